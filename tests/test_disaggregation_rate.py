"""Disaggregated deployments under an offered request rate: each pool at the load it carries."""

from __future__ import annotations

import numpy as np
import pytest

import autoparallel as ap
from cost_model import (
    InfeasiblePlanError,
    Inference,
    ParallelConfig,
    PassCurve,
    PoolConfig,
    ServingConfig,
    disaggregated_split,
    pool_curve,
)
from topology import get_preset

MIXTRAL = ap.get_model("mixtral-8x7b")
H100 = get_preset("dgx-h100")
PREFILL = PoolConfig(config=ParallelConfig(pp=2), serving=ServingConfig(kv_dtype="bf16"))
DECODE = PoolConfig(config=ParallelConfig(tp=2, etp=2), serving=ServingConfig(kv_dtype="bf16"))


def _workload(rate: float | None) -> Inference:
    return Inference(
        prompt_tokens=1000,
        output_tokens=300,
        request_rate_per_s=rate,
        ttft_slo_s=5.0,
        tpot_slo_s=0.05,
    )


def test_a_curve_holds_what_arrives_during_one_pass() -> None:
    """c = rate x seconds(c): the least such c on the curve, the first point's share below it,
    the saturated point past it."""
    curve = PassCurve(np.array([1.0, 4.0, 16.0]), np.array([0.1, 0.2, 0.8]))
    assert curve.steady(2.0) == pytest.approx(0.2)  # one prompt per pass leaves it idle
    held = curve.steady(30.0)  # between 4 (demand 2) and 16 (demand 8): no root; saturated
    assert held == 16.0
    held = curve.steady(15.0)  # 15 x 0.2 = 3 < 4: the root is between 1 and 4
    assert 1.0 < held < 4.0 and held == pytest.approx(15.0 * curve.at(held), rel=1e-6)
    assert curve.at(0.5) == 0.1 and curve.at(10.0) == pytest.approx(0.5)


def test_each_pool_is_priced_at_the_load_the_rate_puts_on_it() -> None:
    """Under a light rate a prefill pass carries few prompts and a decode step few sequences, so
    the first token and the step are far below the saturated unit's; every device is used, and
    more load costs more latency."""
    saturated = disaggregated_split(
        model=MIXTRAL, cluster=H100, workload=_workload(None), prefill=PREFILL, decode=DECODE
    )
    light = disaggregated_split(
        model=MIXTRAL, cluster=H100, workload=_workload(2.0), prefill=PREFILL, decode=DECODE
    )
    heavy = disaggregated_split(
        model=MIXTRAL, cluster=H100, workload=_workload(20.0), prefill=PREFILL, decode=DECODE
    )
    for split in (light, heavy):
        assert split.prefill_devices + split.decode_devices == H100.num_devices
        assert split.requests_per_s in (2.0, 20.0)
    assert light.prefill_ttft_s < saturated.prefill_ttft_s / 5
    assert light.tpot_s < saturated.tpot_s
    assert light.ttft_s < heavy.ttft_s and light.tpot_s <= heavy.tpot_s
    # Little's law on the decode pool: sequences held = rate x output tokens x step, within
    # what one unit holds at its saturated batch
    curve = pool_curve(MIXTRAL, H100, _workload(20.0), DECODE, "decode")
    held = curve.steady(20.0 / heavy.decode_units * 300)
    assert heavy.tpot_s == pytest.approx(curve.at(max(held, 1.0)))
    assert held <= curve.concurrency[-1]


def test_a_rate_past_every_split_is_refused_with_what_it_carries() -> None:
    with pytest.raises(InfeasiblePlanError, match=r"needs more than 8 devices.*carries"):
        disaggregated_split(
            model=MIXTRAL, cluster=H100, workload=_workload(1e4), prefill=PREFILL, decode=DECODE
        )


def test_under_a_rate_the_deployment_with_the_lower_latency_wins() -> None:
    """Both deployments serve the offered rate on every device, so their output tokens/s per
    device tie; the plan keeps the one whose mean end-to-end latency is lower."""
    from autoparallel._planner import colocated_e2e_s

    workload = _workload(20.0)
    plan = ap.find_plan("mixtral-8x7b", H100, workload)
    deployment = plan.deployment
    assert deployment.pools and deployment.ttft_s is not None and deployment.tpot_s is not None
    assert deployment.disaggregated_output_tokens_per_s_per_device == pytest.approx(
        deployment.colocated_output_tokens_per_s_per_device
    )
    assert sum(pool.num_devices for pool in deployment.pools) == H100.num_devices
    disaggregated = deployment.ttft_s + 299 * deployment.tpot_s
    colocated = colocated_e2e_s(plan)
    assert colocated is not None
    assert (deployment.kind == "disaggregated") == (disaggregated < colocated)
    assert deployment.ttft_p90_s is not None and deployment.ttft_p90_s <= workload.ttft_slo_s


def test_an_offered_rate_past_every_layout_says_the_queue_grows(capsys) -> None:
    from autoparallel.cli import main

    code = main(
        [
            "plan",
            "--model",
            "mixtral-8x7b",
            "--cluster",
            "dgx-h100",
            "--request-rate",
            "200",
            "--prompt-tokens",
            "1000",
            "--output-tokens",
            "300",
            "--no-disaggregation",
        ]
    )
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2
    assert "queue grows without bound" in err and "e+" not in err and "1000000" not in err


def test_under_a_rate_the_search_ranks_layouts_by_end_to_end_latency() -> None:
    """Every layout that carries an offered rate on the whole cluster serves the same tokens/s
    per device, so the default objective is the mean end-to-end latency: the plan's is the least
    of the layouts it kept."""
    plan = ap.find_plan("mixtral-8x7b", H100, _workload(20.0), disaggregate=False)
    assert plan.provenance.search.objective == ("e2e",)
    assert plan.predicted.e2e_s is not None and plan.alternatives
    per_device = plan.predicted.tokens_per_s_per_device
    for alternative in plan.alternatives:
        assert alternative.predicted.tokens_per_s_per_device == pytest.approx(per_device)
        assert alternative.predicted.e2e_s is None or (
            plan.predicted.e2e_s <= alternative.predicted.e2e_s
        )
    closed_loop = ap.find_plan(
        "mixtral-8x7b", H100, _workload(20.0).model_copy(update={"request_rate_per_s": None})
    )
    assert closed_loop.provenance.search.objective == ("throughput",)


def test_closed_loop_clients_are_served_at_the_rate_littles_law_gives() -> None:
    """``concurrency`` clients, each sending its next request when the last ends, keep
    rate x end-to-end = concurrency: below the split's capacity on the pools' own latency, past
    it with the clients queued for admission; every device used either way."""
    saturated = disaggregated_split(
        model=MIXTRAL, cluster=H100, workload=_workload(None), prefill=PREFILL, decode=DECODE
    )
    for clients in (8, 64, 4096):
        workload = _workload(None).model_copy(update={"concurrency": clients})
        split = disaggregated_split(
            model=MIXTRAL, cluster=H100, workload=workload, prefill=PREFILL, decode=DECODE
        )
        assert split.prefill_devices + split.decode_devices == H100.num_devices
        e2e = split.ttft_s + 299 * split.tpot_s
        assert split.requests_per_s * e2e == pytest.approx(clients, rel=1e-3)
        capacity = min(
            split.prefill_units * split.prefill_requests_per_s_per_unit,
            split.decode_units * split.decode_requests_per_s_per_unit,
        )
        assert split.requests_per_s <= capacity * (1 + 1e-9)
        if clients == 8:
            assert split.client_wait_s == 0 and split.ttft_s < saturated.ttft_s / 5
        if clients == 4096:  # far past what the pools serve: they run saturated, clients wait
            assert split.client_wait_s > 0
            assert split.requests_per_s == pytest.approx(capacity)


def test_a_rate_only_pools_serve_within_the_slos_plans_the_pools() -> None:
    """At 70 requests/s no colocated layout of Mixtral-8x7B on one DGX H100 meets the TPOT SLO,
    while prefill and decode pools serve it within both: the plan deploys the pools (and says
    why) instead of refusing; without disaggregation it is refused."""
    workload = _workload(70.0)
    plan = ap.find_plan("mixtral-8x7b", H100, workload)
    deployment = plan.deployment
    assert deployment.kind == "disaggregated"
    assert "no colocated layout meets the SLOs" in deployment.note
    assert deployment.ttft_p90_s is not None and deployment.ttft_p90_s <= workload.ttft_slo_s
    assert deployment.tpot_s is not None and deployment.tpot_s <= workload.tpot_slo_s
    assert plan.predicted.tpot_s is not None and plan.predicted.tpot_s > workload.tpot_slo_s * 0.9
    with pytest.raises(InfeasiblePlanError, match="tpot_slo|ttft_slo"):
        ap.find_plan("mixtral-8x7b", H100, workload, disaggregate=False)
    from autoparallel.cli._render import console
    from autoparallel.cli._search import plan_table

    with console.capture() as captured:
        console.print(plan_table(plan))
    assert "none meeting the SLOs" in " ".join(captured.get().split())
