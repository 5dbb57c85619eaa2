"""Prefill without expert parallelism runs the engine's fused MoE op at its measured latency."""

from __future__ import annotations

import numpy as np
import pytest

from autoparallel import get_model
from cost_model import (
    EstimateOptions,
    Inference,
    ParallelConfig,
    ServingConfig,
    _inference_setup,
    configs_to_table,
)
from cost_model import _inference_ops as ops
from cost_model._inference_compute import _fused_prefill_moe, _gemms, _moe_time
from cost_model._inference_kernels import _FUSED_MOE_KERNELS, _measured_kernels_per_pass
from cost_model._inference_setup import _memory_pass, _passes, _Setup, _tokens
from cost_model._kernel_curves_moe import grouped_experts_time_s
from topology import get_preset

DSV3 = get_model("deepseek-v3")
B200_NODE = get_preset("dgx-b200", num_nodes=1)


def _setup(plan: ParallelConfig, prompt_tokens: int) -> _Setup:
    workload = Inference(
        prompt_tokens=prompt_tokens,
        output_tokens=100,
        weight_dtype="fp8",
        serving_engine="sglang",
    )
    table = configs_to_table(
        [plan], **ServingConfig(phase="prefill", batch_size=1).columns(workload=workload)
    )
    return _inference_setup._setup(
        model=DSV3,
        cluster=B200_NODE,
        workload=workload,
        table=table,
        options=EstimateOptions(),
    )


@pytest.mark.parametrize("tokens", [1000, 8000])
def test_tp_moe_prefill_prices_the_fused_op_from_its_table(tokens: int) -> None:
    """A TP8 (etp 8, ep 1) DeepSeek-V3 prefill on B200 prices its routed experts as the measured
    fused MoE op at M = tokens x top_k / 256 per expert, and leaves out the combine passes that
    op holds; the router, shared experts and other token passes stay as they were."""
    s = _setup(ParallelConfig(tp=8, ep=1, etp=8), tokens)
    assert _fused_prefill_moe(s, decode=False)[0]
    assert not _fused_prefill_moe(s, decode=True)[0]
    moe = DSV3.moe
    assert moe is not None
    prefill, _ = _passes(s, np.ones(1))
    attention_tokens, rank_tokens = _tokens(s, prefill)
    assert attention_tokens[0] == tokens and rank_tokens[0] == tokens / 8  # etp 8 gathers them
    fused = grouped_experts_time_s(
        hardware=B200_NODE.device,
        dtype="fp8",
        tokens_per_expert=tokens * moe.top_k / moe.num_routed_experts,
        experts_per_device=float(moe.num_routed_experts),
        touched_fraction=ops.experts_touched_fraction(
            tokens, top_k=moe.top_k, num_experts=moe.num_routed_experts
        ),
        side_bytes_per_assignment=ops.routed_bytes_per_assignment(DSV3, act=2.0, cast=1.0, etp=8.0),
        hidden_size=DSV3.hidden_size,
        expert_ffn_size=moe.expert_ffn_hidden_size / 8,
    )
    assert fused is not None
    router = _gemms(  # the replicated gate runs on every token the rank holds
        s, attention_tokens, ops.router_projections(DSV3), np.ones(1), dtype="bf16"
    )
    shared = _gemms(
        s,
        attention_tokens,
        ops.ffn_projections(DSV3, moe.num_shared_experts * moe.shared_ffn_size),
        s.shard,
    )
    outside = _memory_pass(
        s,
        (
            ops.moe_token_bytes(DSV3, act=2.0, cast=1.0, shard=s.shard)
            - ops.moe_combine_bytes(DSV3, act=2.0)
        )
        * attention_tokens,
    )
    got = _moe_time(s, attention_tokens, rank_tokens, decode=False)
    assert got[0] == pytest.approx(float((router + shared + fused + outside)[0]), rel=1e-9)
    assert ops.moe_combine_bytes(DSV3, act=2.0) > 0


def test_expert_parallel_prefill_keeps_the_roofline() -> None:
    """With ep > 1 the prefill's experts run behind DeepEP, not the fused op: no table, and the
    fused op's kernels pay their floor as before."""
    s = _setup(ParallelConfig(tp=8, ep=8, etp=1), 4000)
    assert not _fused_prefill_moe(s, decode=False)[0]
    tp = _setup(ParallelConfig(tp=8, ep=1, etp=8), 4000)
    lay = tp.layout
    extra = np.max(_measured_kernels_per_pass(tp, decode=False)) - np.max(
        _measured_kernels_per_pass(s, decode=False)
    )
    assert extra == pytest.approx(float(np.max(lay.moe_layers)) * _FUSED_MOE_KERNELS)
