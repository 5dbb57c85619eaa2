"""The cluster as a networkx graph, and explicit device groups reduced to their bottleneck links.

Nodes: ``dev<i>`` (kind ``device``), ``node<k>.<fabric>`` (kind ``switch``; absent on a mesh
fabric, whose devices link pairwise), ``node<k>.nic<j>`` (kind ``nic``), ``leaf<l>`` (kind
``leaf``) and ``spine`` (kind ``spine``, the aggregated core, present when there is more than one
leaf). Every edge is directed and carries ``bandwidth_bytes_per_s`` for that direction,
``latency_s``, ``kind``, ``tier`` (``intra``, ``nic``, ``network``, ``spine``, ``measured``) and
``source``. Measured ``Cluster.links`` become direct device-to-device ``measured`` edges.
"""

from __future__ import annotations

import functools
from collections import Counter

import networkx as nx
import numpy as np

from topology._cluster import MESH_FABRICS, Cluster, DeviceLink
from topology._collectives import GroupPath, broadcast_path, node_share

_NIC_PATH_SOURCE = (
    "assumed: the device-to-NIC PCIe path runs at the NIC's line rate (not a bottleneck)"
)


def _link(graph: nx.DiGraph, a: str, b: str, **attributes) -> None:
    graph.add_edge(a, b, **attributes)
    graph.add_edge(b, a, **attributes)


@functools.lru_cache(maxsize=16)
def build_graph(cluster: Cluster) -> nx.DiGraph:
    """See ``Cluster.graph``. Cached per cluster; treat the result as read-only."""
    graph = nx.DiGraph(name=cluster.name, provenance=cluster.provenance)
    for node in range(cluster.num_nodes):
        _add_node(graph, cluster, node)
    _add_network(graph, cluster)
    for link in cluster.links:
        graph.add_edge(
            f"dev{link.from_device}",
            f"dev{link.to_device}",
            bandwidth_bytes_per_s=link.bandwidth_bytes_per_s,
            latency_s=link.latency_s,
            kind="measured",
            tier="measured",
            source=link.source,
            spread=link.spread,
        )
    return graph


def _add_node(graph: nx.DiGraph, cluster: Cluster, node: int) -> None:
    intra, per_node = cluster.intra_node, cluster.devices_per_node
    devices = [f"dev{node * per_node + local}" for local in range(per_node)]
    for local, name in enumerate(devices):
        graph.add_node(
            name,
            kind="device",
            device_id=node * per_node + local,
            node=node,
            local_index=local,
            hardware=cluster.device.name,
        )
    common = dict(kind=intra.kind, tier="intra", source=intra.source)
    if intra.kind in MESH_FABRICS:
        per_link = intra.bandwidth_bytes_per_s / max(per_node - 1, 1)
        for i, a in enumerate(devices):
            for b in devices[i + 1 :]:
                _link(
                    graph, a, b, bandwidth_bytes_per_s=per_link, latency_s=intra.latency_s, **common
                )
    else:
        switch = f"node{node}.{intra.kind}"
        graph.add_node(switch, kind="switch", node=node)
        for name in devices:  # half the device-to-device latency on each hop through the switch
            _link(
                graph,
                name,
                switch,
                bandwidth_bytes_per_s=intra.bandwidth_bytes_per_s,
                latency_s=intra.latency_s / 2,
                **common,
            )
    nic_bw = cluster.inter_node.bandwidth_bytes_per_s * cluster.devices_per_nic
    for local, name in enumerate(devices):
        nic = f"node{node}.nic{local // cluster.devices_per_nic}"
        graph.add_node(nic, kind="nic", node=node, nic_index=local // cluster.devices_per_nic)
        _link(
            graph,
            name,
            nic,
            bandwidth_bytes_per_s=nic_bw,
            latency_s=0.0,
            kind="pcie",
            tier="nic",
            source=_NIC_PATH_SOURCE,
        )


def leaf_of(cluster: Cluster, node: int, nic_index: int) -> int:
    """Leaf switch of a NIC: rail ``nic_index`` of the node's scalable unit, or by port order on a fat tree."""
    nics_per_node = cluster.devices_per_node // cluster.devices_per_nic
    if cluster.network_topology == "rail_optimized":
        return (node // cluster.leaf_downlinks) * nics_per_node + nic_index
    return (node * nics_per_node + nic_index) // cluster.leaf_downlinks


def _add_network(graph: nx.DiGraph, cluster: Cluster) -> None:
    inter = cluster.inter_node
    nic_bw = inter.bandwidth_bytes_per_s * cluster.devices_per_nic
    nics_per_node = cluster.devices_per_node // cluster.devices_per_nic
    ports: Counter[int] = Counter()
    for node in range(cluster.num_nodes):
        for nic_index in range(nics_per_node):
            leaf = leaf_of(cluster, node, nic_index)
            graph.add_node(f"leaf{leaf}", kind="leaf", topology=cluster.network_topology)
            ports[leaf] += 1
            _link(
                graph,
                f"node{node}.nic{nic_index}",
                f"leaf{leaf}",
                bandwidth_bytes_per_s=nic_bw,
                latency_s=inter.latency_s / 2,
                kind=inter.kind,
                tier="network",
                source=inter.source,
            )
    if len(ports) > 1:
        graph.add_node("spine", kind="spine")
        for leaf, count in ports.items():
            _link(
                graph,
                f"leaf{leaf}",
                "spine",
                bandwidth_bytes_per_s=count * nic_bw / cluster.oversubscription,
                latency_s=0.0,
                kind="spine_uplink",
                tier="spine",
                source=f"leaf downlinks x NIC rate / oversubscription ({cluster.oversubscription:g})",
            )


def _structural(graph: nx.DiGraph) -> nx.DiGraph:
    measured = [(a, b) for a, b, tier in graph.edges(data="tier") if tier == "measured"]
    if not measured:
        return graph
    view = graph.copy()
    view.remove_edges_from(measured)
    return view


def bandwidth_matrix(cluster: Cluster) -> np.ndarray:
    """Device x device bytes/s: a measured link where given, else the bottleneck of the
    fewest-hops path (one breadth-first search per device: O(devices x edges))."""
    graph = build_graph(cluster)
    structural = _structural(graph)
    count = cluster.num_devices
    matrix = np.full((count, count), np.nan)
    for source in range(count):
        paths = nx.single_source_shortest_path(structural, f"dev{source}")
        for target in range(count):
            if target != source:
                path = paths[f"dev{target}"]
                matrix[source, target] = min(
                    structural[a][b]["bandwidth_bytes_per_s"] for a, b in zip(path, path[1:])
                )
    for link in cluster.links:
        matrix[link.from_device, link.to_device] = link.bandwidth_bytes_per_s
    return matrix


def _check_devices(cluster: Cluster, devices) -> list[int]:
    members = [int(device) for device in devices]
    if not members:
        raise ValueError("devices ([]) must name at least one device")
    if len(set(members)) != len(members):
        raise ValueError(f"devices ({members}) must not repeat a device")
    outside = [device for device in members if not 0 <= device < cluster.num_devices]
    if outside:
        raise ValueError(
            f"devices ({outside}) are not devices of {cluster.name}: valid ids are 0..{cluster.num_devices - 1}"
        )
    return members


def _intra_bandwidth(graph: nx.DiGraph, cluster: Cluster, members: list[int]) -> float:
    """Per-device intra-node bytes/s the group can use: each member's fabric port, limited on a
    mesh to its links to fellow members; the slowest member bounds the group."""
    by_node: dict[int, list[int]] = {}
    for device in members:
        by_node.setdefault(cluster.node_of(device), []).append(device)
    usable = []
    for group in by_node.values():
        for device in group:
            edges = [
                (b, data)
                for _, b, data in graph.out_edges(f"dev{device}", data=True)
                if data["tier"] == "intra"
            ]
            port = sum(data["bandwidth_bytes_per_s"] for _, data in edges)
            peers = {f"dev{other}" for other in group if other != device}
            direct = [data["bandwidth_bytes_per_s"] for b, data in edges if b in peers]
            usable.append(min(port, sum(direct)) if direct else port)
    return min(usable) * cluster.intra_node.efficiency


def _measured_limits(cluster: Cluster, members: list[int]) -> tuple[float, float, float, float]:
    """Slowest measured (bandwidth, latency) among the group's pairs: inside nodes, across nodes."""
    inside = set(members)
    intra: list[DeviceLink] = []
    inter: list[DeviceLink] = []
    for link in cluster.links:
        if link.from_device in inside and link.to_device in inside:
            same = cluster.node_of(link.from_device) == cluster.node_of(link.to_device)
            (intra if same else inter).append(link)

    def slowest(links: list) -> tuple[float, float]:
        return (
            min((link.bandwidth_bytes_per_s for link in links), default=np.inf),
            max((link.latency_s for link in links), default=0.0),
        )

    return (*slowest(intra), *slowest(inter))


def group_path(cluster: Cluster, *, devices, concurrent_groups=None) -> GroupPath:
    """``devices`` reduced to a ``GroupPath`` for ``topology._collectives.algorithm_times``."""
    members = _check_devices(cluster, devices)
    graph = build_graph(cluster)
    counts = Counter(cluster.node_of(device) for device in members)
    local = max(counts.values())
    intra_bw = _intra_bandwidth(graph, cluster, members)
    measured_intra_bw, measured_intra_lat, measured_inter_bw, measured_inter_lat = _measured_limits(
        cluster, members
    )
    nic_edges = [
        graph[
            f"node{cluster.node_of(d)}.nic{(d % cluster.devices_per_node) // cluster.devices_per_nic}"
        ]
        for d in members
    ]
    nic_bw = min(
        edges[leaf]["bandwidth_bytes_per_s"]
        for edges in nic_edges
        for leaf in edges
        if leaf.startswith("leaf")
    )
    per_device = nic_bw / cluster.devices_per_nic * cluster.inter_node.efficiency
    concurrent = (
        cluster.devices_per_node / local if concurrent_groups is None else float(concurrent_groups)
    )
    if concurrent < 1:
        raise ValueError(f"concurrent_groups ({concurrent_groups}) must be >= 1")
    share = node_share(
        per_device=per_device,
        devices=cluster.devices_per_node,
        devices_per_nic=cluster.devices_per_nic,
        local=float(local),
        concurrent=concurrent,
    )
    # Rail-aligned traffic between nodes stays in a leaf when the nodes share one (a scalable
    # unit on a rail-optimized network, a leaf's port range on a fat tree); else it crosses the spine.
    leaves = {leaf_of(cluster, node, 0) for node in counts}
    if len(leaves) > 1:
        share /= cluster.oversubscription
    share = min(share, local * measured_inter_bw)
    intra = cluster.intra_node
    reduction = 0.0
    if intra.in_network_reduction_efficiency is not None and len(counts) == 1:
        reduction = min(
            intra.bandwidth_bytes_per_s * intra.in_network_reduction_efficiency, measured_intra_bw
        )
    return broadcast_path(
        len(members),
        local,
        min(intra_bw, measured_intra_bw),
        max(intra.latency_s, measured_intra_lat),
        share,
        max(cluster.inter_node.latency_s, measured_inter_lat),
        reduction,
        len(counts),
    )
