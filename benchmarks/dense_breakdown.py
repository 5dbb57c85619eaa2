"""A dense model's serving passes term by term, next to the engine's operator tables.

Usage:
    python benchmarks/dense_breakdown.py                      # NIM Llama-3.3-70B fp8 TP2 H100
    python benchmarks/dense_breakdown.py --row <row id> --batch 1 16 86 --aic /tmp/aic/unpacked

For one benchmark row of ``data/serving_validation.json`` (its model, layout, precision and engine
profile) it prices a decode step at each ``--batch`` (every sequence at the row's mean decode
context) and a prefill of one prompt of the row's length, as the cost model's inference passes
(``cost_model._inference_passes``) do: each dense GEMM (M = tokens, N x K = one rank's slice), the
LM head, core attention, the memory passes (norms, RoPE, casts, residuals), the per-kernel floors
and the tensor-parallel all-reduces. The tables' column reads aiconfigurator-core 0.12.0's parquet
files for the row's engine and device directly (``--aic``: the unpacked wheel; left out without it):
the fastest kernel at the nearest measured M (log-linear between measured M) for the exact N x K,
per-tensor (``fp8``) and block-scaled (``fp8_block``) FP8; decode attention
(``generation_attention_perf``) at the batch, context and KV-cache dtype; context attention at the
prompt length; the all-reduce (``custom_allreduce_perf``) at the message size. Operator tables are
fit input; the row's published figures are printed for reference only (validation, never fitted).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np

from cost_model import (
    EstimateOptions,
    ParallelConfig,
    ServingConfig,
    _inference_setup,
    configs_to_table,
)
from cost_model import _inference_ops as ops
from cost_model._inference_comm import _comm_times, _fused_norm_kernels
from cost_model._inference_compute import _attention_time, _gemms
from cost_model._inference_kernels import _kernels_per_pass, _measured_kernels_per_pass
from cost_model._inference_passes import _compute_time, _pass_parts
from cost_model._inference_setup import _cast_bytes, _memory_pass, _passes, _tokens
from cost_model._units import dtype_bytes
from topology import get_preset

ROW = "nim:h100:trtllm:llama-3.3-70b:tp2:c1:in5000:out500"
FOLDERS = {"dgx-h100": "h100_sxm", "dgx-h200": "h200_sxm", "dgx-b200": "b200_sxm"}


def _setup(row: dict, phase: str, batch: int):
    from cost_model._serving_validation import _benchmark_workload, row_model

    model = row_model(row)
    cluster = get_preset(row["preset"], num_nodes=row.get("nodes", 1))
    workload = _benchmark_workload(row)
    table = configs_to_table(
        [ParallelConfig(**row["config"])],
        **ServingConfig(phase=phase, batch_size=batch).columns(workload=workload),
    )
    s = _inference_setup._setup(
        model=model, cluster=cluster, workload=workload, table=table, options=EstimateOptions()
    )
    return s


def model_terms(row: dict, batch: int, *, decode: bool) -> dict[str, float]:
    """Seconds of one pass by term as the cost model prices it (all layers)."""
    s = _setup(row, "decode" if decode else "prefill", batch)
    prefill, step = _passes(s, np.full(1, float(batch)))
    p = step if decode else prefill
    model, lay = s.model, s.layout
    layers = float(np.max(lay.layers))
    at, _ = _tokens(s, p)
    names = ("qkv_proj", "o_proj")
    terms = {
        f"GEMM {name}": layers * float(_gemms(s, at, (proj,), s.shard, part="attention")[0])
        for name, proj in zip(names, ops.attention_projections(model), strict=True)
    }
    tp = s.column("tp")
    for name, proj in zip(
        ("gate_up_proj", "down_proj"),
        ops.ffn_projections(model, model.ffn_hidden_size),
        strict=True,
    ):
        terms[f"GEMM {name}"] = layers * float(_gemms(s, at, (proj,), tp, part="dense_ffn")[0])
    compute = float(np.max(_compute_time(s, p)))
    act = dtype_bytes(s.workload.activation_dtype)
    cast = _cast_bytes(s, "attention")
    side = ops.attention_side_bytes(model, decode=p.decode, act=act, cast=cast, shard=s.shard)
    dense = ops.dense_ffn_side_bytes(
        model, model.ffn_hidden_size / tp, act=act, cast=_cast_bytes(s, "dense_ffn")
    )
    terms["memory passes (norms, RoPE, casts, residuals)"] = layers * float(
        np.max(_memory_pass(s, side * at)) + np.max(_memory_pass(s, dense * at))
    )
    kernels = (
        _kernels_per_pass(s)
        - _measured_kernels_per_pass(s, decode=p.decode)
        - _fused_norm_kernels(s, p)
    )
    terms["per-kernel floors"] = float(np.max(kernels)) * s.profile.kernel_floor_s
    terms["LM head"] = compute - sum(terms.values())
    terms["core attention"] = layers * float(_attention_time(s, p)[0])
    comm = _comm_times(s, p)
    terms["TP all-reduce (2 per layer)"] = float(np.max(comm["tp_comm"]))
    terms["per-iteration sampling + scheduler"] = s.profile.sampling_s + s.profile.scheduler_s
    exposed, _ = _pass_parts(s, p)
    terms["pass (exposed)"] = sum(float(v[0]) for v in exposed.values())
    terms["_context"] = float(p.cached_tokens[0] + p.new_tokens[0])
    terms["_fused_norm"] = float(np.max(_fused_norm_kernels(s, p)))
    return terms


class _Tables:
    """The row's engine's newest aiconfigurator-core tables on the row's device."""

    def __init__(self, row: dict, root: Path) -> None:
        self.base = root / "aiconfigurator_core/systems/data" / FOLDERS[row["preset"]]
        self.engine = row["engine"]

    def newest(self, op: str, name: str):
        import pandas as pd

        paths = sorted((self.base / op / self.engine).glob(f"*/{name}"))
        with_version = [
            (tuple(int(x) for x in re.findall(r"\d+", p.parent.name)), p) for p in paths
        ]
        return pd.read_parquet(max(with_version)[1])


def _loglog(x: float, best) -> float:
    """Log-log interpolation of a measured series (index: the size) at ``x``."""
    return float(np.exp(np.interp(np.log(x), np.log(best.index), np.log(best.values))))


class _GemmTable:
    """GEMM latency from the table: the fastest kernel at each measured M, log-linear in M
    between them, log-bilinear between the measured N and K around the asked ones."""

    def __init__(self, tables: _Tables) -> None:
        self.gemm = tables.newest("gemm", "gemm_perf.parquet")
        self.scale = tables.newest("quantize", "computescale_perf.parquet")
        self.grid_n, self.grid_k = np.sort(self.gemm.n.unique()), np.sort(self.gemm.k.unique())

    def on_grid(self, m: int, n: int, k: int, dtype: str) -> float:
        table = "fp8" if dtype == "fp8 static" else dtype
        gemm = self.gemm
        rows = gemm[(gemm.gemm_dtype == table) & (gemm.n == n) & (gemm.k == k)]
        best = rows.groupby("m").latency.min().sort_index()
        if dtype == "fp8 static":  # less the dynamic amax step (the compute-scale table)
            steps = self.scale[self.scale.k == k].groupby("m").latency.min()
            best = best - steps.reindex(best.index).fillna(0.0)
        return _loglog(m, best)

    def seconds(self, m: int, n: int, k: int, dtype: str) -> float:
        def around(grid, x):
            lo, hi = grid[grid <= x].max(), grid[grid >= x].min()
            w = 0.0 if hi == lo else (np.log(x) - np.log(lo)) / (np.log(hi) - np.log(lo))
            return ((lo, 1.0 - w), (hi, w))

        total = 0.0
        for nn, wn in around(self.grid_n, n):
            for kk, wk in around(self.grid_k, k):
                if wn * wk > 0:
                    total += wn * wk * np.log(self.on_grid(m, int(nn), int(kk), dtype))
        return float(np.exp(total)) * 1e-3


def _gemm_terms(row: dict, tables: _Tables, model, m: int, batch: int) -> dict[str, float]:
    """The dense GEMMs of every layer and the LM head, per table dtype."""
    gemms = _GemmTable(tables)
    tp, a, h = int(row["config"]["tp"]), model.attention, model.hidden_size
    shapes = {
        "qkv_proj": ((a.num_heads + 2 * a.num_kv_heads) * a.head_dim // tp, h),
        "o_proj": (h, a.num_heads * a.head_dim // tp),
        "gate_up_proj": (2 * model.ffn_hidden_size // tp, h),
        "down_proj": (h, model.ffn_hidden_size // tp),
    }
    terms = {}
    for dtype in ("fp8 static", "fp8", "fp8_block"):
        for name, (n, k) in shapes.items():
            terms[f"GEMM {name} [{dtype}, N {n} K {k}]"] = model.num_layers * gemms.seconds(
                m, n, k, dtype
            )
    for dtype in ("bfloat16", "fp8 static"):  # the LM head runs on each sequence's last token
        terms[f"LM head [{dtype}, N {model.vocab_size // tp} K {h}]"] = gemms.seconds(
            batch, model.vocab_size // tp, h, dtype
        )
    return terms


def _heads(att, row: dict, model):
    tp, a = int(row["config"]["tp"]), model.attention
    return att[
        (att.num_heads == a.num_heads // tp)
        & (att.num_key_value_heads == max(a.num_kv_heads // tp, 1))
        & (att.head_dim == a.head_dim)
    ]


def _decode_attention_terms(row: dict, tables: _Tables, model, batch: int, context: float):
    kv = "fp8" if row.get("kv_dtype") == "fp8" else "bfloat16"
    att = _heads(tables.newest("attention", "generation_attention_perf.parquet"), row, model)
    sel = att[(att.kv_cache_dtype == kv) & (att.attn_dtype == "bfloat16")]
    sel = sel.assign(ctx=sel.isl + sel.step)
    grid = {}
    for b, g in sel.groupby("batch_size"):
        best = g.groupby("ctx").latency.min().sort_index()
        if len(best) >= 2:  # log-log between measured contexts, bandwidth-bound beyond
            grid[b] = _loglog(context, best) * max(context / best.index[-1], 1.0)
    bs = np.array(sorted(grid))
    lat = np.array([grid[b] for b in bs])
    at_batch = float(np.exp(np.interp(np.log(batch), np.log(bs), np.log(lat))))
    name = f"core attention [{kv} KV, measured batches {bs.min()}..{bs.max()}]"
    return {name: model.num_layers * at_batch * 1e-3}


def _context_attention_terms(row: dict, tables: _Tables, model, m: int) -> dict[str, float]:
    att = _heads(tables.newest("attention", "context_attention_perf.parquet"), row, model)
    sel = att[(att.batch_size == 1) & (att.window_size == 0)]
    terms = {}
    for dt, g in sel.groupby(["attn_dtype", "kv_cache_dtype"]):
        best = g.groupby("isl").latency.min().sort_index()
        terms[f"core attention [context, {dt[0]}/{dt[1]} KV]"] = (
            model.num_layers * _loglog(m, best) * 1e-3
        )
    return terms


def _all_reduce_terms(row: dict, tables: _Tables, model, m: int) -> dict[str, float]:
    comm = tables.newest("comm", "custom_allreduce_perf.parquet")
    comm = comm[comm.num_gpus == int(row["config"]["tp"])]
    terms = {}
    for backend, g in comm.groupby("backend") if "backend" in comm else [("", comm)]:
        best = g.groupby("message_size").latency.min().sort_index()
        terms[f"TP all-reduce x2 per layer [{backend}]"] = (
            2 * model.num_layers * _loglog(m * model.hidden_size, best) * 1e-3
        )
    return terms


def table_terms(row: dict, root: Path, batch: int, context: float, *, decode: bool) -> dict:
    """Seconds of the same terms from the engine's operator tables (all layers)."""
    from cost_model._serving_validation import row_model

    model = row_model(row)
    tables = _Tables(row, root)
    m = batch if decode else int(row["prompt_tokens"])
    terms = _gemm_terms(row, tables, model, m, batch)
    if decode:
        terms.update(_decode_attention_terms(row, tables, model, batch, context))
    else:
        terms.update(_context_attention_terms(row, tables, model, m))
    terms.update(_all_reduce_terms(row, tables, model, m))
    return terms


def main() -> None:
    from cost_model._serving_validation import serving_validation_data

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--row", default=ROW)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16, 86])
    parser.add_argument("--aic", type=Path, default=Path("/tmp/aic/unpacked"))
    args = parser.parse_args()
    (row,) = [r for r in serving_validation_data()["rows"] if r["id"] == args.row]
    have = (args.aic / "aiconfigurator_core").is_dir()
    cases = [(b, True) for b in args.batch] + [(1, False)]
    for batch, decode in cases:
        terms = model_terms(row, batch, decode=decode)
        context = terms.pop("_context")
        fused = terms.pop("_fused_norm")
        kind = (
            f"decode step, batch {batch}, context {context:.0f}"
            if decode
            else (f"prefill of {row['prompt_tokens']} tokens")
        )
        print(f"\n{row['id']}: {kind} (ms per pass; fused AR+norm kernels {fused:.0f})")
        for name, value in terms.items():
            print(f"  model  {name:58s} {value * 1e3:9.2f}")
        if have:
            for name, value in table_terms(row, args.aic, batch, context, decode=decode).items():
                print(f"  tables {name:58s} {value * 1e3:9.2f}")


if __name__ == "__main__":
    main()
