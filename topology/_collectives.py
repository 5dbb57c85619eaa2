"""Alpha-beta collective times, vectorized over numpy arrays.

A group of ``n`` ranks with ``L`` ranks per node spans ``m = n / L`` nodes. It is reduced to a
``GroupPath``: the per-device intra-node bandwidth it can use, the scale-out bandwidth its ranks
on one node share (NIC contention and spine oversubscription included), and both latencies.
The same ``algorithm_times`` prices a path built from the cluster's tiers (``tier_path``, used
by ``Cluster.collective_time`` on arrays of layouts) or from an explicit device list on the
graph (``topology._graph.group_path``).

Sources of the formulas:
- Bus bandwidth, the quantity efficiencies are quoted in: nccl-tests ``doc/PERFORMANCE.md``:
  ``busBw = algBw * 2(n-1)/n`` (all_reduce), ``(n-1)/n`` (all_gather, reduce_scatter,
  alltoall), ``1`` (broadcast, send/recv); ``algBw = size / time``.
- Ring volumes and steps: Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for
  clusters of workstations", JPDC 2009 (2(n-1) steps, 2(n-1)/n of the buffer per rank).
- Tree: NCCL's double binary tree (Sanders, Speck & Träff 2009; NVIDIA blog "Massively Scale
  Your Deep Learning Training with NCCL 2.4", 2019): intra-node chain + inter-node tree,
  logarithmic latency, the whole buffer up and down.
- Hierarchical: reduce-scatter inside the node, all-reduce across nodes on 1/L of the buffer
  per rank (one rail per local rank), all-gather inside the node (Goyal et al. 2017; Jia et al.
  "Highly scalable deep learning training system with mixed-precision", 2018 — "hierarchical all-reduce").
- All-to-all: every rank sends (n-1)/n of its buffer, all peers at once (NCCL's all-to-all is
  grouped ncclSend/ncclRecv to every peer, NCCL user guide "Point-to-point communication"), so
  one latency, not n-1 rounds as in MPICH's pairwise exchange (Thakur, Rabenseifner & Gropp
  2005); NVLink and RDMA transfers proceed concurrently (DeepEP overlaps them), so the slower
  one bounds the time.
- In-switch reduction (NVLS): each device sends and receives its buffer once; the achieved
  ``algBw`` fraction is data on the tier (``LinkTier.in_network_reduction_efficiency``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BUS_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1.0) / n,
    "all_gather": lambda n: (n - 1.0) / n,
    "reduce_scatter": lambda n: (n - 1.0) / n,
    "all_to_all": lambda n: (n - 1.0) / n,
    "broadcast": lambda n: np.ones_like(n),
    "send_recv": lambda n: np.ones_like(n),
}
ALGORITHMS = ("ring", "tree", "hierarchical", "in_network")


def bus_factor(op: str, n):
    """nccl-tests ``busBw / algBw`` for ``op`` over ``n`` ranks (``doc/PERFORMANCE.md``)."""
    _check_op(op)
    return BUS_FACTOR[op](np.maximum(np.asarray(n, dtype=np.float64), 1.0))


def _check_op(op: str) -> None:
    if op not in BUS_FACTOR:
        raise ValueError(f"op ({op!r}) must be one of {sorted(BUS_FACTOR)}")


@dataclass(frozen=True)
class GroupPath:
    """A process group reduced to its bottlenecks (arrays broadcast together; SI units)."""

    group_size: np.ndarray
    ranks_per_node: np.ndarray
    intra_bytes_per_s: np.ndarray  # per device, inside the node, usable by this group
    intra_latency_s: np.ndarray
    node_inter_bytes_per_s: np.ndarray  # per node, shared by the group's ranks there
    inter_latency_s: np.ndarray
    in_network_bytes_per_s: np.ndarray  # algBw of an in-switch all-reduce; 0 where none
    num_nodes: np.ndarray  # nodes the group spans


def _array(value) -> np.ndarray:
    return np.asarray(value, dtype=np.float64)


def tier_path(
    cluster,
    *,
    group_size,
    ranks_per_node,
    concurrent_groups=None,
    num_nodes=None,
    crosses_spine=None,
) -> GroupPath:
    """The bottlenecks of groups placed on ``cluster``'s tiers (vectorized).

    By default a group fills ``ceil(group_size / ranks_per_node)`` consecutive nodes and crosses
    the spine when those exceed one leaf; a placement that knows better passes ``num_nodes`` and
    ``crosses_spine`` (arrays like the others).
    """
    from topology._cluster import MESH_FABRICS

    n = _array(group_size)
    if np.any(n < 1):
        raise ValueError(f"group_size ({group_size}) must be >= 1")
    per_node = _array(ranks_per_node)
    if np.any(per_node < 1) or np.any(per_node > cluster.devices_per_node):
        raise ValueError(
            f"ranks_per_node ({ranks_per_node}) must be in 1..{cluster.devices_per_node} (devices_per_node)"
        )
    local = np.minimum(per_node, n)
    devices = float(cluster.devices_per_node)
    intra, inter = cluster.intra_node, cluster.inter_node
    # A mesh gives each device one link per peer: a group uses only the links to its own members.
    mesh_share = (local - 1.0) / max(devices - 1.0, 1.0) if intra.kind in MESH_FABRICS else 1.0
    intra_bw = (
        intra.bandwidth_bytes_per_s
        * intra.efficiency
        * np.maximum(mesh_share, 1.0 / max(devices - 1.0, 1.0))
    )
    concurrent = devices / local if concurrent_groups is None else _array(concurrent_groups)
    if np.any(concurrent < 1):
        raise ValueError(f"concurrent_groups ({concurrent_groups}) must be >= 1")
    node_bw = node_share(
        per_device=inter.bandwidth_bytes_per_s * inter.efficiency,
        devices=devices,
        devices_per_nic=cluster.devices_per_nic,
        local=local,
        concurrent=concurrent,
    )
    nodes = np.ceil(n / local) if num_nodes is None else _array(num_nodes)
    crosses = (
        nodes > cluster.nodes_per_leaf
        if crosses_spine is None
        else np.asarray(crosses_spine, dtype=bool)
    )
    node_bw = node_bw / np.where(crosses & (nodes > 1), cluster.oversubscription, 1.0)
    reduction = (
        0.0
        if intra.in_network_reduction_efficiency is None
        else intra.bandwidth_bytes_per_s * intra.in_network_reduction_efficiency
    )
    return broadcast_path(
        n, local, intra_bw, intra.latency_s, node_bw, inter.latency_s, reduction, nodes
    )


def node_share(*, per_device, devices, devices_per_nic, local, concurrent):
    """Scale-out bytes/s one group gets on one node: the node's NICs split among the groups
    running at once, and at most the NICs its own ranks sit on (each rank's NIC is shared by
    ``devices_per_nic`` devices, so alone a rank may use all of it)."""
    pool = per_device * devices
    own_nics = np.minimum(local * per_device * devices_per_nic, pool)
    return np.minimum(pool / concurrent, own_nics)


def broadcast_path(*values) -> GroupPath:
    """A ``GroupPath`` from its fields in order, broadcast to one shape."""
    arrays = np.broadcast_arrays(*(_array(v) for v in values))
    return GroupPath(*arrays)


def traffic_per_rank(
    op: str, *, group_size, ranks_per_node, message_bytes
) -> dict[str, np.ndarray]:
    """Bytes one rank sends over the intra-node fabric and the scale-out network.

    Flat algorithms (ring, pairwise all-to-all): a rank's share of the bus volume, split by the
    fraction of its peers on other nodes, ``(n - L) / (n - 1)``.
    """
    _check_op(op)
    n, size = _array(group_size), _array(message_bytes)
    local = np.minimum(_array(ranks_per_node), n)
    volume = bus_factor(op, n) * size
    outside = np.where(n > 1, (n - local) / np.maximum(n - 1.0, 1.0), 0.0)
    return {"intra_node": volume * (1.0 - outside), "inter_node": volume * outside}


def algorithm_times(op: str, *, path: GroupPath, message_bytes) -> dict[str, np.ndarray]:
    """Seconds for each algorithm; ``nan`` where an algorithm does not apply to the op or group."""
    _check_op(op)
    size = _array(message_bytes)
    n, local = path.group_size, path.ranks_per_node
    nodes = path.num_nodes
    spans = nodes > 1.0
    # A flat ring spanning nodes runs one ring per local rank (one per rail): the node's share
    # of the network carries the whole bus volume, each device's fabric port its own.
    flat_bw = np.where(
        spans,
        np.minimum(path.intra_bytes_per_s, path.node_inter_bytes_per_s),
        path.intra_bytes_per_s,
    )
    step_latency = np.where(spans, path.inter_latency_s, path.intra_latency_s)
    factor = bus_factor(op, n)
    nan = np.full(np.broadcast_shapes(n.shape, size.shape), np.nan)
    times = {name: nan for name in ALGORITHMS}
    if op == "all_to_all":
        times["ring"] = _pairwise_all_to_all(path, size)
    elif op == "send_recv":
        bandwidth = np.where(spans, path.node_inter_bytes_per_s / local, path.intra_bytes_per_s)
        times["ring"] = size / bandwidth + step_latency
    else:
        steps = {"all_reduce": 2.0 * (n - 1.0)}.get(op, n - 1.0)
        times["ring"] = factor * size / flat_bw + steps * step_latency
    if op in ("all_reduce", "broadcast"):
        times["tree"] = _tree(op, path, size, flat_bw)
    if op in ("all_reduce", "all_gather", "reduce_scatter"):
        times["hierarchical"] = _hierarchical(op, path, size)
    if op == "all_reduce":
        usable = (path.in_network_bytes_per_s > 0) & ~spans
        seconds = (
            size / np.where(usable, path.in_network_bytes_per_s, 1.0) + 2.0 * path.intra_latency_s
        )
        times["in_network"] = np.where(usable, seconds, np.nan)
    single = n <= 1.0
    return {
        name: np.where(single, np.where(name == "ring", 0.0, np.nan), value + 0.0 * size)
        for name, value in times.items()
    }


def _pairwise_all_to_all(path: GroupPath, size: np.ndarray) -> np.ndarray:
    n, local = path.group_size, path.ranks_per_node
    intra_bytes = (local - 1.0) / n * size  # per rank, to peers on its node
    node_inter_bytes = local * (n - local) / n * size  # per node, to peers elsewhere
    intra_s = intra_bytes / path.intra_bytes_per_s
    inter_s = np.where(n > local, node_inter_bytes / path.node_inter_bytes_per_s, 0.0)
    latency = np.where(n > local, path.inter_latency_s, path.intra_latency_s)
    return np.maximum(intra_s, inter_s) + latency


def _tree(op: str, path: GroupPath, size: np.ndarray, flat_bw: np.ndarray) -> np.ndarray:
    hops = (path.ranks_per_node - 1.0) * path.intra_latency_s + np.ceil(
        np.log2(path.num_nodes)
    ) * path.inter_latency_s
    if (
        op == "all_reduce"
    ):  # reduce up the trees, broadcast down: the buffer twice, two passes of hops
        return 2.0 * size / flat_bw + 2.0 * hops
    return size / flat_bw + hops


def _hierarchical(op: str, path: GroupPath, size: np.ndarray) -> np.ndarray:
    local, nodes = path.ranks_per_node, path.num_nodes
    intra = (local - 1.0) / local * size / path.intra_bytes_per_s + (
        local - 1.0
    ) * path.intra_latency_s
    inter = (nodes - 1.0) / nodes * size / path.node_inter_bytes_per_s + (
        nodes - 1.0
    ) * path.inter_latency_s
    passes = 2.0 if op == "all_reduce" else 1.0  # reduce-scatter + all-gather at each level
    seconds = passes * (intra + inter)
    return np.where((nodes > 1.0) & (local > 1.0), seconds, np.nan)


def applicable(times: dict[str, np.ndarray]) -> dict[str, np.ndarray | float]:
    """Drop algorithms that apply nowhere; scalars become floats."""
    kept = {name: value for name, value in times.items() if not np.all(np.isnan(value))}
    return {name: (float(value) if np.ndim(value) == 0 else value) for name, value in kept.items()}


def cheapest(times: dict[str, np.ndarray]):
    """The fastest applicable algorithm's time, element-wise (a float for scalars)."""
    result = np.nanmin(np.stack(np.broadcast_arrays(*times.values())), axis=0)
    return float(result) if result.ndim == 0 else result


def chosen_algorithm(times: dict[str, np.ndarray]) -> np.ndarray:
    """Name of the fastest algorithm, element-wise."""
    stacked = np.stack(np.broadcast_arrays(*times.values()))
    names = np.array(list(times))
    return names[np.nanargmin(np.where(np.isnan(stacked), np.inf, stacked), axis=0)]


def collective_time(
    cluster, op: str, *, group_size, ranks_per_node, message_bytes, concurrent_groups=None
):
    """See ``Cluster.collective_time``. Groups of size 1 cost nothing."""
    _check_op(op)
    path = tier_path(
        cluster,
        group_size=group_size,
        ranks_per_node=ranks_per_node,
        concurrent_groups=concurrent_groups,
    )
    modelled = cheapest(algorithm_times(op, path=path, message_bytes=message_bytes))
    return _measured_where_profiled(
        cluster, op, path=path, message_bytes=message_bytes, modelled=modelled
    )


def _measured_where_profiled(cluster, op: str, *, path: GroupPath, message_bytes, modelled):
    """A hardware profile's measured curve (``profilers``) replaces the model for groups inside
    one node of the sizes it measured; everything else keeps the alpha-beta time."""
    profile = getattr(cluster.device, "profile", None)
    if profile is None or not profile.collectives.get(op):
        return modelled
    single_node = path.num_nodes <= 1.0
    measured = profile.collective_time_s(op, path.group_size, _array(message_bytes))
    result = np.where(
        np.isfinite(measured) & single_node & (path.group_size > 1.0), measured, modelled
    )
    return float(result) if np.ndim(result) == 0 else result
