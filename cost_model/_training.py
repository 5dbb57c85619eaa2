"""Training step time of a config table (one implementation; a single config is a table of one).

Per pipeline rank (rows ``STAGES``) and micro-batch, each operator is a roofline
(``_pricing.op_time_s``) of its FLOPs and bytes on one device:

* projections, dense FFN, router, routed and shared experts, LM head: matmuls, 2 FLOPs per
  multiply-accumulate (Kaplan et al. 2020 Table 1); backward = 2 x forward (Narayanan et al.
  SC'21 sec. 5.1: "the backward pass is twice the forward");
* core attention: 2*heads*(qk_dim + v_dim) FLOPs per attended key; causal masking and the
  long-context variants via ``mean_attended_tokens``; with FlashAttention the backward is 2.5 x
  the forward (FlashAttention-2, Dao 2023, sec. 3.1: 5 matmuls vs 2); unfused attention
  multiplies the full s x s square and adds memory-bound softmax/dropout passes over it;
* norms, residual adds, dropout, activation functions: memory-bound passes; an MoE layer's
  router, token dispatcher and grouped expert GEMMs as Megatron-core runs them
  (``_training_moe``: routed experts at their measured grouped-GEMM shape where curves exist);
* recompute: ``full`` repeats the forward of every layer, or of the first
  ``EstimateOptions.recompute_layers`` of each model chunk (Megatron-core ``--recompute-method
  block``); ``selective`` repeats the forward of the modules ``EstimateOptions.recompute_modules``
  names (Megatron-core ``--recompute-modules``; the default, core attention, is Korthikanti et
  al. 2022, arXiv:2205.05198, sec. 5) — each recomputed module costs its forward time once more;
* CPU activation offloading (``EstimateOptions.activation_offload_layers``): each offloaded
  layer's activations cross the device-host link (``HardwareSpec.host_link_bandwidth_bytes_per_s``)
  once in forward and once in backward, beside the next layer's compute; only what outlasts that
  compute is exposed (``time.offload``; ``_exposed_offload``).

Communication is priced with ``Cluster.collective_time`` for the placed groups
(``_pricing.ranks_per_node``): TP all-reduce, or reduce-scatter + all-gather with SP, twice per
layer per pass (Shoeybi et al. 2019, Megatron-LM sec. 3; Korthikanti sec. 4.2.2); EP all-to-all
dispatch + combine of tokens x top-k x hidden x routing imbalance (DeepSeek-V3 report,
arXiv:2412.19437, sec. 3.2.2); CP ring send/recv of K/V blocks (cp - 1 per layer); PP
send/recv of the boundary activation; DP gradient all-reduce, or reduce-scatter + parameter
all-gather under ZeRO-1/2, and per-micro-batch gathers under ZeRO-3/FSDP (Rajbhandari et al.,
ZeRO, SC'20; a pipeline stage's gradients are reduced once per step, ``_training_dp``). Each
kind hides up to its overlap fraction behind independent compute, per link: kinds on NVLink
and on the NIC overlap the same compute concurrently, kinds on one link share it, and the
asynchronous pipeline and data-parallel streams also run while the compute stream waits on the
other link's exposed collectives (``_training_links``); the compute it hides behind runs slower while the collective occupies SMs and memory bandwidth
(``time.contention``: the measured mean compute slowdown under overlap, arXiv:2507.03114,
``data/overlap_contention.json``). Megatron-core's EP communication overlap merges one
micro-batch's forward with another's backward layer by layer; what of the EP all-to-all it hides
and the host wait it adds are priced per merged layer pair (``_training_ep_overlap``).

Pipeline: m micro-batches on the slowest rank plus a bubble of (p - 1) micro-batch times for
GPipe and 1F1B, divided by v for interleaved 1F1B (Narayanan et al. SC'21 eq. 1 and sec. 2.2.2),
and (p - 1) forward times for the zero-bubble schedule ZB-H1 (Qi et al., arXiv:2401.10241).

Modules: ``_training_context`` (the per-table quantities), ``_training_ops`` (one layer's
operators), ``_training_micro_batch`` (forward, backward, recompute and TP/EP/CP seconds of a
micro-batch), ``_training_pipeline`` (send/recv and bubble), ``_training_comm`` (one collective
of each kind), ``_training_dp`` (data-parallel traffic and optimizer), this module (the step:
overlap per link, offloading, slowest rank, the parts that sum to ``step_time_s``).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from cost_model._memory import offloaded_layer_bytes
from cost_model._model_spec import ModelSpec
from cost_model._pricing import mean_attended_tokens
from cost_model._training_comm import CollectiveTimes, table_collective_times
from cost_model._training_context import TrainingContext
from cost_model._training_dp import contention_seconds, dp_and_optimizer, hidden_seconds
from cost_model._training_ep_overlap import MergedPairs, ep_overlap_applies, merged_pairs
from cost_model._training_links import LinkWindows, crosses_nodes
from cost_model._training_micro_batch import MicroBatchTimes, micro_batch_times
from cost_model._training_ops import activation_passes
from cost_model._training_pipeline import bubble_time, pipeline_comm
from cost_model._training_tp_overlap import tp_hideable_seconds
from cost_model._workload import Training

#: ``time.<part>`` columns of a training estimate; they sum to ``step_time_s``.
TRAINING_TIME_PARTS: tuple[str, ...] = (
    "compute",
    "recompute",
    "tp_comm",
    "ep_comm",
    "cp_comm",
    "pp_comm",
    "dp_comm",
    "contention",
    "offload",
    "bubble",
    "optimizer",
)


def training_time_columns(ctx: TrainingContext) -> dict[str, np.ndarray]:
    """``time.<part>``, ``hidden.<kind>``, ``step_time_s`` and helpers for every row."""
    times = table_collective_times(ctx)
    mb = micro_batch_times(ctx, times)
    compute = mb.forward + mb.backward + mb.recompute
    # Each link's traffic hides behind the compute once: a kind takes what the kinds before it
    # on the same link left (they share its bandwidth), CP only behind core attention; kinds on
    # NVLink and on the NIC overlap the same compute concurrently (``_training_links``). What
    # each link leaves is the window of the pipeline and data-parallel traffic on it.
    exposed, hidden, windows = {}, {}, LinkWindows(compute)
    fractions = {kind: ctx.overlap_fraction(kind) for kind in ("cp_comm", "tp_comm", "ep_comm")}
    merged, pairs = _ep_overlap(ctx, mb, times)
    fractions["ep_comm"] = np.where(merged, pairs.hidden_fraction, fractions["ep_comm"])
    # Sequence-parallel TP traffic hides only beside the GEMMs it is fused with
    # (``_training_tp_overlap``), the CP ring only behind core attention.
    paired = {"cp_comm": mb.core_attention, "tp_comm": tp_hideable_seconds(ctx, times)}
    for kind in ("cp_comm", "tp_comm", "ep_comm"):
        comm, on_nic = mb.comm[kind], crosses_nodes(ctx, kind)
        free = windows.free(on_nic)
        window = np.minimum(paired[kind], free) if kind in paired else free
        hidden[kind] = hidden_seconds(comm, fraction=fractions[kind], window=window)
        exposed[kind] = comm - hidden[kind]
        windows.take(hidden[kind], exposed=exposed[kind], on_nic=on_nic)
    # Hidden traffic is not free: the compute it runs beside slows down (``contention_seconds``).
    contention = contention_seconds(sum(hidden.values()))
    offload = _exposed_offload(ctx, mb)
    per_micro_batch = compute + sum(exposed.values()) + contention + offload + pairs.host_wait
    # The pipeline's fill and drain run micro-batches with nothing to merge with: the bubble is
    # counted in micro-batches as they run unmerged (EP all-to-alls exposed, no merged host wait).
    merged_hidden = np.where(merged, hidden["ep_comm"], 0.0)
    unmerged = per_micro_batch - pairs.host_wait + merged_hidden - contention_seconds(merged_hidden)
    slowest = np.argmax(per_micro_batch, axis=0)[None, :]

    def pick(rows: np.ndarray) -> np.ndarray:
        return np.take_along_axis(np.broadcast_to(rows, per_micro_batch.shape), slowest, axis=0)[0]

    m = ctx.num_micro_batches
    columns = {
        "time.compute": m * pick(mb.forward + mb.backward + pairs.host_wait),
        "time.recompute": m * pick(mb.recompute),
        "time.offload": m * pick(offload),
        **{f"time.{kind}": m * pick(exposed[kind]) for kind in exposed},
        **{f"hidden.{kind}": m * pick(hidden[kind]) for kind in hidden},
        "time.bubble": bubble_time(
            ctx, micro_batch=pick(unmerged), forward_share=pick(mb.forward / compute)
        ),
        "bottleneck_stage": slowest[0],
    }
    mb_contention = m * pick(contention)
    # Pipeline send/recv with its fill and flush, hidden behind what the link's other traffic
    # left when asynchronous (``_training_pipeline``).
    pp_free = windows.stream_window(crosses_nodes(ctx, "pp_comm"))
    pp_comm, pp_hidden = pipeline_comm(ctx, m=m, p2p=times.pp_p2p, free=m * pick(pp_free))
    mb_contention = mb_contention + contention_seconds(pp_hidden)
    columns["time.pp_comm"], columns["hidden.pp_comm"] = pp_comm, pp_hidden
    dp_free = windows.stream_window(crosses_nodes(ctx, "dp_comm"))
    dp_exposed, dp_hidden, optimizer = dp_and_optimizer(
        ctx, free_compute=dp_free, times=times, mb=mb
    )
    columns["time.dp_comm"], columns["hidden.dp_comm"], columns["time.optimizer"] = (
        dp_exposed,
        dp_hidden,
        optimizer,
    )
    columns["time.contention"] = mb_contention + contention_seconds(dp_hidden)
    columns["step_time_s"] = sum(columns[f"time.{part}"] for part in TRAINING_TIME_PARTS)
    return columns


def _ep_overlap(
    ctx: TrainingContext, mb: MicroBatchTimes, times: CollectiveTimes
) -> tuple[np.ndarray, MergedPairs]:
    """(rows (n,) where Megatron-core's EP communication overlap runs, what it hides and the
    host wait it adds on each rank; ``_training_ep_overlap``). It runs nowhere with the option
    off, on layouts Megatron-core refuses, or under a bidirectional schedule (which hides it
    all). The host wait of the merged pairs is GPU idle time, counted in ``time.compute`` as
    the unmerged host wait is."""
    applies = ep_overlap_applies(ctx) & (not ctx.options.bidirectional_pipeline)
    if not applies.any():
        zeros = np.zeros(ctx.layout.layers.shape)
        return applies, MergedPairs(hidden_fraction=zeros, host_wait=zeros)
    pairs = merged_pairs(
        ctx,
        moe_layer_forward=mb.moe_layer_forward,
        activation_passes=activation_passes(ctx),
        times=times,
        unmerged_host_wait=mb.host_wait,
    )
    return applies, pairs


def _exposed_offload(ctx: TrainingContext, mb: MicroBatchTimes) -> np.ndarray:
    """Seconds CPU activation offloading adds to one micro-batch on each rank (3, n).

    Megatron-core offloads the activations of the first ``EstimateOptions.activation_offload_layers``
    layers of a rank (``--cpu-offloading-num-layers``; Megatron-Bridge docs/training/
    cpu-offloading.md: "Overlaps computation with data transfers (Host2Device and Device2Host)").
    Its offload context (Megatron-core ``TransformerBlock`` with Transformer Engine's
    ``get_cpu_offload_context``, ``transformer_engine/pytorch/cpu_offload.py``) copies a layer's
    saved tensors to the host on a side stream while the next layer's forward runs, and waits
    for the copy before the layer after; in backward it reloads a layer while the layer above
    runs its backward. Each offloaded layer therefore exposes max(0, copy - one layer's forward)
    and max(0, copy - one layer's backward), the copy being the layer's stored activations
    (``_memory.offloaded_layer_bytes``) over the device-host link, one direction
    (``HardwareSpec.host_link_bandwidth_bytes_per_s``). A layer's forward is the rank's mean
    layer; its backward window scales it by the rank's backward (with recompute) over forward.
    Not modelled: the HBM bandwidth the copies take from the kernels they run beside."""
    count = ctx.options.activation_offload_layers
    if count == 0:
        return np.zeros_like(mb.forward)
    bandwidth = getattr(ctx.cluster.device, "host_link_bandwidth_bytes_per_s", None)
    if bandwidth is None:
        raise ValueError(
            f"activation_offload_layers ({count}) needs the device-host link bandwidth; "
            f"{ctx.cluster.device.name} has no host_link_bandwidth_bytes_per_s"
        )
    layout = ctx.layout
    copy = offloaded_layer_bytes(ctx) / bandwidth
    layer_forward = (
        layout.dense_layers * mb.dense_layer_forward + layout.moe_layers * mb.moe_layer_forward
    ) / np.maximum(layout.layers, 1.0)
    backward_ratio = (mb.backward + mb.recompute) / np.maximum(mb.forward, 1e-30)
    layer_backward = layer_forward * backward_ratio
    per_layer = np.maximum(copy - layer_forward, 0.0) + np.maximum(copy - layer_backward, 0.0)
    return np.minimum(float(count), layout.layers) * per_layer


def model_flops_per_step(
    *, model: ModelSpec, workload: Training, attention: Literal["causal", "full_square"] = "causal"
) -> float:
    """Model FLOPs of one step: 3 x forward (forward + 2 x backward), no recompute.

    ``attention="causal"`` counts the keys a causal query attends (mean (S+1)/2 for full
    attention), as FlashAttention-2 (Dao 2023, sec. 4.1) counts causal FLOPs: half the square; the
    MFU this library reports uses it, so that it never exceeds 100% at S >> hidden.
    ``attention="full_square"`` counts every query against all S keys: the convention of PaLM
    (Chowdhery et al. 2022, App. B), Megatron-LM's ``num_floating_point_operations`` and
    torchtitan's ``get_num_flop_per_token``, in which published MFU figures are stated; a
    published MFU is compared in its own convention.
    """
    spec = model.attention
    per_key = 2.0 * spec.num_heads * (spec.qk_head_dim + spec.value_head_dim)
    sequence = workload.sequence_length_tokens
    if attention == "full_square":
        attended = float(sequence)
    elif attention == "causal":
        attended = float(mean_attended_tokens(attention=spec, sequence_tokens=sequence))
    else:
        raise ValueError(f"attention ({attention!r}) must be 'causal' or 'full_square'")
    full_keys = float(sequence) if attention == "full_square" else (sequence + 1.0) / 2.0
    forward = (
        2.0 * model.matmul_parameters_per_token()
        + model.num_layers * per_key * attended
        + model.side_attention_flops_per_token(full_keys)
    )
    return 3.0 * forward * workload.tokens_per_step


__all__ = [
    "TRAINING_TIME_PARTS",
    "model_flops_per_step",
    "training_time_columns",
]
