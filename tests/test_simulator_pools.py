"""The disaggregated pools in the serving simulator: prefill units, the KV transfer and decode
units, each run iteration by iteration; the planner keeps the rate at which they meet the SLOs."""

from __future__ import annotations

import numpy as np
import pytest

import autoparallel as ap
from autoparallel.cli import main
from cost_model import Inference, ParallelConfig, PoolUnit, ServingConfig, simulate_pools, slo_rate
from cost_model._serving import PoolConfig, _kv_transfer
from cost_model._simulator_load import MAX_SIMULATED_REQUESTS
from search._disaggregation import unit_cluster
from topology import get_preset

MODEL = ap.get_model("deepseek-v3")
CLUSTER = get_preset("dgx-h200")
WORKLOAD = Inference(
    prompt_tokens=4000,
    output_tokens=1000,
    weight_dtype="fp8",
    ttft_slo_s=2.0,
    tpot_slo_s=0.05,
)
PREFILL = PoolUnit(
    cluster=unit_cluster(CLUSTER, 8),
    config=ParallelConfig(dp=8, ep=8, attention_data_parallel=True),
    serving=ServingConfig(batch_size=2, a2a_backend="normal", phase="prefill"),
    units=1,
)
DECODE = PoolUnit(
    cluster=unit_cluster(CLUSTER, 8),
    config=ParallelConfig(dp=4, tp=2, ep=8, attention_data_parallel=True),
    serving=ServingConfig(batch_size=64, a2a_backend="low_latency", phase="decode"),
    units=1,
)


def _kv_s() -> float:
    decode = PoolConfig(config=DECODE.config, serving=DECODE.serving)
    return _kv_transfer(MODEL, CLUSTER, WORKLOAD, decode, 1.0, 8)[0]


def _run(rate: float, **extra):
    return simulate_pools(
        model=MODEL,
        workload=WORKLOAD,
        prefill=PREFILL,
        decode=DECODE,
        requests_per_s=rate,
        kv_transfer_s=_kv_s(),
        duration_s=300.0,
        **extra,
    )


def test_at_a_trickle_the_first_token_is_one_prefill_a_transfer_and_one_step() -> None:
    quiet = _run(0.05)
    prefill = float(np.median(quiet.prefill.ttft_s))  # a lone prompt: its pass and the overhead
    step = float(np.median(quiet.decode.tpot_s))
    assert np.median(quiet.ttft_s) == pytest.approx(prefill + _kv_s() + step, rel=0.05)
    assert np.median(quiet.tpot_s) == pytest.approx(step)


def test_the_first_token_waits_longer_as_the_rate_rises() -> None:
    means = [float(np.mean(_run(rate).ttft_s)) for rate in (0.5, 2.0, 4.0)]
    assert means == sorted(means) and means[-1] > 1.2 * means[0]


def test_slo_rate_keeps_the_largest_share_that_meets_the_slos() -> None:
    share, run = slo_rate(
        model=MODEL,
        workload=WORKLOAD,
        prefill=PREFILL,
        decode=DECODE,
        requests_per_s=20.0,
        kv_transfer_s=_kv_s(),
    )
    assert 0.0 < share < 1.0 and run.meets(WORKLOAD)
    assert run.requests_per_s == pytest.approx(20.0 * share)
    over = _run(20.0 * (share + 1.0 / 16.0), seed=0)
    assert not over.meets(WORKLOAD) or share >= 1.0 - 1.0 / 16.0


def test_a_rate_that_is_not_positive_is_named() -> None:
    with pytest.raises(ValueError, match=r"requests_per_s \(0\.0\) must be > 0"):
        _run(0.0)


def test_the_planned_pools_meet_the_slos_in_the_simulator(tmp_path, capsys) -> None:
    out = tmp_path / "plan.json"
    main(
        [
            "plan",
            "--model",
            "deepseek-v3",
            "--cluster",
            "dgx-h200",
            "--nodes",
            "2",
            "--prompt-tokens",
            "4000",
            "--output-tokens",
            "1000",
            "--ttft-slo-ms",
            "2000",
            "--tpot-slo-ms",
            "50",
            "--output",
            str(out),
        ]
    )
    printed = " ".join(capsys.readouterr().out.split())
    assert "serving simulator (the disaggregated pools, Poisson arrivals) at" in printed
    assert "where the simulated pools meet the SLOs" in printed
    deployment = ap.load_plan(out).deployment
    assert deployment.kind == "disaggregated"
    assert deployment.simulated_ttft_p90_s <= 2.0 and deployment.simulated_tpot_p90_s <= 0.05
    devices = sum(pool.num_devices for pool in deployment.pools)
    closed_form = deployment.disaggregated_output_tokens_per_s_per_device * devices / 1000
    # the simulated pools carry at most the split's own rate
    assert 0 < deployment.simulated_requests_per_s <= closed_form * (1 + 1e-9)


def test_a_small_models_design_rate_runs_a_bounded_number_of_requests() -> None:
    """A small model's pools serve tens of thousands of requests per second: without a given
    duration each pool runs ``MAX_SIMULATED_REQUESTS`` at most (10 minutes of such a rate filled
    the host's memory and killed the plan of a tiny MoE), and a given duration is honoured."""
    tiny = ap.get_model("tiny-moe")
    workload = Inference(prompt_tokens=512, output_tokens=64)
    unit = unit_cluster(CLUSTER, 1)
    pools = {
        phase: PoolUnit(
            cluster=unit,
            config=ParallelConfig(),
            serving=ServingConfig(batch_size=256, phase=phase),
            units=1,
        )
        for phase in ("prefill", "decode")
    }

    def run_at(**duration):
        return simulate_pools(
            model=tiny,
            workload=workload,
            prefill=pools["prefill"],
            decode=pools["decode"],
            requests_per_s=5_000.0,
            kv_transfer_s=1e-4,
            **duration,
        )

    run = run_at()
    assert 0 < run.prefill.ttft_s.size <= 1.05 * MAX_SIMULATED_REQUESTS
    assert run.requests_per_s == 5_000.0 and np.all(np.isfinite(run.ttft_s))
    # a duration given is the caller's: honoured as given
    assert run_at(duration_s=2.0).prefill.ttft_s.size < 0.2 * run.prefill.ttft_s.size


def test_a_tiny_moe_plan_simulates_its_pools_and_completes() -> None:
    plan = ap.find_plan(
        "tiny-moe",
        get_preset("dgx-h100", num_nodes=1),
        Inference(prompt_tokens=512, output_tokens=64),
        n_trials=10,
    )
    assert plan.deployment.kind in ("colocated", "disaggregated")
    assert plan.predicted is not None
