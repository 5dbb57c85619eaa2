"""Megatron-core's EP all-to-all overlap: merged layer pairs, unpaired micro-batches, inert where off."""

from __future__ import annotations

import numpy as np
import pytest

from autoparallel import get_model
from cost_model import EstimateOptions, ParallelConfig, Training, configs_to_table
from cost_model._estimate import estimate_table
from cost_model._training_context import training_context
from cost_model._training_ep_overlap import merged_host_wait, pair_seconds, paired_share
from topology import get_preset

#: Qwen3-30B-A3B (the catalog's Qwen/Qwen3-30B-A3B config.json): 128 experts, top-8, expert FFN 768.
QWEN3_30B = get_model("qwen3-30b-a3b")


def _workload(global_batch: int = 64) -> Training:
    return Training(
        sequence_length_tokens=4096,
        global_batch_sequences=global_batch,
        precision="bf16",
        framework="megatron-core",
    )


def _estimate(config: ParallelConfig, *, overlap: bool, nodes: int = 1, global_batch: int = 64):
    cluster = get_preset("dgx-h100").with_nodes(nodes)
    options = EstimateOptions(expert_parallel_comm_overlap=overlap)
    table = configs_to_table([config])
    return estimate_table(QWEN3_30B, cluster, _workload(global_batch), table, options=options)


#: EP 32 over four DGX-H100 nodes: the all-to-all crosses InfiniBand and outlasts the compute.
INTER_NODE = ParallelConfig(dp=32, ep=32, micro_batch_size=1)


def test_a_merged_pair_takes_at_least_its_compute_and_its_communication() -> None:
    rng = np.random.default_rng(0)
    parts = {
        name: rng.uniform(0.0, 2.0, 1000)
        for name in (
            "attention_forward",
            "experts_forward",
            "dispatch_forward",
            "dispatch_backward",
        )
    }
    time, compute, comm = pair_seconds(**parts)
    assert np.all(time >= np.maximum(compute, comm) - 1e-12)
    assert np.all(time <= compute + comm + 1e-12)
    tiny = pair_seconds(
        attention_forward=np.array([1.0]),
        experts_forward=np.array([1.0]),
        dispatch_forward=np.array([1e-6]),
        dispatch_backward=np.array([1e-6]),
    )
    assert tiny[0][0] == pytest.approx(tiny[1][0], rel=1e-5)  # a short exchange hides entirely


def test_the_overlap_lowers_the_exposed_all_to_all_but_not_below_the_compute_bound() -> None:
    off, on = (
        _estimate(INTER_NODE, overlap=False, nodes=4),
        _estimate(INTER_NODE, overlap=True, nodes=4),
    )
    assert off["hidden.ep_comm"][0] == 0.0
    assert 0.0 < on["time.ep_comm"][0] < off["time.ep_comm"][0]
    assert on["step_time_s"][0] < off["step_time_s"][0]
    # Hidden traffic never exceeds the compute it hides behind, and whatever compute could hide
    # the rest stays exposed: the step is at least max(compute, all-to-all) per micro-batch.
    compute = on["time.compute"][0] + on["time.recompute"][0]
    assert on["hidden.ep_comm"][0] <= compute
    assert on["time.ep_comm"][0] >= off["time.ep_comm"][0] - compute
    assert on["step_time_s"][0] >= max(compute, off["time.ep_comm"][0])


def test_the_overlap_is_inert_when_off_or_where_megatron_core_refuses_it() -> None:
    default = _estimate(INTER_NODE, overlap=False, nodes=4)
    plain = estimate_table(
        QWEN3_30B,
        get_preset("dgx-h100").with_nodes(4),
        _workload(),
        configs_to_table([INTER_NODE]),
        options=EstimateOptions(),
    )
    assert default["step_time_s"][0] == plain["step_time_s"][0]
    refused = (
        ParallelConfig(dp=4, pp=2, ep=4, micro_batch_size=1),  # pp > 1 without virtual stages
        ParallelConfig(dp=8, ep=8, micro_batch_size=1, recompute="full"),
        ParallelConfig(dp=8, ep=1, micro_batch_size=1),
    )
    for config in refused:
        off, on = _estimate(config, overlap=False), _estimate(config, overlap=True)
        assert on["step_time_s"][0] == off["step_time_s"][0], config
        assert on["hidden.ep_comm"][0] == off["hidden.ep_comm"][0]


def test_only_the_warm_up_and_cool_down_micro_batches_stay_unpaired() -> None:
    cluster = get_preset("dgx-h100").with_nodes(2)
    options = EstimateOptions(expert_parallel_comm_overlap=True)
    flat = ParallelConfig(dp=16, ep=8, micro_batch_size=1)  # m = 64 / 16 = 4
    interleaved = ParallelConfig(
        dp=4, pp=4, ep=4, virtual_stages=2, micro_batch_size=1, pipeline_schedule="interleaved_1f1b"
    )  # m = 16 per replica, 32 chunk micro-batches
    two_stages = ParallelConfig(
        dp=8, pp=2, ep=8, virtual_stages=2, micro_batch_size=1, pipeline_schedule="interleaved_1f1b"
    )  # m = 8 per replica, 16 chunk micro-batches; the middle row is the first rank
    shares = [
        paired_share(
            training_context(
                model=QWEN3_30B,
                cluster=cluster,
                workload=_workload(),
                table=configs_to_table([config]),
                options=options,
            )
        )[:, 0]
        for config in (flat, interleaved, two_stages)
    ]
    assert shares[0] == pytest.approx([0.75, 0.75, 0.75])  # the first forward, the last backward
    # Warm-up (pp - rank - 1) * 2 + (v - 1) * pp + 1 for ranks 0, pp // 2, pp - 1.
    assert shares[1] == pytest.approx([(32 - 11) / 32, (32 - 7) / 32, (32 - 5) / 32])
    assert shares[2] == pytest.approx([(16 - 5) / 16, (16 - 5) / 16, (16 - 3) / 16])


def test_merged_pairs_wait_for_the_host_only_where_it_outlasts_the_gpu() -> None:
    ctx = training_context(
        model=QWEN3_30B,
        cluster=get_preset("dgx-h100"),
        workload=_workload(),
        table=configs_to_table([ParallelConfig(dp=8, ep=8, micro_batch_size=1)]),
        options=EstimateOptions(expert_parallel_comm_overlap=True),
    )
    kwargs = {"attention_forward": np.array([1e-6]), "experts_forward": np.array([1e-6])}
    short = merged_host_wait(ctx, **kwargs, pair_time=np.array([5e-6]))
    long = merged_host_wait(ctx, **kwargs, pair_time=np.array([1.0]))
    assert short[0] > 0.0 and long[0] == 0.0
