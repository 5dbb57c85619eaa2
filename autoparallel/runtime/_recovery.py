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
import socket
from typing import Any, Iterator

from pydantic import BaseModel, ConfigDict

from autoparallel.plan import PlanRecord, ShardingPlan, build_plan, load_plan
from cost_model import InfeasiblePlanError, Inference, Layout, ModelSpec, ParallelConfig, ServingConfig, Training

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
        first_line = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        super().__init__(f"a peer rank was lost during step {step} ({type(cause).__name__}: {first_line}); {resume}")


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
    except Exception as error:  # noqa: BLE001 - classified, then re-raised
        if not _is_lost_peer(error):
            raise
        lost = RankLostError(step=step, checkpoint=None if checkpoint is None else str(checkpoint), cause=error)
        logger.error("%s", lost)
        raise lost from error


# ---------------------------------------------------------------------------- planning (torch-free)
def cluster_for_world(cluster, world_size: int):  # noqa: ANN001, ANN201 - topology.Cluster
    """``cluster`` resized to exactly ``world_size`` devices: whole nodes when it divides, else
    one node of ``world_size`` devices (the survivors of a partly lost node)."""
    if world_size <= 0:
        raise ValueError(f"world_size ({world_size}) must be > 0")
    per_node = cluster.devices_per_node
    if world_size % per_node == 0:
        return cluster.with_nodes(world_size // per_node)
    if world_size < per_node:
        data = cluster.model_dump()
        data.update(num_nodes=1, devices_per_node=world_size, name=f"{cluster.name.split('@')[0]}@{world_size}d")
        if "devices_per_nic" in data:  # the remaining devices share the node's NIC(s)
            data["devices_per_nic"] = min(data["devices_per_nic"], world_size)
        if "links" in data:  # measured device-to-device links among the remaining devices only
            data["links"] = [link for link in data["links"] if max(link["from_device"], link["to_device"]) < world_size]
        return type(cluster).model_validate(data)
    raise ValueError(
        f"world_size ({world_size}) must be a multiple of devices_per_node ({per_node}) or smaller than it"
    )


def largest_legal_world(*, model: ModelSpec, cluster, workload: Training | Inference, max_world_size: int) -> int:  # noqa: ANN001
    """The largest ``w <= max_world_size`` with at least one legal layout (``search.SearchSpace``:
    the rules of ``cost_model._rules`` and the batch divisibility), e.g. 2 of 3 survivors when a
    model's heads and experts only split in powers of two and the batch does not divide by 3."""
    from search import SearchSpace

    for world in range(max_world_size, 0, -1):
        try:
            sized = cluster_for_world(cluster, world)
        except ValueError:
            continue
        space = SearchSpace(model=model, workload=workload, world_size=world, devices_per_node=sized.devices_per_node)
        if space.num_meshes and space.size:
            return world
    raise ValueError(f"max_world_size ({max_world_size}) allows no legal layout of {model.name} for this workload")


def plan_for_config(
    *, model: ModelSpec, cluster, workload: Training | Inference, config: ParallelConfig,  # noqa: ANN001
    serving: ServingConfig | None = None, like: ShardingPlan | None = None, predicted=None,  # noqa: ANN001
) -> ShardingPlan:
    """The ``ShardingPlan`` of one given layout, ``config`` with the inference ``serving``
    settings (``autoparallel.plan.build_plan``); the search
    record and time of creation are copied from ``like`` when given (a re-planned variant of a
    running plan). ``predicted`` (a ``CostBreakdown`` already computed for this layout on
    ``cluster``) skips ``cost_model.estimate``.

    Raises:
        InfeasiblePlanError: the layout does not fit (from ``cost_model.estimate``).
    """
    record = PlanRecord()
    if like is not None:
        record = PlanRecord(search=like.provenance.search, library_version=like.provenance.library_version,
                            created_at=like.provenance.created_at)
    return build_plan(model=model, cluster=cluster, job=workload, layout=Layout(config=config, serving=serving),
                      predicted="estimate" if predicted is None else predicted, record=record)


def live_variant_plans(*, plan: ShardingPlan, model: ModelSpec, cluster, workload: Training | Inference,  # noqa: ANN001
                       space) -> list[ShardingPlan]:  # noqa: ANN001 - search.SearchSpace
    """``plan``'s mesh with other micro-batch sizes (training) or batch sizes (inference): the
    legal rows of ``space`` that differ from the running plan only there, priced with one
    ``cost_model.estimate_table`` call; infeasible rows are dropped."""
    from cost_model import estimate_table
    from cost_model._estimate import breakdown_from_row
    from search._candidate import layout_at
    from search._space import select

    config = plan.config
    mesh = space.find_mesh(dp=config.dp, tp=config.tp, pp=config.pp, cp=config.cp, ep=config.ep, etp=config.etp,
                           attention_data_parallel=config.attention_data_parallel)
    if mesh is None:
        return []
    table = space.expand([mesh])
    rows = [row for row in range(len(table["mesh_index"])) if _is_live_variant(plan, workload, table, row)]
    if not rows:
        return []
    table = select(table, rows)
    columns = estimate_table(model, cluster, workload, table)
    return [
        plan_for_config(model=model, cluster=cluster, workload=workload, config=layout.config, serving=layout.serving,
                        like=plan, predicted=breakdown_from_row(columns, row))
        for row in range(len(rows))
        if bool(columns["feasible"][row])
        for layout in [layout_at(table, row)]
    ]


def _is_live_variant(plan: ShardingPlan, workload, table, row: int) -> bool:  # noqa: ANN001
    from search._space import config_from_row, row_extras

    config, candidate, extras = plan.config, config_from_row(table, row), row_extras(table, row)
    if isinstance(workload, Training):
        return candidate.model_copy(update={"micro_batch_size": config.micro_batch_size}) == config
    if candidate != config or plan.serving is None:
        return False
    return all(extras.get(k) == getattr(plan.serving, k) for k in ("kv_dtype", "num_redundant_experts") if k in extras)


def research_plans(
    *, plan: ShardingPlan, model: ModelSpec, cluster, workload: Training | Inference, n_trials: int, seed: int,  # noqa: ANN001
    bounds=None, estimator=None,  # noqa: ANN001 - search.SearchBounds, search Estimator
) -> list[ShardingPlan]:
    """Re-search warm-started from ``plan`` (its mesh is the study's first trial), within
    ``bounds``, pricing with ``estimator`` (e.g. a recalibrated cost model); returns the best plan
    and a plan for each ranked alternative (their ``predicted`` from the uncalibrated model)."""
    import autoparallel
    from search import SearchSettings

    settings = SearchSettings() if bounds is None else SearchSettings(bounds=bounds)
    best = autoparallel.find_plan(model, cluster, workload, n_trials=n_trials, seed=seed, warm_start=plan.config,
                                  settings=settings, estimator=estimator)
    plans = [best]
    for alternative in best.alternatives:
        serving = None if alternative.serving is None else alternative.serving.serving_config()
        try:
            plans.append(plan_for_config(model=model, cluster=cluster, workload=workload, config=alternative.config,
                                         serving=serving, like=best, predicted=alternative.predicted))
        except InfeasiblePlanError as error:  # a runner-up that does not fit is no candidate
            logger.info("re-plan: alternative %s skipped: %s", alternative.config, error)
    return plans


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


def job_from_plan(plan: ShardingPlan, *, model, cluster, workload):  # noqa: ANN001, ANN202
    """Model, cluster and workload a plan names, unless given."""
    from autoparallel._planner import resolve_cluster

    model = model or plan.model
    cluster = cluster or resolve_cluster(plan.provenance.cluster_name.split("@")[0])
    workload = workload or plan.job
    return model, cluster, workload


def rebuild_schedule(pipeline, *, plan: ShardingPlan, num_micro_batches: int) -> None:  # noqa: ANN001
    """Give a runtime ``Pipeline`` new stages and a schedule for ``num_micro_batches`` (the chunk
    modules, their weights and the pipeline group are kept)."""
    from autoparallel.runtime._pipeline import build_pipeline

    stage = pipeline.stages[0]
    rebuilt = build_pipeline(
        list(zip(pipeline.chunks, pipeline.modules)), plan=plan, pp_group=stage.group, device=stage.device,
        loss_fn=pipeline.schedule._loss_fn, num_micro_batches=num_micro_batches,
    )
    pipeline.plan, pipeline.stages, pipeline.schedule = plan, rebuilt.stages, rebuilt.schedule
    pipeline.num_micro_batches = num_micro_batches


def recover_job(checkpoint, *, build, model, cluster, workload, n_trials: int, seed: int, max_cp_degree):  # noqa: ANN001, ANN201
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
    model, cluster, workload = job_from_plan(info.plan, model=model, cluster=cluster, workload=workload)
    launched = dist.get_world_size()
    world = largest_legal_world(model=model, cluster=cluster, workload=workload, max_world_size=launched)
    sized = cluster_for_world(cluster, world)
    shared = [None]
    if dist.get_rank() == 0:
        warm = info.plan.config if info.plan.world_size == world else None
        settings = SearchSettings(bounds=SearchBounds(max_cp_degree=max_cp_degree))
        plan = autoparallel.find_plan(model, sized, workload, n_trials=n_trials, seed=seed, warm_start=warm, settings=settings)
        shared = [plan.to_json()]
    dist.broadcast_object_list(shared, src=0)
    plan = load_plan(shared[0])
    logger.info("recovery: checkpoint of step %d saved on %d ranks; %d launched; re-planned for %d ranks: %s",
                info.step, info.plan.world_size, launched, world, plan.config)
    if not shrink_world(world):
        return None
    built = build(plan)
    load_checkpoint(info.path, modules=built[0], optimizer=built[1], plan=plan)
    return plan, (model, sized, workload), built, info


# ---------------------------------------------------------------------------- process group
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def shrink_world(world_size: int, *, timeout_s: float = 60.0) -> bool:
    """Re-form the default process group with ranks ``0 .. world_size - 1``; the others leave it.

    Collective over the current group. Returns True on the ranks that are in the new group,
    False on the spares (which then have no default process group). Rank 0 chooses a fresh port
    on its host (``MASTER_ADDR``) for the new rendezvous.
    """
    import datetime

    import torch.distributed as dist

    rank, current = dist.get_rank(), dist.get_world_size()
    if not 0 < world_size <= current:
        raise ValueError(f"world_size ({world_size}) must be between 1 and the current world size ({current})")
    if world_size == current:
        return True
    port = [_free_port() if rank == 0 else None]
    dist.broadcast_object_list(port, src=0)
    backend = dist.get_backend()
    dist.barrier()
    dist.destroy_process_group()
    if rank >= world_size:
        logger.info("recovery: rank %d is a spare in a world of %d", rank, world_size)
        return False
    address = os.environ.get("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group(
        backend, init_method=f"tcp://{address}:{port[0]}", rank=rank, world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    os.environ.update(WORLD_SIZE=str(world_size), MASTER_PORT=str(port[0]))
    return True
