"""``autoparallel.find_plan``: search, then write the result down as a ``ShardingPlan``.

The plan is pure data built from pure functions of integers: stages from
``cost_model.split_layers``, the expert map from ``autoparallel._expert_placement``, module rules
from ``autoparallel._module_rules``, the predicted cost from ``cost_model.estimate``.
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
from typing import Any

from autoparallel._plan import (
    Alternative,
    ExpertPlacement,
    MeshAxis,
    ModuleRule,
    PhasePlan,
    Provenance,
    ServingSettings,
    ShardingPlan,
    StageLayers,
)
from cost_model import CostBreakdown, InfeasiblePlanError, Inference, ModelSpec, ParallelConfig, Training, split_layers
from cost_model._units import human_bytes
from topology import Cluster

logger = logging.getLogger(__name__)


def find_plan(
    model: ModelSpec | str,
    cluster: Cluster | str,
    workload: Training | Inference,
    *,
    objective: Any = None,
    n_trials: int = 250,
    sampler: Any = None,
    storage: str | None = None,
    seed: int = 0,
    workers: int = 1,
    disaggregate: bool | None = None,
    **search_options: Any,
) -> ShardingPlan:
    """Search the layouts of ``model`` on ``cluster`` for ``workload`` and return the best plan.

    ``model`` is a ``ModelSpec`` or a catalog name / config.json path; ``cluster`` a ``Cluster``
    or a preset name. The remaining keywords go to ``search.find_plan`` (``settings``,
    ``estimator``, ``progress``, ``warm_start``); ``workers > 1`` runs that many processes on one
    study (``storage`` is then required, or a temporary journal file is used). For inference,
    ``disaggregate`` (default: ``workload.disaggregation_allowed``) also prices a prefill/decode
    split (``search._disaggregation``) and records its pools in ``plan.disaggregation``;
    ``provenance.search["deployment"]`` says which of the two serves more tokens per device.

    Raises:
        InfeasiblePlanError: no layout fits; names the bottleneck and the smallest card count
            that would fit.
    """
    from search import find_plan as search_plan

    model, cluster = resolve_model(model), resolve_cluster(cluster)
    options = dict(objective=objective, n_trials=n_trials, sampler=sampler, storage=storage, seed=seed, **search_options)
    if workers > 1:
        from search._workers import run_workers

        result = run_workers(model, cluster, workload, workers=workers, **options)
    else:
        result = search_plan(model, cluster, workload, **options)
    if isinstance(workload, Inference) and result.feasible:  # the serving simulator checks the top layouts
        from search._objective import simulate_top_k

        result = simulate_top_k(result, model=model, cluster=cluster, workload=workload, **_estimator_option(search_options))
    if not result.feasible:
        raise infeasible_error(model=model, cluster=cluster, workload=workload, result=result, **_estimator_option(search_options))
    plan = build_plan(model=model, cluster=cluster, workload=workload, result=result)
    if isinstance(workload, Inference) and (workload.disaggregation_allowed if disaggregate is None else disaggregate):
        plan = with_disaggregation(plan, model=model, cluster=cluster, workload=workload, **_estimator_option(search_options))
    return plan


def with_disaggregation(plan: ShardingPlan, *, model: ModelSpec, cluster: Cluster, workload: Inference, estimator=None) -> ShardingPlan:  # noqa: ANN001
    """``plan`` with the best prefill/decode pools and which deployment wins (output tokens/s per device)."""
    from search._disaggregation import find_disaggregated

    found = find_disaggregated(model, cluster, workload, estimator=estimator)
    if found is None:
        search = {**plan.provenance.search, "deployment": "colocated", "disaggregation": "no unit of a pool fits"}
        return plan.model_copy(update={"provenance": plan.provenance.model_copy(update={"search": search})})
    pools = []
    for phase, candidate, unit, devices in (
        ("prefill", found.prefill, found.prefill_cluster, found.prefill_devices),
        ("decode", found.decode, found.decode_cluster, found.decode_devices),
    ):
        (cost,) = predict_all(model=model, cluster=unit, workload=workload, candidates=[candidate])
        pools.append(PhasePlan(phase=phase, num_devices=devices, config=candidate.config, predicted=cost))
    colocated = plan.predicted.tokens_per_s_per_device or 0.0
    search = {
        **plan.provenance.search,
        "deployment": "disaggregated" if found.output_tokens_per_s_per_device > colocated else "colocated",
        "colocated_output_tokens_per_s_per_device": colocated,
        "disaggregated_output_tokens_per_s_per_device": found.output_tokens_per_s_per_device,
        "disaggregated_bottleneck": found.bottleneck,
    }
    provenance = plan.provenance.model_copy(update={"search": search})
    return plan.model_copy(update={"disaggregation": tuple(pools), "provenance": provenance})


def _estimator_option(options: dict[str, Any]) -> dict[str, Any]:
    return {"estimator": options["estimator"]} if options.get("estimator") is not None else {}


def resolve_model(model: ModelSpec | str) -> ModelSpec:
    from autoparallel._catalog import get_model

    return model if isinstance(model, ModelSpec) else get_model(model)


def resolve_cluster(cluster: Cluster | str, *, num_nodes: int | None = None) -> Cluster:
    """A ``Cluster``, a preset name, or a path to a Cluster JSON (a probe result)."""
    from pathlib import Path

    from topology import get_preset

    if isinstance(cluster, Cluster):
        resolved = cluster
    elif str(cluster).endswith(".json") and Path(cluster).exists():
        resolved = Cluster.model_validate_json(Path(cluster).read_text())
    else:
        return get_preset(str(cluster), num_nodes=num_nodes)
    return resolved if num_nodes is None else resolved.with_nodes(num_nodes)


# ---------------------------------------------------------------------------- plan building
def build_plan(*, model: ModelSpec, cluster: Cluster, workload: Training | Inference, result) -> ShardingPlan:  # noqa: ANN001
    """The ``ShardingPlan`` of ``result.best`` with ``result.ranked[1:]`` as alternatives."""
    best = result.best
    config = best.config
    predicted, *others = predict_all(model=model, cluster=cluster, workload=workload, candidates=result.ranked)
    alternatives = tuple(
        Alternative(
            config=other.config,
            predicted=other_cost,
            reason_lost=reason_lost(winner=predicted, loser=other_cost, objective=result.objective, loser_feasible=other.feasible),
            serving=serving_settings(other),
        )
        for other, other_cost in zip(result.ranked[1:], others)
    )
    return ShardingPlan(
        provenance=provenance(model=model, cluster=cluster, workload=workload, result=result),
        world_size=cluster.num_devices,
        config=config,
        mesh_axes=dense_mesh_axes(config),
        moe_mesh_axes=moe_mesh_axes(config) if model.moe is not None else (),
        rank_to_device=rank_to_device(cluster=cluster, config=config, predicted=predicted),
        stages=pipeline_stages(num_layers=model.num_layers, config=config),
        expert_placement=expert_placement(model=model, config=config, extras=best.extras),
        module_rules=module_rules(model=model, config=config),
        predicted=predicted,
        alternatives=alternatives,
        serving=serving_settings(best),
    )


def provenance(*, model: ModelSpec, cluster: Cluster, workload, result) -> Provenance:  # noqa: ANN001
    import autoparallel

    return Provenance(
        library_version=autoparallel.__version__,
        model_name=model.name,
        model_fingerprint=model.fingerprint(),
        cluster_name=cluster.name,
        cluster_fingerprint=cluster.fingerprint(),
        workload=workload.model_dump(mode="json"),
        search={
            "method": result.method,
            "objective": list(result.objective.names),
            "space_size": result.space_size,
            "num_meshes": result.num_meshes,
            "num_trials": result.num_trials,
            "rows_evaluated": result.rows_evaluated,
            "infeasible_trials": result.infeasible_trials,
            "infeasible_layouts": result.infeasible_rows,
            "elapsed_s": round(result.elapsed_s, 3),
            "study_name": result.study_name,
            "devices_per_node": cluster.devices_per_node,
            "storage": result.storage,
            **{k: v for k, v in result.settings.items() if k in ("seed", "batch_size", "polish_fraction")},
        },
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )


def dense_mesh_axes(config: ParallelConfig) -> tuple[MeshAxis, ...]:
    """Outermost first, Megatron's rank order: rank = tp_i + tp*(cp_i + cp*(dp_i + dp*pp_i))."""
    return tuple(MeshAxis(name=n, size=getattr(config, n)) for n in ("pp", "dp", "cp", "tp"))


def moe_mesh_axes(config: ParallelConfig) -> tuple[MeshAxis, ...]:
    """The MoE view of the same ranks (parallel folding): pp, edp, ep, etp, etp innermost."""
    return (
        MeshAxis(name="pp", size=config.pp),
        MeshAxis(name="edp", size=config.edp),
        MeshAxis(name="ep", size=config.ep),
        MeshAxis(name="etp", size=config.etp),
    )


def rank_to_device(*, cluster: Cluster, config: ParallelConfig, predicted: CostBreakdown | None = None) -> tuple[int, ...]:
    """rank -> device from ``topology.place_mesh``: the dense mesh (pp, dp, cp, tp) with each axis
    weighted by its predicted communication seconds (exposed + hidden; expert all-to-all counts on
    the axis its groups span), so the heaviest traffic stays inside a node.

    The cost model prices Megatron's order (tp innermost); the placement keeps that order unless
    another axis carries more traffic, in which case it only moves heavier traffic onto faster
    links. Without a prediction: identity (Megatron's order)."""
    if predicted is None:
        return tuple(range(config.world_size))
    from topology import place_mesh

    seconds = {**predicted.time_s}
    for part, value in predicted.hidden_time_s.items():
        seconds[part] = seconds.get(part, 0.0) + value
    traffic = {axis: sum(v for k, v in seconds.items() if k.endswith(f"{axis}_comm")) for axis in ("pp", "dp", "cp", "tp")}
    expert_axis = "tp" if config.ep * config.etp <= config.tp else ("cp" if config.ep * config.etp <= config.tp * config.cp else "dp")
    traffic[expert_axis] += sum(v for k, v in seconds.items() if k.endswith("ep_comm"))
    axes = [(axis.name, axis.size) for axis in dense_mesh_axes(config)]
    return place_mesh(axes=axes, traffic=traffic, devices_per_node=cluster.devices_per_node)


def pipeline_stages(*, num_layers: int, config: ParallelConfig) -> tuple[StageLayers, ...]:
    """Chunk c of ``pp * virtual_stages`` holds ``split_layers``'s c-th range, on rank c mod pp."""
    num_chunks = config.pp * config.virtual_stages
    ranges = split_layers(num_layers, num_chunks)
    return tuple(
        StageLayers(
            chunk=chunk, stage=chunk % config.pp, start_layer=start, stop_layer=stop,
            has_embedding=chunk == 0, has_lm_head=chunk == num_chunks - 1,
        )
        for chunk, (start, stop) in enumerate(ranges)
    )


def expert_placement(*, model: ModelSpec, config: ParallelConfig, extras: dict[str, Any]) -> ExpertPlacement | None:
    """Contiguous experts per EP rank; with redundant slots, an EPLB placement for uniform load
    (measured load re-places them at run time, see ``autoparallel.runtime.retune``)."""
    if model.moe is None:
        return None
    from autoparallel._expert_placement import balanced_placement, contiguous_placement

    redundant = int(extras.get("num_redundant_experts", 0))
    num_experts = model.moe.num_routed_experts
    if redundant == 0:
        return contiguous_placement(num_experts=num_experts, ep=config.ep)
    import numpy as np

    return balanced_placement(expert_load=np.ones(num_experts), ep=config.ep, num_redundant_experts=redundant)


def module_rules(*, model: ModelSpec, config: ParallelConfig) -> tuple[ModuleRule, ...]:
    from autoparallel._module_rules import module_rules_for

    return module_rules_for(model=model, config=config)


def serving_settings(candidate) -> ServingSettings | None:  # noqa: ANN001 - search.Candidate
    """Batch size (as resolved by the cost model when the search left it to it), KV dtype, replicas."""
    extras = candidate.extras
    if "batch_size" not in extras:
        return None
    batch = int(extras["batch_size"]) or int(candidate.metrics.get("batch_size", 0))
    return ServingSettings(
        batch_size=max(batch, 1),
        kv_dtype=str(extras.get("kv_dtype", "bf16")),
        num_redundant_experts=int(extras.get("num_redundant_experts", 0)),
        two_batch_overlap=bool(extras.get("two_batch_overlap", False)),
    )


def predict_all(*, model: ModelSpec, cluster: Cluster, workload, candidates) -> list[CostBreakdown]:  # noqa: ANN001
    """The ``CostBreakdown`` of each candidate (feasible or not), priced together by one
    ``cost_model.estimate_table`` call."""
    from cost_model import configs_to_table, estimate_table
    from cost_model._estimate import breakdown_from_row

    extras: dict[str, Any] = {}
    if isinstance(workload, Inference):
        import numpy as np

        from cost_model._serving_columns import ServingConfig

        rows = [
            ServingConfig(**{k: v for k, v in c.extras.items() if k in ServingConfig.model_fields}).columns(workload=workload)
            for c in candidates
        ]
        extras = {name: np.concatenate([row[name] for row in rows]) for name in rows[0]}
    columns = estimate_table(model, cluster, workload, configs_to_table([c.config for c in candidates], **extras))
    return [breakdown_from_row(columns, index) for index in range(len(candidates))]


def reason_lost(*, winner: CostBreakdown, loser: CostBreakdown, objective, loser_feasible: bool) -> str:  # noqa: ANN001
    """Why ``loser`` ranks below ``winner``: the objective gap and the part that grew most."""
    if not loser_feasible:
        return f"infeasible: needs {human_bytes(loser.memory_per_device_bytes)} of {human_bytes(loser.memory_capacity_bytes)} per device or misses an SLO"
    column, direction = objective.columns[0], objective.directions[0]
    win, lose = _metric(winner, column), _metric(loser, column)
    gap = (lose - win) / abs(win) if win else 0.0
    if direction == "maximize":
        gap = -gap
    worse = "higher" if direction == "minimize" else "lower"
    text = f"{column} {abs(gap):.1%} {worse}" if gap else f"{column} equal"
    grown = {k: loser.time_s.get(k, 0.0) - winner.time_s.get(k, 0.0) for k in set(loser.time_s) | set(winner.time_s)}
    if grown:
        part = max(grown, key=grown.get)
        if grown[part] > 0:
            text += f"; {part} +{grown[part] * 1e3:.3g} ms"
    return text


def _metric(breakdown: CostBreakdown, column: str) -> float:
    if column == "memory_headroom_bytes":
        return breakdown.memory_headroom_bytes
    value = getattr(breakdown, column)
    return float(value) if value is not None else math.nan


# ---------------------------------------------------------------------------- infeasible
def infeasible_error(*, model: ModelSpec, cluster: Cluster, workload, result, estimator=None) -> InfeasiblePlanError:  # noqa: ANN001
    """``InfeasiblePlanError`` naming the bottleneck of the least-violating layout and the
    smallest card count (in whole nodes of this cluster) where some layout fits."""
    from search._feasibility import smallest_feasible_devices

    best = result.best
    bottleneck = max(best.violations, key=best.violations.get)
    needed = best.metrics.get("memory_per_device_bytes")
    smallest = smallest_feasible_devices(model=model, cluster=cluster, workload=workload, objective=result.objective, estimator=estimator)
    where = f"at least {smallest} devices ({smallest // cluster.devices_per_node} nodes of {cluster.name.split('@')[0]})" if smallest else "no cluster size up to the search limit"
    message = (
        f"no layout of {model.name} fits on {cluster.num_devices} devices of {cluster.device.name}: "
        f"bottleneck {bottleneck}"
    )
    if bottleneck == "memory" and needed is not None:
        parts = {k[len("memory."):]: v for k, v in best.metrics.items() if k.startswith("memory.")}
        largest = f"; its largest part is {max(parts, key=parts.get)} ({human_bytes(max(parts.values()))})" if parts else ""
        message += (
            f" (the leanest layout needs {human_bytes(needed)} per device, "
            f"{human_bytes(cluster.memory_per_device_bytes)} available{largest})"
        )
    return InfeasiblePlanError(message, part=bottleneck, needed_bytes=needed, available_bytes=cluster.memory_per_device_bytes, suggestion=f"smallest fitting size: {where}")
