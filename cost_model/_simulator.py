"""Iteration-level discrete-event simulator of one serving replica (continuous batching).

It runs the policy ``_serving_load`` prices in closed form, request by request and iteration
by iteration, with the same iteration cost (``IterationCost``): what it adds is the dynamics
the closed form averages away — bursts of arrivals, the order of prompts in the queue, a
request's iterations mixing different prefill loads, admission stalls.

Policy (vLLM V1 scheduler, SGLang's with chunked prefill, TensorRT-LLM's in-flight batching;
Yu et al., Orca, OSDI'22; Kwon et al., vLLM, SOSP'23; Agrawal et al., Sarathi-Serve, OSDI'24):
each iteration first runs one token of every decoding request, then fills the rest of the
``max_batched_tokens`` budget with prompt chunks of waiting requests in arrival order; a
waiting request is admitted (its KV blocks taken) while fewer than ``max_running`` requests hold
the cache. The engine's defaults (``LoadPolicy``, from ``data/serving_profiles.json``) change
two things: an engine that does not mix prefill and decode (SGLang without
``--enable-mixed-chunk``) runs an iteration of prompts alone, with the whole budget, whenever
one is waiting, and the decodes wait for it; an engine without chunked prefill (TensorRT-LLM's
default) takes whole prompts only, one longer than the budget alone. A request's first token
comes at the end of the iteration that finishes its prompt; its remaining ``O - 1`` tokens
take one decoding iteration each. TTFT, TPOT (``(e2e - ttft) / (O - 1)``,
as ``vllm bench serve`` and ``sglang.bench_serving`` report it) and the end-to-end latency add
the engine's per-request overhead. Load is closed-loop (``concurrency`` clients, each sending
its next request when the previous completes: it reaches the scheduler ``request_overhead_s``
after that request's last iteration, inside an iteration that started without it, and waits
for its end, ``_serving_landing``) or open-loop (Poisson ``request_rate_per_s``),
as in Vidur (Agrawal et al., MLSys'24) and DistServe's simulator (Zhong et al., OSDI'24).
The data-parallel attention ranks of one SGLang instance, and vLLM's data-parallel ranks whose
experts span them, are simulated together, each with its own scheduler and requests, iterating
as one (``_serving_coupling.DP_ATTENTION_COUPLING``, ``VLLM_DP_EP_COUPLING``).
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from dataclasses import dataclass

import numpy as np

from cost_model._bench_serving import RequestLengths
from cost_model._serving_replica import GRID_TOKENS, IterationCost, LoadPolicy
from cost_model._simulator_load import check_load, check_replay, first_arrivals, per_rank_clients


@dataclass(frozen=True)
class SimulationResult:
    """Per-request times of the requests measured (after the warm-up), and the throughput."""

    ttft_s: np.ndarray
    tpot_s: np.ndarray
    e2e_s: np.ndarray
    requests_per_s: float
    output_tokens_per_s: float
    iterations: int
    simulated_s: float
    #: coupled data-parallel attention ranks simulated (their requests all measured; the
    #: throughputs are per rank)
    ranks: int = 1

    def summary(self) -> dict[str, float]:
        """Mean, p50, p90 and p99 of TTFT, TPOT and end-to-end latency, in seconds."""
        figures: dict[str, float] = {}
        for name, values in (
            ("ttft", self.ttft_s),
            ("tpot", self.tpot_s),
            ("e2e", self.e2e_s),
        ):
            figures[f"{name}_mean_s"] = float(np.mean(values))
            for p in (50, 90, 99):
                figures[f"{name}_p{p}_s"] = float(np.percentile(values, p))
        figures["requests_per_s"] = self.requests_per_s
        figures["output_tokens_per_s"] = self.output_tokens_per_s
        return figures


class _ScalarCost:
    """``IterationCost`` of one row as plain floats (a numpy call per iteration costs more than
    the iteration's bookkeeping)."""

    def __init__(self, cost: IterationCost) -> None:
        self.grid = [float(x) for x in GRID_TOKENS]
        self.linear = [float(y) for y in cost.linear_s[0]]
        self.prefill_linear = [float(y) for y in cost.prefill_linear_s[0]]
        self.decode = float(cost.decode_attention_s[0])
        self.prefill = float(cost.prefill_token_s[0])
        self.floor = float(cost.floor_s[0])
        self.eager_host = 0.0 if cost.eager_host_s is None else float(cost.eager_host_s[0])
        self.graph_max_tokens = (
            float("inf") if cost.graph_max_tokens is None else float(cost.graph_max_tokens[0])
        )
        self.prompt_graph_max_tokens = float(np.asarray(cost.prompt_graph_limit(lambda v: v[0])))
        # An iteration's cost depends on its three arguments only; coupled ranks and long runs
        # repeat the same few, so each is computed once.
        self._seen: dict[tuple[int, int, bool], float] = {}

    def _interpolate(self, values: list[float], tokens: float) -> float:
        upper = min(max(bisect.bisect_left(self.grid, tokens), 1), len(self.grid) - 1)
        x0, x1, y0, y1 = (
            self.grid[upper - 1],
            self.grid[upper],
            values[upper - 1],
            values[upper],
        )
        return y0 + (tokens - x0) * (y1 - y0) / (x1 - x0)

    def __call__(self, decodes: int, prefill_tokens: int, extend_in_batch: bool = False) -> float:
        """``IterationCost.seconds`` of one iteration, in plain floats; ``extend_in_batch``: a
        coupled rank prefills (``DP_ATTENTION_COUPLING``), so no rank replays a decode graph."""
        key = (decodes, prefill_tokens, extend_in_batch)
        seconds = self._seen.get(key)
        if seconds is None:
            seconds = self._seen[key] = self._seconds(decodes, prefill_tokens, extend_in_batch)
        return seconds

    def _seconds(self, decodes: int, prefill_tokens: int, extend_in_batch: bool) -> float:
        linear = self._interpolate(self.linear, max(float(decodes), 1.0))
        tokens = max(float(decodes + prefill_tokens), 1.0)
        if prefill_tokens > 0:
            linear = max(self._interpolate(self.prefill_linear, tokens), linear)
        gpu = linear + self.decode * decodes + self.prefill * prefill_tokens
        extend = prefill_tokens > 0 or extend_in_batch
        limit = self.prompt_graph_max_tokens if extend else self.graph_max_tokens
        if tokens > limit:
            gpu = max(gpu, self.eager_host)  # host-bound eager pass (IterationCost)
        return gpu + self.floor


def _lengths(rng: np.random.Generator, mean: float, cv: float, count: int) -> np.ndarray:
    """Request lengths of the given mean and spread (gamma-distributed when cv > 0), >= 1."""
    if cv <= 0:
        return np.full(count, max(round(mean), 1), dtype=np.int64)
    shape = 1.0 / cv**2
    return np.maximum(np.rint(rng.gamma(shape, mean / shape, count)), 1).astype(np.int64)


class _Requests:
    """Columns of every request issued; lengths are drawn in blocks as requests arrive."""

    def __init__(
        self,
        *,
        rng: np.random.Generator,
        prompt_tokens: float,
        output_tokens: float,
        prompt_cv: float,
        output_cv: float,
        lengths: RequestLengths | None = None,
    ) -> None:
        self.arrival: list[float] = []
        self.first_token: list[float] = []
        self.finish: list[float] = []
        self._draw = lambda count: (
            _lengths(rng, prompt_tokens, prompt_cv, count),
            _lengths(rng, output_tokens, output_cv, count),
        )
        self.fixed = lengths is not None
        if lengths is None:
            self.prompt, self.output = self._draw(4096)
        else:  # a replayed run: its requests' own lengths, less what the prefix cache holds
            self.prompt, self.output = lengths.uncached_prompt_tokens, lengths.output_tokens

    def add(self, arrival: float) -> int:
        """Issue a request arriving at ``arrival``; its id."""
        rid = len(self.arrival)
        if rid >= self.prompt.size and self.fixed:
            raise ValueError(f"request {rid} is beyond the {self.prompt.size} requests replayed")
        if rid >= self.prompt.size:
            more_prompt, more_output = self._draw(self.prompt.size)
            self.prompt, self.output = (
                np.concatenate([self.prompt, more_prompt]),
                np.concatenate([self.output, more_output]),
            )
        self.arrival.append(arrival)
        self.first_token.append(np.nan)
        self.finish.append(np.nan)
        return rid


def simulate(
    *,
    cost: IterationCost,
    policy: LoadPolicy,
    concurrency: int | tuple[int, ...] | None = None,
    request_rate_per_s: float | None = None,
    duration_s: float = 60.0,
    prompt_tokens_cv: float = 0.0,
    output_tokens_cv: float = 0.0,
    warmup_fraction: float = 0.2,
    seed: int = 0,
    num_requests: int | None = None,
    lengths: RequestLengths | None = None,
) -> SimulationResult:
    """Serve ``duration_s`` of traffic on one replica whose iteration costs ``cost`` (one row).

    ``policy`` holds scalars: mean uncached prompt and output tokens, ``max_running``, the token
    budget and the per-request overhead. Requests arriving in the first ``warmup_fraction`` of
    the run are served but not measured (the closed loop starts with all clients at once), nor
    are those finishing after ``duration_s`` (no new request arrives then: the load drains).
    ``num_requests`` runs a benchmark's protocol instead: exactly that many requests (the
    clients start together), all measured, however long they take; ``lengths`` replays that
    run's own requests in sending order (``_bench_serving.RequestLengths``: a prompt's cached
    tokens are not prefilled) instead of drawing them. Where ``policy`` couples
    several data-parallel attention ranks (``coupled_ranks``), each rank gets this load and they
    iterate together (``_run_coupled``); the throughputs stay per rank. A tuple ``concurrency``
    gives each coupled rank its own clients (a router's round robin of fewer clients than a
    multiple of the ranks: some ranks hold one more, some none).
    """
    ranks = _coupled_ranks(policy)
    check_load(
        sum(concurrency) if isinstance(concurrency, tuple) else concurrency,
        request_rate_per_s,
        num_requests,
    )
    per_rank = per_rank_clients(concurrency, ranks)
    if lengths is not None:
        check_replay(lengths, num_requests=num_requests, ranks=ranks)
    engines = _engines(
        policy,
        per_rank=per_rank,
        ranks=ranks,
        closed=concurrency is not None,
        request_rate_per_s=request_rate_per_s,
        duration_s=duration_s,
        cvs=(prompt_tokens_cv, output_tokens_cv),
        seed=seed,
        num_requests=num_requests,
        lengths=lengths,
    )
    scalar_cost = _ScalarCost(cost)
    if len(engines) == 1:
        state = _run(cost=scalar_cost, engine=engines[0])
    else:
        state = _run_coupled(
            cost=scalar_cost,
            engines=engines,
            equal_batches=bool(policy.graphs_need_equal_batches),
        )
    measured: _Requests | _Merged = engines[0].requests if len(engines) == 1 else _merged(engines)
    if num_requests is not None:
        warmup_s, duration_s = 0.0, np.inf
    else:
        warmup_s = warmup_fraction * duration_s
    return _result(
        measured,
        state,
        policy=policy,
        warmup_s=warmup_s,
        duration_s=duration_s,
        ranks=len(engines),
    )


def _engines(
    policy: LoadPolicy,
    *,
    per_rank,
    ranks: int,
    closed: bool,
    request_rate_per_s,
    duration_s: float,
    cvs: tuple[float, float],
    seed: int,
    num_requests: int | None,
    lengths: RequestLengths | None,
) -> list[_Engine]:
    """One scheduler per coupled rank, each with its first arrivals (its clients, or its Poisson
    stream) and its requests' lengths, drawn from one generator seeded ``seed``."""
    rng = np.random.default_rng(seed)
    engines = []
    for rank in range(ranks):
        arrivals = first_arrivals(
            rng,
            concurrency=None if per_rank is None else per_rank[rank],
            request_rate_per_s=request_rate_per_s,
            duration_s=duration_s,
        )
        requests = _Requests(
            rng=rng,
            prompt_tokens=float(np.asarray(policy.prompt_tokens).ravel()[0]),
            output_tokens=float(np.asarray(policy.output_tokens).ravel()[0]),
            prompt_cv=cvs[0],
            output_cv=cvs[1],
            lengths=lengths,
        )
        engines.append(
            _Engine(
                policy=policy,
                requests=requests,
                arrivals=arrivals[:num_requests] if num_requests is not None else arrivals,
                closed=closed,
                duration_s=np.inf if num_requests is not None else duration_s,
                limit=num_requests,
            )
        )
    return engines


def _coupled_ranks(policy: LoadPolicy) -> int:
    """Data-parallel attention ranks the simulation runs together (``DP_ATTENTION_COUPLING``)."""
    return max(int(round(float(np.asarray(policy.coupled_ranks).ravel()[0]))), 1)


class _Merged:
    """The request columns of every rank of a coupled instance, end to end."""

    def __init__(self, requests: list[_Requests]) -> None:
        self.arrival = [x for r in requests for x in r.arrival]
        self.first_token = [x for r in requests for x in r.first_token]
        self.finish = [x for r in requests for x in r.finish]
        self.output = np.concatenate([r.output[: len(r.arrival)] for r in requests])


def _merged(engines: list[_Engine]) -> _Merged:
    return _Merged([engine.requests for engine in engines])


class _Engine:
    """The scheduler state of one replica: the queue, the running requests, the clock."""

    def __init__(
        self,
        *,
        policy: LoadPolicy,
        requests: _Requests,
        arrivals: list,
        closed: bool,
        duration_s: float,
        limit: int | None,
    ) -> None:
        self.budget = int(policy.max_batched_tokens)
        self.chunked, self.mixed = bool(policy.chunked_prefill), bool(policy.mixed_prefill_decode)
        self.max_running = max(int(np.asarray(policy.max_running).ravel()[0]), 1)
        self.requests, self.closed, self.duration_s, self.limit = (
            requests,
            closed,
            duration_s,
            limit,
        )
        self.pending = deque(arrivals)  # arrival times not yet in the queue, in order
        self.waiting: deque[int] = deque()  # request ids whose prompt is not finished, FCFS
        self.remaining: dict[int, int] = {}
        self.admitted: set[int] = set()
        self.finishing: list[tuple[int, int]] = []  # (iteration of the last token, request id)
        self.decoding, self.running, self.now, self.iteration = 0, 0, 0.0, 0
        self.decode_steps = 0  # iterations that ran the decodes (all of them, where mixed)
        self.client_gap_s = float(policy.request_overhead_s)

    def busy(self) -> bool:
        return bool(self.pending or self.waiting or self.decoding)

    def enqueue_arrivals(self, *, jump: bool = True) -> None:
        """Move the requests that have arrived by now into the queue (jump to the next arrival
        when the engine is idle, unless ``jump`` is off: a coupled rank keeps its instance's
        clock)."""
        idle = not self.waiting and not self.decoding
        if jump and idle and self.pending and self.pending[0] > self.now:
            self.now = self.pending[0]
        while self.pending and self.pending[0] <= self.now:
            rid = self.requests.add(self.pending.popleft())
            self.remaining[rid] = int(self.requests.prompt[rid])
            self.waiting.append(rid)

    def schedule_prefill(self) -> tuple[int, list[int]]:
        """Fill the budget (less the decodes, where the engine mixes them in) with prompts in
        arrival order, admitting requests while the cache holds them: chunks of them where
        the engine chunks prefill, else whole prompts (one longer than the budget alone);
        (prompt tokens scheduled, prompts finished)."""
        left = self.budget - (self.decoding if self.mixed else 0)
        scheduled, finished = 0, []
        for rid in self.waiting:
            if left <= 0:
                break
            whole = self.remaining[rid]
            if not self.chunked and whole > left and scheduled > 0:
                break  # an unchunked prompt waits for an iteration with room for all of it
            if rid not in self.admitted:
                if self.running >= self.max_running:
                    break
                self.admitted.add(rid)
                self.running += 1
            chunk = min(whole, left) if self.chunked else whole
            self.remaining[rid] -= chunk
            left -= chunk
            scheduled += chunk
            if self.remaining[rid] == 0:
                finished.append(rid)
        for rid in finished:  # arrival order: the finished prompts are the queue's head
            self.waiting.popleft()
            del self.remaining[rid]
        return scheduled, finished

    def _complete(self, rid: int) -> None:
        self.requests.finish[rid] = self.now
        self.running -= 1
        issued = len(self.requests.arrival) + len(self.pending)
        if (
            self.closed
            and self.now < self.duration_s
            and (self.limit is None or issued < self.limit)
        ):
            self.pending.append(self.now + self.client_gap_s)  # the client's next request

    def retire_finished(self) -> None:
        """Retire the requests whose last token decode step ``decode_steps`` made, at ``now``."""
        while self.finishing and self.finishing[0][0] == self.decode_steps:
            _, rid = heapq.heappop(self.finishing)
            self.decoding -= 1
            self._complete(rid)

    def finish_iteration(self, finished_prompts: list[int], *, decoded: bool) -> None:
        """Retire the requests whose last token this iteration made (if it ran the decodes);
        start decoding the prompts it finished (their first token is now)."""
        if decoded:
            self.decode_steps += 1
            self.retire_finished()
        for rid in finished_prompts:
            self.requests.first_token[rid] = self.now
            outputs = int(self.requests.output[rid])
            if outputs <= 1:
                self._complete(rid)
            else:
                heapq.heappush(self.finishing, (self.decode_steps + outputs - 1, rid))
                self.decoding += 1


def _run(*, cost: _ScalarCost, engine: _Engine) -> dict:
    """Iterate until every request issued is served (or nothing more can run)."""
    while engine.busy():
        engine.enqueue_arrivals()
        prefill_tokens, finished = engine.schedule_prefill()
        if prefill_tokens == 0 and engine.decoding == 0:  # blocked: wait for an arrival
            if not engine.pending:
                break
            engine.now = max(engine.now, engine.pending[0])
            continue
        decoded = engine.mixed or prefill_tokens == 0  # else the decodes wait for the prefill
        step = cost(engine.decoding if decoded else 0, prefill_tokens)
        repeats = _decode_only_repeats(engine, step) if prefill_tokens == 0 else 1
        for _ in range(repeats):  # the same sum, step by step, as one iteration at a time
            engine.now += step
        engine.iteration += repeats
        engine.decode_steps += repeats - 1
        engine.finish_iteration(finished, decoded=decoded)
    return {"iterations": engine.iteration, "now": engine.now}


def _decode_only_repeats(engine: _Engine, step: float) -> int:
    """Identical decode-only iterations (of ``step`` seconds) a replica runs from now before
    anything changes: until the first decoding request's last token, or the iteration that
    starts at or after the next arrival (whose prompt it would schedule). Nothing else changes
    the schedule between them (a waiting prompt the KV pool cannot hold waits for a request to
    finish), so they are run at once."""
    last = engine.finishing[0][0] - engine.decode_steps if engine.finishing else 1
    arrival = engine.pending[0] if engine.pending else float("inf")
    repeats, start = 1, engine.now + step
    while repeats < last and start < arrival:
        start += step
        repeats += 1
    return repeats


def _run_coupled(*, cost: _ScalarCost, engines: list[_Engine], equal_batches: bool = False) -> dict:
    """Iterate the data-parallel attention ranks of one instance together
    (``DP_ATTENTION_COUPLING``): each rank schedules its own batch (prompts alone where the
    engine does not mix them, else its decodes), a rank with nothing to run while another has
    tokens runs an idle batch, no rank replays a decode graph while any rank prefills (nor,
    with ``equal_batches``, while the ranks' batches differ: ``TRTLLM_ATTENTION_DP_COUPLING``),
    and the iteration lasts as long as its slowest rank."""
    now, iterations = 0.0, 0
    while any(engine.busy() for engine in engines):
        if not any(engine.waiting or engine.decoding for engine in engines):
            now = max(now, min(engine.pending[0] for engine in engines if engine.pending))
        batches, quiet = _schedule_ranks(engines, now=now)
        extend_in_batch = any(tokens > 0 for _, tokens, _ in batches)
        if not extend_in_batch and not any(engine.decoding for engine in engines):
            pending = [engine.pending[0] for engine in engines if engine.pending]
            if not pending:
                break
            now = max(now, min(pending))  # blocked: wait for an arrival
            continue
        # a rank without requests runs one dummy request (TRTLLM_ATTENTION_DP_COUPLING)
        graphless = extend_in_batch or (
            equal_batches and len({max(engine.decoding, 1) for engine in engines}) > 1
        )
        now += _slowest_rank_s(cost, batches=batches, quiet=quiet, extend_in_batch=graphless)
        iterations += 1
        _finish_ranks(batches=batches, quiet=quiet, now=now)
    return {"iterations": iterations, "now": now}


_Batch = tuple["_Engine", int, list[int]]  # a rank, the prompt tokens it runs, prompts finished


def _schedule_ranks(engines: list[_Engine], *, now: float) -> tuple[list[_Batch], list[_Engine]]:
    """Queue each rank's arrivals up to ``now`` (in rank order: the ranks draw request lengths
    from one generator) and schedule the prompts of the ranks that have some waiting; (their
    batches, the quiet ranks: nothing waiting, so they run their decodes alone, as
    ``schedule_prefill`` of an empty queue would have them)."""
    batches: list[_Batch] = []
    quiet: list[_Engine] = []
    for engine in engines:
        if engine.pending and engine.pending[0] <= now:
            engine.now = now
            engine.enqueue_arrivals(jump=False)
        if engine.waiting:
            batches.append((engine, *engine.schedule_prefill()))
        else:
            quiet.append(engine)
    return batches, quiet


def _slowest_rank_s(
    cost: _ScalarCost, *, batches: list[_Batch], quiet: list[_Engine], extend_in_batch: bool
) -> float:
    """The longest iteration of any rank, priced once per distinct (decodes, prompt tokens):
    the maximum of the same costs as one per rank (a maximum is exact, whatever the order)."""
    loads = {(engine.decoding, 0) for engine in quiet}
    loads.update(
        (engine.decoding if engine.mixed or tokens == 0 else 0, tokens)
        for engine, tokens, _ in batches
    )
    return max(cost(decodes, tokens, extend_in_batch) for decodes, tokens in loads)


def _finish_ranks(*, batches: list[_Batch], quiet: list[_Engine], now: float) -> None:
    """``finish_iteration`` on every rank at ``now``: a quiet rank ran its decodes and finished
    no prompt, so only its requests whose last token this was retire (the clock of a rank
    that retires none is not read until it next queues or retires a request)."""
    for engine in quiet:
        engine.decode_steps += 1
        finishing = engine.finishing
        if finishing and finishing[0][0] == engine.decode_steps:
            engine.now = now
            engine.retire_finished()
    for engine, tokens, finished in batches:
        engine.now = now
        engine.finish_iteration(finished, decoded=engine.mixed or tokens == 0)


def _result(
    requests: _Requests | _Merged,
    state: dict,
    *,
    policy: LoadPolicy,
    warmup_s: float,
    duration_s: float,
    ranks: int = 1,
) -> SimulationResult:
    arrival = np.asarray(requests.arrival)
    first = np.asarray(requests.first_token)
    finish = np.asarray(requests.finish)
    outputs = requests.output[: arrival.size]
    done = np.isfinite(finish)
    measured = (
        done & (arrival >= warmup_s) & (finish <= duration_s)
    )  # steady state: no start, no drain
    if not measured.any():
        measured = done
    overhead = float(policy.request_overhead_s)
    ttft = first[measured] - arrival[measured] + overhead
    tpot = np.where(
        outputs[measured] > 1,
        (finish[measured] - first[measured]) / np.maximum(outputs[measured] - 1, 1),
        0.0,
    )
    e2e = finish[measured] - arrival[measured] + overhead
    window = max(
        min(duration_s, state["now"]) - warmup_s, 1e-9
    )  # the whole run for a fixed request count
    in_window = done & (finish >= warmup_s) & (finish <= duration_s)
    completed = float(np.count_nonzero(in_window))
    return SimulationResult(
        ttft_s=ttft,
        tpot_s=tpot,
        e2e_s=e2e,
        requests_per_s=completed / window / ranks,
        output_tokens_per_s=float(outputs[in_window].sum()) / window / ranks,
        iterations=int(state["iterations"]),
        simulated_s=float(state["now"]),
        ranks=ranks,
    )
