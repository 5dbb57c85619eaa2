"""``launch_profile``: run ``profile_hardware`` in this process, under torchrun, or in forked ranks.

Under torchrun (``WORLD_SIZE`` set) each launched process joins the process group and measures;
otherwise ``num_processes`` gloo/default-backend ranks are forked on this host
(``autoparallel.runtime.run_ranks``: fork start-up costs milliseconds where spawn costs seconds).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from profilers._ops import ProfileGrid
from topology import HardwareProfile

#: ``on_progress(done, total, label)``, called on rank 0 after each measured point.
ProgressCallback = Callable[[int, int, str], None]


def _run_on_rank(
    grid: ProfileGrid, threads_per_rank: int, on_progress: ProgressCallback | None, clock: str
) -> HardwareProfile:
    import torch
    import torch.distributed as dist

    from profilers._hardware import count_points, profile_hardware

    torch.set_num_threads(threads_per_rank)
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    total, done = count_points(grid, world), [0]

    def advance(label: str) -> None:
        done[0] += 1
        if on_progress is not None and rank == 0:
            on_progress(done[0], total, label)

    return profile_hardware(grid=grid, progress=advance, clock=clock)


def _forked_rank(
    rank: int, world_size: int, grid: ProfileGrid, threads: int, on_progress, clock: str
) -> HardwareProfile:
    return _run_on_rank(grid, threads, on_progress, clock)


def launch_profile(
    *,
    grid: ProfileGrid,
    num_processes: int = 1,
    threads_per_rank: int = 1,
    timeout_s: float = 1800.0,
    on_progress: ProgressCallback | None = None,
    clock: str = "auto",
) -> HardwareProfile:
    """Measure ``grid`` and return the profile (every rank returns the same one under torchrun).

    Raises ``ValueError`` for ``num_processes`` or ``threads_per_rank`` below 1.
    """
    if num_processes < 1:
        raise ValueError(f"num_processes ({num_processes}) must be >= 1")
    if threads_per_rank < 1:
        raise ValueError(f"threads_per_rank ({threads_per_rank}) must be >= 1")
    if "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
        return _under_torchrun(grid, threads_per_rank, on_progress, clock)
    if num_processes == 1:
        return _run_on_rank(grid, threads_per_rank, on_progress, clock)
    from autoparallel.runtime import run_ranks

    results = run_ranks(
        _forked_rank,
        num_processes,
        args=(grid, threads_per_rank, on_progress, clock),
        timeout_s=timeout_s,
        collective_timeout_s=max(60.0, timeout_s / 4),
        backend=_default_backend(),
    )
    return results[0]


def _default_backend() -> str:
    import torch
    import torch.distributed as dist

    from profilers._timing import current_device

    return (
        dist.get_default_backend_for_device(current_device())
        if hasattr(dist, "get_default_backend_for_device")
        else ("nccl" if torch.cuda.is_available() else "gloo")
    )


def _under_torchrun(
    grid: ProfileGrid, threads_per_rank: int, on_progress, clock: str
) -> HardwareProfile:
    import torch
    import torch.distributed as dist

    from profilers._timing import current_device

    device = current_device()
    if device.type != "cpu":
        torch.get_device_module(device).set_device(int(os.environ.get("LOCAL_RANK", "0")))
    created = not dist.is_initialized()
    if created:
        dist.init_process_group(_default_backend())
    try:
        return _run_on_rank(grid, threads_per_rank, on_progress, clock)
    finally:
        if created:
            dist.barrier()
            dist.destroy_process_group()
