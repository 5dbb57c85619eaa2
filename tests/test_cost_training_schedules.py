"""Schedules and exchanges that hide or shrink communication: DeepEP dispatch (shared with the
inference path), fp8 dispatch, node-limited routing, a bidirectional pipeline, all-gather CP,
asynchronous pipeline sends and receives."""

from __future__ import annotations

import numpy as np
import pytest

from autoparallel import get_model
from cost_model import EstimateOptions, ParallelConfig, Training, estimate_table
from cost_model._kernel_curves_comm import deepep_normal_s, expert_all_to_all_bytes
from cost_model._options import Calibration
from cost_model._table import configs_to_table
from cost_model._training_comm import FP8_DISPATCH_BYTES, collective_times
from cost_model._training_context import training_context
from topology import get_preset

MODEL = get_model("deepseek-v3")
CLUSTER = get_preset("dgx-h100", num_nodes=32)
WORKLOAD = Training(sequence_length_tokens=4096, global_batch_sequences=512)
CONFIG = ParallelConfig(dp=32, pp=8, ep=32, recompute="none", pipeline_schedule="1f1b")


def _options(**changes) -> EstimateOptions:
    return EstimateOptions(calibration=Calibration(), **changes)


def _times(**changes):
    ctx = training_context(
        model=MODEL,
        cluster=CLUSTER,
        workload=WORKLOAD,
        table=configs_to_table([CONFIG]),
        options=_options(**changes),
    )
    return ctx, collective_times(ctx)


def test_deepep_dispatch_deduplicates_per_node_and_beats_the_all_to_all() -> None:
    _, plain = _times()
    _, deepep = _times(expert_dispatcher="deepep")
    assert deepep.ep_exchange[0] < plain.ep_exchange[0]


def test_hybridep_is_priced_as_deepep_s_deduplicated_dispatch() -> None:
    """HybridEP (the flex dispatcher's other backend) also sends each token once per
    destination and combines there; with no operator measurement of its own it is priced by
    DeepEP's normal-kernel fit, below the NCCL all-to-all of every routed copy."""
    _, plain = _times()
    _, deepep = _times(expert_dispatcher="deepep")
    _, hybridep = _times(expert_dispatcher="hybridep")
    np.testing.assert_allclose(hybridep.ep_exchange, deepep.ep_exchange)
    assert hybridep.ep_exchange[0] < plain.ep_exchange[0]


def test_training_and_inference_price_a_deepep_dispatch_with_one_formula() -> None:
    # the inference path's bytes, priced by the fit on DeepEP's measured normal kernels
    ctx, times = _times(expert_dispatcher="deepep")
    tokens = ctx.moe_tokens * ctx.options.routing_imbalance
    intra, inter = expert_all_to_all_bytes(
        rank_tokens=tokens,
        hidden_size=MODEL.hidden_size,
        element_bytes=2.0,
        copies=MODEL.moe.top_k,
        ep=32.0,
        local=ctx.local["ep"],
        node_dedup=True,
    )
    by_hand = sum(
        deepep_normal_s(
            direction=direction,
            intra_bytes=intra,
            inter_bytes=inter,
            nodes=32.0 / np.asarray(ctx.local["ep"], dtype=np.float64),
            cluster=CLUSTER,
        )
        for direction in ("dispatch", "combine")
    )
    assert times.ep_exchange[0] == pytest.approx(float(np.asarray(by_hand)[0]), rel=1e-12)


def test_fp8_dispatch_shrinks_only_the_forward_dispatch() -> None:
    _, bf16 = _times(expert_dispatcher="deepep")
    _, fp8 = _times(expert_dispatcher="deepep", expert_dispatch_fp8=True)
    assert fp8.ep_exchange[0] < bf16.ep_exchange[0]
    assert fp8.ep_exchange_backward[0] == pytest.approx(bf16.ep_exchange_backward[0])
    assert 1.0 < FP8_DISPATCH_BYTES < 2.0


def test_node_limited_routing_caps_the_remote_copies() -> None:
    _, free = _times(expert_dispatcher="deepep")
    _, limited = _times(expert_dispatcher="deepep", max_routed_nodes=1)
    assert limited.ep_exchange[0] < free.ep_exchange[0]


def _columns(**changes) -> dict[str, np.ndarray]:
    return estimate_table(
        MODEL, CLUSTER, WORKLOAD, configs_to_table([CONFIG]), options=_options(**changes)
    )


def test_a_bidirectional_pipeline_hides_the_expert_exchange_and_halves_the_bubble() -> None:
    one_f_one_b, dual = _columns(), _columns(bidirectional_pipeline=True)
    assert dual["hidden.ep_comm"][0] > 0.0 == one_f_one_b["hidden.ep_comm"][0]
    assert dual["time.ep_comm"][0] < one_f_one_b["time.ep_comm"][0]
    assert dual["time.bubble"][0] < 0.5 * one_f_one_b["time.bubble"][0]


def test_all_gather_context_parallel_is_exposed_and_ring_hides() -> None:
    model = get_model("llama-3.1-405b")
    cluster = get_preset("dgx-h100", num_nodes=64)
    workload = Training(sequence_length_tokens=131072, global_batch_sequences=16)
    config = configs_to_table(
        [ParallelConfig(dp=2, tp=8, pp=2, cp=16, sequence_parallel=True, recompute="full")]
    )
    ring = estimate_table(model, cluster, workload, config, options=_options())
    gather = estimate_table(
        model, cluster, workload, config, options=_options(context_parallel="all_gather")
    )
    assert gather["hidden.cp_comm"][0] == 0.0 < gather["time.cp_comm"][0]
    assert ring["hidden.cp_comm"][0] > 0.0


# ------------------------------------------------------------------ asynchronous pipeline p2p
DENSE = get_model("llama-3.1-405b")
DENSE_WORKLOAD = Training(sequence_length_tokens=8192, global_batch_sequences=256)


def _dense_columns(config: ParallelConfig, **changes) -> dict:
    cluster = get_preset("dgx-h100", num_nodes=config.world_size // 8)
    return estimate_table(
        DENSE, cluster, DENSE_WORKLOAD, configs_to_table([config]), options=_options(**changes)
    )


def test_asynchronous_pipeline_sends_hide_the_steady_state_and_keep_the_fill_and_drain() -> None:
    """With asynchronous send/recv (Llama 3 report sec. 3.3.2) the m*v transfers of each
    direction hide behind compute; the pp*v - 1 boundary crossings of the fill and the drain
    stay exposed, and the hidden traffic stretches the compute it runs beside."""
    config = ParallelConfig(
        dp=4, tp=8, pp=8, sequence_parallel=True, recompute="none", micro_batch_size=1,
        pipeline_schedule="interleaved_1f1b", virtual_stages=2,
    )  # fmt: skip
    blocking = _dense_columns(config)
    overlapped = _dense_columns(config, pipeline_p2p_overlap=True)
    m, v, pp = blocking["num_micro_batches"][0], 2, 8
    hidden = overlapped["hidden.pp_comm"][0]
    assert blocking["hidden.pp_comm"][0] == 0.0 and hidden > 0.0
    # One transfer's time, from the blocking total 2 (m v + pp v - 1) transfers.
    transfer = blocking["time.pp_comm"][0] / (2.0 * (m * v + pp * v - 1))
    assert hidden == pytest.approx(2.0 * m * v * transfer, rel=1e-9)
    assert overlapped["time.pp_comm"][0] == pytest.approx(2.0 * (pp * v - 1) * transfer, rel=1e-9)
    slowdown = overlapped["time.contention"][0] - blocking["time.contention"][0]
    assert 0.0 < slowdown < hidden
    saved = blocking["step_time_s"][0] - overlapped["step_time_s"][0]
    assert saved == pytest.approx(hidden - slowdown, rel=1e-9)


def test_asynchronous_pipeline_sends_change_nothing_without_a_pipeline() -> None:
    config = ParallelConfig(dp=8, tp=8, sequence_parallel=True, recompute="full", zero_stage=1)
    blocking = _dense_columns(config)
    overlapped = _dense_columns(config, pipeline_p2p_overlap=True)
    assert overlapped["time.pp_comm"][0] == blocking["time.pp_comm"][0] == 0.0
    assert overlapped["step_time_s"][0] == blocking["step_time_s"][0]
