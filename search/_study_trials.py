"""Running a study's trials: brute force, the ask/tell batches and the polish around the best mesh.

Brute force prices every mesh not yet in the study and adds each chunk as finished trials. The
sampled study asks trials in batches; the switch tables of the batch's meshes are priced with one
call of the vectorized cost model, and each trial is told the value of its best row, with memory
and SLO violations set as Optuna constraints (``Trial.set_constraint``). The last
``polish_fraction`` of the budget walks the neighbours of the best mesh found (a local
refinement, still as trials).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from search._candidate import Candidate
from search._interrupts import raise_if_interrupted
from search._liveness import ask, beating, claim, fail_stale, owner, settle
from search._objective import Objective
from search._study_problem import SearchSettings, _Problem
from search._study_result import _attrs, _best_trial, _finished, num_finished

if TYPE_CHECKING:  # optuna is imported on first use (search._lazy); the checker sees the module
    import optuna
else:
    from search._lazy import optuna

logger = logging.getLogger(__name__)


def _run_brute_force(
    study: optuna.Study, problem: _Problem, *, progress, chunk_meshes: int = 256
) -> int:
    """Price every mesh not yet in the study, a chunk per cost-model call, and add each chunk as
    finished trials (``Study.add_trials``: no sampler involved, constraints included). A killed run
    loses at most the chunk in flight."""
    total, ran = problem.space.num_meshes, 0
    distributions = {
        name: optuna.distributions.IntDistribution(0, int(problem.sampled_levels[:, i].max()))
        for i, name in enumerate(problem._param_names())
    }
    while True:  # re-read what is done before each chunk: workers elsewhere may be pricing too
        raise_if_interrupted()
        done = {_attrs(t).get("mesh_index") for t in _finished(study)}
        todo = [m for m in range(problem.space.num_meshes) if m not in done][:chunk_meshes]
        if not todo:
            return ran
        priced = problem.price(todo)
        study.add_trials(
            [_frozen_trial(problem, mesh, result, distributions) for mesh, result in priced.items()]
        )
        ran += len(priced)
        if progress is not None:
            progress(len(done) + len(priced), total)


def _frozen_trial(
    problem: _Problem, mesh: int, priced: dict[str, Any], distributions
) -> optuna.trial.FrozenTrial:
    best: Candidate = priced["best"]
    values = [float(np.clip(v, -1e30, 1e30)) for v in best.objective_values(problem.objective)]
    constraints = {
        f"constraints:{k}": (max(float(v), 0.0) if not best.feasible else 0.0)
        for k, v in best.violations.items()
    }
    return optuna.trial.create_trial(
        params=problem.level_params(mesh),
        distributions=distributions,
        values=values,
        user_attrs={"result": _result_attr(mesh, priced)},
        system_attrs=constraints,
    )


def _result_attr(mesh: int, priced: dict[str, Any]) -> dict[str, Any]:
    """One attribute per trial (each is a storage transaction): the mesh, the best layout of it,
    its local Pareto rows and row-level infeasibility counts; Optuna Dashboard shows it."""
    return {
        "mesh_index": mesh,
        "worker_pid": os.getpid(),
        "candidate": priced["best"].to_attrs(),
        "infeasible_rows": priced["infeasible_rows"],
        "rows": priced["rows"],
        "front": priced["front"],
    }


def _run_trials(
    study, problem: _Problem, *, n_trials: int, settings: SearchSettings, progress
) -> int:
    """Ask, price and tell batches until the study holds ``n_trials`` finished trials and no trial
    of another search process is in flight (``settle``). Each batch first fails the stale trials
    of dead workers (they are enqueued again), and keeps a heartbeat on its own trials from their
    claim until they are told. A trial failed by another process meanwhile (this one paused past
    the grace period) is dropped: its retry is in the queue."""
    cache: dict[int, dict[str, Any]] = {}
    ran = 0
    polish_from = int(n_trials * (1 - settings.polish_fraction))
    grace_s = settings.grace_period_s or 2 * (settings.heartbeat_interval_s or 10)
    me = owner()
    while True:
        raise_if_interrupted()
        fail_stale(study)
        done = num_finished(study)
        # Past the budget, still run the retries of trials failed as stale (a killed worker's batch).
        size = (
            min(settings.batch_size, n_trials - done)
            if done < n_trials
            else _waiting_retries(study)
        )
        if size <= 0:
            # Trials of other processes failed meanwhile are retried before this one returns.
            if settle(study, grace_s=grace_s) == 0:
                break
            continue
        if polish_from <= done < n_trials:
            _enqueue_neighbours(study, problem, budget=size)
        trials: list[optuna.Trial] = []
        # Beating from the first claim: asking a batch may outlast the grace period.
        with beating(study, trials):
            for _ in range(size):  # each trial is claimed at once: a dead worker's trial is found
                trial = ask(study)
                if claim(study, trial, me):
                    trials.append(trial)
            meshes = _suggest(problem, trials)
            missing = [m for m in set(meshes.values()) if m not in cache]
            if missing:
                cache.update(problem.price(missing))
            for trial, mesh in meshes.items():
                try:
                    _tell(study, trial, mesh, cache[mesh], problem.objective)
                except (
                    optuna.exceptions.UpdateFinishedTrialError
                ):  # failed as stale meanwhile: it is retried
                    logger.warning(
                        "trial %d was failed by another worker (no heartbeat for the grace period)",
                        trial.number,
                    )
        ran += len(meshes)
        if progress is not None:
            progress(min(done + len(trials), n_trials), n_trials)
    return ran


def _suggest(problem: _Problem, trials: list[optuna.Trial]) -> dict[optuna.Trial, int]:
    """The mesh of each trial, leaving out those another process failed as stale meanwhile."""
    meshes = {}
    for trial in trials:
        try:
            meshes[trial] = problem.suggest(trial)
        except optuna.exceptions.UpdateFinishedTrialError:
            logger.warning(
                "trial %d was failed by another worker before it was priced", trial.number
            )
    return meshes


def _waiting_retries(study: optuna.Study) -> int:
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    return sum("failed_trial" in trial.system_attrs for trial in waiting)


def _tell(
    study, trial: optuna.Trial, mesh: int, priced: dict[str, Any], objective: Objective
) -> None:
    best: Candidate = priced["best"]
    trial.set_user_attr("result", _result_attr(mesh, priced))
    for name, value in best.violations.items():
        trial.set_constraint(name, max(float(value), 0.0) if not best.feasible else 0.0)
    values = [float(np.clip(v, -1e30, 1e30)) for v in best.objective_values(objective)]
    study.tell(trial, values)


def _enqueue_neighbours(study, problem: _Problem, *, budget: int) -> None:
    """Enqueue up to ``budget`` unpriced meshes around the best one: every mesh that differs from it
    on one axis only (a line search along each axis, nearest levels first), then two-axis moves
    within L1 distance 2 (e.g. ep up, etp down) — in the sampled coordinates, then in the folded
    ones (``_Problem._folded_levels``)."""
    best = _best_trial(study, problem.objective)
    if best is None or not problem.axes:
        return
    trials = study.get_trials(deepcopy=False)
    # Meshes priced, and meshes any worker has enqueued and not priced yet (no double work).
    seen = (
        {_attrs(t).get("mesh_index") for t in trials}
        | {t.user_attrs.get("enqueued_mesh") for t in trials}
        | problem.enqueued
    )
    center = _attrs(best)["mesh_index"]
    (lines_a, near_a), (lines_b, near_b) = (
        _moves(problem.levels, center),
        _moves(problem.folded_levels, center),
    )
    order = np.concatenate([_round_robin(lines_a + lines_b), near_a, near_b])
    picked = [i for i in dict.fromkeys(int(i) for i in order) if i not in seen][:budget]
    for index in picked:
        problem.enqueued.add(index)
        study.enqueue_trial(problem.level_params(index), user_attrs={"enqueued_mesh": index})


def _moves(levels: np.ndarray, center: int) -> tuple[list[np.ndarray], np.ndarray]:
    """(for each axis, the meshes that differ from ``center`` on that axis only, nearest first;
    two-axis moves of L1 distance 2)."""
    delta = np.abs(levels - levels[center])
    axes_moved, distance = (delta > 0).sum(axis=1), delta.sum(axis=1)
    lines = []
    for axis in range(levels.shape[1]):
        line = np.flatnonzero((axes_moved == 1) & (delta[:, axis] > 0))
        line = line[np.argsort(distance[line], kind="stable")]
        # nearest, farthest, 2nd nearest, 2nd farthest...: the ends of a line show its trend early
        ends = np.empty_like(line)
        ends[0::2], ends[1::2] = line[: (len(line) + 1) // 2], line[::-1][: len(line) // 2]
        lines.append(ends)
    near = np.flatnonzero((axes_moved > 1) & (distance <= 2))
    return lines, near[np.argsort(distance[near], kind="stable")]


def _round_robin(lines: list[np.ndarray]) -> np.ndarray:
    """One point of each line in turn (a coordinate sweep that reaches every axis early)."""
    longest = max((len(line) for line in lines), default=0)
    return np.array(
        [line[i] for i in range(longest) for line in lines if i < len(line)], dtype=np.int64
    )
