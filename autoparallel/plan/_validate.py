"""Whole-plan checks, run whenever a ``ShardingPlan`` is built or loaded.

Each check raises ``PlanError`` naming the field, its value and the rule it breaks. The layout
rules (degrees against heads, KV heads, FFN and expert sizes, layers) are the cost model's own
(``cost_model.check_parallel_config``), so a plan holds exactly what the search may propose and
the runtime accepts.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from cost_model import (
    ALL_AXES,
    DENSE_MESH_ORDER,
    MOE_MESH_ORDER,
    Training,
    axis_degrees,
    check_parallel_config,
    check_sequence_fits,
    describe_layout,
)

if TYPE_CHECKING:
    from autoparallel.plan._schema import ExpertPlacement, ShardingPlan, StageLayers
    from cost_model import ModelSpec, ParallelConfig

__all__ = ["PlanError", "check_plan", "check_schema_version"]


class PlanError(ValueError):
    """A plan breaks a rule: ``field`` (dotted path), its ``value`` and the ``rule``."""

    def __init__(self, *, field: str, value: Any, rule: str) -> None:
        self.field, self.value, self.rule = field, value, rule
        super().__init__(f"plan {field} ({_short(value)}): {rule}")


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 200 else text[:197] + "..."


def check_schema_version(value: Any, *, upgraded: bool) -> None:
    """``value`` must be an integer from 1 to ``SCHEMA_VERSION`` (exactly it once upgraded)."""
    from autoparallel.plan._schema import SCHEMA_VERSION

    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanError(
            field="schema_version",
            value=repr(value),
            rule=f"must be an integer from 1 to {SCHEMA_VERSION}",
        )
    if value > SCHEMA_VERSION:
        raise PlanError(
            field="schema_version",
            value=value,
            rule=f"is newer than this library supports ({SCHEMA_VERSION}); "
            "upgrade moe-autoparallel to read this plan",
        )
    if value < 1:
        raise PlanError(
            field="schema_version",
            value=value,
            rule=f"must be >= 1 (versions are 1 to {SCHEMA_VERSION})",
        )
    if upgraded and value != SCHEMA_VERSION:
        raise PlanError(
            field="schema_version",
            value=value,
            rule=f"a plan object is version {SCHEMA_VERSION}; "
            "older documents are upgraded by load_plan",
        )


def check_plan(plan: ShardingPlan) -> None:
    """Raise ``PlanError`` for the first rule ``plan`` breaks."""
    model = plan.model
    _check_provenance(plan)
    check_layout(
        plan.config,
        model=model,
        world_size=plan.world_size,
        field="config",
        num_redundant_experts=_redundant_slots(plan.serving),
    )
    _check_job(plan)
    _check_meshes(plan)
    _check_rank_map(plan)
    _check_stages(plan.stages, config=plan.config, num_layers=model.num_layers)
    _check_experts(plan)
    _check_rules(plan)
    for index, alternative in enumerate(plan.alternatives):
        check_layout(
            alternative.config,
            model=model,
            world_size=plan.world_size,
            field=f"alternatives[{index}].config",
            num_redundant_experts=_redundant_slots(alternative.serving),
        )
    _check_deployment(plan)


def _redundant_slots(serving) -> int:  # ServingSettings | None
    return 0 if serving is None else serving.num_redundant_experts


def check_layout(
    config: ParallelConfig,
    *,
    model: ModelSpec,
    world_size: int,
    field: str,
    num_redundant_experts: int = 0,
) -> None:
    """``cost_model.check_parallel_config``: dims multiply to ``world_size``, degrees divide
    heads, KV heads, FFN and experts (routed + ``num_redundant_experts`` slots), pipeline chunks
    fit the layers."""
    try:
        check_parallel_config(
            config, model, world_size, num_redundant_experts=num_redundant_experts
        )
    except ValueError as error:
        raise PlanError(field=field, value=describe_layout(config), rule=str(error)) from None


def _check_provenance(plan: ShardingPlan) -> None:
    provenance, model = plan.provenance, plan.model
    if provenance.model_name != model.name:
        raise PlanError(
            field="provenance.model_name",
            value=provenance.model_name,
            rule=f"must equal model.name ({model.name!r})",
        )
    if provenance.model_fingerprint != model.fingerprint():
        raise PlanError(
            field="provenance.model_fingerprint",
            value=provenance.model_fingerprint,
            rule=f"must equal the fingerprint of the plan's model ({model.fingerprint()})",
        )


def _check_job(plan: ShardingPlan) -> None:
    config, job = plan.config, plan.job
    if not isinstance(job, Training):
        if plan.serving is None and plan.predicted is not None:
            raise PlanError(
                field="serving",
                value=None,
                rule="an inference plan priced for serving must record its serving settings",
            )
        return
    if plan.serving is not None:
        raise PlanError(
            field="serving",
            value=plan.serving.batch_size,
            rule="must be absent for a training job",
        )
    if config.attention_data_parallel:
        raise PlanError(
            field="config.attention_data_parallel",
            value=True,
            rule="is an inference layout; training needs False",
        )
    try:
        check_sequence_fits(config, job.sequence_length_tokens)
        config.num_micro_batches(
            int(job.global_batch_sequences or 0)
        )  # derived by Training's validator
    except ValueError as error:
        raise PlanError(field="config", value=describe_layout(config), rule=str(error)) from None


def _check_meshes(plan: ShardingPlan) -> None:
    dense = tuple((axis.name, axis.size) for axis in plan.mesh_axes)
    expected = axis_degrees(plan.config, DENSE_MESH_ORDER)
    if dense != expected:
        raise PlanError(
            field="mesh_axes",
            value=dict(dense),
            rule=f"must be the config's dense mesh {dict(expected)}",
        )
    moe = tuple((axis.name, axis.size) for axis in plan.moe_mesh_axes)
    expected_moe = axis_degrees(plan.config, MOE_MESH_ORDER) if plan.model.moe is not None else ()
    if moe != expected_moe:
        rule = (
            f"must be the config's MoE view {dict(expected_moe)}"
            if expected_moe
            else "must be empty for a dense model"
        )
        raise PlanError(field="moe_mesh_axes", value=dict(moe), rule=rule)


def _check_rank_map(plan: ShardingPlan) -> None:
    if plan.devices_per_node % plan.host_devices:
        raise PlanError(
            field="devices_per_host",
            value=plan.devices_per_host,
            rule=f"must divide devices_per_node ({plan.devices_per_node}): a node is whole hosts",
        )
    ranks, world = plan.rank_to_device, plan.world_size
    if len(ranks) != world:
        raise PlanError(
            field="rank_to_device",
            value=f"{len(ranks)} entries",
            rule=f"must list one device per rank ({world})",
        )
    if sorted(ranks) != list(range(world)):
        stray = sorted(set(ranks) - set(range(world)))
        repeated = sorted(device for device, count in Counter(ranks).items() if count > 1)
        found = f"device {stray[0]} out of range" if stray else f"device {repeated[0]} repeated"
        raise PlanError(
            field="rank_to_device",
            value=found,
            rule=f"must be a permutation of range(world_size = {world})",
        )


def _check_stages(
    stages: tuple[StageLayers, ...], *, config: ParallelConfig, num_layers: int
) -> None:
    num_chunks = config.pp * config.virtual_stages
    if len(stages) != num_chunks:
        raise PlanError(
            field="stages",
            value=f"{len(stages)} chunks",
            rule=f"must hold pp*virtual_stages ({config.pp}*{config.virtual_stages} = "
            f"{num_chunks}) chunks",
        )
    start = 0
    for index, stage in enumerate(stages):
        where = f"stages[{index}]"
        if stage.chunk != index or stage.stage != index % config.pp:
            raise PlanError(
                field=f"{where}.chunk/stage",
                value=f"{stage.chunk}/{stage.stage}",
                rule=f"must be {index}/{index % config.pp} "
                "(chunks in order, chunk c on pipeline rank c mod pp)",
            )
        if stage.start_layer != start:
            rule = f"must be {start}: chunks cover the layers in order, without gap or overlap"
            raise PlanError(field=f"{where}.start_layer", value=stage.start_layer, rule=rule)
        if stage.stop_layer <= stage.start_layer:
            raise PlanError(
                field=f"{where}.stop_layer",
                value=stage.stop_layer,
                rule=f"must be > start_layer ({stage.start_layer})",
            )
        if stage.has_embedding != (index == 0) or stage.has_lm_head != (index == num_chunks - 1):
            rule = "the embedding belongs to the first chunk only and the LM head to the last only"
            raise PlanError(
                field=f"{where}.has_embedding/has_lm_head",
                value=f"{stage.has_embedding}/{stage.has_lm_head}",
                rule=rule,
            )
        start = stage.stop_layer
    if start != num_layers:
        raise PlanError(
            field=f"stages[{num_chunks - 1}].stop_layer",
            value=start,
            rule=f"must be num_layers ({num_layers})",
        )


def _check_experts(plan: ShardingPlan) -> None:
    placement, moe = plan.expert_placement, plan.model.moe
    if moe is None:
        if placement is not None:
            raise PlanError(
                field="expert_placement",
                value=placement.num_experts,
                rule="must be absent for a dense model",
            )
        return
    if placement is None:
        raise PlanError(
            field="expert_placement",
            value=None,
            rule=f"must place the {moe.num_routed_experts} routed experts",
        )
    if placement.num_experts != moe.num_routed_experts:
        raise PlanError(
            field="expert_placement.num_experts",
            value=placement.num_experts,
            rule=f"must equal the model's routed experts ({moe.num_routed_experts})",
        )
    if placement.ep != plan.config.ep:
        raise PlanError(
            field="expert_placement.ep",
            value=placement.ep,
            rule=f"must equal config.ep ({plan.config.ep})",
        )
    if (
        plan.serving is not None
        and plan.serving.num_redundant_experts != placement.num_redundant_experts
    ):
        raise PlanError(
            field="expert_placement.num_redundant_experts",
            value=placement.num_redundant_experts,
            rule=f"must equal serving.num_redundant_experts ({plan.serving.num_redundant_experts})",
        )
    check_expert_map(placement, field="expert_placement")


def check_expert_map(placement: ExpertPlacement, *, field: str) -> None:
    """Every expert on >= 1 existing EP rank, no rank twice, every rank holding the same number
    of slots, and the slots (routed + redundant) divisible by ep."""
    ep, slots = placement.ep, placement.num_experts + placement.num_redundant_experts
    if slots % ep:
        raise PlanError(
            field=f"{field}.num_redundant_experts",
            value=placement.num_redundant_experts,
            rule=f"num_experts + num_redundant_experts ({slots}) must be divisible by ep ({ep})",
        )
    if len(placement.expert_to_ranks) != placement.num_experts:
        raise PlanError(
            field=f"{field}.expert_to_ranks",
            value=f"{len(placement.expert_to_ranks)} experts",
            rule=f"must list every expert ({placement.num_experts})",
        )
    for expert, ranks in enumerate(placement.expert_to_ranks):
        where = f"{field}.expert_to_ranks[{expert}]"
        if not ranks:
            raise PlanError(
                field=where,
                value="[]",
                rule="every expert must be held by at least one EP rank",
            )
        if any(not 0 <= rank < ep for rank in ranks):
            raise PlanError(
                field=where,
                value=list(ranks),
                rule=f"EP ranks must be in range(ep = {ep})",
            )
        if len(set(ranks)) != len(ranks):
            raise PlanError(
                field=where,
                value=list(ranks),
                rule="an expert's replicas must be on distinct EP ranks",
            )
    held = Counter(rank for ranks in placement.expert_to_ranks for rank in ranks)
    for rank in range(ep):
        if held[rank] != slots // ep:
            raise PlanError(
                field=f"{field}.expert_to_ranks",
                value=f"EP rank {rank} holds {held[rank]}",
                rule="every EP rank must hold (num_experts + num_redundant_experts) / ep = "
                f"{slots // ep} experts",
            )


def _check_rules(plan: ShardingPlan) -> None:
    axes = {axis.value for axis in ALL_AXES}
    for index, rule in enumerate(plan.module_rules):
        if rule.mesh_axis not in axes:
            raise PlanError(
                field=f"module_rules[{index}].mesh_axis",
                value=rule.mesh_axis,
                rule=f"must be one of {sorted(axes)}",
            )


def _check_deployment(plan: ShardingPlan) -> None:
    deployment = plan.deployment
    if isinstance(plan.job, Training) and (deployment.pools or deployment.kind != "colocated"):
        raise PlanError(
            field="deployment.kind",
            value=deployment.kind,
            rule="a training job is colocated, without pools",
        )
    for index, pool in enumerate(deployment.pools):
        check_layout(
            pool.config,
            model=plan.model,
            world_size=pool.devices_per_unit,
            field=f"deployment.pools[{index}].config",
            num_redundant_experts=_redundant_slots(pool.serving),
        )
    used = sum(pool.num_devices for pool in deployment.pools)
    if used > plan.world_size:
        raise PlanError(
            field="deployment.pools",
            value=f"{used} devices",
            rule=f"must fit in world_size ({plan.world_size})",
        )
    roles = sorted(pool.role for pool in deployment.pools)
    if deployment.kind == "disaggregated" and roles != ["decode", "prefill"]:
        raise PlanError(
            field="deployment.pools",
            value=roles,
            rule="a disaggregated deployment has one prefill and one decode pool",
        )
