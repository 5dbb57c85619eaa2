"""DeepSeek-V3/R1 Day-6 serving: predicted vs published throughput per H800 node."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from cost_model import Calibration, validate_dsv3_day6
from cost_model._common import calibration_for
from cost_model._inference_validation import day6_fleet_rows, day6_records, day6_units, day6_workload
from topology import get_preset

REFERENCE = Path(__file__).resolve().parents[1].parent / "shared" / "reference" / "published_runs.json"


def test_day6_within_25_percent() -> None:
    rows = validate_dsv3_day6()
    assert [row.published for row in rows] == [73700.0, 14800.0]
    for row in rows:
        assert abs(row.error) <= 0.25, row
        assert row.error == pytest.approx(row.predicted / row.published - 1)


def test_shipped_h800_calibration_is_the_fit() -> None:
    """The shipped value minimizes the fit's loss (neighbours are worse) and is global to H800."""
    shipped = calibration_for(get_preset("hgx-h800").device)
    assert shipped.device_pattern == "H800" and shipped.fit["in_sample"]
    assert calibration_for(get_preset("dgx-h100").device).device_pattern != "H800"

    def loss(efficiency: float) -> float:
        rows = validate_dsv3_day6(calibration=Calibration(device_pattern="H800", matmul_efficiency=efficiency))
        return sum(math.log1p(row.error) ** 2 for row in rows)

    at_fit = loss(shipped.matmul_efficiency)
    assert at_fit < loss(shipped.matmul_efficiency - 0.02) and at_fit < loss(shipped.matmul_efficiency + 0.02)


def test_uncalibrated_model_overpredicts_production_averages() -> None:
    """Without the H800 calibration (preset efficiency) the model predicts far more than the
    24 h averages: the check above can fail."""
    rows = validate_dsv3_day6(calibration=Calibration())
    assert all(row.error > 0.5 for row in rows)


def test_units_and_workload_follow_the_published_records() -> None:
    records = day6_records()["records"]
    if REFERENCE.exists():  # the packaged copy matches the shared reference verbatim
        shared = {r["field"]: r["value"] for r in json.loads(REFERENCE.read_text())["records"] if r["table"] == "dsv3_day6"}
        assert shared == records
    units = day6_units()
    (prefill_nodes, prefill, prefill_serving), (decode_nodes, decode, decode_serving) = units["prefill"], units["decode"]
    assert (prefill_nodes, prefill.ep, prefill.dp, prefill_serving.num_redundant_experts) == (4, 32, 32, 32)
    assert (decode_nodes, decode.ep, decode.dp, decode_serving.num_redundant_experts) == (18, 144, 144, 32)
    assert "EP32" in records["prefill_unit"] and "EP144" in records["decode_unit"]
    workload = day6_workload()
    assert workload.prompt_tokens + (workload.output_tokens + 1) / 2 == pytest.approx(4989, abs=1)
    assert workload.prefix_cache_hit_rate == pytest.approx(0.563, abs=1e-3)
    assert workload.prompt_tokens / workload.output_tokens == pytest.approx(608 / 168, rel=1e-3)


def test_rate_matched_fleet_serves_the_published_daily_totals() -> None:
    rows = day6_fleet_rows()
    assert len(rows) == 2
    for row in rows:
        assert abs(row.error) <= 0.25, row
