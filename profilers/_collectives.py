"""Collective curves: seconds per call over message sizes, for each op and group size.

Message size follows nccl-tests' "size" (``nccl-tests/doc/PERFORMANCE.md``), the convention of
``topology.Cluster.collective_time``: the full buffer per rank — all_reduce's buffer,
all_gather's *output*, reduce_scatter's *input*, all_to_all's send buffer, the bytes one
send/recv pair moves. The world is cut into consecutive groups of each size, all measuring at
once (as tensor-parallel groups do in a step); a point's time is the slowest rank's median.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from profilers._timing import Timing, measure

COLLECTIVE_OPS = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "send_recv",
    "broadcast",
)


@dataclass(frozen=True)
class CollectivePoint:
    op: str
    group_size: int
    message_bytes: int


def group_sizes(world_size: int) -> list[int]:
    """Powers of two from 2 up to ``world_size`` that divide it."""
    sizes, size = [], 2
    while size <= world_size:
        if world_size % size == 0:
            sizes.append(size)
        size *= 2
    return sizes


def collective_points(
    *, ops: tuple[str, ...], message_bytes: tuple[int, ...], world_size: int
) -> list[CollectivePoint]:
    for op in ops:
        if op not in COLLECTIVE_OPS:
            raise ValueError(f"collective_ops entry ({op!r}) must be one of {list(COLLECTIVE_OPS)}")
    return [
        CollectivePoint(op, size, nbytes)
        for size in group_sizes(world_size)
        for op in ops
        for nbytes in message_bytes
    ]


class GroupCache:
    """One process group per group size; every rank must create them in the same order."""

    def __init__(self) -> None:
        self._groups: dict[int, object] = {}

    def group_for(self, size: int):
        if size not in self._groups:
            world, rank = dist.get_world_size(), dist.get_rank()
            mine = None
            for start in range(0, world, size):
                group = dist.new_group(list(range(start, start + size)))
                if start <= rank < start + size:
                    mine = group
            self._groups[size] = mine
        return self._groups[size]


def _call(op: str, group, size: int, numel: int, device: torch.device) -> Callable[[], object]:
    local = dist.get_rank(group)
    numel = max(numel - numel % size, size)
    full = torch.ones(numel, device=device)
    part = torch.ones(numel // size, device=device)
    gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
    scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
    if op == "all_reduce":
        return lambda: dist.all_reduce(full, group=group)
    if op == "all_gather":
        return lambda: gather(full, part, group=group)
    if op == "reduce_scatter":
        return lambda: scatter(part, full, group=group)
    if op == "all_to_all":
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full, group=group)
    if op == "broadcast":
        return lambda: dist.broadcast(full, group_src=0, group=group)
    peer = local + 1 if local % 2 == 0 else local - 1
    if peer >= size:  # the odd one out of an odd group: idle
        return lambda: None
    if local % 2 == 0:
        return lambda: dist.send(full, group_dst=peer, group=group)
    return lambda: dist.recv(full, group_src=peer, group=group)


def measure_collective(
    point: CollectivePoint, *, groups: GroupCache, device: torch.device, warmup: int, repeats: int
) -> Timing:
    """Time one point on every rank; returns the slowest rank's timing (a max over ranks)."""
    group = groups.group_for(point.group_size)
    call = _call(point.op, group, point.group_size, max(point.message_bytes // 4, 1), device)
    dist.barrier()
    # One call per sample: back-to-back collectives would pipeline across samples.
    timing = measure(call, device=device, warmup=warmup, repeats=repeats, min_sample_s=0.0)
    values = torch.tensor([timing.median_s, timing.p10_s, timing.p90_s], dtype=torch.float64)
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return Timing(
        median_s=float(values[0]), p10_s=float(values[1]), p90_s=float(values[2]), repeats=repeats
    )
