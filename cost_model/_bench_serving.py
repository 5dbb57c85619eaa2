"""The requests of an SGLang ``bench_serving`` random-dataset run, as its code builds them.

``python -m sglang.bench_serving --dataset-name random`` (SGLang 0.5.x,
``python/sglang/bench_serving.py``) seeds both generators with ``--seed`` (default 1) in
``run_benchmark`` (``random.seed(args.seed); np.random.seed(args.seed)``), then
``sample_random_requests`` draws the input lengths and then the output lengths with
``np.random.randint(max(int(L * range_ratio), 1), L + 1, size=num_prompts)``
(``compute_random_lens``; ``--random-range-ratio`` defaults to 0), and builds prompt ``i`` from
the ``i``-th ShareGPT conversation of one ``random.shuffle`` of the file: its first turn's token
ids repeated and cut to ``input_lens[i]`` (``(prompt_token_ids * ratio)[: input_lens[i]]``).
NumPy's legacy ``RandomState`` stream is frozen, so the lengths are reproducible; the first
``k`` draws do not depend on ``num_prompts``.

Two consequences for a sequence of runs on one server:

* Prompt ``i`` of a run is a prefix of the same repeated ShareGPT turn in every run with the
  default seed, so it shares ``min(len_run[i], len_earlier[i])`` leading tokens with prompt ``i``
  of each earlier run (same input length: the whole prompt). SGLang's radix cache (on by
  default; ``bench_serving`` flushes it only with ``--flush-cache`` or in SGLang's CI) keeps
  those tokens, and the scheduler computes only the rest of the prompt, at least one token.
* ``benchmark`` first sends ``--warmup-requests`` (default 1) copies of ``input_requests[0]``
  (output cut to 32 tokens) and waits for them: the run's first prompt is cached when the
  measured requests start.

The TTFT clock (``async_request_sglang_generate``) starts once the request holds a
``--max-concurrency`` slot and stops at the first streamed chunk with non-empty ``text``, which
the server sends only after the prompt's last prefill chunk has produced its first token
(``scheduler_output_processor_mixin.process_batch_result_prefill`` appends an output token only
once ``req.is_chunked <= 0``): a cached prompt's TTFT is the one-token extend and its queueing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: ``bench_serving``'s ``--seed`` default.
DEFAULT_SEED = 1
#: ``bench_serving``'s ``--warmup-requests`` default.
DEFAULT_WARMUP_REQUESTS = 1


@dataclass(frozen=True)
class RandomRun:
    """One ``bench_serving --dataset-name random`` run: its length arguments and prompt count."""

    input_len: int
    output_len: int
    num_prompts: int
    range_ratio: float = 0.0
    seed: int = DEFAULT_SEED

    def __post_init__(self) -> None:
        for name in ("input_len", "output_len", "num_prompts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} ({getattr(self, name)}) must be >= 1")
        if not 0.0 <= self.range_ratio <= 1.0:
            raise ValueError(f"range_ratio ({self.range_ratio}) must be in [0, 1]")


@dataclass(frozen=True)
class RequestLengths:
    """Per-request prompt, output and already-cached prompt tokens, in sending order."""

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    cached_prompt_tokens: np.ndarray

    def __post_init__(self) -> None:
        sizes = {self.prompt_tokens.size, self.output_tokens.size, self.cached_prompt_tokens.size}
        if len(sizes) != 1:
            raise ValueError(f"request length columns have different sizes {sorted(sizes)}")
        if np.any(self.cached_prompt_tokens >= self.prompt_tokens):
            raise ValueError("cached_prompt_tokens must leave >= 1 prompt token to compute")

    @property
    def uncached_prompt_tokens(self) -> np.ndarray:
        return self.prompt_tokens - self.cached_prompt_tokens


def random_lengths(run: RandomRun) -> tuple[np.ndarray, np.ndarray]:
    """(input lengths, output lengths) of ``run``, as ``sample_random_requests`` draws them."""
    state = np.random.RandomState(run.seed)
    lengths = []
    for full_len in (run.input_len, run.output_len):
        low = max(int(full_len * run.range_ratio), 1)
        lengths.append(state.randint(low, full_len + 1, size=run.num_prompts).astype(np.int64))
    return lengths[0], lengths[1]


def run_request_lengths(
    run: RandomRun,
    *,
    earlier_runs: Sequence[RandomRun] = (),
    warmup_requests: int = DEFAULT_WARMUP_REQUESTS,
) -> RequestLengths:
    """The requests of ``run`` on a server that served ``earlier_runs`` (same seed) before it,
    with the prompt tokens its radix cache already holds (module docstring); the scheduler
    computes at least the last token of a prompt."""
    prompts, outputs = random_lengths(run)
    held = np.zeros_like(prompts)
    for earlier in earlier_runs:
        if earlier.seed != run.seed:
            continue  # another shuffle of ShareGPT: no shared prompts
        earlier_prompts, _ = random_lengths(earlier)
        count = min(earlier.num_prompts, run.num_prompts)
        held[:count] = np.maximum(held[:count], earlier_prompts[:count])
    if warmup_requests > 0:
        held[0] = prompts[0]
    cached = np.minimum(held, prompts - 1)
    return RequestLengths(prompt_tokens=prompts, output_tokens=outputs, cached_prompt_tokens=cached)
