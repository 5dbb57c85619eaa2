"""Exhaustive baseline: price every legal layout with the vectorized cost model, in chunks.

It answers "how far from the true optimum is the Optuna search" (regret) on the same space,
objective and constraints, and decides feasibility when the study finds nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from cost_model import Inference, ModelSpec, Training
from search._candidate import Candidate, best_row, candidate_at
from search._objective import Estimator, Objective, default_estimator, evaluate, resolve_objective
from search._space import SearchBounds, SearchSpace
from topology import Cluster


@dataclass(frozen=True)
class ExhaustiveResult:
    """The optimum over the whole space (feasible if any layout is), with counts."""

    best: Candidate
    objective: Objective
    space_size: int
    num_feasible: int
    infeasible_rows: dict[str, int]
    elapsed_s: float


def exhaustive_search(
    model: ModelSpec,
    cluster: Cluster,
    workload: Training | Inference,
    *,
    objective: str | tuple[str, ...] | Objective | None = None,
    bounds: SearchBounds | None = None,
    estimator: Estimator | None = None,
    chunk_rows: int = 200_000,
) -> ExhaustiveResult:
    """Price every layout of the space; the best by the primary objective among feasible ones
    (or the least violating one when none is feasible)."""
    start = time.perf_counter()
    objective = resolve_objective(objective, workload)
    estimator = estimator or default_estimator()
    space = SearchSpace(
        model=model,
        workload=workload,
        world_size=cluster.num_devices,
        devices_per_node=cluster.devices_per_node,
        bounds=bounds,
    )
    best: Candidate | None = None
    size = feasible = 0
    infeasible: dict[str, int] = {}
    for table in space.iter_chunks(max_rows=chunk_rows):
        evaluation = evaluate(
            model=model, cluster=cluster, workload=workload, table=table, estimator=estimator
        )
        rows = np.arange(len(table["dp"]))
        size += len(rows)
        feasible += int(evaluation.feasible.sum())
        for name, violation in evaluation.violations.items():
            infeasible[name] = infeasible.get(name, 0) + int((violation > 0).sum())
        challenger = candidate_at(evaluation, best_row(evaluation, objective, rows))
        if best is None or _better(challenger, best, objective):
            best = challenger
    if best is None:
        raise ValueError(f"no legal layout of {model.name} on {cluster.num_devices} devices")
    return ExhaustiveResult(
        best=best,
        objective=objective,
        space_size=size,
        num_feasible=feasible,
        infeasible_rows=infeasible,
        elapsed_s=time.perf_counter() - start,
    )


def _better(a: Candidate, b: Candidate, objective: Objective) -> bool:
    if a.feasible != b.feasible:
        return a.feasible
    if not a.feasible:
        return a.worst_violation < b.worst_violation
    return a.score(objective) < b.score(objective)


def regret(found: Candidate, optimum: Candidate, objective: Objective) -> float:
    """Relative shortfall of ``found`` against ``optimum`` on the primary objective (0 = optimal)."""
    if not optimum.feasible:
        raise ValueError("regret is undefined: the space has no feasible layout")
    if not found.feasible:
        return float("inf")
    best, value = optimum.score(objective), found.score(objective)
    return float((value - best) / abs(best)) if best else 0.0
