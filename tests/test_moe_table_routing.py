"""The MoE operator tables are read as the work their collectors' routing made."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autoparallel._kernel_import_moe import _balanced_ideal_s
from autoparallel._kernel_import_moe_routing import (
    DEEPSEEK_V3_GROUPING,
    MIN_LATENCY_SOURCE,
    balanced_hot_experts,
    rank0_load,
    routed_experts,
)
from autoparallel.testing import deepseek_moe_row
from cost_model._kernel_curves_moe import TOKENS_PER_EXPERT_GRID
from topology import get_preset

DEEPSEEK = (7168, 2048, 256, 8, 1)
DATA = Path(__file__).resolve().parents[1] / "cost_model" / "data"


def test_balanced_logits_put_one_hot_expert_in_each_deepseek_group() -> None:
    hot = balanced_hot_experts(64, 256, 8)
    # token t's hot experts: t + 32 j (mod 256), one in each group of 32
    assert hot[5].tolist() == [5 + 32 * j for j in range(8)]
    assert all(sorted(row // 32) == list(range(8)) for row in hot)
    # fewer tokens than the stride: the hot experts are spread over each group
    assert balanced_hot_experts(4, 256, 8)[1].tolist() == [8 + 32 * j for j in range(8)]


def test_the_grouped_gate_sends_balanced_tokens_to_half_the_experts() -> None:
    # plain top-k: every expert, 8 per token
    assert rank0_load(64, 256, 8, 1, None) == (512, 256)
    # DeepSeek-V3's gate: groups 0-3 win every tie; each token's hot expert in each of them
    # plus the four lowest-index others -> 128 experts read, the same 512 assignments
    assert rank0_load(64, 256, 8, 1, DEEPSEEK_V3_GROUPING) == (512, 128)
    # the first of 8 expert-parallel ranks holds group 0: a hot expert and four cold ones per
    # token (5 x 64), every one of its 32 experts read
    assert rank0_load(64, 256, 8, 8, DEEPSEEK_V3_GROUPING) == (320, 32)
    assert rank0_load(64, 256, 8, 8, None) == (64, 32)
    # one expert per rank: expert 0 is one of the four every token takes
    assert rank0_load(4096, 256, 8, 256, DEEPSEEK_V3_GROUPING) == (4096, 1)
    assert rank0_load(4096, 256, 8, 256, None) == (128, 1)


@pytest.mark.parametrize("tokens", [32, 33, 100, 257])
@pytest.mark.parametrize("ep", [1, 8, 64])
def test_replaying_one_stride_of_tokens_counts_what_every_token_does(tokens: int, ep: int) -> None:
    for grouping in (None, DEEPSEEK_V3_GROUPING):
        picked = routed_experts(tokens, 256, 8, grouping)
        mine = picked[picked < 256 // ep]
        assert rank0_load(tokens, 256, 8, ep, grouping) == (mine.size, np.unique(mine).size)


def _write(folder: Path, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), folder / "moe_perf.parquet")


def _rows(*, efficiency: float, grouping, kernel_source: str = "fused_moe") -> list[dict]:
    """Latencies of the work the routing made (rank 0's assignments and experts read), over
    ``efficiency``, for DeepSeek-V3's experts at expert parallelism 1 and 8."""
    hardware = get_preset("dgx-h200").device
    rows = []
    for ep in (1, 8):
        local = 256 // ep
        for tokens in (1, 4, 16, 64, 256, 1024, 4096):
            assignments, touched = rank0_load(tokens, 256, 8, ep, grouping)
            ideal = local * _balanced_ideal_s(
                assignments / local,
                dtype="fp8",
                shape=DEEPSEEK,
                hardware=hardware,
                touched=touched / local,
            )
            rows.append(
                deepseek_moe_row(
                    tokens=tokens,
                    ep=ep,
                    latency_s=float(ideal) / efficiency,
                    kernel_source=kernel_source,
                )
            )
    return rows


def _imported(tmp_path: Path, engine: str, rows: list[dict]) -> dict:
    from autoparallel._kernel_import import import_aiconfigurator

    _write(
        tmp_path / "aiconfigurator_core" / "systems" / "data" / "h200_sxm" / "moe" / engine / "9.9",
        rows,
    )
    (curve,) = import_aiconfigurator(tmp_path, version="test")["grouped_gemm"]
    return curve["experts_per_device"]


def _inside(values: list[float], *, tokens_per_expert_from: float) -> np.ndarray:
    return np.array(values)[TOKENS_PER_EXPERT_GRID >= tokens_per_expert_from]


def test_an_sglang_table_timed_through_the_grouped_gate_is_read_as_that_work(
    tmp_path: Path,
) -> None:
    curves = _imported(tmp_path, "sglang", _rows(efficiency=0.6, grouping=DEEPSEEK_V3_GROUPING))
    # at expert parallelism 1 every token count is measured from 1/32 token per expert up
    np.testing.assert_allclose(curves["256"], 0.6, rtol=2e-3)
    # at 8 ranks the gate loads rank 0 with 5 tokens per token sent: measured from 5/32 up
    np.testing.assert_allclose(_inside(curves["32"], tokens_per_expert_from=5 / 32), 0.6, rtol=2e-3)


def test_a_plainly_routed_table_keeps_the_balanced_reading(tmp_path: Path) -> None:
    # the same engine, a table that never beats the roofline read as balanced work: older
    # collectors routed plainly, and their tables are read that way
    curves = _imported(tmp_path, "sglang", _rows(efficiency=0.6, grouping=None))
    for values in curves.values():
        np.testing.assert_allclose(values, 0.6, rtol=2e-3)


def test_trtllm_min_latency_rows_are_read_through_the_deepseek_gate(tmp_path: Path) -> None:
    rows = _rows(efficiency=0.3, grouping=None, kernel_source="cutlass") + _rows(
        efficiency=0.7, grouping=DEEPSEEK_V3_GROUPING, kernel_source=MIN_LATENCY_SOURCE
    )
    curves = _imported(tmp_path, "trtllm", rows)
    # the min-latency kernel is the faster of the two for the work it did: 0.7 wherever measured
    np.testing.assert_allclose(curves["256"], 0.7, rtol=2e-3)


def test_no_shipped_deepseek_curve_beats_the_roofline() -> None:
    """Read as balanced work, the grouped-gate tables streamed weights faster than HBM (the
    efficiency clipped at 1 over most of the decode range); read as the gate's work, none does."""
    curves = json.loads((DATA / "kernel_curves.json").read_text())["grouped_gemm"]
    deepseek = [
        c
        for c in curves
        if (c["shape"]["num_experts"], c["shape"]["hidden_size"]) == (256, 7168)
        and c["dtype"] == "fp8"
    ]
    assert {c["engine"] for c in deepseek} == {"sglang", "vllm", "trtllm"}
    for curve in deepseek:
        for values in curve["experts_per_device"].values():
            assert max(values) < 0.95, (curve["engine"], curve["device"], curve["shape"])
