"""Cached greedy generation against an independent reference: no cache at all.

The reference recomputes a full forward over prompt + tokens so far for every new token and
takes the argmax of the last position. It shares the layers' weights with the cached path but
none of the cache logic (offsets, RoPE positions of new tokens, the causal mask against cached
keys, the buffers). 32 new tokens per prompt, MLA and GQA, whole model and under tp / attention
data parallel on gloo ranks. A negative control shifts the cache position by one token in-test:
the same comparison must then fail.
"""

from __future__ import annotations

import pytest

PROMPT_TOKENS = 6
NEW_TOKENS = 32
BATCH = 2
LOGIT_ATOL = 1e-4


class _Recorder:
    """Calls the model, keeping the last position's logits of every call (the cached path)."""

    def __init__(self, module, *, shift_cache_at_first_decode: bool = False) -> None:
        self.module, self.shift = module, shift_cache_at_first_decode
        self.last_logits = []

    def __call__(self, tokens, cache):
        if self.shift and cache.length > 0:
            cache.length -= 1  # the negative control: one token's position lost
            self.shift = False
        logits = self.module(tokens, cache)
        self.last_logits.append(logits[:, -1].detach().clone())
        return logits


def _uncached_reference(model, prompts, *, new_tokens: int):
    """Greedy tokens (batch, new_tokens) and each step's last-position logits, no cache."""
    import torch

    sequence, logits_per_step = prompts, []
    with torch.no_grad():
        for _ in range(new_tokens):
            last = model(sequence)[:, -1]
            logits_per_step.append(last)
            sequence = torch.cat([sequence, last.argmax(dim=-1, keepdim=True)], dim=1)
    return sequence[:, prompts.shape[1] :], logits_per_step


def _teacher_forced_logits(model, prompts, tokens):
    """Logits, no cache, at each position where the cached path predicted ``tokens``."""
    import torch

    with torch.no_grad():
        full = model(torch.cat([prompts, tokens[:, :-1]], dim=1))
    return [full[:, prompts.shape[1] - 1 + step] for step in range(tokens.shape[1])]


def _model(attention: str):
    from autoparallel.runtime import ReferenceMoETransformer, tiny_reference_spec

    spec = tiny_reference_spec(attention=attention)
    model = ReferenceMoETransformer(spec)
    model.init_weights(seed=0, std=0.2)  # std 0.2: varied streams (16+ distinct tokens of 32)
    return model


def _prompts(vocab_size: int, seed: int):
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (BATCH, PROMPT_TOKENS), generator=generator)


def _worst_logit_error(cached, reference) -> float:
    return max(float((a - b).abs().max()) for a, b in zip(cached, reference))


@pytest.mark.parametrize("attention", ["mla", "gqa"])
def test_cached_generation_equals_recomputation_without_cache(attention: str) -> None:
    from autoparallel.runtime import greedy_generate

    model = _model(attention)
    prompts = _prompts(model.spec.vocab_size, seed=11)
    recorder = _Recorder(model)
    generated = greedy_generate(recorder, prompts, max_new_tokens=NEW_TOKENS).tokens
    expected, reference_logits = _uncached_reference(model, prompts, new_tokens=NEW_TOKENS)
    assert generated.shape == (BATCH, NEW_TOKENS)
    assert all(len(set(row)) >= 16 for row in generated.tolist())  # not a repeating stream
    assert generated.tolist() == expected.tolist()
    assert _worst_logit_error(recorder.last_logits, reference_logits) <= LOGIT_ATOL


@pytest.mark.parametrize("attention", ["mla", "gqa"])
def test_negative_control_a_cache_off_by_one_fails_the_comparison(
    attention: str,
) -> None:
    """Lose one cached position at the first decode step: the new token overwrites the last
    prompt token's keys and every later RoPE position is one short."""
    from autoparallel.runtime import greedy_generate

    model = _model(attention)
    prompts = _prompts(model.spec.vocab_size, seed=11)
    recorder = _Recorder(model, shift_cache_at_first_decode=True)
    generated = greedy_generate(recorder, prompts, max_new_tokens=NEW_TOKENS).tokens
    # Logits checked with teacher forcing on the tokens the broken cache produced: the very
    # next step already disagrees with the full forward.
    reference_logits = _teacher_forced_logits(model, prompts, generated)
    assert _worst_logit_error(recorder.last_logits[1:], reference_logits[1:]) > 100 * LOGIT_ATOL
    expected, _ = _uncached_reference(model, prompts, new_tokens=NEW_TOKENS)
    assert generated.tolist() != expected.tolist()


# --------------------------------------------------------------------------- sharded, gloo ranks
def _sharded_rank(rank: int, world_size: int, config_fields: dict, attention: str, model) -> dict:
    import copy

    import torch

    from autoparallel.runtime import apply_plan, greedy_generate
    from autoparallel.testing import plan_for_config
    from cost_model import Inference, ParallelConfig

    torch.set_num_threads(1)
    config = ParallelConfig(**config_fields)
    workload = Inference(prompt_tokens=PROMPT_TOKENS, output_tokens=NEW_TOKENS, concurrency=BATCH)
    plan = plan_for_config(model.spec, config, workload=workload)
    applied = apply_plan(copy.deepcopy(model), plan)
    # Attention-DP ranks serve their own requests; tensor-parallel ranks serve the same ones.
    seed = 20 + (rank if config.attention_data_parallel else 0)
    prompts = _prompts(model.spec.vocab_size, seed=seed)
    return {
        "prompts": prompts,
        "tokens": greedy_generate(applied.module, prompts, max_new_tokens=NEW_TOKENS).tokens,
    }


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("config_fields", "attention"),
    [
        pytest.param({"tp": 2}, "gqa", id="gqa-tp2"),
        pytest.param(
            {"tp": 2, "ep": 2, "attention_data_parallel": True},
            "mla",
            id="mla-attention_dp2-ep2",
        ),
    ],
)
def test_sharded_cached_generation_equals_whole_model_recomputation(
    config_fields: dict, attention: str
) -> None:
    from autoparallel.testing import run_ranks

    model = _model(attention)
    results = run_ranks(_sharded_rank, 2, args=(config_fields, attention, model), timeout_s=120)
    for rank, result in enumerate(results):
        expected, _ = _uncached_reference(model, result["prompts"], new_tokens=NEW_TOKENS)
        assert result["tokens"].shape == (BATCH, NEW_TOKENS)
        assert result["tokens"].tolist() == expected.tolist(), f"rank {rank}"
    if config_fields.get("attention_data_parallel"):
        assert results[0]["prompts"].tolist() != results[1]["prompts"].tolist()
