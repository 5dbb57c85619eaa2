"""Failure recovery and re-planning: a lost rank ends the job with a clear message; relaunched on
the survivors, the job re-plans for the largest legal world they allow, shrinks the process group
to it, and continues from the last complete checkpoint.

The planning helpers here (``largest_legal_world``, ``cluster_for_world``, ``plan_for_config``,
``research_plans``) are torch-free; ``shrink_world`` and ``guard_step`` touch torch.distributed
(imported lazily).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict

from autoparallel.plan import ShardingPlan, load_plan
from autoparallel.retune._replan import (
    cluster_for_world,
    largest_legal_world,
    live_variant_plans,
    plan_for_config,
    research_plans,
)
from autoparallel.runtime._ranks import rendezvous_store

__all__ = [
    "RankLostError",
    "Recovery",
    "cluster_for_world",
    "guard_step",
    "job_from_plan",
    "largest_legal_world",
    "live_variant_plans",
    "plan_for_config",
    "rebuild_schedule",
    "recover_job",
    "research_plans",
    "shrink_world",
]

logger = logging.getLogger(__name__)

# Text of the errors a collective raises when a peer process is gone (gloo, NCCL, the TCP store).
_LOST_PEER_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "Connection refused",
    "Timed out",
    "timed out",
    "remote process exited",
    "NCCL communicator was aborted",
    "DistNetworkError",
)


class RankLostError(RuntimeError):
    """A peer rank died: the job stops, and says how to continue."""

    def __init__(self, *, step: int, checkpoint: str | None, cause: BaseException) -> None:
        self.step, self.checkpoint, self.cause = step, checkpoint, cause
        resume = (
            f"relaunch the job on the remaining ranks and call Retuner.recover({checkpoint!r}) to continue from "
            "its last complete checkpoint"
            if checkpoint
            else "no checkpoint was configured, so the progress of this run is lost"
        )
        first_line = (
            str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        )
        super().__init__(
            f"a peer rank was lost during step {step} ({type(cause).__name__}: {first_line}); {resume}"
        )


def _is_lost_peer(error: BaseException) -> bool:
    text = f"{type(error).__name__}: {error}"
    return any(marker in text for marker in _LOST_PEER_MARKERS)


@contextlib.contextmanager
def guard_step(*, step: int, checkpoint: str | os.PathLike | None = None) -> Iterator[None]:
    """Run one step; if a collective fails because a peer is gone, raise ``RankLostError`` with
    the step, the cause and how to resume. Other errors pass through unchanged."""
    try:
        yield
    except RankLostError:
        raise
    except Exception as error:  # classified, then re-raised
        if not _is_lost_peer(error):
            raise
        lost = RankLostError(
            step=step, checkpoint=None if checkpoint is None else str(checkpoint), cause=error
        )
        logger.error("%s", lost)
        raise lost from error


class Recovery(BaseModel):
    """What ``Retuner.recover`` restored: the new plan and Retuner, ``build``'s result, and the
    checkpoint's step and extra state (training continues at ``step + 1``)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    retuner: Any
    plan: ShardingPlan
    built: Any
    step: int
    extra: dict[str, Any]
    world_size: int
    previous_world_size: int


def job_from_plan(plan: ShardingPlan, *, model, cluster, workload):
    """Model, cluster and workload a plan names, unless given; a serving plan's workload keeps
    the KV-cache dtype the plan runs (its serving settings), not only the one its job named."""
    from autoparallel._planner import resolve_cluster

    model = model or plan.model
    cluster = cluster or resolve_cluster(plan.provenance.cluster_name.split("@")[0])
    if workload is None:
        workload = plan.job
        if plan.serving is not None:
            workload = workload.model_copy(update={"kv_dtype": plan.serving.kv_dtype})
    return model, cluster, workload


def rebuild_schedule(pipeline, *, plan: ShardingPlan, num_micro_batches: int) -> None:
    """Give a runtime ``Pipeline`` new stages and a schedule for ``num_micro_batches`` (the chunk
    modules, their weights and the pipeline group are kept)."""
    from autoparallel.runtime._pipeline import build_pipeline

    stage = pipeline.stages[0]
    rebuilt = build_pipeline(
        list(zip(pipeline.chunks, pipeline.modules)),
        plan=plan,
        pp_group=stage.group,
        device=stage.device,
        loss_fn=pipeline.schedule._loss_fn,
        num_micro_batches=num_micro_batches,
    )
    pipeline.plan, pipeline.stages, pipeline.schedule = plan, rebuilt.stages, rebuilt.schedule
    pipeline.num_micro_batches = num_micro_batches


def recover_job(
    checkpoint, *, build, model, cluster, workload, n_trials: int, seed: int, max_cp_degree
):
    """The work of ``Retuner.recover``: read the last complete checkpoint, find the largest legal
    world the launched ranks allow, re-plan for it on rank 0 (warm-started from the old plan when
    the world is unchanged) and share the plan, shrink the process group, ``build(plan)`` and load
    the checkpoint. Returns ``(plan, (model, cluster, workload), built, info)``, or ``None`` on a
    spare rank. Collective."""
    import torch.distributed as dist

    import autoparallel
    from autoparallel.runtime._reshard import load_checkpoint, read_checkpoint_info
    from search import SearchBounds, SearchSettings

    info = read_checkpoint_info(checkpoint)
    model, cluster, workload = job_from_plan(
        info.plan, model=model, cluster=cluster, workload=workload
    )
    launched = dist.get_world_size()
    world = largest_legal_world(
        model=model, cluster=cluster, workload=workload, max_world_size=launched
    )
    sized = cluster_for_world(cluster, world)
    shared = [None]
    if dist.get_rank() == 0:
        warm = info.plan.config if info.plan.world_size == world else None
        settings = SearchSettings(bounds=SearchBounds(max_cp_degree=max_cp_degree))
        plan = autoparallel.find_plan(
            model, sized, workload, n_trials=n_trials, seed=seed, warm_start=warm, settings=settings
        )
        shared = [plan.to_json()]
    dist.broadcast_object_list(shared, src=0)
    plan = load_plan(shared[0])
    logger.info(
        "recovery: checkpoint of step %d saved on %d ranks; %d launched; re-planned for %d ranks: %s",
        info.step,
        info.plan.world_size,
        launched,
        world,
        plan.config,
    )
    if not shrink_world(world):
        return None
    built = build(plan)
    load_checkpoint(info.path, modules=built[0], optimizer=built[1], plan=plan)
    return plan, (model, sized, workload), built, info


# ---------------------------------------------------------------------------- process group
def shrink_world(world_size: int, *, timeout_s: float = 60.0) -> bool:
    """Re-form the default process group with ranks ``0 .. world_size - 1``; the others leave it.

    Collective over the current group. Returns True on the ranks that are in the new group,
    False on the spares (which then have no default process group). Rank 0 serves the new
    rendezvous store on its host (``MASTER_ADDR``) at a port the OS assigns as it binds, before
    the old group is destroyed, and broadcasts that port (``rendezvous_store``: a port chosen
    and released beforehand can be taken by another process in between).
    """
    import datetime

    import torch.distributed as dist

    rank, current = dist.get_rank(), dist.get_world_size()
    if not 0 < world_size <= current:
        raise ValueError(
            f"world_size ({world_size}) must be between 1 and the current world size ({current})"
        )
    if world_size == current:
        return True
    address = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port: list[int | None] = [None]

    def publish(bound: int) -> None:
        port[0] = bound

    store = None
    if rank == 0:
        store = rendezvous_store(
            0, world_size, timeout_s=timeout_s, publish=publish, lookup=lambda: None, host=address
        )
    dist.broadcast_object_list(port, src=0)
    backend = dist.get_backend()
    dist.barrier()
    dist.destroy_process_group()
    if rank >= world_size:
        logger.info("recovery: rank %d is a spare in a world of %d", rank, world_size)
        return False
    if store is None:
        store = rendezvous_store(
            rank,
            world_size,
            timeout_s=timeout_s,
            publish=publish,
            lookup=lambda: port[0],
            host=address,
        )
    dist.init_process_group(
        backend,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    os.environ.update(WORLD_SIZE=str(world_size), MASTER_PORT=str(port[0]))
    return True
