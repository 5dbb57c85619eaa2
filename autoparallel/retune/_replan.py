"""Re-planning a running job, torch-free: a plan for one config, the live variants of a running
plan (other micro-batch or batch sizes on the same mesh), a warm-started re-search, and the
largest legal world a set of surviving ranks allows."""

from __future__ import annotations

import logging
from typing import Any

from autoparallel._plan import Provenance, ShardingPlan
from cost_model import InfeasiblePlanError, Inference, ModelSpec, ParallelConfig, Training

logger = logging.getLogger("autoparallel.retune")

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
    extras: dict[str, Any] | None = None, like: ShardingPlan | None = None, predicted=None,  # noqa: ANN001
) -> ShardingPlan:
    """A ``ShardingPlan`` for one given config, built by the planner's pure functions; provenance
    is copied from ``like`` when given (a re-planned variant of a running plan). ``predicted``
    (a ``CostBreakdown`` already computed for this config) skips ``cost_model.estimate``.

    Raises:
        InfeasiblePlanError: the config does not fit (from ``cost_model.estimate``).
    """
    import cost_model
    from autoparallel import _planner

    extras = dict(extras or {})
    estimate_extras = {k: extras[k] for k in ("batch_size", "kv_dtype", "num_redundant_experts") if k in extras}
    if predicted is None:
        predicted = cost_model.estimate(model, cluster, workload, config, **estimate_extras)
    serving = None
    if "batch_size" in extras:
        from autoparallel._plan import ServingSettings

        serving = ServingSettings(batch_size=max(int(extras["batch_size"]) or int(predicted.batch_size or 1), 1),
                                  kv_dtype=str(extras.get("kv_dtype", "bf16")),
                                  num_redundant_experts=int(extras.get("num_redundant_experts", 0)))
    provenance = like.provenance if like is not None else Provenance(
        library_version="", model_name=model.name, model_fingerprint=model.fingerprint(), cluster_name=cluster.name,
        cluster_fingerprint=cluster.fingerprint(), workload=workload.model_dump(mode="json"),
    )
    if like is not None and (like.world_size != config.world_size or like.provenance.cluster_fingerprint != cluster.fingerprint()):
        provenance = provenance.model_copy(update={"cluster_name": cluster.name, "cluster_fingerprint": cluster.fingerprint()})
    return ShardingPlan(
        provenance=provenance, world_size=config.world_size, config=config,
        mesh_axes=_planner.dense_mesh_axes(config),
        moe_mesh_axes=_planner.moe_mesh_axes(config) if model.moe is not None else (),
        rank_to_device=_planner.rank_to_device(cluster=cluster, config=config),
        stages=_planner.pipeline_stages(num_layers=model.num_layers, config=config),
        expert_placement=_planner.expert_placement(model=model, config=config, extras=extras),
        module_rules=_planner.module_rules(model=model, config=config),
        predicted=predicted, serving=serving,
    )


def live_variant_plans(*, plan: ShardingPlan, model: ModelSpec, cluster, workload: Training | Inference,  # noqa: ANN001
                       space) -> list[ShardingPlan]:  # noqa: ANN001 - search.SearchSpace
    """``plan``'s mesh with other micro-batch sizes (training) or batch sizes (inference): the
    legal rows of ``space`` that differ from the running plan only there, priced with one
    ``cost_model.estimate_table`` call; infeasible rows are dropped."""
    from cost_model import estimate_table
    from cost_model._estimate import breakdown_from_row
    from search._space import config_from_row, row_extras, select

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
        plan_for_config(model=model, cluster=cluster, workload=workload, config=config_from_row(table, row),
                        extras=row_extras(table, row), like=plan, predicted=breakdown_from_row(columns, row))
        for row in range(len(rows))
        if bool(columns["feasible"][row])
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
        extras = {} if alternative.serving is None else alternative.serving.model_dump()
        try:
            plans.append(plan_for_config(model=model, cluster=cluster, workload=workload, config=alternative.config,
                                         extras=extras, like=best, predicted=alternative.predicted))
        except InfeasiblePlanError as error:  # a runner-up that does not fit is no candidate
            logger.info("re-plan: alternative %s skipped: %s", alternative.config, error)
    return plans
