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
