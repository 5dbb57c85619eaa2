"""One study on a real PostgreSQL server shared by several worker processes: drivers, race-free
creation, kill -9 of a worker (heartbeat, retry), resume, the plan from a finished study, and a
worker with a different job refused. A throw-away server (``initdb`` in a temporary folder, a free
port on 127.0.0.1) runs for this module; the tests skip only where no server can be installed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest

import autoparallel as ap
from autoparallel.cli import main
from autoparallel.testing.postgres import PostgresServer, unavailable_reason
from cost_model import Training
from search import SearchBounds, SearchSettings, database_url, find_plan, load_study_job
from search._workers import run_workers

REPO = Path(__file__).resolve().parents[1]
BOUNDS = SearchBounds(
    zero_stages=(1, 3),
    recompute_policies=("none", "full"),
    max_micro_batch_size=2,
    virtual_stage_choices=(2,),
)
WORKLOAD = Training(sequence_length_tokens=4096, global_batch_sequences=256)
optuna.logging.set_verbosity(optuna.logging.WARNING)

# A worker on "another machine": its own process, the same job, joining by storage URL and study
# name; given a host name, it records that name as its trials' owner host (as a worker on that
# machine would), so only the heartbeat can tell that it died.
_WORKER = textwrap.dedent(
    """
    import os, socket, sys, time, optuna
    import autoparallel as ap
    from cost_model import Training
    from search import SearchBounds, SearchSettings, find_plan
    from search._objective import default_estimator
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url, study, budget, seed, delay_s, ready = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
    if sys.argv[7]:
        socket.gethostname = lambda: sys.argv[7]
    price = default_estimator()
    def slow(*args, **kwargs):  # a slower cost model: trials stay RUNNING while it prices
        time.sleep(delay_s)
        return price(*args, **kwargs)
    bounds = SearchBounds(zero_stages=(1, 3), recompute_policies=("none", "full"), max_micro_batch_size=2, virtual_stage_choices=(2,))
    settings = SearchSettings(bounds=bounds, batch_size=4, study_name=study, heartbeat_interval_s=1, grace_period_s=2)
    # All workers start at the same moment: each says it has imported, then waits for the others.
    open(os.path.join(ready, str(seed)), "w").close()
    deadline = time.monotonic() + 60
    while len(os.listdir(ready)) < int(sys.argv[8]) and time.monotonic() < deadline:
        time.sleep(0.01)
    find_plan(ap.get_model("qwen3-235b-a22b"), ap.get_preset("dgx-h100", num_nodes=8),
              Training(sequence_length_tokens=4096, global_batch_sequences=256), n_trials=budget,
              storage=url, seed=seed, settings=settings, estimator=slow)
    """
)


@pytest.fixture(scope="module")
def server():
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"no PostgreSQL server here: {reason}")
    started = PostgresServer.start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def qwen():
    return ap.get_model("qwen3-235b-a22b"), ap.get_preset("dgx-h100", num_nodes=8)


def _workers(
    tmp_path: Path,
    url: str,
    *,
    study: str,
    budget: int,
    count: int,
    delay_s: float,
    hosts: tuple[str, ...] = (),
) -> list[subprocess.Popen]:
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    ready = tmp_path / "ready"  # a file per worker that has imported: they start together
    ready.mkdir()
    return [
        subprocess.Popen(
            [
                sys.executable,
                str(script),
                url,
                study,
                str(budget),
                str(seed),
                str(delay_s),
                str(ready),
                (*hosts, *[""] * count)[seed],
                str(count),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for seed in range(count)
    ]


def _trials(url: str, study: str) -> list[optuna.trial.FrozenTrial]:
    try:
        return optuna.load_study(study_name=study, storage=database_url(url)).get_trials()
    except KeyError:  # not created yet
        return []


def _by_state(trials, state: optuna.trial.TrialState) -> list[optuna.trial.FrozenTrial]:
    return [t for t in trials if t.state == state]


def test_postgresql_urls_take_the_installed_driver(monkeypatch) -> None:
    import importlib.util

    import search._storage as storage

    installed = [d for d in ("psycopg", "psycopg2") if importlib.util.find_spec(d)]
    if installed:
        assert (
            database_url("postgresql://user@host:5432/db")
            == f"postgresql+{installed[0]}://user@host:5432/db"
        )
        assert (
            database_url("postgres://user@host/db") == f"postgresql+{installed[0]}://user@host/db"
        )
    assert database_url("sqlite:///study.db") == "sqlite:///study.db"
    with pytest.raises(ValueError, match=r"needs the pg8000 driver: pip install 'pg8000'"):
        database_url("postgresql+pg8000://user:secret@host/db")
    monkeypatch.setattr(storage.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(
        ValueError, match=r"needs a postgresql driver: pip install 'moe-autoparallel\[postgres\]'"
    ) as error:
        database_url("postgresql://user:secret@host/db")
    assert "secret" not in str(error.value) and "user:***@host/db" in str(error.value)
    assert len(str(error.value).splitlines()) == 1


def test_three_workers_started_together_on_a_fresh_database(server, tmp_path: Path) -> None:
    # Six batches of four for three workers that start at the same moment: each asks its first
    # batch before any of them can finish the budget.
    url, budget = server.create_database("together"), 24
    workers = _workers(tmp_path, url, study="together", budget=budget, count=3, delay_s=0.05)
    outputs = [worker.communicate(timeout=120)[0] for worker in workers]
    assert [w.returncode for w in workers] == [0, 0, 0], "\n".join(o[-2000:] for o in outputs)
    trials = _trials(url, "together")
    complete = _by_state(trials, optuna.trial.TrialState.COMPLETE)
    assert len(complete) >= budget and not _by_state(trials, optuna.trial.TrialState.RUNNING)
    assert len({t.user_attrs["owner"]["pid"] for t in complete}) >= 2  # they shared the study
    summaries = optuna.get_all_study_summaries(database_url(url), include_best_trial=False)
    assert [s.study_name for s in summaries] == ["together"]  # created once
    assert load_study_job(storage=url, study_name="together").model.name == "qwen3-235b-a22b"


def test_kill_9_of_one_worker_then_the_study_completes(server, tmp_path: Path) -> None:
    # The victim runs "on another machine" (only its heartbeat can show it died) and is killed near
    # the end: the two others meet the budget before its trials pass the grace period, and the last
    # of them to return must still fail those trials and run their retries. The budget only sets
    # how long the run is before the kill: 64 puts the kill, like the last 24 trials, in the
    # polish phase (the last 40% of the budget), as a larger budget would.
    url, budget = server.create_database("killed"), 64
    workers = _workers(
        tmp_path, url, study="killed", budget=budget, count=3, delay_s=0.2, hosts=("elsewhere",)
    )
    victim = workers[0].pid
    at_kill = _kill_in_flight(workers[0], url, after_complete=budget - 24)
    outputs = [worker.communicate(timeout=120)[0] for worker in workers[1:]]
    assert [w.returncode for w in workers[1:]] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    trials = {t.number: t for t in _trials(url, "killed")}
    completed_by_victim = [n for n, s in at_kill.items() if s == optuna.trial.TrialState.COMPLETE]
    in_flight = [n for n, s in at_kill.items() if s == optuna.trial.TrialState.RUNNING]
    assert completed_by_victim and in_flight
    assert all(
        trials[n].user_attrs["owner"] == {"host": "elsewhere", "pid": victim, "trial": n}
        for n in at_kill
    )
    assert all(
        trials[n].state == optuna.trial.TrialState.COMPLETE for n in completed_by_victim
    )  # none lost
    assert all(trials[n].state == optuna.trial.TrialState.FAIL for n in in_flight), [
        (n, trials[n].state, trials[n].datetime_start) for n in in_flight
    ]
    retried = {
        t.system_attrs.get("failed_trial"): t
        for t in trials.values()
        if "failed_trial" in t.system_attrs
    }
    assert set(in_flight) <= set(retried), "a stale trial was not enqueued again"
    # A retry repeats what the killed trial had sampled (a kill between two suggest calls leaves
    # part of the mesh: the retry samples the rest).
    assert all(
        retried[n].params[name] == value
        for n in in_flight
        for name, value in trials[n].params.items()
    )
    assert any(retried[n].state == optuna.trial.TrialState.COMPLETE for n in in_flight)
    running = [
        (n, t.user_attrs.get("owner")) for n, t in trials.items() if t.state.name == "RUNNING"
    ]
    assert not running, (victim, running)
    assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials.values()) >= budget


def _kill_in_flight(
    worker: subprocess.Popen, url: str, *, after_complete: int
) -> dict[int, optuna.trial.TrialState]:
    """SIGKILL ``worker`` while it has trials in flight, after it finished some and the study
    holds ``after_complete`` finished trials; the states of the trials it had claimed, at the
    kill. It runs freely until then, then is frozen for each look (one SQL query: a look must not
    starve it), and killed only while frozen."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(database_url(url), poolclass=sqlalchemy.pool.NullPool)
    deadline = time.monotonic() + 90
    try:
        while (
            "COMPLETE" not in _claimed_states(engine, worker.pid).values()
            or _count_complete(engine) < after_complete
        ):
            # It must not end by itself (a crash, or the budget met before it finished one).
            assert worker.poll() is None, worker.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the worker finished no trial"
            time.sleep(0.05)
        while True:
            assert worker.poll() is None, worker.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the worker never had a batch in flight"
            os.kill(worker.pid, signal.SIGSTOP)
            states = _claimed_states(engine, worker.pid)
            if "RUNNING" in states.values():
                break
            os.kill(worker.pid, signal.SIGCONT)
            time.sleep(0.02)
    finally:
        engine.dispose()
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    return {number: optuna.trial.TrialState[state] for number, state in states.items()}


def _count_complete(engine) -> int:
    import sqlalchemy

    with engine.connect() as connection:
        return connection.execute(
            sqlalchemy.text("SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'")
        ).scalar_one()


def _claimed_states(engine, pid: int) -> dict[int, str]:
    """State of each trial that process ``pid`` claimed (owner naming it and the trial)."""
    import sqlalchemy

    query = sqlalchemy.text(
        "SELECT t.number, t.state, a.value_json FROM trials t JOIN trial_user_attributes a "
        "ON a.trial_id = t.trial_id AND a.key = 'owner'"
    )
    try:
        with engine.connect() as connection:
            rows = connection.execute(query).fetchall()
    except sqlalchemy.exc.ProgrammingError:  # tables not created yet
        return {}
    owners = {number: (state, json.loads(value)) for number, state, value in rows}
    return {
        n: state for n, (state, o) in owners.items() if (o.get("pid"), o.get("trial")) == (pid, n)
    }


def test_a_resumed_study_continues_its_numbering(server, qwen) -> None:
    url = server.create_database("resumed")
    model, cluster = qwen
    settings = SearchSettings(bounds=BOUNDS, batch_size=4, study_name="resumed")
    first = find_plan(model, cluster, WORKLOAD, n_trials=8, storage=url, settings=settings)
    before = {
        t.number for t in _by_state(_trials(url, "resumed"), optuna.trial.TrialState.COMPLETE)
    }
    second = find_plan(
        model, cluster, WORKLOAD, n_trials=16, storage=url, settings=settings, seed=1
    )
    after = {t.number for t in _by_state(_trials(url, "resumed"), optuna.trial.TrialState.COMPLETE)}
    assert len(before) == first.num_trials == 8 and len(after) == second.num_trials == 16
    assert before <= after and min(after - before) > max(before)
    assert second.num_trials_this_run == 8
    assert second.best.score(second.objective) <= first.best.score(first.objective)


def test_three_worker_plan_matches_the_single_process_plan(server, tmp_path: Path) -> None:
    # tiny-moe on 32 H100s: 471 meshes, a budget of 96 sampled trials (no brute force) that one
    # process (48 already) and three workers take to the exhaustive optimum from every seed tried.
    url = server.create_database("shared")
    model, cluster = ap.get_model("tiny-moe"), ap.get_preset("dgx-h100", num_nodes=4)
    settings = SearchSettings(study_name="shared", brute_force_limit=0, brute_force_layouts=0)
    shared = run_workers(
        model, cluster, WORKLOAD, workers=3, storage=url, n_trials=96, settings=settings
    )
    alone = find_plan(
        model,
        cluster,
        WORKLOAD,
        n_trials=96,
        settings=settings.model_copy(update={"study_name": None}),
    )
    assert shared.method == alone.method == "tpe" and shared.num_trials >= 96
    assert (
        len(
            {
                t.user_attrs["owner"]["pid"]
                for t in _by_state(_trials(url, "shared"), optuna.trial.TrialState.COMPLETE)
            }
        )
        == 3
    )
    step, reference = shared.best.metrics["step_time_s"], alone.best.metrics["step_time_s"]
    assert abs(step - reference) <= 0.01 * reference, (shared.best.config, alone.best.config)
    # The plan of the finished study, written without searching again:
    output = tmp_path / "plan.json"
    assert (
        main(
            ["plan", "--from-study", "--storage", url, "--study", "shared", "--output", str(output)]
        )
        == 0
    )
    plan = ap.load_plan(output)
    assert plan.config == shared.best.config and plan.provenance.search.method == "from_study"
    assert (
        sum(t.state == optuna.trial.TrialState.COMPLETE for t in _trials(url, "shared"))
        == shared.num_trials
    )


def test_a_worker_with_a_different_job_is_refused(server, qwen) -> None:
    url = server.create_database("refused")
    model, cluster = qwen
    settings = SearchSettings(bounds=BOUNDS, batch_size=4, study_name="refused")
    find_plan(model, cluster, WORKLOAD, n_trials=8, storage=url, settings=settings)
    other = Training(sequence_length_tokens=8192, global_batch_sequences=256)
    with pytest.raises(
        ValueError,
        match=r"searches a different job.*workload .*sequence_length_tokens=4096.*sequence_length_tokens=8192",
    ):
        find_plan(model, cluster, other, n_trials=8, storage=url, settings=settings)
    with pytest.raises(
        ValueError, match=r"cluster dgx-h100@8n, 64 devices .* vs dgx-h100@4n, 32 devices"
    ):
        find_plan(
            model, cluster.with_nodes(4), WORKLOAD, n_trials=8, storage=url, settings=settings
        )


def test_a_server_whose_chosen_port_was_taken_starts_on_another(monkeypatch):
    """Another process can bind the chosen port before the server does: the start is retried
    on a fresh port instead of failing the suite."""
    import socket

    from autoparallel.testing import postgres

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"no PostgreSQL server here: {reason}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        ports = iter([taken])
        fresh = postgres._free_port
        monkeypatch.setattr(postgres, "_free_port", lambda: next(ports, None) or fresh())
        started = PostgresServer.start()
        try:
            assert started.port != taken
            storage = optuna.storages.RDBStorage(started.url())
            assert storage.get_all_studies() == []
        finally:
            started.stop()
