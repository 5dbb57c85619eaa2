"""Kernel curves imported from public operator tables: provenance, shape, and use in decode."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autoparallel import get_model
from autoparallel._kernel_import_tables import _read
from cost_model import Inference, estimate_inference_table, table_from_columns
from cost_model._kernel_curves import kernel_curves
from cost_model._kernel_curves_attention import mla_efficiency
from cost_model._kernel_curves_moe import TOKENS_PER_EXPERT_GRID, grouped_gemm_efficiency
from cost_model._serving_columns import PHASE_CODES
from topology import get_preset

DATA = Path(__file__).resolve().parents[1] / "cost_model" / "data"


#: Every section of ``kernel_curves.json`` that holds imported measurements.
CURVE_SECTIONS = (
    "grouped_gemm",
    "mla_decode",
    "mla_prefill",
    "mla_bmm",
    "gemm",
    "context_attention",
    "decode_attention",
    "custom_allreduce",
    "linear_attention",
    "dsa_indexer_decode",
)


def _every_curve() -> list[dict]:
    curves = kernel_curves()
    return [curve for section in CURVE_SECTIONS for curve in curves[section]]


def test_curves_are_fit_inputs_with_a_source_file_each_and_no_end_to_end_table() -> None:
    curves = kernel_curves()
    assert curves["kind"] == "fit_input" and "Apache-2.0" in curves["_license"]
    assert "aiconfigurator-core 0.12.0" in curves["_source"]
    files = [c["file"] for c in _every_curve()]
    published = [f for f in files if "flashmla_decode.json" in f]  # a kernel's own figures
    imported = [f for f in files if f not in published]
    assert imported and all(
        f.startswith("aiconfigurator_core/systems/data/") and f.endswith(".parquet")
        for f in imported
    )
    assert published and all(
        f.startswith("https://github.com/deepseek-ai/FlashMLA README.md@") for f in published
    )
    assert not any("silicon_sample" in f for f in files)
    devices = {c["device"] for c in curves["grouped_gemm"]}
    assert {"NVIDIA H100 SXM", "NVIDIA H200 SXM", "NVIDIA B200 SXM"} <= devices
    assert {c["dtype"] for c in curves["grouped_gemm"]} >= {
        "bf16",
        "fp8",
        "fp4",
        "int4",
    }


def test_fit_inputs_and_validation_rows_share_no_source() -> None:
    validation = " ".join(
        p.read_text() for p in DATA.glob("*.json") if p.name != "kernel_curves.json"
    )
    for curve in _every_curve():
        assert curve["file"] not in validation


def test_importer_refuses_the_end_to_end_table() -> None:
    with pytest.raises(ValueError, match="validation data, never a fit input"):
        _read(Path("aiconfigurator_core/systems/data/h200_sxm/silicon_sample.csv"))


def test_small_grouped_gemms_run_far_below_their_roofline() -> None:
    tokens = np.array([1 / 32, 1.0, 64.0])
    efficiency = grouped_gemm_efficiency(
        device_name="NVIDIA H200 SXM",
        dtype="fp8",
        tokens_per_expert=tokens,
        experts_per_device=8,
    )
    assert np.all((efficiency > 0) & (efficiency <= 1))
    assert efficiency[0] < 0.5 * efficiency[1]  # a few tokens spread over 8 experts: launch-bound
    assert (
        grouped_gemm_efficiency(
            device_name="no such device",
            dtype="fp8",
            tokens_per_expert=tokens,
            experts_per_device=8,
        )
        is None
    )
    for kind in (
        "mla_decode",
        "mla_prefill",
    ):  # long contexts and prompts keep the tensor cores busy
        mla = mla_efficiency(
            kind=kind, device_name="NVIDIA H200 SXM", tokens=np.array([16.0, 8192.0])
        )
        assert 0 < mla[0] < mla[1] <= 1.0, kind


def test_decode_prices_routed_experts_at_the_measured_grouped_gemm_efficiency() -> None:
    model = get_model("deepseek-v3")
    workload = Inference(prompt_tokens=2048, output_tokens=256, weight_dtype="fp8")
    table = table_from_columns(dp=8, tp=1, ep=8, batch_size=8, phase=PHASE_CODES["decode"])
    h200 = estimate_inference_table(
        model=model, cluster=get_preset("dgx-h200"), workload=workload, table=table
    )
    # the same device without curves (renamed) falls back to the calibrated roofline
    plain = get_preset("dgx-h200")
    renamed = plain.model_copy(
        update={"device": plain.device.model_copy(update={"name": "NVIDIA H200 SXM (no curves)"})}
    )
    roofline = estimate_inference_table(
        model=model, cluster=renamed, workload=workload, table=table
    )
    assert h200["time.decode_compute"][0] != pytest.approx(
        roofline["time.decode_compute"][0], rel=1e-3
    )
    # MLA decode attention is priced from its measured curve too
    assert h200["time.decode_attention"][0] != pytest.approx(
        roofline["time.decode_attention"][0], rel=1e-3
    )


def test_committed_curves_are_small() -> None:
    # grouped-GEMM, MLA and DeepEP curves (~170 kB), the dense GEMM grids of 4 devices x 3
    # engines x 2-4 dtypes (11 x 9 x 9 points each; TensorRT-LLM's per-tensor FP8 among them),
    # the context-attention curves (TensorRT-LLM's FP8 ones too) and the
    # all-reduce latencies (6 devices x 3 engines x 2-4 GPU counts x 23 sizes); MLA decode at
    # 6 head counts per rank (~95 kB), the absorbed-MLA batched GEMMs (~14 kB); MHA/GQA decode
    # attention (6 devices x 3 engines x 1-2 KV dtypes x 4 groups x 15 pair counts x 12
    # lengths, ~190 kB); Qwen3-235B's experts split over 8 ranks (~21 kB); Kimi-K2's 384
    # experts, whole and over 8 ranks (~75 kB); gpt-oss's MXFP4 experts (~20 kB); the Gated
    # DeltaNet kernels (5 devices x 3 engines x 4-18 per-rank shapes x 11 + 6 x 16 latencies,
    # ~200 kB); the DSA indexer's decode step (5 devices x 11 x 11 latencies, ~7 kB); the DSA
    # and MLA attention modules in prefill (5 devices x 2-3 engines x 1-2 architectures x 4-5
    # head counts x 4 x 8 latencies, ~60 kB)
    assert (DATA / "kernel_curves.json").stat().st_size < 1_100_000
    json.loads((DATA / "kernel_curves.json").read_text())


def _write_moe_table(folder: Path, *, efficiency: float) -> None:
    """A synthetic aiconfigurator MoE table whose latencies are the ideal time over ``efficiency``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from autoparallel._kernel_import_moe import _side_bytes
    from autoparallel.testing import deepseek_moe_row
    from cost_model._kernel_curves_moe import grouped_gemm_ideal_s

    hardware = get_preset("dgx-h200").device
    rows = []
    for ep in (8, 32):
        for tokens in (1, 16, 256, 4096):
            ideal = grouped_gemm_ideal_s(
                hardware=hardware,
                dtype="fp8",
                tokens_per_expert=tokens * 8 / 256,
                experts_per_device=256 / ep,
                touched_fraction=min(1.0, tokens * 8 / 256),
                side_bytes_per_assignment=_side_bytes("fp8", hardware),
            )
            rows.append(deepseek_moe_row(tokens=tokens, ep=ep, latency_s=float(ideal) / efficiency))
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), folder / "moe_perf.parquet")


def test_importer_recovers_the_efficiency_of_a_synthetic_table(tmp_path: Path) -> None:
    from autoparallel._kernel_import import import_aiconfigurator

    root = tmp_path / "aiconfigurator_core"
    _write_moe_table(
        root / "systems" / "data" / "h200_sxm" / "moe" / "trtllm" / "9.9",
        efficiency=0.4,
    )
    curves = import_aiconfigurator(tmp_path, version="test")
    (curve,) = curves["grouped_gemm"]
    assert (
        curve["device"] == "NVIDIA H200 SXM"
        and curve["dtype"] == "fp8"
        and curve["engine"] == "trtllm"
    )
    assert (
        curve["file"] == "aiconfigurator_core/systems/data/h200_sxm/moe/trtllm/9.9/moe_perf.parquet"
    )
    assert set(curve["experts_per_device"]) == {"32", "8"}
    for values in curve["experts_per_device"].values():
        np.testing.assert_allclose(values, 0.4, rtol=1e-3)
    # no MLA table in the package: only the published FlashMLA figures, shipped with the model
    assert (
        {c["engine"] for c in curves["mla_decode"]} == {"flashmla"}
        and curves["deepep_low_latency"] == {}
        and curves["kind"] == "fit_input"
    )


def test_deepep_low_latency_fit_is_an_operator_fit_with_held_out_error() -> None:
    fit = kernel_curves()["deepep_low_latency"]
    assert (
        fit["file"].endswith("wideep_deepep_ll_perf.parquet")
        and "silicon_sample" not in fit["file"]
    )
    grid = {
        "latency_s": (0.0, 40e-6),
        "nvlink_efficiency": (0.05, 1.0),
        "rdma_efficiency": (0.05, 1.2),
    }
    for direction in ("dispatch", "combine"):
        params = fit[direction]
        for name, (low, high) in grid.items():
            assert low < params[name] < high, (
                direction,
                name,
            )  # no parameter at a bound
        assert (
            params["mean_abs_error"] < 0.2
            and max(params["held_out_node_count_mean_abs_error"].values()) < 0.2
        )


def test_low_latency_all_to_all_pays_the_measured_fixed_latency() -> None:
    from cost_model._kernel_curves_comm import deepep_low_latency_s

    cluster = get_preset("dgx-h200", num_nodes=8)
    one_token = deepep_low_latency_s(
        direction="dispatch",
        intra_bytes=7168.0,
        inter_bytes=7 * 7168.0,
        cluster=cluster,
    )
    assert one_token > 15e-6  # DeepEP's measured floor: ~16 us for a single token on 8 nodes


def _flashmla_benchmark_call(heads: int, cache_tokens: float, batch: int = 128):
    """FLOPs and bytes of one call of FlashMLA's benchmark (tests/test_flash_mla.py at c2067be:
    d = 576, dv = 512, one KV head, one query token), and the model's seconds for it."""
    from cost_model._kernel_curves_attention import mla_time_s

    keys = batch * cache_tokens
    flops = keys * heads * (576 + 512) * 2.0
    bytes_moved = (keys * 576 + batch * heads * (576 + 512)) * 2.0
    seconds = mla_time_s(
        kind="mla_decode",
        hardware=get_preset("hgx-h800").device,
        dtype="bf16",
        flops=flops,
        bytes_moved=keys * 576 * 2.0,  # what the cost model counts: the latent cache read
        tokens=cache_tokens,
        batch=batch,
        heads=heads,
        engine="flashmla",
    )[0]
    return flops, bytes_moved, seconds


def test_flashmla_curve_reproduces_its_readme_figures_at_the_benchmark_shapes() -> None:
    """FlashMLA README (c2067be): up to 660 TFLOPS compute-bound and 3000 GB/s memory-bound on the
    H800 SXM5, at its benchmark's batch 128 and 4K-16K cache; 128 query heads (DeepSeek's decode
    instances, no TP) is compute-bound, 16 (TP 8) memory-bound (its deep-dive: h_q >= 128)."""
    published = json.loads((DATA / "flashmla_decode.json").read_text())
    assert published["commit"].startswith("c2067be")
    for cache_tokens in (4096.0, 8192.0, 16384.0):
        flops, _, seconds = _flashmla_benchmark_call(128, cache_tokens)
        assert flops / seconds == pytest.approx(660e12, rel=2e-3)
        _, bytes_moved, seconds = _flashmla_benchmark_call(16, cache_tokens)
        assert bytes_moved / seconds == pytest.approx(3000e9, rel=2e-3)
    # above what the imported H100 tables measured for SGLang's and TensorRT-LLM's kernels at
    # DeepSeek's 128 heads, batch 128, 4K cache (~0.66-0.68 of the roofline)
    kwargs = dict(kind="mla_decode", tokens=4096.0, batch=128.0, heads=128.0)
    flashmla = mla_efficiency(device_name="NVIDIA H800 SXM", engine="flashmla", **kwargs)[0]
    for engine in ("sglang", "trtllm"):
        assert mla_efficiency(device_name="NVIDIA H800 SXM", engine=engine, **kwargs)[0] < (
            flashmla - 0.1
        )
    # the H800's kernels are the H100 SXM's (same die, clocks and HBM3)
    assert mla_efficiency(device_name="NVIDIA H100 SXM", engine="flashmla", **kwargs)[0] == (
        flashmla
    )


def test_flashmla_is_priced_only_where_asked_for() -> None:
    """Neither vLLM 0.33 (FLASH_ATTN_MLA first on SM90) nor SGLang 0.5 (fa3 on Hopper) runs
    FlashMLA by default: an engine without tables of its own keeps the best of the serving
    engines' tables, and a device FlashMLA published nothing for keeps its engine's."""
    kwargs = dict(kind="mla_decode", tokens=4096.0, batch=128.0, heads=128.0)
    flashmla = mla_efficiency(device_name="NVIDIA H100 SXM", engine="flashmla", **kwargs)[0]
    best = mla_efficiency(device_name="NVIDIA H100 SXM", engine=None, **kwargs)[0]
    assert mla_efficiency(device_name="NVIDIA H100 SXM", engine="vllm", **kwargs)[0] == best
    assert best < flashmla - 0.05
    h200 = mla_efficiency(device_name="NVIDIA H200 SXM", engine="flashmla", **kwargs)[0]
    assert h200 == mla_efficiency(device_name="NVIDIA H200 SXM", engine=None, **kwargs)[0]
    model = get_model("deepseek-v3")
    table = table_from_columns(
        length=1, dp=8, ep=8, batch_size=np.array([128]), phase=PHASE_CODES["decode"]
    )
    attention = [
        estimate_inference_table(
            model=model,
            cluster=get_preset("hgx-h800"),
            workload=Inference(
                prompt_tokens=4096, output_tokens=1, weight_dtype="fp8", mla_decode_kernel=kernel
            ),
            table=table,
        )["time.decode_attention"][0]
        for kernel in (None, "flashmla")
    ]
    assert attention[1] < 0.9 * attention[0]


def test_mla_decode_is_far_less_efficient_for_a_few_sequences() -> None:
    efficiency = [
        mla_efficiency(
            kind="mla_decode",
            device_name="NVIDIA H200 SXM",
            tokens=np.array([4096.0]),
            batch=b,
        )[0]
        for b in (1, 4, 16, 64)
    ]
    assert np.all(np.diff(efficiency) > 0) and efficiency[0] < 0.25 * efficiency[-1]
    model = get_model("deepseek-v3")
    workload = Inference(prompt_tokens=4096, output_tokens=256, weight_dtype="fp8")
    table = table_from_columns(
        length=2,
        dp=8,
        tp=1,
        ep=8,
        batch_size=np.array([1, 64]),
        phase=PHASE_CODES["decode"],
    )
    out = estimate_inference_table(
        model=model, cluster=get_preset("dgx-h200"), workload=workload, table=table
    )
    per_sequence = out["time.decode_attention"] / np.array([1.0, 64.0])
    assert per_sequence[0] > 3 * per_sequence[1]


def test_a_tensor_parallel_rank_prices_mla_decode_at_its_own_head_count() -> None:
    """Under TP8 each rank runs 16 of DeepSeek-V3's 128 heads over all its sequences and reads
    each sequence's whole latent. The 16-head rows of the table price that call: on a B200,
    16 sequences at 1K context take about as long as one (~15 vs ~17 us, launch-bound), not
    the 8x of pricing a 16-sequence cache read at the efficiency of 2 whole 128-head sequences."""
    heads = {
        c.get("heads", 128)
        for c in kernel_curves()["mla_decode"]
        if c["device"] == "NVIDIA B200 SXM" and c["engine"] == "sglang"
    }
    assert {16, 128} <= heads
    model = get_model("deepseek-v3")
    workload = Inference(
        prompt_tokens=1000, output_tokens=64, weight_dtype="fp8", serving_engine="sglang"
    )
    table = table_from_columns(
        length=2, tp=8, etp=8, batch_size=np.array([1, 16]), phase=PHASE_CODES["decode"]
    )
    out = estimate_inference_table(
        model=model, cluster=get_preset("dgx-b200"), workload=workload, table=table
    )
    per_layer = out["time.decode_attention"] / model.num_layers
    assert 5e-6 < per_layer[0] < 30e-6
    assert per_layer[1] < 2.0 * per_layer[0]


def test_decode_prices_its_dense_gemms_at_the_engines_measured_latency() -> None:
    """A TP8 DeepSeek-V3 decode step of one sequence on a B200 runs 4 attention GEMMs per layer
    (q/kv down projection fused into one, as SGLang's ``fused_qkv_a_proj_with_mqa``; q up,
    kv up, output) and 2 shared-expert GEMMs, each a launch-bound W8A8 call with its activation
    quantization: the tables time them at 6-15 us each, where the roofline of their bytes
    says ~1-2 us."""
    from cost_model._inference_compute import _gemms
    from cost_model._inference_ops import attention_projections
    from cost_model._inference_setup import _setup
    from cost_model._kernel_curves_gemm import projections_time_s
    from cost_model._options import EstimateOptions

    model = get_model("deepseek-v3")
    a = model.attention
    projections = attention_projections(model)
    assert projections[0] == (a.q_lora_rank + a.kv_lora_rank + a.qk_rope_head_dim, 7168, "")
    assert len(projections) == 4
    workload = Inference(
        prompt_tokens=1000, output_tokens=64, weight_dtype="fp8", serving_engine="sglang"
    )
    table = table_from_columns(tp=8, etp=8, batch_size=1, phase=PHASE_CODES["decode"])
    seconds = {}
    for name in ("dgx-b200", "no curves"):
        cluster = get_preset("dgx-b200")
        if name == "no curves":
            device = cluster.device.model_copy(update={"name": "NVIDIA B200 SXM (no curves)"})
            cluster = cluster.model_copy(update={"device": device})
        setup = _setup(
            model=model, cluster=cluster, workload=workload, table=table, options=EstimateOptions()
        )
        seconds[name] = _gemms(setup, np.ones(1), projections, setup.shard)[0]
    measured = projections_time_s(
        hardware=get_preset("dgx-b200").device,
        dtype="fp8",
        m=1.0,
        shard=8.0,
        projections=projections,
        engine="sglang",
    )
    assert seconds["dgx-b200"] == pytest.approx(measured[0], rel=1e-9)
    assert 4 * 5e-6 < seconds["dgx-b200"] < 4 * 20e-6
    assert seconds["dgx-b200"] > 3 * seconds["no curves"]


def test_absorbed_mla_decode_runs_kv_b_as_its_two_measured_batched_gemms() -> None:
    """In absorbed decode ``kv_b_proj`` is two batched GEMMs over the rank's heads (q_nope into
    the latent, the attention output out of it): a TP8 rank of DeepSeek-V3 on a B200 (16 heads)
    takes the SGLang table's ~9 us for the pair at one token, where the one GEMM of the same
    weights is priced at ~6 us; prefill keeps the explicit GEMM; a device without the table
    keeps the GEMM in decode too."""
    from cost_model._inference_compute import _attention_gemms, _gemms
    from cost_model._inference_ops import attention_projections, kv_up_projection
    from cost_model._inference_setup import _setup
    from cost_model._kernel_curves_attention import mla_bmm_time_s
    from cost_model._options import EstimateOptions

    model = get_model("deepseek-v3")
    assert kv_up_projection(model) in attention_projections(model)
    pair = mla_bmm_time_s(device_name="NVIDIA B200 SXM", tokens=1.0, heads=16, engine="sglang")
    assert pair is not None and 6e-6 < pair[0] < 15e-6
    assert mla_bmm_time_s(device_name="no such device", tokens=1.0, heads=16) is None
    workload = Inference(
        prompt_tokens=1000, output_tokens=64, weight_dtype="fp8", serving_engine="sglang"
    )
    table = table_from_columns(tp=8, etp=8, batch_size=1, phase=PHASE_CODES["decode"])
    setup = _setup(
        model=model,
        cluster=get_preset("dgx-b200"),
        workload=workload,
        table=table,
        options=EstimateOptions(),
    )
    one = np.ones(1)
    explicit = _gemms(setup, one, attention_projections(model), setup.shard)
    kv_up = _gemms(setup, one, (kv_up_projection(model),), setup.shard)
    decode = _attention_gemms(setup, one, decode=True)
    assert decode[0] == pytest.approx(explicit[0] - kv_up[0] + pair[0], rel=1e-9)
    assert _attention_gemms(setup, one, decode=False)[0] == pytest.approx(explicit[0], rel=1e-9)


def test_large_experts_are_priced_on_the_measured_shape_nearest_theirs() -> None:
    """At one token on 8 experts per device, Mixtral-8x7B's 4096 x 14336 experts stream far more
    bytes per expert than DeepSeek-V3's 7168 x 2048 against the same fixed routing and ramp:
    the tables measure them nearer their roofline, and a model with large experts gets their
    curve, not DeepSeek's."""
    common = {"device_name": "NVIDIA B200 SXM", "dtype": "fp8", "experts_per_device": 8}
    tokens = np.array([0.25, 1.0])
    small = grouped_gemm_efficiency(tokens_per_expert=tokens, **common)
    large = grouped_gemm_efficiency(
        tokens_per_expert=tokens, expert_elements=6144 * 16384, **common
    )
    assert small is not None and large is not None
    assert np.all(large > 1.5 * small), (small, large)
    shapes = {tuple(c["shape"].values()) for c in kernel_curves()["grouped_gemm"]}
    assert (4096, 14336, 8, 2, 1) in shapes and (7168, 256, 256, 8, 8) in shapes


def test_a_tp8_qwen3_expert_slice_is_priced_on_its_own_measured_shape() -> None:
    """Qwen3-235B-A22B at TP8 runs all 128 experts on every rank, each a 4096 x 192 slice
    (1536 / 8). The tables measure that split (aiconfigurator-core 0.12.0,
    ``b200_sxm/moe/sglang/0.5.14``: BF16, ``moe_tp_size`` 8, balanced, 19.7 us at one token,
    126 us at 16); before it was imported the slice fell to DeepSeek-V3's 7168 x 256 TP8 curve,
    which priced the one-token step at 13 us. At one token the routing the model assumes
    (8 of 128 experts touched) is the table's, so the curve gives back the table's latency."""

    shapes = {
        (c["engine"], tuple(c["shape"].values()))
        for c in kernel_curves()["grouped_gemm"]
        if c["device"] == "NVIDIA B200 SXM" and c["dtype"] == "bf16"
    }
    assert ("sglang", (4096, 192, 128, 8, 8)) in shapes
    seconds = _layer_seconds(
        "dgx-b200",
        "bf16",
        tokens=[1.0, 16.0],
        top_k=8,
        hidden=4096,
        expert_ffn=192,
        engine="sglang",
    )
    np.testing.assert_allclose(seconds, [19.7e-6, 126.3e-6], rtol=0.05)


def _side_bytes_of(dtype: str, *, hidden: int, expert_ffn: int, preset: str = "dgx-b200") -> float:
    from autoparallel._kernel_import_moe import _side_bytes

    hardware = get_preset(preset).device
    return _side_bytes(dtype, hardware, hidden=hidden, expert_ffn=expert_ffn)


def _layer_seconds(
    preset: str, dtype: str, *, tokens, top_k: int, hidden: int, expert_ffn: int, engine: str
) -> np.ndarray:
    """One MoE layer of 128 experts, all on one device, at ``tokens`` tokens (the tables' point)."""
    from cost_model._kernel_curves_moe import grouped_experts_time_s

    tokens = np.asarray(tokens, dtype=np.float64)
    seconds = grouped_experts_time_s(
        hardware=get_preset(preset).device,
        dtype=dtype,
        tokens_per_expert=tokens * top_k / 128,
        experts_per_device=128.0,
        touched_fraction=np.minimum(1.0, tokens * top_k / 128),
        side_bytes_per_assignment=_side_bytes_of(
            dtype, hidden=hidden, expert_ffn=expert_ffn, preset=preset
        ),
        hidden_size=hidden,
        expert_ffn_size=float(expert_ffn),
        engine=engine,
    )
    assert seconds is not None
    return seconds


def test_gpt_oss_mxfp4_experts_on_hopper_are_priced_from_the_w4a16_tables() -> None:
    """gpt-oss-120b's MXFP4 experts on one H200 run weight-only (bf16 math): vLLM 0.24's table
    (``h200_sxm/moe/vllm/0.24.0``, ``w4a16_mxfp4``, hidden 2880, 128 experts, top-4, balanced)
    times the whole layer at 0.0609 ms for one token and 0.665 ms for 64; the curve gives them
    back, where the FP4 roofline without a table had no Hopper peak to price them at."""
    seconds = _layer_seconds(
        "dgx-h200", "fp4", tokens=[1.0, 64.0], top_k=4, hidden=2880, expert_ffn=2880, engine="vllm"
    )
    np.testing.assert_allclose(seconds, [60.9e-6, 665.4e-6], rtol=0.05)


def test_a_gemm_narrower_than_the_grid_is_held_at_the_narrowest_measured_latency() -> None:
    """A router's 128 logits (Qwen3-235B: 128 x 4096, BF16, one token) run one tile wide and
    launch-bound: SGLang's B200 table times N = 128 and N = 256 at 4.6 and 4.2 us. Holding the
    efficiency of N = 256 would halve the time with the ideal; the latency is held instead.
    A GEMM that is absent (width 0: no shared expert) costs nothing."""
    from cost_model._kernel_curves_gemm import gemm_time_s, projections_time_s

    hardware = get_preset("dgx-b200").device
    common = {"hardware": hardware, "dtype": "bf16", "m": 1.0, "k": 4096, "engine": "sglang"}
    narrow = gemm_time_s(n=128, **common)
    narrowest_measured = gemm_time_s(n=256, **common)
    assert narrow is not None and narrowest_measured is not None
    assert narrow[0] == pytest.approx(narrowest_measured[0], rel=1e-12)
    assert 3e-6 < narrow[0] < 6e-6
    router = projections_time_s(
        hardware=hardware,
        dtype="bf16",
        m=1.0,
        shard=1.0,
        projections=((128, 4096, ""), (0, 4096, "n")),
        engine="sglang",
    )
    assert router is not None and router[0] == pytest.approx(narrow[0], rel=1e-12)


def test_kernels_timed_by_an_operator_table_pay_no_floor_on_top() -> None:
    """A measured latency already holds its kernels' launch gaps, ramps and tails: a pass on H200
    drops its dense GEMMs (``_gemms``: MLA's 4 projections per layer, the fused q/kv down
    projection one, 2 per dense FFN, 2 per shared expert and the router's one per MoE layer)
    from the per-kernel floor, and a decode step also the fused MoE layer (its other 7 kernels)
    and MLA decode (1 per layer), against none on a device without curves."""
    from cost_model._inference_kernels import _kernels_per_pass, _measured_kernels_per_pass
    from cost_model._inference_setup import _setup
    from cost_model._options import EstimateOptions

    model = get_model("deepseek-v3")
    workload = Inference(prompt_tokens=2048, output_tokens=256, weight_dtype="fp8")
    table = table_from_columns(dp=8, tp=1, ep=8, batch_size=8, phase=PHASE_CODES["decode"])
    plain = get_preset("dgx-h200")
    renamed = plain.model_copy(
        update={"device": plain.device.model_copy(update={"name": "NVIDIA H200 SXM (no curves)"})}
    )
    measured = {}
    for name, cluster in (("curves", plain), ("none", renamed)):
        setup = _setup(
            model=model,
            cluster=cluster,
            workload=workload,
            table=table,
            options=EstimateOptions(),
        )
        measured[name] = np.asarray(_measured_kernels_per_pass(setup, decode=True)).ravel()
        measured[name + " prefill"] = np.asarray(
            _measured_kernels_per_pass(setup, decode=False)
        ).ravel()
        assert np.all(_kernels_per_pass(setup) > measured[name])
    dense_layers = model.moe.num_dense_layers
    moe_layers = model.num_layers - dense_layers
    assert measured["none"][0] == 0.0
    assert measured["none prefill"][0] == 0.0
    gemms = 4 * model.num_layers + 2 * dense_layers + 3 * moe_layers
    assert measured["curves"][0] == gemms + 7 * moe_layers + model.num_layers
    assert measured["curves prefill"][0] == gemms


def test_every_curve_names_the_engine_and_version_that_measured_it() -> None:
    for curve in _every_curve():
        if curve["engine"] == "flashmla":  # the kernel's own published figures, at their commit
            assert f"README.md@{curve['engine_version']} " in curve["file"], curve["file"]
            continue
        assert curve["engine"] in {"trtllm", "sglang", "vllm"}
        assert f"/{curve['engine']}/{curve['engine_version']}/" in curve["file"], curve["file"]


def _write_gemm_table(
    folder: Path, *, efficiency: float, gemm_dtype: str = "fp8_block", extra_s: float = 0.0
) -> None:
    """A synthetic aiconfigurator GEMM table over the whole grid (and the odd M one past each
    tile boundary) whose latencies are the ideal time over ``efficiency``; a slower second kernel
    at every point, which the importer must pass over for the fastest."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cost_model._kernel_curves_gemm import GEMM_M_GRID, GEMM_NK_GRID, gemm_ideal_s

    hardware = get_preset("dgx-h200").device
    rows = []
    for m in sorted({int(v) for v in GEMM_M_GRID} | {int(v) + 1 for v in GEMM_M_GRID}):
        for n in GEMM_NK_GRID:
            for k in GEMM_NK_GRID:
                ideal = float(gemm_ideal_s(hardware=hardware, dtype="fp8", m=m, n=n, k=k))
                for source, slower in (("fast", 1.0), ("slow", 3.0)):
                    rows.append(
                        {
                            "kernel_source": source,
                            "gemm_dtype": gemm_dtype,
                            "m": m,
                            "n": n,
                            "k": k,
                            "latency": (ideal / efficiency * slower + extra_s) * 1e3,
                        }
                    )
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), folder / "gemm_perf.parquet")


def test_importer_recovers_the_gemm_efficiency_of_a_synthetic_table(tmp_path: Path) -> None:
    from autoparallel._kernel_import import import_aiconfigurator

    root = tmp_path / "aiconfigurator_core"
    _write_gemm_table(
        root / "systems" / "data" / "h200_sxm" / "gemm" / "vllm" / "9.9", efficiency=0.35
    )
    curves = import_aiconfigurator(tmp_path, version="test")
    (curve,) = curves["gemm"]
    assert (curve["device"], curve["dtype"], curve["engine"], curve["engine_version"]) == (
        "NVIDIA H200 SXM",
        "fp8",
        "vllm",
        "9.9",
    )
    assert curve["file"].endswith("h200_sxm/gemm/vllm/9.9/gemm_perf.parquet")
    np.testing.assert_allclose(curve["efficiency_per_mille"], 350, atol=1)


def _write_compute_scale_table(folder: Path, *, seconds: float) -> None:
    """A synthetic aiconfigurator compute-scale table (dynamic less static per-tensor FP8
    quantization) of ``seconds`` at every (m, k) of the GEMM grid and one past each M."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cost_model._kernel_curves_gemm import GEMM_M_GRID, GEMM_NK_GRID

    rows = [
        {"m": m, "k": k, "quant_dtype": "fp8", "latency": seconds * 1e3}
        for m in sorted({int(v) for v in GEMM_M_GRID} | {int(v) + 1 for v in GEMM_M_GRID})
        for k in GEMM_NK_GRID
    ]
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), folder / "computescale_perf.parquet")


def test_per_tensor_fp8_rows_are_imported_less_their_dynamic_scale_step(tmp_path: Path) -> None:
    """TensorRT-LLM's per-tensor FP8 GEMM rows time dynamic quantization; the ``fp8_tensor``
    curve is the row less the compute-scale table's amax step (static activation scales). An
    engine whose compute-scale table does not isolate that step keeps no per-tensor curve."""
    from autoparallel._kernel_import import import_aiconfigurator

    data = tmp_path / "aiconfigurator_core" / "systems" / "data" / "h200_sxm"
    for engine in ("trtllm", "vllm"):
        _write_gemm_table(
            data / "gemm" / engine / "9.9", efficiency=0.4, gemm_dtype="fp8", extra_s=7e-6
        )
        _write_compute_scale_table(data / "quantize" / engine / "9.9", seconds=7e-6)
    curves = import_aiconfigurator(tmp_path, version="test")
    (curve,) = curves["gemm"]
    assert (curve["engine"], curve["dtype"]) == ("trtllm", "fp8_tensor")
    np.testing.assert_allclose(curve["efficiency_per_mille"], 400, atol=1)


def test_per_tensor_fp8_weights_take_their_own_gemm_table() -> None:
    """Llama-3-70B's TP2 slices on H100 (TensorRT-LLM tables): per-tensor FP8 with static
    scales (``fp8_scaling="tensor"``) prices a 5000-token prefill's GEMMs below the block-scaled
    kernels (whose main loop applies a scale per 128-deep K block); the ideal time of the
    ``fp8_tensor`` curves is FP8's."""
    from cost_model._kernel_curves import gemm_curve_dtype
    from cost_model._kernel_curves_gemm import gemm_ideal_s, projections_time_s

    hardware = get_preset("dgx-h100").device
    ffn = ((2 * 28672, 8192, "n"), (8192, 28672, "k"))  # Llama-3-70B's gate/up and down
    assert gemm_curve_dtype("fp8", "tensor") == "fp8_tensor"
    assert gemm_curve_dtype("fp8", "block") == "fp8"
    assert gemm_curve_dtype("bf16", "tensor") == "bf16"
    ideal = [
        gemm_ideal_s(hardware=hardware, dtype=d, m=64, n=4096, k=8192)
        for d in ("fp8", "fp8_tensor")
    ]
    assert ideal[0] == ideal[1]
    prefill = {
        dtype: projections_time_s(
            hardware=hardware,
            dtype=dtype,
            m=5000.0,
            shard=2.0,
            projections=ffn,
            engine="trtllm",
        )
        for dtype in ("fp8", "fp8_tensor")
    }
    assert prefill["fp8_tensor"] is not None and prefill["fp8"] is not None
    assert float(prefill["fp8_tensor"][0]) < 0.9 * float(prefill["fp8"][0])


def test_an_fp8_cache_runs_fp8_context_attention_where_the_engine_does() -> None:
    """TensorRT-LLM's FP8 context FMHA (its tables' FP8-attention rows over an FP8 cache)
    prices a 5000-token prompt of Llama-3-70B's TP2 heads on H100 at about 0.75x its BF16
    kernel; an engine without such a curve keeps its BF16 kernel for an FP8 cache."""
    from cost_model._kernel_curves_attention import context_attention_time_s

    hardware = get_preset("dgx-h100").device
    tokens, heads = 5000.0, 32.0
    flops = tokens * (tokens + 1) / 2 * 4 * heads * 128
    seconds = {
        (engine, kv): float(
            context_attention_time_s(
                hardware=hardware,
                flops=flops,
                bytes_moved=0.0,
                tokens=tokens,
                units=heads,
                engine=engine,
                kv_element_bytes=kv,
            )[0]
        )
        for engine in ("trtllm", "sglang")
        for kv in (1.0, 2.0)
    }
    assert 0.6 < seconds[("trtllm", 1.0)] / seconds[("trtllm", 2.0)] < 0.85
    assert seconds[("sglang", 1.0)] == seconds[("sglang", 2.0)]


def test_gemm_curves_price_a_gemm_at_its_measured_latency() -> None:
    """On the grid, ideal / efficiency gives back the table's latency (H200, TRT-LLM, FP8 block
    scaled: DeepSeek-V3's 7168 x 2048 slice at 4096 tokens, 0.147 ms in the table, rounded to
    the octave mean), and a TP8 slice runs far below the calibrated matmul efficiency."""
    from cost_model._kernel_curves_gemm import gemm_efficiency, gemm_time_s

    hardware = get_preset("dgx-h200").device
    seconds = gemm_time_s(hardware=hardware, dtype="fp8", m=4096, n=2048, k=7168, engine="trtllm")
    assert seconds is not None and 1.2e-4 < float(seconds[0]) < 1.8e-4
    efficiency = gemm_efficiency(
        device_name=hardware.name, dtype="fp8", m=[4096, 16], n=2048, k=7168, engine="trtllm"
    )
    assert efficiency is not None and np.all(efficiency < 0.5)
    assert efficiency[1] < efficiency[0]  # a few tokens: bound by the weights and the ramp
    assert gemm_efficiency(device_name="NVIDIA A30", dtype="fp8", m=1, n=1, k=1) is None


def test_prefill_prices_dense_gemms_at_their_measured_curves() -> None:
    """A TP8 DeepSeek-V3 prefill on H200 takes longer in compute than the calibrated roofline
    (the same device renamed, without curves) prices it: its GEMM slices run at 0.1-0.5 of FP8
    peak in the tables, against the calibration's one efficiency fitted on large GEMMs (less so
    for the fused q/kv down projection, one GEMM where the roofline sees the same bytes). Expert
    parallelism keeps the routed experts on the roofline in both
    (``_inference_compute._moe_time``)."""
    model = get_model("deepseek-v3")
    workload = Inference(prompt_tokens=3200, output_tokens=64, weight_dtype="fp8")
    table = table_from_columns(tp=8, ep=8, etp=1, batch_size=4, phase=PHASE_CODES["prefill"])
    plain = get_preset("dgx-h200")
    renamed = plain.model_copy(
        update={"device": plain.device.model_copy(update={"name": "NVIDIA H200 SXM (no curves)"})}
    )
    compute = {
        name: estimate_inference_table(
            model=model, cluster=cluster, workload=workload, table=table
        )["time.prefill_compute"][0]
        for name, cluster in (("curves", plain), ("roofline", renamed))
    }
    assert compute["curves"] > 1.05 * compute["roofline"]


def test_a_block_of_projections_prices_each_gemm_as_gemm_time_does() -> None:
    """``projections_time_s`` (one lookup per distinct shard) sums exactly the per-GEMM times."""
    from cost_model._inference_ops import attention_projections, ffn_projections
    from cost_model._kernel_curves_gemm import gemm_time_s, projections_time_s

    hardware = get_preset("dgx-h200").device
    model = get_model("deepseek-v3")
    rng = np.random.default_rng(0)
    m = rng.uniform(0.5, 40_000, 500)
    shard = rng.choice([1.0, 2.0, 3.0, 8.0, 32.0], 500)
    for projections in (attention_projections(model), ffn_projections(model, 18432)):
        block = projections_time_s(
            hardware=hardware, dtype="fp8", m=m, shard=shard, projections=projections
        )
        each = [
            gemm_time_s(
                hardware=hardware,
                dtype="fp8",
                m=m,
                n=n / shard if split == "n" else np.full_like(shard, n),
                k=k / shard if split == "k" else np.full_like(shard, k),
            )
            for n, k, split in projections
        ]
        assert block is not None and all(e is not None for e in each)
        np.testing.assert_allclose(block, np.sum(each, axis=0), rtol=1e-12)


def test_gqa_prefill_attention_is_priced_at_the_measured_context_attention_curve() -> None:
    """Qwen3-235B (GQA, head dim 128) prefill on H200: core attention at the engine's measured
    FlashAttention-class efficiency, which rises with the prompt (a 512-token prompt of 8 heads
    per rank leaves most SMs idle; 8K tokens run near 0.5 of BF16 peak), so it differs from the
    calibration's one efficiency and the short prompt pays relatively more per FLOP."""
    from cost_model._kernel_curves_attention import context_attention_time_s

    hardware = get_preset("dgx-h200").device
    flops = np.array([512 * 513 / 2 * 4 * 8 * 128, 8192 * 8193 / 2 * 4 * 8 * 128])
    seconds = context_attention_time_s(
        hardware=hardware, flops=flops, bytes_moved=0.0, tokens=[512, 8192], units=8.0
    )
    assert seconds is not None
    efficiency = flops / hardware.peak_flops_for("bf16") / seconds
    assert efficiency[0] < 0.5 * efficiency[1] and 0.3 < efficiency[1] < 0.8
    model = get_model("qwen3-235b-a22b")
    workload = Inference(prompt_tokens=8192, output_tokens=64, weight_dtype="bf16")
    table = table_from_columns(tp=8, ep=8, batch_size=1, phase=PHASE_CODES["prefill"])
    plain = get_preset("dgx-h200")
    renamed = plain.model_copy(
        update={"device": plain.device.model_copy(update={"name": "NVIDIA H200 SXM (no curves)"})}
    )
    attention = {
        name: estimate_inference_table(
            model=model, cluster=cluster, workload=workload, table=table
        )["time.prefill_attention"][0]
        for name, cluster in (("curves", plain), ("roofline", renamed))
    }
    assert attention["curves"] != pytest.approx(attention["roofline"], rel=0.05)


def _aiconfigurator_root() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("aiconfigurator_core")
    assert spec is not None and spec.submodule_search_locations, "pip install -e .[test]"
    return Path(next(iter(spec.submodule_search_locations)))


def _decode_all_reduce_s(cluster, engine: str) -> tuple[float, object]:
    """One TP all-reduce of a TP8 Llama-3.1-70B decode step (one sequence) on ``cluster``:
    its decode TP time over the 2 all-reduces per layer; and the model."""
    from cost_model._serving_validation import row_model

    model = row_model({"id": "llama-3.1-70b", "model": "llama-3.1-70b"})
    workload = Inference(
        prompt_tokens=1000, output_tokens=1000, weight_dtype="bf16", serving_engine=engine
    )
    out = estimate_inference_table(
        model=model,
        cluster=cluster,
        workload=workload,
        table=table_from_columns(tp=8, batch_size=1, phase=PHASE_CODES["decode"]),
    )
    tp_comm = out["time.decode_tp_comm"][0] + out["hidden.decode_tp_comm"][0]
    return float(tp_comm) / (2 * model.num_layers), model


@pytest.mark.parametrize(
    ("preset", "folder", "engine", "version", "kernel"),
    [
        ("dgx-a100", "a100_sxm", "sglang", "0.5.10", "SGLang_CustomAllReduce_graph"),
        ("dgx-h200", "h200_sxm", "sglang", "0.5.14", "SGLang_CustomAllReduce_graph"),
        ("dgx-h200", "h200_sxm", "vllm", "0.24.0", "vLLM_custom_graph"),
        ("dgx-h200", "h200_sxm", "trtllm", "1.3.0rc20", "TRTLLM"),
    ],
)
def test_a_tp8_decode_all_reduce_takes_the_engines_measured_latency(
    preset: str, folder: str, engine: str, version: str, kernel: str
) -> None:
    """A decode all-reduce of one token's hidden state (8192 BF16 elements, 16 KB) over 8 GPUs
    costs what the engine's own table measured at that size (aiconfigurator's parquet, read
    here directly), not the collective model's ring (several times more)."""
    seconds, model = _decode_all_reduce_s(get_preset(preset), engine)
    rows = _read(
        _aiconfigurator_root()
        / "systems/data"
        / folder
        / f"comm/{engine}/{version}/custom_allreduce_perf.parquet"
    )
    (measured,) = [
        float(r["latency"]) * 1e-3
        for r in rows
        if r["num_gpus"] == 8
        and r["message_size"] == model.hidden_size
        and r["kernel_source"] == kernel
    ]
    assert seconds == pytest.approx(measured, rel=0.03)


def test_a_device_without_an_all_reduce_table_keeps_the_collective_model() -> None:
    """The H800 shares the H100's kernels (``DEVICE_ALIASES``) but not its NVLink: its TP
    all-reduce stays the topology's collective model, as on a device no table covers, and its
    all-reduces keep their per-kernel floors (its GEMMs, the H100's kernels, drop theirs)."""
    from cost_model._inference_kernels import _measured_kernels_per_pass
    from cost_model._inference_ops import attention_projections, ffn_projections
    from cost_model._inference_setup import _setup
    from cost_model._options import EstimateOptions
    from cost_model._pricing import collective_time_s

    cluster = get_preset("hgx-h800")
    seconds, model = _decode_all_reduce_s(cluster, "sglang")
    workload = Inference(prompt_tokens=1000, output_tokens=1000, weight_dtype="bf16")
    calibration = EstimateOptions().calibration_for(cluster.device)
    modelled = collective_time_s(
        cluster=cluster,
        op="all_reduce",
        group_size=8,
        ranks_per_node=8,
        message_bytes=model.hidden_size * 2.0,
        calibration=calibration,
    )
    assert seconds == pytest.approx(float(modelled), rel=1e-9)
    h100, _ = _decode_all_reduce_s(get_preset("dgx-h100"), "sglang")
    assert h100 < 0.5 * seconds  # the measured kernel on the H100 is far below the model
    table = table_from_columns(tp=8, batch_size=1, phase=PHASE_CODES["decode"])
    floors = {}
    for name in ("hgx-h800", "dgx-h100"):
        setup = _setup(
            model=model,
            cluster=get_preset(name),
            workload=workload,
            table=table,
            options=EstimateOptions(),
        )
        floors[name] = np.asarray(_measured_kernels_per_pass(setup, decode=True)).ravel()[0]
    gemms = model.num_layers * (
        len(attention_projections(model)) + len(ffn_projections(model, model.ffn_hidden_size))
    )
    gemms = gemms + model.num_layers  # and the decode attention kernel (H800: the H100's tables)
    assert floors["hgx-h800"] == gemms
    assert floors["dgx-h100"] == gemms + 2 * model.num_layers  # the two all-reduces per layer


def test_all_reduce_lookup_interpolates_between_measured_sizes() -> None:
    from cost_model._kernel_curves_comm import ALL_REDUCE_MESSAGE_BYTES, all_reduce_time_s

    curve = next(
        c
        for c in kernel_curves()["custom_allreduce"]
        if c["device"] == "NVIDIA H200 SXM" and c["engine"] == "vllm"
    )
    latencies = np.array(curve["latency_us_by_gpus"]["8"]) * 1e-6
    grid = ALL_REDUCE_MESSAGE_BYTES
    between = np.sqrt(grid[10] * grid[11])
    got = all_reduce_time_s(
        device_name="NVIDIA H200 SXM",
        group=np.array([8, 8, 8, 8, 3]),
        message_bytes=np.array([grid[10], between, 16.0, 2 * grid[-1], grid[10]]),
        engine="vllm",
    )
    assert got is not None
    assert got[0] == pytest.approx(latencies[10])
    assert got[1] == pytest.approx(np.sqrt(latencies[10] * latencies[11]))
    assert got[2] == pytest.approx(latencies[0])  # held below the smallest size
    assert got[3] == pytest.approx(2 * latencies[-1])  # bandwidth-bound beyond the largest
    assert np.isnan(got[4])  # 3 GPUs: not measured
    assert all_reduce_time_s(device_name="AMD MI300X", group=8, message_bytes=1.0) is None


def test_importer_keeps_the_engines_graph_rows_of_an_all_reduce_table(tmp_path: Path) -> None:
    """Of a synthetic SGLang table, the CUDA-graph rows of the newest version are kept (the eager
    rows add the collector's copy and host dispatch), and a folder holding another engine's rows
    (as aiconfigurator's ``sglang/0.5.6.post2`` holds TensorRT-LLM's) is passed over."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from autoparallel._kernel_import import import_aiconfigurator
    from cost_model._kernel_curves_comm import ALL_REDUCE_MESSAGE_BYTES

    folder = tmp_path / "aiconfigurator_core" / "systems" / "data" / "a100_sxm" / "comm" / "sglang"
    for version, framework in (("0.5.1", "SGLang"), ("0.5.9", "TRTLLM")):
        rows = [
            {
                "framework": framework,
                "op_name": "all_reduce",
                "kernel_source": f"SGLang_CustomAllReduce_{mode}"
                if framework == "SGLang"
                else "TRTLLM",
                "allreduce_dtype": "bfloat16",
                "num_gpus": gpus,
                "message_size": int(size) // 2,
                "latency": gpus * (1.0 if mode == "graph" else 5.0) * 1e-3,  # ms
            }
            for gpus in (2, 8)
            for size in ALL_REDUCE_MESSAGE_BYTES
            for mode in ("graph", "eager")
        ]
        (folder / version).mkdir(parents=True)
        pq.write_table(
            pa.Table.from_pylist(rows), folder / version / "custom_allreduce_perf.parquet"
        )
    (curve,) = import_aiconfigurator(tmp_path, version="test")["custom_allreduce"]
    assert curve["device"] == "NVIDIA A100 SXM 80GB" and curve["engine_version"] == "0.5.1"
    assert curve["kernel_source"] == "SGLang_CustomAllReduce_graph"
    assert set(curve["latency_us_by_gpus"]) == {"2", "8"}
    np.testing.assert_allclose(curve["latency_us_by_gpus"]["8"], 8.0)


def test_a_single_glitched_all_reduce_sample_is_replaced_and_a_step_is_kept() -> None:
    """A point more than twice as slow as both neighbouring sizes is one glitched sample (the
    larger message took less than half its time) and takes its neighbours' geometric mean; a
    step up that the larger sizes keep (a switch to another algorithm), and a bandwidth-bound
    doubling, are kept as measured."""
    from autoparallel._kernel_import_comm import replace_latency_spikes

    kept, replaced = replace_latency_spikes([4.0, 4.0, 40.0, 4.0, 4.0, 25.0, 90.0, 130.0, 260.0])
    assert replaced == [2]
    assert kept == [4.0, 4.0, 4.0, 4.0, 4.0, 25.0, 90.0, 130.0, 260.0]
    assert replace_latency_spikes([1.0, 2.0, 4.0, 8.0]) == ([1.0, 2.0, 4.0, 8.0], [])


def test_a_decode_step_does_not_get_faster_with_a_second_request_on_a100() -> None:
    """Qwen3-30B-A3B on vLLM over 8 A100s: vLLM's A100 all-reduce table times 4 KiB (one token
    of its 2,048-wide hidden state) at 14.85 us between 5.62 us at 2 KiB and 6.32 us at 8 KiB;
    taken as measured, a batch-1 decode step cost 0.3 ms more than a batch-2 one."""
    from cost_model import ParallelConfig, ServingConfig, configs_to_table
    from cost_model._inference_load import serving_inputs

    model = get_model("qwen3-30b-a3b")
    workload = Inference(
        prompt_tokens=2000, output_tokens=500, weight_dtype="fp8", serving_engine="vllm"
    )
    table = configs_to_table(
        [ParallelConfig(tp=8, ep=8)], **ServingConfig().columns(workload=workload)
    )
    cost, _, _ = serving_inputs(
        model=model, cluster=get_preset("dgx-a100", num_nodes=1), workload=workload, table=table
    )
    steps = [
        float(cost.row(0).seconds(np.array([float(b)]), np.array([0.0]))[0]) for b in (1, 2, 4, 8)
    ]
    assert steps == sorted(steps), steps


def _serving_model(name: str):
    """A catalog model, or one of the serving validation's (Llama-3.1-70B's config)."""
    from cost_model._serving_validation import row_model

    return row_model({"id": name, "model": name})


#: (preset, aiconfigurator folder, engine, version, model, tp, KV dtype): Llama-3.1-70B (64 query
#: heads over 8 KV heads) at TP8 runs 8 query heads over 1 KV head per rank, at TP4 16 over 2;
#: Qwen3-235B-A22B (64 over 4) at TP4 16 over 1 (group 16), at TP8 8 over a replicated KV head.
_DECODE_CASES = [
    ("dgx-h100", "h100_sxm", "sglang", "0.5.14", "llama-3.1-70b", 8, "bf16"),
    ("dgx-h100", "h100_sxm", "trtllm", "1.3.0rc20", "llama-3.1-70b", 4, "fp8"),
    ("dgx-b200", "b200_sxm", "sglang", "0.5.14", "qwen3-235b-a22b", 4, "bf16"),
    ("dgx-b200", "b200_sxm", "trtllm", "1.3.0rc20", "qwen3-235b-a22b", 8, "fp8"),
]


@pytest.mark.parametrize(
    ("preset", "folder", "engine", "version", "name", "tp", "kv"), _DECODE_CASES
)
def test_gqa_decode_attention_takes_the_engines_measured_latency(
    preset: str, folder: str, engine: str, version: str, name: str, tp: int, kv: str
) -> None:
    """One rank's decode attention of a Llama-3.1-70B / Qwen3-235B shape costs what the engine's
    own generation-attention table measured (aiconfigurator's parquet, read here directly), from
    launch-bound (one sequence, 1K keys) to bandwidth-bound (256 sequences, 16K keys)."""
    from cost_model._kernel_curves_attention import decode_attention_time_s

    a = _serving_model(name).attention
    heads, kv_heads = a.num_heads // tp, max(a.num_kv_heads // tp, 1)
    element = {"bf16": 2.0, "fp8": 1.0}[kv]
    rows = _read(
        _aiconfigurator_root()
        / f"systems/data/{folder}/attention/{engine}/{version}/generation_attention_perf.parquet"
    )
    measured: dict[tuple[int, int], float] = {}
    for r in rows:
        if (
            (r["num_heads"], r["num_key_value_heads"], r["head_dim"]) == (heads, kv_heads, 128)
            and r["window_size"] == 0
            and r["kv_cache_dtype"] == {"bf16": "bfloat16", "fp8": "fp8"}[kv]
        ):
            key = (r["batch_size"], r["isl"] + r["step"])
            measured[key] = min(measured.get(key, np.inf), r["latency"] * 1e-3)
    points = [(b, n) for b in (1, 8, 64, 256) for n in (1024, 4096, 16384) if (b, n) in measured]
    assert len(points) >= 10
    batch, keys = (np.array(x, dtype=np.float64) for x in zip(*points))
    seconds = decode_attention_time_s(
        hardware=get_preset(preset).device,
        flops=batch * keys * 4.0 * heads * a.head_dim,
        bytes_moved=batch * keys * kv_heads * 2.0 * a.head_dim * element,
        tokens=keys,
        units=batch * kv_heads,
        group=heads / kv_heads,
        kv_element_bytes=element,
        engine=engine,
    )
    assert seconds is not None
    expected = np.array([measured[p] for p in points])
    # the curves keep the mean over the KV-head splits of a call's (sequence, KV head) pairs:
    # a short launch-bound call of one split runs up to ~13% off it (B200 TensorRT-LLM FP8, 8
    # sequences at 1K keys), the rest within a few percent
    np.testing.assert_allclose(seconds, expected, rtol=0.15)
    assert np.mean(np.abs(seconds / expected - 1.0)) < 0.03


def test_gqa_decode_attention_is_priced_from_the_table_where_one_exists() -> None:
    """Llama-3.1-70B TP8 decode of 64 sequences on the H100: core attention is the SGLang table's
    latency at the pass's shape and its kernel pays no per-kernel floor; a device without tables
    (renamed) and a KV-cache dtype the device's tables lack (the A100's measure BF16 caches
    only) keep the roofline with the calibration's efficiency, and the floor."""
    from cost_model._inference_compute import _decode_attention_measured
    from cost_model._inference_kernels import _measured_kernels_per_pass
    from cost_model._inference_setup import _setup
    from cost_model._kernel_curves_attention import decode_attention_time_s
    from cost_model._options import EstimateOptions

    model = _serving_model("llama-3.1-70b")
    table = table_from_columns(tp=8, batch_size=64, phase=PHASE_CODES["decode"])

    def renamed(name: str):
        plain = get_preset(name)
        device = plain.device.model_copy(update={"name": plain.device.name + " (no curves)"})
        return plain.model_copy(update={"device": device})

    per_layer, measured, floors = {}, {}, {}
    for label, cluster, kv in (
        ("h100", get_preset("dgx-h100"), "bf16"),
        ("h100 plain", renamed("dgx-h100"), "bf16"),
        ("a100 bf16", get_preset("dgx-a100"), "bf16"),
        ("a100 fp8", get_preset("dgx-a100"), "fp8"),
        ("a100 fp8 plain", renamed("dgx-a100"), "fp8"),
    ):
        workload = Inference(
            prompt_tokens=2000,
            output_tokens=1000,
            weight_dtype="bf16",
            kv_dtype=kv,
            serving_engine="sglang",
        )
        out = estimate_inference_table(model=model, cluster=cluster, workload=workload, table=table)
        per_layer[label] = float(out["time.decode_attention"][0]) / model.num_layers
        setup = _setup(
            model=model, cluster=cluster, workload=workload, table=table, options=EstimateOptions()
        )
        measured[label] = bool(_decode_attention_measured(setup)[0])
        floors[label] = float(np.asarray(_measured_kernels_per_pass(setup, decode=True)).ravel()[0])
    # a decode step at the mean context: the prompt and half the output, plus the new token
    keys = np.array([2000.0 + 1001.0 / 2.0])
    table_s = decode_attention_time_s(
        hardware=get_preset("dgx-h100").device,
        flops=64 * keys * 4.0 * 8 * 128,
        bytes_moved=64 * keys * 2.0 * 128 * 2.0,
        tokens=keys,
        units=64.0,
        group=8.0,
        kv_element_bytes=2.0,
        engine="sglang",
    )
    assert table_s is not None
    # (the cache read rounds the context up to whole tokens)
    assert per_layer["h100"] == pytest.approx(float(table_s[0]), rel=1e-3)
    assert per_layer["h100"] != pytest.approx(per_layer["h100 plain"], rel=0.05)
    assert measured["h100"] and not measured["h100 plain"]
    assert measured["a100 bf16"] and not measured["a100 fp8"]
    assert per_layer["a100 fp8"] == pytest.approx(per_layer["a100 fp8 plain"], rel=1e-9)
    # the one attention kernel a layer pays no floor where the table times it
    assert floors["a100 bf16"] - floors["a100 fp8"] == model.num_layers


def test_a_decode_only_iteration_keeps_the_attention_kernels_fixed_latency() -> None:
    """The serving load prices decode attention per request at 256 sequences; the measured GQA
    decode kernel is launch-bound below that (Qwen3-235B at TP8 on B200: ~9 us a layer for one
    sequence, SGLang's table ~10 us). A decode-only iteration of a grid size still costs exactly
    its decode pass, attention included, not 94 layers x a 256th of the batch-256 kernel."""
    from cost_model._inference_load import serving_inputs
    from cost_model._inference_passes import _pass_parts
    from cost_model._inference_setup import _passes, _setup
    from cost_model._options import EstimateOptions
    from cost_model._parallel import ParallelConfig
    from cost_model._serving_columns import ServingConfig
    from cost_model._table import configs_to_table

    model = get_model("qwen3-235b-a22b")
    cluster = get_preset("dgx-b200")
    workload = Inference(
        prompt_tokens=610, output_tokens=421, weight_dtype="bf16", serving_engine="sglang"
    )
    table = configs_to_table(
        [ParallelConfig(tp=8, ep=1, etp=8)], **ServingConfig().columns(workload=workload)
    )
    cost, _, _ = serving_inputs(model=model, cluster=cluster, workload=workload, table=table)
    setup = _setup(
        model=model, cluster=cluster, workload=workload, table=table, options=EstimateOptions()
    )
    for sequences in (1.0, 16.0):
        exposed, _ = _pass_parts(setup, _passes(setup, np.array([sequences]))[1])
        assert exposed["attention"][0] > model.num_layers * 5e-6
        iteration = cost.seconds(np.array([sequences]), np.array([0.0]))
        assert iteration[0] == pytest.approx(
            cost.floor_s[0] + sum(v[0] for v in exposed.values()), rel=1e-9
        )


def test_same_slice_shapes_are_told_apart_by_expert_count() -> None:
    # DeepSeek-V3's and Kimi-K2's experts split over 8 ranks are one 7168 x 256 slice; a rank of
    # 384 experts is priced on Kimi-K2's measured table, one of 256 on DeepSeek-V3's

    def row(experts: int, count: str) -> float:
        (curve,) = [
            c
            for c in kernel_curves()["grouped_gemm"]
            if c["device"] == "NVIDIA B200 SXM"
            and c["dtype"] == "fp4"
            and c["engine"] == "sglang"
            and c["shape"] == {**c["shape"], "num_experts": experts, "expert_ffn_size": 256}
        ]
        return curve["experts_per_device"][count][8]

    def priced(experts_per_device: float) -> float:
        value = grouped_gemm_efficiency(
            device_name="NVIDIA B200 SXM",
            dtype="fp4",
            tokens_per_expert=TOKENS_PER_EXPERT_GRID[8],
            experts_per_device=experts_per_device,
            expert_elements=7168 * 256,
            engine="sglang",
        )
        assert value is not None
        return float(np.squeeze(value))

    assert row(384, "384") != pytest.approx(row(256, "256"), rel=0.05)
    assert priced(384) == pytest.approx(row(384, "384"))
    assert priced(256) == pytest.approx(row(256, "256"))
    assert priced(96) == pytest.approx(row(384, "96"))


def test_a_graph_replayed_pass_prices_its_gemms_at_the_fastest_table() -> None:
    """vLLM's block-FP8 table on B200 times one call from the host (0.18-0.28 ms at M = 1-8
    where SGLang's and TensorRT-LLM's time the same GEMM at 0.011 ms): a decode step replayed
    from a CUDA graph takes the fastest engine's table, an eager pass keeps the engine's own."""
    from cost_model._inference_compute import _gemms
    from cost_model._inference_ops import attention_projections
    from cost_model._inference_setup import _setup
    from cost_model._kernel_curves_gemm import projections_time_s
    from cost_model._options import EstimateOptions

    model = get_model("deepseek-v3")
    projections = attention_projections(model)
    table = table_from_columns(tp=8, etp=8, batch_size=1, phase=PHASE_CODES["decode"])
    cluster = get_preset("dgx-b200")

    def gemms(engine: str, graphed: bool) -> float:
        workload = Inference(
            prompt_tokens=1000, output_tokens=64, weight_dtype="fp8", serving_engine=engine
        )
        setup = _setup(
            model=model, cluster=cluster, workload=workload, table=table, options=EstimateOptions()
        )
        return float(_gemms(setup, np.ones(1), projections, setup.shard, graphed=graphed)[0])

    fastest = float(
        projections_time_s(
            hardware=cluster.device,
            dtype="fp8",
            m=1.0,
            shard=8.0,
            projections=projections,
            engine=None,
        )[0]
    )
    eager_vllm, graphed_vllm = gemms("vllm", False), gemms("vllm", True)
    assert graphed_vllm == pytest.approx(fastest, rel=1e-9)
    assert eager_vllm > 5.0 * graphed_vllm  # the host-timed table, kept where a pass runs eagerly
    assert gemms("sglang", True) == pytest.approx(fastest, rel=0.25)
    assert gemms("sglang", True) <= gemms("sglang", False)
