"""Fit on parts, validate on wholes: the shipped calibration's inputs are operator tables only,
disjoint from every validation row, and no fitted parameter sits at its bound."""

from __future__ import annotations

import importlib.util
import json
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from cost_model._calibration_fits import training_attention_efficiency
from cost_model._calibration_operators import BOUNDS, FITTED_FIELDS, at_bound
from cost_model._calibration_tables import HARDWARE
from cost_model._options import Calibration
from cost_model._validation_cases import published_records, training_cases

DATA = resources.files("cost_model") / "data"
OPERATOR_KINDS = {"gemm", "attention", "nccl", "attention_backward_ratio"}
# The operator tables ship in the aiconfigurator-core wheel (a test extra, pinned to the version
# the calibration was fitted on); only its files are read, nothing of it is imported.
_AIC_SPEC = importlib.util.find_spec("aiconfigurator_core")
assert _AIC_SPEC is not None and _AIC_SPEC.submodule_search_locations, "pip install -e .[test]"
AIC = Path(next(iter(_AIC_SPEC.submodule_search_locations)))


def _document() -> dict:
    return json.loads((DATA / "calibration.json").read_text())


def _inputs_text() -> str:
    return json.dumps([entry["fit"]["inputs"] for entry in _document()["calibrations"]])


def test_fit_inputs_are_operator_tables_only() -> None:
    for entry in _document()["calibrations"]:
        fit = entry["fit"]
        assert fit["fit_on"] == "operator measurements only"
        assert "rows" not in fit  # the former end-to-end fit listed published rows here
        for item in fit["inputs"]:
            assert item["kind"] in OPERATOR_KINDS, item
            assert item["points"] > 0 and item["source"]
            for table in item["tables"]:
                if item["source"].startswith("first-party:"):
                    # the project's own operator measurement (benchmarks/fp8_gemm_check.py)
                    assert table == "cost_model/data/fp8_gemm_first_party.json", item
                    assert (item["kind"], item["dtype"]) == ("gemm", "fp8")
                    continue
                assert table.startswith("systems/data/") and table.endswith(".parquet")
                assert "silicon_sample" not in table
                assert Path(table).name in (
                    "gemm_perf.parquet",
                    "context_attention_perf.parquet",
                    "nccl_perf.parquet",
                )


def test_no_validation_run_or_source_is_a_fit_input() -> None:
    text = _inputs_text()
    runs = {case.run for case in training_cases()}
    sources = {case.source for case in training_cases()}
    records = list(published_records())
    from cost_model._blackwell_validation import blackwell_records

    records += list(blackwell_records())
    urls = {
        word.rstrip(".,;)'\"")
        for record in records
        for word in str(record.get("source", "")).split()
        if word.startswith("http")
    }
    tables = {record.get("table") for record in records if record.get("table")}
    for name in runs | sources | urls | tables:
        assert f'"{name}"' not in text and (len(name) < 12 or name not in text), name


def test_no_fitted_parameter_sits_at_its_bound() -> None:
    for entry in _document()["calibrations"]:
        calibration = Calibration.model_validate(entry)
        assert at_bound(calibration, tolerance=1e-3) == [], entry["device_pattern"]
        for name in FITTED_FIELDS:
            low, high = BOUNDS[name]
            assert low < getattr(calibration, name) < high


def test_at_bound_flags_a_clipped_value() -> None:
    clipped = Calibration(
        matmul_efficiency=1.0,
        attention_efficiency=0.5,
        kernel_overhead_s=5e-6,
        collective_efficiency=0.8,
        collective_overhead_s=8e-6,
    )
    assert at_bound(clipped) == ["matmul_efficiency"]


def test_the_training_attention_efficiency_charges_the_slower_backward() -> None:
    forward = 0.5
    combined = training_attention_efficiency(forward)
    backward = forward * 0.63 / 0.73
    # Time of forward + 2.5x backward FLOPs at the combined efficiency equals the two at theirs.
    assert 3.5 / combined == pytest.approx(1.0 / forward + 2.5 / backward)
    assert backward < combined < forward


def test_every_calibrated_hardware_has_an_entry_in_match_order() -> None:
    patterns = [entry["device_pattern"] for entry in _document()["calibrations"]]
    assert patterns == [h.device_pattern for h in HARDWARE]


def test_refitting_the_a100_tables_reproduces_the_shipped_entry() -> None:
    from cost_model._calibration_operators import calibrate_hardware

    shipped = next(e for e in _document()["calibrations"] if e["device_pattern"] == "A100")
    fitted = calibrate_hardware(AIC, HARDWARE[0])
    for name in FITTED_FIELDS:
        assert getattr(fitted, name) == pytest.approx(shipped[name], rel=1e-6), name
    assert np.isclose(
        fitted.fit["residuals"]["gemm"]["rms_log_error"],
        shipped["fit"]["residuals"]["gemm"]["rms_log_error"],
    )


def test_fp8_gemm_fits_are_recorded_with_inputs_residuals_and_held_out_error() -> None:
    for entry in _document()["calibrations"]:
        fit = entry["fit"]
        fp8_inputs = [item for item in fit["inputs"] if item.get("dtype", "").startswith("fp8")]
        if entry["device_pattern"] == "A100":  # no fp8 tensor cores: no fp8 fit
            assert not fp8_inputs and "fp8_matmul_efficiency" not in fit["parameters"]
            continue
        assert {item["dtype"] for item in fp8_inputs} == {"fp8", "fp8_block"}
        for table in ("fp8", "fp8_block"):
            efficiency = fit["parameters"][f"{table}_matmul_efficiency"]
            assert BOUNDS[f"{table}_matmul_efficiency"][0] < efficiency < entry["matmul_efficiency"]
            assert fit["residuals"][f"gemm_{table}"]["points"] > 100
            assert fit["held_out"][f"gemm_{table}"]["rms_log_error"] < 0.3


def test_at_bound_flags_an_fp8_efficiency_at_its_bound() -> None:
    calibration = Calibration(
        matmul_efficiency=0.8,
        attention_efficiency=0.5,
        kernel_overhead_s=5e-6,
        collective_efficiency=0.8,
        collective_overhead_s=8e-6,
        fit={"parameters": {"fp8_matmul_efficiency": 1.0, "fp8_kernel_overhead_s": 1e-5}},
    )
    assert at_bound(calibration) == ["fp8_matmul_efficiency"]


#: Columns of aiconfigurator's all-reduce operator table: one collective of one message size.
_ALL_REDUCE_COLUMNS = {
    "framework",
    "version",
    "device",
    "op_name",
    "kernel_source",
    "allreduce_dtype",
    "num_gpus",
    "message_size",
    "latency",
    "backend",
    "implementation",
}


def test_serving_all_reduce_latencies_are_operator_tables_only() -> None:
    """The TP all-reduce latencies serving prices with (``kernel_curves.json``
    ``custom_allreduce``) come from aiconfigurator's per-operator comm tables: each file is a
    ``comm/<engine>/<version>/custom_allreduce_perf.parquet`` whose every row times one
    all-reduce of one message over one GPU count (no request, sequence-length or concurrency
    field of an end-to-end run), and the stored latencies are its rows but for single glitched
    samples, each replaced where it took more than twice both neighbouring sizes' time."""
    from autoparallel._kernel_import_tables import _read
    from cost_model._kernel_curves import kernel_curves
    from cost_model._kernel_curves_comm import ALL_REDUCE_MESSAGE_BYTES

    curves = kernel_curves()["custom_allreduce"]
    assert {c["engine"] for c in curves} == {"vllm", "sglang", "trtllm"}
    for curve in curves:
        path = Path(curve["file"])
        assert path.name == "custom_allreduce_perf.parquet" and "silicon_sample" not in str(path)
        assert path.parts[-4:-2] == ("comm", curve["engine"])
        rows = _read(AIC.parent / path)
        assert set(rows[0]) <= _ALL_REDUCE_COLUMNS, sorted(set(rows[0]) - _ALL_REDUCE_COLUMNS)
        assert {r["op_name"] for r in rows} == {"all_reduce"}
        for gpus, latencies in curve["latency_us_by_gpus"].items():
            measured = {
                2 * r["message_size"]: r["latency"] * 1e3
                for r in rows
                if r["num_gpus"] == int(gpus) and r["kernel_source"] == curve["kernel_source"]
            }
            expected = np.array([measured[int(size)] for size in ALL_REDUCE_MESSAGE_BYTES])
            spikes = curve.get("spikes_replaced_bytes_by_gpus", {}).get(gpus, [])
            kept = ~np.isin(ALL_REDUCE_MESSAGE_BYTES, spikes)
            np.testing.assert_allclose(np.array(latencies)[kept], expected[kept], rtol=1e-3)
            for index in np.flatnonzero(~kept):
                assert expected[index] > 2.0 * max(expected[index - 1], expected[index + 1])


def test_the_fp8_fits_price_the_tables_activation_quantization_apart() -> None:
    """Each fp8 table point is a whole W8A8 call, its activation quantization first: priced as a
    memory-bound pass beside the GEMM, the Hopper fits follow their tables within 0.1 rms in log
    (absorbed into the GEMM's efficiency, 0.166 and 0.135 on H100)."""
    for entry in _document()["calibrations"]:
        if not entry["device_pattern"].startswith(("H100", "H200")):
            continue
        residuals = entry["fit"]["residuals"]
        assert residuals["gemm_fp8"]["rms_log_error"] < 0.1
        assert residuals["gemm_fp8_block"]["rms_log_error"] < 0.1
