"""Serving under open-loop (Poisson) load: the closed form's ``open_loop``.

Open-loop load (``request_rate_per_s``, Poisson) gives ``n_d = λ (O - 1) T`` decoding requests at a
mean iteration time ``T`` found by substitution (``_OPEN_LOOP_STEPS`` times,
``_open_loop_iteration``), a share of iterations carrying prompts, and a prompt queue served at the
leftover budget: an M/D/1 wait ``ρ s / (2 (1 - ρ))`` with ``s`` one prompt's share of the budget
(Kleinrock, Queueing Systems I, 1975, Pollaczek-Khinchine), plus the residual of the running
iteration, plus the wait for a free KV slot where the running requests approach ``max_running``
(a G/G/c queue: Halfin-Whitt's Erlang C, Allen-Cunneen's correction; ``_admission_wait``).
The policy, the iteration costs, the coupled ranks and the percentiles are those of
``_serving_load`` (its module docstring), which prices the closed loops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_model._serving_coupling import _coupled_poisson_decode_s
from cost_model._serving_landing import (
    arrival_residual,
)
from cost_model._serving_load import LoadTimes, _drawn_prompts
from cost_model._serving_prompts import prompt_iteration_s, slowest_decodes
from cost_model._serving_replica import IterationCost, LoadPolicy, as_columns

#: Substitutions of the mean iteration (``_open_loop_iteration``).
_OPEN_LOOP_STEPS = 24


def open_loop(*, cost: IterationCost, policy: LoadPolicy, request_rate_per_s) -> LoadTimes:
    """Poisson arrivals at ``request_rate_per_s`` per replica. A replica that cannot carry the
    rate (more running requests than its cache holds, or more prompt tokens than its budget)
    has unbounded latency: its times are ``inf``.

    A share ``q`` of the iterations carries prompts (at least one arrival during the previous
    iteration, ``1 - exp(-λ T)``), the rest only decodes; ``T`` mixes the two. A request waits
    for the running iteration (half of it, when the engine is busy) and for the prompts queued
    ahead of it (M/D/1 at the budget's utilization), then its own iteration(s).
    """
    rate = np.asarray(request_rate_per_s, dtype=np.float64)
    col = as_columns(rate)
    prompt, output = col(policy.prompt_tokens), col(policy.output_tokens)
    slots = col(policy.max_running)
    point = _open_loop_iteration(
        cost=cost, policy=policy, col=col, rate=rate, prompt=prompt, output=output
    )
    iteration, tpot, budget_left = point.iteration_s, point.tpot_s, point.budget_left
    chunks = (
        np.ceil(prompt / budget_left)
        if policy.chunked_prefill
        else np.ones_like(point.prompt_tokens)
    )
    # requests holding a KV slot, as offered (Little: arrival rate x time held); at most
    # ``slots`` run, the rest wait for admission (``_admission_wait``)
    offered = rate * (chunks * iteration + (output - 1.0) * tpot)
    running = np.minimum(offered, slots)
    queue = _open_loop_queue(
        policy=policy, point=point, rate=rate, chunks=chunks, offered=offered, slots=slots
    )
    stable, queue_wait = queue.stable, queue.wait_s
    busy = np.minimum(rate * (chunks + output - 1.0) * iteration, 1.0)  # P(engine busy at arrival)
    # an arrival waits for the instance's running iteration: busy where any coupled rank is
    residual = arrival_residual(
        1.0 - (1.0 - busy) ** col(policy.coupled_ranks), *point.instance_mix
    )
    service = _prompt_service_s(
        cost=cost, policy=policy, point=point, rate=rate, prompt=prompt, chunks=chunks
    )
    ttft = policy.request_overhead_s + residual[0] + queue_wait + service
    spread = _iteration_mix_spread_s(point=point, rate=rate, ranks=col(policy.coupled_ranks))

    def unbounded(v):
        return np.where(stable, v, np.inf)

    return LoadTimes(
        unbounded(ttft),
        unbounded(tpot),
        unbounded(ttft + (output - 1.0) * tpot),
        rate,
        running,
        wait_s=queue_wait,
        busy=np.minimum(np.maximum(queue.utilization, queue.admission_busy), 1.0),
        tpot_spread_s=np.hypot(
            spread / np.sqrt(np.maximum(output - 1.0, 1.0)), point.batch_spread_s
        ),
        residual=residual,
        stable=stable,
    )


def _prompt_service_s(
    *,
    cost: IterationCost,
    policy: LoadPolicy,
    point: _OpenLoopIteration,
    rate: np.ndarray,
    prompt: np.ndarray,
    chunks: np.ndarray,
) -> np.ndarray:
    """Seconds of the iterations that prefill an arriving prompt: its chunks beside the running
    decodes, or, for a prompt of one iteration, that iteration with the prompts queued with it,
    of drawn lengths, beside the coupled ranks' prompts (``_serving_prompts``)."""
    col = as_columns(rate)
    with_prompts, budget_left = point.with_prompts, point.budget_left
    own = np.minimum(prompt + point.prompt_tokens, np.maximum(budget_left, prompt / chunks))
    chunked = cost.seconds(with_prompts, own) + (chunks - 1.0) * cost.seconds(
        with_prompts, budget_left
    )
    alone = prompt_iteration_s(
        cost,
        decodes=with_prompts,
        own=True,
        decode_spread=True,
        **_drawn_prompts(
            policy,
            prompts=rate * point.iteration_s,
            prompt=prompt,
            ranks=col(policy.coupled_ranks),
            budget=budget_left,
        ),
    )
    return np.where(chunks > 1.0, chunked, alone)


def _iteration_mix_spread_s(
    *, point: _OpenLoopIteration, rate: np.ndarray, ranks: np.ndarray
) -> np.ndarray:
    """Spread of one iteration's time over the coupled instance's mix of iterations with and
    without prompts: a prompt iteration gathers the arrivals of its length, so the next is a
    prompt one more often (lag-one correlation ``b - a`` of the two-state chain,
    ``_coupled_poisson_decode_s``), and the mean of a request's iterations spreads by
    ``sqrt((1 + c) / (1 - c))`` more."""
    share, prefill_s, decode_s = point.instance_mix
    after_decode = 1.0 - np.exp(-ranks * rate * decode_s)
    after_prefill = 1.0 - np.exp(-ranks * rate * prefill_s)
    correlation = np.clip(after_prefill - after_decode, 0.0, 0.9)
    return np.sqrt(share * (1.0 - share) * (1.0 + correlation) / (1.0 - correlation)) * np.abs(
        prefill_s - decode_s
    )


@dataclass(frozen=True)
class _OpenLoopIteration:
    """The mean iteration of an open loop at its fixed point (``open_loop``), per row."""

    iteration_s: np.ndarray  # mean iteration, prompt and decode iterations mixed
    previous_iteration_s: np.ndarray  # the same one substitution earlier (settled or not)
    tpot_s: np.ndarray
    with_prompts: np.ndarray  # decodes in a prompt iteration
    budget_left: np.ndarray  # token budget a prompt iteration leaves to prompts
    prompt_tokens: np.ndarray  # prompt tokens arriving per iteration, on average
    share: np.ndarray  # share of iterations that carry prompts
    prefill_s: np.ndarray
    decode_s: np.ndarray
    instance_mix: tuple  # (busy share, prefill s, decode s) of the coupled instance
    batch_spread_s: np.ndarray  # std over requests of their TPOT from the decodes beside them


def _open_loop_iteration(
    *, cost: IterationCost, policy: LoadPolicy, col, rate, prompt, output
) -> _OpenLoopIteration:
    """Substitute the mean iteration ``_OPEN_LOOP_STEPS`` times: decodes from the TPOT, the
    share of prompt iterations from the arrivals, the iteration from both."""
    budget = policy.max_batched_tokens
    mixed = policy.mixed_prefill_decode
    slots = col(policy.max_running)
    iteration = cost.seconds(np.zeros_like(rate * prompt), np.minimum(prompt, budget))
    tpot = iteration
    previous = iteration
    ranks = col(policy.coupled_ranks)
    for _ in range(_OPEN_LOOP_STEPS):
        previous = iteration
        decodes = np.minimum(rate * (output - 1.0) * tpot, slots)  # the cache holds ``slots``
        with_prompts = decodes if mixed else np.zeros_like(decodes)  # decodes in a prompt iteration
        budget_left = np.maximum(budget - with_prompts, 1.0)
        prompt_tokens = rate * prompt * iteration  # per iteration, on average
        share = np.clip(
            np.maximum(1.0 - np.exp(-rate * iteration), prompt_tokens / budget_left),
            1e-9,
            1.0,
        )
        # the arrivals of the last iteration, lengths that vary, the slowest coupled rank
        prefill_s = prompt_iteration_s(
            cost,
            decodes=with_prompts,
            decode_spread=True,
            **_drawn_prompts(
                policy, prompts=rate * iteration, prompt=prompt, ranks=ranks, budget=budget_left
            ),
        )
        decode_alone_s = cost.seconds(slowest_decodes(decodes, ranks), np.zeros_like(prefill_s))
        decode_s, instance_mix = _coupled_poisson_decode_s(
            cost=cost,
            policy=policy,
            col=col,
            decodes=decodes,
            own_share=share,
            rate=rate,
            prefill_iteration_s=prefill_s,
            decode_s=decode_alone_s,
        )
        iteration = share * prefill_s + (1.0 - share) * decode_s
        # A decoding request runs beside the others it sees, Poisson of the mean decodes (the
        # requests of an M/G/inf system seen by one of them; Palm): its own batch is one more.
        seen_s = decode_s + (
            cost.seconds(slowest_decodes(decodes, ranks, own=True), np.zeros_like(prefill_s))
            - decode_alone_s
        )
        seen = share * prefill_s + (1.0 - share) * seen_s
        # unmixed: a decode step waits for the prompt iterations between two decode iterations
        tpot = seen if mixed else seen / np.maximum(1.0 - share, 1e-9)
    return _OpenLoopIteration(
        iteration_s=iteration,
        previous_iteration_s=previous,
        tpot_s=tpot,
        with_prompts=with_prompts,
        budget_left=budget_left,
        prompt_tokens=prompt_tokens,
        share=share,
        prefill_s=prefill_s,
        decode_s=decode_s,
        instance_mix=instance_mix,
        batch_spread_s=_decode_batch_spread_s(
            cost=cost, decodes=decodes, slots=slots, decode_share=np.where(mixed, 1.0 - share, 1.0)
        ),
    )


def _decode_batch_spread_s(
    *, cost: IterationCost, decodes: np.ndarray, slots: np.ndarray, decode_share
) -> np.ndarray:
    """Spread over requests of their mean decode step from the decodes beside them.

    The decodes beside a request come and go over its life: each other request overlaps a
    fraction 1 - |u| / L of a life L it starts u from (Poisson starts, equal lives), so the
    count averaged over the life has mean m and variance 2m/3, a spread over requests that the
    life does not average away. Priced on the decode step at 1 + m -+ that deviation, over the
    ``decode_share`` of a request's iterations that decode."""
    deviation = np.sqrt(2.0 * decodes / 3.0)
    zero = np.zeros_like(decodes)
    high = cost.seconds(np.minimum(1.0 + decodes + deviation, slots), zero)
    low = cost.seconds(np.maximum(1.0 + decodes - deviation, 1.0), zero)
    return 0.5 * np.abs(high - low) * decode_share


@dataclass(frozen=True)
class _OpenLoopQueue:
    """The queues ahead of an open loop's arrival, per row."""

    utilization: np.ndarray  # of the prompt budget
    stable: np.ndarray  # False where the load grows without bound
    wait_s: np.ndarray  # mean wait for the prompts ahead and a KV slot (inf where unstable)
    admission_busy: np.ndarray  # probability that an arrival waits for a KV slot


def _open_loop_queue(
    *, policy: LoadPolicy, point: _OpenLoopIteration, rate, chunks, offered, slots
) -> _OpenLoopQueue:
    """Stability and the queueing part of the TTFT: M/D/1 at the budget's utilization plus the
    wait for a KV slot (``_admission_wait``)."""
    utilization = point.prompt_tokens / point.budget_left
    # Each request adds work to every iteration it spans: past a rate, more decodes make longer
    # iterations make more decodes, and the substitution diverges instead of settling.
    settled = point.iteration_s <= point.previous_iteration_s * (1.0 + 1e-3)
    stable = (utilization < 1.0) & (offered < slots) & settled
    admission_s, admission_busy = _admission_wait(
        running=offered,
        slots=slots,
        rate=rate,
        hold_cv=policy.output_tokens_cv,
    )
    queue_wait = np.where(
        stable,
        utilization * chunks * point.prefill_s / (2.0 * np.maximum(1.0 - utilization, 1e-9))
        + admission_s,
        np.inf,
    )
    return _OpenLoopQueue(
        utilization=utilization, stable=stable, wait_s=queue_wait, admission_busy=admission_busy
    )


def _normal_cdf(x: np.ndarray) -> np.ndarray:
    """Standard normal CDF through erf (Abramowitz & Stegun 7.1.26, |error| < 1.5e-7)."""
    z = np.abs(x) / np.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    erf = 1.0 - poly * np.exp(-z * z)
    return 0.5 * (1.0 + np.sign(x) * erf)


def _admission_wait(*, running, slots, rate, hold_cv: float) -> tuple[np.ndarray, np.ndarray]:
    """(mean wait for a free KV slot, probability of waiting) of Poisson arrivals at ``rate``
    competing for ``slots`` (``max_running``) that each request holds for ``running / rate``
    seconds on average: a G/G/c queue with ``running`` busy slots offered. P(wait) is the
    Halfin-Whitt approximation of Erlang C, ``1 / (1 + b Phi(b) / phi(b))`` with
    ``b = (c - a) / sqrt(a)`` (Halfin & Whitt, Operations Research 29(3), 1981); the M/M/c wait
    ``P(wait) hold / (c - a)`` is scaled by ``(1 + cv_hold^2) / 2`` for Poisson arrivals and
    holds of spread ``cv_hold`` (Allen-Cunneen; Whitt, 'Approximations for the GI/G/m
    queue', Production and Operations Management 2(2), 1993). Zero where slots are ample."""
    running = np.asarray(running, dtype=np.float64)
    spare = np.maximum(np.asarray(slots, dtype=np.float64) - running, 1e-9)
    b = spare / np.sqrt(np.maximum(running, 1e-9))
    density = np.exp(-0.5 * b * b) / np.sqrt(2.0 * np.pi)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        ratio = np.where(density > 1e-300, _normal_cdf(b) / density, np.inf)
        p_wait = np.where(np.isfinite(ratio), 1.0 / (1.0 + b * ratio), 0.0)
    hold_s = running / np.maximum(np.asarray(rate, dtype=np.float64), 1e-12)
    return p_wait * hold_s / spare * (1.0 + hold_cv**2) / 2.0, p_wait
