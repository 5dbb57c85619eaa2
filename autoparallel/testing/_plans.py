"""``plan_for_config``: the ``ShardingPlan`` of one given ``ParallelConfig``, without a search.

Multi-rank tests need a plan for an exact layout (tp2, pp2 x dp2 x tp2, ...). This builds it with
``autoparallel.plan.build_plan``, so the plan is what ``find_plan`` would write for that layout.
"""

from __future__ import annotations

from autoparallel.plan import PlanRecord, ShardingPlan, build_plan
from cost_model import Inference, Layout, ModelSpec, ParallelConfig, Training

__all__ = ["plan_for_config"]


def plan_for_config(
    model: ModelSpec,
    config: ParallelConfig,
    *,
    workload: Training | Inference | None = None,
    cluster_name: str = "cpu-loopback",
) -> ShardingPlan:
    """The plan of ``config`` for ``model`` on ``config.world_size`` ranks (no predicted cost), on
    enough nodes of the preset ``cluster_name``.

    ``workload`` defaults to training 4 sequences of 16 tokens per data-parallel rank.
    Raises ``ValueError`` when ``config`` is not legal for ``model``.
    """
    from topology import get_preset

    config.validate_for(model, config.world_size)
    if workload is None:
        workload = Training(sequence_length_tokens=16, global_batch_sequences=4 * config.dp * config.micro_batch_size)
    per_node = get_preset(cluster_name).devices_per_node
    cluster = get_preset(cluster_name, num_nodes=-(-config.world_size // per_node))
    record = PlanRecord(library_version="test", created_at="")  # the same plan in every process
    return build_plan(model=model, cluster=cluster, job=workload, layout=Layout(config=config), predicted=None, record=record)
