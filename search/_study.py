"""``find_plan``: an Optuna study (ask/tell) over the meshes of a ``SearchSpace``.

Each trial samples one *level* (index into the sorted legal values) per mesh axis; the levels are
mapped to the nearest legal mesh (L1 distance in levels), so every trial prices a legal layout.
Trials are asked in batches; the switch tables of the batch's meshes are priced with one call of
the vectorized cost model, and each trial is told the value of its best row, with memory and SLO
violations set as Optuna constraints (``Trial.set_constraint``). When the space has no more meshes
than the trial budget, or few layouts, every mesh is priced instead (brute force) and recorded as
finished trials. The last ``polish_fraction`` of the budget walks the neighbours of the best mesh
found (a local refinement, still as trials).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from cost_model import Inference, ModelSpec, ParallelConfig, Training
from search._candidate import (
    Candidate,
    SearchResult,
    best_row,
    candidate_at,
    pareto_rows,
)
from search._idle import DeviceChoice, device_choices
from search._liveness import (
    ask,
    beating,
    claim,
    fail_orphans,
    fail_stale,
    owner,
    settle,
)
from search._objective import (
    Estimator,
    Objective,
    default_estimator,
    evaluate,
    resolve_objective,
)
from search._space import MESH_AXES, SearchBounds, SearchSpace, empty_space_reason
from search._storage import (
    _retry_creation,
    creation_lock,
    make_sampler,
    open_storage,
    redacted,
    study_name_for,
)
from search._study_job import check_or_record_job, job_fingerprint, job_record
from topology import Cluster

if TYPE_CHECKING:  # optuna is imported on first use (search._lazy); the checker sees the module
    import optuna
else:
    from search._lazy import optuna

logger = logging.getLogger(__name__)

Progress = Callable[[int, int], None]


class SearchSettings(BaseModel):
    """Knobs of the study beyond the sampler, storage and seed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_size: int = Field(default=16, gt=0, description="trials asked and priced together")
    top_k: int = Field(default=5, gt=0, description="alternatives kept in the result")
    polish_fraction: float = Field(
        default=0.4, ge=0, le=1, description="share of the budget spent around the best mesh"
    )
    brute_force_limit: int | None = Field(
        default=None, description="meshes; default: the trial budget"
    )
    brute_force_layouts: int = Field(
        default=20_000,
        ge=0,
        description="also brute-force a space of at most this many layouts (cheaper than a study)",
    )
    bounds: SearchBounds = SearchBounds()
    study_name: str | None = None
    heartbeat_interval_s: int | None = Field(
        default=5,
        gt=0,
        description="RDB storages: seconds between heartbeats of in-flight trials (None: off)",
    )
    grace_period_s: int | None = Field(
        default=20,
        gt=0,
        description="a trial without a heartbeat for this long is failed and retried",
    )
    idle_devices: Literal["never", "when_needed", "compare"] = Field(
        default="when_needed",
        description="plan on fewer whole nodes when no layout uses them all (when_needed), or also "
        "search the largest smaller legal node count and keep the faster plan (compare)",
    )
    coordinates: Literal["mesh", "folded"] = Field(
        default="folded",
        description="sample ep (mesh) or the expert-data-parallel degree edp (folded; fewer stuck seeds on ref-3t-moe)",
    )

    @model_validator(mode="after")
    def _grace_after_heartbeat(self) -> SearchSettings:
        interval, grace = self.heartbeat_interval_s, self.grace_period_s
        if interval is not None and grace is not None and grace <= interval:
            raise ValueError(
                f"grace_period_s ({grace}) must be > heartbeat_interval_s ({interval}): a live trial would be failed"
            )
        return self


class _Problem:
    """The space plus what is needed to price it; caches priced meshes."""

    def __init__(
        self,
        *,
        model,
        cluster,
        workload,
        objective: Objective,
        estimator: Estimator,
        bounds: SearchBounds,
        coordinates: str = "mesh",
    ):
        self.model, self.cluster, self.workload, self.objective = (
            model,
            cluster,
            workload,
            objective,
        )
        self.coordinates = coordinates
        self.estimator = estimator
        self.space = SearchSpace(
            model=model,
            workload=workload,
            world_size=cluster.num_devices,
            devices_per_node=cluster.devices_per_node,
            bounds=bounds,
        )
        self.axes = [
            a
            for a in (*MESH_AXES, "attention_data_parallel")
            if len(self.space.axis_choices[a]) > 1
        ]
        self.levels = (
            np.stack(
                [
                    np.searchsorted(self.space.axis_choices[a], self.space.mesh[a])
                    for a in self.axes
                ],
                axis=1,
            )
            if self.axes
            else np.zeros((self.space.num_meshes, 0), dtype=np.int64)
        )
        self.enqueued: set[int] = set()
        self.folded_levels = self._folded_levels()

    def _folded_levels(self) -> np.ndarray:
        """Levels in the *folded* coordinates: ep replaced by edp = dp*cp*tp / (ep*etp).

        Expert memory per device depends on edp*etp, so moves that keep edp (pp down, ep up
        together) are single steps here; the polish walks both coordinate systems."""
        mesh = self.space.mesh
        edp = mesh["dp"] * mesh["cp"] * mesh["tp"] // (mesh["ep"] * mesh["etp"])
        columns = [
            np.searchsorted(np.unique(edp), edp) if a == "ep" else self.levels[:, i]
            for i, a in enumerate(self.axes)
        ]
        return np.stack(columns, axis=1) if columns else self.levels

    @property
    def sampled_levels(self) -> np.ndarray:
        """The coordinates the sampler works in (``SearchSettings.coordinates``)."""
        return self.folded_levels if self.coordinates == "folded" else self.levels

    def _param_names(self) -> list[str]:
        rename = {"ep": "edp"} if self.coordinates == "folded" else {}
        return [f"{rename.get(a, a)}_level" for a in self.axes]

    def suggest(self, trial: optuna.Trial) -> int:
        """Mesh index for the trial's sampled levels (nearest legal mesh)."""
        if not self.axes:
            return 0
        levels = self.sampled_levels
        wanted = np.array(
            [
                trial.suggest_int(name, 0, int(levels[:, i].max()))
                for i, name in enumerate(self._param_names())
            ]
        )
        return int(np.argmin(np.abs(levels - wanted).sum(axis=1)))

    def level_params(self, mesh_index: int) -> dict[str, int]:
        return {
            name: int(v) for name, v in zip(self._param_names(), self.sampled_levels[mesh_index])
        }

    def price(self, mesh_indices: list[int]) -> dict[int, dict[str, Any]]:
        """Best row (and local Pareto rows) of each mesh, with row-level infeasibility counts."""
        table = self.space.expand(sorted(set(mesh_indices)))
        evaluation = evaluate(
            model=self.model,
            cluster=self.cluster,
            workload=self.workload,
            table=table,
            estimator=self.estimator,
        )
        out = {}
        for mesh in np.unique(table["mesh_index"]):
            rows = np.flatnonzero(table["mesh_index"] == mesh)
            counts = {name: int((v[rows] > 0).sum()) for name, v in evaluation.violations.items()}
            best = candidate_at(evaluation, best_row(evaluation, self.objective, rows))
            front = (
                [
                    candidate_at(evaluation, r).to_attrs()
                    for r in pareto_rows(evaluation, self.objective, rows)
                ]
                if self.objective.is_multi
                else []
            )
            out[int(mesh)] = {
                "best": best,
                "front": front,
                "rows": len(rows),
                "infeasible_rows": counts,
            }
        return out


def find_plan(
    model: ModelSpec,
    cluster: Cluster,
    workload: Training | Inference,
    *,
    objective: str | tuple[str, ...] | Objective | None = None,
    n_trials: int = 250,
    sampler: str | optuna.samplers.BaseSampler | None = None,
    storage: str | optuna.storages.BaseStorage | None = None,
    seed: int = 0,
    settings: SearchSettings | None = None,
    estimator: Estimator | None = None,
    progress: Progress | None = None,
    warm_start: ParallelConfig | None = None,
) -> SearchResult:
    """Search the legal layouts of ``model`` on ``cluster`` for ``workload``.

    ``n_trials`` is the study's total budget of finished trials: with a persistent ``storage``
    (``sqlite:///study.db``, any RDB URL, or ``journal:PATH``) a killed search resumes where it
    stopped and several processes calling this with the same storage share one budget.
    ``warm_start`` enqueues a known layout's mesh first (re-planning from a running plan).
    Returns the ranked result; no feasible layout at all is a result too (``result.feasible``
    is False) — ``autoparallel.find_plan`` turns it into ``InfeasiblePlanError``.
    """
    settings = settings or SearchSettings()
    if n_trials < 0:
        raise ValueError(
            f"n_trials ({n_trials}) must be >= 0 (0: write the result of the trials the study holds)"
        )
    options: dict[str, Any] = {
        "objective": objective,
        "n_trials": n_trials,
        "sampler": sampler,
        "storage": storage,
        "seed": seed,
        "settings": settings,
        "estimator": estimator,
        "progress": progress,
        "warm_start": warm_start,
    }
    choices = device_choices(
        model=model,
        cluster=cluster,
        workload=workload,
        bounds=settings.bounds,
        mode=settings.idle_devices,
    )
    results = [
        with_devices(
            search_devices(
                model,
                choice.cluster,
                workload,
                **dict(options, settings=settings_for(settings, choice, alone=len(choices) == 1)),
            ),
            choice=choice,
        )
        for choice in choices
    ]
    return best_of(results)


def settings_for(settings: SearchSettings, choice: DeviceChoice, *, alone: bool) -> SearchSettings:
    """A named study holds one job: a smaller node count searched beside another gets its own name."""
    if settings.study_name is None or not choice.idle_reason or alone:
        return settings
    return settings.model_copy(
        update={"study_name": f"{settings.study_name}@{choice.cluster.num_nodes}n"}
    )


def search_devices(
    model,
    cluster,
    workload,
    *,
    n_trials: int,
    settings: SearchSettings,
    progress=None,
    warm_start=None,
    clean_orphans: bool = True,
    **options: Any,
) -> SearchResult:
    """``find_plan`` on exactly ``cluster``'s devices. ``clean_orphans=False`` in the workers of
    ``run_workers``: their parent cleans the study once before starting them."""
    start = time.perf_counter()
    problem, study = open_study(model, cluster, workload, settings=settings, **options)
    if n_trials == 0:
        if not _finished(study):
            raise ValueError(
                f"study ({study.study_name!r}) holds no finished trial to write a plan from"
            )
        method, ran = "from_study", 0
    else:
        method = choose_method(problem, study, n_trials=n_trials, settings=settings)
        ran = _run(
            study,
            problem,
            method=method,
            n_trials=n_trials,
            settings=settings,
            progress=progress,
            warm_start=warm_start,
            clean_orphans=clean_orphans,
        )
    if method in ("from_study", "brute_force"):  # a sampled study was settled by its last batch
        fail_stale(study)
    logger.info(
        "study %s: %d trials this run (%s) over %d meshes",
        study.study_name,
        ran,
        method,
        problem.space.num_meshes,
    )
    return _collect(
        study,
        problem,
        method=method,
        ran=ran,
        elapsed_s=time.perf_counter() - start,
        storage=options["storage"],
        settings=settings,
        seed=options["seed"],
    )


def _run(
    study,
    problem: _Problem,
    *,
    method: str,
    n_trials: int,
    settings: SearchSettings,
    progress,
    warm_start,
    clean_orphans: bool,
) -> int:
    if method == "brute_force":
        return _run_brute_force(study, problem, progress=progress)
    if clean_orphans:
        fail_orphans(study)
    _enqueue_warm_start(study, problem, warm_start=warm_start)
    return _run_trials(study, problem, n_trials=n_trials, settings=settings, progress=progress)


def with_devices(result: SearchResult, *, choice: DeviceChoice) -> SearchResult:
    """``result`` stating the devices it used (``settings['num_nodes_used']``) and why some idle."""
    used = {
        "num_nodes_used": choice.cluster.num_nodes,
        "num_devices_used": choice.cluster.num_devices,
        "idle_reason": choice.idle_reason,
    }
    return dataclasses.replace(result, settings={**result.settings, **used})


def best_of(results: list[SearchResult]) -> SearchResult:
    """The result whose best candidate ranks first (feasible first, then the objective)."""

    def key(result: SearchResult):
        best = result.best
        return (
            not best.feasible,
            best.worst_violation if not best.feasible else best.score(result.objective),
        )

    return min(results, key=key)


def open_study(
    model,
    cluster,
    workload,
    *,
    objective,
    sampler,
    storage,
    seed,
    settings: SearchSettings,
    estimator=None,
):
    """The problem (space, objective, estimator) and its Optuna study, created or loaded by name.

    Creation runs under the storage's creation lock; an existing study must hold the same job
    (``search._study_job``)."""
    objective = resolve_objective(objective, workload)
    if objective.is_multi and not settings.bounds.batch_size_sweep:
        # A throughput/latency front is traced by the batch size: let the study see every batch.
        settings = settings.model_copy(
            update={"bounds": settings.bounds.model_copy(update={"batch_size_sweep": True})}
        )
    problem = _Problem(
        model=model,
        cluster=cluster,
        workload=workload,
        objective=objective,
        estimator=estimator or default_estimator(),
        bounds=settings.bounds,
        coordinates=settings.coordinates,
    )
    if problem.space.num_meshes == 0:
        raise ValueError(empty_space_reason(problem.space))
    name = settings.study_name or study_name_for(
        model=model.name,
        kind=workload.kind,
        world_size=cluster.num_devices,
        model_fingerprint=model.fingerprint(),
        cluster=cluster.fingerprint(),
        workload=workload.model_dump(mode="json"),
        objective=objective.names,
        bounds=settings.bounds.model_dump(mode="json"),
        coordinates=settings.coordinates,
    )
    fingerprint = job_fingerprint(
        model=model, cluster=cluster, workload=workload, objective=objective, settings=settings
    )
    with creation_lock(storage):
        opened = open_storage(
            storage,
            heartbeat_interval_s=settings.heartbeat_interval_s,
            grace_period_s=settings.grace_period_s,
        )
        study = _retry_creation(
            lambda: optuna.create_study(
                storage=opened,
                sampler=make_sampler(sampler, seed=seed, multi_objective=objective.is_multi),
                study_name=name,
                directions=list(objective.directions),
                load_if_exists=True,
            )
        )
        check_or_record_job(
            study,
            fingerprint=fingerprint,
            record=job_record(model=model, cluster=cluster, workload=workload),
        )
    return problem, study


def choose_method(
    problem: _Problem, study: optuna.Study, *, n_trials: int, settings: SearchSettings
) -> str:
    """Brute force when every mesh fits in the trial budget or the whole space is small, else the sampler."""
    limit = settings.brute_force_limit if settings.brute_force_limit is not None else n_trials
    small = problem.space.num_meshes <= limit or problem.space.size <= settings.brute_force_layouts
    return "brute_force" if small else _sampler_name(study.sampler)


def _sampler_name(sampler: optuna.samplers.BaseSampler) -> str:
    return {"TPESampler": "tpe", "NSGAIISampler": "nsga2", "RandomSampler": "random"}.get(
        type(sampler).__name__, type(sampler).__name__
    )


def _attrs(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    return trial.user_attrs.get("result", {})


def _finished(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))


def num_finished(study: optuna.Study) -> int:
    """Finished trials, counted by the storage (cheaper than reading them)."""
    return study._storage.get_n_trials(study._study_id, state=optuna.trial.TrialState.COMPLETE)


def _enqueue_warm_start(
    study: optuna.Study, problem: _Problem, *, warm_start: ParallelConfig | None
) -> None:
    if warm_start is None:
        return
    index = problem.space.find_mesh(
        dp=warm_start.dp,
        tp=warm_start.tp,
        pp=warm_start.pp,
        cp=warm_start.cp,
        ep=warm_start.ep,
        etp=warm_start.etp,
        attention_data_parallel=warm_start.attention_data_parallel,
    )
    if index is not None and index not in {_attrs(t).get("mesh_index") for t in _finished(study)}:
        study.enqueue_trial(problem.level_params(index))


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
