"""Kernel efficiency by real shape, from imported per-operator tables (fit inputs).

A serving layer's routed experts run as grouped GEMMs whose M is the tokens each expert gets —
a few to a few hundred — not one matmul over all of a rank's tokens. Their efficiency is a
measured curve: ``ideal time / measured latency`` as a function of tokens per expert, experts per
device and weight dtype, where the ideal time is the cost model's own for the same work
(``grouped_gemm_ideal_s``: the roofline of the expert FFNs' FLOPs and weight bytes, plus the
permute / activation / un-permute memory passes that the fused MoE kernel also runs,
``_inference_ops.routed_bytes_per_assignment``). MLA decode attention likewise has an efficiency
by context length, batch and heads per rank (``mla_decode_ideal_s``: absorbed-form FLOPs and
latent-cache bytes); a tensor-parallel rank runs its share of the heads over all its sequences,
reading every sequence's whole latent, and is priced on the rows measured at that head count.

The curves live in ``cost_model/data/kernel_curves.json``, written by
``autoparallel profile --import-aiconfigurator`` from NVIDIA's aiconfigurator-core operator
tables (Apache-2.0; every curve names its file and its expert shape). Grouped-GEMM curves are
measured on several expert shapes (DeepSeek-V3's 7168 x 2048, Qwen3-235B's 4096 x 1536,
Mixtral-8x7B's 4096 x 14336, Kimi-K2's 384 experts of DeepSeek-V3's size, and the 7168 x 256
and 4096 x 192 slices of DeepSeek-V3's, Kimi-K2's and Qwen3-235B's experts over 8 tensor-parallel
ranks); a model is priced on the shape nearest the slice one rank runs in log(weight elements per
expert matrix), of two with that slice on the one measured nearest its expert count, since at a
few tokens per expert the fused layer's fixed routing, permute and ramp weigh against the bytes
each expert streams. Where several engines measured
one device and dtype, the best efficiency at each point is used unless an ``engine`` is asked
for: the fastest kernel measured for that shape (TRT-LLM's CUTLASS grouped GEMM where the
Triton kernels of untuned configs fall behind), the one a deployment tuned for its shape runs.
A device or dtype without a curve returns ``None`` and the caller keeps its roofline pricing.

Dense GEMMs (``gemm``: attention projections, dense FFN, shared experts) have curves by real
shape and weight scaling (FP8: block-scaled ``fp8``; per-tensor ``fp8_tensor`` with static
activation scales, TensorRT-LLM's table less its dynamic-scale step, ``gemm_curve_dtype``): efficiency (``gemm_ideal_s`` / measured latency, the fastest kernel the engine ships at
each point) on a grid of M (tokens in the call) x N x K (one rank's slice), trilinear in the logs
(``gemm_efficiency``); TP8 slices of DeepSeek-V3 run at 0.1-0.5 of FP8 peak where the training
calibration's one efficiency says 0.8. Prefill and decode price their dense GEMMs with them.
A table's point is the engine's whole W8A8 call: aiconfigurator's SGLang collector times the
per-token-group FP8 quantization of the activations and the DeepGEMM GEMM together, replayed in a
CUDA graph (``collector/sglang/collect_gemm.py``), so the activation cast the roofline leaves out
is in it. At decode's M they agree with DeepSeek's own kernel benchmarks (H800, DeepGEMM README
at commit a6d97a1, the GEMM alone: M = 64, N x K = 7168 x 16384 in 45 us, 4096 x 7168 in 13 us,
7168 x 2048 in 6 us; the H100 SGLang table, with the quantization: 48, 16 and 10 us). Pricing decode with them lowers Day-6's
SLO-bound decode unit (-18% -> -34% against the published rate) and the DeepSeek profile's
decode (-4% -> -12%): with GEMMs at DeepSeek's own measured speed, what those units over-price
lies elsewhere, in their MLA decode (next paragraph: -17% and -7% with it). The MLA prefill curves (``mla_prefill``) are
imported but not used: priced with the serving engine's own kernel, SGLang's (0.18 of BF16 peak
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

Tensor-parallel all-reduces (``custom_allreduce``) are kept as measured latencies, not
efficiencies: by serving engine, GPU count and message size, each engine's own kernels (vLLM's and
SGLang's custom one-/two-shot all-reduce over NVLink peer memory, NCCL above their size limit;
TensorRT-LLM's AllReduce, AUTO strategy) inside a CUDA graph (``all_reduce_time_s``). A decode
all-reduce of one token's hidden state takes ~7 us on 8 A100s where NCCL's ring model says ~70.

Interpolation: linear in log(tokens per expert) (clamped at the grid's ends) and in log(experts
per device) between measured counts.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

import numpy as np

from cost_model._units import dtype_bytes

#: (hidden, expert FFN width, routed experts, top-k) of DeepSeek-V3's experts: the default shape
#: of a lookup and of a curve that names none.
GROUPED_GEMM_SHAPE = (7168, 2048, 256, 8)
#: Heads per rank of an MLA curve that names none (DeepSeek-V3's 128 on one rank); prefill curves
#: are measured there, decode curves at every head count a tensor-parallel rank runs.
MLA_CURVE_HEADS = 128
#: Tokens per expert at which curves are stored: 1/32 .. 512 by powers of two.
TOKENS_PER_EXPERT_GRID = np.exp2(np.arange(-5.0, 10.0))
_FILE = "kernel_curves.json"
#: Devices whose kernels are another's: the H800 is the H100 SXM's export variant, with the same
#: SMs, clocks and HBM3 and a narrower NVLink (NVIDIA H800 datasheet), which kernels do not see.
DEVICE_ALIASES = {"NVIDIA H800 SXM": "NVIDIA H100 SXM"}
_WEIGHT_ONLY = {"int4": "bf16"}  # dtype the GEMM runs in for weight-only formats
#: Dense GEMM curve dtypes that name a scaling as well as a dtype -> the weight dtype: per-tensor
#: FP8 with static activation scales (``gemm_curve_dtype``); ``fp8`` curves are block-scaled.
_CURVE_WEIGHT_DTYPES = {"fp8_tensor": "fp8"}


def matmul_dtype_of(weight_dtype: str) -> str:
    weight_dtype = _CURVE_WEIGHT_DTYPES.get(weight_dtype, weight_dtype)
    return _WEIGHT_ONLY.get(weight_dtype, weight_dtype)


def gemm_curve_dtype(weight_dtype: str, fp8_scaling: str = "block") -> str:
    """The dense GEMM curve that prices ``weight_dtype`` weights: FP8 weights with per-tensor
    scales (``fp8_scaling`` ``"tensor"``: ModelOpt FP8 checkpoints, TensorRT-LLM
    ``QuantAlgo.FP8``) take the ``fp8_tensor`` curves, whose activation scales are static;
    block-scaled FP8 (DeepSeek-V3's 128 x 128 weight tiles, 1 x 128 activation groups) the
    ``fp8`` ones. They are different kernels (cuBLAS FP8 with one scale; a main loop that
    rescales every 128-deep K block): on H100 (TensorRT-LLM tables, Llama-3-70B's TP2 q/k/v
    slice, 5120 x 8192) 20.8 against 21.5 us at 1 token, 22 against 29 us at 86 and 328
    against 433 us at 5000."""
    return "fp8_tensor" if weight_dtype == "fp8" and fp8_scaling == "tensor" else weight_dtype


def grouped_gemm_ideal_s(
    *,
    hardware,
    dtype: str,
    tokens_per_expert,
    experts_per_device,
    touched_fraction,
    side_bytes_per_assignment=0.0,
    hidden_size: int = GROUPED_GEMM_SHAPE[0],
    expert_ffn_size: int = GROUPED_GEMM_SHAPE[1],
) -> np.ndarray:
    """Roofline seconds of one device's grouped expert GEMMs (SwiGLU: 3 matrices per expert) plus
    their memory passes: max(FLOPs / peak, weight bytes / bandwidth) + side bytes / bandwidth."""
    assignments = np.asarray(tokens_per_expert, dtype=np.float64) * np.asarray(
        experts_per_device, dtype=np.float64
    )
    weights_per_expert = 3.0 * hidden_size * expert_ffn_size
    flops = 2.0 * weights_per_expert * assignments
    weight_bytes = (
        np.asarray(experts_per_device)
        * np.asarray(touched_fraction)
        * weights_per_expert
        * dtype_bytes(dtype)
    )
    bandwidth = hardware.memory_bandwidth_bytes_per_s
    compute_s = flops / hardware.peak_flops_for(matmul_dtype_of(dtype))
    side_s = np.asarray(side_bytes_per_assignment) * assignments / bandwidth
    return np.maximum(compute_s, weight_bytes / bandwidth) + side_s


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


@lru_cache(maxsize=1)
def kernel_curves() -> dict:
    """The shipped curves (``cost_model/data/kernel_curves.json``); empty when absent."""
    folder = resources.files("cost_model") / "data"
    path = folder / _FILE
    return (
        json.loads(path.read_text()) if path.is_file() else {"grouped_gemm": [], "mla_decode": []}
    )


def _curve_shape(curve: dict) -> tuple[int, ...]:
    """(hidden, expert FFN width one rank runs, ...) of a curve; DeepSeek-V3's where unnamed."""
    shape = curve.get("shape")
    return GROUPED_GEMM_SHAPE if shape is None else tuple(shape.values())


#: Curves of one kernel from its authors' published figures, not of a serving engine's tables:
#: priced only where asked for by name (``Inference.mla_decode_kernel``), never in the best over
#: engines (a serving engine that does not run the kernel by default does not get it).
PUBLISHED_KERNELS = frozenset({"flashmla"})


def _engine_curves(curves: list[dict], engine: str | None) -> list[dict]:
    """The serving engine's own curves where it measured them, else every engine's (best)."""
    own = [c for c in curves if c.get("engine") == engine]
    return own or [c for c in curves if c.get("engine") not in PUBLISHED_KERNELS]


@lru_cache(maxsize=64)
def _grouped_tables(
    device_name: str, dtype: str, engine: str | None
) -> list[tuple[float, np.ndarray, np.ndarray]]:
    """Per measured expert shape: (log of its weight elements per expert matrix, log2 experts
    per device, efficiency [counts x grid]), the best over the chosen engines' curves."""
    device_name = DEVICE_ALIASES.get(device_name, device_name)
    matching = [
        c
        for c in kernel_curves()["grouped_gemm"]
        if c["device"] == device_name and c["dtype"] == dtype
    ]
    curves = _engine_curves(matching, engine)
    tables = []
    for shape in sorted({_curve_shape(c) for c in curves}):
        same = [c for c in curves if _curve_shape(c) == shape]
        counts = sorted({int(k) for c in same for k in c["experts_per_device"]})
        grid = np.array(
            [
                np.max(
                    [
                        c["experts_per_device"][str(n)]
                        for c in same
                        if str(n) in c["experts_per_device"]
                    ],
                    axis=0,
                )
                for n in counts
            ]
        )
        elements = np.log(float(shape[0]) * float(shape[1]))
        tables.append((elements, np.log2(np.array(counts, dtype=np.float64)), grid))
    return tables


def grouped_gemm_efficiency(
    *,
    device_name: str,
    dtype: str,
    tokens_per_expert,
    experts_per_device,
    expert_elements=None,
    engine: str | None = None,
) -> np.ndarray | None:
    """Measured efficiency of grouped expert GEMMs (see the module docstring), or None.

    ``expert_elements`` (hidden x expert FFN width, per row; default DeepSeek-V3's) picks the
    measured expert shape nearest in log scale: at a few tokens per expert the fused layer's
    fixed routing, permute and ramp weigh against the bytes each expert streams, so a small
    expert's efficiency would misprice a large one (Mixtral-8x22B at 1 token: 0.2-0.3 on
    DeepSeek's 7168 x 2048 experts, 0.5-0.6 on Mixtral-8x7B's 4096 x 14336 ones). Of shapes
    with the same slice, the one measured at the expert count nearest ``experts_per_device`` (in
    log scale): Kimi-K2's 384 experts per rank on its own table, not held at DeepSeek-V3's 256
    (SGLang's B200 NVFP4 fused MoE over 8-way expert TP, 1K tokens: 0.33 ms on Kimi-K2's 384
    experts, 0.23 ms on DeepSeek-V3's 256, which streams two thirds of the weights). ``engine``
    selects the serving engine's own kernels where its tables cover the device and dtype."""
    tables = _grouped_tables(device_name, dtype, engine)
    if not tables:
        return None
    log_tokens = np.log(
        np.maximum(np.atleast_1d(np.asarray(tokens_per_expert, dtype=np.float64)), 1e-9)
    )
    where = np.log2(np.maximum(np.asarray(experts_per_device, dtype=np.float64), 1e-9))
    target = np.log(
        np.asarray(
            expert_elements
            if expert_elements is not None
            else GROUPED_GEMM_SHAPE[0] * GROUPED_GEMM_SHAPE[1],
            dtype=np.float64,
        )
    )
    shape = np.broadcast_shapes(log_tokens.shape, where.shape, target.shape)
    distance = np.stack([np.broadcast_to(np.abs(target - e), shape) for e, _, _ in tables])
    # of the shapes with the nearest slice (DeepSeek-V3's and Kimi-K2's experts are one size),
    # the one measured nearest the rank's expert count
    at = np.broadcast_to(where, shape)
    counts = np.stack([np.min(np.abs(np.subtract.outer(at, c)), axis=-1) for _, c, _ in tables])
    nearest = np.argmin(np.where(distance == distance.min(axis=0), counts, np.inf), axis=0)
    result = np.zeros(shape)
    for index in np.unique(nearest):  # only the shapes some row is nearest to
        _, log_counts, grid = tables[index]
        along = np.stack(
            [np.interp(log_tokens, np.log(TOKENS_PER_EXPERT_GRID), row) for row in grid]
        )  # counts x n
        along = np.broadcast_to(along, (along.shape[0], *shape))
        value = _between_rows(along, log_counts, np.broadcast_to(where, shape))
        result = np.where(nearest == index, value, result)
    return result


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


def _log_bracket(values: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Indices of the grid points either side of ``values`` and the weight of the upper one,
    linear in the logs and clamped at the grid's ends (a one-point grid holds its value)."""
    if grid.size == 1:
        zero = np.zeros(values.shape, dtype=np.int64)
        return zero, zero, np.zeros(values.shape)
    index, weight = _grid_position(values, grid)
    return index, index + 1, weight


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


def _between_rows(rows: np.ndarray, row_keys: np.ndarray, where: np.ndarray) -> np.ndarray:
    """Linear interpolation between ``rows`` (keys ascending) at ``where``, clamped at the ends."""
    if len(row_keys) == 1:
        return rows[0]
    index = np.clip(np.searchsorted(row_keys, where) - 1, 0, len(row_keys) - 2)
    weight = np.clip((where - row_keys[index]) / (row_keys[index + 1] - row_keys[index]), 0.0, 1.0)
    columns = np.arange(rows.shape[1])
    return (1 - weight) * rows[index, columns] + weight * rows[index + 1, columns]


def grouped_experts_time_s(
    *,
    hardware,
    dtype: str,
    tokens_per_expert,
    experts_per_device,
    touched_fraction,
    side_bytes_per_assignment,
    hidden_size: int,
    expert_ffn_size,
    engine: str | None = None,
) -> np.ndarray | None:
    """One device's routed experts as the grouped GEMMs that run: ``experts_per_device`` experts of
    M = ``tokens_per_expert`` each, the ideal time over the measured efficiency for that M, expert
    count and weight dtype; None where no curve covers the device and dtype."""
    efficiency = grouped_gemm_efficiency(
        device_name=hardware.name,
        dtype=dtype,
        tokens_per_expert=tokens_per_expert,
        experts_per_device=experts_per_device,
        expert_elements=hidden_size * np.asarray(expert_ffn_size, dtype=np.float64),
        engine=engine,
    )
    if efficiency is None:
        return None
    ideal = grouped_gemm_ideal_s(
        hardware=hardware,
        dtype=dtype,
        tokens_per_expert=tokens_per_expert,
        experts_per_device=experts_per_device,
        touched_fraction=touched_fraction,
        side_bytes_per_assignment=side_bytes_per_assignment,
        hidden_size=hidden_size,
        expert_ffn_size=expert_ffn_size,
    )
    return ideal / efficiency


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


def expert_all_to_all_bytes(
    *,
    rank_tokens,
    hidden_size: int,
    element_bytes: float,
    copies,
    ep,
    local,
    node_dedup,
) -> tuple[np.ndarray, np.ndarray]:
    """(NVLink, RDMA) bytes one rank sends in a DeepEP dispatch or combine. Each of its tokens goes
    to ``copies`` expert ranks (top-k x etp), uniform over the ``ep`` ranks of ``ep / local``
    nodes. "Low-latency" kernels send every copy straight to its rank (DeepEP README).

    "Normal" kernels (``node_dedup``) send a token once per distinct remote node, to the rank of
    the same local index there, which forwards it over NVLink once per distinct destination rank
    of its node (``internode.cu`` ``dispatch``: kRDMASender, then kRDMAAndNVLForwarder; on one
    node ``intranode.cu`` sends once per distinct rank). Each rank so forwards the tokens of
    ``nodes`` source ranks (its own included) to the ``local - 1`` other ranks of its node, each
    reached by a token with probability 1 - (1 - 1/ep)^copies."""
    ep, local = np.asarray(ep, dtype=np.float64), np.asarray(local, dtype=np.float64)
    nodes = ep / local
    token_bytes = np.asarray(rank_tokens, dtype=np.float64) * hidden_size * element_bytes
    forwarded = nodes * (local - 1.0) * (1.0 - np.power(1.0 - 1.0 / ep, copies))
    intra = token_bytes * np.where(node_dedup, forwarded, copies * (local - 1.0) / ep)
    remote_copies = copies * (ep - local) / ep
    distinct_nodes = (nodes - 1.0) * (1.0 - np.power(1.0 - 1.0 / nodes, copies))
    remote_copies = np.where(node_dedup, np.minimum(remote_copies, distinct_nodes), remote_copies)
    return intra, token_bytes * remote_copies


def deepep_low_latency_s(*, direction: str, intra_bytes, inter_bytes, cluster) -> np.ndarray | None:
    """DeepEP low-latency ``direction`` (dispatch or combine) of one layer: the fitted fixed
    latency plus the slower tier's bytes over its preset peak bandwidth times the fitted
    efficiency (``kernel_curves.json`` ``deepep_low_latency``: fitted on NVIDIA's H200 operator
    table, 1-8 nodes, and assumed to carry to other NVLink/RDMA fabrics as fractions of their
    peaks); None when the shipped curves hold no fit. The training-fitted collective efficiency
    does not apply: these are not NCCL collectives."""
    return _deepep_fitted_s(
        key="deepep_low_latency",
        direction=direction,
        intra_bytes=intra_bytes,
        inter_bytes=inter_bytes,
        cluster=cluster,
    )


def deepep_normal_s(
    *, direction: str, intra_bytes, inter_bytes, nodes, cluster
) -> np.ndarray | None:
    """DeepEP normal (node-deduplicating, high-throughput) ``direction`` of one layer over an EP
    group spanning ``nodes`` nodes, the bytes of ``expert_all_to_all_bytes`` with ``node_dedup``:
    a fixed latency plus a latency per remote node plus the slower tier's bytes over its preset
    peak bandwidth times the fitted efficiency (``kernel_curves.json`` ``deepep_normal``: fitted
    on NVIDIA's H100 operator table, 1-8 nodes, 20 SMs: DeepEP's and SGLang's default). The
    per-node latency is the notify step, which exchanges token counts with every other node's
    RDMA rank before a multi-node transfer (``internode.cu`` ``notify_dispatch``), and the RDMA
    setup of each destination node. None when the shipped curves hold no fit. Not an NCCL
    collective, so the NCCL-fitted collective efficiency does not apply."""
    fit = kernel_curves().get("deepep_normal")
    if not fit:
        return None
    params = fit[direction]
    remote_nodes = np.maximum(np.asarray(nodes, dtype=np.float64) - 1.0, 0.0)
    latency_s = params["latency_s"] + params["latency_per_remote_node_s"] * remote_nodes
    return latency_s + _slower_tier_s(
        params=params, intra_bytes=intra_bytes, inter_bytes=inter_bytes, cluster=cluster
    )


def _deepep_fitted_s(*, key: str, direction: str, intra_bytes, inter_bytes, cluster):
    """Fixed latency + max(NVLink bytes / (peak x efficiency), RDMA bytes / (peak x efficiency))
    with the ``key`` fit of ``kernel_curves.json``; None without one."""
    fit = kernel_curves().get(key)
    if not fit:
        return None
    params = fit[direction]
    return params["latency_s"] + _slower_tier_s(
        params=params, intra_bytes=intra_bytes, inter_bytes=inter_bytes, cluster=cluster
    )


def _slower_tier_s(*, params: dict, intra_bytes, inter_bytes, cluster) -> np.ndarray:
    """max(NVLink bytes / (peak x efficiency), RDMA bytes / (peak x efficiency)): DeepEP drives
    both tiers at once, so the slower one sets the transfer time."""
    nvlink = cluster.intra_node.bandwidth_bytes_per_s * params["nvlink_efficiency"]
    rdma = cluster.inter_node.bandwidth_bytes_per_s * params["rdma_efficiency"]
    return np.maximum(np.asarray(intra_bytes) / nvlink, np.asarray(inter_bytes) / rdma)


# ------------------------------------------------------------------------------ dense GEMMs
#: Grid of the dense GEMM curves: M (tokens in the call) 1 .. 16384, dense through the ridge
#: region (tens to a thousand tokens) where efficiency moves most, and N / K (output / input width
#: of one rank's slice) 256 .. 16384, the widths of projections sliced over 1-16 ranks, with
#: 8192 (Llama-3-70B/405B's hidden size and its TP-sliced FFN and head widths) measured rather
#: than interpolated: between 7168 and 12288 the efficiency is not log-linear (H100 TensorRT-LLM
#: per-tensor FP8, N x K = 8192 x 14336 at 500 tokens: 107 us interpolated from the 7168 and
#: 12288 widths, 92 us in the table). Coarse enough that every device, engine and dtype fits
#: the small committed file.
GEMM_M_GRID = np.array([1.0, 4.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0, 16384.0])
GEMM_NK_GRID = (256, 512, 1024, 2048, 4096, 7168, 8192, 12288, 16384)


def gemm_ideal_s(*, hardware, dtype: str, m, n, k) -> np.ndarray:
    """Roofline seconds of one ``m x k`` by ``k x n`` GEMM with ``dtype`` weights: max(FLOPs at
    the GEMM dtype's peak, weight bytes at the memory bandwidth) — the cost model's own matmul
    roofline (``_pricing.op_time_s`` before efficiencies), so a curve is ideal / measured."""
    m, n, k = (np.asarray(x, dtype=np.float64) for x in (m, n, k))
    compute_s = 2.0 * m * n * k / hardware.peak_flops_for(matmul_dtype_of(dtype))
    weight_bytes = n * k * dtype_bytes(_CURVE_WEIGHT_DTYPES.get(dtype, dtype))
    return np.maximum(compute_s, weight_bytes / hardware.memory_bandwidth_bytes_per_s)


@lru_cache(maxsize=64)
def _gemm_tables(device_name: str, dtype: str, engine: str | None) -> np.ndarray | None:
    """Efficiency [M x N x K] on the GEMM grid: the engine's own curve, else the best of all."""
    device_name = DEVICE_ALIASES.get(device_name, device_name)
    curves = _engine_curves(
        [
            c
            for c in kernel_curves().get("gemm", ())
            if c["device"] == device_name and c["dtype"] == dtype
        ],
        engine,
    )
    if not curves:
        return None
    shape = (GEMM_M_GRID.size, len(GEMM_NK_GRID), len(GEMM_NK_GRID))  # M, N, K
    return np.max([np.reshape(c["efficiency_per_mille"], shape) / 1000.0 for c in curves], axis=0)


def _grid_position(values: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lower index and weight of ``values`` between the points of ``grid`` (log scale, clamped)."""
    log_grid = np.log(grid)
    where = np.clip(np.log(np.maximum(values, 1e-9)), log_grid[0], log_grid[-1])
    index = np.clip(np.searchsorted(log_grid, where) - 1, 0, grid.size - 2)
    return index, (where - log_grid[index]) / (log_grid[index + 1] - log_grid[index])


def gemm_efficiency(
    *, device_name: str, dtype: str, m, n, k, engine: str | None = None
) -> np.ndarray | None:
    """Measured efficiency (``gemm_ideal_s`` / latency) of a dense GEMM of ``m`` tokens through
    an ``n x k`` weight slice, trilinear in log(m), log(n), log(k) on ``GEMM_M_GRID`` x
    ``GEMM_NK_GRID``^2 and held beyond it; the serving ``engine``'s own kernels where its tables
    cover the device and dtype, else the best measured; None without a curve."""
    table = _gemm_tables(device_name, dtype, engine)
    if table is None:
        return None
    m, n, k = np.broadcast_arrays(
        *(np.atleast_1d(np.asarray(x, dtype=np.float64)) for x in (m, n, k))
    )
    widths = np.asarray(GEMM_NK_GRID, dtype=np.float64)
    (im, wm), (in_, wn), (ik, wk) = (
        _grid_position(m, GEMM_M_GRID),
        _grid_position(n, widths),
        _grid_position(k, widths),
    )
    value = np.zeros(m.shape)
    for dm, fm in ((0, 1.0 - wm), (1, wm)):
        for dn, fn in ((0, 1.0 - wn), (1, wn)):
            for dk, fk in ((0, 1.0 - wk), (1, wk)):
                value = value + fm * fn * fk * table[im + dm, in_ + dn, ik + dk]
    return value


#: Narrowest measured GEMM width: a slice narrower in N or K (a router's 128 experts' logits)
#: is priced at this width's latency, not at its efficiency over a smaller ideal. Below it the
#: call is one tile wide and launch-bound: SGLang's B200 BF16 table (aiconfigurator-core 0.12.0,
#: ``b200_sxm/gemm/sglang/0.5.14``) at M = 1, K = 4096 times N = 32, 64, 128, 256 at 4.5, 3.9,
#: 4.6, 4.2 us, where the efficiency held from N = 256 would price N = 128 at half of 4.2 us.
GEMM_MIN_WIDTH = float(GEMM_NK_GRID[0])


def _held_width(width) -> np.ndarray:
    """``width`` raised to ``GEMM_MIN_WIDTH``; an absent GEMM (width 0: no shared expert) stays 0."""
    width = np.asarray(width, dtype=np.float64)
    return np.where(width > 0, np.maximum(width, GEMM_MIN_WIDTH), 0.0)


def gemm_time_s(*, hardware, dtype: str, m, n, k, engine: str | None = None) -> np.ndarray | None:
    """One dense GEMM at its measured efficiency for its shape (``gemm_efficiency``): seconds,
    or None where no curve covers the device and dtype. N and K below the grid are priced at
    ``GEMM_MIN_WIDTH`` (the latency held, not the efficiency)."""
    n, k = _held_width(n), _held_width(k)
    efficiency = gemm_efficiency(
        device_name=hardware.name, dtype=dtype, m=m, n=n, k=k, engine=engine
    )
    if efficiency is None:
        return None
    return gemm_ideal_s(hardware=hardware, dtype=dtype, m=m, n=n, k=k) / efficiency


def projections_time_s(
    *, hardware, dtype: str, m, shard, projections, engine: str | None = None
) -> np.ndarray | None:
    """The GEMMs of one block (``projections``: (N, K, split) each, split "n", "k" or "" for the
    width tensor parallelism divides by ``shard``) over ``m`` tokens, each at its measured
    efficiency, summed; None without a curve. The same values as ``gemm_time_s`` per GEMM,
    computed per distinct ``shard`` (a few): the curve over M at each slice, then one
    interpolation in log(M) per row. A slice narrower than the grid is priced at
    ``GEMM_MIN_WIDTH``."""
    table = _gemm_tables(hardware.name, dtype, engine)
    if table is None:
        return None
    m = np.atleast_1d(np.asarray(m, dtype=np.float64))
    shards, inverse = np.unique(
        np.broadcast_to(np.asarray(shard, dtype=np.float64), m.shape), return_inverse=True
    )
    index, weight = _grid_position(m, GEMM_M_GRID)
    widths = np.asarray(GEMM_NK_GRID, dtype=np.float64)
    total = np.zeros(m.shape)
    for n, k, split in projections:
        n_rank = n / shards if split == "n" else np.full(shards.shape, float(n))
        k_rank = k / shards if split == "k" else np.full(shards.shape, float(k))
        n_rank, k_rank = _held_width(n_rank), _held_width(k_rank)
        (i_n, w_n), (i_k, w_k) = _grid_position(n_rank, widths), _grid_position(k_rank, widths)
        curves = np.zeros((shards.size, GEMM_M_GRID.size))  # efficiency over M, per shard
        for dn, fn in ((0, 1.0 - w_n), (1, w_n)):
            for dk, fk in ((0, 1.0 - w_k), (1, w_k)):
                curves += (fn * fk)[:, None] * table[:, i_n + dn, i_k + dk].T
        efficiency = (1.0 - weight) * curves[inverse, index] + weight * curves[inverse, index + 1]
        ideal = gemm_ideal_s(
            hardware=hardware, dtype=dtype, m=m, n=n_rank[inverse], k=k_rank[inverse]
        )
        total += ideal / efficiency
    return total


# ------------------------------------------------------------------ tensor-parallel all-reduce
#: Message sizes of the all-reduce tables: 256 B .. 1 GiB by powers of two (aiconfigurator measures
#: 128 .. 2^29 BF16 elements).
ALL_REDUCE_MESSAGE_BYTES = np.exp2(np.arange(8.0, 31.0))


@lru_cache(maxsize=64)
def _all_reduce_table(device_name: str, engine: str | None, gpus: int) -> np.ndarray | None:
    """Log seconds of one all-reduce over ``gpus`` ranks on ``ALL_REDUCE_MESSAGE_BYTES``
    (``custom_allreduce`` curves): the serving engine's own table where it measured the device at
    that GPU count, else the fastest measured at each size; None without one. No device aliases:
    an H800's NVLink is narrower than the H100's whose kernels it shares."""
    curves = _engine_curves(
        [
            c
            for c in kernel_curves().get("custom_allreduce", ())
            if c["device"] == device_name and str(gpus) in c["latency_us_by_gpus"]
        ],
        engine,
    )
    if not curves:
        return None
    latency_us = np.min([c["latency_us_by_gpus"][str(gpus)] for c in curves], axis=0)
    return np.log(latency_us * 1e-6)


def all_reduce_time_s(*, device_name: str, group, message_bytes, engine: str | None = None):
    """Measured seconds of one tensor-parallel all-reduce of ``message_bytes`` (BF16) per rank
    over ``group`` NVLink-connected ranks, as the serving ``engine`` runs it (its custom one-/two-
    shot kernel below its size limit, NCCL above: the tables time the engine's own dispatch,
    ``autoparallel._kernel_import_comm.ALLREDUCE_KERNELS``); NaN on rows whose group size no table
    measured, None where no table covers the device. Linear in log(size) and log(latency)
    between measured sizes, held below the smallest (the kernel's fixed latency) and linear in
    the bytes beyond the largest (bandwidth-bound)."""
    if not any(c["device"] == device_name for c in kernel_curves().get("custom_allreduce", ())):
        return None
    group, message = np.broadcast_arrays(
        np.atleast_1d(np.asarray(group, dtype=np.float64)),
        np.atleast_1d(np.asarray(message_bytes, dtype=np.float64)),
    )
    seconds = np.full(group.shape, np.nan)
    for gpus in np.unique(group):
        table = _all_reduce_table(device_name, engine, int(gpus))
        if table is None or gpus != int(gpus):
            continue
        grid, log_s = np.log(ALL_REDUCE_MESSAGE_BYTES), table
        rows = group == gpus
        where = np.log(np.maximum(message[rows], 1.0))
        inside = np.exp(np.interp(where, grid, log_s))
        beyond = np.exp(log_s[-1] + np.maximum(where - grid[-1], 0.0))  # t_last * bytes / b_last
        seconds[rows] = np.where(where > grid[-1], beyond, inside)
    return seconds
