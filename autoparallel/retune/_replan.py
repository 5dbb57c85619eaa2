"""Re-planning a running job, torch-free: a plan for one config, the live variants of a running
plan (other micro-batch or batch sizes on the same mesh), a warm-started re-search, and the
largest legal world a set of surviving ranks allows."""

from __future__ import annotations

import logging

from autoparallel.plan import PlanRecord, ShardingPlan, build_plan
from cost_model import (
    InfeasiblePlanError,
    Inference,
    Layout,
    ModelSpec,
    ParallelConfig,
    ServingConfig,
    Training,
)

logger = logging.getLogger("autoparallel.retune")


def cluster_for_world(cluster, world_size: int):  # topology.Cluster
    """``cluster`` resized to exactly ``world_size`` devices: whole nodes when it divides, else
    one node of ``world_size`` devices (the survivors of a partly lost node;
    ``Cluster.with_devices_per_node``)."""
    if world_size <= 0:
        raise ValueError(f"world_size ({world_size}) must be > 0")
    per_node = cluster.devices_per_node
    if world_size % per_node == 0:
        return cluster.with_nodes(world_size // per_node)
    if world_size < per_node:
        return cluster.with_nodes(1).with_devices_per_node(world_size)
    raise ValueError(
        f"world_size ({world_size}) must be a multiple of devices_per_node ({per_node}) or smaller than it"
    )


def largest_legal_world(
    *, model: ModelSpec, cluster, workload: Training | Inference, max_world_size: int
) -> int:
    """The largest ``w <= max_world_size`` with at least one legal layout (``search.SearchSpace``:
    the rules of ``cost_model._rules`` and the batch divisibility), e.g. 2 of 3 survivors when a
    model's heads and experts only split in powers of two and the batch does not divide by 3."""
    from search import SearchSpace

    for world in range(max_world_size, 0, -1):
        try:
            sized = cluster_for_world(cluster, world)
        except ValueError:
            continue
        space = SearchSpace(
            model=model,
            workload=workload,
            world_size=world,
            devices_per_node=sized.devices_per_node,
        )
        if space.num_meshes and space.size:
            return world
    raise ValueError(
        f"max_world_size ({max_world_size}) allows no legal layout of {model.name} for this workload"
    )


def plan_for_config(
    *,
    model: ModelSpec,
    cluster,
    workload: Training | Inference,
    config: ParallelConfig,
    serving: ServingConfig | None = None,
    like: ShardingPlan | None = None,
    predicted=None,
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
        record = PlanRecord(
            search=like.provenance.search,
            library_version=like.provenance.library_version,
            created_at=like.provenance.created_at,
        )
    return build_plan(
        model=model,
        cluster=cluster,
        job=workload,
        layout=Layout(config=config, serving=serving),
        predicted="estimate" if predicted is None else predicted,
        record=record,
    )


def live_variant_plans(
    *, plan: ShardingPlan, model: ModelSpec, cluster, workload: Training | Inference, space
) -> list[ShardingPlan]:  # search.SearchSpace
    """``plan``'s mesh with other micro-batch sizes (training) or batch sizes (inference): the
    legal rows of ``space`` that differ from the running plan only there, priced with one
    ``cost_model.estimate_table`` call; infeasible rows are dropped."""
    from cost_model import breakdown_from_row, estimate_table
    from search import layout_at, select

    config = plan.config
    mesh = space.find_mesh(
        dp=config.dp,
        tp=config.tp,
        pp=config.pp,
        cp=config.cp,
        ep=config.ep,
        etp=config.etp,
        attention_data_parallel=config.attention_data_parallel,
    )
    if mesh is None:
        return []
    table = space.expand([mesh])
    rows = [
        row
        for row in range(len(table["mesh_index"]))
        if _is_live_variant(plan, workload, table, row)
    ]
    if not rows:
        return []
    table = select(table, rows)
    columns = estimate_table(model, cluster, workload, table)
    return [
        plan_for_config(
            model=model,
            cluster=cluster,
            workload=workload,
            config=layout.config,
            serving=layout.serving,
            like=plan,
            predicted=breakdown_from_row(columns, row),
        )
        for row in range(len(rows))
        if bool(columns["feasible"][row])
        for layout in [layout_at(table, row)]
    ]


def _is_live_variant(plan: ShardingPlan, workload, table, row: int) -> bool:
    from search import config_from_row, row_extras

    config, candidate, extras = plan.config, config_from_row(table, row), row_extras(table, row)
    if isinstance(workload, Training):
        return candidate.model_copy(update={"micro_batch_size": config.micro_batch_size}) == config
    if candidate != config or plan.serving is None:
        return False
    return all(
        extras.get(k) == getattr(plan.serving, k)
        for k in ("kv_dtype", "num_redundant_experts")
        if k in extras
    )


def research_plans(
    *,
    plan: ShardingPlan,
    model: ModelSpec,
    cluster,
    workload: Training | Inference,
    n_trials: int,
    seed: int,
    bounds=None,
    estimator=None,  # search.SearchBounds, search Estimator
) -> list[ShardingPlan]:
    """Re-search warm-started from ``plan`` (its mesh is the study's first trial), within
    ``bounds``, pricing with ``estimator`` (e.g. a recalibrated cost model); returns the best plan
    and a plan for each ranked alternative (their ``predicted`` from the uncalibrated model)."""
    import autoparallel
    from search import SearchSettings

    settings = SearchSettings() if bounds is None else SearchSettings(bounds=bounds)
    best = autoparallel.find_plan(
        model,
        cluster,
        workload,
        n_trials=n_trials,
        seed=seed,
        warm_start=plan.config,
        settings=settings,
        estimator=estimator,
    )
    plans = [best]
    for alternative in best.alternatives:
        serving = None if alternative.serving is None else alternative.serving.serving_config()
        try:
            plans.append(
                plan_for_config(
                    model=model,
                    cluster=cluster,
                    workload=workload,
                    config=alternative.config,
                    serving=serving,
                    like=best,
                    predicted=alternative.predicted,
                )
            )
        except InfeasiblePlanError as error:  # a runner-up that does not fit is no candidate
            logger.info("re-plan: alternative %s skipped: %s", alternative.config, error)
    return plans
