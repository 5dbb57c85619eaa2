"""``build_plan``: the one constructor of a ``ShardingPlan``. The planner, the recovery re-plan,
the profilers' staged checks and the test helpers all call it.

The plan is pure data built from pure functions of integers: the meshes from the axis orders of
``cost_model``, the rank placement, stages from ``cost_model.split_layers``, the expert map from
``autoparallel._expert_placement``, module rules from ``autoparallel._module_rules``.

Rank placement is chosen first, from the layout alone, and the price is of that placement:
ranks sit on devices in Megatron's order (``rank = tp_i + tp * (cp_i + cp * (dp_i + dp * pp_i))``,
tp innermost, on consecutive devices of a node), which is the order the cost model prices
(``cost_model._pricing.ranks_per_node``). A placement the cost model cannot price is not written.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Literal

from autoparallel.plan._schema import (
    Alternative,
    Deployment,
    ExpertPlacement,
    MeshAxis,
    ModuleRule,
    Provenance,
    SearchRecord,
    ServingSettings,
    ShardingPlan,
    StageLayers,
)
from autoparallel.plan._validate import check_layout
from cost_model import (
    DENSE_MESH_ORDER,
    MOE_MESH_ORDER,
    CostBreakdown,
    EstimateOptions,
    Inference,
    Layout,
    ModelSpec,
    ParallelConfig,
    Training,
    axis_degrees,
    estimate,
    split_layers,
)
from topology import Cluster

__all__ = [
    "PlanRecord",
    "build_plan",
    "dense_mesh_axes",
    "expert_placement",
    "moe_mesh_axes",
    "pipeline_stages",
    "rank_placement",
    "serving_settings",
]

ESTIMATE: Literal["estimate"] = "estimate"


@dataclass(frozen=True)
class PlanRecord:
    """What a plan records beside its layout: the runners-up, the search, the deployment, and
    the library version and time of creation (defaults: this library, now)."""

    alternatives: tuple[Alternative, ...] = ()
    search: SearchRecord | None = None
    deployment: Deployment = field(default_factory=Deployment)
    library_version: str | None = None
    created_at: str | None = None


def build_plan(
    *,
    model: ModelSpec,
    cluster: Cluster,
    job: Training | Inference,
    layout: Layout,
    predicted: CostBreakdown | None | Literal["estimate"] = ESTIMATE,
    estimate_options: dict[str, object] | None = None,
    record: PlanRecord = PlanRecord(),
) -> ShardingPlan:
    """The ``ShardingPlan`` of ``layout`` for ``model`` and ``job`` on the first
    ``layout.config.world_size`` devices of ``cluster``.

    ``predicted``: ``"estimate"`` prices the placed layout with ``cost_model.estimate`` (with
    ``estimate_options``); a ``CostBreakdown`` the caller already priced for this layout on this
    cluster (with ``estimate_options``); ``None`` for an unpriced plan. The plan records the
    ``EstimateOptions`` fields of ``estimate_options`` but the calibration
    (``ShardingPlan.estimate_options``; None when there are none).

    Raises:
        PlanError: (a ``ValueError``) the layout breaks a rule of the model or the job.
        InfeasiblePlanError: ``"estimate"`` and the layout does not fit.
    """
    config = layout.config
    check_layout(
        config,
        model=model,
        world_size=config.world_size,
        field="config",
        num_redundant_experts=_redundant(layout),
    )  # before building its parts
    if config.world_size > cluster.num_devices:
        raise ValueError(
            f"dp*cp*tp*pp ({config.world_size}) must be <= the cluster's devices "
            f"({cluster.num_devices})"
        )
    placement = rank_placement(config)
    price: CostBreakdown | None
    if predicted == ESTIMATE:
        price = estimate(
            model,
            cluster,
            job,
            config,
            **layout.estimate_options(),
            **(estimate_options or {}),
        )
    else:
        price = predicted
    return ShardingPlan(
        provenance=_provenance(model=model, cluster=cluster, record=record),
        model=model,
        job=job,
        world_size=config.world_size,
        devices_per_node=cluster.devices_per_node,
        devices_per_host=cluster.devices_per_host,
        config=config,
        serving=serving_settings(layout=layout, job=job, predicted=price),
        mesh_axes=dense_mesh_axes(config),
        moe_mesh_axes=moe_mesh_axes(config) if model.moe is not None else (),
        rank_to_device=placement,
        stages=pipeline_stages(num_layers=model.num_layers, config=config),
        expert_placement=expert_placement(
            model=model, config=config, num_redundant_experts=_redundant(layout)
        ),
        module_rules=module_rules(
            model=model, config=config, num_redundant_experts=_redundant(layout)
        ),
        predicted=price,
        estimate_options=_recorded_options(estimate_options),
        alternatives=record.alternatives,
        deployment=record.deployment,
    )


def _provenance(*, model: ModelSpec, cluster: Cluster, record: PlanRecord) -> Provenance:
    import autoparallel

    created = record.created_at
    if created is None:
        created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return Provenance(
        library_version=autoparallel.__version__
        if record.library_version is None
        else record.library_version,
        model_name=model.name,
        model_fingerprint=model.fingerprint(),
        cluster_name=cluster.name,
        cluster_fingerprint=cluster.fingerprint(),
        created_at=created,
        search=record.search,
    )


def _recorded_options(options: dict[str, object] | None) -> EstimateOptions | None:
    """The software settings of ``options`` a plan records: its ``EstimateOptions`` fields
    but the calibration (a fit of the hardware, not a setting of the run)."""
    recorded = {
        name: value
        for name, value in (options or {}).items()
        if name in EstimateOptions.model_fields and name != "calibration"
    }
    return EstimateOptions.model_validate(recorded) if recorded else None


def _redundant(layout: Layout) -> int:
    return 0 if layout.serving is None else layout.serving.num_redundant_experts


def dense_mesh_axes(config: ParallelConfig) -> tuple[MeshAxis, ...]:
    """Outermost first, Megatron's rank order: rank = tp_i + tp*(cp_i + cp*(dp_i + dp*pp_i))."""
    return tuple(
        MeshAxis(name=name, size=size) for name, size in axis_degrees(config, DENSE_MESH_ORDER)
    )


def moe_mesh_axes(config: ParallelConfig) -> tuple[MeshAxis, ...]:
    """The MoE view of the same ranks (parallel folding): pp, edp, ep, etp, etp innermost."""
    return tuple(
        MeshAxis(name=name, size=size) for name, size in axis_degrees(config, MOE_MESH_ORDER)
    )


def rank_placement(config: ParallelConfig) -> tuple[int, ...]:
    """rank -> device: Megatron's order over the dense mesh (mesh position i on device i), the
    order the cost model prices: tp groups on consecutive devices, then cp, dp, pp."""
    return tuple(range(config.world_size))


def pipeline_stages(*, num_layers: int, config: ParallelConfig) -> tuple[StageLayers, ...]:
    """Chunk c of ``pp * virtual_stages`` holds ``split_layers``'s c-th range, on rank c mod pp."""
    num_chunks = config.pp * config.virtual_stages
    ranges = split_layers(num_layers, num_chunks)
    return tuple(
        StageLayers(
            chunk=chunk,
            stage=chunk % config.pp,
            start_layer=start,
            stop_layer=stop,
            has_embedding=chunk == 0,
            has_lm_head=chunk == num_chunks - 1,
        )
        for chunk, (start, stop) in enumerate(ranges)
    )


def expert_placement(
    *, model: ModelSpec, config: ParallelConfig, num_redundant_experts: int = 0
) -> ExpertPlacement | None:
    """Contiguous experts per EP rank; with redundant slots, an EPLB placement for uniform load
    (measured load re-places them at run time, see ``autoparallel.runtime.retune``)."""
    if model.moe is None:
        return None
    from autoparallel._expert_placement import balanced_placement, contiguous_placement

    num_experts = model.moe.num_routed_experts
    if num_redundant_experts == 0:
        return contiguous_placement(num_experts=num_experts, ep=config.ep)
    import numpy as np

    return balanced_placement(
        expert_load=np.ones(num_experts),
        ep=config.ep,
        num_redundant_experts=num_redundant_experts,
    )


def module_rules(
    *, model: ModelSpec, config: ParallelConfig, num_redundant_experts: int = 0
) -> tuple[ModuleRule, ...]:
    from autoparallel._module_rules import module_rules_for

    return module_rules_for(model=model, config=config, num_redundant_experts=num_redundant_experts)


def serving_settings(
    *, layout: Layout, job: Training | Inference, predicted: CostBreakdown | None
) -> ServingSettings | None:
    """The layout's serving settings as deployed: the batch cap the price resolved when the
    search left it to the cost model (0: ``CostBreakdown.running_cap``, what the engine admits
    at once; under a request rate more than the mean in flight), the job's KV dtype when the
    layout names none. None for training."""
    if isinstance(job, Training):
        return None
    serving = layout.serving
    if serving is None:
        from cost_model import ServingConfig

        serving = ServingConfig()
    resolved = None if predicted is None else (predicted.running_cap or predicted.batch_size)
    batch = serving.batch_size or resolved or 1
    return ServingSettings(
        batch_size=max(int(batch), 1),
        kv_dtype=serving.kv_dtype or job.kv_dtype,
        num_redundant_experts=serving.num_redundant_experts,
        two_batch_overlap=serving.two_batch_overlap,
        all_to_all_backend=serving.a2a_backend,
    )
