"""MHA/GQA attention curves from aiconfigurator-core's ``attention/*`` tables.

Context attention (``context_attention_perf.parquet``) as efficiency by prompt length and by the
(sequence, head) pairs of one call; decode attention (``generation_attention_perf.parquet``) as
efficiency by the keys attended, the (sequence, KV head) pairs of one call and the query-head
group size, one curve per KV-cache dtype. Efficiency: a roofline of the attention FLOPs (and, in
decode, of the cache read) at the device's peaks over the measured latency.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from autoparallel._kernel_import_tables import DEVICES, _latest_tables, _read
from topology import HardwareSpec, get_preset

#: Engines whose context attention runs in FP8 over an FP8 KV cache: TensorRT-LLM builds FP8
#: context FMHA into an engine whose checkpoint is FP8-quantized (``tensorrt_llm/builder.py``:
#: ``use_fp8_context_fmha`` = quant_algo in (FP8, W4A8_AWQ, NVFP4) and the plugin option, whose
#: default is on: ``tensorrt_llm/plugin/plugin.py`` ``PluginConfig``), and its tables time that
#: kernel in their FP8-attention rows. The other engines' FP8-cache prefill is not priced as FP8.
FP8_CONTEXT_FMHA_ENGINES = ("trtllm",)
#: Context-attention grid: prompt lengths and (sequence, head) pairs per call, 4x apart.
ATTENTION_TOKENS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
ATTENTION_UNITS = (1, 4, 16, 64, 256, 1024, 4096)


def _context_attention_curves(root: Path, device: str, engine: str) -> list[dict]:
    """MHA/GQA context attention (FlashAttention-class, causal, bf16, head dim 128, no window)
    efficiency by prompt length and by the (sequence, head) pairs of one call (batch x query
    heads on the rank: the kernel's parallel work), from the newest table with 3+ lengths for
    every pair count: at each point the fastest over the measured key-value head counts, held
    beyond the longest measured length. Ideal: the causal score and value FLOPs,
    ``b * L (L + 1) / 2 * 4 * heads * 128``, at the BF16 peak. Engines that run FP8 context
    attention with an FP8 KV cache (``FP8_CONTEXT_FMHA_ENGINES``) get an ``fp8`` curve too, from
    their rows of FP8 attention over an FP8 cache, its ideal at the FP8 peak."""
    hardware = get_preset(DEVICES[device]).device
    units = {u: i for i, u in enumerate(ATTENTION_UNITS)}
    lengths = {n: i for i, n in enumerate(ATTENTION_TOKENS)}
    for path in _latest_tables(root, device, "attention", engine, "context_attention_perf.parquet"):
        dtypes = {"bfloat16": "bf16"}
        if engine in FP8_CONTEXT_FMHA_ENGINES:
            dtypes["fp8"] = "fp8"
        best = {name: np.zeros((len(units), len(lengths))) for name in dtypes}
        for row in _read(path):
            batch, heads, length = int(row["batch_size"]), int(row["num_heads"]), int(row["isl"])
            if (
                row["attn_dtype"] not in dtypes
                or row["kv_cache_dtype"] != row["attn_dtype"]
                or int(row["window_size"]) != 0
                or int(row["head_dim"]) != 128
                or batch * heads not in units
                or length not in lengths
            ):
                continue
            flops = batch * length * (length + 1) / 2.0 * 4.0 * heads * 128
            peak = hardware.peak_flops_for(dtypes[row["attn_dtype"]])
            efficiency = flops / peak / (float(row["latency"]) * 1e-3)
            cell = (units[batch * heads], lengths[length])
            table = best[row["attn_dtype"]]
            table[cell] = max(table[cell], efficiency)
        if (best["bfloat16"] > 0).sum(axis=1).min() < 3:
            continue
        # a long prompt of many sequences is not measured: its efficiency is held from the
        # longest measured (the kernel is saturated there)
        log_lengths = np.log(np.array(ATTENTION_TOKENS, dtype=np.float64))
        curves = []
        for name, table in best.items():
            if (table > 0).sum(axis=1).min() < 3:
                continue
            for i, row in enumerate(table):
                measured = row > 0
                table[i] = np.interp(log_lengths, log_lengths[measured], row[measured])
            curves.append(
                {
                    "device": hardware.name,
                    "engine": engine,
                    "engine_version": path.parent.name,
                    "dtype": dtypes[name],
                    "file": str(path.relative_to(root.parent)),
                    "efficiency_by_units": {
                        str(u): [round(float(e), 3) for e in np.clip(table[i], 1e-3, 1.0)]
                        for u, i in units.items()
                    },
                }
            )
        return curves
    return []


#: Decode-attention grid: keys the decoded token attends (the tables' ``isl + step``, 2x apart
#: from 64; a shorter context is held at 64's efficiency), (sequence, KV head) pairs of one call
#: (2x apart) and query heads per KV head (MHA, and the GQA groups of the catalog's models:
#: Llama-3 8B / Mixtral 4, Llama-3 70B / Qwen3 8, Qwen3-235B 16 on one rank; a group between is
#: interpolated). A 4x grid in either of the first two misprices the tables' own points by 5-8%
#: on average and up to 50% where the call turns from launch- to bandwidth-bound; the 2x grid by
#: 1-3% (Llama-3.1-70B and Qwen3-235B per-rank shapes, H100 / B200, SGLang / TensorRT-LLM).
DECODE_ATTENTION_TOKENS = tuple(2**i for i in range(6, 18))
DECODE_ATTENTION_UNITS = tuple(2**i for i in range(15))
DECODE_ATTENTION_GROUPS = (1, 4, 8, 16)
#: aiconfigurator device folders whose decode-attention tables are imported -> preset: the
#: kernel-curve devices and the A100 and GB300, whose attention tables the package also ships.
DECODE_ATTENTION_DEVICES = {**DEVICES, "a100_sxm": "dgx-a100", "gb300": "gb300-nvl72"}
#: KV-cache dtypes of the decode-attention tables -> the project's (the element bytes read).
KV_CACHE_DTYPES = {"bfloat16": ("bf16", 2.0), "fp8": ("fp8", 1.0)}


def _decode_attention_curves(root: Path, device: str, engine: str) -> list[dict]:
    """MHA/GQA decode attention (one query token per sequence, bf16 queries, head dim 128, no
    window) efficiency by the keys each sequence attends and by the (sequence, KV head) pairs of
    one call (batch x KV heads on the rank: the kernel's parallel work, each pair reading its
    own cache), for each query-head group size, one curve per KV-cache dtype, from the newest
    table: at each point the fastest kernel's, averaged over the measured KV-head counts whose
    pairs and group match (the pairs set the efficiency: at equal pairs the splits differ by a
    few percent, up to 20% at short contexts), held beyond the longest measured length (large batches of long contexts are not
    measured). Ideal: the roofline of the score and value FLOPs, ``b * n * 4 * heads * 128`` at
    the BF16 peak, and of the cache read, ``b * n * kv_heads * 2 * 128`` elements at the memory
    bandwidth (``n``: keys attended). A table faster than that roofline anywhere does not time
    the work it states and is passed over for the engine's next newest (TensorRT-LLM 1.0.0 on
    A100: its GQA calls read the stated cache at up to 1.65x the HBM bandwidth, every other
    table at most 0.96x; ``_beats_the_roofline``)."""
    hardware = get_preset(DECODE_ATTENTION_DEVICES[device]).device
    for path in _latest_tables(
        root, device, "attention", engine, "generation_attention_perf.parquet"
    ):
        fastest = _fastest_decode_efficiency(path=path, hardware=hardware)
        if _beats_the_roofline(fastest):
            continue
        best = _mean_over_kv_heads(fastest=fastest)
        curves = []
        for name, d in _DECODE_DTYPE_INDEX.items():
            by_group = _decode_curves_by_group(best=best[d])
            if by_group:
                curves.append(
                    {
                        "device": hardware.name,
                        "engine": engine,
                        "engine_version": path.parent.name,
                        "dtype": KV_CACHE_DTYPES[name][0],
                        "file": str(path.relative_to(root.parent)),
                        "efficiency_by_group_units": by_group,
                    }
                )
        if curves:
            return curves
    return []


#: Grid indices of the decode-attention tables' cells: KV-cache dtype, group, pairs, keys.
_DECODE_DTYPE_INDEX = {name: i for i, name in enumerate(KV_CACHE_DTYPES)}
_DECODE_GROUP_INDEX = {g: i for i, g in enumerate(DECODE_ATTENTION_GROUPS)}
_DECODE_UNIT_INDEX = {u: i for i, u in enumerate(DECODE_ATTENTION_UNITS)}
_DECODE_LENGTH_INDEX = {n: i for i, n in enumerate(DECODE_ATTENTION_TOKENS)}


def _fastest_decode_efficiency(*, path: Path, hardware: HardwareSpec) -> dict[tuple, float]:
    """The fastest kernel's efficiency per (dtype, group, pairs, keys) cell and KV-head count of
    one decode-attention table (``_decode_attention_curves``)."""
    peak = hardware.peak_flops_for("bf16")
    bandwidth = hardware.memory_bandwidth_bytes_per_s
    dtypes, groups = _DECODE_DTYPE_INDEX, _DECODE_GROUP_INDEX
    units, lengths = _DECODE_UNIT_INDEX, _DECODE_LENGTH_INDEX
    fastest: dict[tuple, float] = {}  # per cell and KV-head count, over the kernels
    for row in _read(path):
        batch, heads = int(row["batch_size"]), int(row["num_heads"])
        kv_heads, length = int(row["num_key_value_heads"]), int(row["isl"]) + int(row["step"])
        if (
            row["attn_dtype"] != "bfloat16"
            or row["kv_cache_dtype"] not in dtypes
            or int(row.get("window_size") or 0) != 0  # the A100 tables have no windows
            or int(row["head_dim"]) != 128
            or int(row["beam_width"]) != 1
            or heads % kv_heads
            or heads // kv_heads not in groups
            or batch * kv_heads not in units
            or length not in lengths
        ):
            continue
        element = KV_CACHE_DTYPES[row["kv_cache_dtype"]][1]
        ideal = max(
            batch * length * 4.0 * heads * 128 / peak,
            batch * length * kv_heads * 2.0 * 128 * element / bandwidth,
        )
        key = (
            dtypes[row["kv_cache_dtype"]],
            groups[heads // kv_heads],
            units[batch * kv_heads],
            lengths[length],
            kv_heads,
        )
        fastest[key] = max(fastest.get(key, 0.0), ideal / (float(row["latency"]) * 1e-3))
    return fastest


def _beats_the_roofline(fastest: dict[tuple, float]) -> bool:
    """Whether a table's fastest call ran above its roofline (efficiency over 1): no kernel reads
    the stated cache faster than the memory bandwidth, so such a table timed other work (cache
    blocks shared between its sequences, say) and its efficiencies would price real calls too
    fast."""
    return bool(fastest) and max(fastest.values()) > 1.0


def _mean_over_kv_heads(*, fastest: dict[tuple, float]) -> np.ndarray:
    """Efficiency per (dtype, group, pairs, keys) cell, 0 where not measured."""
    # the mean over the KV-head counts that make a cell's pairs (sequences x KV heads)
    sums = np.zeros(
        (
            len(_DECODE_DTYPE_INDEX),
            len(_DECODE_GROUP_INDEX),
            len(_DECODE_UNIT_INDEX),
            len(_DECODE_LENGTH_INDEX),
        )
    )
    counts = np.zeros_like(sums)
    for key, efficiency in fastest.items():
        sums[key[:4]] += efficiency
        counts[key[:4]] += 1
    return np.divide(sums, counts, out=np.zeros_like(sums), where=counts > 0)


def _decode_curves_by_group(*, best: np.ndarray) -> dict[str, dict[str, list[float]]]:
    """One KV-cache dtype's efficiency rows by group and pairs over the keys grid, held beyond
    the longest measured length; a row needs 3+ measured lengths."""
    log_lengths = np.log(np.array(DECODE_ATTENTION_TOKENS, dtype=np.float64))
    by_group = {}
    for g, gi in _DECODE_GROUP_INDEX.items():
        rows = {}
        for u, ui in _DECODE_UNIT_INDEX.items():
            measured = best[gi, ui] > 0
            if measured.sum() >= 3:
                values = np.interp(log_lengths, log_lengths[measured], best[gi, ui][measured])
                # three significant digits: a launch-bound call of a few pairs over a
                # short context runs at 1e-4 of the roofline
                rows[str(u)] = [float(f"{e:.3g}") for e in np.clip(values, 1e-5, 1.0)]
        if rows:
            by_group[str(g)] = rows
    return by_group
