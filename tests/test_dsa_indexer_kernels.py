"""The DSA indexer's decode step at its measured latency: SGLang's attention module with the indexer
less the same module without it (aiconfigurator-core ``sparse_attention`` tables)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from autoparallel import get_model
from autoparallel.testing import import_synthetic_table
from cost_model import Inference, ParallelConfig
from cost_model._inference_compute import _indexer_time
from cost_model._inference_ops import Pass
from cost_model._inference_setup import _setup
from cost_model._kernel_curves import kernel_curves
from cost_model._kernel_curves_dsa import dsa_indexer_decode_s
from cost_model._options import EstimateOptions
from cost_model._serving_columns import ServingConfig
from cost_model._table import configs_to_table
from topology import get_preset

B200 = "NVIDIA B200 SXM"


def _curve(device: str = B200) -> dict:
    (curve,) = [c for c in kernel_curves()["dsa_indexer_decode"] if c["device"] == device]
    return curve


def test_the_curves_name_their_table_and_grow_with_sequences_and_context() -> None:
    curves = kernel_curves()["dsa_indexer_decode"]
    assert {c["device"] for c in curves} >= {"NVIDIA H100 SXM", "NVIDIA H200 SXM", B200}
    for curve in curves:
        assert curve["engine"] == "sglang" and curve["index_heads"] == 32
        assert curve["file"].endswith(
            f"/sparse_attention/sglang/{curve['engine_version']}/dsa_generation_module_perf.parquet"
        )
        table = np.array(list(curve["latency_us_by_batch"].values()))
        assert np.all(np.diff(table, axis=0) >= 0) and np.all(np.diff(table, axis=1) >= 0)
    # one sequence at a million cached tokens: the scan and top-k dwarf the step's fixed cost
    one = _curve()["latency_us_by_batch"]["1"]
    assert one[-1] > 10 * one[0]


def test_grid_points_come_back_and_the_rest_is_interpolated_or_grows_in_proportion() -> None:
    curve, data = _curve(), kernel_curves()
    contexts = np.array(data["dsa_indexer_context_grid"], dtype=float)
    arguments = dict(device_name=B200, heads=32, head_dim=128)
    eight = dsa_indexer_decode_s(batch=8, context=contexts, **arguments)
    np.testing.assert_allclose(eight * 1e6, curve["latency_us_by_batch"]["8"], rtol=1e-9)
    between = dsa_indexer_decode_s(batch=np.array([8.0, 12.0, 16.0]), context=4096, **arguments)
    assert between[0] <= between[1] <= between[2]
    far = dsa_indexer_decode_s(batch=1, context=np.array([2.0**20, 2.0**21]), **arguments)
    assert far[1] == pytest.approx(2.0 * far[0])
    # the H800 runs the H100's kernels; other head dims and unmeasured devices keep the roofline
    assert (
        dsa_indexer_decode_s(
            device_name="NVIDIA H800 SXM", heads=32, head_dim=128, batch=1, context=1
        )
        is not None
    )
    assert dsa_indexer_decode_s(device_name=B200, heads=32, head_dim=64, batch=1, context=1) is None
    assert (
        dsa_indexer_decode_s(device_name="AMD MI300X", heads=32, head_dim=128, batch=1, context=1)
        is None
    )


def _indexer_s(name: str, *, batch: float, context: float, decode: bool = True) -> float:
    workload = Inference(prompt_tokens=8192, output_tokens=1024, weight_dtype="fp8", kv_dtype="fp8")
    table = configs_to_table(
        [ParallelConfig(tp=8, ep=1, etp=8)], **ServingConfig().columns(workload=workload)
    )
    s = _setup(
        model=get_model(name),
        cluster=get_preset("dgx-b200", num_nodes=1),
        workload=workload,
        table=table,
        options=EstimateOptions(),
    )
    one = np.ones(1)
    new = one if decode else one * context
    cached = one * context if decode else one * 0
    return float(_indexer_time(s, Pass(one * batch, new, cached, one, decode=decode))[0])


def test_a_decode_step_pays_the_measured_indexer_and_more_heads_add_their_scores() -> None:
    """GLM-5's indexer (32 heads) is the measured one; DeepSeek-V3.2's has 64 heads: the same
    step plus the extra heads' scores at the roofline. At a million cached tokens one sequence's
    step takes the measured half millisecond, where a roofline of the scores and key reads alone
    gave a few tens of microseconds."""
    glm = _indexer_s("glm-5", batch=1, context=1_048_575)
    measured = dsa_indexer_decode_s(
        device_name=B200, heads=32, head_dim=128, batch=1, context=1_048_576
    )
    assert glm == pytest.approx(float(measured), rel=1e-3)
    assert 300e-6 < glm < 1e-3
    v32 = _indexer_s("deepseek-v3.2", batch=1, context=1_048_575)
    assert glm < v32 < 1.2 * glm
    # prefill keeps its roofline: far below the decode curve's per-token cost at this length
    assert _indexer_s("glm-5", batch=1, context=1024, decode=False) < 1024 * glm


def _dsa_rows() -> list[dict]:
    """A synthetic SGLang DSA decode table: two GLM-5 checkpoints' rows with the indexer, one's
    without, and a DeepSeek-V3.2 row (no pair: not used); the indexer costs 20 us + 1 ns per
    cached token and sequence, the rest of the module 30 us."""
    rows = []
    for batch in (2**i for i in range(11)):
        for step in (4**i for i in range(11)):
            if batch * step > 2**20 and batch > 1:
                continue
            indexer = 20.0 + 1e-3 * batch * step
            for model, op, source, us in (
                (
                    "zai-org/GLM-5-FP8",
                    "dsa_generation_module",
                    "sglang_dsa_indexer_trtllm",
                    30.0 + indexer,
                ),
                (
                    "zai-org/GLM-5.2-FP8",
                    "dsa_generation_module_skip_indexer",
                    "sglang_dsa_skip_indexer_trtllm",
                    30.0,
                ),
                (
                    "deepseek-ai/DeepSeek-V3.2",
                    "dsa_generation_module",
                    "sglang_dsa_indexer_trtllm",
                    999.0,
                ),
            ):
                rows.append(
                    {
                        "op_name": op,
                        "kernel_source": source,
                        "model": model,
                        "num_heads": 8,
                        "tp_size": 8,
                        "kv_cache_dtype": "fp8",
                        "gemm_type": "fp8_block",
                        "batch_size": batch,
                        "isl": 1,
                        "step": step,
                        "latency": us * 1e-3,
                    }
                )
    return rows


def test_importer_takes_the_difference_of_paired_rows(tmp_path: Path) -> None:
    curves = import_synthetic_table(
        tmp_path,
        "h200_sxm/sparse_attention/sglang/9.9",
        "dsa_generation_module_perf.parquet",
        _dsa_rows(),
    )
    (curve,) = curves["dsa_indexer_decode"]
    assert curve["device"] == "NVIDIA H200 SXM" and curve["engine_version"] == "9.9"
    contexts = np.array(curves["dsa_indexer_context_grid"], dtype=float)
    for batch in (1, 16, 1024):
        expected = 20.0 + 1e-3 * batch * contexts
        np.testing.assert_allclose(curve["latency_us_by_batch"][str(batch)], expected, rtol=0.01)
