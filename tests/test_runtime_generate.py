"""Inference under a plan: greedy tokens equal the reference's; KV cache per rank as the cost model predicts."""

from __future__ import annotations

import copy

import pytest

from autoparallel.testing import run_ranks

PROMPT_TOKENS = 6
NEW_TOKENS = 32
SEQUENCES_PER_RANK = 2


def _predicted_kv_bytes_per_rank(spec, config, *, sequences: int, context_tokens: int) -> float:
    """The cost model's KV-cache bytes of one rank: layers x sequences x bytes per sequence-layer
    (fp32, unpaged), divided by the ranks that split one sequence's cache."""
    import numpy as np

    from cost_model import _inference_ops as ops

    shard = np.asarray([1.0 if config.attention_data_parallel else float(config.tp)])
    per_sequence_layer = ops.kv_bytes_per_sequence_layer(spec, context_tokens, 4.0, 1)
    return float(
        spec.num_layers * sequences * per_sequence_layer / ops.kv_head_split(spec, shard)[0]
    )


def _generate_rank(rank: int, world_size: int, config_fields: dict, spec_fields: dict) -> dict:
    import torch

    from autoparallel.runtime import (
        ReferenceMoETransformer,
        apply_plan,
        greedy_generate,
        tiny_reference_spec,
    )
    from autoparallel.testing import plan_for_config
    from cost_model import Inference, ParallelConfig

    spec = tiny_reference_spec(**{"num_layers": 2, **spec_fields})  # one dense + one MoE layer
    config = ParallelConfig(**config_fields)
    workload = Inference(
        prompt_tokens=PROMPT_TOKENS, output_tokens=NEW_TOKENS, concurrency=SEQUENCES_PER_RANK
    )
    plan = plan_for_config(spec, config, workload=workload)
    reference = ReferenceMoETransformer(spec)
    reference.init_weights(seed=0, std=0.1)
    model = copy.deepcopy(reference)
    applied = apply_plan(model, plan)
    # Attention-DP ranks serve different requests; tensor-parallel ranks serve the same ones.
    request_rank = rank if config.attention_data_parallel else 0
    generator = torch.Generator().manual_seed(100 + request_rank)
    prompts = torch.randint(
        0, spec.vocab_size, (SEQUENCES_PER_RANK, PROMPT_TOKENS), generator=generator
    )
    expected = greedy_generate(reference, prompts, max_new_tokens=NEW_TOKENS)
    got = greedy_generate(applied.module, prompts, max_new_tokens=NEW_TOKENS)
    predicted = _predicted_kv_bytes_per_rank(
        spec, config, sequences=SEQUENCES_PER_RANK, context_tokens=PROMPT_TOKENS + NEW_TOKENS - 1
    )
    return {
        "tokens": got.tokens.tolist(),
        "expected": expected.tokens.tolist(),
        "kv_bytes": got.cache.num_bytes(),
        "reference_kv_bytes": expected.cache.num_bytes(),
        "predicted_kv_bytes": predicted,
    }


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("config_fields", "spec_fields"),
    [
        pytest.param({"tp": 2}, {}, id="mla-tp2"),
        pytest.param({"tp": 2}, {"attention": "gqa"}, id="gqa-tp2"),
        pytest.param({"tp": 2}, {"attention": "gqa", "num_kv_heads": 1}, id="gqa-one-kv-head-tp2"),
        pytest.param(
            {"tp": 2, "ep": 2, "attention_data_parallel": True}, {}, id="mla-attention_dp2-ep2"
        ),
    ],
)
def test_greedy_generation_equals_reference(config_fields, spec_fields):
    results = run_ranks(_generate_rank, 2, args=(config_fields, spec_fields), timeout_s=120)
    for rank, result in enumerate(results):
        assert len(result["tokens"][0]) == NEW_TOKENS
        assert result["tokens"] == result["expected"], (
            f"rank {rank} generated other tokens than the reference"
        )
        assert result["kv_bytes"] == pytest.approx(result["predicted_kv_bytes"], rel=1e-9)
    if "attention_data_parallel" in config_fields:
        assert results[0]["tokens"] != results[1]["tokens"]  # each rank served its own requests
    if spec_fields.get("attention") == "gqa" and spec_fields.get("num_kv_heads", 2) == 2:
        assert (
            results[0]["kv_bytes"] * 2 == results[0]["reference_kv_bytes"]
        )  # K/V heads split over tp
    else:
        assert (
            results[0]["kv_bytes"] == results[0]["reference_kv_bytes"]
        )  # MLA's latent is not split


def test_cache_matches_model_spec_formula():
    """Whole model, one process: the cache holds ModelSpec.kv_cache_bytes per sequence (fp32)."""
    import torch

    from autoparallel.runtime import ReferenceMoETransformer, greedy_generate, tiny_reference_spec

    for attention in ("mla", "gqa"):
        spec = tiny_reference_spec(attention=attention)
        model = ReferenceMoETransformer(spec)
        model.init_weights(seed=0)
        prompts = torch.randint(0, spec.vocab_size, (3, 5))
        generation = greedy_generate(model, prompts, max_new_tokens=4)
        assert generation.tokens.shape == (3, 4)
        assert generation.cache.num_bytes() == 3 * spec.kv_cache_bytes(8, "fp32")
        incremental = generation.tokens
        # The same tokens from full recomputation without a cache.
        sequence = prompts
        for _ in range(4):
            next_token = model(sequence)[:, -1].argmax(-1, keepdim=True)
            sequence = torch.cat([sequence, next_token], dim=1)
        assert torch.equal(sequence[:, 5:], incremental)
