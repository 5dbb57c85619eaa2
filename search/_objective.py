"""What the search optimizes, and how a table of layouts is priced and checked.

An ``Objective`` names metrics of the vectorized cost model and their directions. Rows are
feasible when they fit in memory and meet the workload's SLOs; every violation is reported as a
normalized excess (``needed / allowed - 1``, > 0 means violated) so that Optuna's constraint
handling (``Trial.set_constraint``) can rank infeasible points by how far off they are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from cost_model import Inference, Layout, ModelSpec, Training
from search._space import Table
from topology import Cluster

Direction = Literal["minimize", "maximize"]
Estimator = Callable[..., dict]

#: Named single metrics: name -> (cost-model column, direction).
METRICS: dict[str, tuple[str, Direction]] = {
    "step_time": ("step_time_s", "minimize"),
    "throughput": ("tokens_per_s_per_device", "maximize"),
    "tpot": ("tpot_s", "minimize"),
    "ttft": ("ttft_s", "minimize"),
    "e2e": ("e2e_s", "minimize"),
    "memory": ("memory_per_device_bytes", "minimize"),
    "memory_headroom": ("memory_headroom_bytes", "maximize"),
}
#: Multi-objective presets (Pareto fronts searched with NSGA-II).
PARETO = {"training": ("step_time", "memory_headroom"), "inference": ("throughput", "tpot")}
DEFAULT = {"training": "step_time", "inference": "throughput"}
VIOLATIONS = ("memory", "ttft_slo", "tpot_slo", "cost_model")


class Objective(BaseModel):
    """Metric names (keys of ``METRICS``) with their columns and directions, first one primary."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    names: tuple[str, ...]

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(METRICS[name][0] for name in self.names)

    @property
    def directions(self) -> tuple[Direction, ...]:
        return tuple(METRICS[name][1] for name in self.names)

    @property
    def is_multi(self) -> bool:
        return len(self.names) > 1

    def score(self, metrics: dict[str, np.ndarray]) -> np.ndarray:
        """The primary metric oriented so that lower is better."""
        values = np.asarray(metrics[self.columns[0]], dtype=np.float64)
        return values if self.directions[0] == "minimize" else -values


def resolve_objective(
    objective: str | tuple[str, ...] | Objective | None, workload: Training | Inference
) -> Objective:
    """``None`` -> the workload's default; ``"pareto"`` -> its two-objective preset; a name or names."""
    if isinstance(objective, Objective):
        return objective
    if objective is None and getattr(workload, "request_rate_per_s", None) is not None:
        # an offered rate is carried alike by every layout that serves it on the whole cluster
        # (output tokens/s per device tie): the lower mean end-to-end latency is the better one
        names: tuple[str, ...] = ("e2e",)
    elif objective is None:
        names = (DEFAULT[workload.kind],)
    elif objective == "pareto":
        names = PARETO[workload.kind]
    else:
        names = (objective,) if isinstance(objective, str) else tuple(objective)
    for name in names:
        if name not in METRICS:
            raise ValueError(f"objective ({name!r}) must be one of {sorted(METRICS) + ['pareto']}")
        if workload.kind == "training" and name in ("tpot", "ttft", "e2e"):
            raise ValueError(
                f"objective ({name!r}) is an inference metric; the workload is training"
            )
    if len(set(names)) != len(names) or len(names) > 2:
        raise ValueError(f"objective ({names}) must name one or two distinct metrics")
    return Objective(names=names)


@dataclass(frozen=True)
class Evaluation:
    """Priced rows: cost-model metrics, normalized violations (> 0 violated) and feasibility."""

    table: Table
    metrics: dict[str, np.ndarray]
    violations: dict[str, np.ndarray]

    @property
    def feasible(self) -> np.ndarray:
        return np.all([v <= 0 for v in self.violations.values()], axis=0)

    @property
    def worst_violation(self) -> np.ndarray:
        return np.max(np.stack(list(self.violations.values())), axis=0)


def default_estimator() -> Estimator:
    """``cost_model.estimate_table``, imported when first needed."""
    import cost_model

    estimate_table = getattr(cost_model, "estimate_table", None)
    if estimate_table is None:
        raise ValueError(
            "cost_model.estimate_table is not available in this installation; pass estimator="
        )
    return estimate_table


def evaluate(
    *,
    model: ModelSpec,
    cluster: Cluster,
    workload: Training | Inference,
    table: Table,
    estimator: Estimator,
) -> Evaluation:
    """Price every row of ``table`` with one call of ``estimator(model, cluster, workload, table)``."""
    raw = estimator(model, cluster, workload, table)
    capacity = cluster.memory_per_device_bytes
    memory = np.asarray(raw["memory_per_device_bytes"], dtype=np.float64)
    metrics = {name: np.asarray(value) for name, value in raw.items()}
    metrics["memory_headroom_bytes"] = capacity - memory
    violations = {"memory": np.nan_to_num(memory / capacity - 1.0, nan=0.0)}
    if isinstance(workload, Inference):
        for name, slo in (("ttft_slo", workload.ttft_slo_s), ("tpot_slo", workload.tpot_slo_s)):
            column = _slo_column(metrics, name.removesuffix("_slo"))
            if slo is not None and column is not None:
                violations[name] = np.nan_to_num(column / slo - 1.0, nan=0.0)
    feasible_column = np.asarray(raw.get("feasible", np.ones(len(memory), dtype=bool)), dtype=bool)
    others_ok = np.all([v <= 0 for v in violations.values()], axis=0)
    # Infeasible for a reason of the cost model's own (e.g. no batch fits) while every limit we
    # know holds: count it under "cost_model".
    violations["cost_model"] = np.where(~feasible_column & others_ok, 1.0, 0.0)
    return Evaluation(table=table, metrics=metrics, violations=violations)


def _slo_column(metrics: dict[str, np.ndarray], metric: str) -> np.ndarray | None:
    """The figure an SLO limits: the p90 (``ttft_p90_s``, ``tpot_p90_s``) where the estimator
    gives one, else the mean (``ttft_s``, ``tpot_s``; a pool's pass)."""
    mean = metrics.get(f"{metric}_s")
    if mean is None:
        return None
    mean = np.asarray(mean, dtype=np.float64)
    p90 = metrics.get(f"{metric}_p90_s")
    if p90 is None:
        return mean
    p90 = np.asarray(p90, dtype=np.float64)
    return np.where(np.isfinite(p90), p90, mean)


def simulate_top_k(
    result,
    *,
    model: ModelSpec,
    cluster: Cluster,
    workload: Inference,
    top_k: int = 3,
    estimator=None,
):
    """``result`` (a ``SearchResult``) with its first ``top_k`` colocated candidates checked by the
    iteration-level serving simulator (``cost_model._simulator``).

    Where the workload lets the search choose the load (no ``concurrency`` or
    ``request_rate_per_s``) and SLOs are set, each candidate's concurrency is lowered until the
    simulated p90 TTFT and TPOT meet them; its batch becomes that load and it is re-priced. Each
    checked candidate's metrics gain ``simulated_<ttft|tpot|e2e>_<mean|p90|p99>_s`` and
    ``simulated_concurrency``; the candidates are then re-ranked by the objective.
    """
    import dataclasses

    from cost_model import simulate_layout, slo_concurrency

    choosing = workload.concurrency is None and workload.request_rate_per_s is None
    checked = []
    for candidate in result.ranked[:top_k]:
        serving = _serving_of(candidate)
        if serving.phase != "both":
            checked.append(candidate)
            continue
        check = (
            slo_concurrency
            if choosing and (workload.ttft_slo_s or workload.tpot_slo_s)
            else simulate_layout
        )
        run = check(
            model=model,
            cluster=cluster,
            workload=workload,
            config=candidate.config,
            serving=serving,
        )
        if choosing and run.concurrency_per_replica is not None:
            per_micro_batch = int(-(-run.concurrency_per_replica // candidate.config.pp))
            batch = min(
                per_micro_batch,
                int(candidate.metrics.get("batch_size", per_micro_batch)) or per_micro_batch,
            )
            serving = serving.model_copy(update={"batch_size": batch})
        figures = run.result.summary()
        simulated = {f"simulated_{name}": figures[name] for name in figures if name.endswith("_s")}
        simulated["simulated_concurrency"] = float(
            (run.concurrency_per_replica or 0) * run.replicas
        )
        layout = Layout(config=candidate.config, serving=serving)
        checked.append(
            dataclasses.replace(
                candidate, layout=layout, metrics={**candidate.metrics, **simulated}
            )
        )
    repriced = _repriced(
        checked, model=model, cluster=cluster, workload=workload, estimator=estimator
    )
    ranked = list(repriced) + list(result.ranked[top_k:])
    objective = result.objective
    ranked.sort(
        key=lambda c: (not c.feasible, c.score(objective) if c.feasible else c.worst_violation)
    )
    return dataclasses.replace(result, ranked=tuple(ranked), best=ranked[0])


def _serving_of(candidate):
    from cost_model import ServingConfig

    return candidate.serving if candidate.serving is not None else ServingConfig()


def _repriced(candidates, *, model, cluster, workload, estimator):
    """The candidates priced again at their (possibly lowered) batch, simulated figures kept."""
    import dataclasses

    from cost_model import configs_to_table

    rows = [_serving_of(c).columns(workload=workload) for c in candidates]
    columns = {name: np.concatenate([row[name] for row in rows]) for name in rows[0]}
    table = configs_to_table([c.config for c in candidates], **columns)
    evaluation = evaluate(
        model=model,
        cluster=cluster,
        workload=workload,
        table=table,
        estimator=estimator or default_estimator(),
    )
    repriced = []
    for index, candidate in enumerate(candidates):
        metrics = {
            k: float(np.asarray(v)[index]) for k, v in evaluation.metrics.items() if np.ndim(v) == 1
        }
        simulated = {k: v for k, v in candidate.metrics.items() if k.startswith("simulated_")}
        violations = {k: float(v[index]) for k, v in evaluation.violations.items()}
        repriced.append(
            dataclasses.replace(candidate, metrics={**metrics, **simulated}, violations=violations)
        )
    return repriced
