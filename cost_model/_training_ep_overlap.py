"""Megatron-core's expert-parallel all-to-all overlap (``--overlap-moe-expert-parallel-comm``).

With the overlap on, the 1F1B steady state runs one micro-batch's forward merged with another's
backward, layer by layer (Megatron-core 0.16 ``pipeline_parallel/combined_1f1b.py``, "EP A2A in
forward step is hidden by the attention/mlp computation in the backward step, and vice versa"),
on two CUDA streams (``models/common/model_chunk_schedule_plan.py``,
``TransformerLayerSchedulePlan.run``)::

    comm stream:  combine_bwd | dispatch_fwd -> dispatch_bwd        | combine_fwd
    comp stream:  attn_fwd    | mlp_bwd -> mlp_bwd_dw -> mlp_fwd    | attn_bwd

where ``attn`` is everything of the layer but the routed experts (attention, norms, router,
shared experts, the dispatcher's permute; ``models/gpt/fine_grained_callables.py``) and ``mlp``
the routed experts. Each phase waits for the one before, and within the middle phase
``mlp_fwd`` waits for ``dispatch_fwd`` and ``dispatch_bwd`` for ``mlp_bwd``; ``attn_bwd``
waits for ``dispatch_bwd``. Megatron-Bridge turns ``delay_wgrad_compute`` on with the overlap
(``scripts/performance/utils/overrides.py`` ``_set_moe_a2a_overlap_overrides``), so the
experts' weight-gradient GEMMs (``mlp_bwd_dw``) run apart from their data-gradient GEMMs and
fill the wait for ``dispatch_fwd``. One merged layer pair therefore takes (``pair_seconds``)

    max(A_f, C_b) + max(max(M_b + W, D_f) + M_f, max(D_f, M_b) + D_b) + max(A_b, C_f),

never less than its compute nor its communication. What it cannot hide stays exposed:

* micro-batches with nothing to pair: without pipelining the first forward and the last
  backward (``combined_1f1b_schedule_for_no_pipelining``); with interleaved pipelining a rank's
  warm-up forwards and cool-down backwards, ``(pp - rank - 1) * 2 + (v - 1) * pp + 1`` chunk
  micro-batches of its ``m * v`` (``schedules.py``: the overlap schedules "one extra
  micro-batch forward step before the 1f1b stages");
* layouts where Megatron-core refuses the overlap (``TransformerConfig.__post_init__``): ep = 1,
  pp > 1 without virtual stages, full recompute. There the option is inert.

The hidden all-to-all still costs the compute it runs beside its SM and memory-bandwidth share:
the training step's contention term (``_training_dp.contention_seconds``,
``data/overlap_contention.json``).

The merge also costs host time (NVIDIA/Megatron-LM pull request #2168: "EP Overlap brings extra
cpu overhead and may cause GPU bubble"). Unmerged, the backward has no host synchronization and
its host work runs ahead of the GPU (``_training_host``); merged, each forward layer's dispatch
waits for its token counts on the host, so the host issues the paired backward layer's work
between two such waits: the stretch from one sync to the next holds the backward layer's
experts, the forward layer's dispatch-to-combine, the backward layer's attention and the next
forward layer's attention up to its sync (``merged_host_wait``, the host counts and the list
bound of ``_training_host``). Where that stretch outlasts the pair's GPU time the GPU waits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from cost_model import _training_moe as training_moe
from cost_model._table import RECOMPUTE_CODES
from cost_model._training_host import host_parts, stretch_time_s

if TYPE_CHECKING:
    from cost_model._training_comm import CollectiveTimes
    from cost_model._training_context import TrainingContext

__all__ = [
    "MergedPairs",
    "ep_overlap_applies",
    "merged_host_wait",
    "merged_pairs",
    "pair_seconds",
    "paired_share",
]


def ep_overlap_applies(ctx: TrainingContext) -> np.ndarray:
    """Rows (n,) where ``EstimateOptions.expert_parallel_comm_overlap`` runs: ep > 1, no pipeline
    or an interleaved one, no full recompute (Megatron-core's checks of the option)."""
    if not ctx.options.expert_parallel_comm_overlap or ctx.model.moe is None:
        return np.zeros(ctx.tokens.shape, dtype=bool)
    pipeline_ok = (ctx.column("pp") == 1) | (ctx.column("virtual_stages") > 1)
    not_full = np.asarray(ctx.table["recompute"]) != RECOMPUTE_CODES["full"]
    return (ctx.column("ep") > 1) & pipeline_ok & not_full


def paired_share(ctx: TrainingContext) -> np.ndarray:
    """Share of each pipeline rank's chunk micro-batches (rows ``STAGES``) whose forward runs
    merged with another's backward: all but the warm-up forwards (and as many cool-down
    backwards) of the overlapped schedule. Ranks: 0, pp // 2 (a middle rank; with pp <= 2 the
    middle row is the first rank, as in ``stage_layout``), pp - 1."""
    pp, v, m = ctx.column("pp"), ctx.column("virtual_stages"), ctx.num_micro_batches
    total = m * v
    middle = np.where(pp > 2, np.floor(pp / 2.0), 0.0)
    ranks = np.stack([np.zeros_like(pp), middle, pp - 1.0])
    warmup = np.where(pp > 1, (pp - ranks - 1.0) * 2.0 + (v - 1.0) * pp + 1.0, 1.0)
    return np.clip(total - warmup, 0.0, None) / total


def pair_seconds(
    *,
    attention_forward: np.ndarray,
    experts_forward: np.ndarray,
    dispatch_forward: np.ndarray,
    dispatch_backward: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(time, compute, communication) of one merged layer pair, forward of one micro-batch with
    the backward of another (module docstring). The backward of each part is twice its forward
    (Narayanan et al. SC'21 sec. 5.1); the experts' is split into data- and weight-gradient
    GEMMs of one forward each (``delay_wgrad_compute``). Dispatch and combine of one pass move
    the same bytes: ``dispatch_*`` is each one's time (with an fp8 dispatch, the mean of the two)."""
    a_f, m_f, d_f, d_b = attention_forward, experts_forward, dispatch_forward, dispatch_backward
    a_b, m_b, w_b = 2.0 * a_f, m_f, m_f
    middle = np.maximum(np.maximum(m_b + w_b, d_f) + m_f, np.maximum(d_f, m_b) + d_b)
    time = np.maximum(a_f, d_b) + middle + np.maximum(a_b, d_f)
    return time, a_f + a_b + m_f + m_b + w_b, 2.0 * (d_f + d_b)


@dataclass(frozen=True)
class MergedPairs:
    """The overlap on each pipeline rank (rows ``STAGES``): the fraction of its EP all-to-all
    time hidden, and the seconds one micro-batch's merged layer pairs wait on the host."""

    hidden_fraction: np.ndarray
    host_wait: np.ndarray


def merged_pairs(
    ctx: TrainingContext,
    *,
    moe_layer_forward: np.ndarray,
    activation_passes: float,
    times: CollectiveTimes,
    unmerged_host_wait: np.ndarray,
) -> MergedPairs:
    """The paired share of a rank's micro-batches times, per merged MoE layer pair, the share of
    its all-to-alls that finish under the other micro-batch's compute and its host wait; zero
    where the overlap does not run. The merged pairs' host wait replaces the wait the unmerged
    forward and backward of those micro-batches already pay (``unmerged_host_wait``, (3, n) per
    micro-batch) where it is longer."""
    experts = training_moe.routed_experts_time(ctx, activation_passes=activation_passes)
    attention = np.maximum(moe_layer_forward - experts, 0.0)
    time, compute, comm = pair_seconds(
        attention_forward=attention,
        experts_forward=experts,
        dispatch_forward=times.ep_exchange / 2.0,
        dispatch_backward=times.ep_exchange_backward / 2.0,
    )
    hidden_in_pair = np.where(comm > 0.0, 1.0 - (time - compute) / np.maximum(comm, 1e-30), 0.0)
    wait = merged_host_wait(
        ctx, attention_forward=attention, experts_forward=experts, pair_time=time
    )
    share = np.where(ep_overlap_applies(ctx), paired_share(ctx), 0.0)
    return MergedPairs(
        hidden_fraction=share * hidden_in_pair,
        host_wait=share * np.maximum(ctx.layout.moe_layers * wait - unmerged_host_wait, 0.0),
    )


def merged_host_wait(
    ctx: TrainingContext,
    *,
    attention_forward: np.ndarray,
    experts_forward: np.ndarray,
    pair_time: np.ndarray,
) -> np.ndarray:
    """Seconds one merged layer pair waits on its host beyond ``pair_time`` (module docstring):
    the sync-to-sync stretch of (host, compute-stream GPU) blocks in issue order, the backward
    layer's experts (data and weight gradients), the forward layer's dispatch-to-combine, the
    backward layer's attention, the next forward layer's attention, router and dispatch
    preprocessing (``_training_host.stretch_time_s``). Zero without host operator counts or
    where the dispatcher does not wait on the host."""
    parts = host_parts(ctx)
    syncs = ctx.moe_dispatch_syncs
    if parts is None or not syncs:
        return np.zeros_like(pair_time)
    a_f, m_f = attention_forward, experts_forward
    stretch = stretch_time_s(
        [
            (parts.moe_backward, 2.0 * m_f),
            (parts.moe_after_sync_forward, m_f),
            (parts.attention_backward, 2.0 * a_f),
            (parts.attention_forward + parts.moe_before_sync_forward, a_f),
        ]
    )
    return np.maximum(stretch - pair_time, 0.0)
