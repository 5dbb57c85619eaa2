"""``find_plan``: an Optuna study (ask/tell) over the meshes of a ``SearchSpace``.

Each trial samples one *level* (index into the sorted legal values) per mesh axis; the levels are
mapped to the nearest legal mesh (L1 distance in levels), so every trial prices a legal layout.
Trials are asked in batches; the switch tables of the batch's meshes are priced with one call of
the vectorized cost model, and each trial is told the value of its best row, with memory and SLO
violations set as Optuna constraints (``Trial.set_constraint``). When the space has no more meshes
than the trial budget, or few layouts, every mesh is priced instead (brute force) and recorded as
finished trials. The last ``polish_fraction`` of the budget walks the neighbours of the best mesh
found (a local refinement, still as trials).

This module chooses the devices and the method and opens the study; the settings and the priced
problem live in ``_study_problem``, the trial loops (brute force, ask/tell batches, polish) in
``_study_trials``, and the ranking of finished trials into a ``SearchResult`` in
``_study_result``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cost_model import Inference, ModelSpec, ParallelConfig, Training
from search._candidate import SearchResult
from search._idle import DeviceChoice, device_choices
from search._liveness import fail_orphans, fail_stale
from search._objective import Estimator, Objective, default_estimator, resolve_objective
from search._space import empty_space_reason
from search._storage import (
    _retry_creation,
    creation_lock,
    make_sampler,
    open_storage,
    study_name_for,
)
from search._study_job import check_or_record_job, job_fingerprint, job_record
from search._study_problem import SearchSettings, _Problem
from search._study_result import _attrs, _collect, _finished
from search._study_trials import _run_brute_force, _run_trials
from topology import Cluster

if TYPE_CHECKING:  # optuna is imported on first use (search._lazy); the checker sees the module
    import optuna
else:
    from search._lazy import optuna

logger = logging.getLogger(__name__)

Progress = Callable[[int, int], None]


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
    # the cut cluster's name says what it uses: "@2n" (whole nodes) or "@1n64d" (hosts idle)
    shape = choice.cluster.name.rsplit("@", 1)[-1]
    return settings.model_copy(update={"study_name": f"{settings.study_name}@{shape}"})


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
    """``result`` stating the devices it used (``settings['num_nodes_used']`` nodes of
    ``settings['devices_per_node_used']`` devices) and why some idle."""
    used = {
        "num_nodes_used": choice.cluster.num_nodes,
        "devices_per_node_used": choice.cluster.devices_per_node,
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
