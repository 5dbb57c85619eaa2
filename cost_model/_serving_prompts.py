"""What an iteration carrying prompts costs when prompt lengths vary and ranks iterate together.

The closed form (``_serving_load``) knows the mean number of prompts a rank sends into an
iteration (Poisson: completions of a desynchronized closed loop, or arrivals of an open one)
and the mean prompt length; the simulator (``_simulator``) draws both. Two things make the
mean iteration longer than the iteration of the mean batch:

* the iteration's cost is not linear in its tokens. An eager prefill costs at least the host
  time of launching its kernels and grows with its tokens only past the point where the GPU
  takes longer (``_serving_replica.IterationCost``: ``max(GPU, host)``), a convex function, so
  over prompt lengths that vary the mean cost exceeds the cost of the mean (Jensen's
  inequality);
* coupled data-parallel ranks iterate together and an iteration lasts its slowest rank
  (``_serving_coupling.DP_ATTENTION_COUPLING``): a prompt-carrying iteration runs the fullest
  rank's prompts, and a decode iteration the largest decode batch, not the average rank's.

``prompt_iteration_s`` prices both over the distribution of one rank's prompt tokens: ``N``
prompts, Poisson (given at least one; each count apart), whose summed lengths are lognormal with
mean ``N P`` and coefficient of variation ``c / sqrt(N)`` (lengths of mean ``P`` and spread ``c``),
each cut into ``QUANTILE_POINTS`` equal-probability slices read at their own means; a rank holds
no prompt with the complementary probability of its busy share, and the slowest of ``R`` ranks has
the distribution function ``F^R`` (order statistics: David and Nagaraja, Order Statistics, 2003,
sec. 2.1); an arrival's own prefill runs ``1 + N`` prompts beside ``R - 1`` such ranks (Wolff's
PASTA: an arrival sees the time average). ``slowest_decodes`` is the mean largest of ``R``
Poisson decode batches, the requests of an M/G/inf system (each rank's running requests under
Poisson arrivals); under Poisson arrivals the decodes beside a prompt are Poisson too, priced
at none and at their mean given some (``decode_spread``): where a prompt sits at a CUDA-graph
capture size, an iteration without decodes replays a graph and one with them runs eagerly.
"""

from __future__ import annotations

from functools import lru_cache
from statistics import NormalDist

import numpy as np

#: Equal-probability slices of the distribution of the tokens of a given number of prompts,
#: each read at its own mean (so their average is the distribution's mean).
QUANTILE_POINTS = 8
_SLICE_EDGES = [NormalDist().inv_cdf(i / QUANTILE_POINTS) for i in range(1, QUANTILE_POINTS)]


@lru_cache(maxsize=256)
def _slice_means(prompt_cv: float, counts: int) -> np.ndarray:
    """Means of the ``QUANTILE_POINTS`` equal-probability slices of the lognormal of mean 1 and
    coefficient of variation ``prompt_cv / sqrt(N)`` for ``N = 1 .. counts``, (counts, points):
    with log-spread ``s``, between standard normal quantiles ``z_i`` and ``z_(i+1)``,
    ``E[X | slice] = K (Phi(z_(i+1) - s) - Phi(z_i - s))``."""
    normal = NormalDist()
    edges = [-np.inf, *_SLICE_EDGES, np.inf]
    spreads = np.sqrt(np.log1p(prompt_cv**2 / np.arange(1.0, counts + 1.0)))
    cdf = np.array(
        [[normal.cdf(edge - s) if np.isfinite(edge) else float(edge > 0) for edge in edges]
         for s in spreads]
    )  # fmt: skip
    return QUANTILE_POINTS * np.diff(cdf, axis=-1)


def prompt_iteration_s(
    cost,
    *,
    decodes,
    prompts,
    prompt_tokens,
    prompt_cv,
    ranks,
    budget,
    busy=None,
    own=False,
    decode_spread=False,
) -> np.ndarray:
    """Mean seconds of an iteration in which at least one of ``ranks`` coupled ranks runs
    prompts, a rank that runs some running Poisson(``prompts``) of them given at least one, of
    ``prompt_tokens`` tokens on average (coefficient of variation ``prompt_cv``), each rank's
    prompt tokens at most ``budget``, the iteration as long as its slowest rank:
    ``E[max_k cost(decodes, T_k) | some T_k > 0]`` (module docstring). A rank runs prompts in an
    iteration with probability ``busy``: by default ``1 - exp(-prompts)``, the Poisson count's
    own (Poisson arrivals), less where a rank that has just prefilled must decode before it
    sends more (an engine that does not mix: ``w / (1 + w)``).

    ``own``: the iteration of one request's own prefill instead: its rank runs that prompt and
    the Poisson(``prompts``) others queued with it (``1 + N`` prompts: an arrival sees the time
    average, Wolff's PASTA), beside ``ranks - 1`` others as above, with no further condition.
    ``decode_spread``: the decodes beside the prompts are Poisson of mean ``decodes`` (the
    requests of an M/G/inf system under Poisson arrivals) rather than ``decodes`` exactly: an
    iteration with none beside its prompts (``e^-decodes``) may replay a graph the others cannot.
    Arrays broadcast together ((n,) or (n, k), as ``IterationCost.seconds`` takes them)."""
    arrays = [np.asarray(x, dtype=np.float64) for x in (prompts, prompt_tokens, ranks, decodes)]
    shape = np.broadcast_shapes(*(a.shape for a in arrays), np.shape(budget))
    rate, length, ranks, decodes = (np.broadcast_to(a, shape) for a in arrays)
    counts, weights, mine, empty = _prompt_counts(rate=rate, busy=busy, shape=shape)
    tokens, weights, mine = _sorted_prompt_tokens(
        counts=counts, length=length, prompt_cv=prompt_cv, weights=weights, mine=mine
    )
    capped = np.minimum(tokens, np.asarray(budget, dtype=np.float64)[..., None])
    rows = shape[0] if shape else 1
    flat = capped.reshape(rows, -1)

    def priced(count) -> np.ndarray:
        at = np.broadcast_to(np.asarray(count)[..., None], capped.shape).reshape(rows, -1)
        return cost.seconds(at, flat).reshape(capped.shape)

    if decode_spread:  # none beside the prompts (e^-m), else their mean given some
        none = np.exp(-decodes)[..., None]
        some_decodes = decodes / np.maximum(-np.expm1(-decodes), 1e-12)
        seconds = none * priced(np.zeros(shape)) + (1.0 - none) * priced(some_decodes)
    else:
        seconds = priced(decodes)
    # distribution function of the slowest rank at each point, and at the point before it
    others = np.minimum(empty[..., None] + np.cumsum(weights, axis=-1), 1.0)
    if own:
        slowest = np.minimum(np.cumsum(mine, axis=-1), 1.0) * others ** (ranks[..., None] - 1.0)
        first = np.zeros(shape)
    else:
        slowest = others ** ranks[..., None]
        first = empty**ranks
    previous = np.concatenate([first[..., None], slowest[..., :-1]], axis=-1)
    mean = np.sum(seconds * (slowest - previous), axis=-1)
    return mean / np.maximum(1.0 - first, 1e-12)


def _prompt_counts(
    *, rate: np.ndarray, busy, shape: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The prompt counts ``N = 1, 2, ...`` a rank may run, with (..., counts) each: the
    probability that a busy rank runs ``N`` (Poisson(``rate``) given at least one, on a rank
    busy with probability ``busy``), that the arrival's own rank runs ``N`` (its own and a
    Poisson number queued with it), and (...) the probability that a rank runs none."""
    rate = np.maximum(rate, 1e-12)
    top = float(np.max(rate))
    counts = np.arange(1.0, np.ceil(top + 5.0 * np.sqrt(top) + 4.0) + 1.0)  # N = 1, 2, ...
    log_pmf = counts * np.log(rate[..., None]) - rate[..., None] - _log_factorial(counts)
    weights = np.exp(log_pmf)  # (..., counts)
    some = -np.expm1(-rate)
    weights[..., -1] += np.maximum(some - weights.sum(axis=-1), 0.0)  # the tail
    if busy is None:
        busy = some
    busy = np.clip(np.broadcast_to(np.asarray(busy, dtype=np.float64), shape), 1e-12, 1.0)
    weights = weights * (busy / some)[..., None]  # N given at least one, on a busy rank
    # the arrival's own rank: 1 + N prompts, N Poisson (P(1 + N = n) = P(N = n - 1))
    mine = np.exp(np.concatenate([-rate[..., None], log_pmf[..., :-1]], axis=-1))
    mine[..., -1] += np.maximum(1.0 - mine.sum(axis=-1), 0.0)
    return counts, weights, mine, 1.0 - busy


def _sorted_prompt_tokens(
    *, counts: np.ndarray, length: np.ndarray, prompt_cv: float, weights, mine
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The prompt tokens a rank may run, (..., points) sorted, with the two probabilities of
    ``_prompt_counts`` split over them: ``N`` prompts of lognormal tokens, mean ``N`` times
    ``length``, coefficient of variation ``prompt_cv / sqrt(N)``, in equal-probability
    slices."""
    shape = length.shape
    slices = (
        _slice_means(float(prompt_cv), counts.size) if prompt_cv > 0 else np.ones((counts.size, 1))
    )
    tokens = (counts * length[..., None])[..., None] * slices  # (..., counts, slices)
    weights = np.broadcast_to(weights[..., None] / slices.shape[-1], tokens.shape)
    mine = np.broadcast_to(mine[..., None] / slices.shape[-1], tokens.shape)
    tokens = tokens.reshape(*shape, -1)
    order = np.argsort(tokens, axis=-1)  # the cost grows with the tokens: sorted by either
    return (
        np.take_along_axis(tokens, order, axis=-1),
        np.take_along_axis(weights.reshape(*shape, -1), order, axis=-1),
        np.take_along_axis(mine.reshape(*shape, -1), order, axis=-1),
    )


def _log_factorial(counts: np.ndarray) -> np.ndarray:
    return np.cumsum(np.log(counts))


def slowest_decodes(decodes, ranks, *, own=False) -> np.ndarray:
    """Mean largest of ``ranks`` independent Poisson decode batches of mean ``decodes``:
    ``sum_m (1 - F(m)^R)``; ``decodes`` itself for one rank. ``own``: as a decoding request sees
    it, its own rank's batch one more than Poisson (itself and the others; Palm: the requests an
    M/G/inf system's request sees besides itself are Poisson of the mean),
    ``sum_m (1 - F(m - 1) F(m)^(R - 1))``; ``1 + decodes`` for one rank."""
    mean = np.maximum(np.asarray(decodes, dtype=np.float64), 0.0)
    ranks = np.maximum(np.asarray(ranks, dtype=np.float64), 1.0)
    top = float(np.max(mean)) if mean.size else 0.0
    terms = int(np.ceil(top + 12.0 * np.sqrt(top) + 24.0))
    pmf = np.exp(-mean)
    cdf = pmf.copy()  # F(0)
    below = np.zeros_like(cdf)  # F(-1)
    others = ranks - 1.0 if own else ranks
    largest = 1.0 - (below if own else 1.0) * cdf**others
    for m in range(1, terms):
        pmf = pmf * mean / m
        below = cdf
        cdf = np.minimum(cdf + pmf, 1.0)
        largest = largest + (1.0 - (below if own else 1.0) * cdf**others)
    if own:
        return np.where(ranks > 1.0, largest, 1.0 + mean)
    return np.where(ranks > 1.0, largest, mean)
