"""Retuner decisions in one process: calibration, candidates, the gain-versus-cost threshold.

The cost model, the planner and the search are the real ones (tiny-moe on the cpu-loopback
preset); only the measurements are synthetic, so each test knows what the right decision is.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

import autoparallel as ap
from autoparallel._expert_placement import contiguous_placement, load_imbalance, zipf_expert_load
from autoparallel.runtime._recovery import cluster_for_world, largest_legal_world, plan_for_config
from autoparallel.runtime.retune import MeasuredStep, Retuner, RetuneSettings, summarize
from cost_model import Inference, ParallelConfig, ServingConfig, Training

MODEL = ap.get_model("tiny-moe")
CLUSTER = ap.get_preset("cpu-loopback")
TRAINING = Training(sequence_length_tokens=16, global_batch_sequences=16)


def _plan(config: ParallelConfig, workload=TRAINING):
    return plan_for_config(model=MODEL, cluster=CLUSTER, workload=workload, config=config)


def _steps(plan, *, count: int = 4, scale: float = 1.0, load=None, start: int = 0, **fields):
    expert_load = None if load is None else (tuple(float(x) for x in load),)
    return [
        MeasuredStep(
            step=start + i,
            step_time_s=plan.predicted.step_time_s * scale,
            expert_load=expert_load,
            **fields,
        )
        for i in range(count)
    ]


def _retuner(plan, **settings) -> Retuner:
    return Retuner(
        plan, model=MODEL, cluster=CLUSTER, workload=TRAINING, settings=RetuneSettings(**settings)
    )


def test_skewed_routing_is_rebalanced_and_the_reason_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    plan = _plan(ParallelConfig(dp=4, ep=4, micro_batch_size=4))
    load = zipf_expert_load(num_experts=8, exponent=1.2, total_tokens=4096)
    before = load_imbalance(placement=contiguous_placement(num_experts=8, ep=4), expert_load=load)
    retuner = _retuner(plan, allowed_changes=("expert_placement",), num_redundant_experts=4)
    # Measured communication well under the prediction: the replicas' gradient sync is cheap here.
    comm = sum(v for k, v in plan.predicted.time_s.items() if k.endswith("_comm"))
    with caplog.at_level(logging.INFO, logger="autoparallel.retune"):
        decision = retuner.decide(
            _steps(plan, scale=1.2, load=load, communication_time_s=0.05 * comm)
        )
    assert decision.kind == "expert_placement" and decision.changed
    assert decision.calibration.expert_imbalance == pytest.approx(before)
    after = load_imbalance(placement=decision.plan.expert_placement, expert_load=load)
    assert after <= 1.15 < 1.8 <= before
    assert decision.new_step_time_s < decision.predicted_step_time_s
    assert (
        decision.plan.config == plan.config
        and decision.plan.expert_placement.num_redundant_experts == 4
    )
    assert (
        "change expert_placement" in decision.reason
        and "max/mean tokens per EP rank" in decision.reason
    )
    assert any("change expert_placement" in record.getMessage() for record in caplog.records)


def test_balanced_run_at_the_prediction_keeps_the_plan() -> None:
    plan = ap.find_plan(MODEL, CLUSTER, TRAINING, n_trials=16)
    retuner = _retuner(plan)
    decision = retuner.decide(_steps(plan, scale=1.0, load=np.full(8, 100.0)))
    assert decision.kind == "keep" and decision.plan == plan
    assert decision.calibration.time_scale == pytest.approx(1.0)
    assert "keep the plan" in decision.reason
    assert decision.candidates  # the re-search and the live variants were considered
    # The re-search may find a faster layout than a short initial search did, but at the
    # prediction a restart does not pay back within the horizon; no live change is worth it.
    for candidate in decision.candidates:
        if candidate.gain_s_per_step > 0.03 * decision.predicted_step_time_s:
            assert candidate.kind == "reshard" and candidate.change_cost_s >= 120.0
            assert candidate.gain_s_per_step * 1000 < 1.5 * candidate.change_cost_s


def test_slow_micro_batches_change_live() -> None:
    plan = _plan(ParallelConfig(dp=4, micro_batch_size=1))
    decision = _retuner(plan, allowed_changes=("micro_batch",)).decide(_steps(plan))
    assert decision.kind == "micro_batch"
    assert decision.plan.config.micro_batch_size > 1
    assert decision.plan.config.model_copy(update={"micro_batch_size": 1}) == plan.config
    assert decision.change_cost_s == pytest.approx(
        decision.predicted_step_time_s
    )  # one step's worth


def _faster(plan, *, factor: float):
    """The same plan predicted ``factor`` x faster, as another layout (tp2) a re-search found."""
    predicted = plan.predicted.model_copy(
        update={
            "step_time_s": plan.predicted.step_time_s / factor,
            "time_s": {k: v / factor for k, v in plan.predicted.time_s.items()},
        }
    )
    config = plan.config.model_copy(update={"dp": 2, "tp": 2})
    return plan_for_config(
        model=MODEL, cluster=CLUSTER, workload=plan.job, config=config, predicted=predicted
    )


def test_a_reshard_must_pay_back_its_restart() -> None:
    plan = _plan(ParallelConfig(dp=4, micro_batch_size=4))
    faster = _faster(plan, factor=1.25)
    # fit_cost_model off: the injected plan's prediction is the premise, not to be re-priced.
    settings = dict(allowed_changes=("reshard",), restart_overhead_s=60.0, fit_cost_model=False)
    short = Retuner(
        plan,
        model=MODEL,
        cluster=CLUSTER,
        workload=TRAINING,
        search=lambda current: [faster],
        settings=RetuneSettings(horizon_steps=100, **settings),
    )
    decision = short.decide(_steps(plan))
    assert decision.kind == "keep" and "does not pay back its cost" in decision.reason
    long = Retuner(
        plan,
        model=MODEL,
        cluster=CLUSTER,
        workload=TRAINING,
        search=lambda current: [faster],
        settings=RetuneSettings(horizon_steps=10**8, **settings),
    )
    decision = long.decide(_steps(plan))
    assert decision.kind == "reshard" and decision.plan.config.tp == 2
    assert decision.change_cost_s >= 60.0
    assert decision.gain_s_per_step * 10**8 >= 1.5 * decision.change_cost_s


def test_small_gains_are_noise() -> None:
    plan = _plan(ParallelConfig(dp=4, micro_batch_size=4))
    retuner = Retuner(
        plan,
        model=MODEL,
        cluster=CLUSTER,
        workload=TRAINING,
        search=lambda current: [_faster(plan, factor=1.01)],
        settings=RetuneSettings(
            allowed_changes=("reshard",),
            horizon_steps=10**9,
            restart_overhead_s=0.0,
            fit_cost_model=False,
        ),
    )
    decision = retuner.decide(_steps(plan))
    assert decision.kind == "keep" and "gain below noise" in decision.reason


def test_calibration_fits_time_communication_and_memory() -> None:
    plan = _plan(ParallelConfig(dp=4, ep=4, micro_batch_size=4))
    predicted = plan.predicted
    comm = sum(v for k, v in predicted.time_s.items() if k.endswith("_comm"))
    assert comm > 0
    retuner = _retuner(plan, fit_cost_model=False)
    plain = retuner.calibrate(summarize(_steps(plan, scale=2.0)))
    assert plain.time_scale == pytest.approx(2.0) and plain.communication_scale is None
    measured_comm = 3.0 * comm
    steps = _steps(
        plan,
        scale=2.0,
        communication_time_s=measured_comm,
        peak_memory_bytes=predicted.memory_per_device_bytes * 1.5,
    )
    fitted = retuner.calibrate(summarize(steps))
    assert fitted.communication_scale == pytest.approx(3.0)
    rest = predicted.step_time_s - comm
    assert fitted.time_scale == pytest.approx((2.0 * predicted.step_time_s - measured_comm) / rest)
    assert fitted.memory_scale == pytest.approx(1.5)
    # The fitted model reproduces the measurement it was fitted on.
    assert retuner.policy._calibrated_time(plan, 1.0, fitted) == pytest.approx(
        2.0 * predicted.step_time_s
    )


def test_observe_decides_every_n_steps_after_warmup() -> None:
    plan = _plan(ParallelConfig(dp=4, micro_batch_size=4))
    retuner = Retuner(
        plan,
        model=MODEL,
        cluster=CLUSTER,
        workload=TRAINING,
        search=lambda current: [],
        settings=RetuneSettings(every_n_steps=3, warmup_steps=2, allowed_changes=("reshard",)),
    )
    results = [retuner.observe(m) for m in _steps(plan, count=8)]
    assert [r is not None for r in results] == [
        False,
        False,
        False,
        False,
        True,
        False,
        False,
        True,
    ]
    assert [d.step for d in retuner.decisions] == [4, 7]


def test_inference_batch_size_is_compared_per_token() -> None:
    workload = Inference(prompt_tokens=64, output_tokens=64)
    plan = plan_for_config(
        model=MODEL,
        cluster=CLUSTER,
        workload=workload,
        config=ParallelConfig(dp=4),
        serving=ServingConfig(batch_size=1, kv_dtype="bf16", num_redundant_experts=0),
    )
    retuner = Retuner(
        plan,
        model=MODEL,
        cluster=CLUSTER,
        workload=workload,
        settings=RetuneSettings(allowed_changes=("batch_size",)),
    )
    decision = retuner.decide(_steps(plan))
    assert decision.kind == "batch_size"
    assert decision.plan.serving.batch_size > 1 and decision.plan.config == plan.config
    # A bigger batch makes each decode step longer but each token cheaper.
    assert decision.plan.predicted.step_time_s >= plan.predicted.step_time_s
    assert decision.new_step_time_s < decision.predicted_step_time_s


def test_bad_use_raises_value_error() -> None:
    plan = _plan(ParallelConfig(dp=4, micro_batch_size=4))
    with pytest.raises(ValueError, match="plan.predicted"):
        Retuner(
            plan.model_copy(update={"predicted": None}),
            model=MODEL,
            cluster=CLUSTER,
            workload=TRAINING,
        )
    retuner = _retuner(plan)
    with pytest.raises(ValueError, match="window"):
        retuner.decide([])
    decision = Retuner(
        plan,
        model=MODEL,
        cluster=CLUSTER,
        workload=TRAINING,
        search=lambda current: [_faster(plan, factor=2)],
        settings=RetuneSettings(
            allowed_changes=("reshard",), horizon_steps=10**9, fit_cost_model=False
        ),
    ).decide(_steps(plan))
    with pytest.raises(ValueError, match="not a live change"):
        retuner.apply(decision)
    with pytest.raises(ValueError, match="every_n_steps"):
        RetuneSettings(every_n_steps=0)


def test_largest_legal_world_and_resized_clusters() -> None:
    from autoparallel.runtime import tiny_reference_spec
    from search import SearchSpace

    workload = Training(sequence_length_tokens=16, global_batch_sequences=4)
    # 2 layers (pp <= 2), 4 heads, 8 experts, 4 sequences: nothing splits over 3 ranks.
    two_layers = tiny_reference_spec(num_layers=2)
    assert (
        largest_legal_world(model=two_layers, cluster=CLUSTER, workload=workload, max_world_size=3)
        == 2
    )
    assert (
        SearchSpace(model=two_layers, workload=workload, world_size=3, devices_per_node=3).size == 0
    )
    # 4 layers: pp3 with uneven stages is legal, so all 3 survivors are used.
    assert (
        largest_legal_world(model=MODEL, cluster=CLUSTER, workload=workload, max_world_size=3) == 3
    )
    assert cluster_for_world(CLUSTER, 2).num_devices == 2
    assert (
        cluster_for_world(CLUSTER, 3).collective_time(
            "all_reduce", group_size=3, ranks_per_node=3, message_bytes=1e6
        )
        > 0
    )
    assert cluster_for_world(CLUSTER.with_nodes(2), 8).num_devices == 8
    with pytest.raises(ValueError, match="world_size"):
        cluster_for_world(CLUSTER.with_nodes(2), 6)


def test_a_lost_peer_becomes_a_clear_error() -> None:
    from autoparallel.runtime._recovery import RankLostError, guard_step

    gloo = RuntimeError(
        "[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:41234"
    )
    with pytest.raises(
        RankLostError, match=r"during step 7 .*Retuner\.recover\('/jobs/ckpt'\)"
    ) as lost:
        with guard_step(step=7, checkpoint="/jobs/ckpt"):
            raise gloo
    assert lost.value.step == 7 and lost.value.cause is gloo
    with pytest.raises(RankLostError, match="no checkpoint was configured"):
        with guard_step(step=2):
            raise gloo
    with pytest.raises(KeyError):  # not a lost peer: passes through unchanged
        with guard_step(step=1, checkpoint="/jobs/ckpt"):
            raise KeyError("batch")


def test_checkpoint_info_errors_name_the_path(tmp_path) -> None:
    from autoparallel.runtime._reshard import read_checkpoint_info

    with pytest.raises(ValueError, match="nothing was saved there"):
        read_checkpoint_info(tmp_path)


def test_cost_model_calibrate_refits_the_matmul_efficiency() -> None:
    plan = _plan(ParallelConfig(dp=4, ep=4, micro_batch_size=4))
    retuner = _retuner(plan)
    calibration = retuner.calibrate(summarize(_steps(plan, scale=2.0)))
    assert calibration.method.startswith("cost_model.calibrate")
    fitted = retuner.policy._cost_calibration
    assert fitted is not None and fitted.matmul_efficiency < CLUSTER.device.matmul_efficiency
    # The refitted cost model explains most of the 2x; the residual scale is what it could not.
    assert abs(np.log(calibration.time_scale)) < 0.5 * np.log(2.0)
    assert retuner.policy._calibrated_time(plan, 1.0, calibration) == pytest.approx(
        2.0 * plan.predicted.step_time_s
    )


def test_measurement_from_a_step_profiler_report() -> None:
    from types import SimpleNamespace

    report = SimpleNamespace(
        median_step_time_s=0.25,
        peak_memory_bytes=3e9,
        comm_time_s=0.05,
        expert_load={"model.layers.10.mlp.gate": (1, 2, 3), "model.layers.2.mlp.gate": (4, 5, 6)},
    )
    measurement = MeasuredStep.from_step_report(report, step=9)
    assert (
        measurement.step == 9
        and measurement.step_time_s == 0.25
        and measurement.communication_time_s == 0.05
    )
    assert measurement.expert_load == ((4.0, 5.0, 6.0), (1.0, 2.0, 3.0))  # layer 2 before layer 10
    assert summarize([measurement]).expert_load.tolist() == [5.0, 7.0, 9.0]


def test_replicas_are_weighed_against_their_gradient_sync(caplog: pytest.LogCaptureFixture) -> None:
    plan = _plan(ParallelConfig(dp=4, ep=4, micro_batch_size=4))
    load = zipf_expert_load(num_experts=8, exponent=1.2, total_tokens=4096)
    retuner = _retuner(plan, allowed_changes=("expert_placement",), min_relative_gain=0.0)
    decision = retuner.decide(_steps(plan, scale=1.2, load=load))
    by_replicas = {c.plan.expert_placement.num_redundant_experts: c for c in decision.candidates}
    assert set(by_replicas) == {0, 4}  # one replica slot per EP rank, or none
    with_replicas, without = by_replicas[4], by_replicas[0]
    assert load_imbalance(
        placement=with_replicas.plan.expert_placement, expert_load=load
    ) < load_imbalance(placement=without.plan.expert_placement, expert_load=load)
    # Training pays an all-reduce of the replicated experts' gradients every step.
    assert (
        retuner.policy._replica_sync_s(with_replicas.plan.expert_placement, decision.calibration)
        > 0
    )
    assert retuner.policy._replica_sync_s(without.plan.expert_placement, decision.calibration) == 0
    chosen = min(decision.candidates, key=lambda c: c.step_time_s)
    assert decision.plan.expert_placement == chosen.plan.expert_placement


def test_an_override_takes_the_priced_candidate() -> None:
    plan = _plan(ParallelConfig(dp=4, ep=4, micro_batch_size=4))
    load = zipf_expert_load(num_experts=8, exponent=1.2, total_tokens=4096)
    decision = _retuner(
        plan, allowed_changes=("expert_placement",), num_redundant_experts=4
    ).decide(_steps(plan, load=load))
    forced = decision.overridden("expert_placement")
    assert (
        forced.kind == "expert_placement"
        and forced.plan.expert_placement.num_redundant_experts == 4
    )
    assert (
        forced.reason.startswith("override to expert_placement")
        and decision.reason in forced.reason
    )
    with pytest.raises(ValueError, match="not among the priced candidates"):
        decision.overridden("reshard")


def test_the_policy_decides_without_torch() -> None:
    """``autoparallel.retune`` is the torch-free half: a policy alone turns measured steps into a
    decision in a process where importing torch fails."""
    import subprocess
    import sys

    script = (
        "import sys; sys.modules['torch'] = None\n"
        "import autoparallel as ap\n"
        "from autoparallel.retune import MeasuredStep, RetunePolicy, RetuneSettings\n"
        "from autoparallel.retune._replan import plan_for_config\n"
        "from cost_model import ParallelConfig, Training\n"
        "model, cluster = ap.get_model('tiny-moe'), ap.get_preset('cpu-loopback')\n"
        "workload = Training(sequence_length_tokens=16, global_batch_sequences=16)\n"
        "plan = plan_for_config(model=model, cluster=cluster, workload=workload, config=ParallelConfig(dp=4, ep=4))\n"
        "policy = RetunePolicy(plan, model=model, cluster=cluster, workload=workload,\n"
        "                      settings=RetuneSettings(allowed_changes=('expert_placement',)))\n"
        "load = (tuple([400.0] + [10.0] * 7),)\n"
        "steps = [MeasuredStep(step=i, step_time_s=plan.predicted.step_time_s * 1.5, expert_load=load) for i in range(4)]\n"
        "decision = policy.decide(steps)\n"
        "print(decision.kind, decision.calibration.expert_imbalance > 1)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    kind, skewed = result.stdout.split()
    assert skewed == "True" and kind in ("expert_placement", "keep")


def test_serving_skew_is_priced_by_the_cost_model() -> None:
    """The stretch a measured expert skew puts on a serving plan is the cost model's own decode
    step at that routing imbalance, not a re-derived share of the step."""
    from cost_model import EstimateOptions, ServingConfig, configs_to_table, estimate_table

    workload = Inference(prompt_tokens=64, output_tokens=64)
    plan = plan_for_config(
        model=MODEL,
        cluster=CLUSTER,
        workload=workload,
        config=ParallelConfig(dp=4, ep=4),
        serving=ServingConfig(batch_size=8, kv_dtype="bf16", num_redundant_experts=0),
    )
    retuner = Retuner(plan, model=MODEL, cluster=CLUSTER, workload=workload)
    serving = ServingConfig(batch_size=8).columns(workload=workload)
    table = configs_to_table([plan.config], **serving)
    skewed = estimate_table(
        MODEL, CLUSTER, workload, table, options=EstimateOptions(routing_imbalance=3.0)
    )
    expected = float(skewed["step_time_s"][0]) / plan.predicted.step_time_s
    assert expected > 1.0
    assert retuner.policy._stretch(plan, 3.0) == pytest.approx(expected)
