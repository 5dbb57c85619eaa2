"""Compute of one inference pass on each pipeline rank: the GEMMs of every block, core attention
and the MoE layer, in seconds.

Matmuls are rooflines of their FLOPs and weight bytes, each part (attention, dense FFN, routed
and shared experts, router, LM head) in its own weight dtype (``Inference.part_weight_dtype``: a
released checkpoint keeps some parts wider than its experts); the memory passes between them (norms,
casts to the GEMM dtype, RoPE and MLA's re-expanded keys and values, the MoE permute, activation
and combine reduction, residual adds: ``_inference_ops.*_side_bytes``) are separate memory-bound
kernels whose time adds. Efficiencies come from the device's shipped calibration
(``_options.Calibration``, shared with training): matmuls at ``matmul_efficiency``, core attention
at ``attention_efficiency``.

Where imported operator tables cover the device (``_kernel_curves``), a pass's dense GEMMs
(attention projections, dense FFN, shared experts: ``_inference_ops.*_projections``), prefill
and decode alike, run at the serving engine's measured latency for their shape (M = tokens per
rank, N x K = the rank's slice of each projection; the W8A8 activation quantization included),
a prefill pass's MHA/GQA core attention at the measured causal
FlashAttention-class efficiency by prompt length and (sequence, head) pairs per call
(``_kernel_curves_attention.context_attention_time_s``), a decode step's MHA/GQA core attention
at the serving engine's measured decode-kernel efficiency by context, (sequence, KV head) pairs and
query heads per KV head (``_kernel_curves_attention.decode_attention_time_s``), a decode step's
routed experts (and a prefill pass's without expert parallelism: the engine's fused MoE op,
``_moe_time``) as grouped GEMMs at
their measured efficiency for M = tokens per expert, MLA decode attention at its measured efficiency
by context length, batch and heads per rank and its ``kv_b_proj`` as the two measured batched
GEMMs of the absorbed form; kernels timed by a table pay no per-kernel floor on top
(``_inference_kernels._measured_kernels_per_pass``).

The busiest EP rank carries the balls-into-bins excess of uniform routing widened by real
traffic's expert-load skew (``_routing_skew``: by default the residual measured behind an
expert-placement balancer, EPLB), or the measured ``EstimateOptions.routing_imbalance`` if
larger (``busiest_rank_load_factor``); redundant experts cost their memory.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from cost_model import _inference_ops as ops
from cost_model._inference_module import module_rows, prefill_module_time
from cost_model._inference_setup import (
    _attention_dtype,
    _cast_bytes,
    _memory_pass,
    _mm,
    _part_dtype,
    _Setup,
    busiest_rank_load_factor,
)
from cost_model._kernel_curves import DEVICE_ALIASES, gemm_curve_dtype, kernel_curves
from cost_model._kernel_curves_attention import (
    DECODE_ATTENTION_KV_DTYPES,
    context_attention_time_s,
    decode_attention_time_s,
    mla_bmm_time_s,
    mla_time_s,
)
from cost_model._kernel_curves_dsa import MEASURED_INDEXER, dsa_indexer_decode_s
from cost_model._kernel_curves_gemm import gemm_efficiency, projections_time_s
from cost_model._kernel_curves_linear import gated_deltanet_time_s
from cost_model._kernel_curves_moe import grouped_experts_time_s, grouped_gemm_efficiency
from cost_model._pricing import op_time_s
from cost_model._units import dtype_bytes


def _gemms(
    s: _Setup,
    tokens,
    projections,
    shard,
    *,
    part: str | None = None,
    dtype: str | None = None,
    graphed=False,
) -> np.ndarray:
    """The GEMMs of one block of ``part`` over ``tokens`` per device, each projection's split
    width divided by ``shard``, with weights in ``dtype`` (default: the part's weight dtype,
    ``_inference_setup._part_dtype``; the workload's ``weight_dtype`` without a part). Prefill and
    decode alike, every GEMM runs at the serving engine's measured latency for its shape
    (``_kernel_curves_gemm.projections_time_s``: M = tokens, N x K = one rank's slice) where its
    operator tables cover the device and dtype; the tables time the activation quantization a
    W8A8 GEMM launches before it (aiconfigurator's SGLang collector times
    ``sglang_per_token_group_quant_fp8`` + DeepGEMM per block-FP8 call, in a CUDA graph), which
    the roofline misses. Devices without tables keep the calibrated roofline.

    Rows where the pass replays a CUDA graph (``graphed``) take the fastest engine's table for
    the shape instead: a table's point is one call timed from the host, and where the engine's
    Python dispatch of its linear method outlasts the kernels the point times the host (vLLM
    0.24's block-FP8 table on B200, ``b200_sxm/gemm/vllm/0.24.0``: 0.18-0.28 ms per call at
    M = 1-8 for N x K = 1536 x 7168, where SGLang's and TensorRT-LLM's tables time the same GEMM
    with its activation quantization at 0.011 ms; aiconfigurator records such rows' provenance
    as ``legacy`` in ``collection_meta.yaml``), while a graph replays the kernels alone. Each
    table's point bounds the GPU time of its engine's kernels from above; the fastest is the
    tightest bound."""
    dtype = dtype or (s.workload.weight_dtype if part is None else _part_dtype(s, part))
    evaluate = partial(
        s.rows.evaluate,
        partial(projections_time_s, projections=projections),
        hardware=s.cluster.device,
        dtype=_gemm_table_dtype(s, dtype),
        m=np.asarray(tokens, dtype=np.float64),
        shard=np.asarray(shard, dtype=np.float64),
    )
    graphed = np.broadcast_to(np.asarray(graphed, dtype=bool), np.shape(tokens))
    # the fastest table over engines includes the engine's own: one evaluation where every row
    # replays a graph (decode), both where passes mix
    measured = evaluate(engine=None if graphed.all() else s.profile.engine)
    if measured is not None:
        if graphed.any() and not graphed.all():
            fastest = evaluate(engine=None)
            assert fastest is not None  # the engine's own curve is among them
            measured = np.where(graphed, fastest, measured)
        return measured
    wb = dtype_bytes(dtype)
    total = np.zeros_like(np.asarray(tokens, dtype=np.float64))
    for n, k, split in projections:
        n_rank = n / shard if split == "n" else np.full_like(shard, float(n))
        k_rank = k / shard if split == "k" else np.full_like(shard, float(k))
        flops, weight_bytes = 2.0 * tokens * n_rank * k_rank, n_rank * k_rank * wb
        total = total + _mm(s, flops, weight_bytes, part or "routed_experts", dtype=dtype)
    return np.asarray(total)


def _gemm_table_dtype(s: _Setup, dtype: str) -> str:
    """The dense GEMM table that prices ``dtype`` weights under the workload's FP8 scaling
    (``_kernel_curves.gemm_curve_dtype``): per-tensor FP8 on its own table where the device has
    one, else on the block-scaled table (the nearer kernel) rather than on no table at all."""
    table = gemm_curve_dtype(dtype, s.workload.fp8_scaling)
    if table != dtype and (
        gemm_efficiency(device_name=s.hardware.name, dtype=table, m=1.0, n=1.0, k=1.0) is None
    ):
        return dtype
    return table


def _attention_gemms(s: _Setup, tokens, *, decode: bool, graphed=False) -> np.ndarray:
    """The GEMMs of one attention block over ``tokens`` per device (``_gemms``). Absorbed MLA
    decode runs ``kv_b_proj`` as its two batched GEMMs over the rank's heads, at their measured
    latency where a table covers the device (``_kernel_curves_attention.mla_bmm_time_s``).
    ``graphed``: rows whose pass replays a CUDA graph (``_gemms``)."""
    model = s.model
    projections = ops.attention_projections(model)
    if model.attention.has_linear_mixer:  # the mean layer: full and linear layers in their share
        f = model.attention.full_layer_fraction
        full = _gemms(s, tokens, projections, s.shard, part="attention", graphed=graphed)
        linear = _gemms(
            s, tokens, ops.linear_projections(model), s.shard, part="attention", graphed=graphed
        )
        return f * full + model.attention.linear_share * linear
    bmm = None
    if decode and model.attention.kind == "mla":
        bmm = s.rows.evaluate(
            mla_bmm_time_s,
            device_name=s.hardware.name,
            tokens=np.asarray(tokens, dtype=np.float64),
            heads=model.attention.num_heads / s.shard,
            engine=s.profile.engine,
        )
    if bmm is None:
        return _gemms(s, tokens, projections, s.shard, part="attention", graphed=graphed)
    kv_up = ops.kv_up_projection(model)
    rest = tuple(projection for projection in projections if projection != kv_up)
    return _gemms(s, tokens, rest, s.shard, part="attention", graphed=graphed) + bmm


def _context_attention_measured(s: _Setup, *, decode: bool) -> bool:
    """Whether a pass's MHA/GQA attention is priced from the context-attention curves: prefill,
    full causal attention, a device the tables cover
    (``_kernel_curves_attention.context_attention_time_s``)."""
    a = s.model.attention
    return (
        not decode
        and a.kind != "mla"
        and a.variant == "full"
        and a.head_dim == 128  # the head size the curves measure
        and s.workload.activation_dtype == "bf16"
        and any(
            c["device"] == DEVICE_ALIASES.get(s.hardware.name, s.hardware.name)
            for c in kernel_curves().get("context_attention", ())
        )
    )


def _decode_attention_measured(s: _Setup) -> np.ndarray:
    """Rows whose decode MHA/GQA attention is priced from the decode-attention curves: full
    attention of head size 128 (the curves' shapes), a device and KV-cache dtype the tables
    cover (``_kernel_curves_attention.decode_attention_time_s``)."""
    if "_decode_attention_measured" not in s.__dict__:  # the same for every pass of one setup
        a = s.model.attention
        device = DEVICE_ALIASES.get(s.hardware.name, s.hardware.name)
        dtypes = {
            c["dtype"]
            for c in kernel_curves().get("decode_attention", ())
            if c["device"] == device
            and a.kind != "mla"
            and a.variant == "full"
            and a.head_dim == 128
        }
        covered = [b for b, dtype in DECODE_ATTENTION_KV_DTYPES.items() if dtype in dtypes]
        s.__dict__["_decode_attention_measured"] = np.isin(s.kv_element_bytes, covered)
    return s.__dict__["_decode_attention_measured"]


def _router_and_shared_time(
    s: _Setup, *, attention_tokens: np.ndarray, graphed: bool
) -> np.ndarray:
    """Router and shared experts of one MoE layer, (n,) seconds."""
    model, moe = s.model, s.model.moe
    assert moe is not None
    # the gate runs replicated on the hidden states a rank holds after attention: every token
    # of its replica under tensor parallelism (SGLang ``Qwen3MoeSparseMoeBlock.gate``, a
    # ``ReplicatedLinear``), its own under attention data parallelism
    router = _gemms(
        s,
        attention_tokens,
        ops.router_projections(model),
        np.ones_like(attention_tokens),
        part="router",
        dtype=s.workload.weight_dtype_by_part.get("router", s.workload.activation_dtype),
        graphed=graphed,
    )
    shared = _gemms(
        s,
        attention_tokens,
        ops.ffn_projections(model, moe.num_shared_experts * moe.shared_ffn_size),
        s.shard,
        part="shared_experts",
        graphed=graphed,
    )
    return router + shared


@dataclass(frozen=True)
class _ExpertLoad:
    """The routed experts' work on the busiest EP rank of each row."""

    assignments: np.ndarray  # (token, expert) assignments it receives
    slots: np.ndarray  # expert slots it holds, redundant experts included
    touched: np.ndarray  # fraction of the experts that receive a token


def _expert_load(s: _Setup, *, rank_tokens: np.ndarray) -> _ExpertLoad:
    """Assignments, expert slots and touched fraction of the busiest EP rank
    (``busiest_rank_load_factor``)."""
    moe = s.model.moe
    assert moe is not None
    ep, etp = s.column("ep"), s.column("etp")
    group_tokens = rank_tokens * ep * etp
    mean_assignments = group_tokens * moe.top_k / ep
    assignments = mean_assignments * busiest_rank_load_factor(s, rank_tokens)
    slots = (moe.num_routed_experts + s.column("num_redundant_experts")) / ep
    touched = s.rows.evaluate(
        ops.experts_touched_fraction,
        tokens=group_tokens,
        top_k=moe.top_k,
        num_experts=moe.num_routed_experts,
    )
    return _ExpertLoad(assignments=assignments, slots=slots, touched=touched)


def _measured_experts_time(
    s: _Setup, *, load: _ExpertLoad, side_bytes_per_assignment: np.ndarray
) -> np.ndarray:
    """Routed experts as the measured grouped GEMMs of the busiest rank, (n,) seconds."""
    moe = s.model.moe
    assert moe is not None
    # M = tokens per expert slot on the busiest rank; the expert width split over etp. The best
    # kernel over engines, not the serving engine's: the operator tables time one MoE backend per
    # engine version with the configs its collector found, not the DeepGEMM / CUTLASS kernels or
    # tuned configs a deployment selects for its shape (SGLang 0.5.10's bf16 Triton fused MoE on
    # H200, DeepSeek-V3's experts 8 to a rank: 0.09 of the roofline from 512 tokens per expert,
    # where TensorRT-LLM's reaches 0.5-0.57).
    return s.rows.evaluate(
        grouped_experts_time_s,
        hardware=s.cluster.device,
        dtype=_part_dtype(s, "routed_experts"),
        tokens_per_expert=load.assignments / load.slots,
        experts_per_device=load.slots,
        touched_fraction=load.touched,
        side_bytes_per_assignment=side_bytes_per_assignment,
        hidden_size=s.model.hidden_size,
        expert_ffn_size=moe.expert_ffn_hidden_size / s.column("etp"),
    )


def _moe_time(
    s: _Setup,
    attention_tokens: np.ndarray,
    rank_tokens: np.ndarray,
    *,
    decode: bool = True,
    graphed=False,
    parts: dict | None = None,
) -> np.ndarray:
    """Router, shared experts and routed experts of one MoE layer, (n,) seconds; ``parts``,
    where given, receives the router and shared experts' share as ``shared``.

    Decode steps price the routed experts as the grouped GEMMs that run (``_grouped_experts_time``:
    M = tokens per expert, measured curves). So does a prefill pass without expert parallelism
    (``_fused_prefill_moe``): its tokens never leave the rank, and the engine runs the fused MoE
    op the tables time (SGLang on Blackwell: FlashInfer's TRT-LLM MoE, routing through the
    weighted combine in one call, ``layers/moe/moe_runner/flashinfer_trtllm.py``; the Triton
    ``fused_moe`` elsewhere), so the combine passes of ``moe_token_bytes`` are in the measured
    op. A prefill pass with ep > 1 keeps the calibrated roofline: its experts run DeepGEMM's
    contiguous-layout grouped GEMM behind DeepEP's normal kernels, which reaches about 0.75 of FP8
    peak at large M (DeepGEMM README, H800), while the imported tables' large-M kernels (TRT-LLM
    CUTLASS, Triton) measure 0.3-0.5; until DeepGEMM's own tables are imported the imported
    curves would misprice it."""
    model, moe = s.model, s.model.moe
    if moe is None:
        return np.zeros_like(attention_tokens)
    wb = dtype_bytes(_part_dtype(s, "routed_experts"))
    act = dtype_bytes(s.workload.activation_dtype)
    etp = s.column("etp")
    dense = _router_and_shared_time(s, attention_tokens=attention_tokens, graphed=graphed)
    if parts is not None:
        parts["shared"] = dense
    load = _expert_load(s, rank_tokens=rank_tokens)
    w_expert = model.ffn_parameters(moe.expert_ffn_hidden_size) / etp
    cast = _cast_bytes(s)
    side = ops.routed_bytes_per_assignment(model, act=act, cast=cast, etp=etp)
    token_bytes = ops.moe_token_bytes(model, act=act, cast=cast, shard=s.shard)
    token_passes = _memory_pass(s, token_bytes * attention_tokens)
    measured = None
    fused = _fused_prefill_moe(s, decode=decode)
    if decode or np.any(fused):
        measured = _measured_experts_time(s, load=load, side_bytes_per_assignment=side)
    if measured is not None and decode:
        return dense + measured + token_passes
    routed = _mm(s, 2 * w_expert * load.assignments, load.slots * load.touched * w_expert * wb)
    roofline = dense + routed + _memory_pass(s, side * load.assignments) + token_passes
    if measured is None:
        return roofline
    outside_op = _memory_pass(  # the fused op writes the combined output itself
        s, (token_bytes - ops.moe_combine_bytes(model, act=act)) * attention_tokens
    )
    return np.where(fused, dense + measured + outside_op, roofline)


def _fused_prefill_moe(s: _Setup, *, decode: bool) -> np.ndarray:
    """Rows whose prefill pass runs its routed experts as the engine's fused MoE op at its
    measured latency (``_moe_time``), (n,) bool: prefill, no expert parallelism (each rank runs
    every expert's etp slice over all its tokens: no all-to-all, no DeepEP), and grouped-GEMM
    curves for the device and weight dtype."""
    ep = s.column("ep")
    if decode or s.model.moe is None or not np.any(ep == 1):
        return np.zeros(ep.shape, dtype=bool)
    covered = (
        grouped_gemm_efficiency(
            device_name=s.hardware.name,
            dtype=s.workload.weight_dtype,
            tokens_per_expert=1.0,
            experts_per_device=1.0,
        )
        is not None
    )
    return (ep == 1) & covered


@dataclass(frozen=True)
class _AttentionWork:
    """What one layer's core attention does in a pass on one rank: FLOPs, the KV bytes it reads
    (all sequences', over the rank's share of the KV heads and of each context), and the keys
    each sequence reads."""

    flops: np.ndarray
    bytes_moved: np.ndarray
    read_tokens: np.ndarray


def _attention_work(s: _Setup, p: ops.Pass) -> _AttentionWork:
    """Core attention's FLOPs and bytes of pass ``p`` on one rank (``_AttentionWork``)."""
    model = s.model
    queries = p.batch * p.new_tokens / (s.column("cp") * s.shard)
    spread = (
        1.0 if p.decode else 1.0 + s.workload.prompt_tokens_cv**2
    )  # E[P^2]/E[P]^2 of the prompt mix
    keys = ops.mean_attended_between(
        model, p.cached_tokens * spread + 1.0, (p.cached_tokens + p.new_tokens) * spread
    )
    flops = queries * keys * ops.attention_flops_per_key(model, decode=p.decode)
    if not p.decode:
        prefix = p.batch * p.cached_tokens / (s.column("cp") * s.shard)
        flops = flops + prefix * ops.prefix_upprojection_flops_per_token(model)
    kv_fraction = 1.0 / (ops.kv_head_split(model, s.shard) * s.column("cp"))
    read_tokens = ops.kv_read_tokens(model, p.cached_tokens + p.new_tokens)
    kv_read = p.batch * ops.kv_bytes_per_sequence_layer(
        model, read_tokens, s.kv_element_bytes, block_tokens=1, with_indexer=False
    )
    return _AttentionWork(flops=flops, bytes_moved=kv_read * kv_fraction, read_tokens=read_tokens)


def _indexer_time(s: _Setup, p: ops.Pass) -> np.ndarray:
    """DSA's lightning indexer of one layer, (n,) seconds: every new token scores every key
    before it with the indexer's FP8 keys (``AttentionSpec.indexer_flops_per_key``) and selects
    its top-k. A decode step takes the measured latency where a curve covers the device
    (``_kernel_curves_dsa``: projections, scores and top-k selection, of an indexer of 32 heads;
    more heads add their scores at the roofline); otherwise, and in a prefill no measured module
    covers (``_inference_module``), the scores and the read of every key once per pass are an FP8
    roofline op at the attention calibration (the top-k selection uncounted: a lower bound). The
    indexer's projections are replicated on each tensor-parallel rank and its keys are cached
    whole on each (vLLM ``DeepseekV32IndexerCache``, SGLang's NSA indexer buffer: one per rank),
    so its work is per rank, split only over context parallelism."""
    model = s.model
    a = model.attention
    zero = np.zeros_like(s.column("cp"), dtype=np.float64)
    if not a.indexer_heads:
        return zero
    cp = s.column("cp")
    # a query at position i scores its i - 1 predecessors and itself: the mean over the pass
    keys = p.cached_tokens + (p.new_tokens + 1.0) / 2.0
    flops = p.batch * p.new_tokens * keys * a.indexer_flops_per_key() / cp
    read = p.batch * ops.indexer_read_bytes(model, p.cached_tokens + p.new_tokens) / cp

    def roofline(flops, read):
        return s.rows.evaluate(
            op_time_s,
            flops=flops,
            bytes_moved=read,
            hardware=s.cluster.device,
            dtype="fp8",
            calibration=s.calibration,
            kind="attention",
        )

    if p.decode:
        measured = dsa_indexer_decode_s(
            device_name=s.hardware.name,
            heads=a.indexer_heads,
            head_dim=a.indexer_head_dim,
            batch=p.batch * p.new_tokens,
            context=(p.cached_tokens + p.new_tokens) / cp,
        )
        if measured is not None:
            extra = max(a.indexer_heads - MEASURED_INDEXER[0], 0) / a.indexer_heads
            scores = roofline(extra * flops, np.zeros_like(read)) if extra else 0.0
            return zero + measured + scores
    return zero + roofline(flops, read)


def _mla_decode_time(s: _Setup, p: ops.Pass, work: _AttentionWork) -> np.ndarray | None:
    """MLA decode at FlashMLA-class kernels' measured efficiency (prefill keeps the calibrated
    one: see ``_kernel_curves_attention``): one call per rank, all its sequences, over its share
    of the heads and of each context (cp); every head reads the sequence's whole latent, so the
    bytes are all sequences'."""
    model = s.model
    return s.rows.evaluate(
        mla_time_s,
        kind="mla_decode",
        hardware=s.cluster.device,
        dtype=_attention_dtype(s),
        flops=work.flops,
        bytes_moved=work.bytes_moved,
        tokens=work.read_tokens / s.column("cp"),
        batch=p.batch,
        heads=model.attention.num_heads / s.shard,
        # the workload's named kernel, else the serving engine's own where measured
        engine=s.workload.mla_decode_kernel or s.profile.engine,
    )


def _gqa_decode_time(s: _Setup, p: ops.Pass, work: _AttentionWork) -> np.ndarray:
    """MHA/GQA decode at the measured decode-attention curves: one call per rank, its sequences
    times its KV heads (a KV head replicated over the ranks past the KV-head count is one per
    rank), each with its group of query heads."""
    model = s.model
    kv_heads = model.attention.num_kv_heads / ops.kv_head_split(model, s.shard)
    return s.rows.evaluate(
        decode_attention_time_s,
        hardware=s.cluster.device,
        flops=work.flops,
        bytes_moved=work.bytes_moved,
        tokens=work.read_tokens / s.column("cp"),
        units=p.batch * kv_heads,
        group=model.attention.num_heads / s.shard / kv_heads,
        kv_element_bytes=s.kv_element_bytes,
        engine=s.profile.engine,
    )


def _context_time(s: _Setup, p: ops.Pass, work: _AttentionWork) -> np.ndarray | None:
    """MHA/GQA context attention at its measured curves: one call per rank, its sequences times
    its query heads; the prompt's full length (the cached prefix too) is the length the kernel
    attends over."""
    return s.rows.evaluate(
        context_attention_time_s,
        hardware=s.cluster.device,
        flops=work.flops,
        bytes_moved=work.bytes_moved,
        tokens=work.read_tokens / s.column("cp"),
        units=p.batch * s.model.attention.num_heads / s.shard,
        engine=s.profile.engine,
        kv_element_bytes=s.kv_element_bytes,
    )


def _attention_time(s: _Setup, p: ops.Pass) -> np.ndarray:
    """Core attention of one layer and its DSA indexer where it has one, (n,) seconds
    (``_core_attention_time``, ``_indexer_time``); a DSA or MLA layer's prefill where the
    engine's tables time its whole attention module, that module, projections included
    (``_inference_module``); where linear layers of their own shape alternate with full ones,
    the mean layer: the full layers' attention and the linear layers' recurrence
    (``_linear_mixer_time``) in their shares."""
    a = s.model.attention
    if a.has_linear_mixer:
        full_only = s.model.model_copy(update={"attention": a.full_layers_only()})
        full = replace(s, model=full_only)
        f = a.full_layer_fraction
        return f * _core_attention_time(full, p) + a.linear_share * _linear_mixer_time(s, p)
    roofline = _core_attention_time(s, p) + _indexer_time(s, p)
    rows = np.zeros(1, dtype=bool) if p.decode else module_rows(s)
    if not rows.any():
        return roofline
    return np.where(rows, prefill_module_time(s, p), roofline)


def _linear_mixer_time(s: _Setup, p: ops.Pass) -> np.ndarray:
    """One linear layer's mixer over pass ``p`` on one rank, (n,) seconds, its heads split over
    the tensor-parallel ranks (vLLM and SGLang shard the DeltaNet heads): a Gated DeltaNet
    layer's convolution and recurrence at their measured latency where a table covers the device
    (``_kernel_curves_linear``: decode one token per sequence, prefill the pass's new tokens per
    sequence), else ``_linear_mixer_roofline``."""
    a = s.model.attention
    if a.linear_kind == "gated_deltanet":
        measured = gated_deltanet_time_s(
            device_name=s.hardware.name,
            engine=s.profile.engine,
            key_heads=a.linear_key_heads / s.shard,
            value_heads=a.linear_value_heads / s.shard,
            head_dims=(a.linear_key_head_dim, a.linear_value_head_dim),
            batch=p.batch * p.new_tokens if p.decode else p.batch,
            new_tokens=p.new_tokens,
            decode=p.decode,
        )
        if measured is not None:
            return measured
    return _linear_mixer_roofline(s, p)


def _linear_mixer_roofline(s: _Setup, p: ops.Pass) -> np.ndarray:
    """One linear layer's recurrence as a roofline: its FLOPs
    (``AttentionSpec.linear_flops_per_token``) and bytes — each sequence's state read and
    written once per pass, the new tokens' q, k, v and gates read once — at the attention
    calibration. The chunked prefill kernels' intra-chunk products (fla
    ``chunk_gated_delta_rule``) and the convolution are not counted: a lower bound."""
    a = s.model.attention
    shard = s.shard
    act = dtype_bytes(s.workload.activation_dtype)
    tokens = p.batch * p.new_tokens
    keys = a.linear_key_heads * a.linear_key_head_dim
    values = a.linear_value_heads * a.linear_value_head_dim
    flops = tokens * a.linear_flops_per_token() / shard
    state = 2.0 * p.batch * a.linear_state_elements() * s.kv_element_bytes / shard
    inputs = tokens * (2 * keys + 2 * values) * act / shard
    return s.rows.evaluate(
        op_time_s,
        flops=flops,
        bytes_moved=state + inputs,
        hardware=s.cluster.device,
        dtype=_attention_dtype(s),
        calibration=s.calibration,
        kind="attention",
    )


def _core_attention_time(s: _Setup, p: ops.Pass) -> np.ndarray:
    """Core attention (scores and values) of one layer, (n,) seconds: MLA decode, MHA/GQA decode
    and MHA/GQA context attention at their measured kernels where a table covers them
    (``_mla_decode_time``, ``_gqa_decode_time``, ``_context_time``), else the calibrated
    roofline."""
    work = _attention_work(s, p)
    if p.decode and s.model.attention.kind == "mla":
        measured = _mla_decode_time(s, p, work)
        if measured is not None:
            return measured
    measured_decode = _decode_attention_measured(s) if p.decode else None
    if measured_decode is not None and measured_decode.any():
        decode_measured = _gqa_decode_time(s, p, work)
        if measured_decode.all():
            return decode_measured
    if _context_attention_measured(s, decode=p.decode):
        measured = _context_time(s, p, work)
        if measured is not None:
            return measured
    roofline = s.rows.evaluate(
        op_time_s,
        flops=work.flops,
        bytes_moved=work.bytes_moved,
        hardware=s.cluster.device,
        dtype=_attention_dtype(s),
        calibration=s.calibration,
        kind="attention",
    )
    if measured_decode is not None and measured_decode.any():
        return np.where(measured_decode, decode_measured, roofline)
    return roofline
