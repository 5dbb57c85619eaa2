"""Several worker processes searching one Optuna study through a shared storage.

The parent creates the study (schema, study and job record once), fails the trials that dead
processes left RUNNING (once: the workers skip it), closes its database connections, and then
forks ``workers`` processes that each open their own connection and run the study with their own
seed; no connection crosses ``fork()``. Each worker records itself (host, pid) as the owner of
the trials it asks and keeps their heartbeat. A worker dies with its parent (Linux
``PR_SET_PDEATHSIG``; elsewhere it checks its parent between batches), so killing the parent
leaves no orphan worker. A worker that dies is reported; the parent then fails its in-flight
trials and finishes the budget itself, so the command completes with none left RUNNING.
Workers on other machines join by running the same search with the same storage URL and study
name (``SearchSettings.study_name``); a worker with a different job is refused.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import multiprocessing
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from search._candidate import SearchResult
from search._idle import device_choices
from search._lazy import optuna
from search._liveness import alive, fail_orphans, fail_stale
from search._storage import close_storage, open_storage
from search._study import (
    _enqueue_warm_start,
    best_of,
    choose_method,
    open_study,
    search_devices,
    settings_for,
    with_devices,
)
from search._study_problem import SearchSettings
from search._study_result import num_finished

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def run_workers(
    model,
    cluster,
    workload,
    *,
    workers: int,
    storage: str | None = None,
    n_trials: int = 200,
    seed: int = 0,
    settings: SearchSettings | None = None,
    progress=None,
    **options: Any,
) -> SearchResult:
    """Run ``workers`` processes on one study; ``storage=None`` uses a temporary journal file.

    The budget ``n_trials`` is shared: each worker stops once the study holds that many finished
    trials, so the study may end up to ``(workers - 1) * batch_size`` trials over it."""
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers ({workers}) must be an integer >= 1")
    if storage is not None and not isinstance(storage, str):
        raise ValueError(
            f"storage ({type(storage).__name__}) must be a URL: each worker process opens its own connection"
        )
    settings = settings or SearchSettings()
    if storage is None:
        storage = "journal:" + str(Path(tempfile.mkdtemp(prefix="autoparallel-")) / "study.log")
    choices = device_choices(
        model=model,
        cluster=cluster,
        workload=workload,
        bounds=settings.bounds,
        mode=settings.idle_devices,
    )
    common = {
        "workers": workers,
        "storage": storage,
        "n_trials": n_trials,
        "seed": seed,
        "progress": progress,
        "options": options,
    }
    return best_of(
        [
            with_devices(
                _run_on(
                    model,
                    choice.cluster,
                    workload,
                    settings=settings_for(settings, choice, alone=len(choices) == 1),
                    **common,
                ),
                choice=choice,
            )
            for choice in choices
        ]
    )


def _run_on(
    model,
    cluster,
    workload,
    *,
    workers: int,
    storage: str,
    n_trials: int,
    seed: int,
    settings: SearchSettings,
    progress,
    options: dict,
) -> SearchResult:
    start = time.perf_counter()
    search = {name: options.get(name) for name in ("objective", "sampler", "estimator")}
    problem, study = open_study(
        model, cluster, workload, storage=storage, seed=seed, settings=settings, **search
    )
    single = (
        n_trials == 0
        or choose_method(problem, study, n_trials=n_trials, settings=settings) == "brute_force"
    )
    if not single:  # clean once, before the workers start
        fail_orphans(study)
        fail_stale(study)
        _enqueue_warm_start(study, problem, warm_start=options.get("warm_start"))
    before, study_name = num_finished(study), study.study_name
    close_storage(study._storage)  # no connection crosses fork()
    del study
    final: dict[str, Any] = dict(
        search, storage=storage, n_trials=n_trials, seed=seed, settings=settings
    )
    # The workers share the batch: as many trials in flight as one process would have, so the
    # sampler's random start and its model see as many told trials as in one process.
    shared_batch = settings.model_copy(
        update={"batch_size": max(1, -(-settings.batch_size // workers))}
    )
    if (
        single
    ):  # one vectorized pass prices every mesh (or nothing runs): more processes would repeat it
        return search_devices(
            model,
            cluster,
            workload,
            progress=progress,
            warm_start=options.get("warm_start"),
            **final,
        )
    processes = _start(
        model, cluster, workload, workers=workers, search=dict(final, settings=shared_batch)
    )
    dead = _wait(
        processes, storage=storage, study_name=study_name, n_trials=n_trials, progress=progress
    )
    if dead:
        logger.warning(
            "%d of %d search workers died (exit codes %s); finishing the budget here",
            len(dead),
            workers,
            dead,
        )
    # Fails the dead workers' trials, runs what the budget still lacks, and ranks the study.
    result = search_devices(model, cluster, workload, **final)
    return dataclasses.replace(
        result,
        elapsed_s=time.perf_counter() - start,
        num_trials_this_run=result.num_trials - before,
    )


def _start(model, cluster, workload, *, workers: int, search: dict) -> list:
    context: Any = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    parent = os.getpid()
    processes = [
        context.Process(
            target=_worker,
            args=(model, cluster, workload, parent),
            kwargs=dict(search, seed=search["seed"] + index),
            daemon=True,
            name=f"search-worker-{index}",
        )
        for index in range(workers)
    ]
    for process in processes:
        process.start()
    return processes


def _worker(model, cluster, workload, parent: int, **search: Any) -> None:
    _die_with_parent(parent)
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def check_parent(
        done: int, total: int
    ) -> None:  # between batches, where prctl is not available
        if not alive(parent) or os.getppid() != parent:
            os._exit(3)

    search_devices(model, cluster, workload, clean_orphans=False, progress=check_parent, **search)


def _die_with_parent(parent: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux); exit now if it already has."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):  # no prctl: the progress check covers it
            pass
    if os.getppid() != parent:
        os._exit(3)


def _wait(processes, *, storage: str, study_name: str, n_trials: int, progress) -> list[int]:
    """Wait for the workers, reporting progress from this process's own connection; the exit
    codes of those that failed."""
    watched = optuna.load_study(
        study_name=study_name, storage=open_storage(storage, heartbeat_interval_s=None)
    )
    try:
        while any(p.is_alive() for p in processes):
            if progress is not None:
                progress(min(num_finished(watched), n_trials), n_trials)
            time.sleep(0.25)
        for process in processes:
            process.join()
        if progress is not None:
            progress(min(num_finished(watched), n_trials), n_trials)
    finally:
        close_storage(watched._storage)
    return [p.exitcode for p in processes if p.exitcode != 0]
