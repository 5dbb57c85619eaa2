"""Where a closed-loop client's next request lands in the engine's iterations, and its wait.

A client reads its request's last token and sends the next one, which crosses the HTTP server
and the tokenizer (the engine profile's ``request_overhead_s``) before the scheduler sees it.
The engines take new requests in only between iterations (SGLang ``Scheduler.event_loop_normal``
receives requests before it builds the next batch; vLLM V1 ``EngineCore.step`` and
TensorRT-LLM's executor loop likewise), and the iteration after a completion starts at once,
without the request sent then: the request waits for the rest of the iteration it lands in.
The simulator (``_simulator``) sends it ``request_overhead_s`` after its predecessor's last
iteration; the closed form (``_serving_load.closed_loop``) prices the same wait here.
"""

from __future__ import annotations

import numpy as np

#: Standard normal quantiles of the reported percentiles.
Z_SCORES = {0.5: 0.0, 0.9: 1.2815515655446004, 0.99: 2.3263478740408408}


def iteration_rest_s(overhead_s, iteration_s) -> np.ndarray:
    """What is left of iterations of length ``iteration_s``, back to back, ``overhead_s``
    after one began: ``ceil(o / T) T - o``."""
    iteration_s = np.maximum(iteration_s, 1e-12)
    return np.ceil(overhead_s / iteration_s) * iteration_s - overhead_s


def landing_wait_s(
    *,
    overhead_s,
    mixed: bool,
    coupled_ranks,
    prompt_iterations_per_step,
    prefill_iteration_s,
    decode_s,
) -> np.ndarray:
    """Landing wait of a request whose predecessor ended at a random iteration (a
    desynchronized closed loop): the iteration it lands in carries prompts with the share of
    iterations that do, ``prompt_iterations_per_step`` per decode step (all of them iterations
    of their own where the engine does not mix, else carried by decode iterations), on any of
    the ``coupled_ranks`` whose iterations last as long as the slowest
    (``_serving_coupling.DP_ATTENTION_COUPLING``)."""
    overhead = np.asarray(overhead_s, dtype=np.float64)
    per_step = np.asarray(prompt_iterations_per_step, dtype=np.float64)
    share = np.minimum(per_step, 1.0) if mixed else per_step / (1.0 + per_step)
    share = 1.0 - (1.0 - share) ** coupled_ranks
    return share * iteration_rest_s(overhead, prefill_iteration_s) + (
        1.0 - share
    ) * iteration_rest_s(overhead, decode_s)


def chained_landing_wait_s(*, overhead_s, groups, prefill_s, decode_s, backlog=0.0) -> np.ndarray:
    """Landing wait of equal requests whose prompts fill ``groups`` prefill iterations on an
    engine that mixes: the group finishing one iteration after another lands in that group's
    prefill iteration, so the groups chain (their prefills run back to back); the chain's
    first lands in a decode iteration. One group returns to an idle engine and waits for
    nothing. The chain's later groups wait ``backlog`` prefill iterations more on average
    (``chained_backlog``)."""
    groups = np.maximum(groups, 1.0)
    chained = (1.0 - 1.0 / groups) * (iteration_rest_s(overhead_s, prefill_s) + backlog * prefill_s)
    return chained + np.where(groups > 1.0, iteration_rest_s(overhead_s, decode_s) / groups, 0.0)


def chained_backlog(*, overhead_s, groups, group_size, per_iteration, decode_s) -> np.ndarray:
    """Mean prefill iterations a chain's later group waits beyond its landing, where an
    iteration takes whole prompts only (``per_iteration`` of them; groups of ``group_size``).

    The groups finish one iteration apart, as they were prefilled, and the chain's first
    finishes after decode-only iterations: while its next request crosses the client and the
    server (``overhead_s``), ``j = ceil(overhead_s / decode_s)`` decode iterations run, at the end
    of which ``j`` more groups have finished. Their requests all reach the chain's first prefill
    iteration, which takes the first group's, so ``B = j - 1`` groups stay queued; then one group
    arrives in each iteration and the iteration takes it and, where it has room beyond one group,
    ``s = per_iteration / group_size - 1`` groups of the queue, so the ``i``-th later group waits
    ``max(B - i s, 0)`` iterations more. The mean over the ``groups - 1`` later groups."""
    groups = np.asarray(groups, dtype=np.float64)
    queued = np.ceil(np.asarray(overhead_s) / np.maximum(np.asarray(decode_s), 1e-12)) - 1.0
    queued = np.clip(queued, 0.0, np.maximum(groups - 1.0, 0.0))
    drained = np.maximum(np.asarray(per_iteration) / np.maximum(group_size, 1e-12) - 1.0, 0.0)
    later = np.maximum(groups - 1.0, 1.0)
    # sum_i max(B - i s, 0) over i = 0 .. later - 1: the first ``n`` terms are positive
    positive = np.minimum(np.ceil(queued / np.maximum(drained, 1e-12)), later)
    total = positive * queued - drained * positive * (positive - 1.0) / 2.0
    return np.where(groups > 1.0, np.maximum(total, 0.0) / later, 0.0)


def arrival_residual(
    busy, share, prefill_s, decode_s
) -> tuple[np.ndarray, dict[float, np.ndarray]]:
    """Wait for the iteration running when a request arrives: with probability ``busy`` the
    engine runs one, picked length-biased (a long prefill iteration is more likely hit); the
    wait is uniform over it. Mean ``busy E[T^2] / (2 E[T])``; quantiles those of that mixture:
    with ``pi`` the share of time in the longer kind of iteration (``L``; ``S`` the shorter),
    ``P(wait > w) = busy (1 - w (pi / L + (1 - pi) / S))`` up to ``S`` and
    ``busy pi (1 - w / L)`` from ``S`` to ``L``, inverted piece by piece."""
    mean_iteration = share * prefill_s + (1.0 - share) * decode_s
    mean = busy * (share * prefill_s**2 + (1.0 - share) * decode_s**2) / (2.0 * mean_iteration)
    prefill_time_share = share * prefill_s / np.maximum(mean_iteration, 1e-300)
    prefill_longer = prefill_s >= decode_s
    long_s = np.where(prefill_longer, prefill_s, decode_s)
    short_s = np.maximum(np.where(prefill_longer, decode_s, prefill_s), 1e-300)
    long_share = np.where(prefill_longer, prefill_time_share, 1.0 - prefill_time_share)
    quantiles = {}
    for p in Z_SCORES:
        tail = np.minimum((1.0 - p) / np.maximum(busy, 1e-9), 1.0)  # P(wait > w) / busy
        within_short = (1.0 - tail) / (
            long_share / np.maximum(long_s, 1e-300) + (1.0 - long_share) / short_s
        )
        past_short = long_s * (1.0 - tail / np.maximum(long_share, 1e-300))
        quantiles[p] = np.where(
            tail >= long_share * (1.0 - short_s / np.maximum(long_s, 1e-300)),
            within_short,
            past_short,
        )
    return mean, quantiles
