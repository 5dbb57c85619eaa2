"""``Candidate``: one priced layout, and the search result that ranks them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cost_model import Layout, ParallelConfig, ServingConfig
from search._objective import Evaluation, Objective
from search._space import config_from_row, row_extras


@dataclass(frozen=True)
class Candidate:
    """A ``Layout`` (config + inference serving settings such as the batch size), its predicted
    metrics and its normalized constraint violations (> 0 violated)."""

    layout: Layout
    metrics: dict[str, float]
    violations: dict[str, float]
    trial_number: int | None = None

    @property
    def config(self) -> ParallelConfig:
        return self.layout.config

    @property
    def serving(self) -> ServingConfig | None:
        return self.layout.serving

    @property
    def feasible(self) -> bool:
        return all(v <= 0 for v in self.violations.values())

    @property
    def worst_violation(self) -> float:
        return max(self.violations.values(), default=0.0)

    def objective_values(self, objective: Objective) -> tuple[float, ...]:
        return tuple(float(self.metrics[column]) for column in objective.columns)

    def score(self, objective: Objective) -> float:
        """Primary objective, lower is better."""
        value = float(self.metrics[objective.columns[0]])
        return value if objective.directions[0] == "minimize" else -value

    def to_attrs(self) -> dict[str, Any]:
        """JSON-able form (Optuna user attributes; the dashboard shows it). The per-part times are
        left out (``autoparallel`` re-prices the plans it keeps): they would double every trial."""
        return {
            "config": self.config.model_dump(mode="json"),
            "serving": None if self.serving is None else self.serving.model_dump(mode="json"),
            "metrics": {k: _finite(v) for k, v in self.metrics.items() if not k.startswith(("time.", "hidden."))},
            "violations": {k: _finite(v) for k, v in self.violations.items()},
        }

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any], *, trial_number: int | None = None) -> Candidate:
        return cls(
            layout=_stored_layout(attrs),
            metrics={k: float(v) for k, v in attrs["metrics"].items()},
            violations={k: float(v) for k, v in attrs["violations"].items()},
            trial_number=trial_number,
        )

    def with_trial(self, number: int) -> Candidate:
        return Candidate(self.layout, self.metrics, self.violations, number)

    def mesh_key(self) -> tuple:
        c = self.config
        return (c.dp, c.tp, c.pp, c.cp, c.ep, c.etp, c.attention_data_parallel)


def _stored_layout(attrs: dict[str, Any]) -> Layout:
    """The layout of a stored trial: ``config`` and ``serving`` (or, in studies written before
    serving settings were typed, the serving columns among ``extras``)."""
    serving = attrs.get("serving")
    if serving is None and "extras" in attrs:
        serving = {k: v for k, v in attrs["extras"].items() if k in ServingConfig.model_fields} or None
    return Layout(config=ParallelConfig.model_validate(attrs["config"]), serving=None if serving is None else ServingConfig(**serving))


def layout_at(table: dict[str, np.ndarray], index: int) -> Layout:
    """The ``Layout`` of row ``index`` of a config table: serving settings when the table has
    the inference columns."""
    extras = row_extras(table, index)
    serving = {k: v for k, v in extras.items() if k in ServingConfig.model_fields}
    return Layout(config=config_from_row(table, index), serving=ServingConfig(**serving) if serving else None)


def _finite(value: float) -> float:
    value = float(value)
    return value if math.isfinite(value) else (1e300 if value > 0 else -1e300)


def candidate_at(evaluation: Evaluation, index: int) -> Candidate:
    table = evaluation.table
    return Candidate(
        layout=layout_at(table, index),
        metrics={k: float(np.asarray(v)[index]) for k, v in evaluation.metrics.items() if np.ndim(v) == 1},
        violations={k: float(v[index]) for k, v in evaluation.violations.items()},
    )


def best_row(evaluation: Evaluation, objective: Objective, rows: np.ndarray) -> int:
    """Among ``rows``: the best feasible one by the primary objective, else the least violating."""
    feasible = evaluation.feasible[rows]
    if feasible.any():
        candidates = rows[feasible]
        scores = objective.score(evaluation.metrics)[candidates]
        scores = np.where(np.isfinite(scores), scores, np.inf)
        return int(candidates[np.argmin(scores)])
    return int(rows[np.argmin(evaluation.worst_violation[rows])])


def pareto_rows(evaluation: Evaluation, objective: Objective, rows: np.ndarray, *, limit: int = 8) -> list[int]:
    """Feasible non-dominated rows among ``rows`` (both objectives oriented lower-is-better)."""
    rows = rows[evaluation.feasible[rows]]
    if not len(rows):
        return []
    points = np.stack(
        [
            np.asarray(evaluation.metrics[c], dtype=np.float64)[rows] * (1 if d == "minimize" else -1)
            for c, d in zip(objective.columns, objective.directions)
        ],
        axis=1,
    )
    keep = non_dominated(points)
    front = rows[keep]
    order = np.argsort(points[keep, 0])
    front = front[order]
    if len(front) > limit:  # spread the kept points evenly along the front
        front = front[np.unique(np.linspace(0, len(front) - 1, limit).round().astype(int))]
    return [int(r) for r in front]


def non_dominated(points: np.ndarray) -> np.ndarray:
    """Boolean mask of the rows of ``points`` (minimize every column) no other row dominates."""
    order = np.lexsort(points.T[::-1])
    mask = np.zeros(len(points), dtype=bool)
    best_second = np.inf
    for index in order:  # sorted by first objective, ties by second: a sweep finds the 2-D front
        if points[index, 1] < best_second:
            mask[index] = True
            best_second = points[index, 1]
    return mask


@dataclass(frozen=True)
class SearchResult:
    """What a search found. ``ranked`` holds the best layout of each of the best meshes, best first
    (``ranked[0] is best``); ``pareto`` the non-dominated layouts of a two-objective search."""

    best: Candidate
    ranked: tuple[Candidate, ...]
    pareto: tuple[Candidate, ...]
    objective: Objective
    method: str
    space_size: int
    num_meshes: int
    num_trials: int
    num_trials_this_run: int
    rows_evaluated: int
    infeasible_trials: dict[str, int]
    infeasible_rows: dict[str, int]
    elapsed_s: float
    study_name: str
    storage: str | None
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def feasible(self) -> bool:
        return self.best.feasible

    def explain_infeasible(self) -> str:
        """One line: how many trials and layouts were infeasible, and why."""
        trials = sum(self.infeasible_trials.values())
        parts = [f"{name} {count}" for name, count in sorted(self.infeasible_rows.items()) if count]
        why = ", ".join(parts) if parts else "none"
        return (
            f"{trials} of {self.num_trials} trials had no feasible layout; "
            f"infeasible layouts among {self.rows_evaluated:,} priced: {why}"
        )
