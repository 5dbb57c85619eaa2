"""Trials of dead workers: who owns a RUNNING trial, heartbeats, and failing and retrying orphans.

Two mechanisms, both from Optuna's own model of a trial's life:

* **owner** — each asked trial records ``{"host", "pid", "trial"}`` of the process that asked it
  (read when asked, not at import: a forked worker is not its parent). At start-up a search fails
  the RUNNING trials whose owner is a dead process on this host (a resumed search after kill -9);
* **heartbeat** — on an RDB storage opened with ``heartbeat_interval`` every in-flight trial has
  a heartbeat refreshed by a thread from its claim until it is told; every batch starts by failing
  the trials whose heartbeat is older than the grace period (a worker killed on another machine).

A failed trial is enqueued again with its parameters (Optuna's ``RetryFailedTrialCallback``),
and the budget counts finished trials only, so the study still completes it. A trial is
*unclaimed* between ``ask`` and its claim: it has no heartbeat yet (Optuna never finds it stale)
and no owner, or the owner of the trial it retries (the retry copies the user attributes); one
left unclaimed for the grace period belongs to a process killed in between and is failed.
Before a search returns it settles the study (``settle``): it waits until no trial of another
search process is in flight, failing those of dead processes, so that once the last worker
returns no trial is RUNNING.
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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # optuna is imported on first use (search._lazy); the checker sees the module
    import optuna
else:
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
    orphans = [trial for trial in running if _is_orphan(claimed_by(trial) or {}, me)]
    nameless = {trial.number for trial in running if claimed_by(trial) is None}
    if nameless:
        time.sleep(ownerless_wait_s)
        orphans += [
            trial
            for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
            if trial.number in nameless and claimed_by(trial) is None
        ]
    failed = [trial for trial in orphans if _fail(study, trial)]
    if failed:
        logger.info("marked %d trials of dead workers as failed", len(failed))
    return len(failed)


def claimed_by(trial: optuna.trial.FrozenTrial) -> dict | None:
    """The owner that claimed ``trial``; None while it is unclaimed (no owner yet, or the owner of
    the trial it retries). An owner naming no trial was written by another program: a claim."""
    trial_owner = trial.user_attrs.get("owner")
    if not isinstance(trial_owner, dict) or trial_owner.get("trial", trial.number) != trial.number:
        return None
    return trial_owner


def _is_orphan(trial_owner: dict, me: dict) -> bool:
    return (
        trial_owner.get("host") == me["host"]
        and trial_owner.get("pid") != me["pid"]
        and not alive(trial_owner.get("pid"))
    )


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
    getter = getattr(storage, "get_heartbeat_stale_trial_callback", None) or getattr(
        storage, "get_failed_trial_callback", None
    )
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


def claim(study: optuna.Study, trial: optuna.Trial, me: dict[str, object]) -> bool:
    """Mark a just-asked trial as this process's: its first heartbeat (a trial with no heartbeat
    is never found stale), then its owner, so that a trial with an owner has a heartbeat. False
    when another process failed the trial first (left unclaimed for the grace period)."""
    try:
        if heartbeat_enabled(study):
            storage: Any = study._storage  # the heartbeat API of RDB storages
            storage.record_heartbeat(trial._trial_id)
        trial.set_user_attr("owner", {**me, "trial": trial.number})
    except optuna.exceptions.UpdateFinishedTrialError:
        logger.warning("trial %d was failed before this process claimed it", trial.number)
        return False
    return True


def settle(study: optuna.Study, *, grace_s: float, poll_s: float = 0.5) -> int:
    """Wait until no trial that another search process asked is in flight: trials of dead
    processes on this host are failed at once, trials left unclaimed after ``grace_s`` (from when
    this process first saw them) are failed, and claimed trials of live processes (and, with a
    heartbeat, of other hosts) are waited for until they are told or found stale. Failed trials
    are enqueued again. Returns how many trials were waited for or failed (0: none in flight)."""
    me, seen = owner(), set()
    unclaimed_since: dict[int, float] = {}
    while True:
        fail_stale(study)
        now, pending = time.monotonic(), []
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            trial_owner = claimed_by(trial)
            if trial_owner is None:
                if now - unclaimed_since.setdefault(trial.number, now) <= grace_s:
                    pending.append(trial.number)
                else:
                    _fail(study, trial)
            elif _is_orphan(trial_owner, me):
                _fail(study, trial)
            elif _awaited(study, trial_owner, me):
                pending.append(trial.number)
            else:
                continue
            seen.add(trial.number)
        if not pending:
            return len(seen)
        logger.info("waiting for %d trials in flight in other search processes", len(pending))
        time.sleep(poll_s)


def _awaited(study: optuna.Study, trial_owner: dict, me: dict) -> bool:
    """Whether a claimed RUNNING trial will end by itself: asked by another search process
    (its owner names the trial) that is alive on this host or keeps a heartbeat elsewhere."""
    mine = (trial_owner.get("host"), trial_owner.get("pid")) == (me["host"], me["pid"])
    if "trial" not in trial_owner or mine:
        return False
    return trial_owner.get("host") == me["host"] or heartbeat_enabled(study)


#: Seconds an interrupted search waits for its heartbeat thread before leaving it (a daemon).
_INTERRUPTED_JOIN_S = 1.0


@contextlib.contextmanager
def beating(study: optuna.Study, trials: list[optuna.Trial]) -> Iterator[None]:
    """Record a heartbeat for each of ``trials`` every interval until the block ends (``claim``
    recorded the first one); trials appended to the list inside the block beat too."""
    if not heartbeat_enabled(study):
        yield
        return
    storage: Any = study._storage  # the heartbeat API of RDB storages
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(storage.get_heartbeat_interval()):
            for trial in list(trials):
                storage.record_heartbeat(trial._trial_id)

    thread = threading.Thread(target=beat, name="trial-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    except BaseException:
        # An interrupted or failed search does not wait for a heartbeat in progress: its write
        # may wait up to the SQLite busy timeout (60 s) for the lock, and the thread is a daemon
        # whose unfinished write the database rolls back (the trials are failed by the next
        # run's stale-trial check either way).
        stop.set()
        thread.join(timeout=_INTERRUPTED_JOIN_S)
        raise
    stop.set()
    thread.join()
