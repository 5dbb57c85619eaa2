"""One prefill pass of DeepSeek-V3/R1 at TP8 (attention TP, MoE TP: etp 8) on 8 x B200, op by op:
the cost model's parts next to the sum of the SGLang operator tables at the same shapes.

Usage:
    python benchmarks/prefill_breakdown.py                       # 1000 and 8000 prompt tokens
    python benchmarks/prefill_breakdown.py --tokens 610 4194 --aic /tmp/aic/unpacked
    python benchmarks/prefill_breakdown.py --rows c1             # every concurrency-1 TTFT row
    python benchmarks/prefill_breakdown.py --rows <row id> ...   # rows of serving_validation.json

The model's column comes from the cost model's inference internals (``cost_model._inference_*``
modules; one sequence, prefill pool: the pass ``_inference_passes._pass_parts`` prices). The tables'
column reads aiconfigurator-core 0.12.0's B200 SGLang parquet files directly (``--aic``: the
unpacked wheel; the column is left out without it): DeepGEMM block-FP8 GEMMs (with their activation
quantization) at M = tokens and each rank's N x K slice, the fused MoE op
(``sglang_flashinfer_trtllm_moe``, fp8_block, moe_tp 8, balanced), MLA context attention
(``trtllm_mla``, 16 heads per rank, one sequence), the router as a BF16 ``torch_linear`` and the
custom all-reduce (graph and eager rows: an eager row times one call launched alone, so it holds the
call's host launch, ~20 us on B200 at every size below 1 MB, which the eager pass's host issue time
already counts; the model prices the graph rows). The tables have no norms, RoPE, KV-cache store or
residual adds: the model's memory passes stand alone. Per-request CPU work (``request_overhead_s``)
and the host's eager launches (``eager_pass_host_s``) are listed after the GPU pass. Operator tables
are fit input; nothing end-to-end is read here.

``--rows`` takes benchmark rows of ``data/serving_validation.json`` instead (``c1``: every row at
concurrency 1, one prompt on an idle engine) and prices one prompt of the row's mean length on
the row's model, layout, precision and engine profile: the pass's exposed GPU parts, its kernels
and their host issue time where the engine runs it eagerly, the engine's per-request and
per-iteration floors, and the one-prompt TTFT they add up to, next to the simulator's prediction
and the published figure (validation only: printed, never fitted). ``serial`` is the bound where
the host's kernel issue does not overlap the GPU at all (GPU + host): a diagnostic, not a price.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from autoparallel import get_model
from cost_model import EstimateOptions, Inference, ParallelConfig, ServingConfig, configs_to_table
from cost_model import _inference_ops as ops
from cost_model._inference_comm import _comm_times
from cost_model._inference_compute import _attention_time, _fused_prefill_moe, _gemms, _moe_time
from cost_model._inference_kernels import (
    _kernels_per_pass,
    _measured_kernels_per_pass,
    eager_pass_host_s,
    pass_runs_eagerly,
)
from cost_model._inference_passes import _pass_parts
from cost_model._inference_setup import _cast_bytes, _memory_pass, _passes, _setup, _tokens
from topology import get_preset

TABLES = "aiconfigurator_core/systems/data/b200_sxm"
DEEPGEMM = "sglang_deepgemm_gemm_nt_f8f8bf16"


def model_parts(tokens: int) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds per pass by op, and the pass totals, as the cost model prices them."""
    model, cluster = get_model("deepseek-v3"), get_preset("dgx-b200", num_nodes=1)
    workload = Inference(
        prompt_tokens=tokens, output_tokens=1000, weight_dtype="fp8", serving_engine="sglang"
    )
    table = configs_to_table(
        [ParallelConfig(tp=8, ep=1, etp=8)],
        **ServingConfig(phase="prefill", batch_size=1).columns(workload=workload),
    )
    s = _setup(
        model=model, cluster=cluster, workload=workload, table=table, options=EstimateOptions()
    )
    prefill, _ = _passes(s, np.ones(1))
    at, rt = _tokens(s, prefill)
    layers, moe_layers = float(np.max(s.layout.layers)), float(np.max(s.layout.moe_layers))
    dense_layers = float(np.max(s.layout.dense_layers))
    moe = model.moe
    assert moe is not None
    act, cast = 2.0, _cast_bytes(s)
    names = ("fused_qkv_a", "q_b_proj", "kv_b_proj", "o_proj")
    parts = {
        f"attn {name}": layers * float(_gemms(s, at, (proj,), s.shard)[0])
        for name, proj in zip(names, ops.attention_projections(model), strict=True)
    }
    parts["core attention"] = layers * float(_attention_time(s, prefill)[0])
    dense = ops.ffn_projections(model, model.ffn_hidden_size)
    parts["dense FFN GEMMs"] = dense_layers * float(_gemms(s, at, dense, s.column("tp"))[0])
    router = _gemms(s, rt, ops.router_projections(model), np.ones(1), dtype="bf16")
    shared = _gemms(
        s, at, ops.ffn_projections(model, moe.num_shared_experts * moe.shared_ffn_size), s.shard
    )
    parts["router"] = moe_layers * float(router[0])
    parts["shared experts"] = moe_layers * float(shared[0])
    side = ops.moe_token_bytes(model, act=act, cast=cast, shard=s.shard)
    fused = bool(_fused_prefill_moe(s, decode=False)[0])
    if fused:
        side = side - ops.moe_combine_bytes(model, act=act)
    passes = moe_layers * float(_memory_pass(s, side * at)[0])
    moe_total = moe_layers * float(_moe_time(s, at, rt, decode=False)[0])
    parts["routed experts"] = moe_total - parts["router"] - parts["shared experts"] - passes
    parts["all-reduce x2 per layer"] = float(np.max(_comm_times(s, prefill)["tp_comm"]))
    attention_side = ops.attention_side_bytes(
        model, decode=False, act=act, cast=cast, shard=s.shard
    )
    dense_side = ops.dense_ffn_side_bytes(model, model.ffn_hidden_size / 8, act=act, cast=cast)
    parts["memory passes (norms, RoPE, casts, residuals)"] = (
        passes
        + layers * float(_memory_pass(s, attention_side * at)[0])
        + dense_layers * float(_memory_pass(s, dense_side * at)[0])
    )
    kernels = float(np.max(_kernels_per_pass(s)))
    measured = float(np.max(_measured_kernels_per_pass(s, decode=False)))
    parts["per-kernel floors"] = (kernels - measured) * s.profile.kernel_floor_s
    exposed, _ = _pass_parts(s, prefill)
    totals = {
        "GPU pass": sum(float(v[0]) for v in exposed.values()),
        "eager launches (host)": float(eager_pass_host_s(s)[0]),
        "request overhead": s.profile.request_overhead_s,
        "kernels per pass": kernels,
    }
    return parts, totals


def table_parts(tokens: int, root: Path) -> dict[str, float]:
    """Seconds per pass by op from the B200 SGLang operator tables (log-log interpolation)."""
    import pandas as pd

    base = root / TABLES
    gemm = pd.read_parquet(base / "gemm/sglang/0.5.14/gemm_perf.parquet")
    moe = pd.read_parquet(base / "moe/sglang/0.5.14/moe_perf.parquet")
    mla = pd.read_parquet(base / "mla/sglang/0.5.14/context_mla_perf.parquet")
    reduce = pd.read_parquet(base / "comm/sglang/0.5.14/custom_allreduce_perf.parquet")

    def loglog(x, y, at: float) -> float:
        return float(np.exp(np.interp(np.log(at), np.log(x), np.log(y)))) * 1e-3

    def grid_gemm(n: int, k: int, source: str) -> float:
        rows = gemm[(gemm.kernel_source == source) & (gemm.n == n) & (gemm.k == k)]
        rows = rows.sort_values("m")
        return loglog(rows.m, rows.latency, tokens)

    def gemm_s(n: int, k: int, source: str = DEEPGEMM) -> float:
        """On the grid, or scaled by N x K from the grid points around it (off-grid N or K)."""
        ns, ks = np.sort(gemm.n.unique()), np.sort(gemm.k.unique())
        if n in ns and k in ks:
            return grid_gemm(n, k, source)
        near = [
            (nn, kk)
            for nn in {ns[ns <= n].max(), ns[ns >= n].min()}
            for kk in {ks[ks <= k].max(), ks[ks >= k].min()}
        ]
        return float(np.mean([grid_gemm(nn, kk, source) * n * k / (nn * kk) for nn, kk in near]))

    moe_rows = moe[
        (moe.kernel_source == "sglang_flashinfer_trtllm_moe")
        & (moe.moe_dtype == "fp8_block")
        & (moe.hidden_size == 7168)
        & (moe.inter_size == 2048)
        & (moe.topk == 8)
        & (moe.num_experts == 256)
        & (moe.moe_tp_size == 8)
        & (moe.moe_ep_size == 1)
        & (moe.distribution == "balanced")
    ].sort_values("num_tokens")
    mla_rows = mla[
        (mla.num_heads == 16) & (mla.batch_size == 1) & (mla.kv_cache_dtype == "bfloat16")
    ].sort_values("isl")
    layers, dense_layers, moe_layers = 61, 3, 58
    parts = {
        "attn fused_qkv_a": layers * gemm_s(2112, 7168),
        "attn q_b_proj": layers * gemm_s(3072, 1536),
        "attn kv_b_proj": layers * gemm_s(4096, 512),
        "attn o_proj": layers * gemm_s(7168, 2048),
        "core attention": layers * loglog(mla_rows.isl, mla_rows.latency, tokens),
        "dense FFN GEMMs": dense_layers * (gemm_s(4608, 7168) + gemm_s(7168, 2304)),
        "router": moe_layers * gemm_s(256, 7168, "sglang_torch_linear"),
        "shared experts": moe_layers * (gemm_s(512, 7168) + gemm_s(7168, 256)),
        "routed experts": moe_layers * loglog(moe_rows.num_tokens, moe_rows.latency, tokens),
    }
    for backend in ("graph", "eager"):
        rows = reduce[(reduce.num_gpus == 8) & (reduce.backend == f"sglang_{backend}")]
        rows = rows.sort_values("message_size")  # elements (BF16)
        parts[f"all-reduce x2 per layer ({backend})"] = (
            2 * layers * loglog(rows.message_size, rows.latency, tokens * 7168)
        )
    return parts


def row_terms(row: dict) -> dict[str, float]:
    """Seconds of one prompt of ``row``'s mean length on an idle engine, by term (see ``--rows``)."""
    from cost_model._serving_validation import _benchmark_workload, row_model

    model = row_model(row)
    cluster = get_preset(row["preset"], num_nodes=row.get("nodes", 1))
    workload = _benchmark_workload(row)
    table = configs_to_table(
        [ParallelConfig(**row["config"])],
        **ServingConfig(phase="prefill", batch_size=1).columns(workload=workload),
    )
    s = _setup(
        model=model, cluster=cluster, workload=workload, table=table, options=EstimateOptions()
    )
    prefill, _ = _passes(s, np.ones(1))
    exposed, _ = _pass_parts(s, prefill)
    terms = {f"GPU {part}": float(v[0]) for part, v in exposed.items() if float(v[0]) > 0}
    gpu = sum(float(v[0]) for v in exposed.values())
    host = float(eager_pass_host_s(s)[0])
    eager = bool(pass_runs_eagerly(s, prefill)[0])
    overhead = s.profile.request_overhead_s + s.profile.iteration_floor_s
    terms.update(
        {
            "GPU pass": gpu,
            "kernels per pass": float(np.max(_kernels_per_pass(s))),
            "host issue (eager)": host if eager else 0.0,
            "request overhead + iteration floor": overhead,
            "one-prompt TTFT": (max(gpu, host) if eager else gpu) + overhead,
            "serial bound (GPU + host)": gpu + (host if eager else 0.0) + overhead,
        }
    )
    return terms


def print_rows(row_ids: list[str]) -> None:
    from cost_model._serving_validation import serving_validation_data, validate_serving

    rows = [r for r in serving_validation_data()["rows"] if r["kind"] == "benchmark"]
    if row_ids == ["c1"]:
        rows = [r for r in rows if r["concurrency"] == 1]
    else:
        rows = [r for r in rows if r["id"] in row_ids]
    predicted = {
        r.row_id: r.predicted
        for r in validate_serving(row_ids=tuple(r["id"] for r in rows))
        if "TTFT" in r.metric
    }
    for row in rows:
        terms = row_terms(row)
        print(
            f"\n{row['id']} ({row['engine']} {row.get('engine_version', '')}), prompt {row['prompt_tokens']}"
        )
        for name, value in terms.items():
            shown = f"{value:9.0f}" if name == "kernels per pass" else f"{value * 1e3:9.2f}"
            print(f"  {name:44s} {shown}")
        print(f"  {'simulator mean TTFT (ms)':44s} {predicted[row['id']]:9.2f}")
        print(f"  {'published mean TTFT (ms)':44s} {row['measured']['ttft_ms']:9.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1000, 8000])
    parser.add_argument("--aic", type=Path, default=Path("/tmp/aic/unpacked"))
    parser.add_argument("--rows", nargs="+", help="serving_validation.json row ids, or c1")
    args = parser.parse_args()
    if args.rows:
        print_rows(args.rows)
        return
    have_tables = (args.aic / TABLES).is_dir()
    for tokens in args.tokens:
        parts, totals = model_parts(tokens)
        tables = table_parts(tokens, args.aic) if have_tables else {}
        print(f"\nDeepSeek-V3 TP8 (etp 8) prefill of {tokens} tokens on 8 x B200, ms per pass")
        print(f"{'op':48s} {'model':>9s} {'tables':>9s}")
        for name in dict.fromkeys([*parts, *tables]):
            model_ms = f"{parts[name] * 1e3:9.2f}" if name in parts else f"{'':9s}"
            table_ms = f"{tables[name] * 1e3:9.2f}" if name in tables else f"{'':9s}"
            print(f"{name:48s} {model_ms} {table_ms}")
        for name, value in totals.items():
            shown = f"{value:9.0f}" if name == "kernels per pass" else f"{value * 1e3:9.2f}"
            print(f"{name:48s} {shown}")


if __name__ == "__main__":
    main()
