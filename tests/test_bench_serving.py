"""SGLang bench_serving's random-dataset runs, replayed request by request."""

from __future__ import annotations

import numpy as np
import pytest

from cost_model._bench_serving import (
    RandomRun,
    RequestLengths,
    random_lengths,
    run_request_lengths,
)
from cost_model._serving_validation import (
    row_request_lengths,
    serving_validation_data,
    simulate_benchmark,
)

LLAMA_C64 = "sglang-cookbook:a100:llama-3.1-70b:tp8:c64:in8000:out1000"


def _row(row_id: str) -> dict:
    return next(r for r in serving_validation_data()["rows"] if r["id"] == row_id)


def test_the_seeded_draws_reproduce_the_published_token_totals() -> None:
    """The Llama-3.1 cookbook page's 'Total input tokens' / 'Total generated tokens'."""
    for (input_len, output_len, num_prompts), totals in {
        (8000, 1000, 320): (1273893, 170000),
        (8000, 1000, 80): (300020, 41669),
        (1000, 1000, 500): (249831, 252662),
    }.items():
        prompts, outputs = random_lengths(
            RandomRun(input_len=input_len, output_len=output_len, num_prompts=num_prompts)
        )
        assert (int(prompts.sum()), int(outputs.sum())) == totals


def test_a_run_finds_the_prompts_of_earlier_runs_on_its_server_cached() -> None:
    run = RandomRun(input_len=8000, output_len=1000, num_prompts=320)
    same = run_request_lengths(
        run, earlier_runs=[RandomRun(input_len=8000, output_len=1000, num_prompts=80)]
    )
    prompts = same.prompt_tokens
    # The 80 prompts of the earlier run are this run's first 80: all but the last token cached.
    assert np.array_equal(same.cached_prompt_tokens[:80], prompts[:80] - 1)
    assert not same.cached_prompt_tokens[80:].any()
    # A shorter-input run cached a prefix of the same repeated ShareGPT turn.
    shorter = RandomRun(input_len=1000, output_len=1000, num_prompts=500)
    partial = run_request_lengths(run, earlier_runs=[shorter])
    held = np.minimum(random_lengths(shorter)[0][:320], prompts - 1)
    assert np.array_equal(partial.cached_prompt_tokens[1:], held[1:])
    # The warm-up request caches prompt 0 even on a fresh server; without it nothing is cached.
    assert run_request_lengths(run).cached_prompt_tokens[0] == prompts[0] - 1
    assert not run_request_lengths(run, warmup_requests=0).cached_prompt_tokens.any()


def test_every_cookbook_row_replays_runs_of_its_published_mean_lengths() -> None:
    rows = [r for r in serving_validation_data()["rows"] if r["source"] == "sglang-cookbook"]
    assert rows and all("bench_serving_random" in r for r in rows)
    for row in rows:
        lengths = row_request_lengths(row)
        assert lengths is not None
        assert lengths.prompt_tokens.mean() == pytest.approx(row["prompt_tokens"], abs=0.5)
        assert lengths.output_tokens.mean() == pytest.approx(row["output_tokens"], abs=1.5)


def test_a_wave_of_cached_prompts_reaches_its_first_tokens_without_the_prefill_queue() -> None:
    """64 clients x ~4k-token prompts at t=0 queue ~20 s of prefill on 8 A100s; the cookbook's
    run found its first 80 prompts in the prefix cache (mean TTFT 633 ms, P99 1.9 s)."""
    row = _row(LLAMA_C64)
    cached = simulate_benchmark(row)
    fresh = {**row, "bench_serving_random": {**row["bench_serving_random"], "earlier_runs": []}}
    cold = simulate_benchmark(fresh)
    assert cached["ttft_ms"] < 0.25 * cold["ttft_ms"]
    assert cached["tpot_ms"] == pytest.approx(cold["tpot_ms"], rel=0.25)


def test_a_run_or_a_replay_that_cannot_exist_is_an_error() -> None:
    with pytest.raises(ValueError, match="num_prompts"):
        RandomRun(input_len=8000, output_len=1000, num_prompts=0)
    with pytest.raises(ValueError, match="range_ratio"):
        RandomRun(input_len=8000, output_len=1000, num_prompts=1, range_ratio=1.5)
    with pytest.raises(ValueError, match=">= 1 prompt token"):
        RequestLengths(
            prompt_tokens=np.array([4]),
            output_tokens=np.array([2]),
            cached_prompt_tokens=np.array([4]),
        )
