"""Host issue time of an MoE layer's expert segment that a dropless dispatch exposes.

Host and device run concurrently: the host (Python, PyTorch, Transformer Engine, the CUDA
driver) issues kernels ahead of the GPU, and a stretch of work takes max(host issue time, GPU
time). A device-to-host synchronization drains that lead. Megatron-core's dropless token
dispatchers need the token counts on the host: the all-to-all takes its split sizes there,
and Transformer Engine's ``GroupedLinear`` takes the tokens of each local expert as a Python
list; so every MoE layer's forward copies the counts to the host and waits for them before the
all-to-all (``token_dispatcher.py``; DeepEP and HybridEP read the received count the same way
unless a static capacity is given, ``fused_a2a.py``). After that wait the GPU is idle until the
host issues the next kernel, and the segment from the dispatch to the combine - the two
all-to-alls, the permutes and the experts - takes max(host, GPU) on its own: the host cannot
have issued any of it early. Its host side is dominated by the experts: ``GroupedLinear``
issues one cuBLASLt GEMM per local expert (``general_grouped_gemm``), for the gated fc1 and for
fc2, each at a fixed host cost that does not shrink with the tokens
(``FrameworkProfile.expert_gemm_host_s``, an operator-level measurement with its source in
``data/framework_profiles.json``). What the host issue time exceeds the segment's GPU time by is
exposed, every micro-batch and MoE layer.

The backward runs the data- and weight-gradient GEMM of every forward GEMM and has no such
wait; it is charged as twice the forward like the rest of the layer (the model's convention,
Narayanan et al. SC'21 sec. 5.1), which holds the same host/GPU ratio.

Zero where the framework's dispatch does not wait on the host, where the run captures the
whole iteration in a CUDA graph (``EstimateOptions.cuda_graphs == "full_iteration"``: one
graph launch issues every kernel; it needs a sync-free dispatch), and for dense models. Per-layer
TE graphs (``"partial"``: attention, router, dispatch preprocessing) leave the segment eager and
change nothing here. Host costs of the other operators of the segment (permutes, quantization,
activation) are not counted: the term is a lower bound of the exposed host time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from cost_model._training import TrainingContext

__all__ = ["expert_segment_host_s", "exposed_expert_host_s"]

#: GroupedLinear calls of one MoE layer's experts in a forward pass: the gated fc1 (gate and up
#: projections in one weight) and fc2 (Megatron-core ``TEGroupedMLP``).
GROUPED_LINEARS_PER_FORWARD = 2.0


def expert_segment_host_s(ctx: TrainingContext) -> np.ndarray:
    """Host seconds to issue the expert GEMMs of one MoE layer's forward on one rank: one per
    local expert and ``GroupedLinear`` call, at the framework's measured cost per expert GEMM;
    zeros without a framework profile or for a dense model."""
    moe, framework = ctx.model.moe, ctx.framework
    if moe is None or framework is None:
        return np.zeros_like(ctx.tokens)
    local_experts = moe.num_routed_experts / ctx.column("ep")
    per_gemm = framework.expert_gemm_host_s
    return np.broadcast_to(GROUPED_LINEARS_PER_FORWARD * local_experts * per_gemm, ctx.tokens.shape)


def exposed_expert_host_s(ctx: TrainingContext, *, segment_gpu_s: np.ndarray) -> np.ndarray:
    """Seconds one MoE layer's forward waits on the host beyond ``segment_gpu_s``, the GPU time
    of its dispatch-to-combine segment (dispatcher passes, experts, forward all-to-alls); zero
    where the dispatch does not wait on the host or the whole iteration is one CUDA graph."""
    framework = ctx.framework
    if (
        framework is None
        or not framework.moe_dispatch_host_sync
        or ctx.options.cuda_graphs == "full_iteration"
    ):
        return np.zeros(np.broadcast(ctx.tokens, segment_gpu_s).shape)
    return np.maximum(expert_segment_host_s(ctx) - segment_gpu_s, 0.0)
