"""The iteration cost of a serving replica, per row: ``_inference_passes``' pass time on a
grid of tokens per iteration (``IterationCost``), which the closed form (``_serving_load``,
``_serving_open_loop``) and the simulator (``_simulator``) share."""

from __future__ import annotations

import numpy as np

from cost_model._inference_kernels import eager_pass_host_s
from cost_model._inference_passes import _pass_parts
from cost_model._inference_setup import _passes, _Setup
from cost_model._serving_replica import GRID_TOKENS, IterationCost

#: Tokens per iteration at which decode attention is priced per request (it is linear in them).
_ATTENTION_REFERENCE_TOKENS = 256.0
#: Tokens per iteration at which the prefill form is priced (``_prefill_linear``).
_PREFILL_GRID_TOKENS = np.array([64.0, 1024.0, 4096.0, 16384.0])


def iteration_cost(s: _Setup) -> IterationCost:
    """Iteration time of each row's replica as a function of its tokens (``IterationCost``).

    An iteration of ``T`` tokens runs ``pp`` micro-batches of ``T / pp`` (the pipeline keeps
    ``pp`` in flight). A decode-only iteration costs ``_pass_parts`` of a decode pass at batch
    ``T / pp``; an iteration carrying prompt tokens costs the prefill pass a prefill pool runs,
    over ``T`` tokens (its batch of prompts scaled to ``T`` tokens), so that one prompt alone
    costs exactly one prefill pass. A prompt token adds its core attention at the prompt's
    token-weighted mean context (what the prefill pass of the whole prompt spends beyond its
    interpolated linear part). An iteration the engine runs without a CUDA graph takes at least
    the host time of launching its kernels (``_inference_kernels.eager_pass_host_s``); ``pp``
    micro-batches of at most the engine's largest graph replay graphs.
    """
    n = s.phase.shape[0]
    pp = s.column("pp")
    prefill, _ = _passes(s, np.ones(n) / pp)
    prompt = prefill.new_tokens
    linear, attention, decode_attention = [], [], np.zeros(n)
    for tokens in GRID_TOKENS:
        exposed, _ = _pass_parts(s, _passes(s, np.full(n, tokens) / pp)[1])
        linear.append(sum(exposed.values()) - exposed["attention"])
        attention.append(exposed["attention"])
        if tokens == _ATTENTION_REFERENCE_TOKENS:
            decode_attention = exposed["attention"] / tokens
    # A measured decode-attention kernel is launch-bound at a few sequences (~10 us a layer
    # however few: ``_kernel_curves_attention.decode_attention_time_s``): what the per-request price
    # leaves out at each grid size stays in the decode iteration's linear part, so a
    # decode-only iteration costs exactly its decode pass.
    linear = [
        part + seconds - decode_attention * tokens
        for part, seconds, tokens in zip(linear, attention, GRID_TOKENS, strict=True)
    ]
    floor = np.full(n, s.profile.iteration_floor_s)
    whole_parts = _pass_parts(s, prefill)[0]
    cost = IterationCost(
        np.stack(linear, axis=1),
        decode_attention,
        np.zeros(n),
        floor,
        _prefill_linear(s, prefill, whole_parts),
    )
    whole = sum(whole_parts.values())
    extra = whole - (cost.seconds(np.zeros(n), prompt) - floor)
    return IterationCost(
        cost.linear_s,
        decode_attention,
        np.maximum(extra, 0.0) / prompt,
        floor,
        cost.prefill_linear_s,
        eager_pass_host_s(s),
        s.graph_tokens * pp,
        s.profile.prefill_graphs,
        s.prefill_graph_tokens * pp,
    )


def _prefill_linear(s: _Setup, prefill, prefill_parts: dict[str, np.ndarray]) -> np.ndarray:
    """Everything but core attention of a prefill-form iteration at each of ``GRID_TOKENS``,
    (n, g). Priced at ``_PREFILL_GRID_TOKENS`` (the sizes prompt iterations have: chunks up to
    a budget of thousands of tokens) and linear between them; below the smallest, an iteration
    is bound by its weight reads (the matmuls' ridge point is hundreds of tokens per expert or
    replica), so it is held at that value. ``prefill_parts`` are the exposed parts of
    ``prefill`` itself, reused where a grid size is every row's prompt."""
    priced = []
    for tokens in _PREFILL_GRID_TOKENS:
        grid_pass = prefill.scaled(tokens / prefill.new_tokens)
        exposed = (
            prefill_parts
            if np.array_equal(grid_pass.batch, prefill.batch)
            else _pass_parts(s, grid_pass)[0]
        )
        priced.append(sum(exposed.values()) - exposed["attention"])
    grid, columns = _PREFILL_GRID_TOKENS, []
    for tokens in np.clip(GRID_TOKENS, grid[0], grid[-1]):
        index = int(np.clip(np.searchsorted(grid, tokens) - 1, 0, grid.size - 2))
        weight = (tokens - grid[index]) / (grid[index + 1] - grid[index])
        columns.append((1.0 - weight) * priced[index] + weight * priced[index + 1])
    return np.stack(columns, axis=1)
