"""The ``Cluster`` a probe run measured: tiers, latency, efficiency and the device, from results.

Measured values carry ``measured: probe run <name>`` provenance; the point-to-point matrix is
kept as ``Cluster.links``. A ``base`` preset supplies what a single-node run cannot see (the
scale-out tier) and the peaks that measured rates are relative to. Tier bandwidth, latency and
spread are medians over directed pairs; the per-step latency is the smallest all-reduce's time
over its 2(n-1) ring steps; the efficiency is the largest all-reduce's bus bandwidth (nccl-tests
convention) over the point-to-point bandwidth. Hosts (torchrun nodes) whose links to each
other run at a within-host rate are one scale-up domain, the cluster's node (``_hosts_per_domain``:
a GB200 NVL72 rack's 4-GPU trays). Torch-free.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import networkx as nx

from topology._cluster import Cluster, DeviceLink, LinkTier
from topology._hardware import HardwareSpec
from topology._probe_types import CollectiveResult, ComputeResult

__all__ = ["build_cluster"]


@dataclass(frozen=True)
class _Identity:
    run_name: str
    backend: str
    device_type: str
    device_name: str
    memory_bytes: float
    world_size: int
    devices_per_node: int


def _tier(links: list[DeviceLink], *, kind: str, source: str, efficiency: float = 1.0) -> LinkTier:
    bandwidth = statistics.median(link.bandwidth_bytes_per_s for link in links)
    latency = statistics.median(link.latency_s for link in links)
    spread = statistics.median(link.spread for link in links)
    return LinkTier(
        kind=kind,
        bandwidth_bytes_per_s=bandwidth,
        latency_s=latency,
        efficiency=efficiency,
        source=f"{source}: median of {len(links)} directed pairs (half round trip for latency), median spread {spread:.2f}",
    )


def _latency_from_collectives(collectives: list[CollectiveResult], fallback: float) -> float:
    """Per-step latency: the smallest all-reduce's time over its 2(n-1) ring steps (collective
    software overhead included), else the point-to-point ``fallback``."""
    small = [row for row in collectives if row.op == "all_reduce"]
    if not small:
        return fallback
    row = min(small, key=lambda r: (r.message_bytes, -r.group_size))
    return row.median_s / (2.0 * (row.group_size - 1))


def build_cluster(
    *,
    identity: _Identity,
    links: list[DeviceLink],
    collectives: list[CollectiveResult],
    compute: list[ComputeResult],
    base: Cluster | None = None,
) -> Cluster:
    """A ``Cluster`` from measurements (``measured:`` provenance); ``base`` supplies what a
    single-node run cannot see (the scale-out tier) and the peaks measured rates are relative to."""
    where = (
        f"measured: probe run {identity.run_name} ({identity.backend}, {identity.world_size} ranks)"
    )
    per_node = (
        identity.devices_per_node
        if identity.world_size % identity.devices_per_node == 0
        else identity.world_size
    )
    if not links:
        return _one_rank_cluster(identity, compute, where, base)
    links = [link.model_copy(update={"source": where}) for link in links]
    host = per_node
    hosts_per_domain, domain_note = _hosts_per_domain(links, host=host, world=identity.world_size)
    per_node = host * hosts_per_domain
    if domain_note:
        where = f"{where}; {domain_note}"
    inside = [link for link in links if link.from_device // per_node == link.to_device // per_node]
    across = [link for link in links if link.from_device // per_node != link.to_device // per_node]
    fabric = (
        base.intra_node.kind
        if base
        else ("loopback" if identity.device_type == "cpu" else "measured")
    )
    intra = _tier(inside or links, kind=fabric, source=where)
    intra = intra.model_copy(
        update={
            "latency_s": _latency_from_collectives(collectives, intra.latency_s),
            "efficiency": _efficiency(intra, collectives),
        }
    )
    if across:
        inter = _tier(across, kind=base.inter_node.kind if base else "measured", source=where)
    elif base is not None:
        inter = base.inter_node
    else:
        inter = intra.model_copy(
            update={"source": f"not measured (one node); copied from the intra-node tier, {where}"}
        )
    return Cluster(
        name=f"probe-{identity.run_name}",
        device=_device(identity, compute, where, base),
        num_nodes=identity.world_size // per_node,
        devices_per_node=per_node,
        devices_per_host=host if hosts_per_domain > 1 else None,
        intra_node=intra,
        inter_node=inter,
        network_topology="single_node" if not across else "rail_optimized",
        provenance=where,
        links=tuple(links),
    )


def _one_rank_cluster(
    identity: _Identity, compute: list[ComputeResult], where: str, base: Cluster | None
) -> Cluster:
    """A one-rank probe: its measured device on ``base``'s tiers (it measures no links)."""
    if base is None:
        raise ValueError(
            "base (None) must be a preset for a one-rank probe: it measures no links to build tiers from"
        )
    device = _device(identity, compute, where, base)
    return Cluster.model_validate(
        base.model_dump()
        | {
            "name": f"probe-{identity.run_name}",
            "num_nodes": 1,
            "devices_per_node": 1,
            "devices_per_nic": 1,
            "devices_per_host": None,
            "links": (),
            "device": device.model_dump(),
            "provenance": f"{where}; links from {base.name}",
        }
    )


#: Cross-host bandwidth, as a share of the within-host median, at or above which two hosts are
#: read as one scale-up fabric (a rack-scale NVLink domain: GB200 NVL72 trays reach each other at
#: NVLink's 900 GB/s per direction, 18x their 50 GB/s NIC; a DGX node's scale-out link is under a
#: seventh of its NVLink), so the probe's node is the domain, not the host.
SAME_FABRIC_SHARE = 0.5


def _hosts_per_domain(links: list[DeviceLink], *, host: int, world: int) -> tuple[int, str]:
    """Hosts of ``host`` ranks per scale-up domain (1: every host its own node) and a note for
    the provenance. Hosts whose measured links reach ``SAME_FABRIC_SHARE`` of the within-host
    median bandwidth are joined; the domains must be equal runs of consecutive hosts (ranks
    numbered host by host, domain by domain), else each host stays a node."""
    hosts = world // host
    within = [
        link.bandwidth_bytes_per_s
        for link in links
        if link.from_device // host == link.to_device // host
    ]
    if hosts < 2 or world % host or not within:
        return 1, ""
    floor = SAME_FABRIC_SHARE * statistics.median(within)
    between: dict[tuple[int, int], list[float]] = {}
    for link in links:
        first, second = sorted((link.from_device // host, link.to_device // host))
        if first != second:
            between.setdefault((first, second), []).append(link.bandwidth_bytes_per_s)
    rates = {pair: statistics.median(values) for pair, values in between.items()}
    fast = nx.Graph()
    fast.add_nodes_from(range(hosts))
    fast.add_edges_from(pair for pair, rate in rates.items() if rate >= floor)
    domains = [sorted(members) for members in nx.connected_components(fast)]
    size = len(domains[0])
    runs = all(  # equal runs of consecutive hosts, aligned to the domain size
        members == list(range(members[0], members[0] + size)) and members[0] % size == 0
        for members in domains
    )
    if size == 1 or not runs:
        return 1, ""
    fast_rates = [rate for rate in rates.values() if rate >= floor]
    note = (
        f"{size} hosts of {host} ranks per scale-up domain (hosts reach each other at "
        f"{statistics.median(fast_rates) / 1e9:.0f} GB/s, {statistics.median(within) / 1e9:.0f} GB/s "
        f"within a host)"
    )
    return size, note


def _efficiency(intra: LinkTier, collectives: list[CollectiveResult]) -> float:
    """Largest all-reduce's bus bandwidth over the measured point-to-point bandwidth (<= 1)."""
    rows = [
        row
        for row in collectives
        if row.op == "all_reduce" and row.group_size <= row.ranks_per_node
    ]
    if not rows:
        return 1.0
    row = max(rows, key=lambda r: (r.message_bytes, r.group_size))
    return float(min(1.0, max(1e-3, row.bus_bandwidth_bytes_per_s / intra.bandwidth_bytes_per_s)))


def _device(
    identity: _Identity, compute: list[ComputeResult], where: str, base: Cluster | None
) -> HardwareSpec:
    rates: dict[str, list[float]] = {}
    for row in compute:
        rates.setdefault(row.kind, []).append(row.rate_per_s)
    flops = {
        kind.removeprefix("matmul_"): statistics.median(values)
        for kind, values in rates.items()
        if kind.startswith("matmul_")
    }
    memory_bw = statistics.median(rates["memory_copy"])
    if base is not None:
        device = base.device
        shared = [dtype for dtype in flops if dtype in device.peak_flops]
        efficiency = (
            min(1.0, statistics.median(flops[d] / device.peak_flops[d] for d in shared))
            if shared
            else device.matmul_efficiency
        )
        memory = min(1.0, memory_bw / device.memory_bandwidth_bytes_per_s)
        sources = dict(
            device.sources,
            matmul_efficiency=f"{where}: median measured / peak over {shared}",
            memory_bandwidth_efficiency=f"{where}: copy bandwidth / peak",
        )
        return device.model_copy(
            update={
                "matmul_efficiency": efficiency,
                "memory_bandwidth_efficiency": memory,
                "sources": sources,
            }
        )
    return HardwareSpec(
        name=identity.device_name,
        peak_flops=flops,
        matmul_efficiency=1.0,
        memory_bytes=identity.memory_bytes,
        memory_bandwidth_bytes_per_s=memory_bw,
        memory_bandwidth_efficiency=1.0,
        device_type=identity.device_type,
        sources={
            field: f"{where}: median over ranks"
            for field in ("peak_flops", "memory_bandwidth_bytes_per_s", "memory_bytes")
        },
    )
