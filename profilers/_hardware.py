"""``profile_hardware``: run the operator and collective points, return a ``HardwareProfile``.

Under ``torch.distributed`` every rank measures the operator points at the same time (ranks
share a host's cores and memory bandwidth in a real step too) and the per-rank medians are
averaged; collectives are measured per group size. Without a process group only the operator
points run.
"""

from __future__ import annotations

import datetime
import logging
import socket
from collections import defaultdict
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist

from profilers._collectives import GroupCache, collective_points, measure_collective
from profilers._ops import Point, ProfileGrid, operator_points, tiny_op_call
from profilers._timing import (
    Timing,
    cache_flusher,
    current_device,
    device_memory_bytes,
    device_name,
    measure,
)
from topology import HardwareProfile, MeasuredCurve

logger = logging.getLogger(__name__)

Progress = Callable[[str], None]


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _mean_over_ranks(timing: Timing) -> Timing:
    if not _distributed():
        return timing
    values = torch.tensor([timing.median_s, timing.p10_s, timing.p90_s], dtype=torch.float64)
    dist.all_reduce(values)
    values /= dist.get_world_size()
    return Timing(
        median_s=float(values[0]),
        p10_s=float(values[1]),
        p90_s=float(values[2]),
        repeats=timing.repeats,
    )


def _measure_point(
    point: Point, *, device: torch.device, grid: ProfileGrid, clock: str, flush=None
) -> Timing:
    call = point.build(device)
    if _distributed():
        dist.barrier()
    before = flush if point.cold else None
    return _mean_over_ranks(
        measure(
            call,
            device=device,
            warmup=grid.warmup,
            repeats=grid.repeats,
            clock=clock,
            before_each=before,
        )
    )


def _common_timestamp() -> str:
    """Rank 0's UTC time to the second, on every rank (the ranks start at slightly different
    moments, and every rank must return the same profile)."""
    now = torch.tensor(
        [datetime.datetime.now(datetime.timezone.utc).timestamp()], dtype=torch.float64
    )
    if _distributed():
        dist.broadcast(now, src=0)
    moment = datetime.datetime.fromtimestamp(int(now[0]), tz=datetime.timezone.utc)
    return moment.isoformat()


def resolve_clock(clock: str, device: torch.device) -> str:
    """``auto``: thread CPU time for single-threaded CPU kernels (robust to other jobs on the
    cores), else wall time."""
    if clock not in ("auto", "wall", "thread"):
        raise ValueError(f"clock ({clock!r}) must be one of ['auto', 'thread', 'wall']")
    if clock == "auto":
        return "thread" if device.type == "cpu" and torch.get_num_threads() == 1 else "wall"
    if clock == "thread" and device.type != "cpu":
        raise ValueError(
            f"clock ('thread') must be 'wall' on device type {device.type!r}: kernels run asynchronously"
        )
    return clock


def _curve(rows: list[tuple[float, Timing, str]], source: str) -> MeasuredCurve:
    """Sort by work; equal works (different shapes) keep the faster median."""
    merged: dict[float, tuple[Timing, str]] = {}
    for work, timing, label in rows:
        if work not in merged or timing.median_s < merged[work][0].median_s:
            merged[work] = (timing, label)
    works = sorted(merged)
    return MeasuredCurve(
        work=tuple(works),
        seconds=tuple(merged[w][0].median_s for w in works),
        spread=tuple(merged[w][0].spread for w in works),
        labels=tuple(merged[w][1] for w in works),
        source=source,
    )


def count_points(grid: ProfileGrid, world_size: int) -> int:
    """How many points ``profile_hardware`` measures (for a progress bar's total)."""
    collectives = collective_points(
        ops=grid.collective_ops, message_bytes=grid.collective_bytes, world_size=world_size
    )
    return len(operator_points(grid)) + (len(collectives) + 4 if world_size > 1 else 0) + 4


def profile_hardware(
    *, grid: ProfileGrid, progress: Progress | None = None, clock: str = "auto"
) -> HardwareProfile:
    """Measure ``grid`` on the current device (and process group, if any); every rank returns
    the same profile. ``progress(label)`` is called after each point. ``clock`` times operator
    points (``resolve_clock``); collectives are always timed by the wall clock."""
    device = current_device()
    clock = resolve_clock(clock, device)
    world = dist.get_world_size() if _distributed() else 1
    backend = dist.get_backend() if _distributed() else "none"
    when = _common_timestamp()
    source = (
        f"measured: autoparallel profile, {world} {device.type} rank(s), backend {backend}, "
        f"{torch.get_num_threads()} thread(s) per rank, operators timed by {clock} clock, "
        f"GEMMs with caches flushed ({grid.cache_flush_bytes / 2**20:.0f} MiB written before each), "
        f"host {socket.gethostname()}, {when}"
    )
    advance = progress or (lambda label: None)
    families = _operator_families(grid=grid, device=device, clock=clock, advance=advance)
    overhead = _mean_over_ranks(
        measure(
            tiny_op_call(device),
            device=device,
            warmup=grid.warmup,
            repeats=grid.repeats,
            clock=clock,
        )
    )
    advance("kernel overhead")
    eager_op = _eager_op_host_s(device)
    advance("eager inference dispatch")
    graph_floor = _graph_kernel_floor_s(device)
    advance("graph-replayed kernel floor")
    collectives = (
        _profile_collectives(grid=grid, device=device, source=source, advance=advance)
        if world > 1
        else {}
    )
    sharded, sharded_curve = 0.0, None
    if world > 1:
        sharded_curve = _sharded_curve(grid=grid, device=device, source=source)
        sharded = float(sorted(sharded_curve.seconds)[len(sharded_curve.seconds) // 2])
        advance("tensor-parallel module overhead")
    updates = _update_curves(grid=grid, device=device, source=source, clock=clock)
    advance("optimizer update and gradient accumulation")
    host = _host_overhead(
        grid=grid, device=device, source=source, clock=clock, world=world, advance=advance
    )

    def by_dtype(family: str) -> dict:
        return {key: _curve(rows, source) for (fam, key), rows in families.items() if fam == family}

    return HardwareProfile(
        device_type=device.type,
        device_name=device_name(device),
        num_threads=torch.get_num_threads(),
        torch_version=torch.__version__,
        created_utc=when,
        provenance=source,
        memory_bytes=device_memory_bytes(
            device, ranks_per_host=world if device.type == "cpu" else 1
        ),
        kernel_overhead_s=overhead.median_s,
        eager_op_host_s=eager_op,
        graph_kernel_floor_s=graph_floor,
        operator_clock=clock,
        sharded_module_overhead_s=sharded,
        sharded_linear=sharded_curve,
        gemm=by_dtype("gemm"),
        attention=by_dtype("attention"),
        grouped_gemm=by_dtype("grouped_gemm"),
        memory=_curve(families[("memory", "")], source),
        norm=_curve(families[("norm", "")], source) if families.get(("norm", "")) else None,
        collectives=collectives,
        optimizer=updates[0],
        gradient_accumulation=updates[1],
        host=host,
    )


def _operator_families(
    *, grid: ProfileGrid, device: torch.device, clock: str, advance: Progress
) -> dict[tuple[str, str], list]:
    """Every operator point of ``grid`` timed, grouped by (family, key): (work, timing, label)."""
    families: dict[tuple[str, str], list] = defaultdict(list)
    flush = cache_flusher(device, grid.cache_flush_bytes)
    for point in operator_points(grid):
        try:
            timing = _measure_point(point, device=device, grid=grid, clock=clock, flush=flush)
        except (RuntimeError, NotImplementedError):  # a kernel this device lacks (fp8 GEMMs)
            if not point.optional:
                raise
            advance(f"{point.family} {point.key} {point.label} (not run here)")
            continue
        if point.kernels > 1:  # a curve's x axis is the work of one kernel, as the model asks
            timing = timing.per_kernel(point.kernels)
        families[(point.family, point.key)].append((point.work, timing, point.label))
        advance(f"{point.family} {point.key} {point.label}".replace("  ", " "))
    return families


def _eager_op_host_s(device: torch.device) -> float:
    """Host seconds per eagerly launched inference op (``profilers._host``), rank mean."""
    from profilers._host import eager_op_host_seconds

    return _mean_seconds([eager_op_host_seconds(device=device)])[0]


def _graph_kernel_floor_s(device: torch.device) -> float | None:
    """GPU seconds per graph-replayed tiny kernel (``profilers._host``), rank mean; None
    without CUDA graphs."""
    from profilers._host import graph_kernel_floor_seconds

    floor = graph_kernel_floor_seconds(device=device)
    return None if floor is None else _mean_seconds([floor])[0]


def _training_dtype(grid: ProfileGrid) -> torch.dtype:
    from profilers._ops import TORCH_DTYPES

    return TORCH_DTYPES[
        "bf16" if "bf16" in grid.dtypes else "fp32"
    ]  # the training precision when measured


def _mean_seconds(values: list[float]) -> list[float]:
    """Each value averaged over the ranks (they measured at the same time, as in a real step)."""
    if not _distributed():
        return values
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor)
    return (tensor / dist.get_world_size()).tolist()


def _update_curves(
    *, grid: ProfileGrid, device: torch.device, source: str, clock: str
) -> tuple[MeasuredCurve, MeasuredCurve]:
    """(optimizer, gradient accumulation) curves (``profilers._host``)."""
    from profilers._host import update_points

    if _distributed():
        dist.barrier()
    curves = []
    for rows in update_points(
        parameters=grid.optimizer_parameters,
        device=device,
        dtype=_training_dtype(grid),
        clock=clock,
        warmup=grid.warmup,
        repeats=grid.repeats,
    ):
        seconds = _mean_seconds([s for _, s, _ in rows])
        timings = [
            (work, Timing(median_s=t, p10_s=t, p90_s=t, repeats=grid.repeats), label)
            for (work, _, label), t in zip(rows, seconds)
        ]
        curves.append(_curve(timings, source))
    return curves[0], curves[1]


def _host_overhead(
    *,
    grid: ProfileGrid,
    device: torch.device,
    source: str,
    clock: str,
    world: int,
    advance: Progress,
):
    """``HostOverhead``: layer host costs on every rank (averaged), and with ranks the
    tensor-parallel weight update and pipeline micro-batch costs (``profilers._host``)."""
    from profilers._host import (
        collective_sync_seconds,
        layer_host_seconds,
        pipeline_micro_batch_seconds,
        sharded_update_seconds,
    )
    from topology import HostOverhead

    if _distributed():
        dist.barrier()
    layers = layer_host_seconds(
        device=device,
        dtype=_training_dtype(grid),
        clock=clock,
        warmup=grid.warmup,
        repeats=grid.repeats,
    )
    names = sorted(layers)
    fields = dict(zip(names, _mean_seconds([layers[name] for name in names])))
    advance("decoder layer host cost")
    if world > 1:
        fields["sharded_parameter_update_s"] = sharded_update_seconds(
            device=device,
            dtype=_training_dtype(grid),
            clock=clock,
            warmup=grid.warmup,
            repeats=grid.repeats,
        )
        advance("tensor-parallel weight update")
        fields["pipeline_micro_batch_s"] = pipeline_micro_batch_seconds(
            device=device, warmup=grid.warmup, repeats=grid.repeats
        )
        advance("pipeline schedule per micro-batch")
        fields["collective_sync_s"] = collective_sync_seconds(
            device=device, dtype=_training_dtype(grid), warmup=grid.warmup, repeats=grid.repeats
        )
        advance("collective after compute")
    return HostOverhead(**fields, source=source + ", runtime modules at a vanishing size")


def _sharded_curve(*, grid: ProfileGrid, device: torch.device, source: str) -> MeasuredCurve:
    from profilers._ops import TORCH_DTYPES
    from profilers._sharded import sharded_linear_points

    dtype = TORCH_DTYPES[
        "bf16" if "bf16" in grid.dtypes else "fp32"
    ]  # the training precision when measured
    points = sorted(
        sharded_linear_points(
            device=device,
            warmup=grid.warmup,
            repeats=grid.repeats,
            dtype=dtype,
            widths=grid.sharded_linear_widths,
        )
    )
    # Each point is a difference of wall-clock medians (sharded - unsharded/world - all-reduces):
    # noise can push one near zero. The extra cost of a sharded linear does not fall as its
    # activation grows, so each point is held at least at the smaller sizes' (a running max).
    envelope = np.maximum.accumulate([seconds for _, seconds, _ in points])
    timings = [
        (
            work,
            Timing(median_s=float(s), p10_s=float(s), p90_s=float(s), repeats=grid.repeats),
            label,
        )
        for (work, _, label), s in zip(points, envelope)
    ]
    return _curve(
        timings, source + ", tensor-parallel linear overhead by wall clock (running max over sizes)"
    )


def _profile_collectives(
    *, grid: ProfileGrid, device: torch.device, source: str, advance: Progress
) -> dict:
    groups = GroupCache()
    rows: dict[tuple[str, int], list] = defaultdict(list)
    points = collective_points(
        ops=grid.collective_ops,
        message_bytes=grid.collective_bytes,
        world_size=dist.get_world_size(),
    )
    for point in points:
        timing = measure_collective(
            point, groups=groups, device=device, warmup=grid.warmup, repeats=grid.repeats
        )
        rows[(point.op, point.group_size)].append(
            (float(point.message_bytes), timing, f"{point.message_bytes} B")
        )
        advance(f"{point.op} n={point.group_size} {point.message_bytes} B")
    curves: dict[str, dict[int, MeasuredCurve]] = defaultdict(dict)
    for (op, size), op_rows in rows.items():
        curves[op][size] = _curve(op_rows, source)
    return dict(curves)
