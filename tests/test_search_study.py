"""The Optuna study: regret against the exhaustive baseline, brute force, Pareto fronts,
constraints, infeasibility, and storage (a SIGKILLed search resumes; two workers share a study)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import optuna
import pytest

import autoparallel as ap
from cost_model import InfeasiblePlanError, Inference, Training
from search import (
    SearchBounds,
    SearchSettings,
    exhaustive_search,
    find_plan,
    regret,
    resolve_objective,
)
from search._feasibility import _sizes_upward, lean_bounds
from search._workers import run_workers

REPO = Path(__file__).resolve().parents[1]
optuna.logging.set_verbosity(optuna.logging.WARNING)

# A mid-sized training problem whose exhaustive optimum is cheap: Qwen3-235B on 64 H100.
QWEN_BOUNDS = SearchBounds(
    zero_stages=(1, 3),
    recompute_policies=("none", "full"),
    max_micro_batch_size=2,
    virtual_stage_choices=(2,),
)
QWEN_TRAINING = Training(sequence_length_tokens=4096, global_batch_sequences=256)


@pytest.fixture(scope="module")
def qwen():
    return ap.get_model("qwen3-235b-a22b"), ap.get_preset("dgx-h100", num_nodes=8)


@pytest.fixture(scope="module")
def qwen_optimum(qwen):
    model, cluster = qwen
    return exhaustive_search(model, cluster, QWEN_TRAINING, bounds=QWEN_BOUNDS)


def test_tpe_reaches_the_exhaustive_optimum(qwen, qwen_optimum) -> None:
    model, cluster = qwen
    calls = []
    result = find_plan(
        model,
        cluster,
        QWEN_TRAINING,
        n_trials=80,
        seed=0,
        settings=SearchSettings(bounds=QWEN_BOUNDS),
        progress=lambda done, total: calls.append((done, total)),
    )
    assert result.method == "tpe" and result.num_trials == 80 and result.num_meshes > 80
    assert result.space_size == qwen_optimum.space_size
    # Regret 2.6% at this budget (seed 0): the best layout (tp4 cp2 ep4 etp2) and the one found
    # (tp1 cp8 ep8 etp1) are near-ties four axes apart, beyond the polish's two-axis moves.
    assert regret(result.best, qwen_optimum.best, result.objective) <= 0.03
    assert calls[-1] == (80, 80) and all(done <= total for done, total in calls)
    ranked = [c.score(result.objective) for c in result.ranked]
    assert ranked == sorted(ranked) and len({c.mesh_key() for c in result.ranked}) == len(ranked)


def test_small_space_is_brute_forced(tmp_path: Path) -> None:
    model, cluster = ap.get_model("tiny-moe"), ap.get_preset("cpu-loopback")
    workload = Training(sequence_length_tokens=64, global_batch_sequences=8)
    result = find_plan(model, cluster, workload, n_trials=200)
    assert result.method == "brute_force"
    assert (
        result.num_trials == result.num_meshes
    )  # every mesh once, then the budget stops mattering
    optimum = exhaustive_search(model, cluster, workload)
    assert result.best.config == optimum.best.config
    assert regret(result.best, optimum.best, result.objective) == 0.0


def test_pareto_front_with_nsga2() -> None:
    model, cluster = ap.get_model("deepseek-v3"), ap.get_preset("dgx-h100", num_nodes=16)
    workload = Inference(prompt_tokens=2048, output_tokens=512, tpot_slo_s=0.1)
    result = find_plan(model, cluster, workload, objective="pareto", n_trials=48, seed=1)
    assert result.method == "nsga2" and result.objective.names == ("throughput", "tpot")
    front = [c.objective_values(result.objective) for c in result.pareto]
    assert len(front) >= 3 and all(c.feasible for c in result.pareto)
    for throughput, tpot in front:  # nobody on the front is dominated by another point of it
        assert not any(
            t2 >= throughput and p2 <= tpot and (t2, p2) != (throughput, tpot) for t2, p2 in front
        )
    assert [t for t, _ in front] == sorted(t for t, _ in front)
    assert (
        len({c.serving.batch_size for c in result.pareto}) > 1
    )  # the front is traced by the batch


def test_training_pareto_trades_step_time_for_memory_headroom() -> None:
    model, cluster = ap.get_model("tiny-moe"), ap.get_preset("cpu-loopback")
    workload = Training(sequence_length_tokens=64, global_batch_sequences=8)
    result = find_plan(model, cluster, workload, objective="pareto", n_trials=60)
    assert (
        result.objective.names == ("step_time", "memory_headroom")
        and result.method == "brute_force"
    )
    front = [c.objective_values(result.objective) for c in result.pareto]
    assert len(front) >= 2
    steps, headrooms = zip(*front)
    assert list(steps) == sorted(steps) and list(headrooms) == sorted(
        headrooms
    )  # slower buys more headroom


def test_memory_violations_are_constraints_and_counted() -> None:
    model, cluster = ap.get_model("deepseek-v3"), ap.get_preset("dgx-h100", num_nodes=4)
    workload = Inference(prompt_tokens=2048, output_tokens=512)
    result = find_plan(
        model,
        cluster,
        workload,
        n_trials=40,
        seed=0,
        settings=SearchSettings(study_name="constraints"),
    )
    assert result.feasible and result.infeasible_rows["memory"] > 0
    assert (
        "infeasible layouts among" in result.explain_infeasible()
        and "memory" in result.explain_infeasible()
    )
    # Optuna sees each trial's violations as constraints (> 0 violated)
    assert result.infeasible_trials.get("memory", 0) > 0


def test_too_small_cluster_names_bottleneck_and_smallest_size() -> None:
    model, cluster = ap.get_model("deepseek-v3"), ap.get_preset("dgx-h100", num_nodes=1)
    workload = Inference(prompt_tokens=2048, output_tokens=512)
    with pytest.raises(InfeasiblePlanError) as caught:
        ap.find_plan(model, cluster, workload, n_trials=20)
    message = str(caught.value)
    assert "bottleneck memory" in message and "smallest fitting size" in message
    assert caught.value.part == "memory"
    smallest = int(message.split("at least ")[1].split(" devices")[0])
    assert smallest % 8 == 0 and smallest > 8
    assert caught.value.smallest_devices == smallest
    fits = exhaustive_search(model, cluster.with_nodes(smallest // 8), workload)
    assert fits.best.feasible
    short = exhaustive_search(model, cluster.with_nodes(smallest // 8 - 1), workload)
    assert not short.best.feasible


def test_unknown_names_list_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="ref-3t-moe"):
        ap.get_model("no-such-model")
    with pytest.raises(ValueError, match="dgx-h100"):
        ap.get_preset("no-such-cluster")
    with pytest.raises(ValueError, match="objective \\('tpot'\\) is an inference metric"):
        resolve_objective("tpot", QWEN_TRAINING)
    with pytest.raises(ValueError, match="must be one of"):
        resolve_objective("speed", QWEN_TRAINING)


def test_warm_start_is_the_first_trial(qwen) -> None:
    model, cluster = qwen
    storage = optuna.storages.InMemoryStorage()
    seed_config = ap.ParallelConfig(dp=8, tp=4, pp=2, ep=16, etp=1, zero_stage=1)
    find_plan(
        model,
        cluster,
        QWEN_TRAINING,
        n_trials=12,
        storage=storage,
        settings=SearchSettings(bounds=QWEN_BOUNDS, study_name="warm"),
        warm_start=seed_config,
    )
    trials = optuna.load_study(study_name="warm", storage=storage).get_trials()
    first = min(trials, key=lambda t: t.number)
    config = first.user_attrs["result"]["candidate"]["config"]
    assert (config["dp"], config["tp"], config["pp"], config["ep"], config["etp"]) == (
        8,
        4,
        2,
        16,
        1,
    )


_CHILD = textwrap.dedent(
    """
    import sys, time, optuna
    import autoparallel as ap
    from cost_model import Training
    from search import SearchBounds, SearchSettings, find_plan
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    bounds = SearchBounds(zero_stages=(1, 3), recompute_policies=("none", "full"), max_micro_batch_size=2, virtual_stage_choices=(2,))
    def slow(done, total):
        print(done, flush=True)
        time.sleep(0.3)  # slow enough to be killed mid-way
    find_plan(ap.get_model("qwen3-235b-a22b"), ap.get_preset("dgx-h100", num_nodes=8),
              Training(sequence_length_tokens=4096, global_batch_sequences=256), n_trials=32,
              storage=sys.argv[1], seed=3, settings=SearchSettings(bounds=bounds, batch_size=4, study_name="resume"),
              progress=slow)
    """
)


def _complete(storage: str, name: str) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name=name, storage=storage)
    return study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))


def _count_complete(path: Path) -> int:
    """Finished trials in the SQLite file, read directly (cheap enough to poll)."""
    if not path.exists():
        return 0
    with sqlite3.connect(path, timeout=30) as connection:
        try:
            return connection.execute(
                "SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'"
            ).fetchone()[0]
        except sqlite3.OperationalError:  # tables not created yet
            return 0


def test_sigkilled_search_resumes_without_losing_trials(tmp_path: Path, qwen) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    child = subprocess.Popen(
        [sys.executable, str(script), storage],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    try:
        while _count_complete(tmp_path / "study.db") < 8:
            assert child.poll() is None, child.stderr.read().decode()
            assert time.monotonic() < deadline, "the child search made no progress"
            time.sleep(0.2)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    before = _complete(storage, "resume")
    assert 8 <= len(before) < 32
    best_before = min(t.values[0] for t in before if all(v <= 0 for v in t.constraints.values()))
    model, cluster = qwen
    result = find_plan(
        model,
        cluster,
        QWEN_TRAINING,
        n_trials=32,
        storage=storage,
        seed=3,
        settings=SearchSettings(bounds=QWEN_BOUNDS, batch_size=4, study_name="resume"),
    )
    after = _complete(storage, "resume")
    assert result.num_trials == len(after) == 32
    assert result.num_trials_this_run == 32 - len(before)
    assert {t.number for t in before} <= {t.number for t in after}  # no finished trial lost
    new_numbers = {t.number for t in after} - {t.number for t in before}
    assert min(new_numbers) > max(t.number for t in before)  # numbering continues
    assert result.best.metrics["step_time_s"] <= best_before + 1e-12
    study = optuna.load_study(study_name="resume", storage=storage)
    assert not study.get_trials(
        states=(optuna.trial.TrialState.RUNNING,)
    )  # the killed batch is marked failed


@pytest.mark.slow
def test_two_worker_processes_share_one_study(tmp_path: Path, qwen) -> None:
    model, cluster = qwen
    storage = f"sqlite:///{tmp_path / 'workers.db'}"
    result = run_workers(
        model,
        cluster,
        QWEN_TRAINING,
        workers=2,
        storage=storage,
        n_trials=16,
        settings=SearchSettings(bounds=QWEN_BOUNDS, batch_size=4, study_name="workers"),
    )
    trials = _complete(storage, "workers")
    assert len(trials) == result.num_trials >= 16
    assert len(trials) <= 16 + 2 * 4  # each worker overshoots by at most one batch
    pids = {t.user_attrs["result"]["worker_pid"] for t in trials}
    # Both workers searched, and each returned only once the study was settled: the parent,
    # which finishes what dead workers left, found nothing to run.
    assert len(pids) == 2 and os.getpid() not in pids
    study = optuna.load_study(study_name="workers", storage=storage)
    assert not study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
    assert len({t.number for t in trials}) == len(trials)
    assert np.isfinite(result.best.metrics["step_time_s"])


def test_trials_left_running_by_a_dead_worker_are_failed(tmp_path: Path, qwen) -> None:
    import socket

    model, cluster = qwen
    storage = f"sqlite:///{tmp_path / 'orphans.db'}"
    settings = SearchSettings(bounds=QWEN_BOUNDS, batch_size=4, study_name="orphans")
    find_plan(model, cluster, QWEN_TRAINING, n_trials=4, storage=storage, settings=settings)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    study = optuna.load_study(study_name="orphans", storage=storage)
    orphan = study.ask()  # what a worker killed between ask and tell leaves behind
    orphan.set_user_attr("owner", {"host": socket.gethostname(), "pid": int(dead.stdout)})
    live = study.ask()  # a live worker's trial (this process) must not be touched
    live.set_user_attr("owner", {"host": socket.gethostname(), "pid": os.getppid()})
    result = find_plan(
        model, cluster, QWEN_TRAINING, n_trials=8, storage=storage, settings=settings
    )
    states = {
        t.number: t.state
        for t in optuna.load_study(study_name="orphans", storage=storage).get_trials()
    }
    assert states[orphan.number] == optuna.trial.TrialState.FAIL
    assert states[live.number] == optuna.trial.TrialState.RUNNING
    assert result.num_trials == 8


def test_the_smallest_size_walk_keeps_the_powers_of_two_and_every_sharding_stage() -> None:
    """DeepSeek-V3's 128 heads and 256 experts have no mesh on most 1.25x steps of a node
    count (105, 165, ... nodes of 4 devices); the walk keeps the powers of two between them. Under
    pipeline parallelism ZeRO-3 holds each stage gathered, so the lean search keeps ZeRO-1/2."""
    sizes = _sizes_upward(84, max_nodes=65_536)
    assert sizes[0] == 84 and sizes == sorted(set(sizes))
    assert {128, 256, 512, 1024, 2048, 4096, 8192} <= set(sizes)
    assert {105, 132, 165} <= set(sizes) and max(sizes) < 84 * 1.25**24
    assert _sizes_upward(3, max_nodes=8) == [3, 4, 5, 7, 8]
    assert _sizes_upward(100, max_nodes=64) == []
    assert lean_bounds().zero_stages == (1, 2, 3)
    assert lean_bounds(SearchBounds(zero_stages=(0,))).zero_stages == (0,)
