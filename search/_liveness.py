"""Trials of dead workers: who owns a RUNNING trial, heartbeats, and failing and retrying orphans.

Two mechanisms, both from Optuna's own model of a trial's life:

* **owner** — each asked trial records ``{"host", "pid"}`` of the process that asked it (read
  when asked, not at import: a forked worker is not its parent). At start-up a search fails the
  RUNNING trials whose owner is a dead process on this host (a resumed search after kill -9);
* **heartbeat** — on an RDB storage opened with ``heartbeat_interval`` every in-flight trial has
  a heartbeat refreshed by a thread while its batch is priced; every batch starts by failing the
  trials whose heartbeat is older than the grace period (a worker killed on another machine).

A failed trial is enqueued again with its parameters (Optuna's ``RetryFailedTrialCallback``),
and the budget counts finished trials only, so the study still completes it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from search._lazy import optuna

logger = logging.getLogger(__name__)


def owner() -> dict[str, object]:
    """This process, as recorded on the trials it asks."""
    return {"host": socket.gethostname(), "pid": os.getpid()}


def fail_orphans(study: optuna.Study, *, ownerless_wait_s: float = 1.0) -> int:
    """Fail (and enqueue again) the RUNNING trials of dead processes on this host; trials of live
    workers or of other hosts are left alone (the heartbeat covers those). A trial that names no
    owner was asked by a process killed before it could write its name (a live worker writes it
    within milliseconds): one still nameless after ``ownerless_wait_s`` is failed too."""
    me = owner()
    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    orphans = [trial for trial in running if _is_orphan(trial.user_attrs.get("owner", {}), me)]
    nameless = {trial.number for trial in running if "owner" not in trial.user_attrs}
    if nameless:
        time.sleep(ownerless_wait_s)
        orphans += [
            trial
            for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
            if trial.number in nameless and "owner" not in trial.user_attrs
        ]
    failed = [trial for trial in orphans if _fail(study, trial)]
    if failed:
        logger.info("marked %d trials of dead workers as failed", len(failed))
    return len(failed)


def _is_orphan(trial_owner: dict, me: dict) -> bool:
    return trial_owner.get("host") == me["host"] and trial_owner.get("pid") != me["pid"] and not alive(trial_owner.get("pid"))


def _fail(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
    """FAIL ``trial`` unless another process finished it first; then retry it as the heartbeat would."""
    storage = study._storage
    try:
        if not storage.set_trial_state_values(trial._trial_id, state=optuna.trial.TrialState.FAIL):
            return False
    except optuna.exceptions.UpdateFinishedTrialError:  # another worker failed or finished it
        return False
    callback = _stale_callback(storage)
    if callback is not None:
        callback(study, storage.get_trial(trial._trial_id))
    return True


def _stale_callback(storage):
    getter = getattr(storage, "get_heartbeat_stale_trial_callback", None) or getattr(storage, "get_failed_trial_callback", None)
    return getter() if getter is not None else None


def alive(pid: int | None) -> bool:
    """Whether process ``pid`` runs on this host (a zombie — killed, not yet reaped — does not)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def heartbeat_enabled(study: optuna.Study) -> bool:
    interval = getattr(study._storage, "get_heartbeat_interval", lambda: None)
    return interval() is not None


def fail_stale(study: optuna.Study) -> None:
    """Optuna's ``fail_stale_trials`` (its stale callback enqueues the retries)."""
    if heartbeat_enabled(study):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)


def ask(study: optuna.Study) -> optuna.Trial:
    """``study.ask()`` without Optuna's note that heartbeats are meant for ``optimize`` (this
    module keeps them beating for ask/tell)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Heartbeat of storage")
        return study.ask()


def claim(study: optuna.Study, trial: optuna.Trial, me: dict[str, object]) -> None:
    """Mark a just-asked trial as this process's: its owner, and its first heartbeat (a trial
    with no heartbeat is never found stale)."""
    trial.set_user_attr("owner", me)
    if heartbeat_enabled(study):
        study._storage.record_heartbeat(trial._trial_id)


@contextlib.contextmanager
def beating(study: optuna.Study, trials: list[optuna.Trial]) -> Iterator[None]:
    """Record a heartbeat for each of ``trials`` every interval until the block ends (``claim``
    recorded the first one)."""
    if not heartbeat_enabled(study) or not trials:
        yield
        return
    storage, stop = study._storage, threading.Event()
    ids = [trial._trial_id for trial in trials]

    def beat() -> None:
        while not stop.wait(storage.get_heartbeat_interval()):
            for trial_id in ids:
                storage.record_heartbeat(trial_id)

    thread = threading.Thread(target=beat, name="trial-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
