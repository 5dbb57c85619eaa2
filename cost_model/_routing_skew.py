"""The expert-load skew of real traffic: how far the busiest expert-parallel rank's routed load
sits above the mean beyond the sampling excess of uniform routing.

Uniform routing of a mean load of ``L`` (token, expert) assignments per rank over ``N`` ranks
leaves the busiest rank at ``1 + sqrt(2 ln N / L)`` of the mean (the balls-into-bins excess,
``max_load_factor``: the largest of ``N`` counts that vary by ``sqrt(L)``). Real
traffic varies more: some experts are hotter than others, and an expert-placement balancer
(DeepSeek's EPLB: redundant replicas of the hot experts and a packing of experts onto ranks from
measured statistics; DeepSeek-V3 report sec. 3.4) evens the ranks only as far as the statistics
it placed from match the traffic. With that residual a relative spread ``skew`` of the ranks'
loads, independent of the sampling spread, the busiest rank carries

    1 + sqrt(2 ln N) * sqrt(1 / L + skew**2)

of the mean: the sampling part fades as the load grows, the skew does not.

``eplb_skew`` solves that expression for ``skew`` on each measured record of a deployment with a
balancer (``data/expert_load_skew.json``: TensorRT-LLM's DeepSeek-R1 routing statistics on 32
GB200, EP 32 and EP 36 over 288 slots) and takes their mean: one parameter from two records, each
of which predicts the other's imbalance (``leave_one_out``). The records without a balancer are
kept as data only: their skew depends on the dataset and on the experts' order (TensorRT-LLM
measured a 1.56 excess on its machine-translation set), so no default follows from them.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources

import numpy as np

__all__ = [
    "eplb_skew",
    "leave_one_out",
    "max_load_factor",
    "predicted_excess",
    "record_skew",
    "skew_data",
]


@lru_cache(maxsize=1)
def skew_data() -> dict:
    """``data/expert_load_skew.json``: the routing statistics with their source."""
    text = (resources.files("cost_model") / "data" / "expert_load_skew.json").read_text()
    return json.loads(text)


def max_load_factor(mean_load, num_bins, skew: float = 0.0) -> np.ndarray:
    """Most-loaded bin over the mean when items land uniformly at random (Raab & Steger 1998),
    with bins whose expected loads themselves spread by ``skew`` (relative) beyond the sampling
    (``_routing_skew``: real traffic's expert-load skew)."""
    mean_load = np.maximum(np.asarray(mean_load, dtype=np.float64), 1e-12)
    bins = np.asarray(num_bins, dtype=np.float64)
    spread = np.sqrt(1.0 / mean_load + skew * skew)
    return 1.0 + np.where(bins > 1, np.sqrt(2.0 * np.log(np.maximum(bins, 1.0))) * spread, 0.0)


def predicted_excess(*, ep: float, mean_load: float, skew: float) -> float:
    """The busiest rank's load over the mean, less one (``max_load_factor`` with ``skew``)."""
    return float(max_load_factor(mean_load, ep, skew)) - 1.0


def record_skew(record: dict) -> float:
    """The skew at which ``predicted_excess`` equals the record's measured imbalance ratio (0 where
    sampling alone explains it)."""
    z = math.sqrt(2.0 * math.log(record["ep"]))
    spread = record["imbalance_ratio"] / z
    return math.sqrt(max(spread * spread - 1.0 / record["mean_assignments_per_rank"], 0.0))


def _balanced_records() -> list[dict]:
    return [r for r in skew_data()["records"] if r["balancer"]]


@lru_cache(maxsize=1)
def eplb_skew() -> float:
    """The residual skew of a deployment that runs an expert-placement balancer: the mean of
    ``record_skew`` over the records with one."""
    records = _balanced_records()
    return sum(record_skew(r) for r in records) / len(records)


def leave_one_out() -> list[tuple[str, float, float]]:
    """``(case, measured, predicted)`` imbalance ratio of each balancer record, predicted from the
    skew of the other records alone."""
    records = _balanced_records()
    rows = []
    for held in records:
        others = [r for r in records if r is not held]
        skew = sum(record_skew(r) for r in others) / len(others)
        predicted = predicted_excess(
            ep=held["ep"], mean_load=held["mean_assignments_per_rank"], skew=skew
        )
        rows.append((held["case"], held["imbalance_ratio"], predicted))
    return rows
