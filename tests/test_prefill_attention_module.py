"""An attention layer's prefill at its whole module's measured latency (aiconfigurator-core
``sparse_attention/<engine>/<version>/dsa_context_module_perf`` for DSA layers,
``mla/<engine>/<version>/mla_context_module_perf`` for DeepSeek-V3's MLA layers)."""

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
    _inference_kernels,
    _inference_module,
    _inference_passes,
    module_shape,
)
from cost_model._inference_compute import (
    _attention_gemms,
    _attention_time,
    _core_attention_time,
    _indexer_time,
)
from cost_model._inference_module import MODULE_KERNELS, module_rows
from cost_model._inference_ops import Pass, attention_projections
from cost_model._inference_setup import _Setup, _setup
from cost_model._kernel_curves import kernel_curves
from cost_model._kernel_curves_module import prefill_module_s
from cost_model._options import EstimateOptions
from cost_model._serving_columns import ServingConfig
from cost_model._table import configs_to_table
from topology import get_preset

B200 = "NVIDIA B200 SXM"
V32 = "DeepseekV32ForCausalLM"
V3 = "DeepseekV3ForCausalLM"


def _curves(
    device: str = B200, architecture: str = V32, kind: str = "dsa_prefill_module"
) -> dict[str, dict]:
    return {
        c["engine"]: c
        for c in kernel_curves()[kind]
        if c["device"] == device and c["architecture"] == architecture
    }


SHAPES = {
    V32: module_shape(get_model("deepseek-v3.2")),
    "GlmMoeDsaForCausalLM": module_shape(get_model("glm-5")),
    V3: module_shape(get_model("deepseek-v3")),
}


def dsa_prefill_module_s(**arguments) -> np.ndarray | None:
    shape = SHAPES.get(arguments["architecture"], SHAPES[V32])
    return prefill_module_s(kind="dsa_prefill_module", shape=shape, **arguments)


def test_every_engine_measured_the_module_on_each_blackwell_and_hopper_device() -> None:
    devices = ("NVIDIA H100 SXM", "NVIDIA H200 SXM", B200)
    for device in devices:
        for architecture in (V32, "GlmMoeDsaForCausalLM"):
            assert set(_curves(device, architecture)) == {"trtllm", "vllm", "sglang"}
    for device in devices:  # DeepSeek-V3's MLA module: TensorRT-LLM's and vLLM's tables
        assert set(_curves(device, V3, "mla_prefill_module")) == {"trtllm", "vllm"}
    curves = kernel_curves()
    for kind, folder in (("dsa_prefill_module", "sparse_attention"), ("mla_prefill_module", "mla")):
        for curve in curves[kind]:
            table = kind.replace("prefill_module", "context_module_perf.parquet")
            assert curve["file"].endswith(
                f"/{folder}/{curve['engine']}/{curve['engine_version']}/{table}"
            )
            for grid in curve["latency_ms_by_heads"].values():
                values = np.array(grid)
                assert values.shape == (4, 8) and np.all(values > 0)
                # more or longer prompts never take less; a 32k prompt's scores and attention
                # dwarf a 1k one's module
                assert np.all(np.diff(values, axis=0) >= 0)
                assert np.all(np.diff(values, axis=1) >= 0)
                assert values[0, -1] > 5.0 * values[0, 2]


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
    tokens = np.array(data["prefill_module_tokens_grid"], dtype=float)
    for index, batch in enumerate(data["prefill_module_batch_grid"]):
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
    # only the serving engine's own curve prices its rows
    assert (
        dsa_prefill_module_s(device_name=B200, engine="other", architecture=V32, **arguments)
        is None
    )
    with pytest.raises(ValueError, match="kind"):
        prefill_module_s(
            kind="gqa",
            device_name=B200,
            engine="trtllm",
            architecture=V32,
            shape=SHAPES[V32],
            **arguments,
        )


def _setup_for(model: str, *, engine: str, cp: int = 1, preset: str = "dgx-b200") -> _Setup:
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
    s = _setup_for("deepseek-v3.2", engine=engine)
    assert module_rows(s).all()
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
    one, two = _setup_for("glm-5", engine="sglang"), _setup_for("glm-5", engine="sglang", cp=2)
    prompt = _prompt(16384)
    assert float(_attention_time(two, prompt)[0]) == pytest.approx(
        float(_attention_time(one, prompt)[0]) / 2.0
    )
    mi300x = _setup_for("glm-5", engine="sglang", preset="mi300x")
    assert not module_rows(mi300x).any()
    assert float(_attention_time(mi300x, prompt)[0]) == pytest.approx(
        float((_core_attention_time(mi300x, prompt) + _indexer_time(mi300x, prompt))[0])
    )


def test_the_module_holds_the_projections_and_its_kernels(monkeypatch) -> None:
    """Priced as the module, a prefill pass drops its attention GEMMs from the compute and counts
    the block's kernels as measured."""
    s = _setup_for("deepseek-v3.2", engine="trtllm")
    prompt = _prompt(8192)
    with_module = float(_inference_passes._compute_time(s, prompt).max())
    measured = float(_inference_kernels._count_measured_kernels(s, decode=False).max())

    def nowhere(setup: _Setup) -> np.ndarray:
        return np.zeros(setup.column("cp").shape, dtype=bool)

    for module in (_inference_compute, _inference_passes, _inference_kernels, _inference_module):
        monkeypatch.setattr(module, "module_rows", nowhere)
    bare = _setup_for("deepseek-v3.2", engine="trtllm")
    without = float(_inference_passes._compute_time(bare, prompt).max())
    layers = float(s.layout.layers.max())
    gemms = float(_attention_gemms(bare, np.array([8192.0]), decode=False)[0])
    held = len(attention_projections(bare.model)) + 0.0  # GEMMs measured; no context curve
    kernels = float(_inference_kernels._count_measured_kernels(bare, decode=False).max())
    assert measured - kernels == pytest.approx(layers * (MODULE_KERNELS - held))
    floor = bare.profile.kernel_floor_s * layers * (MODULE_KERNELS - held)
    assert without - with_module == pytest.approx(layers * gemms + floor, rel=1e-6)


@pytest.mark.parametrize("engine", ["trtllm", "vllm"])
def test_deepseek_v3_mla_prefill_is_its_engine_s_measured_module(engine: str) -> None:
    """DeepSeek-V3's dense MLA layers take TensorRT-LLM's and vLLM's measured module in prefill
    (at 32K tokens about half the former roofline); SGLang, whose tables time the attention
    kernel alone, and DeepSeek's own serving (priced on SGLang's profile) keep the roofline."""
    s = _setup_for("deepseek-v3", engine=engine)
    assert module_rows(s).all()
    for tokens in (1024.0, 32768.0):
        measured = prefill_module_s(
            kind="mla_prefill_module",
            shape=SHAPES[V3],
            device_name=B200,
            engine=engine,
            architecture=V3,
            heads=16,
            batch=1,
            new_tokens=tokens,
            cached_tokens=0,
        )
        assert measured is not None
        prompt = _prompt(tokens)
        assert float(_attention_time(s, prompt)[0]) == pytest.approx(float(measured), rel=1e-9)
    roofline = _core_attention_time(s, _prompt(32768.0)) + _attention_gemms(
        s, np.array([32768.0]), decode=False
    )
    assert float(_attention_time(s, _prompt(32768.0))[0]) < 0.7 * float(roofline[0])
    sglang = _setup_for("deepseek-v3", engine="sglang")
    assert not module_rows(sglang).any()
    # Kimi K2 shares DeepSeek-V3's architecture and MLA shape (64 heads: 8 a rank at TP8);
    # ref-3t-moe its architecture but not its hidden size (8192): not DeepSeek-V3's module
    assert module_rows(_setup_for("kimi-k2", engine="vllm")).all()
    assert not module_rows(_setup_for("ref-3t-moe", engine="vllm")).any()


def _synthetic_rows() -> list[dict]:
    """A synthetic TensorRT-LLM DSA context table: V3.2 module 50 us + 0.5 us a prompt token at
    16 heads (x2 at 32), measured up to 4,096 tokens for one prompt and 1,024 for four, and rows
    the importer must leave out (another projection or KV dtype, a cached prefix, the module
    without its indexer, an architecture of no catalog model)."""
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
                    {"architecture": "KimiK3ForConditionalGeneration"},  # no catalog shape
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
        _synthetic_rows(),
    )
    (curve,) = curves["dsa_prefill_module"]
    assert (curve["device"], curve["engine"], curve["engine_version"]) == (B200, "trtllm", "9.9")
    assert curve["shape"] == SHAPES[V32] and curves["mla_prefill_module"] == []
    assert sorted(curve["latency_ms_by_heads"]) == ["16", "32"]
    tokens = np.array(curves["prefill_module_tokens_grid"], dtype=float)
    sixteen = np.array(curve["latency_ms_by_heads"]["16"])
    measured = tokens <= 4096
    np.testing.assert_allclose(sixteen[0, measured] * 1e3, 50.0 + 0.5 * tokens[measured], rtol=0.01)
    # past the longest prompt: grown as the last two measured lengths (here near linear)
    assert sixteen[0, -1] / sixteen[0, -2] == pytest.approx(2.0, rel=0.02)
    # four prompts past 1,024 tokens and batches past four: the measured smaller batch scaled
    assert sixteen[1, 4] == pytest.approx(4.0 * sixteen[0, 4], rel=0.01)
    assert sixteen[3, 2] == pytest.approx(16.0 * sixteen[1, 2], rel=0.01)
    assert np.array(curve["latency_ms_by_heads"]["32"]) == pytest.approx(2.0 * sixteen, rel=0.01)
