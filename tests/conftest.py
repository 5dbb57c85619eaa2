"""Shared test configuration: GPU tests skip where no accelerator is present; a test marked
``distributed`` fails if it starts no process; plans found once for the plan and export tests."""

from __future__ import annotations

import importlib.util
import os
import resource
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Each of pytest-xdist's worker processes has a core of its own: one intra-op thread per
    # worker (and per process it starts) keeps their OpenMP pools from oversubscribing the
    # cores, which slows small tensor ops a hundredfold.
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)

_FORKS = [0]  # os.fork() calls in this process: forked ranks and multiprocessing workers
os.register_at_fork(after_in_parent=lambda: _FORKS.__setitem__(0, _FORKS[0] + 1))


def _processes_started() -> tuple[int, float]:
    """Forks so far, and CPU seconds of finished children (torchrun and other subprocesses)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return _FORKS[0], children.ru_utime + children.ru_stime


def _live_children() -> int:
    """Children still running (e.g. a Popen left to a fixture's teardown); 0 where /proc is absent."""
    count = 0
    for listing in Path("/proc/self/task").glob("*/children"):
        try:
            count += len(listing.read_text().split())
        except OSError:
            continue
    return count


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    item.stash[_STARTED_BEFORE] = _processes_started()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A test marked ``distributed`` that passes without forking or reaping a child process is
    reported failed: the mark selects the multi-process tests and must not drift."""
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or not report.passed or item.get_closest_marker("distributed") is None:
        return
    before = item.stash.get(_STARTED_BEFORE, None)
    if before is not None and _processes_started() == before and _live_children() == 0:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} is marked distributed but started no process: "
            "remove the mark, or run its ranks (run_ranks, torchrun)"
        )


_STARTED_BEFORE = pytest.StashKey[tuple]()


def _has_cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(item.get_closest_marker("gpu") for item in items) and not _has_cuda():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


@pytest.fixture(scope="session")
def training_plan():
    """A searched training plan of Qwen3-235B-A22B on 64 H100s (ZeRO 1/3, every recompute policy)."""
    import optuna

    import autoparallel as ap
    from cost_model import Training
    from search import SearchBounds, SearchSettings

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    bounds = SearchBounds(
        zero_stages=(1, 3), recompute_policies=("none", "selective", "full"), max_micro_batch_size=2
    )
    workload = Training(sequence_length_tokens=4096, global_batch_sequences=256)
    cluster = ap.get_preset("dgx-h100", num_nodes=8)
    return ap.find_plan(
        "qwen3-235b-a22b", cluster, workload, n_trials=40, settings=SearchSettings(bounds=bounds)
    )


@pytest.fixture(scope="session")
def inference_plan():
    """A searched inference plan of DeepSeek-V3 on 128 H100s under a 50 ms TPOT."""
    import optuna

    import autoparallel as ap
    from cost_model import Inference

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    workload = Inference(prompt_tokens=2048, output_tokens=512, tpot_slo_s=0.05)
    return ap.find_plan(
        "deepseek-v3", ap.get_preset("dgx-h100", num_nodes=16), workload, n_trials=40, seed=1
    )


@pytest.fixture
def cli_json(capsys):
    """Run the CLI with ``argv`` (a command that prints JSON); its document. The run must exit
    0 (else the assertion shows its stderr)."""
    import json

    from autoparallel.cli import main

    def run(argv: list[str]) -> dict:
        assert main(argv) == 0, capsys.readouterr().err
        return json.loads(capsys.readouterr().out)

    return run


@pytest.fixture
def cli_refused(capsys):
    """Run the CLI with ``argv``, which it must refuse: exit 2, nothing on stdout, no
    traceback; its error message on one line."""
    from autoparallel.cli import main

    def run(argv: list[str]) -> str:
        assert main(argv) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and "Traceback" not in captured.err
        return " ".join(captured.err.split())

    return run
