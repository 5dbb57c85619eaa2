"""``smallest_feasible_devices`` inside ``shared_fit_verdicts``: each size is priced once for the
same inputs, the answer is that of a fresh walk, and nothing is kept outside the block."""

from __future__ import annotations

import pytest

import autoparallel as ap
import search._feasibility as feasibility
from cost_model import Training
from search import shared_fit_verdicts, smallest_feasible_devices


@pytest.fixture
def priced(monkeypatch) -> list[int]:
    """Cluster sizes (devices) that ``smallest_feasible_devices`` priced, in order."""
    sizes: list[int] = []
    search_once = feasibility.exhaustive_search

    def counted(model, cluster, workload, **options):
        sizes.append(cluster.num_devices)
        return search_once(model, cluster, workload, **options)

    monkeypatch.setattr(feasibility, "exhaustive_search", counted)
    return sizes


def _smallest() -> int | None:
    return smallest_feasible_devices(
        model=ap.get_model("tiny-moe"),
        cluster=ap.get_preset("cpu-loopback"),
        workload=Training(sequence_length_tokens=64, global_batch_sequences=8),
    )


def test_shared_verdicts_price_each_size_once_with_the_same_answer(priced) -> None:
    fresh = _smallest()
    walk = list(priced)
    assert fresh is not None and walk
    with shared_fit_verdicts():
        assert _smallest() == fresh and priced[len(walk) :] == walk
        assert _smallest() == fresh and len(priced) == 2 * len(walk)  # answered from the verdicts
    assert _smallest() == fresh and len(priced) == 3 * len(walk)  # outside: priced again


def test_a_budget_that_samples_no_fitting_mesh_plans_the_lean_pass(capsys) -> None:
    """gpt-oss-120b trained on 16 H200: two sampled trials find no layout under 141 GB, while
    the exhaustive pass over the leanest switches (the one that decides the smallest fitting
    size) finds one at this very size. The plan is that pass's best, said so, not an error
    naming 16 devices as the smallest size that fits."""
    model, cluster = ap.get_model("gpt-oss-120b"), ap.get_preset("dgx-h200", num_nodes=2)
    workload = Training(sequence_length_tokens=4096, global_batch_tokens=4096 * 1024)
    from search import find_plan as sampled

    assert not sampled(model, cluster, workload, n_trials=2).feasible
    plan = ap.find_plan(model, cluster, workload, n_trials=2)
    assert plan.provenance.search.method.endswith("+lean")
    assert plan.config.recompute == "full" and plan.config.micro_batch_size == 1
    assert 0 < plan.predicted.memory_per_device_bytes <= cluster.memory_per_device_bytes
    from autoparallel.cli import main

    argv = ["plan", "--model", "gpt-oss-120b", "--cluster", "dgx-h200", "--nodes", "2"]
    capsys.readouterr()
    assert main([*argv, "--training", "--trials", "2", "--output", "/dev/null"]) == 0
    assert "found no fitting layout" in capsys.readouterr().out
