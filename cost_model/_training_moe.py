"""One MoE block of a training step, forward, on one rank: the kernels Megatron-core runs.

* Router (``TopKRouter``): the gating GEMM, then the top-k softmax over the scores, which writes
  ``probs`` and the boolean ``routing_map`` (tokens x experts each); a memory-bound pass.
* Token dispatcher (Megatron-core ``MoEAlltoAllTokenDispatcher``, ``token_dispatcher.py``):
  ``permute`` gathers the ``top_k`` copies of each token into expert order (read and write
  tokens x top_k x hidden), the all-to-all (priced in ``_training_comm``), and, with more than one
  local expert, ``sort_chunks_by_idxs`` regroups the received chunks by local expert (read and
  write); the combine runs the reverse: ``sort_chunks_by_idxs`` back, the all-to-all, and
  ``unpermute`` reads each weighted copy and sums it into its token (one write per token).
* Routed experts (``GroupedMLP`` / TE ``GroupedLinear``): one grouped GEMM per expert matrix, of
  M = the tokens each local expert receives, K and N the hidden size and the expert FFN width
  (over etp). Where ``cost_model/data/kernel_curves.json`` holds a measured grouped-GEMM curve
  for the device and the training dtype (operator tables, ``_kernel_curves_moe``), the experts are
  priced at that shape by ``grouped_experts_time_s``; its ideal counts the expert-side
  permute into the grouped layout and un-permute into the combine buffer with the FFN's own
  passes, which stand here for ``sort_chunks_by_idxs`` and its reverse. Elsewhere (no curve:
  GB200 bf16, MI300X, any device without imported tables) the experts keep the roofline at the
  calibrated GEMM efficiency of their per-expert size, plus the dispatcher passes above.
  The curves were measured up to ``TOKENS_PER_EXPERT_GRID[-1]`` (512) tokens per expert, with
  inference engines' fused MoE kernels; they price the experts only there. Beyond, where a
  training micro-batch usually is (Qwen3-30B-A3B at 4096 tokens, top-8 of 128 experts, EP 8:
  2048 per expert), the per-expert GEMMs are large and keep the roofline: holding the curve's
  last point flat would carry those kernels' efficiency at M = 512 (0.3-0.5 of the fp8 peak on
  H100/B200/GB200) to M of several thousand, beyond what was measured.

The backward is priced by the caller as twice the forward (Narayanan et al. SC'21 sec. 5.1):
for the experts, the data-gradient and weight-gradient grouped GEMMs, each of the forward's
FLOPs, taken at the forward's measured efficiency (the curves hold no backward shapes); for the
memory-bound passes, the gradient of a gather is the scatter of the same bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from cost_model._inference_ops import experts_touched_fraction, routed_bytes_per_assignment
from cost_model._kernel_curves_moe import TOKENS_PER_EXPERT_GRID, grouped_experts_time_s
from cost_model._precision import bf16_layer_fraction
from cost_model._training_comm import ACTIVATION_BYTES
from cost_model._units import dtype_bytes

if TYPE_CHECKING:
    from cost_model._training_context import TrainingContext

#: Bytes per router score element of the top-k softmax: the fp32 scores read, fp32 ``probs``
#: written, one-byte ``routing_map`` written (Megatron-core ``moe_utils.topk_softmax_with_capacity``).
ROUTER_SCORE_BYTES = 4.0 + 4.0 + 1.0


def routed_assignments(ctx: TrainingContext) -> np.ndarray:
    """Token copies the busiest expert rank computes per micro-batch: its routed tokens times
    ``top_k`` times the routing imbalance, times etp (each etp rank computes every copy of its
    group on a 1/etp slice of the expert width)."""
    moe = ctx.model.moe
    assert moe is not None
    return ctx.moe_tokens * moe.top_k * ctx.options.expert_load_factor * ctx.column("etp")


def tokens_per_expert(ctx: TrainingContext) -> np.ndarray:
    """M of the busiest rank's grouped GEMMs: its token copies over its local experts."""
    moe = ctx.model.moe
    assert moe is not None
    return routed_assignments(ctx) / (moe.num_routed_experts / ctx.column("ep"))


def router_time(ctx: TrainingContext) -> np.ndarray:
    """Gating GEMM (hidden x experts per token) and the top-k softmax pass over the scores."""
    moe = ctx.model.moe
    assert moe is not None
    h, experts = ctx.model.hidden_size, moe.num_routed_experts
    gemm = ctx.op(
        2.0 * ctx.moe_tokens * h * experts, ctx.moe_tokens * h * ACTIVATION_BYTES, role="router"
    )
    return gemm + ctx.op(0.0, ctx.moe_tokens * experts * ROUTER_SCORE_BYTES)


def dispatcher_bytes_per_copy(ctx: TrainingContext, *, expert_side: bool) -> np.ndarray:
    """Bytes per token copy of the dispatcher's memory passes (see the module docstring): on the
    token's rank ``permute`` (read, write) and ``unpermute`` (read, and one write per token);
    with ``expert_side``, ``sort_chunks_by_idxs`` and its reverse (read, write each) where a rank
    holds more than one expert."""
    moe = ctx.model.moe
    assert moe is not None
    h = ctx.model.hidden_size
    source = (2.0 + 1.0 + 1.0 / moe.top_k) * h * ACTIVATION_BYTES
    if not expert_side:
        return np.broadcast_to(source, ctx.tokens.shape)
    local_experts = moe.num_routed_experts / ctx.column("ep")
    return source + np.where(local_experts > 1.0, 4.0 * h * ACTIVATION_BYTES, 0.0)


def _curve_dtype(ctx: TrainingContext) -> str:
    return "fp8" if ctx.workload.precision == "fp8" else ctx.workload.precision


def _measured_experts(ctx: TrainingContext, dtype: str) -> np.ndarray | None:
    """Routed experts of one layer at their grouped-GEMM shape from the measured curve for
    ``dtype``; None without one. The side bytes are the fused kernel's, as the curve's
    efficiency was derived with them (``autoparallel._kernel_import``)."""
    model, moe = ctx.model, ctx.model.moe
    assert moe is not None
    etp, ep = ctx.column("etp"), ctx.column("ep")
    cast = min(dtype_bytes(dtype), ACTIVATION_BYTES)
    return grouped_experts_time_s(
        hardware=ctx.cluster.device,
        dtype=dtype,
        tokens_per_expert=tokens_per_expert(ctx),
        experts_per_device=moe.num_routed_experts / ep,
        touched_fraction=experts_touched_fraction(
            ctx.moe_tokens * ep * etp, top_k=moe.top_k, num_experts=moe.num_routed_experts
        ),
        side_bytes_per_assignment=routed_bytes_per_assignment(
            model, act=ACTIVATION_BYTES, cast=cast, etp=etp
        ),
        hidden_size=model.hidden_size,
        expert_ffn_size=moe.expert_ffn_hidden_size / etp,
    )


def measured_experts_time(ctx: TrainingContext) -> np.ndarray | None:
    """Routed experts of one layer from the grouped-GEMM curves in the training dtype; in fp8
    training, the layers kept in bf16 (``bf16_layer_fraction``) from the bf16 curve. None
    (the caller keeps the roofline pricing) where a needed curve is missing."""
    dtype = _curve_dtype(ctx)
    measured = _measured_experts(ctx, dtype)
    kept = bf16_layer_fraction(ctx)
    if measured is None or not np.any(kept):
        return measured
    high = _measured_experts(ctx, "bf16")
    return None if high is None else measured * (1.0 - kept) + high * kept


def roofline_experts_time(ctx: TrainingContext, *, activation_passes: float) -> np.ndarray:
    """Routed experts of one layer as rooflines at the calibrated GEMM efficiency of one expert's
    GEMM (the pricing where no grouped-GEMM curve is measured), with their activation pass.
    Kernels: Megatron-core's ``TEGroupedMLP`` calls Transformer Engine's ``GroupedLinear`` twice
    (the gated fc1, then fc2), and each call runs one cuBLASLt GEMM per local expert
    (``general_grouped_gemm``): two GEMMs per local expert, each paying the per-kernel cost."""
    model, moe = ctx.model, ctx.model.moe
    assert moe is not None
    h, width = model.hidden_size, moe.expert_ffn_hidden_size / ctx.column("etp")
    assignments = routed_assignments(ctx)
    local_experts = moe.num_routed_experts / ctx.column("ep")
    expert = model.ffn_parameters(moe.expert_ffn_hidden_size) / ctx.column("etp")
    gemms = ctx.op(
        2.0 * assignments * expert,
        local_experts * expert * 2.0 + assignments * 2.0 * (h + width) * ACTIVATION_BYTES,
        calls=2.0 * local_experts,
        role="expert",
    )
    return gemms + expert_activation_time(ctx, activation_passes=activation_passes)


def expert_activation_time(ctx: TrainingContext, *, activation_passes: float) -> np.ndarray:
    """The routed experts' activation function of one layer, forward: a memory-bound pass over
    the busiest rank's FC1 outputs (what ``--recompute-modules moe_act`` repeats)."""
    moe = ctx.model.moe
    assert moe is not None
    width = moe.expert_ffn_hidden_size / ctx.column("etp")
    moved = routed_assignments(ctx) * width * activation_passes * ACTIVATION_BYTES
    return ctx.op(0.0, moved)


def shared_experts_time(ctx: TrainingContext, *, activation_passes: float) -> np.ndarray:
    """The shared experts of one MoE layer, forward: their GEMMs (split over tp) and activation
    pass; zeros without shared experts."""
    model, moe = ctx.model, ctx.model.moe
    assert moe is not None
    shared = moe.num_shared_experts * model.ffn_parameters(moe.shared_ffn_size) / ctx.column("tp")
    if not shared.any():
        return np.zeros_like(ctx.tokens)
    shared_width = moe.num_shared_experts * moe.shared_ffn_size / ctx.column("tp")
    shared_time = ctx.op(2.0 * ctx.tokens * shared, shared * 2.0)
    return shared_time + ctx.op(
        0.0, ctx.tokens * shared_width * activation_passes * ACTIVATION_BYTES
    )


def moe_ffn_time(ctx: TrainingContext, *, activation_passes: float) -> np.ndarray:
    """Router, dispatcher passes, routed experts (busiest rank) and shared experts of one MoE
    layer, forward; zeros for a dense model. ``activation_passes``: reads + writes per element
    of the activation function's output (``_training_ops.activation_passes``)."""
    if ctx.model.moe is None:
        return np.zeros_like(ctx.tokens)
    experts, dispatcher = _experts_and_dispatcher(ctx, activation_passes=activation_passes)
    shared = shared_experts_time(ctx, activation_passes=activation_passes)
    return router_time(ctx) + dispatcher + experts + shared


def routed_experts_time(ctx: TrainingContext, *, activation_passes: float) -> np.ndarray:
    """The routed experts of one MoE layer, forward (busiest rank): their grouped GEMMs and
    activation, as ``moe_ffn_time`` prices them (what Megatron-core's fine-grained schedule runs
    as the layer's ``mlp`` node); zeros for a dense model."""
    if ctx.model.moe is None:
        return np.zeros_like(ctx.tokens)
    return _experts_and_dispatcher(ctx, activation_passes=activation_passes)[0]


def _experts_and_dispatcher(
    ctx: TrainingContext, *, activation_passes: float
) -> tuple[np.ndarray, np.ndarray]:
    """(routed experts, dispatcher memory passes) of one MoE layer, forward."""
    assignments = routed_assignments(ctx)
    roofline = roofline_experts_time(ctx, activation_passes=activation_passes)
    with_sorts = assignments * dispatcher_bytes_per_copy(ctx, expert_side=True)
    measured = measured_experts_time(ctx)
    if measured is None:
        return roofline, ctx.op(0.0, with_sorts)
    # The curve where it was measured, the roofline beyond.
    within = tokens_per_expert(ctx) <= TOKENS_PER_EXPERT_GRID[-1]
    source = assignments * dispatcher_bytes_per_copy(ctx, expert_side=False)
    return np.where(within, measured, roofline), ctx.op(0.0, np.where(within, source, with_sorts))
