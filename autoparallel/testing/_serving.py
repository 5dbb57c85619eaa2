"""One serving layout's iteration cost and admission policy, as the closed form and the
simulator share them (``cost_model.serving_inputs``), for tests that compare
the two."""

from __future__ import annotations

from typing import Any


def serving_row(
    model: str, preset: str, config, *, nodes: int = 1, **workload: Any
) -> tuple[Any, Any, float]:
    """(iteration cost, load policy, replicas) of ``config`` serving catalog ``model`` on
    ``nodes`` of ``preset`` under ``Inference(**workload)`` with the engine's defaults."""
    from autoparallel import get_model
    from cost_model import Inference, ServingConfig, configs_to_table, serving_inputs
    from topology import get_preset

    job = Inference(**workload)
    table = configs_to_table([config], **ServingConfig().columns(workload=job))
    cost, policy, replicas = serving_inputs(
        model=get_model(model),
        cluster=get_preset(preset, num_nodes=nodes),
        workload=job,
        table=table,
    )
    return cost.row(0), policy.row(0), float(replicas[0])
