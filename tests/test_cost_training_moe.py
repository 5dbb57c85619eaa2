"""Training MoE block: grouped-GEMM shape, measured curves where measured, dispatcher passes."""

from __future__ import annotations

import numpy as np
import pytest

from autoparallel import get_model
from cost_model import EstimateOptions, ParallelConfig, Training, configs_to_table
from cost_model import _training_moe as moe_block
from cost_model._kernel_curves_moe import TOKENS_PER_EXPERT_GRID, grouped_experts_time_s
from cost_model._training_context import training_context
from topology import get_preset

#: Qwen3-30B-A3B (the catalog's Qwen/Qwen3-30B-A3B config.json): 128 experts, top-8, expert FFN 768.
QWEN3_30B = get_model("qwen3-30b-a3b")


def _context(*, preset: str, sequence: int, ep: int = 8, precision: str = "fp8", nodes: int = 1):
    workload = Training(
        sequence_length_tokens=sequence,
        global_batch_sequences=64,
        precision=precision,
        framework="megatron-core",
    )
    config = ParallelConfig(dp=8 * nodes, ep=ep, micro_batch_size=1)
    return training_context(
        model=QWEN3_30B,
        cluster=get_preset(preset, num_nodes=nodes),
        workload=workload,
        table=configs_to_table([config]),
        options=EstimateOptions(),
    )


def test_tokens_per_expert_is_tokens_times_top_k_over_local_share() -> None:
    ctx = _context(preset="dgx-b200", sequence=4096)
    # 4096 tokens x top-8 copies on each of 8 ranks, over 128 experts: 2048 per expert.
    assert moe_block.tokens_per_expert(ctx)[0] == pytest.approx(4096 * 8 * 8 / 128)


def test_measured_curve_prices_experts_within_its_range() -> None:
    ctx = _context(preset="dgx-h100", sequence=128)  # 64 tokens per expert
    assert moe_block.tokens_per_expert(ctx)[0] <= TOKENS_PER_EXPERT_GRID[-1]
    measured = moe_block.measured_experts_time(ctx)
    assert measured is not None
    curve = grouped_experts_time_s(
        hardware=ctx.cluster.device,
        dtype="fp8",
        tokens_per_expert=moe_block.tokens_per_expert(ctx),
        experts_per_device=16,
        touched_fraction=1.0,
        side_bytes_per_assignment=0.0,
        hidden_size=2048,
        expert_ffn_size=768,
    )
    assert curve is not None and measured[0] > curve[0]  # plus the fused kernel's side passes
    roofline = moe_block.roofline_experts_time(ctx, activation_passes=3.0)
    assert measured[0] != pytest.approx(roofline[0])
    block = moe_block.moe_ffn_time(ctx, activation_passes=3.0)
    assert block[0] > measured[0]


def test_beyond_the_measured_range_the_roofline_prices_the_experts() -> None:
    ctx = _context(preset="dgx-b200", sequence=4096)
    assert moe_block.tokens_per_expert(ctx)[0] > TOKENS_PER_EXPERT_GRID[-1]
    roofline = moe_block.roofline_experts_time(ctx, activation_passes=3.0)
    assignments = moe_block.routed_assignments(ctx)
    rest = moe_block.router_time(ctx) + ctx.op(
        0.0, assignments * moe_block.dispatcher_bytes_per_copy(ctx, expert_side=True)
    )
    block = moe_block.moe_ffn_time(ctx, activation_passes=3.0)
    np.testing.assert_allclose(block, roofline + rest, rtol=1e-12)


def test_a_device_without_a_curve_keeps_the_roofline() -> None:
    ctx = _context(preset="mi300x", sequence=128, precision="bf16")  # no MI300X operator curves
    assert moe_block.measured_experts_time(ctx) is None
    block = moe_block.moe_ffn_time(ctx, activation_passes=3.0)
    assert np.all(np.isfinite(block)) and block[0] > 0.0


def test_chunk_sorts_only_with_more_than_one_local_expert() -> None:
    h = QWEN3_30B.hidden_size
    many = _context(preset="dgx-b200", sequence=4096, ep=8)
    source = moe_block.dispatcher_bytes_per_copy(many, expert_side=False)[0]
    assert source == pytest.approx((3.0 + 1.0 / 8) * h * 2.0)  # permute r+w, unpermute r + w/k
    assert moe_block.dispatcher_bytes_per_copy(many, expert_side=True)[0] == pytest.approx(
        source + 4.0 * h * 2.0
    )
    one = _context(preset="dgx-b200", sequence=4096, ep=128, nodes=16)  # one expert per rank
    assert moe_block.dispatcher_bytes_per_copy(one, expert_side=True)[0] == pytest.approx(source)


def test_router_pass_grows_with_the_number_of_experts() -> None:
    ctx = _context(preset="dgx-b200", sequence=4096)
    scores = ctx.op(0.0, ctx.moe_tokens * 128 * moe_block.ROUTER_SCORE_BYTES)
    assert moe_block.router_time(ctx)[0] > scores[0] > 0.0


def test_expert_parallel_comm_overlap_hides_the_ep_all_to_all() -> None:
    """Megatron-core's EP overlap runs one micro-batch's all-to-alls beside another's compute:
    the step gets shorter where the device bounds it (micro-batch 2 here). At micro-batch 1 on
    an x86 host the merged micro-batch pairs are bound by the host issuing both (its MoE routing
    code's measured cost, ``HostOpCounts.moe_routing_op_host_s``): the all-to-alls still hide,
    the step does not shorten, as Megatron-Bridge's 26.02 DGX H100 Qwen3-30B run with the overlap
    (5,113 tokens/s/GPU) against 26.02.01's without it (9,058)."""
    from cost_model._estimate import estimate_table

    workload = Training(
        sequence_length_tokens=4096,
        global_batch_sequences=64,
        precision="bf16",
        framework="megatron-core",
    )

    def columns(overlap: bool, micro_batch: int) -> dict:
        table = configs_to_table([ParallelConfig(dp=8, ep=8, micro_batch_size=micro_batch)])
        options = EstimateOptions(expert_parallel_comm_overlap=overlap)
        return estimate_table(QWEN3_30B, get_preset("dgx-h100"), workload, table, options=options)

    for micro_batch in (1, 2):
        off, on = columns(False, micro_batch), columns(True, micro_batch)
        assert off["hidden.ep_comm"][0] == 0.0 and off["time.ep_comm"][0] > 0.0
        assert on["hidden.ep_comm"][0] > 0.0
        assert on["time.ep_comm"][0] < off["time.ep_comm"][0]
        if micro_batch == 2:
            assert on["step_time_s"][0] < off["step_time_s"][0]
        else:
            assert on["step_time_s"][0] >= off["step_time_s"][0]
