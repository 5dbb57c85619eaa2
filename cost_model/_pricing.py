"""Vectorized operator and collective pricing shared by the training and inference models.

Every function takes arrays (or a config table, see ``cost_model._table``) and returns arrays;
nothing here loops over configs. The pieces:

* **Roofline and collectives.** ``op_time_s``: max(FLOPs / achievable FLOP/s, bytes /
  achievable bandwidth) (Williams et al., "Roofline", CACM 2009). ``ranks_per_node``: how many
  ranks of each axis group share a node, for Megatron's rank order (tp innermost, then cp, dp,
  pp; MoE layers re-view dp*cp*tp as edp x ep x etp with etp innermost).
  ``collective_time_s`` prices a collective with ``Cluster.collective_time``;
  ``expert_dispatch_time_s`` a DeepEP dispatch or combine (DeepEP README; DeepSeek-V3 report
  sec. 2.1.2 for node-limited routing). Efficiencies come from ``_options.Calibration``.
* **Alike rows.** A large table repeats the same inputs on many rows (a search's configs differ
  in knobs a given operator does not read). ``RowPartition`` remembers, per table, which rows
  were alike in earlier calls, so element-wise pricing (collectives, kernel curves, rooflines)
  runs once per group of alike rows and is scattered back; every input is checked against its
  group's representative, so the result is the row-by-row one.
* **Attention extent.** ``mean_attended_tokens``: keys per query of a causal sequence for the
  full, sliding-window, sparse top-k and linear variants.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from cost_model._model_spec import AttentionSpec
from cost_model._options import Calibration
from cost_model._rows import _DISTINCT_MIN_SIZE, RowPartition, distinct_rows
from cost_model._stages import _int


def op_time_s(
    *,
    flops,
    bytes_moved,
    hardware,
    dtype: str,
    calibration: Calibration,
    calls=1.0,
    kind: str = "matmul",
) -> np.ndarray:
    """Roofline time of ``calls`` equal kernels moving ``flops`` and ``bytes_moved`` in total:
    max of compute and memory time (Williams et al., CACM 2009).

    Achievable FLOP/s = peak(dtype) x ``hardware.gemm_efficiency(flops / calls)`` x the
    calibration's scale for ``kind`` (``matmul``, or ``attention`` for core-attention kernels);
    achievable bandwidth = peak x ``hardware.memory_efficiency(bytes / calls)`` (for ``kind``
    ``norm``: ``hardware.norm_efficiency``, a measured norm curve where there is one) x the
    calibration's memory scale.
    """
    flops = np.asarray(flops, dtype=np.float64)
    bytes_moved = np.asarray(bytes_moved, dtype=np.float64)
    calls = np.maximum(np.asarray(calls, dtype=np.float64), 1.0)
    peak = hardware.peak_flops_for(dtype)
    scale = (
        calibration.attention_scale(hardware)
        if kind == "attention"
        else calibration.matmul_scale(hardware)
    )
    matmul = hardware.gemm_efficiency(flops / calls, dtype) * scale
    bandwidth = hardware.memory_efficiency
    if kind == "norm" and hasattr(hardware, "norm_efficiency"):  # norm layers: their measured curve
        bandwidth = hardware.norm_efficiency
    memory = bandwidth(bytes_moved / calls) * calibration.memory_scale(hardware)
    compute_s = flops / (peak * matmul)
    memory_s = bytes_moved / (hardware.memory_bandwidth_bytes_per_s * memory)
    return np.maximum(compute_s, memory_s)


def ranks_per_node(
    *, table: Mapping[str, np.ndarray], devices_per_node: int
) -> dict[str, np.ndarray]:
    """Ranks of one group of each axis that share a node, for Megatron's rank order.

    Global rank = tp_index + tp*(cp_index + cp*(dp_index + dp*pp_index)): the group of an axis
    has stride = product of the inner sizes, so ``min(size, max(1, devices_per_node // stride))``
    of its members sit on one node. MoE layers view the dp*cp*tp ranks of a stage as
    edp x ep x etp, etp innermost (Megatron-core parallel folding). ``dp_cp`` is the
    gradient-reduction group of dense parameters (dp and cp are adjacent, stride tp).
    """
    tp, cp, dp = _int(table, "tp"), _int(table, "cp"), _int(table, "dp")
    pp, ep, etp = _int(table, "pp"), _int(table, "ep"), _int(table, "etp")
    edp = (dp * cp * tp) // (ep * etp)

    def local(size: np.ndarray, stride: np.ndarray | int) -> np.ndarray:
        return np.minimum(size, np.maximum(1, devices_per_node // stride))

    return {
        "tp": local(tp, 1),
        "cp": local(cp, tp),
        "dp": local(dp, tp * cp),
        "dp_cp": local(dp * cp, tp),
        "pp": local(pp, tp * cp * dp),
        "etp": local(etp, 1),
        "ep": local(ep, etp),
        "edp": local(edp, etp * ep),
    }


def collective_time_s(
    *,
    cluster,
    op: str,
    group_size,
    ranks_per_node,
    message_bytes,
    calibration: Calibration,
    rows: RowPartition | None = None,
) -> np.ndarray:
    """``cluster.collective_time`` divided by the calibration's collective efficiency (an
    all-to-all by its own efficiency, plus its fixed cost per call, where the calibration has
    them: ``_calibrated``).

    Large tables repeat the same (group size, ranks per node, message) many times, so the
    topology model is evaluated once per distinct triple and scattered back. ``rows`` (one per
    table, shared by every call on it) remembers which rows were alike in earlier calls, so a
    call whose triples are alike on the same rows skips the search for distinct triples.
    """
    group, local, message = np.broadcast_arrays(
        *(
            np.asarray(value, dtype=np.float64)
            for value in (group_size, ranks_per_node, message_bytes)
        )
    )
    if group.size < _DISTINCT_MIN_SIZE:
        seconds = cluster.collective_time(
            op, group_size=group, ranks_per_node=local, message_bytes=message
        )
        return _calibrated(op, seconds, group, calibration)
    shape = group.shape
    varying = [  # a scalar argument is alike on every row
        value.ravel()
        for value, given in zip(
            (group, local, message), (group_size, ranks_per_node, message_bytes), strict=True
        )
        if np.ndim(given) > 0
    ]
    if rows is None:
        first, inverse = distinct_rows(varying, size=group.size)
    else:
        found = rows.grouping(varying, size=group.size, site=f"collective {op}")
        if found is None:  # rows hardly repeat: price them all
            seconds = cluster.collective_time(
                op, group_size=group, ranks_per_node=local, message_bytes=message
            )
            return _calibrated(op, seconds, group, calibration)
        first, inverse = found
    whole_group = group
    group, local, message = (value.reshape(-1)[first] for value in (group, local, message))
    seconds = cluster.collective_time(
        op, group_size=group, ranks_per_node=local, message_bytes=message
    )
    seconds = np.asarray(seconds, dtype=np.float64).reshape(-1)[inverse].reshape(shape)
    return _calibrated(op, seconds, whole_group, calibration)


def _calibrated(op: str, seconds, group: np.ndarray, calibration: Calibration) -> np.ndarray:
    """Topology seconds of ``op`` over the calibration's efficiency plus its fixed cost per call
    (``collective_overhead_s``); an all-to-all, where the calibration fitted its own
    (``all_to_all_efficiency``), over that plus its own fixed cost (``all_to_all_overhead_s``).
    The fixed cost applies on groups of two or more ranks (a group of one issues no
    collective)."""
    seconds = np.asarray(seconds, dtype=np.float64)
    if op != "all_to_all" or calibration.all_to_all_efficiency is None:
        fixed = np.where(group > 1.0, calibration.collective_overhead_s, 0.0)
        return seconds / calibration.collective_efficiency + fixed
    fixed = np.where(group > 1.0, calibration.all_to_all_overhead_s, 0.0)
    return seconds / calibration.all_to_all_efficiency + fixed


def expert_dispatch_time_s(
    *,
    cluster,
    calibration: Calibration,
    hidden_size: int,
    top_k: int,
    ep,
    etp,
    ep_per_node,
    rank_tokens,
    element_bytes: float,
    node_dedup: bool,
    max_routed_nodes: int | None = None,
) -> np.ndarray:
    """One MoE dispatch (or combine) as DeepEP runs it: every rank writes straight to its peers,
    NVLink and RDMA at once, so the time is the slower tier's bytes over its bandwidth plus one
    latency (DeepEP README; not the n-1 rounds of a pairwise all-to-all). Each tier is priced by
    the topology as a point-to-point transfer. Each token goes to ``top_k`` experts, each held by
    ``etp`` ranks. With ``node_dedup`` (DeepEP "normal" kernels) a token is sent once per
    remote node and forwarded over NVLink there; without, every copy crosses RDMA. Destinations
    are uniform over the group's ``ep`` ranks on ``ep / L`` nodes (``L`` = ``ep_per_node``);
    node-limited routing (DeepSeek-V3 report sec. 2.1.2: each token to at most M nodes) caps the
    distinct remote nodes at ``max_routed_nodes``. Shared by training and inference.
    """
    ep, etp = np.asarray(ep, dtype=np.float64), np.asarray(etp, dtype=np.float64)
    local = np.minimum(np.asarray(ep_per_node, dtype=np.float64), ep)
    nodes = ep / local
    copies = top_k * etp
    token_bytes = np.asarray(rank_tokens, dtype=np.float64) * hidden_size * element_bytes
    intra_bytes = token_bytes * copies * (local - 1.0) / ep
    remote_copies = copies * (ep - local) / ep
    if node_dedup:  # distinct remote nodes among the copies' destinations
        remote_copies = np.minimum(
            remote_copies, (nodes - 1.0) * (1.0 - np.power(1.0 - 1.0 / nodes, copies))
        )
    if max_routed_nodes is not None:
        remote_copies = np.minimum(
            remote_copies, np.where(node_dedup, float(max_routed_nodes), copies)
        )
    inter_bytes = token_bytes * remote_copies

    def point_to_point(ranks_per_node, message) -> np.ndarray:
        return collective_time_s(
            cluster=cluster,
            op="send_recv",
            group_size=2.0,
            ranks_per_node=ranks_per_node,
            message_bytes=message,
            calibration=calibration,
        )

    seconds = np.maximum(
        point_to_point(2.0, intra_bytes), np.where(nodes > 1, point_to_point(1.0, inter_bytes), 0.0)
    )
    return np.where(ep > 1, seconds, 0.0)


def mean_attended_tokens(*, attention: AttentionSpec, sequence_tokens) -> np.ndarray:
    """Mean keys a query attends to over a causal sequence of ``sequence_tokens`` tokens.

    Query i (1-based) attends ``attention.attended_tokens(i)`` keys: i for full attention (mean
    (S+1)/2), min(i, w) for a window or top-k budget w, ((i-1) mod w) + 1 within chunks of w, a
    constant for linear attention; interleaved full layers (``full_layer_fraction`` f) weigh
    the full mean by f. Closed form of the mean of min(i, w): (w(w+1)/2 + (S-w)w)/S for S > w;
    of the chunked count: (k w(w+1)/2 + r(r+1)/2)/S with S = k w + r.
    """
    s = np.asarray(sequence_tokens, dtype=np.float64)
    full = (s + 1.0) / 2.0
    f = attention.full_layer_fraction
    if attention.variant == "full":
        return full
    if attention.variant == "linear":
        # ``attended_tokens``' rule: no keys where the layers have their own recurrence
        keys = 0.0 if attention.has_linear_mixer else float(attention.qk_head_dim)
        local = np.full_like(s, keys)
    else:
        sparse = attention.variant == "sparse_topk"
        tokens = attention.topk_tokens if sparse else attention.window_tokens
        assert tokens is not None  # AttentionSpec requires it for these variants
        w = float(tokens)
        safe = np.maximum(s, 1.0)
        if attention.variant == "chunked":
            chunks = np.floor(safe / w)
            rest = safe - chunks * w
            local = (chunks * w * (w + 1.0) / 2.0 + rest * (rest + 1.0) / 2.0) / safe
        else:
            capped = (w * (w + 1.0) / 2.0 + (s - w) * w) / safe
            local = np.where(s > w, capped, full)
    return f * full + (1.0 - f) * local
