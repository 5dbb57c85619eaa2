"""Seconds of one micro-batch on each pipeline rank: forward, backward, recompute, TP/EP/CP.

* forward: the layer operators of ``_training_ops`` over the rank's dense and MoE layers and
  model ends, each kernel paying the calibration's fixed cost; backward = 2 x forward (Narayanan
  et al. SC'21 sec. 5.1: "the backward pass is twice the forward"), core attention 2.5 x its
  forward with FlashAttention (FlashAttention-2, Dao 2023, sec. 3.1: 5 matmuls vs 2); a stretch
  of work takes at least the host's time to issue it (``_training_host``);
* recompute: ``full`` repeats the forward of every layer, or of the first
  ``EstimateOptions.recompute_layers`` of each model chunk (Megatron-core ``--recompute-method
  block``); ``selective`` repeats the forward of the modules ``EstimateOptions.recompute_modules``
  names (Megatron-core ``--recompute-modules``; the default, core attention, is Korthikanti et
  al. 2022, arXiv:2205.05198, sec. 5) — each recomputed module costs its forward time once more;
  torchtitan's op-level selective checkpointing recomputes half the matmul and elementwise
  forward (``_apply_op_sac``);
* communication per micro-batch (one collective of each kind priced by ``_training_comm``):
  TP all-reduce, or reduce-scatter + all-gather with SP, twice per layer per pass (Shoeybi et
  al. 2019, Megatron-LM sec. 3; Korthikanti sec. 4.2.2); EP all-to-all dispatch + combine per
  MoE layer and pass (DeepSeek-V3 report, arXiv:2412.19437, sec. 3.2.2); CP ring send/recv of
  K/V blocks, the backward ring carrying K/V and their gradients.

How much of the communication hides, and the pipeline around the micro-batches, is
``_training``'s. Split from ``_training``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_model import _training_moe as training_moe
from cost_model._precision import quantization_time_s
from cost_model._table import RECOMPUTE_CODES
from cost_model._training_comm import CollectiveTimes, mla_backward_widths
from cost_model._training_context import TrainingContext
from cost_model._training_host import LayerGpuParts, exposed_host_s
from cost_model._training_ops import (
    activation_passes,
    attention_projection_time,
    core_attention_time,
    cross_entropy_time,
    dense_ffn_time,
    embedding_time,
    gradient_accumulation_time,
    kernels_per_layer,
    layer_elementwise_time,
    layer_host_time,
    lm_head_time,
    mla_up_projection_time,
    moe_ffn_time,
    norm_time,
    tensor_parallel_host_time,
)

__all__ = [
    "MicroBatchTimes",
    "RecomputeWork",
    "micro_batch_times",
    "recompute_module_times",
]


@dataclass(frozen=True)
class MicroBatchTimes:
    """Seconds of one micro-batch on each pipeline rank (rows ``STAGES``)."""

    forward: np.ndarray
    backward: np.ndarray
    recompute: np.ndarray
    core_attention: (
        np.ndarray
    )  # forward + backward + recompute of core attention (CP overlap window)
    comm: dict[str, np.ndarray]  # tp_comm, ep_comm, cp_comm: total per micro-batch
    #: One dense layer's forward (ZeRO-3 per-layer overlap window), (n,), or (3, n) where the
    #: ranks' layers differ (fp8 training's bf16 layers at the model's ends)
    dense_layer_forward: np.ndarray
    moe_layer_forward: np.ndarray  # one MoE layer's forward, (n,) or (3, n) as the dense one
    host_wait: np.ndarray  # seconds of forward + backward spent waiting on the host (in both)


def _with_layer_host(ctx: TrainingContext, work: np.ndarray, host: np.ndarray) -> np.ndarray:
    """One layer's forward with the measured host seconds of its operators (a hardware
    profile's ``layer_host_time_s``: dispatch and autograd bookkeeping, a third of the
    forward + backward figure). On a CPU the same cores run that bookkeeping and the kernels, one
    after the other: their sum. On an accelerator the host issues kernels ahead of the device
    asynchronously (CUDA semantics; ``_training_host``), so the layer takes the longer of the
    two: the host bounds it only where it issues slower than the device runs."""
    if getattr(ctx.cluster.device, "resolved_device_type", "cpu") == "cpu":
        return work + host
    return np.maximum(work, host)


def micro_batch_times(ctx: TrainingContext, times: CollectiveTimes) -> MicroBatchTimes:
    layout = ctx.layout
    core = core_attention_time(ctx)
    dense_launches, moe_launches = kernels_per_layer(ctx)
    overhead = ctx.calibration.kernel_overhead_s
    dense_sharded, moe_sharded, per_sharded = tensor_parallel_host_time(ctx)
    dense_host, moe_host = layer_host_time(
        ctx
    )  # forward + backward: a third here, as backward = 2 x forward
    common = attention_projection_time(ctx) + layer_elementwise_time(ctx)
    dense_ffn = dense_ffn_time(ctx)
    dense_layer = _with_layer_host(
        ctx, common + core + dense_ffn + dense_launches * overhead + dense_sharded, dense_host / 3.0
    )
    moe_ffn = moe_ffn_time(ctx)
    moe_layer = _with_layer_host(
        ctx, common + core + moe_ffn + moe_launches * overhead + moe_sharded, moe_host / 3.0
    )
    # fp8 quantization kernels, forward + backward: a third here, as backward = 2 x forward.
    dense_layer = dense_layer + quantization_time_s(ctx, moe=False) / 3.0
    moe_layer = moe_layer + quantization_time_s(ctx, moe=True) / 3.0
    layers_forward = layout.dense_layers * dense_layer + layout.moe_layers * moe_layer
    ends = layout.has_embedding * (embedding_time(ctx) + per_sharded) + layout.has_lm_head * (
        lm_head_time(ctx) + per_sharded
    )
    core_backward_factor = 2.5 if ctx.options.flash_attention else 2.0
    backward = 2.0 * (layers_forward + ends) + (core_backward_factor - 2.0) * layout.layers * core
    # The loss's backward passes are its own count, not twice its forward ones.
    loss_forward = cross_entropy_time(ctx, backward=False)
    loss_backward = cross_entropy_time(ctx, backward=True)
    backward = backward + layout.has_lm_head * (loss_backward - 2.0 * loss_forward)
    backward = backward + gradient_accumulation_time(ctx)
    # A stretch of work takes at least the host's time to issue it (``_training_host``).
    host_forward, host_backward = exposed_host_s(
        ctx,
        gpu=_host_gpu_parts(
            ctx,
            moe_layer=moe_layer,
            moe_ffn=moe_ffn,
            rest_forward=layout.dense_layers * dense_layer + ends,
            backward=backward,
            times=times,
        ),
    )
    backward = backward + host_backward
    selective = np.asarray(ctx.table["recompute"]) == RECOMPUTE_CODES["selective"]
    modules = RecomputeWork(core=core, dense_ffn=dense_ffn, moe_ffn=moe_ffn)
    recompute = ctx.full_recompute_share * layers_forward + np.where(
        selective, _selective_recompute(ctx, layers_forward=layers_forward, work=modules), 0.0
    )
    core_recomputed = ctx.fully_recomputed_layers + np.where(
        selective & _recomputes_core_attention(ctx), layout.layers, 0.0
    )
    core_total = layout.layers * core * (1.0 + core_backward_factor) + core_recomputed * core
    return MicroBatchTimes(
        forward=layers_forward + ends + host_forward,
        backward=backward,
        recompute=recompute,
        core_attention=core_total,
        comm=_micro_batch_comm(ctx, times),
        dense_layer_forward=_rows(dense_layer, ctx),
        moe_layer_forward=_rows(moe_layer, ctx),
        host_wait=host_forward + host_backward,
    )


def _rows(layer: np.ndarray, ctx: TrainingContext) -> np.ndarray:
    """One layer's time as an array over the rows (n,), or over the pipeline ranks and the rows
    (3, n) where it differs by rank (``_precision.bf16_layer_fraction``)."""
    return np.broadcast_to(layer, np.broadcast_shapes(np.shape(layer), ctx.tokens.shape))


@dataclass(frozen=True)
class RecomputeWork:
    """Forward seconds of one layer's parts that selective recompute may repeat, already priced
    for the layer (shape (n,)): core attention, a dense FFN, an MoE block."""

    core: np.ndarray
    dense_ffn: np.ndarray
    moe_ffn: np.ndarray


def _op_level_selective(ctx: TrainingContext) -> bool:
    return ctx.framework is not None and ctx.framework.selective_recompute == "every_second_matmul"


def _recomputes_core_attention(ctx: TrainingContext) -> bool:
    return not _op_level_selective(ctx) and "core_attn" in ctx.options.recompute_modules


def _selective_recompute(
    ctx: TrainingContext, *, layers_forward: np.ndarray, work: RecomputeWork
) -> np.ndarray:
    """Forward seconds selective recompute repeats in backward on each rank (3, n).

    Megatron-core recomputes the modules ``EstimateOptions.recompute_modules`` names, each once
    more in backward (``--recompute-modules``; Megatron-Bridge docs/training/activation-
    recomputation.md; ``recompute_module_times``); its default, core attention, is Korthikanti
    et al. 2022 sec. 5. torchtitan's op-level selective checkpointing saves every second matmul
    output, the attention output and the collectives, and recomputes the rest: half the matmul
    and elementwise forward, not core attention (torchtitan ``_apply_op_sac``, ``_save_list``).
    The framework profile says which."""
    layout = ctx.layout
    if _op_level_selective(ctx):
        return 0.5 * (layers_forward - layout.layers * work.core)
    dense, moe = recompute_module_times(ctx, work=work)
    return layout.dense_layers * dense + layout.moe_layers * moe


def recompute_module_times(
    ctx: TrainingContext, *, work: RecomputeWork
) -> tuple[np.ndarray, np.ndarray]:
    """Forward seconds of one (dense, MoE) layer's selective-recompute modules (shape (n,)),
    Megatron-core's ``--recompute-modules``: ``core_attn`` the attention scores, softmax and
    weighted values; ``mla_up_proj`` MLA's up-projection GEMMs and rotary embedding
    (``mla_up_projection_time``); ``layernorm`` the two norms; ``mlp`` a dense layer's FFN;
    ``moe`` the whole MoE block (router, dispatcher passes, experts, shared experts; its
    all-to-alls repeat in ``_micro_batch_comm``), which contains ``moe_act`` (the routed experts'
    activation function) and ``shared_experts``."""
    modules = frozenset(ctx.options.recompute_modules)
    zeros = np.zeros_like(ctx.tokens)
    common = work.core if "core_attn" in modules else zeros
    if "mla_up_proj" in modules:
        common = common + mla_up_projection_time(ctx)
    if "layernorm" in modules:
        common = common + norm_time(ctx)
    dense = common + work.dense_ffn if "mlp" in modules else common
    if ctx.model.moe is None:
        return dense, dense
    passes = activation_passes(ctx)
    if "moe" in modules:
        return dense, common + work.moe_ffn
    moe = common
    if "moe_act" in modules:
        moe = moe + training_moe.expert_activation_time(ctx, activation_passes=passes)
    if "shared_experts" in modules:
        moe = moe + training_moe.shared_experts_time(ctx, activation_passes=passes)
    return dense, moe


def _micro_batch_comm(ctx: TrainingContext, times: CollectiveTimes) -> dict[str, np.ndarray]:
    """TP, EP and CP seconds of one micro-batch per rank: forward, backward, full recompute."""
    layout = ctx.layout
    # Forward, backward, and the forward full recompute repeats on its share of the layers.
    passes = 2.0 + ctx.full_recompute_share
    # Selective recompute of the ``moe`` module repeats the MoE block's dispatch and combine.
    moe_repeat = np.asarray(ctx.table["recompute"]) == RECOMPUTE_CODES["selective"]
    moe_repeat = (
        moe_repeat & ("moe" in ctx.options.recompute_modules) & (not _op_level_selective(ctx))
    )
    ep_passes = passes + moe_repeat
    # Selective recompute of core attention re-runs its context-parallel exchange: Megatron-core
    # checkpoints the core attention module (megatron/core/transformer/attention.py
    # ``_checkpointed_attention_forward``: ``tensor_parallel.checkpoint`` around
    # ``_run_core_attention``), and Transformer Engine's attention with a cp group exchanges K/V
    # inside it (transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py
    # ``attn_forward_func_with_cp``: ``AttnFuncWithCPAndKVP2P``'s ring,
    # ``AttnFuncWithCPAndKVAllGather``'s all-gather), so backward repeats one forward exchange.
    core_repeat = (
        np.asarray(ctx.table["recompute"]) == RECOMPUTE_CODES["selective"]
    ) & _recomputes_core_attention(ctx)
    tp_layer = np.where(ctx.sequence_parallel, times.tp_split, times.tp_all_reduce)
    # A blocking collective between compute segments waits for the ranks' wake-up beyond its
    # own time (measured, ``HardwareSpec.collective_sync_s``; 0 without a profile).
    sync = getattr(ctx.cluster.device, "collective_sync_s", 0.0)
    mla_extra = max(len(mla_backward_widths(ctx.model)) - 1.0, 0.0)
    mla_backward = np.where(ctx.sequence_parallel, 0.0, layout.layers * times.tp_mla_backward)
    tp_count = (
        passes * layout.layers * 2.0
        + layout.has_embedding
        + np.where(ctx.sequence_parallel, 0.0, layout.layers * mla_extra)
    )
    return {
        # Two collectives per layer and pass (MLA: more in backward without SP; the all-gathers
        # may move fp8, ``_training_comm._tp``); the vocab-parallel embedding all-reduces once.
        "tp_comm": passes * layout.layers * 2.0 * tp_layer
        + layout.has_embedding * times.tp_all_reduce
        + mla_backward
        + np.where(ctx.column("tp") > 1, tp_count * sync, 0.0),
        # Dispatch and combine: two all-to-alls per MoE layer and pass (forward and recompute
        # forward may dispatch in fp8; backward exchanges bf16 gradients).
        "ep_comm": layout.moe_layers
        * ((ep_passes - 1.0) * times.ep_exchange + times.ep_exchange_backward)
        + np.where(ctx.column("ep") > 1, ep_passes * layout.moe_layers * 2.0 * sync, 0.0),
        # The backward ring carries K/V and their gradients: twice the forward traffic.
        "cp_comm": (passes + 1.0 + core_repeat) * layout.layers * times.cp_ring,
    }


def _host_gpu_parts(
    ctx: TrainingContext,
    *,
    moe_layer: np.ndarray,
    moe_ffn: np.ndarray,
    rest_forward: np.ndarray,
    backward: np.ndarray,
    times: CollectiveTimes,
) -> LayerGpuParts:
    """GPU seconds of the parts the host issue time is compared with (``_training_host``): an
    MoE layer's dispatch-to-combine segment is its MoE block less the router plus the forward
    all-to-alls, of which the routed and shared experts; the rest of the layer comes before the
    dispatch's host sync."""
    if ctx.model.moe is None:
        zeros = np.zeros_like(ctx.tokens)
        return LayerGpuParts(zeros, zeros, zeros, rest_forward, backward)
    segment = moe_ffn - training_moe.router_time(ctx)
    passes = activation_passes(ctx)
    experts = training_moe.routed_experts_time(
        ctx, activation_passes=passes
    ) + training_moe.shared_experts_time(ctx, activation_passes=passes)
    return LayerGpuParts(
        moe_before_sync=moe_layer - segment,
        moe_after_sync=segment + times.ep_exchange,
        moe_experts=experts,
        rest_forward=rest_forward,
        backward=backward,
    )
