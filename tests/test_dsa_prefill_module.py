"""A DSA layer's prefill at its attention module's measured latency (aiconfigurator-core
``sparse_attention/<engine>/<version>/dsa_context_module_perf`` tables)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from autoparallel import get_model
from autoparallel.testing import import_synthetic_table
from cost_model import (
    Inference,
    ParallelConfig,
    _inference_compute,
    _inference_dsa,
    _inference_kernels,
    _inference_passes,
)
from cost_model._inference_compute import (
    _attention_gemms,
    _attention_time,
    _core_attention_time,
    _indexer_time,
)
from cost_model._inference_dsa import MODULE_KERNELS, dsa_module_rows
from cost_model._inference_ops import Pass, attention_projections
from cost_model._inference_setup import _Setup, _setup
from cost_model._kernel_curves import kernel_curves
from cost_model._kernel_curves_dsa import dsa_prefill_module_s
from cost_model._options import EstimateOptions
from cost_model._serving_columns import ServingConfig
from cost_model._table import configs_to_table
from topology import get_preset

B200 = "NVIDIA B200 SXM"
V32 = "DeepseekV32ForCausalLM"


def _curves(device: str = B200, architecture: str = V32) -> dict[str, dict]:
    return {
        c["engine"]: c
        for c in kernel_curves()["dsa_prefill_module"]
        if c["device"] == device and c["architecture"] == architecture
    }


def test_every_engine_measured_the_module_on_each_blackwell_and_hopper_device() -> None:
    devices = ("NVIDIA H100 SXM", "NVIDIA H200 SXM", B200)
    for device in devices:
        for architecture in (V32, "GlmMoeDsaForCausalLM"):
            assert set(_curves(device, architecture)) == {"trtllm", "vllm", "sglang"}
    for curve in kernel_curves()["dsa_prefill_module"]:
        assert curve["file"].endswith(
            f"/sparse_attention/{curve['engine']}/{curve['engine_version']}/"
            "dsa_context_module_perf.parquet"
        )
        for grid in curve["latency_ms_by_heads"].values():
            table = np.array(grid)
            assert table.shape == (4, 8) and np.all(table > 0)
            # more or longer prompts never take less; a 32k prompt's indexer and attention dwarf
            # a 1k one's module
            assert np.all(np.diff(table, axis=0) >= 0) and np.all(np.diff(table, axis=1) >= 0)
            assert table[0, -1] > 5.0 * table[0, 2]


def test_the_engines_agree_on_the_order_of_a_long_prompt() -> None:
    """One 8,192-token prompt, 16 query heads a rank (TP8), B200: every engine's table puts the
    module at 5-6.5 ms a layer."""
    for curve in _curves().values():
        one_prompt = curve["latency_ms_by_heads"]["16"][0]
        assert 5.0 < one_prompt[5] < 6.5


def _module_s(**arguments) -> np.ndarray:
    defaults = dict(device_name=B200, engine="trtllm", architecture=V32, heads=16, batch=1)
    defaults.update(arguments)
    seconds = dsa_prefill_module_s(cached_tokens=0, **defaults)
    assert seconds is not None
    return np.asarray(seconds)


def test_grid_points_come_back_and_the_rest_is_interpolated_or_extrapolated() -> None:
    grid = _curves()["trtllm"]["latency_ms_by_heads"]
    data = kernel_curves()
    tokens = np.array(data["dsa_prefill_tokens_grid"], dtype=float)
    for index, batch in enumerate(data["dsa_prefill_batch_grid"]):
        np.testing.assert_allclose(
            _module_s(batch=batch, new_tokens=tokens) * 1e3, grid["16"][index], rtol=1e-9
        )
    between = _module_s(heads=np.array([16.0, 24.0, 32.0]), new_tokens=8192)
    assert between[0] <= between[1] <= between[2]
    # past the batch grid and below one prompt: in proportion to the prompts
    assert _module_s(batch=128, new_tokens=4096) == pytest.approx(
        2.0 * _module_s(batch=64, new_tokens=4096)
    )
    assert _module_s(batch=0.25, new_tokens=4096) == pytest.approx(
        0.25 * _module_s(batch=1, new_tokens=4096)
    )
    # past the longest prompt: a power of the length between 1 and 2
    far = _module_s(new_tokens=np.array([32768.0, 65536.0, 131072.0]))
    assert 2.0 <= far[1] / far[0] <= 4.0
    assert far[2] / far[1] == pytest.approx(far[1] / far[0])
    # head counts outside a curve's range take its nearest (SGLang measured 16-128 for V3.2)
    assert _module_s(engine="sglang", heads=8, new_tokens=4096) == pytest.approx(
        _module_s(engine="sglang", heads=16, new_tokens=4096)
    )


def test_a_chunk_after_a_prefix_costs_the_module_s_growth_and_its_fixed_part() -> None:
    arguments = dict(device_name=B200, engine="trtllm", architecture=V32, heads=16, batch=1)
    chunk = dsa_prefill_module_s(new_tokens=8192, cached_tokens=8192, **arguments)
    whole = _module_s(new_tokens=16384)
    prefix = _module_s(new_tokens=8192)
    fixed = _module_s(new_tokens=1)
    assert float(chunk) == pytest.approx(float(whole - prefix + fixed))
    assert float(chunk) > float(prefix)  # its queries attend twice the keys


def test_other_devices_architectures_and_the_h800_alias() -> None:
    arguments = dict(heads=16, batch=1, new_tokens=1024, cached_tokens=0)
    assert (
        dsa_prefill_module_s(
            device_name="AMD MI300X", engine="sglang", architecture=V32, **arguments
        )
        is None
    )
    assert (
        dsa_prefill_module_s(
            device_name=B200, engine="trtllm", architecture="DeepseekV3ForCausalLM", **arguments
        )
        is None
    )
    h800 = dsa_prefill_module_s(
        device_name="NVIDIA H800 SXM", engine="vllm", architecture=V32, **arguments
    )
    h100 = dsa_prefill_module_s(
        device_name="NVIDIA H100 SXM", engine="vllm", architecture=V32, **arguments
    )
    assert h800 is not None and float(h800) == pytest.approx(float(h100))
    # an engine without a curve takes the fastest engine's
    fastest = min(
        float(_module_s(engine=engine, new_tokens=1024)) for engine in ("trtllm", "vllm", "sglang")
    )
    assert float(_module_s(engine="other", new_tokens=1024)) == pytest.approx(fastest)


def _dsa_setup(model: str, *, engine: str, cp: int = 1, preset: str = "dgx-b200") -> _Setup:
    workload = Inference(
        prompt_tokens=8192, output_tokens=1024, weight_dtype="fp8", serving_engine=engine
    )
    table = configs_to_table(
        [ParallelConfig(tp=8, ep=1, etp=8, cp=cp)],
        **ServingConfig(phase="prefill", batch_size=1).columns(workload=workload),
    )
    return _setup(
        model=get_model(model),
        cluster=get_preset(preset, num_nodes=cp),
        workload=workload,
        table=table,
        options=EstimateOptions(),
    )


def _prompt(tokens: float, *, decode: bool = False) -> Pass:
    one = np.ones(1)
    if decode:
        return Pass(one, one, one * tokens, one, decode=True)
    return Pass(one, one * tokens, one * 0.0, one, decode=False)


@pytest.mark.parametrize("engine", ["trtllm", "vllm", "sglang"])
def test_a_prefill_layer_costs_the_measured_module_and_decode_keeps_its_pricing(
    engine: str,
) -> None:
    s = _dsa_setup("deepseek-v3.2", engine=engine)
    assert dsa_module_rows(s).all()
    prompt = _prompt(8192)
    measured = _module_s(engine=engine, new_tokens=8192)
    assert float(_attention_time(s, prompt)[0]) == pytest.approx(float(measured), rel=1e-9)
    # several times the roofline of the core attention, the indexer and the projections (vLLM's
    # block-FP8 projections are timed launch-bound in its GEMM table, 1 ms of that roofline)
    roofline = (
        _core_attention_time(s, prompt)
        + _indexer_time(s, prompt)
        + _attention_gemms(s, np.array([8192.0]), decode=False)
    )
    assert float(measured) > 2.5 * float(roofline[0])
    step = _prompt(8192, decode=True)
    assert float(_attention_time(s, step)[0]) == pytest.approx(
        float((_core_attention_time(s, step) + _indexer_time(s, step))[0])
    )


def test_context_parallel_ranks_take_their_share_and_unmeasured_devices_the_roofline() -> None:
    one, two = _dsa_setup("glm-5", engine="sglang"), _dsa_setup("glm-5", engine="sglang", cp=2)
    prompt = _prompt(16384)
    assert float(_attention_time(two, prompt)[0]) == pytest.approx(
        float(_attention_time(one, prompt)[0]) / 2.0
    )
    mi300x = _dsa_setup("glm-5", engine="sglang", preset="mi300x")
    assert not dsa_module_rows(mi300x).any()
    assert float(_attention_time(mi300x, prompt)[0]) == pytest.approx(
        float((_core_attention_time(mi300x, prompt) + _indexer_time(mi300x, prompt))[0])
    )


def test_the_module_holds_the_projections_and_its_kernels(monkeypatch) -> None:
    """Priced as the module, a prefill pass drops its attention GEMMs from the compute and counts
    the block's kernels as measured; a model without a DSA curve (DeepSeek-V3's MLA) is as
    before."""
    s = _dsa_setup("deepseek-v3.2", engine="trtllm")
    prompt = _prompt(8192)
    with_module = float(_inference_passes._compute_time(s, prompt).max())
    measured = float(_inference_kernels._count_measured_kernels(s, decode=False).max())

    def nowhere(setup: _Setup) -> np.ndarray:
        return np.zeros(setup.column("cp").shape, dtype=bool)

    for module in (_inference_compute, _inference_passes, _inference_kernels, _inference_dsa):
        monkeypatch.setattr(module, "dsa_module_rows", nowhere)
    bare = _dsa_setup("deepseek-v3.2", engine="trtllm")
    without = float(_inference_passes._compute_time(bare, prompt).max())
    layers = float(s.layout.layers.max())
    gemms = float(_attention_gemms(bare, np.array([8192.0]), decode=False)[0])
    held = len(attention_projections(bare.model)) + 0.0  # GEMMs measured; no context curve
    kernels = float(_inference_kernels._count_measured_kernels(bare, decode=False).max())
    assert measured - kernels == pytest.approx(layers * (MODULE_KERNELS - held))
    floor = bare.profile.kernel_floor_s * layers * (MODULE_KERNELS - held)
    assert without - with_module == pytest.approx(layers * gemms + floor, rel=1e-6)


def _module_rows() -> list[dict]:
    """A synthetic TensorRT-LLM DSA context table: V3.2 module 50 us + 0.5 us a prompt token at
    16 heads (x2 at 32), measured up to 4,096 tokens for one prompt and 1,024 for four, and rows
    the importer must leave out (another projection or KV dtype, a cached prefix, the module
    without its indexer)."""
    rows = []
    base = {
        "model": "deepseek-ai/DeepSeek-V3.2",
        "architecture": V32,
        "op_name": "dsa_context_module",
        "kernel_source": "default",
        "gemm_type": "fp8_block",
        "kv_cache_dtype": "bfloat16",
        "tp_size": 1,
        "step": 0,
    }
    for heads in (16, 32):
        for batch, longest in ((1, 4096), (4, 1024)):
            for isl in (1, 256, 1024, 2048, 4096):
                if isl > longest:
                    continue
                us = (50.0 + 0.5 * batch * isl) * heads / 16
                rows.append(
                    {
                        **base,
                        "num_heads": heads,
                        "batch_size": batch,
                        "isl": isl,
                        "latency": us * 1e-3,
                    }
                )
                for change in (
                    {"gemm_type": "bfloat16"},
                    {"kv_cache_dtype": "fp8"},
                    {"step": 128},
                    {"op_name": "dsa_context_module_skip_indexer"},
                ):
                    rows.append(
                        {
                            **base,
                            **change,
                            "num_heads": heads,
                            "batch_size": batch,
                            "isl": isl,
                            "latency": 9.0,
                        }
                    )
    return rows


def test_importer_keeps_fresh_fp8_prompts_and_completes_the_triangle(tmp_path: Path) -> None:
    curves = import_synthetic_table(
        tmp_path,
        "b200_sxm/sparse_attention/trtllm/9.9",
        "dsa_context_module_perf.parquet",
        _module_rows(),
    )
    (curve,) = curves["dsa_prefill_module"]
    assert (curve["device"], curve["engine"], curve["engine_version"]) == (B200, "trtllm", "9.9")
    assert sorted(curve["latency_ms_by_heads"]) == ["16", "32"]
    tokens = np.array(curves["dsa_prefill_tokens_grid"], dtype=float)
    sixteen = np.array(curve["latency_ms_by_heads"]["16"])
    measured = tokens <= 4096
    np.testing.assert_allclose(sixteen[0, measured] * 1e3, 50.0 + 0.5 * tokens[measured], rtol=0.01)
    # past the longest prompt: grown as the last two measured lengths (here near linear)
    assert sixteen[0, -1] / sixteen[0, -2] == pytest.approx(2.0, rel=0.02)
    # four prompts past 1,024 tokens and batches past four: the measured smaller batch scaled
    assert sixteen[1, 4] == pytest.approx(4.0 * sixteen[0, 4], rel=0.01)
    assert sixteen[3, 2] == pytest.approx(16.0 * sixteen[1, 2], rel=0.01)
    assert np.array(curve["latency_ms_by_heads"]["32"]) == pytest.approx(2.0 * sixteen, rel=0.01)
