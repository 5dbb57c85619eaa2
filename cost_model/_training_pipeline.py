"""The pipeline around a training step's micro-batches: its send/recv traffic and its bubble.

Bubble: m micro-batches on the slowest rank plus (p - 1) micro-batch times of idle time for
GPipe and 1F1B, divided by v for interleaved 1F1B (Narayanan et al. SC'21 eq. 1 and sec.
2.2.2), (p - 1) forward times for the zero-bubble schedule ZB-H1 (Qi et al., arXiv:2401.10241),
and DualPipe's (pp/2 - 1)(F&B + B - 3W) for a bidirectional schedule (DeepSeek-V3 report,
arXiv:2412.19437, Table 2). Send/recv: one activation forward and one gradient backward per
micro-batch and model chunk, plus the pipeline fill and flush (Narayanan et al. SC'21 sec.
2.2), hidden behind the time their link's other traffic left when asynchronous
(``_training_links``). Split from ``_training`` (which calls ``pipeline_comm`` and
``bubble_time``).
"""

from __future__ import annotations

import numpy as np

from cost_model._table import SCHEDULE_CODES
from cost_model._training_context import TrainingContext
from cost_model._training_dp import hidden_seconds

__all__ = ["bubble_time", "pipeline_comm"]


def pipeline_comm(
    ctx: TrainingContext, *, m: np.ndarray, p2p: np.ndarray, free: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(exposed, hidden) pipeline seconds per step on the slowest rank.

    Forward activation and backward gradient send/recv per micro-batch and model chunk, plus
    the pipeline fill and flush: the first micro-batch's activation crosses pp*v - 1 chunk
    boundaries before the last stage starts, its gradient as many on the way back (the latency
    the bubble's compute-only count leaves out; Narayanan et al. SC'21 sec. 2.2). Each
    micro-batch's schedule actions on a stage cost host time beyond the send/recv
    (``HardwareSpec.pipeline_micro_batch_s``; 0 without a profile)."""
    v = ctx.column("virtual_stages")
    hops = np.where(ctx.column("pp") > 1, ctx.column("pp") * v - 1.0, 0.0)
    steady, pp_hidden = _pipeline_p2p(ctx, m=m, v=v, p2p=p2p, free=free)
    pp_comm = steady - pp_hidden + 2.0 * hops * p2p
    schedule_s = getattr(ctx.cluster.device, "pipeline_micro_batch_s", 0.0)
    pp_comm = pp_comm + np.where(
        ctx.column("pp") > 1, m * ctx.column("virtual_stages") * schedule_s, 0.0
    )
    return pp_comm, pp_hidden


def _pipeline_p2p(
    ctx: TrainingContext, *, m: np.ndarray, v: np.ndarray, p2p: np.ndarray, free: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(steady-state, hidden) pipeline send/recv seconds per step: one activation forward and
    one gradient backward per micro-batch and model chunk. Asynchronous sends and receives
    (``EstimateOptions.pipeline_p2p_overlap``) hide them behind the step's time their link's
    other traffic left (``free``, ``LinkWindows.stream_window``); blocking ones hide nothing."""
    steady = np.where(ctx.column("pp") > 1, 2.0 * m * v * p2p, 0.0)
    if not ctx.options.pipeline_p2p_overlap:
        return steady, np.zeros_like(steady)
    return steady, hidden_seconds(steady, fraction=1.0, window=free)


def bubble_time(
    ctx: TrainingContext, *, micro_batch: np.ndarray, forward_share: np.ndarray
) -> np.ndarray:
    """(pp - 1) micro-batches of idle time, scaled by the schedule: 1/v interleaved (Narayanan
    et al. SC'21), the forward share for ZB-H1 (Qi et al.), and for a bidirectional schedule
    DualPipe's (pp/2 - 1)(F&B + B - 3W) with the weight-gradient half of B deferred (W = B/2,
    F&B = F + B): (pp/2 - 1)(F + B/2) (DeepSeek-V3 report Table 2)."""
    pp, v = ctx.column("pp"), ctx.column("virtual_stages")
    schedule = np.asarray(ctx.table["pipeline_schedule"])
    factor = np.where(
        schedule == SCHEDULE_CODES["interleaved_1f1b"],
        1.0 / v,
        np.where(schedule == SCHEDULE_CODES["zero_bubble"], forward_share, 1.0),
    )
    if ctx.options.bidirectional_pipeline:
        half = np.maximum(pp / 2.0 - 1.0, 0.0) / np.maximum(pp - 1.0, 1.0)
        factor = half * (0.5 + 0.5 * forward_share)
    return (pp - 1.0) * micro_batch * factor
