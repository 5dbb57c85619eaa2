"""Alpha-beta collective times (vectorized).

Ring algorithm volumes per rank (Patarasuk & Yuan 2009; NCCL's performance notes
``nccl-tests/doc/PERFORMANCE.md``): all_reduce moves 2(n-1)/n of the buffer, all_gather and
reduce_scatter (n-1)/n, all_to_all (n-1)/n; the time is volume / bus bandwidth plus a latency
term per step. A group spanning nodes is hierarchical: the inter-node share of the traffic
crosses the NIC tier of each device, the rest crosses the intra-node fabric.
"""

from __future__ import annotations

import numpy as np

_RING_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1.0) / n,
    "all_gather": lambda n: (n - 1.0) / n,
    "reduce_scatter": lambda n: (n - 1.0) / n,
    "all_to_all": lambda n: (n - 1.0) / n,
    "broadcast": lambda n: np.ones_like(n),
    "send_recv": lambda n: np.ones_like(n),
}
_STEPS = {
    "all_reduce": lambda n: 2.0 * (n - 1.0),
    "all_gather": lambda n: n - 1.0,
    "reduce_scatter": lambda n: n - 1.0,
    "all_to_all": lambda n: n - 1.0,
    "broadcast": lambda n: np.log2(np.maximum(n, 2.0)),
    "send_recv": lambda n: np.ones_like(n),
}


def collective_time(cluster, op: str, *, group_size, ranks_per_node, message_bytes):
    """See ``Cluster.collective_time``. Groups of size 1 cost nothing."""
    if op not in _RING_FACTOR:
        raise ValueError(f"op ({op!r}) must be one of {sorted(_RING_FACTOR)}")
    n = np.asarray(group_size, dtype=np.float64)
    local = np.minimum(np.asarray(ranks_per_node, dtype=np.float64), n)
    size = np.asarray(message_bytes, dtype=np.float64)
    intra, inter = cluster.intra_node, cluster.inter_node
    intra_bw = intra.bandwidth_bytes_per_s * intra.efficiency
    inter_bw = inter.bandwidth_bytes_per_s * inter.efficiency / cluster.oversubscription
    spans_nodes = n > local
    volume = _RING_FACTOR[op](n) * size
    # Fraction of each rank's traffic that leaves the node: peers outside the node.
    outside = np.where(spans_nodes, (n - local) / np.maximum(n - 1.0, 1.0), 0.0)
    if op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        # Hierarchical ring: the inter-node ring carries the buffer once per node-group.
        inter_time = np.where(spans_nodes, volume / np.maximum(local, 1.0) / inter_bw, 0.0)
        intra_time = volume / intra_bw
        bandwidth_time = intra_time + inter_time
    else:
        bandwidth_time = volume * (1.0 - outside) / intra_bw + volume * outside / inter_bw
    latency = np.where(spans_nodes, inter.latency_s, intra.latency_s) * _STEPS[op](n)
    result = np.where(n <= 1.0, 0.0, bandwidth_time + latency)
    return float(result) if result.ndim == 0 else result
