"""Time of one inference pass by part, and of a batch's step weighted by phase.

``_compute_time`` adds a pass's matmuls and element-wise kernels (``_inference_compute``) and
its per-kernel floors (``_inference_kernels``); ``_pass_parts`` sets them beside its traffic
(``_inference_comm``) and hides what overlaps. In a prefill pass, hidden communication holds
``COMMUNICATION_SM_FRACTION`` of the SMs while it runs, so compute takes that fraction of the
hidden time longer; decode's low-latency all-to-all holds none. ``_timing`` weights both passes
by phase (the time model of ``_inference_setup``).

Columns ``_inference_load.estimate_inference_table`` writes from here: ``time.<phase>_<part>``
for parts ``INFERENCE_TIME_PARTS`` (exposed seconds; they sum to ``step_time_s``) and
``hidden.<phase>_<kind>`` for the communication kinds (seconds that overlap compute, not in the
sum); ``step_time_s`` (the decode step, or the prefill pass for a prefill pool), ``ttft_s`` /
``tpot_s`` (NaN where the phase has none; percentiles and the load in ``_inference_load``'s
columns), ``tokens_per_s_per_device`` (output tokens, or input tokens including cache hits for a
prefill pool), ``prefill_tokens_per_s_per_device``, ``decode_tokens_per_s_per_device``,
``batch_size``, ``feasible`` and ``reason`` (``_reasons.REASON_CODES``: the largest memory part
when memory does not fit, else the missed SLO).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np

from cost_model import _inference_ops as ops
from cost_model._inference_comm import _comm_times, _fused_norm_kernels
from cost_model._inference_compute import _attention_gemms, _attention_time, _gemms, _moe_time
from cost_model._inference_kernels import (
    _host_bound,
    _kernels_per_pass,
    _measured_kernels_per_pass,
    pass_runs_eagerly,
)
from cost_model._inference_module import module_rows
from cost_model._inference_overlap import stage_paired_ep_exposure
from cost_model._inference_setup import (
    _cast_bytes,
    _memory_pass,
    _mm,
    _part_dtype,
    _passes,
    _Setup,
    _tokens,
)
from cost_model._serving_columns import PHASE_CODES
from cost_model._units import dtype_bytes

INFERENCE_TIME_PARTS: tuple[str, ...] = (
    "compute",
    "attention",
    "tp_comm",
    "ep_comm",
    "cp_comm",
    "pp_comm",
)


_COMM_PARTS = ("tp_comm", "ep_comm", "cp_comm", "pp_comm")


def _compute_time(s: _Setup, p: ops.Pass, parts: dict | None = None) -> np.ndarray:
    """Matmuls and element-wise kernels of one pass on each pipeline rank, (3, n) seconds;
    ``parts``, where given, receives one layer's attention projections, MoE layer and its router
    and shared experts, (n,)."""
    model, lay, head_bytes = s.model, s.layout, dtype_bytes(_part_dtype(s, "lm_head"))
    act = dtype_bytes(s.workload.activation_dtype)
    attention_tokens, rank_tokens = _tokens(s, p)
    tp = s.column("tp")
    # a pass replayed from a CUDA graph runs its GEMMs without the engine's host dispatch
    graphed = ~pass_runs_eagerly(s, p)
    attention_gemms = _attention_gemms(s, attention_tokens, decode=p.decode, graphed=graphed)
    if not p.decode:  # a measured prefill attention module holds its projections
        attention_gemms = np.where(module_rows(s), 0.0, attention_gemms)
    total = lay.layers * attention_gemms
    dense_tokens = np.where(s.attention_dp, attention_tokens * tp, attention_tokens)
    total = total + lay.dense_layers * _gemms(
        s,
        dense_tokens,
        ops.ffn_projections(model, model.ffn_hidden_size),
        tp,
        part="dense_ffn",
        graphed=graphed,
    )
    moe = _moe_time(s, attention_tokens, rank_tokens, decode=p.decode, graphed=graphed, parts=parts)
    total = total + lay.moe_layers * moe
    if parts is not None:
        parts.update(projections=attention_gemms, moe=moe)
    head_tokens = p.batch * p.head_tokens / s.column("cp") * np.where(s.attention_dp, tp, 1.0)
    w_head = model.vocab_size * model.hidden_size / tp
    head = _mm(
        s,
        2 * w_head * head_tokens,
        w_head * head_bytes + head_tokens * model.vocab_size / tp * ops.LOGIT_BYTES,
        "lm_head",
    )
    cast = _cast_bytes(s, "attention")
    attention_side = (
        ops.attention_side_bytes(model, decode=p.decode, act=act, cast=cast, shard=s.shard)
        * attention_tokens
    )
    if not p.decode:  # cached prefix tokens re-expanded for explicit-form MLA
        prefix_tokens = p.batch * p.cached_tokens / s.column("cp")
        attention_side = (
            attention_side
            + ops.prefix_expansion_bytes(model, act=act, shard=s.shard) * prefix_tokens
        )
    dense_cast = _cast_bytes(s, "dense_ffn")
    dense_side = ops.dense_ffn_side_bytes(
        model, model.ffn_hidden_size / tp, act=act, cast=dense_cast
    )
    total = total + lay.has_lm_head * head + lay.layers * _memory_pass(s, attention_side)
    total = total + lay.dense_layers * _memory_pass(s, dense_side * dense_tokens)
    # Two overlapped micro-batches run on two streams: one's launch gaps fill with the other's
    # kernels, so a pass pays the floor once, not once per micro-batch.
    kernels = (
        _kernels_per_pass(s)
        - _measured_kernels_per_pass(s, decode=p.decode)
        - _fused_norm_kernels(s, p)
    )
    floors = kernels * kernel_floor_s(s)
    return total + (floors / np.where(s.two_batch, 2.0, 1.0) if np.any(s.two_batch) else floors)


def kernel_floor_s(s: _Setup) -> float:
    """GPU seconds one kernel of a pass costs beyond its work: the device profile's measured
    graph-replayed kernel floor (``autoparallel profile``) where it has one, else the serving
    engine's sourced default (``ServingProfile.kernel_floor_s``)."""
    measured = getattr(s.hardware, "graph_kernel_floor_s", None)
    return s.profile.kernel_floor_s if measured is None else float(measured)


def _overlap_fractions(s: _Setup) -> dict[str, np.ndarray]:
    """Share of each communication kind that may hide behind compute, (n,) per kind: all of it
    under two-batch overlap (but pipeline sends), else its calibrated overlap fraction; the
    same for every pass of one setup."""
    if "_overlap_fractions" not in s.__dict__:
        s.__dict__["_overlap_fractions"] = {
            kind: np.where(
                s.two_batch & (kind != "pp_comm"), 1.0, s.calibration.overlap_fraction(kind)
            )
            for kind in _COMM_PARTS
        }
    return s.__dict__["_overlap_fractions"]


def _pass_parts(s: _Setup, p: ops.Pass) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Exposed and hidden seconds of one pass on the slowest pipeline rank, by part, (n,) each.

    With two-batch overlap the pass runs as two half micro-batches (every part costs twice a
    half pass) and TP/EP/CP traffic may hide entirely behind compute, the EP all-to-all only
    behind the stage of the other micro-batch that runs beside it (``_inference_overlap``,
    unless ``EstimateOptions.two_batch_stages`` is off); otherwise each kind hides up to its
    calibrated overlap fraction. Hidden traffic never exceeds the compute it hides behind.
    """
    # (without two-batch overlap on any row, one micro-batch: the pass itself, nothing scaled)
    split = bool(np.any(s.two_batch))
    micro_batches = np.where(s.two_batch, 2.0, 1.0) if split else 1.0
    micro = p.scaled(1.0 / micro_batches) if split else p  # type: ignore[arg-type]

    def whole(seconds: np.ndarray) -> np.ndarray:  # a micro-batch's time, times their count
        return micro_batches * seconds if split else seconds

    shape = s.layout.layers.shape
    stage_costs: dict[str, np.ndarray] = {}
    core = _attention_time(s, micro)
    raw = {
        "compute": whole(_compute_time(s, micro, stage_costs)),
        "attention": whole(s.layout.layers * core),
    }
    raw.update(
        {  # a rank-independent time stays (n,): it broadcasts over the ranks
            kind: whole(t) for kind, t in _comm_times(s, micro).items()
        }
    )
    busy = raw["compute"] + raw["attention"]
    fractions = _overlap_fractions(s)
    hideable_parts = {kind: raw[kind] * fractions[kind] for kind in _COMM_PARTS}
    if s.two_batch_stages and np.any(s.two_batch) and np.any(raw["ep_comm"] > 0):
        # what no stage of the other micro-batch hides stays exposed (``_inference_overlap``)
        moe_layers = s.layout.moe_layers
        per_layer = raw["ep_comm"] / micro_batches / np.maximum(moe_layers, 1)
        paired = moe_layers * stage_paired_ep_exposure(
            s, micro, per_layer, core=core, **stage_costs
        )
        paired = np.where(s.two_batch, np.minimum(paired, raw["ep_comm"]), 0.0)
        hideable_parts["ep_comm"] = (raw["ep_comm"] - paired) * fractions["ep_comm"]
    hideable = sum(hideable_parts.values())
    hidden_total = np.minimum(hideable, busy)
    # Each rank's exposed time is all of its time less what hides, and in prefill the hidden
    # traffic's kernels hold SMs, so compute runs slower meanwhile; the parts are split on the
    # slowest rank only.
    total = busy + sum(raw[kind] for kind in _COMM_PARTS) - hidden_total
    if not p.decode:
        total = total + ops.COMMUNICATION_SM_FRACTION * hidden_total
    slowest = np.argmax(np.broadcast_to(total, shape), axis=0) * shape[1] + np.arange(shape[1])
    pp = s.column("pp")

    def pick(values: np.ndarray) -> np.ndarray:
        if np.ndim(values) < 2:  # the same on every rank
            return np.broadcast_to(values, pp.shape)
        return np.take(np.ascontiguousarray(values).reshape(-1), slowest)

    held = pick(hideable)
    scale = pick(hidden_total) / np.where(held > 0, held, 1.0)
    hidden = {kind: pick(hideable_parts[kind]) * scale for kind in _COMM_PARTS}
    # compute and attention hide nothing: their exposed time is their time
    exposed = {
        part: pick(raw[part]) - hidden[part] if part in hidden else pick(raw[part])
        for part in INFERENCE_TIME_PARTS
    }
    if not p.decode:
        exposed["compute"] = exposed["compute"] + ops.COMMUNICATION_SM_FRACTION * sum(
            hidden.values()
        )
    return {k: pp * v for k, v in exposed.items()}, {k: pp * v for k, v in hidden.items()}


@dataclass(frozen=True)
class _Timing:
    """Time columns of one batch choice: parts, prefill pass, decode step and step (n,)."""

    time: dict[str, np.ndarray]
    hidden: dict[str, np.ndarray]
    prefill_s: np.ndarray
    decode_s: np.ndarray
    step_s: np.ndarray


def _timing(s: _Setup, batch: np.ndarray) -> _Timing:
    """Both passes at ``batch``, weighted by phase into the step (see the module docstring).
    A colocated row's TTFT and TPOT come from its load (``_inference_load``), not from here."""
    prefill, decode = _passes(s, batch)
    pre_exposed, pre_hidden = _pass_parts(s, prefill)
    dec_exposed, dec_hidden = _pass_parts(s, decode)
    pre_exposed = _host_bound(s, pre_exposed, pass_runs_eagerly(s, prefill))
    dec_exposed = _host_bound(s, dec_exposed, pass_runs_eagerly(s, decode))
    is_prefill, is_both = s.phase == PHASE_CODES["prefill"], s.phase == PHASE_CODES["both"]
    prefill_weight = np.where(is_prefill, 1.0, np.where(is_both, 1.0 / s.output_tokens, 0.0))
    decode_weight = np.where(is_prefill, 0.0, 1.0)
    time, hidden = {}, {}
    for part in INFERENCE_TIME_PARTS:
        time[f"prefill_{part}"] = prefill_weight * pre_exposed[part]
        time[f"decode_{part}"] = decode_weight * dec_exposed[part]
    for kind in _COMM_PARTS:
        hidden[f"prefill_{kind}"] = prefill_weight * pre_hidden[kind]
        hidden[f"decode_{kind}"] = decode_weight * dec_hidden[kind]
    return _Timing(
        time,
        hidden,
        cast(np.ndarray, sum(pre_exposed.values())),
        cast(np.ndarray, sum(dec_exposed.values())),
        cast(np.ndarray, sum(time.values())),
    )
