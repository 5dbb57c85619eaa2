"""Real traffic's expert-load skew (``cost_model._routing_skew``): one parameter from measured
routing statistics, how it widens the busiest expert rank's load, and where the estimates use it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from autoparallel import get_model
from cost_model import EstimateOptions, estimate_inference_table, table_from_columns
from cost_model._routing_skew import (
    eplb_skew,
    leave_one_out,
    max_load_factor,
    predicted_excess,
    record_skew,
    skew_data,
)
from cost_model._workload import Inference
from topology import get_preset

DSV3 = get_model("deepseek-v3")
H100_4_NODES = get_preset("dgx-h100", num_nodes=4)
PREFILL = Inference(prompt_tokens=4096, output_tokens=1, weight_dtype="fp8")


def test_each_balancer_record_is_reproduced_by_its_own_skew() -> None:
    records = [r for r in skew_data()["records"] if r["balancer"]]
    assert len(records) >= 2
    for record in records:
        excess = predicted_excess(
            ep=record["ep"],
            mean_load=record["mean_assignments_per_rank"],
            skew=record_skew(record),
        )
        assert excess == pytest.approx(record["imbalance_ratio"], rel=1e-9)
    # the default is their mean, and it is a residual: far below the unbalanced record's
    unbalanced = next(r for r in skew_data()["records"] if not r["balancer"])
    assert min(map(record_skew, records)) <= eplb_skew() <= max(map(record_skew, records))
    assert 0.0 < eplb_skew() < 0.1 * record_skew(unbalanced)


def test_each_record_is_predicted_from_the_others_within_five_percent() -> None:
    rows = leave_one_out()
    assert len(rows) >= 2
    for case, measured, predicted in rows:
        assert predicted == pytest.approx(measured, rel=0.05), case


def test_the_skew_outlasts_the_sampling_excess() -> None:
    skew = eplb_skew()
    loads = np.array([1e2, 1e3, 1e4, 1e6])
    uniform = max_load_factor(loads, 32)
    skewed = max_load_factor(loads, 32, skew)
    assert np.all(skewed > uniform)
    assert uniform[-1] == pytest.approx(1.0, abs=0.01)  # sampling fades with the load
    assert skewed[-1] - 1.0 == pytest.approx(math.sqrt(2.0 * math.log(32)) * skew, rel=0.01)
    assert float(max_load_factor(1e6, 1, skew)) == 1.0  # one rank holds every expert


def test_a_monte_carlo_of_skewed_ranks_stays_within_the_uniform_factors_slack() -> None:
    """Ranks whose expected loads spread by ``skew`` around the mean, each count Poisson around
    its own expectation: the closed form bounds the simulated busiest rank from above within the
    slack its uniform form has (``test_decode_load``: 1.0-1.6 on the excess)."""
    rng = np.random.default_rng(7)
    skew, ranks, mean = eplb_skew(), 32, 1024.0
    expected = mean * np.clip(1.0 + skew * rng.standard_normal((4000, ranks)), 0.0, None)
    counts = rng.poisson(expected)
    simulated = float(np.mean(counts.max(axis=1) / counts.mean(axis=1)))
    predicted = float(max_load_factor(mean, ranks, skew))
    assert 1.0 <= (predicted - 1.0) / (simulated - 1.0) <= 1.6


def _prefill(options: EstimateOptions, **columns) -> dict:
    table = table_from_columns(batch_size=4, phase=1, **columns)
    return estimate_inference_table(
        model=DSV3, cluster=H100_4_NODES, workload=PREFILL, table=table, options=options
    )


def test_the_default_is_the_eplb_residual_and_zero_is_uniform_routing() -> None:
    assert EstimateOptions().routing_skew == eplb_skew()
    assert EstimateOptions(expert_load_skew=0.0).routing_skew == 0.0
    expert_parallel = {"dp": 32, "ep": 32}
    real = _prefill(EstimateOptions(), **expert_parallel)
    uniform = _prefill(EstimateOptions(expert_load_skew=0.0), **expert_parallel)
    assert real["time.prefill_compute"][0] > uniform["time.prefill_compute"][0]
    assert (
        real["prefill_tokens_per_s_per_device"][0] < uniform["prefill_tokens_per_s_per_device"][0]
    )
    # no expert parallelism: every rank holds every expert, nothing to skew
    tensor_parallel = {"tp": 32, "ep": 1}
    assert (
        _prefill(EstimateOptions(), **tensor_parallel)["time.prefill_compute"][0]
        == (
            _prefill(EstimateOptions(expert_load_skew=0.0), **tensor_parallel)[
                "time.prefill_compute"
            ][0]
        )
    )


def test_a_negative_skew_names_the_field() -> None:
    with pytest.raises(ValidationError, match="expert_load_skew"):
        EstimateOptions(expert_load_skew=-0.1)
