"""``autoparallel.find_plan``: search, then write the result down as a ``ShardingPlan``.

The search ranks layouts; ``plan_from_search`` prices the best and the runners-up in one table
and hands them to ``autoparallel.plan.build_plan``, the one constructor of a plan.
"""

from __future__ import annotations

import logging
import math
from functools import partial
from typing import Any

from autoparallel._planner_deployment import (  # noqa: F401 - re-exported
    colocated_e2e_s,
    misses_only_slos,
    with_disaggregation,
)
from autoparallel.plan import (
    Alternative,
    PlanRecord,
    SearchRecord,
    ShardingPlan,
    build_plan,
)

# the plan-building parts, also reachable from here
from autoparallel.plan._build import (  # noqa: F401 - re-exported
    dense_mesh_axes,
    expert_placement,
    module_rules,
    moe_mesh_axes,
    pipeline_stages,
    rank_placement,
    serving_settings,
)
from cost_model import (
    CostBreakdown,
    EstimateOptions,
    InfeasiblePlanError,
    Inference,
    ModelSpec,
    Training,
    estimate_table,
    human_bytes,
    human_seconds,
)
from topology import Cluster

logger = logging.getLogger(__name__)
#: A time the search records for an unbounded one (an open loop past its capacity; the search
#: stores infinities as 1e300, ``search._candidate``): anything this long is unbounded.
UNBOUNDED_S = 1e299


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
    engine: str | None = None,
    engine_version: str | None = None,
    estimate_options: EstimateOptions | None = None,
    **search_options: Any,
) -> ShardingPlan:
    """Search the layouts of ``model`` on ``cluster`` for ``workload`` and return the best plan.

    ``model`` is a ``ModelSpec`` or a catalog name / config.json path; ``cluster`` a ``Cluster``
    or a preset name. The remaining keywords go to ``search.find_plan`` (``settings``,
    ``estimator``, ``progress``, ``warm_start``); ``workers > 1`` runs that many processes on one
    study (``storage`` is then required, or a temporary journal file is used). For inference,
    ``disaggregate`` (default: ``workload.disaggregation_allowed``) also prices a prefill/decode
    split (``search._disaggregation``) and records its pools in ``plan.deployment.pools``;
    ``plan.deployment.kind`` says which of the two serves more tokens per device.
    ``engine`` (``vllm``, ``sglang``, ``trtllm``, ``megatron``, ``torchtitan``, ``deepspeed``)
    keeps only layouts that engine runs at ``engine_version`` (default: its current release). An inference
    ``workload`` that leaves ``weight_dtype`` unset serves a catalog name or config.json path in
    its released checkpoint's dtype (``autoparallel._catalog.checkpoint_dtype``: DeepSeek-V3 fp8),
    with the parts its ``quantization_config`` keeps wider (``checkpoint_dtype_by_part``).
    ``estimate_options``: how the software runs (a recipe's EP overlap, CUDA graphs, recompute
    modules, ...), for every layout the search prices and the plan's own prediction; the plan
    records them (``ShardingPlan.estimate_options``). Not with an ``estimator`` of one's own.

    Raises:
        InfeasiblePlanError: no layout fits; names the bottleneck and the smallest card count
            that would fit.
    """
    workload = _with_checkpoint_dtype(model, workload)
    model, cluster = resolve_model(model), resolve_cluster(cluster)
    search_options = _engine_and_estimator_options(
        search_options,
        estimate_options=estimate_options,
        engine=engine,
        engine_version=engine_version,
        workload=workload,
    )
    options = dict(
        objective=objective, n_trials=n_trials, sampler=sampler, storage=storage, seed=seed
    )
    result, cluster = _search(
        model, cluster, workload, workers=workers, **options, **search_options
    )
    plan = _colocated_or_pools(
        model=model,
        cluster=cluster,
        workload=workload,
        result=result,
        estimate_options=estimate_options,
        disaggregate=disaggregate,
        search_options=search_options,
        bounds=search_options["settings"].bounds if engine is not None else None,
    )
    if plan is not None:
        return plan
    raise infeasible_error(
        model=model,
        cluster=cluster,
        workload=workload,
        result=result,
        **_estimator_option(search_options),
    )


def _colocated_or_pools(
    *,
    model: ModelSpec,
    cluster: Cluster,
    workload: Training | Inference,
    result,
    estimate_options: EstimateOptions | None,
    disaggregate: bool | None,
    search_options: dict[str, Any],
    bounds,
) -> ShardingPlan | None:
    """The plan of the search's ``result``, with the prefill/decode pools priced beside it where
    the workload may be disaggregated (within an engine's ``bounds``); None where neither the
    colocated layout nor the pools serve the workload (``find_plan`` then raises)."""
    estimator = _estimator_option(search_options)
    disaggregating = isinstance(workload, Inference) and (
        workload.disaggregation_allowed if disaggregate is None else disaggregate
    )
    # a load no colocated layout serves within the SLOs may still be served by prefill and decode
    # pools; only a layout that misses nothing but an SLO stands in for the colocated one then
    feasible = result.feasible
    if not (feasible or (disaggregating and misses_only_slos(result.best))):
        return None
    plan = plan_from_search(
        model=model, cluster=cluster, workload=workload, result=result, options=estimate_options
    )
    if disaggregating:
        plan = with_disaggregation(
            plan,
            model=model,
            cluster=cluster,
            workload=workload,
            bounds=bounds,
            colocated_violations=None if feasible else result.best.violations,
            **estimator,
        )
    return plan if feasible or plan.deployment.kind == "disaggregated" else None


def _engine_and_estimator_options(
    search_options: dict[str, Any],
    *,
    estimate_options: EstimateOptions | None,
    engine: str | None,
    engine_version: str | None,
    workload: Training | Inference,
) -> dict[str, Any]:
    """``search_options`` with the estimator ``estimate_options`` configure (exclusive with an
    ``estimator`` of one's own) and the search settings of the layouts ``engine`` runs at
    ``engine_version``."""
    search_options = dict(search_options)
    if estimate_options is not None:
        if search_options.get("estimator") is not None:
            raise ValueError(
                "estimate_options and estimator are exclusive: give the options to estimator"
            )
        search_options["estimator"] = partial(estimate_table, options=estimate_options)
    if engine is not None:
        from search import engine_search_settings

        search_options["settings"] = engine_search_settings(
            search_options.get("settings"), engine=engine, version=engine_version, workload=workload
        )
    return search_options


def _with_checkpoint_dtype(model: ModelSpec | str, workload: Training | Inference):
    """An inference ``workload`` without a ``weight_dtype`` of a catalog name or config.json
    path serves the released checkpoint's dtype; served in that dtype without its own
    ``weight_dtype_by_part`` (``fp8_scaling``), it keeps the parts the checkpoint leaves wider
    (and its FP8 weight scaling)."""
    if not (isinstance(workload, Inference) and isinstance(model, str)):
        return workload
    from autoparallel._catalog import (
        checkpoint_dtype,
        checkpoint_dtype_by_part,
        checkpoint_fp8_scaling,
    )

    released = checkpoint_dtype(model)
    update: dict = {}
    if "weight_dtype" not in workload.model_fields_set:
        update["weight_dtype"] = released
    as_released = update.get("weight_dtype", workload.weight_dtype) == released
    if as_released and "weight_dtype_by_part" not in workload.model_fields_set:
        update["weight_dtype_by_part"] = checkpoint_dtype_by_part(model)
    scaling = checkpoint_fp8_scaling(model) if as_released else None
    if scaling is not None and "fp8_scaling" not in workload.model_fields_set:
        update["fp8_scaling"] = scaling
    return workload.model_copy(update=update) if update else workload


def _search(model: ModelSpec, cluster: Cluster, workload, *, workers: int, **options: Any):
    """The ranked search result (in ``workers`` processes when more than one) and the cluster it
    used (fewer whole nodes or hosts when some are left idle); for inference the serving simulator
    re-checks the top layouts."""
    from search import find_plan as search_plan

    if workers != 1:  # run_workers names a count below 1
        from search import run_workers

        result = run_workers(model, cluster, workload, workers=workers, **options)
    else:
        result = search_plan(model, cluster, workload, **options)
    nodes = result.settings.get("num_nodes_used", cluster.num_nodes)
    per_node = result.settings.get("devices_per_node_used", cluster.devices_per_node)
    if (nodes, per_node) != (cluster.num_nodes, cluster.devices_per_node):
        # whole nodes, or whole hosts of each node, left idle
        cluster = cluster.with_nodes(nodes).with_devices_per_node(per_node)
    if not result.feasible and result.method != "from_study":
        result = _with_lean_layout(result, model, cluster, workload, options)
    if isinstance(workload, Inference) and result.feasible:
        from search import simulate_top_k

        result = simulate_top_k(
            result, model=model, cluster=cluster, workload=workload, **_estimator_option(options)
        )
    return result, cluster


#: ``SearchResult.method`` suffix of a result whose plan is the lean pass's (``_with_lean_layout``).
LEAN_METHOD_SUFFIX = "+lean"


def _with_lean_layout(result, model: ModelSpec, cluster: Cluster, workload, options: dict):
    """``result`` whose sampled trials found no fitting layout, with the best layout of an
    exhaustive pass over the leanest switches at this size (``search.lean_bounds``: full
    recompute, micro-batch / batch 1, the smallest KV dtype; every mesh), where one fits.

    The same pass decides the smallest fitting size of ``InfeasiblePlanError``; without it a
    budget too small to sample the fitting meshes would report "no layout fits" with this very
    size as the smallest that fits. ``method`` gains ``LEAN_METHOD_SUFFIX``; the result is
    unchanged where nothing fits."""
    import dataclasses

    from search import exhaustive_search, lean_bounds

    settings = options.get("settings")
    lean = exhaustive_search(
        model,
        cluster,
        workload,
        objective=result.objective,
        bounds=lean_bounds(settings.bounds if settings is not None else None, workload),
        **_estimator_option(options),
    )
    if not lean.best.feasible:
        return result
    logger.warning(
        "%d trials found no fitting layout; planning the best of the %d lean layouts "
        "(%d fit); more trials may find a faster one",
        result.num_trials,
        lean.space_size,
        lean.num_feasible,
    )
    return dataclasses.replace(
        result,
        best=lean.best,
        ranked=(lean.best,),
        pareto=(lean.best,) if result.pareto else (),
        method=result.method + LEAN_METHOD_SUFFIX,
        rows_evaluated=result.rows_evaluated + lean.space_size,
        elapsed_s=result.elapsed_s + lean.elapsed_s,
    )


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
    elif str(cluster).endswith(".json") or Path(cluster).is_file():
        path = Path(cluster)
        if not path.is_file():
            raise ValueError(
                f"cluster ({str(cluster)!r}) looks like a Cluster JSON file, but no such file exists"
            )
        resolved = Cluster.model_validate_json(path.read_text())
    else:
        return get_preset(str(cluster), num_nodes=num_nodes)
    return resolved if num_nodes is None else resolved.with_nodes(num_nodes)


# ---------------------------------------------------------------------------- plan building
def plan_from_search(
    *,
    model: ModelSpec,
    cluster: Cluster,
    workload: Training | Inference,
    result,
    options: EstimateOptions | None = None,
) -> ShardingPlan:
    """The plan of ``result.best`` with ``result.ranked[1:]`` as alternatives, all priced in one
    table (the price of each layout in the rank placement ``build_plan`` writes) with
    ``options``, which the plan records."""
    predicted, *others = predict_all(
        model=model, cluster=cluster, workload=workload, candidates=result.ranked, options=options
    )
    alternatives = tuple(
        Alternative(
            config=other.config,
            predicted=other_cost,
            reason_lost=reason_lost(
                winner=predicted,
                loser=other_cost,
                objective=result.objective,
                loser_feasible=other.feasible,
            ),
            serving=serving_settings(layout=other.layout, job=workload, predicted=other_cost),
        )
        for other, other_cost in zip(result.ranked[1:], others)
    )
    record = PlanRecord(alternatives=alternatives, search=search_record(result))
    return build_plan(
        model=model,
        cluster=cluster,
        job=workload,
        layout=result.best.layout,
        predicted=predicted,
        estimate_options=None if options is None else options.model_dump(exclude_unset=True),
        record=record,
    )


def search_record(result) -> SearchRecord:
    settings = result.settings
    return SearchRecord(
        method=result.method,
        objective=tuple(result.objective.names),
        space_size=result.space_size,
        num_meshes=result.num_meshes,
        num_trials=result.num_trials,
        rows_evaluated=result.rows_evaluated,
        infeasible_trials=result.infeasible_trials,
        infeasible_layouts=result.infeasible_rows,
        elapsed_s=round(result.elapsed_s, 3),
        study_name=result.study_name,
        storage=result.storage,
        seed=settings.get("seed"),
        batch_size=settings.get("batch_size"),
        polish_fraction=settings.get("polish_fraction"),
        idle_reason=settings.get("idle_reason", ""),
    )


def predict_all(
    *,
    model: ModelSpec,
    cluster: Cluster,
    workload,
    candidates,
    options: EstimateOptions | None = None,
) -> list[CostBreakdown]:
    """The ``CostBreakdown`` of each candidate (feasible or not), priced together by one
    ``cost_model.estimate_table`` call (with ``options``; None: the defaults)."""
    from cost_model import breakdown_from_row, configs_to_table, estimate_table

    extras: dict[str, Any] = {}
    if isinstance(workload, Inference):
        import numpy as np

        from cost_model import ServingConfig

        rows = [
            (c.layout.serving or ServingConfig()).columns(workload=workload) for c in candidates
        ]
        extras = {name: np.concatenate([row[name] for row in rows]) for name in rows[0]}
    columns = estimate_table(
        model,
        cluster,
        workload,
        configs_to_table([c.config for c in candidates], **extras),
        options=options,
    )
    return [breakdown_from_row(columns, index) for index in range(len(candidates))]


def reason_lost(
    *, winner: CostBreakdown, loser: CostBreakdown, objective, loser_feasible: bool
) -> str:
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
    grown = {
        k: loser.time_s.get(k, 0.0) - winner.time_s.get(k, 0.0)
        for k in set(loser.time_s) | set(winner.time_s)
    }
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
def infeasible_error(
    *, model: ModelSpec, cluster: Cluster, workload, result, estimator=None
) -> InfeasiblePlanError:
    """``InfeasiblePlanError`` naming the bottleneck of the least-violating layout and the
    smallest card count (in whole nodes of this cluster) where some layout fits."""
    from search import smallest_feasible_devices

    best = result.best
    bottleneck = max(best.violations, key=best.violations.get)
    needed = best.metrics.get("memory_per_device_bytes")
    smallest = smallest_feasible_devices(
        model=model,
        cluster=cluster,
        workload=workload,
        objective=result.objective,
        estimator=estimator,
    )
    where = (
        f"at least {smallest} devices ({smallest // cluster.devices_per_node} nodes of {cluster.name.split('@')[0]})"
        if smallest
        else "no cluster size up to the search limit"
    )
    message = (
        f"no layout of {model.name} fits on {cluster.num_devices} devices of {cluster.device.name}: "
        f"bottleneck {bottleneck}"
    )
    if bottleneck in ("ttft_slo", "tpot_slo"):
        metric = bottleneck.replace("_slo", "_s")
        limit = workload.ttft_slo_s if bottleneck == "ttft_slo" else workload.tpot_slo_s
        reached = best.metrics.get(metric)
        name = metric[: -len("_s")].upper()
        rate = getattr(workload, "request_rate_per_s", None)
        if reached is not None and reached >= UNBOUNDED_S and rate is not None:
            # an open loop past the layout's capacity: the queue, and so the TTFT, grows without end
            message += (
                f" (at the offered {rate:g} requests/s the least-violating layout's queue grows "
                f"without bound: the rate exceeds what it serves, so no {name} meets the "
                f"{human_seconds(limit or 0.0)} SLO)"
            )
        elif reached is not None and limit:
            message += (
                f" (the least-violating layout reaches {name} {human_seconds(reached)} against the "
                f"{human_seconds(limit)} SLO, {reached / limit - 1.0:.0%} over)"
            )
        return InfeasiblePlanError(
            message,
            part=bottleneck,
            suggestion=f"smallest size meeting it: {where}",
            smallest_devices=smallest,
        )
    if bottleneck == "memory" and needed is not None:
        parts = {k[len("memory.") :]: v for k, v in best.metrics.items() if k.startswith("memory.")}
        largest = (
            f"; its largest part is {max(parts, key=parts.get)} ({human_bytes(max(parts.values()))})"
            if parts
            else ""
        )
        message += (
            f" (the leanest layout needs {human_bytes(needed)} per device, "
            f"{human_bytes(cluster.memory_per_device_bytes)} available{largest})"
        )
    return InfeasiblePlanError(
        message,
        part=bottleneck,
        needed_bytes=needed,
        available_bytes=cluster.memory_per_device_bytes,
        suggestion=f"smallest fitting size: {where}",
        smallest_devices=smallest,
    )
