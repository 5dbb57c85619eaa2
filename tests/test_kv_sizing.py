"""Each engine sizes its KV pool by its own rule (``_inference_load._engine_admits``): vLLM and
TensorRT-LLM after a profiling forward pass of their token budget, whose peak activations the
pool loses; SGLang by its static fraction alone."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autoparallel import get_model
from cost_model import Inference, ModelSpec, ParallelConfig
from cost_model import _inference_ops as ops
from cost_model._inference_load import serving_inputs, sizing_pass_bytes
from cost_model._inference_memory import _memory_parts
from cost_model._inference_setup import _setup
from cost_model._options import EstimateOptions
from cost_model._serving_columns import ServingConfig
from cost_model._serving_profile import serving_profile
from cost_model._table import configs_to_table
from topology import get_preset

DSV3 = get_model("deepseek-v3")
H200 = get_preset("dgx-h200", num_nodes=1)
CAPACITY = H200.memory_per_device_bytes
#: DeepSeek-R1's launch on dstack's H200 node: tp 8, experts tensor-parallel (no ep).
CONFIG = ParallelConfig(tp=8, ep=1, etp=8)


def _workload(engine: str, budget: int | None, version: str | None = None) -> Inference:
    return Inference(
        prompt_tokens=3200,
        output_tokens=800,
        weight_dtype="fp8",
        serving_engine=engine,
        serving_engine_version=version,
        max_batched_tokens=budget,
    )


def _table(workload: Inference):
    return configs_to_table([CONFIG], **ServingConfig().columns(workload=workload))


def _setup_for(workload: Inference):
    return _setup(
        model=DSV3,
        cluster=H200,
        workload=workload,
        table=_table(workload),
        options=EstimateOptions(),
    )


def _admitted(workload: Inference) -> float:
    _, policy, _ = serving_inputs(
        model=DSV3, cluster=H200, workload=workload, table=_table(workload)
    )
    return float(np.asarray(policy.max_running)[0])


def _pool_and_weights(workload: Inference) -> tuple[float, float, float]:
    """(sizing pass bytes, weights bytes, fraction) of the row's engine."""
    s = _setup_for(workload)
    weights = float(_memory_parts(s, np.ones(1))["weights"][0])
    fraction = float(s.profile.memory_fraction(s.column("tp"))[0])
    return float(sizing_pass_bytes(s)[0]), weights, fraction


def test_a_larger_vllm_token_budget_leaves_fewer_kv_blocks() -> None:
    """vLLM profiles a forward of ``max_num_batched_tokens`` before it sizes its cache: V0
    without chunked prefill profiles DeepSeek-R1's whole 163,840-token context, which takes
    tens of GB of the pool and admits about half the requests a 2,048-token budget does; the
    pool is ``gpu_memory_utilization`` x memory less the weights and exactly that peak."""
    version = "0.7.4.dev181+gf35f8e22"
    small, large = _workload("vllm", 2048, version), _workload("vllm", 163840, version)
    (small_pass, weights, fraction), (large_pass, _, _) = (
        _pool_and_weights(small),
        _pool_and_weights(large),
    )
    assert 10e9 < large_pass - small_pass < 40e9
    small_pool = fraction * CAPACITY - weights - small_pass
    large_pool = fraction * CAPACITY - weights - large_pass
    admitted_small, admitted_large = _admitted(small), _admitted(large)
    assert admitted_large < 0.7 * admitted_small
    # the count follows the pool: per request KV is the same at either budget
    assert admitted_small / admitted_large == pytest.approx(small_pool / large_pool, rel=0.03)


def test_vllm_v0_fused_moe_chunk_bounds_the_profiling_pass() -> None:
    """vLLM 0.7.x runs its fused MoE over chunks of 32,768 tokens, so beyond the chunk the
    profiling pass grows only by its per-token dense activations; without the chunk the MoE
    intermediate buffers of every token would be held at once."""
    s = _setup_for(_workload("vllm", 163840, "0.7.4.dev181+gf35f8e22"))
    assert s.profile.moe_chunk_tokens == 32768
    unchunked = dataclasses.replace(
        s, profile=s.profile.model_copy(update={"moe_chunk_tokens": None})
    )
    chunked, whole = float(sizing_pass_bytes(s)[0]), float(sizing_pass_bytes(unchunked)[0])
    assert DSV3.moe is not None
    # the MoE buffers of (163,840 - 32,768) tokens x top-k copies of (hidden + 3 x ffn / tp)
    freed = (163840 - 32768) * DSV3.moe.top_k * (DSV3.hidden_size + 3 * 2048 / 8) * 2.0
    assert whole - chunked == pytest.approx(freed, rel=1e-6)


def test_sglang_sizes_its_pool_by_the_static_fraction_alone() -> None:
    """SGLang profiles no pass: ``mem_fraction_static`` x memory less the weights is its pool.
    Up to 0.4.7 the fraction is a constant of the tp size on an 80 GB device (here 0.4.3, the
    dstack H200 runs' release: whatever its chunked-prefill size); from 0.4.8 it is what the
    engine reserves for activations and graphs, 1.5 MiB per chunked-prefill token from 0.5.3
    (``server_args.py`` ``_handle_gpu_memory_settings``), so a larger budget shrinks the pool."""
    small, large = _workload("sglang", 2048, "0.4.3"), _workload("sglang", 32768, "0.4.3")
    (small_pass, weights, fraction), (large_pass, _, _) = (
        _pool_and_weights(small),
        _pool_and_weights(large),
    )
    assert small_pass == large_pass == 0.0
    assert _admitted(small) == _admitted(large)
    pool = fraction * CAPACITY - weights
    tokens = np.ceil((3200 + 0.098 * 800) / small.kv_block_tokens) * small.kv_block_tokens
    per_request = DSV3.num_layers * 576 * 2.0 * tokens  # the MLA latent on every tp rank
    assert _admitted(small) == pytest.approx(pool // per_request, abs=1)
    # Current releases: reserved = 512 + 1.5 x max(budget, 2048) + 2 x 512 (graph batch at tp 8
    # on a device under 160 GiB) + 8 / 8 x 1024 MiB, at least 10 GiB.
    mib = CAPACITY / 2**20
    for budget in (2048, 32768):
        current = _workload("sglang", budget)
        reserved = max(512 + 1.5 * budget + 2 * 512 + 1024, 10 * 1024)
        pool = round((mib - reserved) / mib, 3) * CAPACITY - weights
        assert _admitted(current) == pytest.approx(pool // per_request, abs=1)
    assert _admitted(_workload("sglang", 32768)) < _admitted(_workload("sglang", 2048))


def test_tensorrt_llm_takes_its_fraction_of_what_the_profiling_pass_leaves() -> None:
    """TensorRT-LLM's pool is ``free_gpu_memory_fraction`` x (memory - weights - the peak of a
    warm-up of ``max_num_tokens`` tokens): a larger budget costs the pool 0.9 of its extra
    activations, where vLLM loses all of them."""
    small, large = _workload("trtllm", 4096), _workload("trtllm", 32768)
    (small_pass, weights, fraction), (large_pass, _, _) = (
        _pool_and_weights(small),
        _pool_and_weights(large),
    )
    assert fraction == 0.9 and large_pass > small_pass > 0.0
    small_pool = fraction * (CAPACITY - weights - small_pass)
    large_pool = fraction * (CAPACITY - weights - large_pass)
    assert small_pool - large_pool == pytest.approx(0.9 * (large_pass - small_pass))
    admitted_small, admitted_large = _admitted(small), _admitted(large)
    assert admitted_large < admitted_small
    assert admitted_small / admitted_large == pytest.approx(small_pool / large_pool, rel=0.03)


def test_sglang_default_fraction_follows_its_tensor_parallel_size() -> None:
    """SGLang's ``mem_fraction_static`` default shrinks as tp grows (more ranks, more
    communicator memory outside the static pool); vLLM's ``gpu_memory_utilization`` does not."""
    tp = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 32.0])
    sglang = serving_profile("sglang").memory_fraction(tp)
    assert list(sglang) == [0.88, 0.87, 0.85, 0.81, 0.79, 0.79]
    assert list(serving_profile("vllm").memory_fraction(tp)) == [0.9] * tp.size


def _admitted_by(model: ModelSpec, workload: Inference) -> float:
    table = configs_to_table([CONFIG], **ServingConfig().columns(workload=workload))
    _, policy, _ = serving_inputs(model=model, cluster=H200, workload=workload, table=table)
    return float(np.asarray(policy.max_running)[0])


def test_window_layers_cost_what_each_engine_pools_for_them() -> None:
    """vLLM frees the blocks that leave a sliding window; SGLang keeps one pool of full-length
    layers, but for the model classes it gives a second, smaller pool of window layers
    (``swa_full_tokens_ratio`` 0.8: Llama 4) and not for gpt-oss, whose hybrid pool it turns
    off. The admitted count follows each rule's KV per request."""
    gpt_oss, scout = get_model("gpt-oss-120b"), get_model("llama-4-scout")
    sglang, vllm = serving_profile("sglang"), serving_profile("vllm")
    assert gpt_oss.architecture == "GptOssForCausalLM"
    assert scout.architecture == "Llama4ForConditionalGeneration"
    assert sglang.window_kv_ratio(gpt_oss.architecture) == 1.0
    assert sglang.window_kv_ratio(None) == 1.0
    assert sglang.window_kv_ratio(scout.architecture) == 0.8
    assert vllm.window_kv_ratio(gpt_oss.architecture) is None

    context = np.array([32768.0])
    kept = ops.kv_bytes_per_sequence_layer(gpt_oss, context, 2.0, 1, window_ratio=1.0)
    windowed = ops.kv_bytes_per_sequence_layer(gpt_oss, context, 2.0, 1)
    # half of gpt-oss's layers attend over a 128-token window
    assert float(windowed[0] / kept[0]) == pytest.approx((32768 + 128) / (2 * 32768))

    workload = _workload("sglang", None).model_copy(update={"weight_dtype": "bf16"})
    unpooled = scout.model_copy(update={"architecture": None})
    admitted, admitted_unpooled = _admitted_by(scout, workload), _admitted_by(unpooled, workload)
    # a quarter of Scout's layers are full; the chunked ones cost 0.8 of a token each
    assert admitted / admitted_unpooled == pytest.approx(1.0 / (0.25 + 0.75 * 0.8), rel=0.01)
