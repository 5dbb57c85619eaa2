"""The measuring steps of one probe rank: which pairs, collectives and kernels, in which order.

Every rank walks the same global order of steps (deadlock-free): point-to-point bandwidth of
every ordered pair of ranks up to ``max_all_pairs_ranks`` (beyond it each rank's ring neighbours
and a deterministic sample of others); collective time and nccl-tests bus bandwidth by group
size (ranks ``0..g-1``) and message size; per-device matmul FLOP/s by dtype and memory (copy)
bandwidth. Each step runs under the ``RankMonitor``'s timeout, so a rank that dies or hangs is
named. ``topology.probe_measure`` does the timing; torch is imported only inside the steps.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from topology._cluster import DeviceLink
from topology._probe_types import (
    CollectiveResult,
    ComputeResult,
    ProbeHooks,
    ProbeSettings,
    Progress,
)

__all__ = ["probe_pairs"]


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
