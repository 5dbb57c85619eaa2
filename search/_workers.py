"""Several worker processes searching one Optuna study through a shared storage.

The parent creates the study (so that workers never race to create tables or enqueue the same
trials), starts ``workers`` processes that each run ``find_plan`` with their own seed on the same
storage and study name, reports progress from the storage, and finally collects the result from
the study. Workers on other machines can join by calling ``find_plan`` with the same storage URL
and settings (the study name is derived from the problem, or set in ``SearchSettings``).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from search._lazy import optuna

from search._candidate import SearchResult
from search._study import SearchSettings, _enqueue_warm_start, _finished, choose_method, find_plan, open_study


def run_workers(model, cluster, workload, *, workers: int, storage: str | None = None, n_trials: int = 200, seed: int = 0, settings: SearchSettings | None = None, progress=None, **options: Any) -> SearchResult:  # noqa: ANN001
    """Run ``workers`` processes on one study; ``storage=None`` uses a temporary journal file.

    The budget ``n_trials`` is shared: each worker stops once the study holds that many finished
    trials, so the study may end up to ``(workers - 1) * batch_size`` trials over it."""
    if workers < 1:
        raise ValueError(f"workers ({workers}) must be >= 1")
    start = time.perf_counter()
    settings = settings or SearchSettings()
    if storage is None:
        storage = "journal:" + str(Path(tempfile.mkdtemp(prefix="autoparallel-")) / "study.log")
    common = dict(objective=options.get("objective"), sampler=options.get("sampler"), storage=storage, settings=settings)
    problem, study = open_study(model, cluster, workload, seed=seed, estimator=options.get("estimator"), **common)
    if choose_method(problem, study, n_trials=n_trials, settings=settings) == "brute_force":
        # One vectorized pass prices every mesh: more processes would only repeat it.
        return find_plan(model, cluster, workload, storage=storage, n_trials=n_trials, seed=seed, settings=settings, **options)
    _enqueue_warm_start(study, problem, warm_start=options.get("warm_start"))
    before = len(_finished(study))
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    worker_options = {k: v for k, v in options.items() if k not in ("progress", "warm_start")}
    processes = [
        context.Process(
            target=_worker,
            args=(model, cluster, workload),
            kwargs=dict(worker_options, storage=storage, n_trials=n_trials, seed=seed + index, settings=settings),
            daemon=True,
        )
        for index in range(workers)
    ]
    for process in processes:
        process.start()
    _wait(processes, study=study, n_trials=n_trials, progress=progress)
    failed = [p.exitcode for p in processes if p.exitcode != 0]
    if failed:
        raise RuntimeError(f"{len(failed)} of {workers} search workers failed (exit codes {failed})")
    # Collect: the budget is spent, so this runs no trial and ranks what the workers found.
    result = find_plan(model, cluster, workload, storage=storage, n_trials=n_trials, seed=seed, settings=settings, **worker_options)
    return dataclasses.replace(result, elapsed_s=time.perf_counter() - start, num_trials_this_run=result.num_trials - before)


def _worker(model, cluster, workload, **kwargs: Any) -> None:  # noqa: ANN001
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    find_plan(model, cluster, workload, **kwargs)


def _wait(processes, *, study: optuna.Study, n_trials: int, progress) -> None:  # noqa: ANN001
    while any(p.is_alive() for p in processes):
        if progress is not None:
            progress(min(len(_finished(study)), n_trials), n_trials)
        time.sleep(0.25)
    for process in processes:
        process.join()
    if progress is not None:
        progress(min(len(_finished(study)), n_trials), n_trials)
