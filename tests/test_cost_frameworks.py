"""Framework profiles: named, sourced software facts that change the priced step."""

from __future__ import annotations

import numpy as np
import pytest

from cost_model import EstimateOptions, ParallelConfig, Training, estimate_table
from cost_model._frameworks import framework_names, framework_profile
from cost_model._options import Calibration
from cost_model._table import configs_to_table
from cost_model._validation_cases import gpt_model
from topology import get_preset

MODEL = gpt_model(
    name="gpt-13b-like", heads=40, hidden=5120, layers=40, vocab=32000, sequence=4096, tied=False
)
CLUSTER = get_preset("dgx-a100", num_nodes=8)
NEUTRAL = EstimateOptions(calibration=Calibration())


def _columns(
    framework: str | None, zero_stage: int, micro_batches: int = 1, gradient_dtype: str = "fp32"
) -> dict[str, np.ndarray]:
    workload = Training(
        sequence_length_tokens=4096,
        global_batch_sequences=64 * micro_batches,
        framework=framework,
        gradient_dtype=gradient_dtype,
    )
    config = ParallelConfig(dp=64, zero_stage=zero_stage, recompute="selective")
    return estimate_table(MODEL, CLUSTER, workload, configs_to_table([config]), options=NEUTRAL)


def test_every_profile_has_a_source_and_the_named_frameworks_exist() -> None:
    assert {"megatron-core", "deepspeed", "torchtitan"} <= set(framework_names())
    assert all(len(framework_profile(name).source) > 40 for name in framework_names())


def test_an_unknown_framework_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="framework .*'nope'.* must be one of"):
        Training(sequence_length_tokens=2048, global_batch_sequences=8, framework="nope")


def _dp_seconds(columns: dict[str, np.ndarray]) -> float:
    return float(columns["time.dp_comm"][0] + columns["hidden.dp_comm"][0])


def test_bf16_gradient_reduction_moves_less_than_fp32() -> None:
    """Megatron-core with bf16 main gradients (Megatron-Bridge's grad_reduce_in_fp32 = False)
    reduces in bf16, torchtitan's FSDP2 policy in fp32: the ZeRO-1 traffic (one reduce-scatter
    + one all-gather) differs by the gradient half."""
    megatron = _columns("megatron-core", 1, gradient_dtype="bf16")
    torchtitan = _columns("torchtitan", 1, gradient_dtype="bf16")
    assert _dp_seconds(megatron) < _dp_seconds(torchtitan)
    assert framework_profile("torchtitan").gradient_reduce_bytes == 4


def test_megatron_core_reduces_in_its_main_gradient_dtype() -> None:
    """Megatron-core's reduce-scatter moves its main-gradient buffer: fp32 main gradients
    (Megatron-LM's --bf16 default) move twice the gradient bytes of bf16 ones, so the ZeRO-1
    step (gradient reduce-scatter + bf16 weight all-gather) grows by half."""
    assert framework_profile("megatron-core").gradient_reduce_bytes is None
    fp32 = _dp_seconds(_columns("megatron-core", 1, gradient_dtype="fp32"))
    bf16 = _dp_seconds(_columns("megatron-core", 1, gradient_dtype="bf16"))
    assert fp32 == pytest.approx(1.5 * bf16, rel=0.05)


def test_no_overlap_profile_exposes_all_gradient_traffic() -> None:
    old = _columns("megatron-lm-2021", 0)
    assert old["hidden.dp_comm"][0] == 0.0 and old["time.dp_comm"][0] > 0.0
    core = _columns("megatron-core", 0)
    assert core["hidden.dp_comm"][0] > 0.0


def test_zero2_reduces_per_micro_batch_only_where_the_framework_does() -> None:
    deepspeed, megatron = (
        _columns("deepspeed", 2, micro_batches=4),
        _columns("megatron-core", 2, micro_batches=4),
    )
    deepspeed_one = _columns("deepspeed", 2, micro_batches=1)
    megatron_one = _columns("megatron-core", 2, micro_batches=1)

    def traffic(c):
        return c["time.dp_comm"][0] + c["hidden.dp_comm"][0]

    assert traffic(deepspeed) > 2.0 * traffic(deepspeed_one)
    assert traffic(megatron) == pytest.approx(traffic(megatron_one), rel=1e-9)


def test_unfused_cross_entropy_adds_its_counted_passes() -> None:
    """Megatron-core's eager vocab-parallel cross entropy moves 38 bytes per logit forward and 14
    backward (``cross_entropy_bytes_per_logit``) where the default counts 12 and 24: the micro-
    batch grows by exactly those passes over the rank's logits, and nothing else changes."""
    from cost_model._training_comm import table_collective_times
    from cost_model._training_context import training_context
    from cost_model._training_micro_batch import micro_batch_times
    from cost_model._training_ops import cross_entropy_bytes_per_logit, cross_entropy_time
    from cost_model._validation import _cluster, _options, _workload
    from cost_model._validation_cases import training_cases

    (case,) = [c for c in training_cases() if (c.table, c.run) == ("megatron_readme_h100", "1.7B")]
    cluster = _cluster(case.hardware, case.config.world_size)
    unfused = _options(case, None, cluster)
    assert unfused.unfused_cross_entropy
    table = configs_to_table([case.config])
    times = {}
    for options in (unfused, unfused.model_copy(update={"unfused_cross_entropy": False})):
        ctx = training_context(
            model=case.model,
            cluster=cluster,
            workload=_workload(case),
            table=table,
            options=options,
        )
        mb = micro_batch_times(ctx, table_collective_times(ctx))
        loss = cross_entropy_time(ctx, backward=False) + cross_entropy_time(ctx, backward=True)
        # pp = 1: the one stage (row 0) holds the LM head
        times[options.unfused_cross_entropy] = ((mb.forward + mb.backward)[0], loss, ctx)
    assert cross_entropy_bytes_per_logit(times[True][2]) == (38.0, 14.0)
    assert cross_entropy_bytes_per_logit(times[False][2]) == (12.0, 24.0)
    np.testing.assert_allclose(
        times[True][0] - times[False][0], times[True][1] - times[False][1], rtol=1e-9
    )
    assert np.all(times[True][1] > times[False][1])


def _dp64_context(framework: str):
    """A ZeRO-1 context of MODEL over 64 data-parallel ranks under ``framework``."""
    from cost_model._training_context import training_context

    workload = Training(sequence_length_tokens=4096, global_batch_sequences=64, framework=framework)
    return training_context(
        model=MODEL,
        cluster=CLUSTER,
        workload=workload,
        table=configs_to_table([ParallelConfig(dp=64, zero_stage=1)]),
        options=NEUTRAL,
    )


def test_megatron_core_zeroes_its_whole_gradient_buffer_each_step() -> None:
    """Megatron-core's ``zero_grad_buffer`` writes the rank's whole fp32 main-gradient buffer
    once per step (ZeRO-1 keeps it unsharded); a profile that frees gradients writes none."""
    from cost_model._training_dp import _gradient_buffer_zero_time

    assert framework_profile("megatron-core").zeroes_gradient_buffer_each_step
    assert not framework_profile("torchtitan").zeroes_gradient_buffer_each_step
    seconds = {}
    for framework in ("megatron-core", "torchtitan"):
        ctx = _dp64_context(framework)
        parameters = np.full((3, 1), 1e9)
        seconds[framework] = _gradient_buffer_zero_time(ctx, local_parameters=parameters)
        if framework == "megatron-core":
            expected = ctx.op(0.0, parameters * 4.0)
    np.testing.assert_allclose(seconds["megatron-core"], expected, rtol=1e-12)
    assert np.all(seconds["megatron-core"] > 0) and np.all(seconds["torchtitan"] == 0)


def test_megatron_core_last_gradient_bucket_is_exposed() -> None:
    """The bucket holding the embedding (at least max(40M, 1M x dp) parameters) has no compute
    to hide behind under Megatron-core; torchtitan's FSDP2 has no such bucket."""
    from cost_model._training_dp import _last_bucket_share

    shares = {}
    for framework in ("megatron-core", "torchtitan"):
        ctx = _dp64_context(framework)
        shares[framework] = _last_bucket_share(ctx)
        if framework == "megatron-core":
            dense = sum(ctx.parameters.values())
            embedding = ctx.parameters["embedding"]
    expected = np.maximum(np.maximum(64e6, embedding) / dense, 0.0)
    np.testing.assert_allclose(shares["megatron-core"], expected, rtol=1e-12)
    assert np.all((shares["megatron-core"] > 0) & (shares["megatron-core"] < 1))
    assert np.all(shares["torchtitan"] == 0)
    megatron = _columns("megatron-core", 1)
    assert megatron["time.dp_comm"][0] > 0.0
