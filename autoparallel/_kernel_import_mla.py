"""MLA attention curves: aiconfigurator-core's MLA tables and FlashMLA's published figures.

Read: MLA decode and prefill attention (``mla/*/generation_mla_perf.parquet``,
``context_mla_perf.parquet``), as efficiency (the cost model's ideal time,
``cost_model._kernel_curves_attention.mla_decode_ideal_s`` or the causal prefill FLOPs at the
BF16 peak, over the measured latency) by context length and batch, one curve per head count per
rank; and
the batched GEMMs of absorbed MLA decode (``mla_bmm/*/mla_bmm_perf.parquet``, kept as measured).

MLA decode also gets curves of one kernel from its authors' published figures (DeepSeek's
FlashMLA, ``cost_model/data/flashmla_decode.json``: README throughput at the benchmark's shapes,
``flashmla_decode_curves``), written with the imported ones under engine ``"flashmla"``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from autoparallel._kernel_import_tables import DEVICES, _latest_tables, _read
from cost_model import MLA_CURVE_HEADS, attention_flops_per_key, mla_decode_ideal_s
from topology import get_preset

#: Fewest heads per rank of the MLA decode rows kept: the catalog's MLA models (64 or 128 heads)
#: at tensor parallelism up to 16.
MLA_MIN_HEADS = 4
#: MLA operator tables: file, and the batch sizes kept (decode: all; prefill: one prompt).
_MLA_TABLES = {
    "mla_decode": ("generation_mla_perf.parquet", None),
    "mla_prefill": ("context_mla_perf.parquet", (1,)),
}


def _mla_ideal_s(kind: str, *, hardware, batch: int, tokens: np.ndarray, heads: int) -> np.ndarray:
    """Ideal seconds of one MLA layer of DeepSeek-V3's head shape over ``heads`` heads on one
    rank: absorbed-form decode of one token at ``tokens`` context (every head reads the one
    latent), or an explicit-form causal prefill of a ``tokens`` prompt."""
    if kind == "mla_decode":
        return mla_decode_ideal_s(
            hardware=hardware, batch=batch, context_tokens=tokens, heads=heads
        )
    from autoparallel._catalog import get_model

    per_key = attention_flops_per_key(get_model("deepseek-v3"), decode=False) * heads / 128
    flops = batch * tokens * (tokens + 1.0) / 2.0 * per_key  # causal: query i attends i keys
    return flops / hardware.peak_flops_for("bf16")


def _mla_latencies(path: Path, kind: str) -> dict[int, dict[int, dict[int, float]]]:
    """Fastest measured seconds by heads per rank, then batch, then length: keys the decoded
    token attends (context plus itself) or the prompt's length; bf16 cache. The tables' heads
    are one rank's (``num_heads`` x ``tp_size`` is the model's); decode keeps every head count
    measured down to ``MLA_MIN_HEADS``, the heads a tensor-parallel rank runs (DeepSeek-V3's 128
    over tp 8: 16), prefill the 128 of one rank."""
    keep = _MLA_TABLES[kind][1]
    table: dict[int, dict[int, dict[int, float]]] = {}
    for row in _read(path):
        batch, heads = int(row["batch_size"]), int(row["num_heads"])
        if (
            (kind != "mla_decode" and heads != MLA_CURVE_HEADS)
            or heads < MLA_MIN_HEADS
            or row["kv_cache_dtype"] != "bfloat16"
            or (keep and batch not in keep)
        ):
            continue
        length = int(row["isl"]) + (int(row["step"]) if kind == "mla_decode" else 0)
        lengths = table.setdefault(heads, {}).setdefault(batch, {})
        lengths[length] = min(lengths.get(length, np.inf), float(row["latency"]) * 1e-3)
    kept = {
        heads: {batch: lengths for batch, lengths in batches.items() if len(lengths) >= 4}
        for heads, batches in table.items()
    }
    return {heads: batches for heads, batches in kept.items() if batches}


def _mla_curves(root: Path, device: str, engine: str, kind: str) -> list[dict]:
    """MLA attention efficiency by length for each measured batch (DeepSeek-V3's attention), one
    curve per head count per rank, from the newest table with 4+ lengths: on the lengths of the
    smallest batch, each batch's curve interpolated in log(length) and held beyond its longest
    measured length."""
    hardware = get_preset(DEVICES[device]).device
    for path in _latest_tables(root, device, "mla", engine, _MLA_TABLES[kind][0]):
        tables = _mla_latencies(path, kind)
        curves = []
        for heads, table in sorted(tables.items(), reverse=True):
            grid = np.array(sorted(table[min(table)]), dtype=np.float64)
            by_batch = {}
            for batch, lengths in sorted(table.items()):
                measured_at = np.array(sorted(lengths), dtype=np.float64)
                ideal = _mla_ideal_s(
                    kind, hardware=hardware, batch=batch, tokens=measured_at, heads=heads
                )
                efficiency = ideal / np.array([lengths[int(n)] for n in measured_at])
                values = np.interp(np.log(grid), np.log(measured_at), efficiency)
                by_batch[str(batch)] = [round(float(e), 4) for e in np.clip(values, 1e-3, 1.0)]
            curves.append(
                {
                    "device": hardware.name,
                    "engine": engine,
                    "engine_version": path.parent.name,
                    "dtype": "bf16",
                    "heads": heads,
                    "file": str(path.relative_to(root.parent)),
                    "context_tokens": grid.tolist(),
                    "efficiency_by_batch": by_batch,
                }
            )
        if curves:
            return curves
    return []


#: Published kernel figures kept as MLA decode curves: data file in ``cost_model/data`` -> engine
#: name of its curves (a kernel, not a serving engine: a workload asks for it by name,
#: ``Inference.mla_decode_kernel``).
PUBLISHED_MLA_DECODE = {"flashmla_decode.json": "flashmla"}


def flashmla_decode_curves() -> list[dict]:
    """FlashMLA's dense decoding kernel as MLA decode curves, one per query-head count, from its
    published throughput (``cost_model/data/flashmla_decode.json``, FlashMLA README at the commit
    it names): at each shape of the benchmark the README's figures come from, the kernel takes
    the longer of its FLOPs at the compute-bound figure and its bytes at the memory-bound one
    (FLOPs and bytes as the benchmark counts them); efficiency is the cost model's ideal time
    (``mla_decode_ideal_s`` at the preset's peaks) over that time."""
    from importlib import resources

    ((name, engine),) = PUBLISHED_MLA_DECODE.items()
    data = json.loads((resources.files("cost_model") / "data" / name).read_text())
    hardware = get_preset(data["device_preset"]).device
    context = np.asarray(data["cache_tokens"], dtype=np.float64)
    d, dv, size = data["head_dim_k"], data["head_dim_v"], data["element_bytes"]
    curves = []
    for heads in sorted(data["query_heads"], reverse=True):
        by_batch = {}
        for batch in data["batch"]:
            keys = batch * context
            flops = keys * heads * (d + dv) * 2.0
            bytes_moved = (keys * d + batch * heads * (d + dv)) * size
            kernel_s = np.maximum(
                flops / data["compute_bound_flops_per_s"],
                bytes_moved / data["memory_bound_bytes_per_s"],
            )
            ideal = mla_decode_ideal_s(
                hardware=hardware, batch=batch, context_tokens=context, heads=heads
            )
            by_batch[str(batch)] = [round(float(e), 4) for e in ideal / kernel_s]
        curves.append(
            {
                "device": hardware.name,
                "engine": engine,
                "engine_version": data["commit"][:7],
                "dtype": "bf16",
                "heads": heads,
                "file": f"{data['repository']} README.md@{data['commit'][:7]} (cost_model/data/{name})",
                "context_tokens": context.tolist(),
                "efficiency_by_batch": by_batch,
            }
        )
    return curves


#: Tokens per call at which the absorbed-MLA batched GEMMs are kept (the tables' grid up to 8K).
MLA_BMM_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
#: The two batched GEMMs of absorbed MLA decode (aiconfigurator ``mla_bmm`` op names): the
#: queries' no-RoPE part into the latent (``q_nope x W_UK``) and the attention output back to
#: the value heads (``x W_UV``), which together take the place of ``kv_b_proj``.
MLA_BMM_OPS = ("mla_gen_pre", "mla_gen_post")


def _mla_bmm_curves(root: Path, device: str, engine: str) -> list[dict]:
    """Seconds of the absorbed-MLA batched GEMM pair (``MLA_BMM_OPS``, summed) by heads per rank
    (4+) on ``MLA_BMM_TOKENS``, BF16 weights, kept as measured: from the newest
    ``mla_bmm/<engine>/<version>/mla_bmm_perf.parquet`` that times both at every grid point."""
    hardware = get_preset(DEVICES[device]).device
    for path in _latest_tables(root, device, "mla_bmm", engine, "mla_bmm_perf.parquet"):
        fastest: dict[tuple, float] = {}
        for row in _read(path):
            heads = int(row["num_heads"])
            if row["bmm_dtype"] != "bfloat16" or heads < MLA_MIN_HEADS:
                continue
            key = (row["op_name"], heads, int(row["num_tokens"]))
            fastest[key] = min(fastest.get(key, np.inf), float(row["latency"]) * 1e-3)
        by_heads = {}
        for heads in sorted({k[1] for k in fastest}):
            keys = [(op, heads, t) for t in MLA_BMM_TOKENS for op in MLA_BMM_OPS]
            if all(k in fastest for k in keys):
                by_heads[str(heads)] = [
                    float(f"{sum(fastest[(op, heads, t)] for op in MLA_BMM_OPS) * 1e6:.4g}")
                    for t in MLA_BMM_TOKENS
                ]
        if by_heads:
            return [
                {
                    "device": hardware.name,
                    "engine": engine,
                    "engine_version": path.parent.name,
                    "dtype": "bf16",
                    "ops": list(MLA_BMM_OPS),
                    "file": str(path.relative_to(root.parent)),
                    "latency_us_by_heads": by_heads,
                }
            ]
    return []
