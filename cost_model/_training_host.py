"""Host issue time of a micro-batch: a stretch of work takes at least the time the host needs to
issue it.

Host and device run concurrently: the host (Python, the PyTorch dispatcher, Transformer Engine,
the CUDA driver's ``cudaLaunchKernel``) issues kernels ahead of the GPU, and the GPU cannot run
a kernel before it is issued. Over a stretch of work with no device-to-host synchronization,
issued in order, the GPU finishes no earlier than, for every split point, the host time to
issue the ops before it plus the GPU time of the ops after it (list scheduling of two
resources in series); with uniform blocks the maximum sits at a block boundary, so a stretch
of blocks ``(host_i, gpu_i)`` takes ``max_k (sum host[:k] + sum gpu[k:])`` - at least
``max(host, GPU)``.

A synchronization drains the host's lead. Megatron-core's dropless token dispatchers need the
token counts on the host (the all-to-all takes its split sizes there and Transformer Engine's
``GroupedLinear`` takes the tokens of each local expert as a Python list), so every MoE layer's
forward copies the counts to the host and waits before the all-to-all
(``token_dispatcher.py`` ``_maybe_dtoh_and_synchronize``; DeepEP and HybridEP read the received
count the same way unless a static capacity is given, ``fused_a2a.py``). The forward then splits
into one stretch per MoE layer: the part after one layer's sync (all-to-alls, permutes,
experts, combine) followed by the part before the next one's (attention, router, dispatch
preprocessing); the dense layers and the model's ends form their own stretch. The backward
reuses the split sizes and has no such wait: one stretch per micro-batch.

Within the part after the sync the host issues, in order, the dispatch (its all-to-alls and the
sort by local expert), then the expert GEMMs one cuBLASLt call per local expert, then the combine
(``token_dispatcher.py`` ``token_dispatch``, ``dispatch_postprocess``; ``experts.py``
``TEGroupedMLP.forward``; ``combine_preprocess`` to ``combine_postprocess``). The stretch is
priced block by block in that order: the dispatch all-to-all's GPU time can hide the GEMMs'
issue time that follows it, the combine's cannot, since the GPU reaches the combine only after
the last GEMM is issued. The GPU side of the dispatch and of the combine is half each of the
segment less its experts (the two all-to-alls move the same tokens, as
``_training_ep_overlap`` prices them).

The host side of each part is the framework's operator count per layer
(``FrameworkProfile.host_ops``: counted from the framework's code, with the basis in
``data/framework_profiles.json``) times the host seconds per eager operator (the hardware
profile's measured ``eager_op_host_s`` where there is one, else the profile's sourced default,
measured on x86 DGX hosts, times the device's ``host_op_time_factor``: twice on a Grace host),
plus one cuBLASLt GEMM per local expert and ``GroupedLinear`` call at
``FrameworkProfile.expert_gemm_host_s`` (two calls forward, a data- and a weight-gradient GEMM of
each in backward), plus, in fp8, the quantization launches of each local expert and call
(``HostOpCounts.expert_quantization`` of the run's recipe: Transformer Engine quantizes the
input, forward, and the output gradient, backward, expert by expert; current scaling launches
four kernels per expert and tensor, MXFP8 one) at the eager operator's seconds. CUDA graphs
remove the host cost of what they capture (``EstimateOptions.cuda_graphs``): ``partial``
replaces each captured scope (``EstimateOptions.cuda_graph_scope``: attention, router,
dispatch preprocessing) by one graph launch per pass; ``full_iteration`` captures everything.
Counts leave out the Python of each module around its kernels (the per-expert Python loops of
``GroupedLinear`` among them) and the weights' quantization, cached after a step's first
micro-batch: the host side is a lower bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from cost_model._frameworks import FrameworkProfile, HostOpCounts
    from cost_model._training_context import TrainingContext

__all__ = [
    "HostParts",
    "LayerGpuParts",
    "exposed_host_s",
    "host_parts",
    "host_time_scale",
    "stretch_time_s",
]

#: GroupedLinear calls of one MoE layer's experts in a forward pass: the gated fc1 (gate and up
#: projections in one weight) and fc2 (Megatron-core ``TEGroupedMLP``).
GROUPED_LINEARS_PER_FORWARD = 2.0
#: Backward GEMMs per forward GEMM: the data and the weight gradient.
BACKWARD_GEMMS_PER_GEMM = 2.0


@dataclass(frozen=True)
class HostParts:
    """Host seconds to issue each part of one layer on one rank, forward and backward (each
    broadcastable to the rows' shape)."""

    attention_forward: np.ndarray
    attention_backward: np.ndarray
    moe_before_sync_forward: np.ndarray  # router + dispatch preprocessing (+ shared experts)
    moe_dispatch_forward: np.ndarray  # after the sync: dispatch all-to-alls, sort by expert
    moe_experts_forward: np.ndarray  # per local expert and call: its GEMM (+ fp8 quantization)
    moe_combine_forward: np.ndarray  # activation, unsort, combine all-to-all, unpermute
    moe_backward: np.ndarray
    dense_mlp_forward: np.ndarray
    dense_mlp_backward: np.ndarray
    embedding_forward: np.ndarray
    embedding_backward: np.ndarray
    lm_head_forward: np.ndarray  # final norm, output layer and loss
    lm_head_backward: np.ndarray

    @property
    def moe_after_sync_forward(self) -> np.ndarray:
        """Host seconds of everything an MoE layer's forward issues after its sync."""
        return self.moe_dispatch_forward + self.moe_experts_forward + self.moe_combine_forward


@dataclass(frozen=True)
class LayerGpuParts:
    """GPU seconds of one micro-batch's parts on each pipeline rank, as the layer model prices
    them: one MoE layer's forward before its sync (attention, router, preprocessing) and after
    it (the dispatch-to-combine segment with its all-to-alls), of which the experts (routed and
    shared), the forward of the dense layers and ends of the stage, and the stage's whole
    backward."""

    moe_before_sync: np.ndarray
    moe_after_sync: np.ndarray
    moe_experts: np.ndarray  # the experts' share of moe_after_sync
    rest_forward: np.ndarray
    backward: np.ndarray


def host_time_scale(ctx: TrainingContext, framework: FrameworkProfile) -> float:
    """The run's host seconds per operator over the framework's defaults (measured on x86 DGX
    hosts): the hardware profile's measured ``eager_op_host_s`` over the default where there is
    one, else the device's ``host_op_time_factor`` (a Grace host: 2)."""
    assert framework.host_ops is not None
    measured = getattr(ctx.cluster.device, "eager_op_host_s", None)
    if measured is not None:
        return float(measured) / framework.host_ops.eager_op_host_s
    return float(getattr(ctx.cluster.device, "host_op_time_factor", 1.0))


def eager_op_host_s(ctx: TrainingContext, framework: FrameworkProfile) -> float:
    """Host seconds per eagerly issued operator: the hardware profile's measured value where
    there is one (``topology`` ``eager_op_host_s``), else the framework's sourced default on the
    device's host (``host_time_scale``)."""
    assert framework.host_ops is not None
    return framework.host_ops.eager_op_host_s * host_time_scale(ctx, framework)


def _scoped(ctx: TrainingContext, scope: str, ops: float) -> float:
    """Operators the host issues for one captured-or-eager scope: one graph launch where the
    run captures it in a partial CUDA graph."""
    if ctx.options.cuda_graphs == "partial" and scope in ctx.options.cuda_graph_scope:
        return 1.0 if ops > 0 else 0.0
    return ops


def _expert_quantization_ops(ctx: TrainingContext, counts: HostOpCounts) -> tuple[float, float]:
    """Quantization operators per local expert and ``GroupedLinear`` call, (forward, backward):
    the counts of the run's fp8 recipe, none in bf16 or for a recipe without counts."""
    if ctx.workload.precision != "fp8":
        return 0.0, 0.0
    ops = counts.expert_quantization.get(ctx.workload.fp8_recipe)
    return (0.0, 0.0) if ops is None else (ops.forward, ops.backward)


def host_parts(ctx: TrainingContext) -> HostParts | None:
    """Host seconds of each part of one layer (see ``HostParts``); None where the framework
    has no operator counts or the whole iteration is one CUDA graph."""
    framework = ctx.framework
    if (
        framework is None
        or framework.host_ops is None
        or ctx.options.cuda_graphs == "full_iteration"
    ):
        return None
    counts: HostOpCounts = framework.host_ops
    op_s = eager_op_host_s(ctx, framework)
    routing_s = (
        op_s
        if counts.moe_routing_op_host_s is None
        else counts.moe_routing_op_host_s * host_time_scale(ctx, framework)
    )
    core_extra = 0.0 if ctx.options.flash_attention else counts.unfused_attention_extra
    attention_fwd = _scoped(ctx, "attn", counts.attention_forward + core_extra)
    attention_bwd = _scoped(ctx, "attn", counts.attention_backward + 2.0 * core_extra)
    zeros = np.zeros_like(ctx.tokens)
    moe = ctx.model.moe
    if moe is None:
        before = dispatch = experts = combine = moe_bwd = zeros
    else:
        local_experts = moe.num_routed_experts / ctx.column("ep")
        gemm_s = framework.expert_gemm_host_s * host_time_scale(ctx, framework)
        shared = 1.0 if moe.num_shared_experts else 0.0
        routing_ops = _scoped(ctx, "moe_router", counts.router_forward) + _scoped(
            ctx, "moe_preprocess", counts.dispatch_preprocess_forward
        )
        before = zeros + routing_ops * routing_s + shared * counts.shared_experts_forward * op_s
        dispatch = zeros + counts.expert_dispatch_forward * routing_s
        quantize_forward, quantize_backward = _expert_quantization_ops(ctx, counts)
        experts = zeros + GROUPED_LINEARS_PER_FORWARD * local_experts * (
            gemm_s + quantize_forward * op_s
        )
        combine = (
            zeros + (counts.expert_segment_forward - counts.expert_dispatch_forward) * routing_s
        )
        routing_backward_ops = (
            _scoped(ctx, "moe_router", counts.router_backward)
            + _scoped(ctx, "moe_preprocess", counts.dispatch_preprocess_backward)
            + counts.expert_segment_backward
        )
        moe_bwd = (
            zeros
            + routing_backward_ops * routing_s
            + shared * counts.shared_experts_backward * op_s
            + BACKWARD_GEMMS_PER_GEMM * GROUPED_LINEARS_PER_FORWARD * local_experts * gemm_s
            + GROUPED_LINEARS_PER_FORWARD * local_experts * quantize_backward * op_s
        )
    return HostParts(
        attention_forward=zeros + attention_fwd * op_s,
        attention_backward=zeros + attention_bwd * op_s,
        moe_before_sync_forward=before,
        moe_dispatch_forward=dispatch,
        moe_experts_forward=experts,
        moe_combine_forward=combine,
        moe_backward=moe_bwd,
        dense_mlp_forward=zeros + counts.dense_mlp_forward * op_s,
        dense_mlp_backward=zeros + counts.dense_mlp_backward * op_s,
        embedding_forward=zeros + counts.embedding_forward * op_s,
        embedding_backward=zeros + counts.embedding_backward * op_s,
        lm_head_forward=zeros + counts.lm_head_forward * op_s,
        lm_head_backward=zeros + counts.lm_head_backward * op_s,
    )


def stretch_time_s(blocks: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Seconds a sync-free stretch of blocks ``(host_s, gpu_s)``, issued in order, takes:
    ``max_k (sum host[:k] + sum gpu[k:])`` over the block boundaries ``k``."""
    suffix_gpu = np.asarray(sum(gpu for _, gpu in blocks))
    best = suffix_gpu
    prefix_host = np.zeros_like(suffix_gpu)
    for host, gpu in blocks:
        prefix_host = prefix_host + host
        suffix_gpu = suffix_gpu - gpu
        best = np.maximum(best, prefix_host + suffix_gpu)
    return best


def exposed_host_s(ctx: TrainingContext, *, gpu: LayerGpuParts) -> tuple[np.ndarray, np.ndarray]:
    """Seconds one micro-batch waits on its host beyond the GPU time of its parts, on each
    pipeline rank: (forward, backward); zeros without operator counts or under a full-iteration
    CUDA graph. The forward of an MoE layer with a host sync is one stretch of the part after
    the previous layer's sync (dispatch, experts, combine) and the part before its own; without
    a sync (or a dense model)
    the forward is one stretch, and the backward is one stretch."""
    layout = ctx.layout
    zeros = np.zeros(np.broadcast(ctx.tokens, gpu.backward).shape)
    parts = host_parts(ctx)
    if parts is None:
        return zeros, zeros
    moe_layers, dense_layers = layout.moe_layers, layout.dense_layers
    host_dense_fwd = parts.attention_forward + parts.dense_mlp_forward
    host_rest_fwd = (
        dense_layers * host_dense_fwd
        + layout.has_embedding * parts.embedding_forward
        + layout.has_lm_head * parts.lm_head_forward
    )
    host_before = parts.attention_forward + parts.moe_before_sync_forward
    host_after = parts.moe_after_sync_forward
    syncs = ctx.moe_dispatch_syncs
    if syncs:
        # Dispatch and combine share the segment's GPU time beside the experts (module doc).
        exchange = (gpu.moe_after_sync - gpu.moe_experts) / 2.0
        per_moe_layer = stretch_time_s(
            [
                (parts.moe_dispatch_forward, exchange),
                (parts.moe_experts_forward, gpu.moe_experts),
                (parts.moe_combine_forward, exchange),
                (host_before, gpu.moe_before_sync),
            ]
        ) - (gpu.moe_after_sync + gpu.moe_before_sync)
        rest = np.maximum(host_rest_fwd - gpu.rest_forward, 0.0)
        forward = moe_layers * per_moe_layer + rest
    else:
        host_fwd = host_rest_fwd + moe_layers * (host_before + host_after)
        gpu_fwd = gpu.rest_forward + moe_layers * (gpu.moe_before_sync + gpu.moe_after_sync)
        forward = np.maximum(host_fwd - gpu_fwd, 0.0)
    host_bwd = (
        dense_layers * (parts.attention_backward + parts.dense_mlp_backward)
        + moe_layers * (parts.attention_backward + parts.moe_backward)
        + layout.has_embedding * parts.embedding_backward
        + layout.has_lm_head * parts.lm_head_backward
    )
    backward = np.maximum(host_bwd - gpu.backward, 0.0)
    return zeros + forward, zeros + backward
