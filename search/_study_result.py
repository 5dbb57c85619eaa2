"""Reading a study's finished trials back: their ranking and the ``SearchResult`` they make.

Each finished trial holds one user attribute ``result`` (``_attrs``: the mesh, its best layout,
local Pareto rows and row-level infeasibility counts). Trials rank feasible first, then by the
objective's score (infeasible ones by their worst violation); the result keeps the ``top_k``
best distinct meshes and, for a multi-objective study, the non-dominated feasible layouts of
all trials' local fronts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from search._candidate import Candidate, SearchResult
from search._objective import Objective
from search._storage import redacted
from search._study_problem import _Problem

if TYPE_CHECKING:  # optuna is imported on first use (search._lazy); the checker sees the module
    import optuna
else:
    from search._lazy import optuna


def _attrs(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    return trial.user_attrs.get("result", {})


def _finished(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))


def num_finished(study: optuna.Study) -> int:
    """Finished trials, counted by the storage (cheaper than reading them)."""
    return study._storage.get_n_trials(study._study_id, state=optuna.trial.TrialState.COMPLETE)


def _best_trial(study: optuna.Study, objective: Objective) -> optuna.trial.FrozenTrial | None:
    ranked = _ranked_trials(_finished(study), objective)
    return ranked[0] if ranked else None


def _ranked_trials(trials, objective: Objective) -> list:
    def key(trial):
        candidate = Candidate.from_attrs(_attrs(trial)["candidate"])
        return (
            not candidate.feasible,
            candidate.worst_violation if not candidate.feasible else candidate.score(objective),
        )

    return sorted((t for t in trials if "candidate" in _attrs(t)), key=key)


def _collect(
    study, problem: _Problem, *, method, ran, elapsed_s, storage, settings, seed
) -> SearchResult:
    trials = _finished(study)
    ranked_trials = _ranked_trials(trials, problem.objective)
    ranked, seen = [], set()
    for trial in ranked_trials:
        candidate = Candidate.from_attrs(_attrs(trial)["candidate"], trial_number=trial.number)
        if candidate.mesh_key() not in seen:
            seen.add(candidate.mesh_key())
            ranked.append(candidate)
        if len(ranked) >= settings.top_k:
            break
    infeasible_trials: dict[str, int] = {}
    infeasible_rows: dict[str, int] = {}
    rows = 0
    for trial in trials:
        candidate = Candidate.from_attrs(_attrs(trial)["candidate"])
        if not candidate.feasible:
            reason = max(candidate.violations, key=lambda name: candidate.violations[name])
            infeasible_trials[reason] = infeasible_trials.get(reason, 0) + 1
    for mesh_attrs in {_attrs(t)["mesh_index"]: _attrs(t) for t in trials}.values():
        rows += mesh_attrs.get("rows", 0)
        for name, count in mesh_attrs.get("infeasible_rows", {}).items():
            infeasible_rows[name] = infeasible_rows.get(name, 0) + count
    return SearchResult(
        best=ranked[0],
        ranked=tuple(ranked),
        pareto=_pareto(trials, problem.objective),
        objective=problem.objective,
        method=method,
        space_size=problem.space.size,
        num_meshes=problem.space.num_meshes,
        num_trials=len(trials),
        num_trials_this_run=ran,
        rows_evaluated=rows,
        infeasible_trials=infeasible_trials,
        infeasible_rows=infeasible_rows,
        elapsed_s=elapsed_s,
        study_name=study.study_name,
        storage=redacted(storage)
        if storage is None or isinstance(storage, str)
        else type(storage).__name__,
        settings={
            "sampler": method,
            "seed": seed,
            **settings.model_dump(mode="json", exclude={"study_name"}),
        },
    )


def _pareto(trials, objective: Objective) -> tuple[Candidate, ...]:
    if not objective.is_multi:
        return ()
    from search._candidate import non_dominated

    pool = [
        Candidate.from_attrs(a, trial_number=t.number)
        for t in trials
        for a in _attrs(t).get("front", [])
    ]
    pool = [c for c in pool if c.feasible]
    if not pool:
        return ()
    points = np.array(
        [
            [
                v if d == "minimize" else -v
                for v, d in zip(c.objective_values(objective), objective.directions)
            ]
            for c in pool
        ]
    )
    mask = non_dominated(points)
    front = sorted(
        (c for c, keep in zip(pool, mask) if keep), key=lambda c: c.objective_values(objective)[0]
    )
    unique, seen = [], set()
    for c in front:
        key = c.layout
        if key not in seen:
            seen.add(key)
            unique.append(c)
    return tuple(unique)
