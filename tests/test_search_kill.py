"""kill -9 during ``plan --workers 2 --storage sqlite:///s.db``: of the parent, of one worker, of
all; then the same command completes with no finished trial lost and none left RUNNING. Killing
the parent takes its workers with it, and no SQLite connection crosses ``fork()``."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

import autoparallel as ap
from cost_model import Training
from search import SearchBounds, SearchSettings
from search._workers import run_workers

REPO = Path(__file__).resolve().parents[1]
# Twice the trials finished before the kill: the kill lands mid-search, and the rerun has half
# the budget left to finish.
BUDGET = 32
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _command(database: Path, output: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "autoparallel.cli",
        "plan",
        "--training",
        "--model",
        "tiny-moe",
        "--cluster",
        "dgx-h100",
        "--nodes",
        "4",
        "--sequence-length",
        "4096",
        "--global-batch-tokens",
        "1048576",
        "--trials",
        str(BUDGET),
        "--workers",
        "2",
        # a trial its killed worker held is failed after 3 s, not the default 20 s
        "--heartbeat-s",
        "1",
        "--grace-period-s",
        "3",
        "--storage",
        f"sqlite:///{database}",
        "--output",
        str(output),
    ]


def _states(database: Path) -> dict[int, str]:
    if not database.exists():
        return {}
    with sqlite3.connect(database, timeout=30) as connection:
        try:
            return dict(connection.execute("SELECT number, state FROM trials").fetchall())
        except sqlite3.OperationalError:  # tables not created yet
            return {}


def _complete(database: Path) -> set[int]:
    return {number for number, state in _states(database).items() if state == "COMPLETE"}


def _workers_of(parent: int) -> list[int]:
    """The parent's forked workers (same command line as the parent)."""
    cmdline = Path(f"/proc/{parent}/cmdline").read_bytes()
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    return [
        int(pid)
        for pid in children
        if Path(f"/proc/{pid}/cmdline").exists()
        and Path(f"/proc/{pid}/cmdline").read_bytes() == cmdline
    ]


def _running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _start_and_wait(
    database: Path, output: Path, *, env: dict
) -> tuple[subprocess.Popen, list[int]]:
    """Start the command; return once it has finished some trials and both workers run."""
    process = subprocess.Popen(
        _command(database, output),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while len(_complete(database)) < 16 or len(workers := _workers_of(process.pid)) < 2:
        assert process.poll() is None, process.stdout.read().decode()[-3000:]
        assert time.monotonic() < deadline, "the search made no progress"
        time.sleep(0.05)
    return process, workers


@pytest.mark.parametrize("victim", ["parent", "one worker", "all"])
def test_kill_9_then_the_same_command_completes(victim: str, tmp_path: Path) -> None:
    database, output = tmp_path / "s.db", tmp_path / "plan.json"
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="200")
    process, workers = _start_and_wait(database, output, env=env)
    if victim == "parent":
        os.kill(process.pid, signal.SIGKILL)
    elif victim == "one worker":
        os.kill(workers[0], signal.SIGKILL)
    else:
        os.killpg(process.pid, signal.SIGKILL)
    first_exit = process.wait(timeout=60)
    deadline = time.monotonic() + 10
    while any(_running(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_running(pid) for pid in workers), "workers outlived their killed parent"
    if victim == "one worker":  # the parent finishes the budget with the other worker
        assert first_exit == 0, process.stdout.read().decode()[-3000:]
    before = _complete(database)
    assert before
    again = subprocess.run(
        _command(database, output),
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    states = _states(database)
    after = _complete(database)
    assert before <= after, "a finished trial was lost"
    assert len(after) >= BUDGET
    assert "RUNNING" not in states.values(), _running_detail(database)
    assert ap.load_plan(output).world_size == 32


def test_no_sqlite_connection_crosses_fork(tmp_path: Path) -> None:
    database = tmp_path / "fork.db"
    open_at_fork: list[list[str]] = []

    def record() -> None:
        if os.getpid() == parent:
            links = [
                os.readlink(f"/proc/self/fd/{fd}")
                for fd in os.listdir("/proc/self/fd")
                if os.path.exists(f"/proc/self/fd/{fd}")
            ]
            open_at_fork.append([link for link in links if link.startswith(str(database))])

    parent = os.getpid()
    os.register_at_fork(before=record)
    model, cluster = ap.get_model("qwen3-235b-a22b"), ap.get_preset("dgx-h100", num_nodes=8)
    bounds = SearchBounds(
        zero_stages=(1, 3),
        recompute_policies=("none", "full"),
        max_micro_batch_size=2,
        virtual_stage_choices=(2,),
    )
    result = run_workers(
        model,
        cluster,
        Training(sequence_length_tokens=4096, global_batch_sequences=256),
        workers=2,
        storage=f"sqlite:///{database}",
        n_trials=16,
        settings=SearchSettings(bounds=bounds, batch_size=4, study_name="fork"),
    )
    assert result.num_trials >= 16
    assert len(open_at_fork) >= 2 and not any(open_at_fork), open_at_fork
    complete = optuna.load_study(study_name="fork", storage=f"sqlite:///{database}").get_trials(
        states=(optuna.trial.TrialState.COMPLETE,)
    )
    pids = {t.user_attrs["owner"]["pid"] for t in complete}
    assert len(pids) == 2 and parent not in pids  # each worker owns its trials


def _running_detail(database: Path) -> list:
    with sqlite3.connect(database, timeout=30) as connection:
        return connection.execute(
            "SELECT t.number, t.state, a.key, a.value_json FROM trials t LEFT JOIN trial_user_attributes a ON a.trial_id = t.trial_id "
            "WHERE t.state != 'COMPLETE' AND (a.key IS NULL OR a.key != 'result')"
        ).fetchall()


def test_an_interrupted_search_does_not_wait_on_a_blocked_heartbeat(tmp_path: Path) -> None:
    """Ctrl-C inside ``beating`` while the heartbeat thread's write waits on the SQLite lock
    (another connection holds it): the block ends within about a second, not after the 60 s
    busy timeout, and the heartbeat thread is left as the daemon it is."""
    import threading

    from search._liveness import _INTERRUPTED_JOIN_S, beating
    from search._storage import open_storage

    url = f"sqlite:///{tmp_path}/s.db"
    storage = open_storage(url, heartbeat_interval_s=1)
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    holder = sqlite3.connect(tmp_path / "s.db", timeout=60)
    holder.execute("BEGIN IMMEDIATE")  # takes the write lock the heartbeat needs
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt), beating(study, [trial]):
            time.sleep(1.5)  # the first beat after 1 s now waits on the lock
            raise KeyboardInterrupt
        waited = time.monotonic() - started
    finally:
        holder.rollback()
        holder.close()
    assert waited < 1.5 + _INTERRUPTED_JOIN_S + 1.0
    beats = [t for t in threading.enumerate() if t.name == "trial-heartbeat"]
    assert all(t.daemon for t in beats)


class _Swallowing:
    """An object whose weakref callback takes the SIGINT: Python prints the KeyboardInterrupt
    raised there as "Exception ignored" and goes on, as it does in SQLAlchemy's
    ``_collection_gced`` when Ctrl-C lands in it."""

    def trigger(self) -> None:
        import weakref

        class _Dropped:
            pass

        dropped = _Dropped()
        self._ref = weakref.ref(dropped, lambda _: signal.raise_signal(signal.SIGINT))
        del dropped  # the callback runs now and swallows the KeyboardInterrupt


@pytest.fixture
def default_sigint():
    """Python's own Ctrl-C handler during the test, as an interactive run has it (a library an
    earlier test of this worker imported may have left its own, and ``remembered_interrupts``
    then steps aside); the previous handler restored after it."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_swallowed_ctrl_c_stops_the_search_at_the_next_batch(
    tmp_path: Path, monkeypatch, default_sigint
) -> None:
    """A Ctrl-C that a weakref callback swallowed during the first batch's pricing is raised
    again before the second batch: the search stops with the first batch's trials stored (a
    rerun resumes from them) instead of running to its end."""
    from cost_model import estimate_table
    from search import find_plan
    from search._interrupts import raise_if_interrupted, remembered_interrupts

    calls = []

    def estimator(model, cluster, workload, table):
        calls.append(len(table["dp"]))
        if len(calls) == 1:
            _Swallowing().trigger()
            calls.append("went on")  # the KeyboardInterrupt did not reach this frame
        return estimate_table(model, cluster, workload, table)

    swallowed = []
    # the hook Python calls with what it could not raise; the block keeps its KeyboardInterrupt
    monkeypatch.setattr(sys, "unraisablehook", lambda raised: swallowed.append(raised.exc_type))
    storage = f"sqlite:///{tmp_path}/s.db"
    settings = SearchSettings(batch_size=4, brute_force_limit=0, brute_force_layouts=0)
    with remembered_interrupts():
        with pytest.raises(KeyboardInterrupt):
            find_plan(
                ap.get_model("tiny-moe"),
                ap.get_preset("cpu-loopback"),
                Training(sequence_length_tokens=64, global_batch_sequences=8),
                n_trials=40,
                storage=storage,
                settings=settings,
                estimator=estimator,
            )
        raise_if_interrupted()  # raised once: nothing pending after it
    assert swallowed == []  # Python could not raise it, and its traceback was not printed
    assert len(calls) == 2 and calls[1] == "went on"  # priced one batch only
    study = optuna.load_study(study_name=None, storage=storage)
    told = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert 0 < len(told) <= 4
    # outside the block Ctrl-C is Python's own again
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
