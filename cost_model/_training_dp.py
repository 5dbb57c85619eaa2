"""Data-parallel traffic and the once-per-step optimizer work of a training step.

ZeRO-0/1/2 reduce and gather a rank's whole parameters once per step (ZeRO-2 reduce-scatters
every micro-batch where the framework does); ZeRO-3/FSDP gathers and reduce-scatters per layer
and micro-batch with a one-layer prefetch window, except under pipeline parallelism, where
torch.distributed.pipelining holds each stage's gradients until one reduce-scatter after the
step's last backward (``_pipeline_fsdp_comm``); the optimizer step moves the rank's shard of
the states at memory bandwidth and the gradient-norm clipping adds two passes and scalar
all-reduces over every rank. Split from ``_training`` (which calls ``dp_and_optimizer``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

import numpy as np

from cost_model._memory import micro_batches_in_flight, pipeline_unsharded_stage
from cost_model._pricing import collective_time_s
from cost_model._training_comm import CollectiveTimes, sharded_parameters

if TYPE_CHECKING:
    from cost_model._training_context import TrainingContext
    from cost_model._training_micro_batch import MicroBatchTimes

__all__ = [
    "contention_seconds",
    "dp_and_optimizer",
    "hidden_seconds",
    "overlap_compute_slowdown",
    "sharded_weights_per_rank",
]


def hidden_seconds(
    comm: np.ndarray, *, fraction: float | np.ndarray, window: np.ndarray
) -> np.ndarray:
    """Seconds of ``comm`` hidden behind ``window`` seconds of independent compute."""
    return np.minimum(fraction * comm, window)


@cache
def overlap_compute_slowdown() -> float:
    """Measured slowdown of compute kernels while a collective runs beside them (NCCL kernels
    hold SMs and memory bandwidth): ``data/overlap_contention.json``, arXiv:2507.03114."""
    text = (resources.files("cost_model") / "data" / "overlap_contention.json").read_text()
    return float(json.loads(text)["compute_slowdown_while_overlapped"])


def contention_seconds(hidden: np.ndarray | float) -> np.ndarray:
    """Seconds the compute loses to the communication it hides. The operator fit prices each
    kernel alone; while a collective runs beside it the kernel runs ``1 + s`` times longer
    (``overlap_compute_slowdown``). Over ``hidden`` seconds of overlapped communication the
    stretched compute does ``hidden / (1 + s)`` seconds of isolated work, so the step grows
    by ``hidden * s / (1 + s)``."""
    s = overlap_compute_slowdown()
    return np.asarray(hidden) * (s / (1.0 + s))


def sharded_weights_per_rank(ctx: TrainingContext) -> np.ndarray:
    """Tensor-parallel weight tensors of each pipeline rank (rows ``STAGES``): the linears of
    ``tensor_parallel_host_time`` plus the vocab-parallel embedding and LM head; 0 with tp = 1."""
    attention = 3.0 if ctx.model.attention.kind == "mla" else 4.0
    moe = ctx.model.moe
    shared = 3.0 if moe is not None and moe.num_shared_experts else 0.0
    layout = ctx.layout
    count = layout.dense_layers * (attention + 3.0) + layout.moe_layers * (attention + shared)
    count = count + layout.has_embedding + layout.has_lm_head
    return np.where(ctx.column("tp") > 1, count, 0.0)


def dp_and_optimizer(
    ctx: TrainingContext, *, free_compute: np.ndarray, times: CollectiveTimes, mb: MicroBatchTimes
):
    """Exposed and hidden gradient/parameter traffic and the optimizer step of the rank where
    they take longest (``_data_parallel_comm``, ``_optimizer_step_time``)."""
    comm, hidden = _data_parallel_comm(ctx, free_compute=free_compute, times=times, mb=mb)
    optimizer = _optimizer_step_time(ctx)
    total = comm - hidden + optimizer
    worst = np.argmax(total, axis=0)[None, :]
    take = lambda rows: np.take_along_axis(rows, worst, axis=0)[0]  # noqa: E731
    return take(comm - hidden), take(hidden), take(optimizer)


def _data_parallel_comm(
    ctx: TrainingContext, *, free_compute, times: CollectiveTimes, mb: MicroBatchTimes
):
    """(total, hidden) data-parallel seconds per step on each pipeline rank (3, n).

    * ZeRO-0: one gradient all-reduce, bucketed under the last micro-batch's backward
      (PyTorch DDP, Li et al. VLDB 2020; Megatron ``--overlap-grad-reduce``).
    * ZeRO-1 (Megatron-core distributed optimizer): one gradient reduce-scatter under the last
      micro-batch's backward (``--overlap-grad-reduce``: gradients are synchronised only on
      the last micro-batch) and one all-gather of the updated weights under the next step's
      first forward (``--overlap-param-gather``: each bucket's gather is waited on before its
      layers' forward).
    * ZeRO-2: gradients are partitioned as they are produced, so every micro-batch reduce-
      scatters its gradients (DeepSpeed ``reduce_scatter`` per micro-batch, ZeRO SC'20 sec. 5.2),
      each under its own backward; one weight all-gather under the first forward.
    * ZeRO-3/FSDP: per layer (``_fsdp_comm``); under pipeline parallelism once per step
      for the gradients (``_pipeline_fsdp_comm``, where ``_memory.pipeline_unsharded_stage``
      holds the stage unsharded).
    ``free_compute``: the time of one micro-batch the data-parallel stream may run in — the
    compute not already hiding TP/EP/CP traffic on the same link, plus the compute stream's
    waits on the other link's exposed collectives (``_training_links.LinkWindows``); its
    forward and backward keep their shares of it.
    """
    zero = np.asarray(ctx.table["zero_stage"])
    every = (zero == 2) & ctx.zero2_reduce_every_micro_batch
    scatters = np.where(every, ctx.num_micro_batches, 1.0)
    whole = np.where(
        zero == 0,
        times.dp_all_reduce,
        scatters * times.dp_gradient_scatter + times.dp_weight_gather,
    )
    compute = mb.forward + mb.backward + mb.recompute
    free_share = np.where(compute > 0, free_compute / np.maximum(compute, 1e-30), 0.0)
    forward_window = free_share * mb.forward
    backward_window = free_share * (mb.backward + mb.recompute)
    overlappable = ctx.dp_overlap * (1.0 - _last_bucket_share(ctx))
    whole_hidden = np.where(
        zero == 0,
        hidden_seconds(times.dp_all_reduce, fraction=overlappable, window=backward_window),
        hidden_seconds(
            scatters * times.dp_gradient_scatter,
            fraction=overlappable,
            window=scatters * backward_window,
        )
        + hidden_seconds(times.dp_weight_gather, fraction=overlappable, window=forward_window),
    )
    fsdp_total, fsdp_exposed = _fsdp_comm(ctx, times=times, mb=mb, free_share=free_share)
    held = pipeline_unsharded_stage(ctx)
    if held.any():
        staged_total, staged_exposed = _pipeline_fsdp_comm(
            ctx, times=times, mb=mb, free_share=free_share
        )
        fsdp_total = np.where(held, staged_total, fsdp_total)
        fsdp_exposed = np.where(held, staged_exposed, fsdp_exposed)
    comm = np.where(zero == 3, fsdp_total, whole)
    return comm, np.where(zero == 3, fsdp_total - fsdp_exposed, whole_hidden)


def _last_bucket_share(ctx: TrainingContext) -> np.ndarray:
    """Share (3, n) of a rank's gradient traffic in its last bucket, which
    ``FrameworkProfile.last_gradient_bucket_exposed`` leaves without compute to hide behind:
    the bucket of the first parameters, the whole embedding where the rank holds it (the
    remainder of the bucket it closes is left out), else one bucket of max(40M, 1M x dp)
    parameters (Megatron-core's bucket rule, ``param_and_grad_buffer.py``: buckets close once
    they reach that size, filled in reverse parameter order), over all the rank's parameters
    (the expert buffer's own last bucket is not counted); 0 without the fact."""
    dense, expert = sharded_parameters(ctx)
    total = dense + expert
    if not ctx.last_gradient_bucket_exposed:
        return np.zeros(total.shape)
    bucket = np.maximum(40e6, 1e6 * ctx.column("dp") * ctx.column("cp"))
    last = np.maximum(bucket, ctx.parameters["embedding"])
    return np.where(total > 0, np.minimum(last / np.maximum(total, 1.0), 1.0), 0.0)


def _fsdp_comm(
    ctx: TrainingContext, *, times: CollectiveTimes, mb: MicroBatchTimes, free_share: np.ndarray
):
    """(total, exposed) ZeRO-3/FSDP seconds per step on each pipeline rank (3, n).

    Each micro-batch gathers every layer's weights before its forward and again before its
    backward, and reduce-scatters its gradients after it (FSDP2 ``reshard_after_forward``;
    Zhao et al., PyTorch FSDP, VLDB 2023 sec. 3.3-4; DeepSpeed ZeRO-3). Gradient accumulation
    keeps the per-micro-batch reduce-scatter: FSDP2 reduces every backward unless
    ``set_requires_gradient_sync(False)``, and torchtitan's ``Trainer.train_step`` runs its
    ``gradient_accumulation_steps`` forward-backward calls without it (torchtitan/trainer.py at
    b5bcd76; only the chunked loss's LM head opts out, components/loss.py). With one layer of
    prefetch the next layer's gather runs under this layer's compute, so a layer exposes
    max(0, gather - compute) in forward and max(0, gather + reduce-scatter - compute) in
    backward; the first gather of each pass and the last reduce-scatter have nothing to hide
    behind, nor do the embedding and LM head of the root module (kept unsharded between
    forward and backward: one gather, one reduce-scatter). A layer's window is the share
    ``free_share`` of its compute that is not already hiding TP/EP/CP traffic.
    """
    layer, layout = times.fsdp_layer, ctx.layout
    overlap = ctx.dp_overlap * free_share
    backward_factor = _backward_factor(ctx)
    forward_pass = _gather_pass(ctx, times=times, mb=mb, overlap=overlap, window_factor=1.0)
    backward_pass = _gather_pass(
        ctx, times=times, mb=mb, overlap=overlap, window_factor=backward_factor, scatter=True
    )
    last_scatter = np.where(layout.moe_layers > 0, layer.moe_scatter, layer.dense_scatter)
    last_backward = backward_factor * np.where(
        layout.moe_layers > 0, mb.moe_layer_forward, mb.dense_layer_forward
    )
    last_edge = np.where(layout.layers > 0, np.minimum(last_scatter, overlap * last_backward), 0.0)
    scatters = _layer_scatters(ctx, times)
    ends = layer.ends_gather + layer.ends_scatter
    m = ctx.num_micro_batches
    total = forward_pass.total + backward_pass.total + scatters + ends
    exposed = forward_pass.exposed + backward_pass.exposed + last_edge + ends
    return m * total, m * exposed


def _pipeline_fsdp_comm(
    ctx: TrainingContext, *, times: CollectiveTimes, mb: MicroBatchTimes, free_share: np.ndarray
):
    """(total, exposed) ZeRO-3 seconds per step on each rank of a pipeline (3, n), for the rows
    ``_memory.pipeline_unsharded_stage`` holds unsharded: FSDP2 under torch.distributed.pipelining.

    * Gradients: every micro-batch's backward runs with ``set_requires_gradient_sync(False)``
      and ``set_reshard_after_backward(False)`` (``_PipelineStageBase.backward_maybe_with_nosync``,
      distributed/pipelining/stage.py, torch 2.13); the schedule's ``REDUCE_GRAD`` action after
      the stage's last backward (``_add_reduce_grad``, schedules.py) calls ``perform_reduce_grad``,
      which runs each group's ``post_backward`` (the reduce-scatters of the accumulated
      ``reduce_dtype`` gradients) and ``_root_post_backward_final_callback``, whose
      ``finalize_backward`` makes the compute stream wait for them. They start after the
      stage's last backward kernel and nothing on the rank runs beside them: one reduce-scatter
      of every layer and of the embedding and LM head per step, all exposed. (Before the
      ``REDUCE_GRAD`` action, e.g. the torch of torchtitan's December 2024 benchmarks,
      ``backward_maybe_with_nosync`` ran the same ``post_backward`` calls once the last
      micro-batch's backward had returned.)
    * Gathers: a layer left gathered by a backward stays gathered; one resharded after a
      forward is gathered by the next pass. With ``reshard_after_forward=True``
      (``TrainingContext.pipeline_reshard_after_forward``) every pass after a forward gathers:
      per model chunk the first forward, the forwards that follow a forward (the warm-up's,
      ``_memory.micro_batches_in_flight`` forwards in all, m under GPipe) and every backward
      that follows a forward, m + 1 passes in all. Without it (torchtitan under pp) only the
      step's first forward gathers. Each pass has FSDP2's one-layer prefetch (its first gather
      exposed, each later one beyond its predecessor's compute window).
    * The embedding and LM head belong to the stage's root FSDP module, which FSDP2 never
      reshards after forward (``FSDPState._lazy_init``, distributed/fsdp/_fully_shard/
      _fsdp_state.py): gathered once per step, before the stage's first layer, exposed.

    Not modelled: the drain slack of the later ranks (rank r's last backward ends r backward
    stage-times before the first rank's, so part of its reduce-scatter runs in the pipeline's
    cool-down); the first rank, which runs the step's last backward, has none.
    """
    layer = times.fsdp_layer
    overlap = ctx.dp_overlap * free_share
    forward_pass = _gather_pass(ctx, times=times, mb=mb, overlap=overlap, window_factor=1.0)
    backward_pass = _gather_pass(
        ctx, times=times, mb=mb, overlap=overlap, window_factor=_backward_factor(ctx)
    )
    m = ctx.num_micro_batches
    if ctx.pipeline_reshard_after_forward:
        forward_passes = np.minimum(micro_batches_in_flight(ctx), m)
        backward_passes = m + 1.0 - forward_passes
    else:
        forward_passes, backward_passes = np.ones_like(layer.ends_gather), 0.0
    scatter = _layer_scatters(ctx, times) + layer.ends_scatter
    gather_total = (forward_passes + backward_passes) * forward_pass.total + layer.ends_gather
    gather_exposed = (
        forward_passes * forward_pass.exposed
        + backward_passes * backward_pass.exposed
        + layer.ends_gather
    )
    return gather_total + scatter, gather_exposed + scatter


@dataclass(frozen=True)
class _Pass:
    """Seconds (3, n) of one pass's per-layer ZeRO-3 collectives over a rank's layers."""

    total: np.ndarray
    exposed: np.ndarray


def _backward_factor(ctx: TrainingContext) -> np.ndarray:
    """A layer's backward over its forward: 2, plus the recomputed forward on full
    recompute's share of layers."""
    return 2.0 + ctx.full_recompute_share


def _layer_scatters(ctx: TrainingContext, times: CollectiveTimes) -> np.ndarray:
    """Seconds (3, n) of one reduce-scatter of every layer's gradients on a rank."""
    layer, layout = times.fsdp_layer, ctx.layout
    return layout.dense_layers * layer.dense_scatter + layout.moe_layers * layer.moe_scatter


def _gather_pass(
    ctx: TrainingContext,
    *,
    times: CollectiveTimes,
    mb: MicroBatchTimes,
    overlap: np.ndarray,
    window_factor: float | np.ndarray,
    scatter: bool = False,
) -> _Pass:
    """One forward (``window_factor`` 1) or backward pass gathering each layer with one layer of
    prefetch, and with ``scatter`` reduce-scattering each after it: a layer exposes what of its
    collectives exceeds the overlappable share of its compute; the pass's first gather has no
    compute before it and is exposed whole. ``total`` counts the gathers only."""
    layer, layout = times.fsdp_layer, ctx.layout
    exposed, total = 0.0, 0.0
    for count, gather, reduce, forward in (
        (layout.dense_layers, layer.dense_gather, layer.dense_scatter, mb.dense_layer_forward),
        (layout.moe_layers, layer.moe_gather, layer.moe_scatter, mb.moe_layer_forward),
    ):
        comm = gather + reduce if scatter else gather
        exposed = exposed + count * np.maximum(comm - overlap * window_factor * forward, 0.0)
        total = total + count * gather
    first_dense = layout.dense_layers > 0
    first_gather = np.where(first_dense, layer.dense_gather, layer.moe_gather)
    first_forward = np.where(first_dense, mb.dense_layer_forward, mb.moe_layer_forward)
    edge = np.where(layout.layers > 0, np.minimum(first_gather, overlap * first_forward), 0.0)
    return _Pass(total=np.asarray(total), exposed=np.asarray(exposed + edge))


def _optimizer_step_time(ctx: TrainingContext) -> np.ndarray:
    """Once per step on each rank (3, n): the gradient-norm reduction and clipping, the
    optimizer update over the rank's shard of the states (``_optimizer_time``) and the zeroing
    of the main-gradient buffer (``_gradient_buffer_zero_time``)."""
    dense, expert = sharded_parameters(ctx)
    dp_cp = ctx.column("dp") * ctx.column("cp")
    edp = dp_cp * ctx.column("tp") / (ctx.column("ep") * ctx.column("etp"))
    zero = np.asarray(ctx.table["zero_stage"])
    states = np.where(zero >= 1, dense / dp_cp + expert / edp, dense + expert)
    return (
        _optimizer_time(ctx, states * _optimizer_update_bytes(ctx))
        + _gradient_clip_time(ctx, local_parameters=states)
        + _gradient_buffer_zero_time(
            ctx, local_parameters=np.where(zero >= 2, states, dense + expert)
        )
    )


def _gradient_buffer_zero_time(ctx: TrainingContext, *, local_parameters: np.ndarray) -> np.ndarray:
    """One write of the rank's main-gradient buffer where the framework zeroes it at the start
    of each step (``FrameworkProfile.zeroes_gradient_buffer_each_step``; Megatron-core's
    distributed optimizer keeps the whole buffer, its ``grad_data.zero_()``); 0 otherwise."""
    if not ctx.zeroes_gradient_buffer_each_step:
        return np.zeros_like(np.asarray(local_parameters, dtype=np.float64))
    return ctx.op(0.0, local_parameters * ctx.grad_bytes)


def _gradient_clip_time(ctx: TrainingContext, *, local_parameters: np.ndarray) -> np.ndarray:
    """Global gradient-norm clipping (Megatron-LM ``clip_grad_norm_fp32``; torch
    ``clip_grad_norm_``): one read of the local gradients for their norm, an all-reduce of
    one fp32 scalar over every rank (its latency grows with the world size), one read + write
    to scale them; a second scalar all-reduce for the logged loss."""
    moved = local_parameters * ctx.grad_bytes * 3.0
    world = ctx.column("dp") * ctx.column("cp") * ctx.column("tp") * ctx.column("pp")
    per_node = np.minimum(world, ctx.cluster.devices_per_node)
    scalar = collective_time_s(
        cluster=ctx.cluster,
        op="all_reduce",
        group_size=world,
        ranks_per_node=per_node,
        message_bytes=np.full(world.shape, 4.0),
        calibration=ctx.calibration,
    )
    return ctx.op(0.0, moved, calls=2.0) + 2.0 * scalar


def _optimizer_time(ctx: TrainingContext, update_bytes: np.ndarray) -> np.ndarray:
    """One optimizer step moving ``update_bytes``: the profile's measured optimizer curve (scaled
    like any measured memory-bound curve by the calibration) where there is one, else the
    memory roofline; plus the measured extra update cost of each tensor-parallel weight."""
    device = ctx.cluster.device
    measured = (
        device.optimizer_time_s(update_bytes) if hasattr(device, "optimizer_time_s") else None
    )
    if measured is None:
        seconds = ctx.op(0.0, update_bytes)
    else:
        seconds = np.asarray(measured) / ctx.calibration.memory_scale(device)
    return seconds + sharded_weights_per_rank(ctx) * getattr(
        device, "sharded_parameter_update_s", 0.0
    )


def _optimizer_update_bytes(ctx: TrainingContext) -> float:
    """Bytes read and written per parameter by one optimizer step: read the gradient, read and
    write each state (the fp32 master weight; Adam m and v, SGD momentum, at
    ``TrainingContext.optimizer_state_bytes``), write the bf16 weight."""
    moments = 2 if ctx.workload.optimizer == "adam" else 1
    master = 4.0 if ctx.workload.master_weights_fp32 else 0.0
    return ctx.grad_bytes + 2.0 * (moments * ctx.optimizer_state_bytes + master) + 2.0
