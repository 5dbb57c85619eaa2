"""``topology.probe``: measure a live cluster under torchrun and describe it as a ``Cluster``.

Every rank runs ``probe_rank``; rank 0 gathers the measurements and builds a ``ProbeReport``
whose ``cluster`` carries ``measured: <run>`` provenance and the point-to-point matrix as
``Cluster.links``, so it loads back (``Cluster.load``) and feeds the cost model. This module is
torch-free at import; ``topology.probe_measure`` does the timing.

What is measured (warm-up runs first, then the median of ``repeats`` >= 5 and the spread):
- point-to-point bandwidth of every ordered pair of ranks up to ``max_all_pairs_ranks``
  (beyond it each rank's ring neighbours and a deterministic sample of others);
- collective time and nccl-tests bus bandwidth by group size (ranks ``0..g-1``) and message size;
- per-device matmul FLOP/s by dtype and memory (copy) bandwidth.
"""

from __future__ import annotations

import datetime
import os
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from topology._cluster import Cluster, DeviceLink, LinkTier
from topology._hardware import HardwareSpec

_STRICT = ConfigDict(extra="forbid", frozen=True)
Progress = Callable[[str, int, int], None]
PROBED_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
PROBED_DTYPES = ("fp32", "bf16", "fp16")


class ProbeSettings(BaseModel):
    """What to measure and how long to wait. Sizes in bytes; ``None`` picks a size for the device."""

    model_config = _STRICT

    p2p_message_bytes: int | None = Field(default=None, gt=0)
    collective_message_bytes: tuple[int, ...] | None = None
    collective_ops: tuple[str, ...] = PROBED_OPS
    group_sizes: tuple[int, ...] | None = Field(
        default=None, description="default: powers of two up to the world"
    )
    matmul_dim: int | None = Field(default=None, gt=0)
    matmul_dtypes: tuple[str, ...] | None = None
    copy_bytes: int | None = Field(default=None, gt=0)
    warmup: int = Field(default=1, ge=0)
    repeats: int = Field(default=5, ge=5, description="median of at least 5 timed repeats")
    operation_timeout_s: float = Field(default=60.0, gt=0)
    max_all_pairs_ranks: int = Field(default=64, gt=1)
    sampled_peers_per_rank: int = Field(default=8, ge=0)
    run_name: str | None = None
    stop_silent_local_ranks: bool = Field(
        default=True,
        description="SIGKILL a rank on this host that stopped answering, so the launcher can exit",
    )

    @field_validator("collective_ops")
    @classmethod
    def _known_ops(cls, ops: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(ops) - set(PROBED_OPS))
        if unknown:
            raise ValueError(
                f"collective_ops ({unknown}) are not probed ops; valid: {', '.join(PROBED_OPS)}"
            )
        return ops

    @field_validator("matmul_dtypes")
    @classmethod
    def _known_dtypes(cls, dtypes: tuple[str, ...] | None) -> tuple[str, ...] | None:
        unknown = sorted(set(dtypes or ()) - set(PROBED_DTYPES))
        if unknown:
            raise ValueError(
                f"matmul_dtypes ({unknown}) are not probed dtypes; valid: {', '.join(PROBED_DTYPES)}"
            )
        return dtypes


@dataclass(frozen=True)
class ProbeHooks:
    """Test hooks: ``before_send(sender, receiver)`` runs inside the timed send of a pair;
    ``before_step(label)`` before every step (a test may kill or stall its rank there)."""

    before_send: Callable[[int, int], None] | None = None
    before_step: Callable[[str], None] | None = None


class CollectiveResult(BaseModel):
    model_config = _STRICT

    op: str
    group_size: int
    ranks_per_node: int
    message_bytes: int
    median_s: float
    spread: float
    bus_bandwidth_bytes_per_s: float


class ComputeResult(BaseModel):
    model_config = _STRICT

    rank: int
    kind: str = Field(description="matmul_<dtype> or memory_copy")
    rate_per_s: float = Field(description="FLOP/s for matmuls, bytes/s for copies")
    spread: float


class ProbeReport(BaseModel):
    """Everything one probe run measured, and the ``Cluster`` built from it."""

    model_config = _STRICT

    run_name: str
    backend: str
    device_type: str
    world_size: int
    devices_per_node: int
    p2p: tuple[DeviceLink, ...]
    collectives: tuple[CollectiveResult, ...]
    compute: tuple[ComputeResult, ...]
    cluster: Cluster

    def p2p_matrix(self) -> np.ndarray:
        """Rank x rank measured bandwidth (bytes/s); ``nan`` on the diagonal and unmeasured pairs."""
        matrix = np.full((self.world_size, self.world_size), np.nan)
        for link in self.p2p:
            matrix[link.from_device, link.to_device] = link.bandwidth_bytes_per_s
        return matrix

    def slowest_link(self) -> DeviceLink:
        if not self.p2p:
            raise ValueError(
                f"probe run {self.run_name} measured no links (world_size {self.world_size})"
            )
        return min(self.p2p, key=lambda link: link.bandwidth_bytes_per_s)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.model_dump_json(indent=2) + "\n")
        return path


def probe_pairs(
    world_size: int, *, max_all_pairs_ranks: int = 64, sampled_peers_per_rank: int = 8
) -> list[tuple[int, int]]:
    """Unordered pairs to measure, in one global order every rank follows (deadlock-free):
    all pairs up to ``max_all_pairs_ranks`` ranks, else ring neighbours plus a seeded sample."""
    if world_size <= max_all_pairs_ranks:
        return [(a, b) for a in range(world_size) for b in range(a + 1, world_size)]
    chosen: set[tuple[int, int]] = set()
    sampler = random.Random(world_size)
    for rank in range(world_size):
        neighbour = (rank + 1) % world_size
        chosen.add((min(rank, neighbour), max(rank, neighbour)))
        for peer in sampler.sample(range(world_size), min(sampled_peers_per_rank, world_size)):
            if peer != rank:
                chosen.add((min(rank, peer), max(rank, peer)))
    return sorted(chosen)


def _defaults(settings: ProbeSettings, device_type: str, world_size: int) -> dict:
    small = device_type == "cpu"
    groups = settings.group_sizes or tuple(
        2**k for k in range(1, world_size.bit_length()) if 2**k <= world_size
    )
    bad = [size for size in groups if not 2 <= size <= world_size]
    if bad:
        raise ValueError(f"group_sizes ({bad}) must be between 2 and the world size ({world_size})")
    return {
        "p2p": settings.p2p_message_bytes or (1 << 20 if small else 64 << 20),
        "sizes": settings.collective_message_bytes
        or ((1 << 16, 1 << 20) if small else (1 << 20, 16 << 20, 256 << 20)),
        "groups": groups,
        "dim": settings.matmul_dim or (256 if small else 8192),
        "dtypes": settings.matmul_dtypes
        or (("fp32", "bf16") if small else ("bf16", "fp16", "fp32")),
        "copy": settings.copy_bytes or (16 << 20 if small else 1 << 30),
    }


def probe_rank(
    rank: int,
    world_size: int,
    *,
    settings: ProbeSettings | None = None,
    hooks: ProbeHooks | None = None,
    base: Cluster | None = None,
    progress: Progress | None = None,
) -> ProbeReport | None:
    """One rank's share of a probe, in an initialized default process group. Returns the
    ``ProbeReport`` on rank 0 and ``None`` elsewhere; raises ``ProbeRankError`` naming the
    ranks that stopped answering (within about twice ``operation_timeout_s``)."""
    import torch.distributed as dist

    from topology import devices
    from topology import probe_measure as measure

    settings, hooks = settings or ProbeSettings(), hooks or ProbeHooks()
    device, backend = devices.device_and_backend()
    chosen = _defaults(settings, device.type, world_size)
    names = [
        settings.run_name or datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    ]
    dist.broadcast_object_list(names, src=0)  # one name (and store prefix) for every rank
    run_name: str = names[0]
    monitor = measure.RankMonitor(
        rank=rank,
        world_size=world_size,
        timeout_s=settings.operation_timeout_s,
        prefix=f"autoparallel-probe/{run_name}",
        stop_silent_local_ranks=settings.stop_silent_local_ranks,
    )
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    steps = _Steps(
        rank=rank, hooks=hooks, progress=progress, total=_count_steps(world_size, settings, chosen)
    )
    # Every blocking call without a timeout (group creation, object gather) sits right behind a
    # timed barrier, so a rank that dies mid-probe is caught by a timed operation.
    _timed_barrier(monitor, device, "start")
    groups = {size: dist.new_group(list(range(size))) for size in chosen["groups"]}
    links = _measure_p2p(rank, world_size, settings, chosen, monitor, device, hooks, steps)
    collectives = _measure_collectives(
        rank, settings, chosen, groups, monitor, device, local_world, steps
    )
    compute = _measure_compute(rank, settings, chosen, device, steps)
    _timed_barrier(monitor, device, "finish")
    gathered: list[Any] | None = [None] * world_size if rank == 0 else None
    monitor.run("gather results", lambda: dist.gather_object((links, compute), gathered, dst=0))
    monitor.finished()
    if rank != 0:
        return None
    assert gathered is not None  # rank 0 gathers
    all_links = [link for part, _ in gathered for link in part]
    all_compute = [row for _, part in gathered for row in part]
    identity = _Identity(
        run_name,
        backend,
        device.type,
        devices.device_name(device),
        devices.device_memory_bytes(device, ranks_per_host=local_world),
        world_size,
        local_world,
    )
    cluster = build_cluster(
        identity=identity, links=all_links, collectives=collectives, compute=all_compute, base=base
    )
    return ProbeReport(
        run_name=run_name,
        backend=backend,
        device_type=device.type,
        world_size=world_size,
        devices_per_node=cluster.devices_per_node,
        p2p=tuple(all_links),
        collectives=tuple(collectives),
        compute=tuple(all_compute),
        cluster=cluster,
    )


def _timed_barrier(monitor, device, label: str) -> None:
    import torch
    import torch.distributed as dist

    flag = torch.ones(1, device=device)
    monitor.run(f"barrier ({label})", lambda: monitor.wait(dist.all_reduce(flag, async_op=True)))


@dataclass
class _Steps:
    rank: int
    hooks: ProbeHooks
    progress: Progress | None
    total: int
    done: int = 0

    def begin(self, label: str) -> None:
        if self.hooks.before_step is not None:
            self.hooks.before_step(label)

    def end(self, label: str) -> None:
        self.done += 1
        if self.progress is not None and self.rank == 0:
            self.progress(label, self.done, self.total)


def _count_steps(world_size: int, settings: ProbeSettings, chosen: dict) -> int:
    pairs = len(
        probe_pairs(
            world_size,
            max_all_pairs_ranks=settings.max_all_pairs_ranks,
            sampled_peers_per_rank=settings.sampled_peers_per_rank,
        )
    )
    rank0_pairs = world_size - 1 if world_size <= settings.max_all_pairs_ranks else pairs
    return (
        rank0_pairs
        + len(chosen["groups"]) * len(chosen["sizes"]) * len(settings.collective_ops)
        + len(chosen["dtypes"])
        + 1
    )


def _measure_p2p(
    rank, world_size, settings, chosen, monitor, device, hooks, steps
) -> list[DeviceLink]:
    import torch

    from topology import probe_measure as measure

    payload = torch.ones(max(1, chosen["p2p"] // 4), dtype=torch.float32, device=device)
    token = torch.zeros(1, dtype=torch.float32, device=device)
    links = []
    pairs = probe_pairs(
        world_size,
        max_all_pairs_ranks=settings.max_all_pairs_ranks,
        sampled_peers_per_rank=settings.sampled_peers_per_rank,
    )
    for a, b in pairs:
        if rank not in (a, b):
            continue
        label = f"p2p {a}<->{b}"
        steps.begin(label)
        for sender, receiver in ((a, b), (b, a)):
            common = dict(
                monitor=monitor,
                sender=sender,
                receiver=receiver,
                token=token,
                repeats=settings.repeats,
                warmup=settings.warmup,
                device=device,
            )
            samples = monitor.run(
                label,
                lambda c=common: measure.time_pair(
                    payload=payload, before_send=hooks.before_send, **c
                ),
                peers=(a, b),
            )
            pings = monitor.run(label, lambda c=common: measure.time_ping(**c), peers=(a, b))
            if rank == sender:
                timing = measure.Timing.of(samples)
                links.append(
                    DeviceLink(
                        from_device=sender,
                        to_device=receiver,
                        spread=timing.spread,
                        bandwidth_bytes_per_s=payload.numel() * 4 / timing.median_s,
                        latency_s=measure.Timing.of(pings).median_s,
                        source="measured",
                    )
                )
        steps.end(label)
    return links


def _measure_collectives(
    rank, settings, chosen, groups, monitor, device, local_world, steps
) -> list[CollectiveResult]:
    from topology import probe_measure as measure
    from topology._collectives import bus_factor

    results = []
    for group_size, group in groups.items():
        members = list(range(group_size))
        for op in settings.collective_ops:
            for size in chosen["sizes"]:
                label = f"{op} x{group_size} {size} B"
                steps.begin(label)
                if rank in members:
                    samples = monitor.run(
                        label,
                        lambda o=op, s=size, g=group, n=group_size: measure.time_collective(
                            monitor=monitor,
                            op=o,
                            group=g,
                            group_size=n,
                            message_bytes=s,
                            repeats=settings.repeats,
                            warmup=settings.warmup,
                            device=device,
                        ),
                        peers=members,
                    )
                    timing = measure.Timing.of(samples)
                    results.append(
                        CollectiveResult(
                            op=op,
                            group_size=group_size,
                            ranks_per_node=min(group_size, local_world),
                            message_bytes=size,
                            median_s=timing.median_s,
                            spread=timing.spread,
                            bus_bandwidth_bytes_per_s=float(
                                size * bus_factor(op, group_size) / timing.median_s
                            ),
                        )
                    )
                steps.end(label)
    return results if rank == 0 else []


def _measure_compute(rank, settings, chosen, device, steps) -> list[ComputeResult]:
    from topology import probe_measure as measure

    rows = []
    for dtype in chosen["dtypes"]:
        steps.begin(f"matmul {dtype}")
        samples, flops = measure.time_matmul(
            dtype_name=dtype,
            dim=chosen["dim"],
            repeats=settings.repeats,
            warmup=settings.warmup,
            device=device,
        )
        timing = measure.Timing.of(samples)
        rows.append(
            ComputeResult(
                rank=rank,
                kind=f"matmul_{dtype}",
                rate_per_s=flops / timing.median_s,
                spread=timing.spread,
            )
        )
        steps.end(f"matmul {dtype}")
    steps.begin("memory copy")
    samples, moved = measure.time_copy(
        num_bytes=chosen["copy"], repeats=settings.repeats, warmup=settings.warmup, device=device
    )
    timing = measure.Timing.of(samples)
    rows.append(
        ComputeResult(
            rank=rank, kind="memory_copy", rate_per_s=moved / timing.median_s, spread=timing.spread
        )
    )
    steps.end("memory copy")
    return rows


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
                "links": (),
                "device": device.model_dump(),
                "provenance": f"{where}; links from {base.name}",
            }
        )
    links = [link.model_copy(update={"source": where}) for link in links]
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
        intra_node=intra,
        inter_node=inter,
        network_topology="single_node" if not across else "rail_optimized",
        provenance=where,
        links=tuple(links),
    )


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


def probe(
    *,
    settings: ProbeSettings | None = None,
    base: Cluster | None = None,
    output: str | Path | None = None,
    report: str | Path | None = None,
    progress: Progress | None = None,
    hooks: ProbeHooks | None = None,
) -> ProbeReport | None:
    """Probe the cluster this process belongs to (run it in every rank, e.g. under torchrun).

    Initializes the default process group from the environment when needed (the device's
    default backend) and tears it down again if it did. Rank 0 writes the cluster JSON to
    ``output`` and the full report to ``report`` and returns the ``ProbeReport``; other ranks
    return ``None``. Raises ``ProbeRankError`` naming a rank that died or hung.
    """
    import torch.distributed as dist

    from topology import devices
    from topology import probe_measure as measure

    settings = settings or ProbeSettings()
    created = not dist.is_initialized()
    if created:
        devices.bind_local_device()
        _device_, backend = devices.device_and_backend()
        dist.init_process_group(
            backend, timeout=datetime.timedelta(seconds=max(settings.operation_timeout_s * 4, 60))
        )
    try:
        result = probe_rank(
            dist.get_rank(),
            dist.get_world_size(),
            settings=settings,
            base=base,
            progress=progress,
            hooks=hooks,
        )
    except measure.ProbeRankError:
        # The process group is broken: tearing it down would wait for the silent rank forever.
        raise
    except BaseException:
        if created:
            dist.destroy_process_group()
        raise
    if result is not None and output is not None:
        result.cluster.save(output)
    if result is not None and report is not None:
        result.save(report)
    if created:
        dist.destroy_process_group()
    return result
