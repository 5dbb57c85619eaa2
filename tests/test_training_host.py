"""Host issue time of the expert segment behind a dropless dispatch (``_training_host``) and the
expert GEMM count it and the GPU side share (two ``GroupedLinear`` calls per local expert)."""

from __future__ import annotations

import numpy as np
import pytest

from cost_model import EstimateOptions, ParallelConfig, Training, configs_to_table
from cost_model import _training_moe as moe_block
from cost_model._estimate import estimate_table
from cost_model._frameworks import framework_profile
from cost_model._model_spec import ModelSpec
from cost_model._training import training_context
from cost_model._training_host import expert_segment_host_s, exposed_expert_host_s
from topology import get_preset


def _moe(*, layers: int = 4, experts: int = 128) -> ModelSpec:
    """A small fine-grained MoE: narrow experts, so a short micro-batch leaves the GPU little to
    do per expert while the host still issues one GEMM per local expert."""
    return ModelSpec.from_hf_config(
        {
            "model_type": "qwen3_moe",
            "num_hidden_layers": layers,
            "hidden_size": 1024,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "intermediate_size": 3072,
            "moe_intermediate_size": 256,
            "num_experts": experts,
            "num_experts_per_tok": 8,
            "vocab_size": 32000,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": False,
        },
        name="small-moe",
    )


def _workload(*, sequence: int = 256, batch: int = 64, framework: str | None = "megatron-core"):
    return Training(
        sequence_length_tokens=sequence,
        global_batch_sequences=batch,
        precision="bf16",
        framework=framework,
    )


def _step(model, workload, *, ep: int = 1, cuda_graphs: str = "none") -> float:
    config = ParallelConfig(dp=8, ep=ep, micro_batch_size=1)
    columns = estimate_table(
        model,
        get_preset("dgx-h100", num_nodes=1),
        workload,
        configs_to_table([config]),
        options=EstimateOptions(cuda_graphs=cuda_graphs),
    )
    return float(columns["step_time_s"][0])


def _context(model, workload, *, ep: int = 1, cuda_graphs: str = "none"):
    return training_context(
        model=model,
        cluster=get_preset("dgx-h100", num_nodes=1),
        workload=workload,
        table=configs_to_table([ParallelConfig(dp=8, ep=ep, micro_batch_size=1)]),
        options=EstimateOptions(cuda_graphs=cuda_graphs),
    )


def test_host_issue_time_is_two_grouped_linears_of_each_local_expert() -> None:
    model, workload = _moe(), _workload()
    per_gemm = framework_profile("megatron-core").expert_gemm_host_s
    assert per_gemm > 0
    for ep, local in ((1, 128), (8, 16)):
        host = expert_segment_host_s(_context(model, workload, ep=ep))
        assert host[0] == pytest.approx(2 * local * per_gemm)


def test_exposed_only_beyond_the_segment_gpu_time() -> None:
    ctx = _context(_moe(), _workload())
    host = expert_segment_host_s(ctx)[0]
    assert exposed_expert_host_s(ctx, segment_gpu_s=np.array([2 * host]))[0] == 0.0
    assert exposed_expert_host_s(ctx, segment_gpu_s=np.array([0.25 * host]))[0] == pytest.approx(
        0.75 * host
    )


def test_zero_with_a_full_iteration_cuda_graph_or_without_a_host_sync() -> None:
    model, workload = _moe(), _workload()
    idle = np.array([0.0])
    full = _context(model, workload, cuda_graphs="full_iteration")
    assert exposed_expert_host_s(full, segment_gpu_s=idle)[0] == 0.0
    partial = _context(model, workload, cuda_graphs="partial")  # the experts stay eager
    assert exposed_expert_host_s(partial, segment_gpu_s=idle)[0] > 0.0
    no_framework = _context(model, _workload(framework=None))
    assert exposed_expert_host_s(no_framework, segment_gpu_s=idle)[0] == 0.0
    torchtitan = _context(model, _workload(framework="torchtitan"))
    assert exposed_expert_host_s(torchtitan, segment_gpu_s=idle)[0] == 0.0


def test_host_bound_step_is_slower_eager_than_fully_graphed() -> None:
    model, workload = _moe(), _workload()
    eager, graphed = _step(model, workload), _step(model, workload, cuda_graphs="full_iteration")
    partial = _step(model, workload, cuda_graphs="partial")
    assert eager > graphed
    assert partial == pytest.approx(eager)  # per-layer graphs leave the expert segment eager


def test_exposed_host_time_grows_with_moe_layers_and_micro_batches() -> None:
    def exposed(layers: int, batch: int) -> float:
        model, workload = _moe(layers=layers), _workload(batch=batch)
        return _step(model, workload) - _step(model, workload, cuda_graphs="full_iteration")

    base = exposed(4, 64)
    assert base > 0.0
    # Twice the MoE layers or twice the micro-batches: twice the exposed host time (to the
    # data-parallel traffic the longer compute hides).
    assert exposed(8, 64) == pytest.approx(2.0 * base, rel=1e-2)
    assert exposed(4, 128) == pytest.approx(2.0 * base, rel=1e-2)


def test_expert_gemm_calls_are_two_per_local_expert() -> None:
    """fc1 and fc2 are separate GroupedLinear calls, each one GEMM per local expert: in fp8 the
    experts pay the fp8 kernels' fixed cost per call twice per local expert."""
    model = _moe()
    workload = Training(
        sequence_length_tokens=256,
        global_batch_sequences=64,
        precision="fp8",
        framework="megatron-core",
    )
    ctx = _context(model, workload, ep=1)
    experts = moe_block.roofline_experts_time(ctx, activation_passes=0.0)[0]
    fewer = ctx.op(
        2.0 * moe_block.routed_assignments(ctx) * model.ffn_parameters(256),
        128 * model.ffn_parameters(256) * 2.0
        + moe_block.routed_assignments(ctx) * 2.0 * (1024 + 256) * 2.0,
        calls=128.0,
        role="expert",
    )[0]
    assert experts > fewer  # 256 calls pay twice the per-call cost of 128
