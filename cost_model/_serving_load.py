"""Serving under load: TTFT, TPOT and end-to-end latency of continuous batching (closed form).

The policy modelled is iteration-level continuous batching with chunked prefill, as vLLM V1,
SGLang and TensorRT-LLM run it (Yu et al., Orca, OSDI'22: iteration-level scheduling; Kwon et
al., vLLM, SOSP'23: admission by free KV blocks; Agrawal et al., Sarathi-Serve, OSDI'24: a token
budget per iteration, decodes first, the rest filled with prefill chunks; Zheng et al., SGLang,
NeurIPS'24). Every iteration runs one token of each decoding request and at most
``max_batched_tokens - decodes`` prompt tokens of the waiting requests, first come first served;
a request is admitted while the KV cache holds it (``max_running`` per replica). Two defaults
differ by engine (``_serving_profile.ServingProfile``, each with its documentation as source):
whether prefill and decode mix in one iteration (vLLM V1 and TensorRT-LLM's in-flight batching
do; SGLang runs a waiting prefill alone, with the whole budget, and the decodes wait for it) and
whether a long prompt is chunked (TensorRT-LLM's default prefills whole prompts).

Each iteration's time is ``IterationCost.seconds(decodes, prefill_tokens)``, and what the engine
admits is a ``LoadPolicy`` (both ``_serving_replica``).

The closed form is iteration accounting (Little's law over iterations, as Vidur's and
DistServe's analytical models do; Agrawal et al., Vidur, MLSys'24; Zhong et al., DistServe,
OSDI'24 sec. 4). Closed-loop load (``concurrency``: a benchmark client keeping ``C`` requests in
flight) admits ``n = min(C, max_running)``, the rest waiting for admission (Little: ``(C - n) /
X``); requests of equal lengths sent together are prefilled together, in groups (``closed_loop``;
without mixing they stay in lock-step waves, ``_unmixed_closed_loop``), while output lengths that
vary end requests at random iterations, so the clients drift apart and a prompt runs with the
few sent in the same iteration (``_desynchronized_closed_loop``). Open-loop load
(``request_rate_per_s``, Poisson) gives ``n_d = λ (O - 1) T`` decoding requests at a mean
iteration time ``T`` found by substitution, a share of iterations carrying prompts, and a prompt
queue served at the leftover budget: an M/D/1 wait ``ρ s / (2 (1 - ρ))`` with ``s`` one prompt's
share of the budget (Kleinrock, Queueing Systems I, 1975, Pollaczek-Khinchine), plus the
residual of the running iteration, plus the wait for a free KV slot where the running requests
approach ``max_running`` (a G/G/c queue: Halfin-Whitt's Erlang C, Allen-Cunneen's correction;
``_admission_wait``) (``_serving_open_loop.open_loop``).

The data-parallel attention ranks of one SGLang instance iterate together
(``DP_ATTENTION_COUPLING``), as do vLLM's data-parallel ranks whose experts span them
(``VLLM_DP_EP_COUPLING``): where their requests drift apart (output lengths that vary, or
Poisson arrivals), a rank's decode iteration lasts another rank's prefill iteration whenever
one of them prefills (``_coupled_decode_s``); lock-step waves of equal requests prefill on
every rank at once, so they stall no further (``_serving_coupling``). Where requests drift
apart, a prompt-carrying iteration costs the mean over the prompts drawn (their count and
lengths) of the slowest coupled rank, and an open loop's decode iteration the largest rank's
batch (``_serving_prompts``): the cost of the mean batch reads low, since an eager iteration's
cost is convex in its tokens and the slowest of several ranks exceeds the average one.

Percentiles (open loop): a request's TPOT averages its ``O - 1`` iterations, a share of which
carries prompts on some rank of its coupled instance (``σ / sqrt(O - 1)``, central limit, widened
by ``sqrt((1 + c) / (1 - c))`` for the prompt iterations' clustering, lag-one correlation ``c``),
and runs beside a count of decoding requests
that its life averages but does not even out (variance ``2m/3`` for Poisson starts and equal
lives); p-quantiles are ``T + z_p`` times the two spreads combined. A decoding request's own
batch is itself and a Poisson count of others (Palm), one more than the server's mean. The
TTFT's queueing part is taken exponential with its mean beyond the zero-wait mass (the M/G/1
tail, Kingman 1962): quantile ``W / ρ · ln(ρ / (1 - p))`` where ``p > 1 - ρ``; the wait for the
running iteration is uniform over a length-biased iteration, a mixture of prompt and decode
iterations whose quantiles are inverted exactly (``_serving_landing.arrival_residual``). A closed loop of equal requests
runs in lock-step waves, so its percentiles equal its means (the simulator shows the spread
random lengths add); on an engine that prefills without the decodes a wave's prompts finish at
evenly filled positions, and a percentile is the position it falls on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_model._serving_coupling import _coupled_decode_s
from cost_model._serving_dealt import dealt_closed_loop
from cost_model._serving_landing import (
    Z_SCORES,
    chained_backlog,
    chained_landing_wait_s,
    landing_wait_s,
)
from cost_model._serving_prompts import prompt_iteration_s
from cost_model._serving_replica import IterationCost, LoadPolicy, as_columns


@dataclass(frozen=True)
class LoadTimes:
    """Mean TTFT, TPOT and end-to-end latency, the completion rate and the running requests;
    percentiles on demand (``quantile``) from the spread terms of the model."""

    ttft_s: np.ndarray
    tpot_s: np.ndarray
    e2e_s: np.ndarray
    requests_per_s: np.ndarray  # per replica
    running: np.ndarray  # mean requests admitted
    wait_s: np.ndarray | None = None  # mean queueing part of the TTFT (exponential tail)
    busy: np.ndarray | None = None  # probability that an arrival waits at all
    tpot_spread_s: np.ndarray | None = None  # standard deviation of a request's TPOT
    ttft_spread_s: np.ndarray | None = None  # standard deviation of the TTFT (normal, no queue)
    residual: tuple | None = None  # (mean, {p: quantile}) of the wait for the running iteration
    stable: np.ndarray | None = None  # False where the load grows without bound (times inf)
    #: (TTFT, TPOT) spread of a lock-step wave whose requests are spaced evenly over it
    wave_range_s: tuple[np.ndarray, np.ndarray] | None = None
    #: the wave's distinct first-token positions (equal shares of its requests at each)
    wave_steps: np.ndarray | None = None

    def quantile(self, metric: str, p: float) -> np.ndarray:
        """The p-quantile (0.5, 0.9 or 0.99) of ``"ttft"`` or ``"tpot"`` over requests."""
        if metric == "tpot":
            value = (
                self.tpot_s
                if self.tpot_spread_s is None
                else self.tpot_s + Z_SCORES[p] * self.tpot_spread_s
            )
        else:
            value = self.ttft_s if self.wait_s is None else self._ttft_quantile(p)
            if self.ttft_spread_s is not None:
                value = value + Z_SCORES[p] * self.ttft_spread_s
        if self.wave_range_s is not None:  # uniform over the wave's positions
            value = value + self._wave_offset(p) * self.wave_range_s[metric == "tpot"]
        return value if self.stable is None else np.where(self.stable, value, np.inf)

    def _wave_offset(self, p: float) -> np.ndarray | float:
        """The p-quantile of a wave's requests less their mean, in units of the wave's range:
        ``s`` equally filled positions 0 .. s-1, the p-quantile at position ``ceil(p s) - 1``
        (between two positions where ``p s`` is whole). A few positions put the p90 on the last
        (4 groups of prompts: the p90 request is in the 4th, not 0.4 of the range past the
        mean); many give ``p - 1/2``."""
        if self.wave_steps is None:
            return p - 0.5
        steps = np.maximum(np.asarray(self.wave_steps, dtype=np.float64), 1.0)
        x = p * steps
        whole = np.isclose(x, np.round(x))
        position = np.where(whole, np.round(x) - 0.5, np.ceil(x) - 1.0)
        return np.where(
            steps > 1.0, np.clip(position / np.maximum(steps - 1.0, 1.0), 0.0, 1.0) - 0.5, 0.0
        )

    def _ttft_quantile(self, p: float) -> np.ndarray:
        assert self.wait_s is not None and self.busy is not None  # set together by open_loop
        load = np.clip(self.busy, 1e-9, 1.0)
        finite = np.isfinite(self.wait_s)
        wait = np.where(finite, self.wait_s, 0.0)
        tail = np.where(
            p > 1.0 - load, wait / load * np.log(np.maximum(load / (1.0 - p), 1.0)), 0.0
        )
        value = self.ttft_s - wait + tail
        if self.residual is not None:
            value = value - self.residual[0] + self.residual[1][p]
        return np.where(finite, value, np.inf)


def closed_loop(*, cost: IterationCost, policy: LoadPolicy, concurrency) -> LoadTimes:
    """``concurrency`` requests in flight per replica (scalar, (n,) or (n, k)), each sent as
    soon as the previous one completes (a benchmark client with ``--max-concurrency``).

    Requests sent together are prefilled together: ``n`` running requests of ``P``-token
    prompts fall into ``m = ceil(n P / B)`` groups whose prompts share an iteration of
    ``n P / m`` tokens (``B`` the budget left by the decodes, the whole budget where all ``n``
    prompts fit it: that wave finishes together and returns to an idle engine); a prompt longer than ``B`` spans
    ``k = ceil(P / B)`` iterations. A request's cycle is ``k`` prefill iterations and ``O - 1``
    decode iterations, ``m - k`` of which carry the other groups' prompts; a completion sends
    the next request at an iteration's end, so it waits for no running iteration. When the
    groups' prompts need more iterations than a cycle has, prefill is budget-bound: every
    iteration is full and the completion rate is ``B / (P T)``.

    Loads that leave replicas (or coupled ranks) unequal: ``_serving_dealt``.
    """
    return dealt_closed_loop(
        lambda policy, concurrency: _closed_loop(cost=cost, policy=policy, concurrency=concurrency),
        policy=policy,
        concurrency=concurrency,
    )


@dataclass(frozen=True)
class _PrefillGroups:
    """How a closed loop's prompts share the prefill iterations (``_prefill_groups``), (n,)
    each: the token budget left to prompts per iteration, iterations per prompt, groups of
    prompts prefilled together, requests per group and prompt tokens per group iteration."""

    budget_left: np.ndarray
    chunks: np.ndarray
    groups: np.ndarray
    group_size: np.ndarray
    group_tokens: np.ndarray


def _prefill_groups(
    *, policy: LoadPolicy, running: np.ndarray, prompt: np.ndarray
) -> _PrefillGroups:
    """How ``running`` clients' prompts share the prefill iterations."""
    budget = policy.max_batched_tokens
    # A wave whose prompts all fit one iteration of the whole budget is prefilled at once,
    # finishes at once and returns to an idle engine: no decode shares its iteration.
    whole_wave = (
        running * prompt <= budget
        if policy.chunked_prefill
        else np.floor(budget / prompt) >= running
    )
    budget_left = np.maximum(
        np.where(policy.mixed_prefill_decode & ~whole_wave, budget - running, budget), 1.0
    )
    if policy.chunked_prefill:
        chunks = np.ceil(prompt / budget_left)
        groups = np.maximum(chunks, np.ceil(running * prompt / budget_left))
    else:  # whole prompts, as many as the budget holds (at least one) per iteration
        chunks = np.ones_like(budget_left)
        groups = np.ceil(running / np.maximum(np.floor(budget_left / prompt), 1.0))
    group_size = running / groups * chunks  # requests whose prompts share a prefill iteration
    group_tokens = running * prompt / groups
    if policy.chunked_prefill:
        group_tokens = np.minimum(group_tokens, budget_left)
    return _PrefillGroups(budget_left, chunks, groups, group_size, group_tokens)


def _closed_loop(*, cost: IterationCost, policy: LoadPolicy, concurrency) -> LoadTimes:
    """``closed_loop`` at one request in flight or more per replica."""
    col = as_columns(concurrency)
    prompt, output = col(policy.prompt_tokens), col(policy.output_tokens)
    running = np.minimum(concurrency, col(policy.max_running))
    groups = _prefill_groups(policy=policy, running=running, prompt=prompt)
    decode_s = cost.seconds(running, np.zeros_like(groups.group_tokens))
    if policy.output_tokens_cv > 0:
        return _desynchronized_closed_loop(
            cost=cost,
            policy=policy,
            concurrency=concurrency,
            running=running,
            budget_left=(
                groups.budget_left
                if policy.chunked_prefill
                else np.maximum(groups.budget_left, prompt)
            ),
            decode_s=decode_s,
        )
    if not policy.mixed_prefill_decode:
        return _unmixed_closed_loop(
            policy=policy,
            concurrency=concurrency,
            running=running,
            output=output,
            chunks=groups.chunks,
            groups=groups.groups,
            prefill_s=cost.seconds(np.zeros_like(groups.group_tokens), groups.group_tokens),
            decode_s=decode_s,
        )
    return _mixed_closed_loop(
        cost=cost,
        policy=policy,
        concurrency=concurrency,
        running=running,
        groups=groups,
        decode_s=decode_s,
    )


def _mixed_closed_loop(
    *,
    cost: IterationCost,
    policy: LoadPolicy,
    concurrency,
    running: np.ndarray,
    groups: _PrefillGroups,
    decode_s: np.ndarray,
) -> LoadTimes:
    """``_closed_loop`` where prefill chunks ride in the decode iterations (vLLM V1,
    TensorRT-LLM): a cycle of one request's output holds its group's prefill iterations, full of
    prompt tokens while prefill is budget-bound."""
    col = as_columns(concurrency)
    prompt, output = col(policy.prompt_tokens), col(policy.output_tokens)
    chunks, count = groups.chunks, groups.groups
    prefill_s = cost.seconds(running - groups.group_size, groups.group_tokens)
    cycle_iterations = output - 1.0 + chunks
    bound = count > cycle_iterations  # budget-bound prefill: every iteration full
    others = np.clip(count - chunks, 0.0, output - 1.0)
    cycle_s = np.where(
        bound,
        cycle_iterations * prefill_s,
        count * prefill_s + (cycle_iterations - count) * decode_s,
    )
    rate = np.where(bound, groups.budget_left / (prompt * prefill_s), running / cycle_s)
    tpot = np.where(
        bound,
        prefill_s,
        (others * prefill_s + (output - 1.0 - others) * decode_s) / np.maximum(output - 1.0, 1.0),
    )
    e2e_running = np.where(bound, running / rate, chunks * prefill_s + (output - 1.0) * tpot)
    admission_wait = (concurrency - running) / rate
    backlog = (
        0.0
        if policy.chunked_prefill  # a chunked iteration takes part of a queued prompt: no backlog
        else chained_backlog(
            overhead_s=policy.request_overhead_s,
            groups=count,
            group_size=groups.group_size,
            per_iteration=np.maximum(np.floor(groups.budget_left / prompt), 1.0),
            # the decode iterations after the first group finished, without its requests
            decode_s=cost.seconds(
                np.maximum(running - groups.group_size, 1.0), np.zeros_like(running)
            ),
        )
    )
    landing = chained_landing_wait_s(
        overhead_s=policy.request_overhead_s,
        groups=count,
        prefill_s=prefill_s,
        decode_s=decode_s,
        backlog=backlog,
    )
    ttft = (
        policy.request_overhead_s + landing + e2e_running - (output - 1.0) * tpot + admission_wait
    )
    return LoadTimes(ttft, tpot, ttft + (output - 1.0) * tpot, rate, running)


def _unmixed_closed_loop(
    *, policy: LoadPolicy, concurrency, running, output, chunks, groups, prefill_s, decode_s
) -> LoadTimes:
    """A closed loop on an engine whose prefill iterations run without the decodes (SGLang's
    default). Prefill has priority, so the prompts sent together run back to back in
    ``groups`` iterations and their decodes start together after the last: equal requests
    finish together and keep to lock-step waves. A wave's cycle is its ``groups`` prefill
    iterations and ``O - 1`` decode iterations; a prompt finishes after ``chunks`` to
    ``groups`` of them (evenly spread: its percentiles are uniform over that range), and the
    prefills after its first token stall its decode."""
    cycle_s = groups * prefill_s + (output - 1.0) * decode_s
    rate = running / cycle_s
    first_token_s = (groups + chunks) / 2.0 * prefill_s
    stalls = (groups - chunks) / 2.0 * prefill_s
    tpot = ((output - 1.0) * decode_s + stalls) / np.maximum(output - 1.0, 1.0)
    admission_wait = (concurrency - running) / rate
    ttft = policy.request_overhead_s + first_token_s + admission_wait
    spread = (groups - chunks) * prefill_s  # first and last prompt of a wave
    return LoadTimes(
        ttft,
        tpot,
        ttft + (output - 1.0) * tpot,
        rate,
        running,
        wave_range_s=(spread, spread / np.maximum(output - 1.0, 1.0)),
        wave_steps=groups - chunks + 1.0,
    )


def _desynchronized_closed_loop(
    *, cost: IterationCost, policy: LoadPolicy, concurrency, running, budget_left, decode_s
) -> LoadTimes:
    """A closed loop whose requests have output lengths that vary: completions fall at random
    iterations, each sends the next request at that iteration's end, and the clients drift
    apart instead of keeping the waves of equal requests. The completions of ``n`` requests
    that each complete once per cycle of iterations are independent, so the number ending in
    one iteration is close to Poisson with mean ``a = n / cycle`` (a superposition of many
    renewal processes tends to Poisson: Palm-Khintchine, Khintchine, 'Mathematical Methods in
    the Theory of Queueing', 1960, ch. 5), and a request sees Poisson(``a``) others sent with
    it (Palm: the arrivals an arrival sees are distributed as the time average). They arrive
    at an iteration's end, so they wait for no running iteration: the next iteration (of
    prompts alone, where the engine does not mix) carries them.

    Mixing (vLLM V1, TensorRT-LLM): a cycle is ``chunks`` prompt iterations and ``O - 1``
    decode iterations; a share ``1 - exp(-a)`` of iterations (at least ``a P / B`` where the
    budget ``B`` binds) carries prompts, ``a P`` tokens per iteration on average, and a TPOT
    averages over them. Not mixing (SGLang): a decode iteration ends ``a = n / (O - 1)``
    requests on average, and with probability ``1 - exp(-a)`` a prefill of the prompts sent
    then follows before the next decode step: it stalls every decoding request. A request's
    own prefill carries its prompt and the ``a P`` tokens sent with it, over as many
    budget-sized iterations as they take (the ones ahead of it in the queue, half of them
    on average, before its own).

    A new request reaches the scheduler ``request_overhead_s`` after the iteration that
    completed its predecessor (the client reads the last token and sends the next request,
    which crosses the HTTP server and the tokenizer): it lands inside an iteration that
    started without it and waits for its rest (``_serving_landing.landing_wait_s``), as in the
    simulator. Prompt lengths that vary with equal outputs leave the requests prefilled
    together ending together, so only the output's spread selects this form (on an engine that mixes, such groups split unevenly over the budget's
    iterations, which neither form prices).
    """
    col = as_columns(concurrency)
    prompt, output = col(policy.prompt_tokens), col(policy.output_tokens)
    decode_steps = np.maximum(output - 1.0, 1.0)
    batches = _desynchronized_prompt_batches(
        cost=cost,
        policy=policy,
        running=running,
        budget_left=budget_left,
        prompt=prompt,
        decode_steps=decode_steps,
    )
    tpot, step_spread = _desynchronized_tpot(
        cost=cost, policy=policy, col=col, running=running, batches=batches, decode_s=decode_s
    )
    landing = landing_wait_s(
        overhead_s=policy.request_overhead_s,
        mixed=policy.mixed_prefill_decode,
        coupled_ranks=col(policy.coupled_ranks),
        prompt_iterations_per_step=batches.with_prompts * batches.batch_iterations,
        prefill_iteration_s=batches.coupled_iteration_s,
        decode_s=decode_s,
    )
    held_s = batches.own_s + (output - 1.0) * tpot  # a request holds its slot
    cycle_s = policy.request_overhead_s + landing + held_s  # a client's cycle
    rate = np.minimum(concurrency / cycle_s, running / held_s)
    admission_wait = (concurrency - running) / rate
    ttft = policy.request_overhead_s + landing + batches.own_s + admission_wait
    return LoadTimes(
        ttft,
        tpot,
        ttft + (output - 1.0) * tpot,
        rate,
        running,
        tpot_spread_s=step_spread / np.sqrt(decode_steps),
        ttft_spread_s=_desynchronized_ttft_spread(policy=policy, batches=batches),
    )


@dataclass(frozen=True)
class _PromptBatches:
    """The prompts sent together in a desynchronized closed loop, per row."""

    sent: np.ndarray  # requests sent per (decode) iteration, on average
    with_prompts: np.ndarray  # share of iterations after which any prompt is sent
    batch_s: np.ndarray  # the prefill of the prompts sent after one iteration, all iterations
    batch_iterations: np.ndarray  # budget-sized iterations that prefill takes
    own_s: np.ndarray  # a request's own prefill, the ones ahead of it included
    #: an iteration in which some of the coupled ranks prefill: it lasts the fullest rank's batch
    coupled_iteration_s: np.ndarray


def _drawn_prompts(policy: LoadPolicy, *, prompts, prompt, ranks, budget) -> dict:
    """The arguments of ``_serving_prompts.prompt_iteration_s`` for ``prompts`` Poisson prompts
    per rank of ``prompt`` tokens on average, spread as the policy's prompt lengths."""
    return {
        "prompts": prompts,
        "prompt_tokens": prompt,
        "prompt_cv": policy.prompt_tokens_cv,
        "ranks": ranks,
        "budget": budget,
    }


def _desynchronized_prompt_batches(
    *, cost: IterationCost, policy: LoadPolicy, running, budget_left, prompt, decode_steps
) -> _PromptBatches:
    """The Poisson batches of prompts sent together and a request's own prefill
    (``_desynchronized_closed_loop``)."""
    mixed = policy.mixed_prefill_decode
    chunks = np.ceil(prompt / budget_left) if policy.chunked_prefill else np.ones_like(prompt)
    sent = running / (decode_steps + (chunks if mixed else 0.0))  # per (decode) iteration
    with_prompts = np.maximum(1.0 - np.exp(-sent), 1e-9)
    batch_tokens = sent * prompt / with_prompts  # prompt tokens after an iteration that sent any
    batch_iterations = np.maximum(batch_tokens / budget_left, 1.0)
    decodes = running if mixed else np.zeros_like(running)
    batch_s = batch_iterations * cost.seconds(
        np.maximum(decodes - sent / with_prompts, 0.0), np.minimum(batch_tokens, budget_left)
    )
    # a rank sends prompts after a share of its iterations; not mixing, never right after its
    # own prefill, which ran no decode to complete a request
    busy = with_prompts if mixed else with_prompts / (1.0 + with_prompts)
    drawn = _drawn_prompts(
        policy, prompts=sent, prompt=prompt, ranks=policy.coupled_ranks, budget=budget_left
    )
    drawn["busy"] = busy
    coupled_iteration_s = prompt_iteration_s(
        cost, decodes=np.maximum(decodes - sent / with_prompts, 0.0), **drawn
    )
    # a request's own prefill: its prompt and the ones sent with it, beside the coupled ranks'
    own_s = np.maximum(prompt * (1.0 + sent / 2.0) / budget_left, 1.0) * prompt_iteration_s(
        cost, decodes=np.maximum(decodes - 1.0 - sent, 0.0), own=True, **drawn
    )
    return _PromptBatches(
        sent=sent,
        with_prompts=with_prompts,
        batch_s=batch_s,
        batch_iterations=batch_iterations,
        own_s=own_s,
        coupled_iteration_s=coupled_iteration_s,
    )


def _desynchronized_ttft_spread(*, policy: LoadPolicy, batches: _PromptBatches) -> np.ndarray:
    """Standard deviation of the TTFT of a desynchronized closed loop."""
    sent = batches.sent
    # own prompt (spread cv) plus Poisson(a) others: Var = P^2 (cv^2 + a (1 + cv^2)), taken
    # proportional to the prefill's time (an upper bound: the pass's fixed part does not vary)
    cv2 = policy.prompt_tokens_cv**2
    return batches.own_s * np.sqrt(cv2 + sent * (1.0 + cv2)) / (1.0 + sent)


def _desynchronized_tpot(
    *,
    cost: IterationCost,
    policy: LoadPolicy,
    col,
    running,
    batches: _PromptBatches,
    decode_s,
) -> tuple[np.ndarray, np.ndarray]:
    """(mean TPOT, spread of one decode step) where prompt batches interleave with the decodes
    (``_desynchronized_closed_loop``)."""
    with_prompts, batch_s = batches.with_prompts, batches.batch_s
    batch_iterations = batches.batch_iterations
    share = with_prompts * batch_iterations  # prompt iterations per decode step
    # a prompt iteration lasts the fullest coupled rank's (this rank's own batch when alone)
    prefill_iteration_s = batches.coupled_iteration_s
    decode_s = _coupled_decode_s(
        cost=cost,
        policy=policy,
        col=col,
        decodes=running,
        own_share=with_prompts,
        prefill_iteration_s=prefill_iteration_s,
        decode_s=decode_s,
    )
    if policy.mixed_prefill_decode:
        share = np.minimum(share, 1.0)
        tpot = share * prefill_iteration_s + (1.0 - share) * decode_s
        step_spread = np.sqrt(share * (1.0 - share)) * np.abs(prefill_iteration_s - decode_s)
    else:
        tpot = decode_s + share * prefill_iteration_s
        step_spread = np.sqrt(with_prompts * (1.0 - with_prompts)) * batch_s
    return tpot, step_spread
