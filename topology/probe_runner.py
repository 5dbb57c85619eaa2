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

The settings and result records live in ``_probe_types``, the measuring steps in
``_probe_steps`` and the cluster built from the results in ``_probe_cluster``; this module
keeps the names its callers import (``probe``, ``probe_rank``, ``probe_pairs``,
``build_cluster`` and the records).
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any

from topology._cluster import Cluster
from topology._probe_cluster import _Identity, build_cluster
from topology._probe_steps import (
    _count_steps,
    _defaults,
    _measure_collectives,
    _measure_compute,
    _measure_p2p,
    _Steps,
    _timed_barrier,
    probe_pairs,
)
from topology._probe_types import (
    CollectiveResult,
    ComputeResult,
    ProbeHooks,
    ProbeReport,
    ProbeSettings,
    Progress,
)

__all__ = [
    "CollectiveResult",
    "ComputeResult",
    "ProbeHooks",
    "ProbeReport",
    "ProbeSettings",
    "build_cluster",
    "probe",
    "probe_pairs",
    "probe_rank",
]


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
