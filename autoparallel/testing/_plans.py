"""``plan_for_config``: the ``ShardingPlan`` of one given ``ParallelConfig``, without a search.

Multi-rank tests need a plan for an exact layout (tp2, pp2 x dp2 x tp2, ...). This builds it with
the planner's own pure plan-building functions (mesh axes, rank placement, stages, expert
placement, module rules), so the plan is what ``find_plan`` would write for that layout.
"""

from __future__ import annotations

from autoparallel._plan import Provenance, ShardingPlan
from cost_model import Inference, ModelSpec, ParallelConfig, Training

__all__ = ["plan_for_config"]


def plan_for_config(
    model: ModelSpec,
    config: ParallelConfig,
    *,
    workload: Training | Inference | None = None,
    cluster_name: str = "cpu-loopback",
) -> ShardingPlan:
    """The plan of ``config`` for ``model`` on ``config.world_size`` ranks (no predicted cost).

    ``workload`` defaults to training 4 sequences of 16 tokens per data-parallel rank.
    Raises ``ValueError`` when ``config`` is not legal for ``model``.
    """
    from autoparallel import _planner
    from autoparallel._module_rules import module_rules_for

    config.validate_for(model, config.world_size)
    if workload is None:
        workload = Training(sequence_length_tokens=16, global_batch_sequences=4 * config.dp * config.micro_batch_size)
    provenance = Provenance(
        library_version="test",
        model_name=model.name,
        model_fingerprint=model.fingerprint(),
        cluster_name=cluster_name,
        cluster_fingerprint="",
        workload=workload.model_dump(mode="json"),
    )
    return ShardingPlan(
        provenance=provenance,
        world_size=config.world_size,
        config=config,
        mesh_axes=_planner.dense_mesh_axes(config),
        moe_mesh_axes=_planner.moe_mesh_axes(config) if model.moe is not None else (),
        rank_to_device=tuple(range(config.world_size)),
        stages=_planner.pipeline_stages(num_layers=model.num_layers, config=config),
        expert_placement=_planner.expert_placement(model=model, config=config, extras={}),
        module_rules=module_rules_for(model=model, config=config),
    )
