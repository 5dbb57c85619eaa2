"""Static-batch prefill pass and decode step, the cost model beside aiconfigurator-core's SDK.

Usage:
    python benchmarks/compare_aiconfigurator.py                   # the whole grid
    python benchmarks/compare_aiconfigurator.py --models deepseek-v3 --gpus h200 --batches 8
    python benchmarks/compare_aiconfigurator.py --families        # per-family lines per case

A diagnostic, not a test: it locates where the two compositions of operator tables differ. Both
sides price one static batch of ``batch`` prompts of ``isl`` tokens in one prefill pass (no
chunking) and one decode step of ``batch`` sequences at the mean decode context
(``isl + (osl + 1) / 2``). aiconfigurator's figures come from
``aiconfigurator_core.sdk.engine.EngineHandle`` (``compile`` a model/system/backend/layout, then
``run_static_per_op`` for the context phase and ``decode_step_per_op`` for one generation step:
per-op latencies summed over layers). They are another model's outputs, not measurements: never
a fit input or a validation row.

The cost model's figures are the passes ``_inference_passes._pass_parts`` prices (exposed parts,
the eager host shortfall of ``_inference_kernels._host_bound`` included), split by family from the
same internals (``_inference_compute``, ``_inference_comm``, ``_inference_kernels``). Families:

    attention   attention projections + core attention (MLA: aiconfigurator's whole MLA block)
    dense_ffn   dense-layer FFN GEMMs and activation
    moe         router, shared and routed experts (ours: with the MoE layer's memory passes)
    elementwise norms, residual adds, RoPE, casts (ours: the attention/dense memory passes)
    lm_head     logits GEMM (+ embedding lookup on aiconfigurator's side)
    comm        TP all-reduces, MoE dispatch/combine, embedding all-reduce (exposed)
    floors      ours: per-kernel launch floors and the eager host shortfall; aic: ops no rule
                of ``aic_family`` matches (none in this grid)

Engine per-iteration work outside the pass (scheduler, sampling, per-request overhead) is printed
apart: aiconfigurator's static estimate has none.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from cost_model import EstimateOptions, Inference, ParallelConfig, ServingConfig, configs_to_table
from cost_model import _inference_ops as ops
from cost_model._inference_comm import _comm_times, _fused_norm_kernels
from cost_model._inference_compute import _attention_gemms, _attention_time, _gemms, _moe_time
from cost_model._inference_kernels import (
    _host_bound,
    _kernels_per_pass,
    _measured_kernels_per_pass,
    pass_runs_eagerly,
)
from cost_model._inference_passes import _pass_parts
from cost_model._inference_setup import (
    _cast_bytes,
    _memory_pass,
    _mm,
    _part_dtype,
    _passes,
    _setup,
    _tokens,
)
from cost_model._options import calibration_for
from cost_model._serving_validation import (
    row_fp8_scaling,
    row_kv_dtype,
    row_model,
    row_weight_dtype_by_part,
)
from cost_model._units import dtype_bytes
from topology import get_preset

FAMILIES = ("attention", "dense_ffn", "moe", "elementwise", "lm_head", "comm", "floors")


@dataclass(frozen=True)
class ModelCase:
    """One model on both sides: our name, aiconfigurator's HF id and quant modes."""

    name: str
    hf_id: str
    weight_dtype: str
    gemm_quant: str
    moe_quant: str | None


@dataclass(frozen=True)
class LayoutCase:
    """Attention TP and the MoE split (``etp`` = MoE TP, ``ep`` = expert parallel)."""

    tp: int
    ep: int
    etp: int

    @property
    def label(self) -> str:
        return f"tp{self.tp}" + (f"ep{self.ep}" if self.ep > 1 else "")


MODELS = {
    "deepseek-v3": ModelCase(
        "deepseek-v3", "deepseek-ai/DeepSeek-V3", "fp8", "fp8_block", "fp8_block"
    ),
    "qwen3-235b-a22b": ModelCase(
        "qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B-FP8", "fp8", "fp8_block", "fp8_block"
    ),
    "llama-3.1-70b": ModelCase(
        "llama-3.1-70b", "meta-llama/Meta-Llama-3.1-70B", "bf16", "bfloat16", None
    ),
}
#: Layouts per model: MoE TP8 is not a valid block-FP8 split of Qwen3's 1536-wide experts
#: (1536 / 8 = 192, not a multiple of the 128 block), so Qwen3 runs EP only.
LAYOUTS = {
    "deepseek-v3": (LayoutCase(8, 1, 8), LayoutCase(8, 8, 1)),
    "qwen3-235b-a22b": (LayoutCase(8, 8, 1), LayoutCase(4, 4, 1)),
    "llama-3.1-70b": (LayoutCase(8, 1, 1), LayoutCase(4, 1, 1)),
}
GPUS = {"h200": ("dgx-h200", "h200_sxm"), "b200": ("dgx-b200", "b200_sxm")}
ENGINES = ("sglang", "trtllm", "vllm")


def _f(values: Any) -> float:
    """The slowest rank's value of a one-row array."""
    return float(np.max(values))


def our_setup(*, model: ModelCase, gpu: str, engine: str, layout: LayoutCase, isl: int, osl: int):
    """The cost model's setup of one static batch row (``_inference_setup._setup``)."""
    row = {"model": model.name, "weight_dtype": model.weight_dtype, "kv_dtype": "auto"}
    workload = Inference(
        prompt_tokens=isl,
        output_tokens=osl,
        weight_dtype=cast(Any, model.weight_dtype),
        weight_dtype_by_part=cast(Any, row_weight_dtype_by_part(row)),
        kv_dtype=cast(Any, row_kv_dtype(row)),
        fp8_scaling=cast(Any, row_fp8_scaling(row)),
        serving_engine=cast(Any, engine),
    )
    cluster = get_preset(GPUS[gpu][0], num_nodes=1)
    config = ParallelConfig(tp=layout.tp, ep=layout.ep, etp=layout.etp)
    table = configs_to_table([config], **ServingConfig(batch_size=1).columns(workload=workload))
    options = EstimateOptions(calibration=calibration_for(cluster.device))
    return _setup(
        model=row_model(row), cluster=cluster, workload=workload, table=table, options=options
    )


def _compute_families(s, p: ops.Pass) -> dict[str, float]:
    """``_inference_passes._compute_time`` and the core attention, split by family (seconds)."""
    model, lay, tp = s.model, s.layout, s.column("tp")
    act = dtype_bytes(s.workload.activation_dtype)
    attention_tokens, rank_tokens = _tokens(s, p)
    dense_tokens = np.where(s.attention_dp, attention_tokens * tp, attention_tokens)
    head_tokens = p.batch * p.head_tokens / s.column("cp") * np.where(s.attention_dp, tp, 1.0)
    w_head = model.vocab_size * model.hidden_size / tp
    head_bytes = dtype_bytes(_part_dtype(s, "lm_head"))
    head = _mm(
        s,
        2 * w_head * head_tokens,
        w_head * head_bytes + head_tokens * model.vocab_size / tp * ops.LOGIT_BYTES,
        "lm_head",
    )
    side = ops.attention_side_bytes(
        model, decode=p.decode, act=act, cast=_cast_bytes(s, "attention"), shard=s.shard
    )
    dense_side = ops.dense_ffn_side_bytes(
        model, model.ffn_hidden_size / tp, act=act, cast=_cast_bytes(s, "dense_ffn")
    )
    graphed = ~pass_runs_eagerly(s, p)  # as ``_inference_passes._compute_time`` prices them
    dense = _gemms(
        s,
        dense_tokens,
        ops.ffn_projections(model, model.ffn_hidden_size),
        tp,
        part="dense_ffn",
        graphed=graphed,
    )
    kernels = (
        _kernels_per_pass(s)
        - _measured_kernels_per_pass(s, decode=p.decode)
        - _fused_norm_kernels(s, p)
    )
    return {
        "attention": _f(
            lay.layers * _attention_gemms(s, attention_tokens, decode=p.decode, graphed=graphed)
        )
        + _f(lay.layers * _attention_time(s, p)),
        "dense_ffn": _f(lay.dense_layers * dense),
        "moe": _f(
            lay.moe_layers
            * _moe_time(s, attention_tokens, rank_tokens, decode=p.decode, graphed=graphed)
        ),
        "elementwise": _f(lay.layers * _memory_pass(s, side * attention_tokens))
        + _f(lay.dense_layers * _memory_pass(s, dense_side * dense_tokens)),
        "lm_head": _f(lay.has_lm_head * head),
        "floors": _f(kernels * s.profile.kernel_floor_s),
    }


def our_pass(s, p: ops.Pass) -> tuple[float, dict[str, float]]:
    """One pass's exposed seconds and its families; ``comm`` = exposed traffic, and the gap
    between the families and the exposed total (SM contention, host shortfall) joins ``floors``."""
    exposed, _ = _pass_parts(s, p)
    exposed = _host_bound(s, exposed, pass_runs_eagerly(s, p))
    total = sum(_f(v) for v in exposed.values())
    families = _compute_families(s, p)
    families["comm"] = sum(_f(exposed[k]) for k in ("tp_comm", "ep_comm", "cp_comm", "pp_comm"))
    raw_comm = sum(_f(v) for v in _comm_times(s, p).values())
    assert raw_comm >= families["comm"] - 1e-12
    families["floors"] += total - sum(families.values())
    return total, families


def ours(*, model, gpu, engine, layout, batch: int, isl: int, osl: int) -> dict[str, Any]:
    """The cost model's prefill pass and decode step (seconds) with families and step floors."""
    s = our_setup(model=model, gpu=gpu, engine=engine, layout=layout, isl=isl, osl=osl)
    prefill, decode = _passes(s, np.full(1, float(batch)))
    prefill_s, prefill_families = our_pass(s, prefill)
    decode_s, decode_families = our_pass(s, decode)
    return {
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "prefill": prefill_families,
        "decode": decode_families,
        "step_floor_s": s.profile.scheduler_s + s.profile.sampling_s,
        "request_overhead_s": s.profile.request_overhead_s,
    }


def aic_family(op_name: str) -> str:
    """The family of one aiconfigurator per-op name (``context_``/``generation_`` stripped)."""
    name = op_name.split("_", 1)[1]
    rules = (
        (
            (
                "_ar",
                "ar_",
                "allreduce",
                "all_reduce",
                "dispatch",
                "p2p",
                "allgather",
                "reduce_scatter",
                "a2a",
                "alltoall",
            ),
            "comm",
        ),
        (("logits", "embedding"), "lm_head"),
        (("router", "shared", "moe"), "moe"),
        (("mla", "attention", "qkv", "proj_gemm", "bmm"), "attention"),
        (("gate_ffn1", "ffn2", "act_gate"), "dense_ffn"),
        (("norm", "rope", "add", "quant"), "elementwise"),
    )
    for keys, family in rules:
        if any(key in name for key in keys):
            return family
    return "floors"


def balanced_routing() -> None:
    """Make aiconfigurator read its ``balanced`` MoE rows instead of its default
    ``power_law`` ones (``sdk/config.py`` ``ModelConfig.workload_distribution``), as the cost
    model's ``EstimateOptions.routing_imbalance`` = 1 does: wraps the ``build_model_config``
    that ``sdk.engine.compile_engine`` calls."""
    from aiconfigurator_core.sdk import engine

    build = engine.build_model_config

    def build_balanced(**kwargs: Any):
        config = build(**kwargs)
        config.workload_distribution = "balanced"
        return config

    setattr(engine, "build_model_config", build_balanced)  # noqa: B010  # a module attribute


def aic_handle(*, model: ModelCase, system: str, engine: str, layout: LayoutCase):
    """aiconfigurator's compiled engine for one case (``sdk.engine.EngineHandle.compile``)."""
    from aiconfigurator_core.sdk.engine import EngineHandle

    moe = {} if model.moe_quant is None else {"moe_tp_size": layout.etp, "moe_ep_size": layout.ep}
    return EngineHandle.compile(
        model.hf_id,
        system,
        engine,
        tp_size=layout.tp,
        gemm_quant_mode=model.gemm_quant,
        moe_quant_mode=model.moe_quant,
        kvcache_quant_mode="bfloat16",
        fmha_quant_mode="bfloat16",
        **moe,
    )


def _fold(values) -> tuple[float, dict[str, float], dict[str, float]]:
    families = dict.fromkeys(FAMILIES, 0.0)
    by_op: dict[str, float] = {}
    for name, latency_ms, *_ in values:
        families[aic_family(name)] += latency_ms * 1e-3
        by_op[name] = by_op.get(name, 0.0) + latency_ms * 1e-3
    return sum(families.values()), families, by_op


def theirs(handle, *, batch: int, isl: int, osl: int) -> dict[str, Any]:
    """aiconfigurator's context phase and one generation step (seconds) with families."""
    context, _ = handle.run_static_per_op(batch_size=batch, isl=isl, osl=osl)
    prefill_s, prefill, prefill_ops = _fold(context)
    decode_s, decode, decode_ops = _fold(handle.decode_step_per_op(batch, isl, osl))
    return {
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "prefill": prefill,
        "decode": decode,
        "ops": {"prefill": prefill_ops, "decode": decode_ops},
    }


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan")


def print_case(case: dict[str, Any], *, families: bool, ops_detail: bool) -> None:
    """One grid point: totals and ratios, then (optionally) the families side by side."""
    o, t = case["ours"], case["aic"]
    print(
        f"{case['label']:<52} prefill {o['prefill_s'] * 1e3:9.2f} {t['prefill_s'] * 1e3:9.2f}"
        f" x{_ratio(o['prefill_s'], t['prefill_s']):5.2f} | decode {o['decode_s'] * 1e3:7.2f}"
        f" {t['decode_s'] * 1e3:7.2f} x{_ratio(o['decode_s'], t['decode_s']):5.2f}"
    )
    if families:
        for phase in ("prefill", "decode"):
            cells = [
                f"{f}={o[phase][f] * 1e3:.2f}/{t[phase][f] * 1e3:.2f}"
                for f in FAMILIES
                if o[phase][f] or t[phase][f]
            ]
            print(f"    {phase:<8} ours/aic ms: " + "  ".join(cells))
    if ops_detail:
        for phase in ("prefill", "decode"):
            cells = [f"{k}={v * 1e3:.3f}" for k, v in t["ops"][phase].items() if v]
            print(f"    aic {phase} ops ms: " + "  ".join(cells))


def print_summary(cases: list[dict[str, Any]]) -> None:
    """Per model/GPU/engine: median (min-max) ratios, and the three families with the largest
    mean difference per phase, ours - aic, in % of aiconfigurator's phase total (signed)."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for case in cases:
        groups.setdefault(case["key"], []).append(case)
    print("\nsummary: model gpu engine | ours/aic prefill, decode: median (min-max)")
    print("          top family gaps, ours - aic, % of aic's phase total (mean over the grid)")
    for key, rows in groups.items():
        cells = []
        for phase in ("prefill", "decode"):
            ratios = [_ratio(r["ours"][f"{phase}_s"], r["aic"][f"{phase}_s"]) for r in rows]
            cells.append(f"x{np.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
        print(f"{' '.join(key):<32} prefill {cells[0]:<20} decode {cells[1]}")
        for phase in ("prefill", "decode"):
            gaps = {
                f: 100
                * float(
                    np.mean(
                        [
                            (r["ours"][phase][f] - r["aic"][phase][f]) / r["aic"][f"{phase}_s"]
                            for r in rows
                        ]
                    )
                )
                for f in FAMILIES
            }
            top = sorted(gaps.items(), key=lambda item: -abs(item[1]))[:3]
            print(f"    {phase:<8} " + "  ".join(f"{f} {g:+.1f}%" for f, g in top))


def run_grid(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every grid point both sides can price; a combination aiconfigurator lacks data for is
    reported once and skipped."""
    cases = []
    for name in args.models:
        model = MODELS[name]
        for gpu in args.gpus:
            for engine in args.engines:
                for layout in LAYOUTS[name][: args.layouts]:
                    try:
                        handle = aic_handle(
                            model=model, system=GPUS[gpu][1], engine=engine, layout=layout
                        )
                    except Exception as error:  # a missing table is a result
                        print(f"skip {name} {gpu} {engine} {layout.label}: {error!s:.160}")
                        continue
                    for isl in args.isl:
                        for batch in args.batches:
                            label = f"{name} {gpu} {engine} {layout.label} b{batch} isl{isl}"
                            try:
                                aic = theirs(handle, batch=batch, isl=isl, osl=args.osl)
                            except Exception as error:
                                print(f"skip {label}: {error!s:.160}")
                                continue
                            mine = ours(
                                model=model,
                                gpu=gpu,
                                engine=engine,
                                layout=layout,
                                batch=batch,
                                isl=isl,
                                osl=args.osl,
                            )
                            case = {
                                "label": label,
                                "key": (name, gpu, engine),
                                "ours": mine,
                                "aic": aic,
                            }
                            print_case(case, families=args.families, ops_detail=args.ops)
                            cases.append(case)
    return cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--gpus", nargs="+", default=list(GPUS), choices=list(GPUS))
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64, 256])
    parser.add_argument("--isl", nargs="+", type=int, default=[1024, 8192])
    parser.add_argument("--osl", type=int, default=1024)
    parser.add_argument("--layouts", type=int, default=2, help="first N layouts per model")
    parser.add_argument("--families", action="store_true", help="families side by side")
    parser.add_argument("--ops", action="store_true", help="aiconfigurator's per-op list")
    parser.add_argument(
        "--balanced", action="store_true", help="aiconfigurator's balanced MoE rows"
    )
    args = parser.parse_args()
    try:
        import aiconfigurator_core  # noqa: F401
    except ImportError:
        print(
            "aiconfigurator-core is not installed: `pip install aiconfigurator-core==0.12.0` "
            "to run this comparison.",
            file=sys.stderr,
        )
        return 0
    if args.balanced:
        balanced_routing()
    print("case | prefill ms ours aic ratio | decode step ms ours aic ratio")
    cases = run_grid(args)
    if cases:
        floors = {c["key"][2]: c["ours"]["step_floor_s"] for c in cases}
        print("\nours, outside the pass: scheduler+sampling per iteration (ms):", end=" ")
        print(", ".join(f"{e} {v * 1e3:.2f}" for e, v in floors.items()))
        print_summary(cases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
