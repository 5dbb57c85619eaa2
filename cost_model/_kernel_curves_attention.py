"""Attention curves: MLA (decode, prefill, its absorbed batched GEMMs) and MHA/GQA context and
decode attention at their measured efficiency (imported operator tables, ``_kernel_curves``).

MLA decode attention has an efficiency by context length, batch and heads per rank
(``mla_decode_ideal_s``: absorbed-form FLOPs and latent-cache bytes); a tensor-parallel rank
runs its share of the heads over all its sequences, reading every sequence's whole latent, and
is priced on the rows measured at that head count. DeepSeek-V3's MLA layers take, in prefill,
the whole attention module TensorRT-LLM's and vLLM's tables time (``_inference_module``). The
MLA prefill curves of the attention kernel alone (``mla_prefill``) are imported but not used: priced with the serving engine's own kernel, SGLang's (0.18 of BF16 peak
against TRT-LLM's 0.55), LMSYS's SGLang prefill rows improve (+22% -> +0.4% at 4K) but the
Day-6 and profile prefill units, DeepSeek's own engine validated with SGLang's profile, fall to
-32% / -20%; with the best kernel instead Day-6 prefill is +30%.

MLA decode also has curves of one kernel from its authors' published figures rather than an
engine's tables: DeepSeek's FlashMLA (engine ``"flashmla"``, ``data/flashmla_decode.json``: up to
3000 GB/s memory-bound and 660 TFLOPS compute-bound on the H800 SXM5, README at c2067be, at its
benchmark's batch 128, 4K-16K cache and 16-128 query heads; ``_kernel_import_mla.flashmla_decode_curves``).
At DeepSeek-V3's 128 heads it runs at 0.81 of the roofline where the imported H100 tables of
SGLang's FA3 and TensorRT-LLM's kernels measure 0.66-0.76. They price a workload that names the
kernel (``Inference.mla_decode_kernel``: DeepSeek's own serving, ``_inference_validation``) and
never enter the best over engines: vLLM 0.33 picks FLASH_ATTN_MLA before FLASHMLA on SM90
(``vllm/platforms/cuda.py`` ``_get_backend_priorities``) and SGLang 0.5.23 picks ``fa3`` for MLA
on Hopper (``srt/arg_groups/model_override_base.py``), the kernel of its H100/H200 tables
(``kernel_source`` flash_attention). Outside the benchmark's shapes the curve is held like every
other (a few-sequence call is not what the README measured); on devices other than the H800 and
its H100 twin the engines' tables price FlashMLA.

MHA/GQA context attention (``context_attention``) has an efficiency by prompt length and by the
(sequence, query head) pairs of one call, its kernel's parallel work (``context_attention_time_s``);
prefill prices full causal attention of head size 128 with it: the BF16 kernel, or over an FP8
KV cache the engine's FP8 one where it runs and measured one (TensorRT-LLM's FP8 context FMHA). MHA/GQA decode attention
(``decode_attention``, from the engines' ``generation_attention_perf`` tables) has one by the keys
each sequence attends, the (sequence, KV head) pairs of the call and the query heads per KV head,
per KV-cache dtype (BF16, FP8): the roofline is the cache read, and a call of a few pairs over a
short context is launch-bound (H100, SGLang's FA3: 64 pairs at 2K keys run at 0.6 of the memory
bandwidth, at 32K keys 0.9); the pairs, not how they split into sequences and KV heads, set it
(at equal pairs the tables' splits mostly differ by a few percent; the curves keep their mean)
(``decode_attention_time_s``). Imported on the A100 and GB300 too, whose decode a serving row runs.

The two batched GEMMs of absorbed MLA decode (``mla_bmm``: q_nope through W_UK, the attention
output through W_UV, in place of ``kv_b_proj``) are kept as measured latencies by tokens and
heads per rank (``mla_bmm_time_s``): at a few tokens they are launch-bound.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from cost_model._kernel_curves import (
    DEVICE_ALIASES,
    _between_rows,
    _engine_curves,
    _log_bracket,
    kernel_curves,
)

#: Heads per rank of an MLA curve that names none (DeepSeek-V3's 128 on one rank); prefill curves
#: are measured there, decode curves at every head count a tensor-parallel rank runs.
MLA_CURVE_HEADS = 128


def mla_decode_ideal_s(
    *,
    hardware,
    batch,
    context_tokens,
    heads: int,
    kv_lora_rank: int = 512,
    rope_dim: int = 64,
    kv_bytes: float = 2.0,
) -> np.ndarray:
    """Roofline seconds of one MLA decode attention layer in absorbed form (DeepSeek-V2 sec.
    2.1.2; FlashMLA): ``2*heads*(2*kv_lora_rank + rope)`` FLOPs per cached key, the latent read once."""
    keys = np.asarray(batch, dtype=np.float64) * np.asarray(context_tokens, dtype=np.float64)
    flops = keys * 2.0 * heads * (2 * kv_lora_rank + rope_dim)
    cache_bytes = keys * (kv_lora_rank + rope_dim) * kv_bytes
    return np.maximum(
        flops / hardware.peak_flops_for("bf16"),
        cache_bytes / hardware.memory_bandwidth_bytes_per_s,
    )


def mla_efficiency(
    *,
    kind: str,
    device_name: str,
    tokens,
    batch=1.0,
    heads=MLA_CURVE_HEADS,
    engine: str | None = None,
) -> np.ndarray | None:
    """Measured MLA efficiency (best over serving engines, or ``engine``'s: a serving engine or
    a published kernel, ``PUBLISHED_KERNELS``), or None: ``kind`` ``mla_decode`` at a
    context of ``tokens``, or ``mla_prefill`` of a ``tokens``-long prompt, for ``batch``
    sequences of ``heads`` heads per call (one rank's: a tensor-parallel rank runs its share of
    the heads over every sequence and reads each sequence's whole latent). Linear in log(length),
    log(batch) and log(heads) between the measured points (a curve that names no head count has
    128), held beyond them; ``engine``'s own kernels where it measured the device."""
    tables = _mla_tables(kind, DEVICE_ALIASES.get(device_name, device_name), engine)
    if not tables:
        return None
    tokens, batch, heads = np.broadcast_arrays(
        *(np.atleast_1d(np.asarray(x, dtype=np.float64)) for x in (tokens, batch, heads))
    )
    values = []
    for head_grid, batch_grid, context_grid, efficiency in tables:
        (h0, h1, wh), (b0, b1, wb), (c0, c1, wc) = (
            _log_bracket(np.maximum(x, 1.0), grid)
            for x, grid in ((heads, head_grid), (batch, batch_grid), (tokens, context_grid))
        )
        total = np.zeros(tokens.shape)
        for hi, fh in ((h0, 1.0 - wh), (h1, wh)):
            for bi, fb in ((b0, 1.0 - wb), (b1, wb)):
                for ci, fc in ((c0, 1.0 - wc), (c1, wc)):
                    total += fh * fb * fc * efficiency[hi, bi, ci]
        values.append(total)
    return np.max(values, axis=0)


@lru_cache(maxsize=64)
def _mla_tables(
    kind: str, device_name: str, engine: str | None
) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], ...]:
    """Per measured table (engine, file) of ``kind``: its head counts, batches and context
    lengths, and the efficiency on that grid [heads x batch x length] (each head count's curves
    interpolated onto the batches and lengths of the table, in the logs); empty without curves."""
    curves = _engine_curves(
        [
            c
            for c in kernel_curves().get(kind, ())
            if DEVICE_ALIASES.get(c["device"], c["device"]) == device_name
        ],
        engine,
    )
    tables = []
    for source in sorted({(c["engine"], c["file"]) for c in curves}):
        by_heads = sorted(
            (c for c in curves if (c["engine"], c["file"]) == source),
            key=lambda c: c.get("heads", MLA_CURVE_HEADS),
        )
        context = np.asarray(by_heads[0]["context_tokens"], dtype=np.float64)
        batches = np.array(
            sorted({float(b) for c in by_heads for b in c["efficiency_by_batch"]}),
        )
        grid = np.stack([_mla_curve_grid(c, context, batches) for c in by_heads])
        heads = np.array([float(c.get("heads", MLA_CURVE_HEADS)) for c in by_heads])
        tables.append((heads, batches, context, grid))
    return tuple(tables)


def _mla_curve_grid(curve: dict, context: np.ndarray, batches: np.ndarray) -> np.ndarray:
    """One head count's curve on ``batches`` x ``context`` (linear in the logs, held at the ends)."""
    own = sorted(curve["efficiency_by_batch"], key=float)
    rows = np.stack(
        [
            np.interp(
                np.log(context), np.log(curve["context_tokens"]), curve["efficiency_by_batch"][b]
            )
            for b in own
        ]
    )
    log_own = np.log(np.array([float(b) for b in own]))
    return np.stack(
        [_between_rows(rows, log_own, np.full(context.size, np.log(b))) for b in batches]
    )


def mla_bmm_time_s(*, device_name: str, tokens, heads, engine: str | None = None):
    """Measured seconds of the two batched GEMMs absorbed MLA decode runs in place of
    ``kv_b_proj`` (DeepSeek-V2 sec. 2.1.2: the queries into the latent through W_UK, the
    attention output out of it through W_UV; BF16 weights, as SGLang keeps a block-FP8
    ``kv_b_proj``) for ``tokens`` tokens over ``heads`` heads per rank (``mla_bmm``); the
    serving ``engine``'s own where measured, else the fastest; None where no table covers the
    device. Linear in log(tokens) and log(heads) between measured points, held below them and
    linear in the tokens beyond the largest (the work grows with them)."""
    device_name = DEVICE_ALIASES.get(device_name, device_name)
    curves = _engine_curves(
        [c for c in kernel_curves().get("mla_bmm", ()) if c["device"] == device_name], engine
    )
    if not curves:
        return None
    grid = np.asarray(kernel_curves()["mla_bmm_tokens"], dtype=np.float64)
    tokens, heads = np.broadcast_arrays(
        *(np.atleast_1d(np.asarray(x, dtype=np.float64)) for x in (tokens, heads))
    )
    tokens = np.maximum(tokens, 1.0)
    (t0, t1, wt) = _log_bracket(tokens, grid)
    beyond = np.maximum(tokens / grid[-1], 1.0)
    values = []
    for curve in curves:
        by_heads = sorted(curve["latency_us_by_heads"].items(), key=lambda item: float(item[0]))
        latency = np.array([row for _, row in by_heads]) * 1e-6  # [heads x tokens]
        h0, h1, wh = _log_bracket(np.maximum(heads, 1.0), np.array([float(h) for h, _ in by_heads]))
        total = np.zeros(tokens.shape)
        for hi, fh in ((h0, 1.0 - wh), (h1, wh)):
            total += fh * ((1.0 - wt) * latency[hi, t0] + wt * latency[hi, t1])
        values.append(total * beyond)
    return np.min(values, axis=0)


def context_attention_time_s(
    *,
    hardware,
    flops,
    bytes_moved,
    tokens,
    units,
    engine: str | None = None,
    kv_element_bytes=2.0,
) -> np.ndarray | None:
    """MHA/GQA context (prefill) attention of one layer: its roofline (``flops`` at the peak of
    the kernel's dtype, ``bytes_moved`` at the memory bandwidth) over the measured efficiency of
    a causal FlashAttention-class kernel (``context_attention``: by prompt length ``tokens`` and
    by the (sequence, query head) pairs ``units`` of the call, log-linear in both, held beyond
    the grid); the serving ``engine``'s own kernel where measured; None without a curve. Rows
    with an FP8 KV cache (``kv_element_bytes`` 1) run the engine's own FP8 context attention
    where it has a curve of one (``_kernel_import_attention.FP8_CONTEXT_FMHA_ENGINES``: TensorRT-LLM's
    FP8 context FMHA, on at 0.7-0.75x the BF16 kernel's time for a 5000-token Llama-3-70B TP2
    prompt on H100), the BF16 kernel otherwise."""
    device_name = DEVICE_ALIASES.get(hardware.name, hardware.name)
    mine = [c for c in kernel_curves().get("context_attention", ()) if c["device"] == device_name]
    curves = _engine_curves([c for c in mine if c.get("dtype", "bf16") == "bf16"], engine)
    if not curves:
        return None
    bf16 = _context_attention_s(hardware, curves, flops, bytes_moved, tokens, units, "bf16")
    fp8 = [c for c in mine if c.get("dtype") == "fp8" and c.get("engine") == engine]
    if not fp8:
        return bf16
    fast = _context_attention_s(hardware, fp8, flops, bytes_moved, tokens, units, "fp8")
    return np.where(np.asarray(kv_element_bytes) == 1.0, fast, bf16)


def _context_attention_s(hardware, curves, flops, bytes_moved, tokens, units, dtype: str):
    """Seconds of context attention on ``curves`` (the best of them) at the ``dtype`` peak."""
    grid = np.log(np.asarray(kernel_curves()["context_attention_tokens"], dtype=np.float64))
    log_tokens = np.log(np.maximum(np.atleast_1d(np.asarray(tokens, dtype=np.float64)), 1.0))
    log_units = np.log2(np.maximum(np.asarray(units, dtype=np.float64), 1.0))
    values = []
    for curve in curves:
        keys = sorted(curve["efficiency_by_units"], key=float)
        rows = np.stack(
            [np.interp(log_tokens, grid, curve["efficiency_by_units"][u]) for u in keys]
        )
        log_keys = np.log2(np.array([float(u) for u in keys]))
        values.append(_between_rows(rows, log_keys, np.broadcast_to(log_units, rows.shape[1:])))
    compute_s = np.asarray(flops) / hardware.peak_flops_for(dtype)
    memory_s = np.asarray(bytes_moved) / hardware.memory_bandwidth_bytes_per_s
    return np.maximum(compute_s, memory_s) / np.max(values, axis=0)


#: KV-cache element bytes -> dtype of the decode-attention curves (``decode_attention``).
DECODE_ATTENTION_KV_DTYPES = {2.0: "bf16", 1.0: "fp8"}


@lru_cache(maxsize=64)
def _decode_attention_tables(
    device_name: str, engine: str | None
) -> dict[str, tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]]:
    """Per KV-cache dtype, per chosen curve: its group sizes, (sequence, KV head) pair counts
    and efficiency on that grid [groups x pairs x lengths] (a group's pair counts not measured
    held from its nearest measured ones, in the logs)."""
    device_name = DEVICE_ALIASES.get(device_name, device_name)
    mine = [c for c in kernel_curves().get("decode_attention", ()) if c["device"] == device_name]
    tables: dict[str, list] = {}
    for dtype in sorted({c["dtype"] for c in mine}):
        for curve in _engine_curves([c for c in mine if c["dtype"] == dtype], engine):
            by_group = sorted(curve["efficiency_by_group_units"].items(), key=lambda i: float(i[0]))
            units = np.array(sorted({float(u) for _, rows in by_group for u in rows}))
            grid = []
            for _, rows in by_group:
                keys = sorted(rows, key=float)
                values = np.array([rows[u] for u in keys], dtype=np.float64)
                own = np.log(np.array([float(u) for u in keys]))
                grid.append(
                    np.stack([np.interp(np.log(units), own, column) for column in values.T], axis=1)
                )
            groups = np.array([float(g) for g, _ in by_group])
            tables.setdefault(dtype, []).append((groups, units, np.stack(grid)))
    return {dtype: tuple(curves) for dtype, curves in tables.items()}


def decode_attention_time_s(
    *,
    hardware,
    flops,
    bytes_moved,
    tokens,
    units,
    group,
    kv_element_bytes,
    engine: str | None = None,
) -> np.ndarray | None:
    """MHA/GQA decode (generation) attention of one layer: its roofline (``flops`` at the BF16
    peak, ``bytes_moved`` at the memory bandwidth) over the measured efficiency of the serving
    engine's decode kernel (``decode_attention``: by the keys ``tokens`` each sequence attends,
    the (sequence, KV head) pairs ``units`` of the call and the query heads per KV head
    ``group``, linear in the logs of all three and held beyond the grid); the engine's own table
    where measured, else the best. NaN on rows whose KV-cache dtype (``kv_element_bytes``: BF16
    or FP8) has no curve; None where the device has none."""
    tables = _decode_attention_tables(hardware.name, engine)
    if not tables:
        return None
    context = np.asarray(kernel_curves()["decode_attention_tokens"], dtype=np.float64)
    tokens, units, group, element = np.broadcast_arrays(
        *(
            np.atleast_1d(np.asarray(x, dtype=np.float64))
            for x in (tokens, units, group, kv_element_bytes)
        )
    )
    efficiency = np.full(tokens.shape, np.nan)
    for element_bytes, dtype in DECODE_ATTENTION_KV_DTYPES.items():
        rows = element == element_bytes
        if dtype not in tables or not rows.any():
            continue
        at = [np.maximum(x[rows], 1.0) for x in (group, units, tokens)]
        (c0, c1, wc) = _log_bracket(at[2], context)
        values = []
        for groups, unit_grid, grid in tables[dtype]:
            (g0, g1, wg), (u0, u1, wu) = _log_bracket(at[0], groups), _log_bracket(at[1], unit_grid)
            total = np.zeros(at[0].shape)
            for gi, fg in ((g0, 1.0 - wg), (g1, wg)):
                for ui, fu in ((u0, 1.0 - wu), (u1, wu)):
                    for ci, fc in ((c0, 1.0 - wc), (c1, wc)):
                        total += fg * fu * fc * grid[gi, ui, ci]
            values.append(total)
        efficiency[rows] = np.max(values, axis=0)
    compute_s = np.asarray(flops) / hardware.peak_flops_for("bf16")
    memory_s = np.asarray(bytes_moved) / hardware.memory_bandwidth_bytes_per_s
    return np.maximum(compute_s, memory_s) / efficiency


def mla_time_s(
    *,
    kind: str,
    hardware,
    dtype: str,
    flops,
    bytes_moved,
    tokens,
    batch=1.0,
    heads=MLA_CURVE_HEADS,
    engine: str | None = None,
) -> np.ndarray | None:
    """MLA attention of one layer: its roofline (``flops`` at the ``dtype`` peak, ``bytes_moved``
    at the memory bandwidth) over the measured efficiency (``mla_efficiency`` at ``tokens``,
    ``batch`` and ``heads`` per call); None without a curve."""
    efficiency = mla_efficiency(
        kind=kind,
        device_name=hardware.name,
        tokens=tokens,
        batch=batch,
        heads=heads,
        engine=engine,
    )
    if efficiency is None:
        return None
    compute_s = np.asarray(flops) / hardware.peak_flops_for(dtype)
    return (
        np.maximum(compute_s, np.asarray(bytes_moved) / hardware.memory_bandwidth_bytes_per_s)
        / efficiency
    )
