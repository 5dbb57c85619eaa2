"""Gated DeltaNet layers priced at their measured kernels: the import of aiconfigurator-core's
``linear_attention`` tables and their use in a hybrid model's serving passes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from autoparallel import get_model
from autoparallel.testing import import_synthetic_table
from cost_model import Inference, ParallelConfig
from cost_model._inference_compute import _linear_mixer_roofline, _linear_mixer_time
from cost_model._inference_ops import Pass
from cost_model._inference_setup import _setup
from cost_model._kernel_curves import kernel_curves
from cost_model._kernel_curves_linear import gated_deltanet_measured, gated_deltanet_time_s
from cost_model._options import EstimateOptions
from cost_model._serving_columns import ServingConfig
from cost_model._table import configs_to_table
from topology import get_preset

B200 = "NVIDIA B200 SXM"
QWEN35 = get_model("qwen3.5-397b-a17b")


def _shipped(engine: str, key_heads: int, value_heads: int) -> dict:
    (curve,) = [
        c
        for c in kernel_curves()["linear_attention"]
        if c["device"] == B200 and c["engine"] == engine
    ]
    (shape,) = [
        s for s in curve["shapes"] if (s["key_heads"], s["value_heads"]) == (key_heads, value_heads)
    ]
    return shape


def _time(**kw) -> np.ndarray:
    arguments = dict(device_name=B200, engine="sglang", head_dims=(128, 128))
    result = gated_deltanet_time_s(**{**arguments, **kw})
    assert result is not None
    return result


def test_the_shipped_curves_name_their_table_and_cover_the_hopper_and_blackwell_gpus() -> None:
    curves = kernel_curves()["linear_attention"]
    assert {c["device"] for c in curves} >= {"NVIDIA H100 SXM", "NVIDIA H200 SXM", B200}
    for curve in curves:
        assert curve["file"].endswith("gdn_perf.parquet")
        assert f"/linear_attention/{curve['engine']}/{curve['engine_version']}/" in curve["file"]
        for shape in curve["shapes"]:  # non-decreasing in sequences and in prompt tokens
            assert np.all(np.diff(shape["decode_us_by_batch"]) >= 0)
            table = np.array(list(shape["prefill_us_by_batch"].values()))
            assert np.all(np.diff(table, axis=0) >= 0) and np.all(np.diff(table, axis=1) >= 0)


def test_measured_points_come_back_and_the_rest_follows_the_work() -> None:
    shape = _shipped("sglang", 2, 8)
    batches = np.array(kernel_curves()["linear_attention_batch_grid"], dtype=float)
    decode = _time(key_heads=2, value_heads=8, batch=batches, new_tokens=1, decode=True)
    np.testing.assert_allclose(decode * 1e6, shape["decode_us_by_batch"], rtol=1e-9)
    tokens = np.array(kernel_curves()["linear_attention_tokens_grid"], dtype=float)
    prefill = _time(key_heads=2, value_heads=8, batch=16, new_tokens=tokens, decode=False)
    np.testing.assert_allclose(prefill * 1e6, shape["prefill_us_by_batch"]["16"], rtol=1e-9)
    # beyond the grids the kernels are saturated: twice the sequences or tokens, twice the time
    far = _time(
        key_heads=2, value_heads=8, batch=np.array([1024.0, 2048.0]), new_tokens=1, decode=True
    )
    assert far[1] == pytest.approx(2.0 * far[0])
    long = _time(
        key_heads=2, value_heads=8, batch=1, new_tokens=np.array([32768.0, 65536.0]), decode=False
    )
    assert long[1] == pytest.approx(2.0 * long[0])
    # a shape between two measured ones of its value/key ratio lies between them
    low, mid, high = _time(
        key_heads=np.array([2.0, 3.0, 4.0]),
        value_heads=np.array([8.0, 12.0, 16.0]),
        batch=64,
        new_tokens=1,
        decode=True,
    )
    assert low < mid < high
    # and half the heads of the smallest measured costs at most its time
    (half,) = _time(
        key_heads=np.array([0.5]), value_heads=np.array([2.0]), batch=64, new_tokens=1, decode=True
    )
    assert half < _time(key_heads=1, value_heads=4, batch=64, new_tokens=1, decode=True)[()]


def test_without_a_curve_the_caller_keeps_its_roofline() -> None:
    arguments = dict(key_heads=2, value_heads=8, batch=1, new_tokens=1, decode=True)
    assert (
        gated_deltanet_time_s(
            device_name="AMD MI300X", engine="vllm", head_dims=(128, 128), **arguments
        )
        is None
    )
    assert (
        gated_deltanet_time_s(device_name=B200, engine="vllm", head_dims=(64, 64), **arguments)
        is None
    )
    assert gated_deltanet_measured(device_name="NVIDIA H800 SXM", head_dims=(128, 128))  # an H100


def _qwen35_setup(engine: str, device: str = "dgx-b200"):
    workload = Inference(
        prompt_tokens=8192, output_tokens=1024, weight_dtype="fp8", serving_engine=engine
    )
    config = ParallelConfig(tp=8, ep=8, etp=1)
    table = configs_to_table([config], **ServingConfig().columns(workload=workload))
    return _setup(
        model=QWEN35,
        cluster=get_preset(device, num_nodes=1),
        workload=workload,
        table=table,
        options=EstimateOptions(),
    )


def test_a_hybrid_models_linear_layers_cost_their_measured_kernels() -> None:
    """Qwen3.5-397B on 8 B200s: 16 key and 64 value heads over tp 8 are the tables' (2, 8) shape.
    A decode step of one sequence pays the kernels' launch-bound latency, several times the
    roofline of its state; a long prompt pays the chunked recurrence's measured time."""
    s = _qwen35_setup("sglang")
    ones = np.ones(1)
    step = Pass(ones, ones, ones * 8192, ones, decode=True)
    measured = float(_linear_mixer_time(s, step)[0])
    assert measured * 1e6 == pytest.approx(_shipped("sglang", 2, 8)["decode_us_by_batch"][0])
    assert measured > 3.0 * float(_linear_mixer_roofline(s, step)[0])
    prompt = Pass(ones, ones * 8192, ones * 0, ones, decode=False)
    assert float(_linear_mixer_time(s, prompt)[0]) * 1e6 == pytest.approx(
        _shipped("sglang", 2, 8)["prefill_us_by_batch"]["1"][13]
    )
    # each engine its own kernels
    v = _qwen35_setup("vllm")
    assert float(_linear_mixer_time(v, prompt)[0]) * 1e6 == pytest.approx(
        _shipped("vllm", 2, 8)["prefill_us_by_batch"]["1"][13]
    )


def _gdn_rows() -> list[dict]:
    """A synthetic GDN table: one shape timed for two models (the faster kept), a failed cell (a
    latency below its smaller neighbour's) and long prompts measured for one sequence only."""
    rows = []
    for model, scale in (("a", 1.0), ("b", 1.5)):
        for batch in (2**i for i in range(11)):
            for kernel, us in (
                ("causal_conv1d_update", 2.0),
                ("fused_recurrent_gated_delta_rule_packed_decode", 4.0 * batch),
            ):
                latency = (
                    us
                    * scale
                    * (
                        0.01
                        if (batch, kernel) == (64, "fused_recurrent_gated_delta_rule_packed_decode")
                        else 1.0
                    )
                )
                rows.append(("generation", kernel, batch, 1, model, latency))
            for length in (2**i for i in range(16)):
                if batch > 1 and length > 1024:
                    continue
                for kernel, us in (
                    ("causal_conv1d_fn", 3.0),
                    ("chunk_gated_delta_rule", 20.0 + 0.1 * batch * length),
                ):
                    rows.append(("context", kernel, batch, length, model, us * scale))
    return [
        {
            "phase": phase,
            "kernel_source": kernel,
            "batch_size": batch,
            "seq_len": length,
            "num_tokens": batch * length,
            "d_model": 4096,
            "d_conv": 4,
            "num_k_heads": 2,
            "head_k_dim": 128,
            "num_v_heads": 8,
            "head_v_dim": 128,
            "model_name": model,
            "latency": us * 1e-3,
        }
        for phase, kernel, batch, length, model, us in rows
    ]


def test_importer_keeps_the_measured_latency_of_a_synthetic_table(tmp_path: Path) -> None:
    curves = import_synthetic_table(
        tmp_path, "h200_sxm/linear_attention/vllm/9.9", "gdn_perf.parquet", _gdn_rows()
    )
    (curve,) = curves["linear_attention"]
    assert curve["device"] == "NVIDIA H200 SXM" and curve["engine"] == "vllm"
    assert curve["file"].endswith("h200_sxm/linear_attention/vllm/9.9/gdn_perf.parquet")
    (shape,) = curve["shapes"]
    decode = np.array(shape["decode_us_by_batch"])
    expected = 2.0 + 4.0 * np.array(curves["linear_attention_batch_grid"], dtype=float)
    # model a's latencies, the sum of both kernels; the failed cell at 64 takes 32's
    expected[6] = expected[5]
    np.testing.assert_allclose(decode, expected, rtol=5e-3)
    tokens = np.array(curves["linear_attention_tokens_grid"], dtype=float)
    one = np.array(shape["prefill_us_by_batch"]["1"])
    np.testing.assert_allclose(one, 23.0 + 0.1 * tokens, rtol=5e-3)
    # a length only one sequence was timed at: extended from the largest batch measured there
    four = np.array(shape["prefill_us_by_batch"]["4"])
    assert four[-1] == pytest.approx(4.0 * one[-1], rel=5e-3)
