"""``estimate_inference_table``: the passes of ``_inference_passes`` priced under a serving load.

Colocated rows (phase ``both``) run iteration-level continuous batching with chunked prefill
(``_serving_load``): their iteration cost is the pass time of ``_inference_passes`` at the
iteration's token count (``iteration_cost``), and TTFT / TPOT / end-to-end latency come from the
load the workload states — ``concurrency`` (closed loop), ``request_rate_per_s`` (open loop,
Poisson) — or, with neither, the largest concurrency per replica whose p90 TTFT and p90 TPOT meet
the SLOs and whose KV cache fits (the engine's admission at its default memory fraction,
``_engine_admits``; ``_largest_meeting_slos``: each row bisects ``CONCURRENCY_GRID`` with the closed
form alone; the cost model's passes are priced once, on a token grid). A row's ``batch_size`` > 0
fixes the requests each micro-batch holds (closed loop at that load).

Pool rows of a disaggregated deployment (phase ``prefill`` / ``decode``) keep the pass model:
a prefill pool's pass over its batch of prompts, a decode pool's step at its batch; their
queueing and the KV transfer are priced per deployment (``_serving``).

Extra output columns over those of ``_inference_passes`` and ``_inference_memory``: ``ttft_p90_s``,
``ttft_p99_s``, ``tpot_p90_s``, ``tpot_p99_s``, ``e2e_s`` (means over requests where not a
percentile; NaN where the phase has none), ``concurrency`` (requests in flight over the layout's
replicas), ``requests_per_s`` and ``running_cap`` (sequences per micro-batch one replica's engine
admits at once, the cap a launch sets: ``batch_size`` but under a request rate, where that is
the mean in flight and the engine admits what its KV pool holds).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

import numpy as np

from cost_model import _inference_ops as ops
from cost_model._engine_paths import attention_replicas
from cost_model._inference_comm import _experts_span_replicas
from cost_model._inference_iteration import iteration_cost
from cost_model._inference_memory import _memory_parts, _pass_memory
from cost_model._inference_passes import _Timing, _timing
from cost_model._inference_setup import _Setup, _setup
from cost_model._model_spec import ModelSpec
from cost_model._options import EstimateOptions
from cost_model._reasons import REASON_CODES, memory_reason
from cost_model._rows import distinct_rows
from cost_model._serving_columns import PHASE_CODES
from cost_model._serving_load import LoadTimes, closed_loop
from cost_model._serving_open_loop import open_loop
from cost_model._serving_replica import IterationCost, LoadPolicy
from cost_model._table import select_rows, table_length
from cost_model._workload import Inference

#: Config columns no inference formula reads (``_inference_setup`` reads the mesh, the virtual
#: stages, attention data parallelism and ``_serving_columns.INFERENCE_COLUMNS``).
TRAINING_ONLY_COLUMNS = frozenset(
    {"recompute", "zero_stage", "micro_batch_size", "sequence_parallel", "pipeline_schedule"}
)
#: Requests in flight per replica tried when the SLOs choose the load (2x apart).
CONCURRENCY_GRID = 2.0 ** np.arange(13)


def _fits(s: _Setup) -> np.ndarray:
    """Sequences per micro-batch the memory holds (memory is affine in the batch), >= 0."""
    ones = np.ones(s.phase.shape[0])
    first, second = (
        sum(_memory_parts(s, ones).values()),
        sum(_memory_parts(s, 2 * ones).values()),
    )
    per_sequence = second - first
    return np.maximum(
        np.floor((s.cluster.memory_per_device_bytes - (first - per_sequence)) / per_sequence),
        0.0,
    )


def sizing_pass_bytes(s: _Setup) -> np.ndarray:
    """Peak activation and transient buffer memory per device, bytes (n,), of the forward pass
    the engine profiles before it sizes its KV pool (``ServingProfile.kv_sizing_pass``), which
    the pool loses; 0 for an engine that profiles none (SGLang).

    The pass runs the engine's token budget per replica (``max_batched_tokens``: vLLM
    ``max_num_batched_tokens``, TensorRT-LLM ``max_num_tokens``) as a prefill of fresh
    sequences, vLLM's split over ``min(budget, max_num_seqs)`` dummy requests, TensorRT-LLM's
    over requests of the model's whole context, one sampled token each; its memory is the
    inference path's own activation sizing (``_inference_memory._pass_memory``: hidden states, the
    attention's inputs and outputs, the MoE layer's intermediate buffers, held for at most
    ``moe_chunk_tokens`` tokens, the logits of the sampled tokens, the tensor-parallel
    all-reduce buffers). vLLM ``gpu_worker.determine_available_memory`` / V0
    ``worker.determine_num_available_blocks``; TensorRT-LLM ``_torch/pyexecutor/_util.py``."""
    profile, n = s.profile, s.phase.shape[0]
    if profile.kv_sizing_pass == "none":
        return np.zeros(n)
    budget = s.token_budget
    if profile.kv_sizing_pass == "running_cap":
        sequences = min(budget, float(profile.max_running_requests))
    else:
        sequences = np.ceil(budget / min(budget, float(s.model.max_context_tokens)))
    dummy = ops.Pass(
        np.full(n, sequences), np.full(n, budget / sequences), np.zeros(n), np.ones(n), False
    )
    activations, buffers = _pass_memory(s, dummy, moe_chunk_tokens=profile.moe_chunk_tokens)
    return activations + buffers


def _engine_admits(s: _Setup) -> np.ndarray:
    """Requests one replica's engine runs at once at its default memory settings (>= 1).

    The engine's KV pool is ``f`` of the device memory less the weights and the peak memory of
    the pass it profiles (``sizing_pass_bytes``; ``kv_memory_of == "total"``: vLLM
    ``gpu_memory_utilization``; SGLang ``mem_fraction_static``, which profiles none and leaves
    the rest of the device to activations), or ``f`` of what those leave (``"free"``:
    TensorRT-LLM ``free_gpu_memory_fraction``). A request is admitted while the pool holds, for
    every running request, its prompt and the share of its output tokens its engine reserves
    (``admission_output_share`` of at most ``admission_output_clip``: all of them for
    TensorRT-LLM's GUARANTEED_NO_EVICT, SGLang's decayed new-token ratio). Each device holds its
    stage's layers of every request of the replica, so the count is per replica. The engine's
    own default cap on running requests (``ServingProfile.running_cap``: vLLM ``max_num_seqs``,
    TensorRT-LLM ``max_batch_size``, SGLang ``max_running_requests``) bounds it too."""
    profile, ones = s.profile, np.ones(s.phase.shape[0])
    others = _memory_parts(s, ones)["weights"] + sizing_pass_bytes(s)
    capacity = s.cluster.memory_per_device_bytes
    fraction = profile.memory_fraction(
        s.column("tp"),
        memory_bytes=capacity,
        pp=s.column("pp"),
        budget=s.token_budget,
        device_name=s.hardware.name,
        attention_dp=s.attention_dp,
    )
    pool = (
        fraction * capacity - others
        if profile.kv_memory_of == "total"
        else fraction * (capacity - others)
    )
    cached = np.floor(s.prompt_tokens * s.workload.prefix_cache_hit_rate)
    reserved = (
        s.prompt_tokens
        - cached
        + profile.admission_output_share
        * np.minimum(s.output_tokens, profile.admission_output_clip)
    )
    per_layer = ops.kv_bytes_per_sequence_layer(
        s.model,
        reserved,
        s.kv_element_bytes,
        block_tokens=s.workload.kv_block_tokens,
        window_ratio=profile.window_kv_ratio(s.model.architecture),
    )
    kv_fraction = 1.0 / (ops.kv_head_split(s.model, s.shard) * s.column("cp"))
    layers = np.max(np.reshape(s.layout.layers, (-1, ones.size)), axis=0)
    per_request = layers * per_layer * kv_fraction
    held = np.floor(np.maximum(pool, 0.0) / per_request)
    cap = profile.running_cap(
        device_name=s.hardware.name,
        memory_bytes=capacity,
        pool_tokens=held * reserved,
        context_tokens=float(s.model.max_context_tokens),
    )
    return np.maximum(np.minimum(held, cap), 1.0)


def _policy(s: _Setup, max_running: np.ndarray) -> LoadPolicy:
    cached = np.floor(s.prompt_tokens * s.workload.prefix_cache_hit_rate)
    budget = s.token_budget
    return LoadPolicy(
        s.prompt_tokens - cached,
        s.output_tokens,
        max_running,
        float(budget),
        s.profile.request_overhead_s,
        s.profile.chunked_prefill,
        s.profile.mixed_prefill_decode,
        s.workload.output_tokens_cv,
        s.workload.prompt_tokens_cv,
        _coupled_ranks(s),
        s.profile.graphs_need_equal_batches,
    )


def _coupled_ranks(s: _Setup) -> np.ndarray:
    """Attention replicas of each row's instance that iterate together, (n,): SGLang's and
    TensorRT-LLM's data-parallel attention ranks (``_serving_coupling.DP_ATTENTION_COUPLING``,
    ``TRTLLM_ATTENTION_DP_COUPLING``), vLLM's data-parallel ranks whose experts span them
    (``_serving_coupling.VLLM_DP_EP_COUPLING``: the expert group's ``ep x etp`` ranks over one
    replica's ``cp x`` attention shard), 1 elsewhere (vLLM's replicas with their own experts, and
    every replica without attention data parallel, iterates alone here)."""
    ones = np.ones(s.phase.shape[0])
    if s.profile.engine == "vllm":
        if s.model.moe is None:
            return ones
        spanned = s.column("ep") * s.column("etp") / (s.column("cp") * s.shard)
        return np.where(_experts_span_replicas(s), np.maximum(spanned, 1.0), ones)
    if s.profile.engine not in ("sglang", "trtllm"):
        return ones
    replicas = attention_replicas(
        tp=s.column("tp"),
        ep=s.column("ep"),
        etp=s.column("etp"),
        attention_data_parallel=s.attention_dp,
    )
    return np.asarray(replicas, dtype=np.float64)


def _slo_met(s: _Setup, times: LoadTimes) -> np.ndarray:
    """p90 TTFT and p90 TPOT within the workload's SLOs (True where none is set)."""
    w, ok = s.workload, np.ones(np.shape(times.ttft_s), dtype=bool)
    if w.ttft_slo_s is not None:
        ok &= times.quantile("ttft", 0.9) <= w.ttft_slo_s
    if w.tpot_slo_s is not None:
        ok &= times.quantile("tpot", 0.9) <= w.tpot_slo_s
    return ok


def _colocated_load(s: _Setup, cost: IterationCost) -> tuple[np.ndarray, LoadTimes, np.ndarray]:
    """Requests in flight per replica, the load times of each row (phase ``both``) and the
    requests one replica's engine runs at once (the row's batch, else what its default KV pool
    holds: ``_engine_admits``; the rest wait)."""
    w, pp, given = s.workload, s.column("pp"), s.column("batch_size")
    max_running = np.where(given > 0, given * pp, _engine_admits(s))
    policy = _policy(s, max_running)
    if w.request_rate_per_s is not None:
        times = open_loop(
            cost=cost,
            policy=policy,
            request_rate_per_s=np.full(pp.shape, w.request_rate_per_s) / s.replicas,
        )
        return np.minimum(times.running, max_running), times, max_running
    if w.concurrency is not None:
        concurrency = np.full(pp.shape, w.concurrency / s.replicas)
    elif (w.ttft_slo_s is None and w.tpot_slo_s is None) or np.all(given > 0):
        concurrency = max_running
    else:
        scan = partial(_largest_meeting_slos, s)  # once per group of alike rows
        concurrency = np.where(
            given > 0,
            max_running,
            s.rows.evaluate(scan, cost=cost, policy=policy, max_running=max_running),
        )
    times = closed_loop(cost=cost, policy=policy, concurrency=concurrency)
    return concurrency, times, max_running


def _largest_meeting_slos(
    s: _Setup, cost: IterationCost, policy: LoadPolicy, max_running: np.ndarray
) -> np.ndarray:
    """The largest concurrency per replica of ``CONCURRENCY_GRID`` (capped by the cache) whose
    p90 TTFT and TPOT meet the SLOs, refined once by the geometric midpoint to the next grid
    point; 1 where none does. Both times rise with the load, so each row bisects the grid's
    indices (four evaluations of the closed form, no cost-model pass)."""
    rows = np.arange(max_running.shape[0])
    grid = np.minimum(CONCURRENCY_GRID[None, :], max_running[:, None])

    def meets(concurrency: np.ndarray) -> np.ndarray:
        return _slo_met(s, closed_loop(cost=cost, policy=policy, concurrency=concurrency))

    low, high = (
        np.zeros(rows.shape, dtype=np.int64),
        np.full(rows.shape, grid.shape[1] - 1),
    )
    while np.any(low < high):
        middle = (low + high + 1) // 2
        ok = meets(grid[rows, middle])
        low, high = np.where(ok, middle, low), np.where(ok, high, middle - 1)
    chosen, following = (
        grid[rows, low],
        grid[rows, np.minimum(low + 1, grid.shape[1] - 1)],
    )
    between = np.floor(np.sqrt(chosen * following))
    return np.where((between > chosen) & meets(between), between, chosen)


def _pool_batch(s: _Setup, fits: np.ndarray) -> np.ndarray:
    """Sequences per micro-batch of a pool row: the column if > 0, else what ``concurrency``
    needs, else the largest that memory holds and, by bisection, meets the TPOT SLO (a decode
    pool) or TTFT SLO (a prefill pool) of its pass."""
    n, w, given = s.phase.shape[0], s.workload, s.column("batch_size")
    if w.concurrency is not None:
        return np.where(given > 0, given, np.ceil(w.concurrency / (s.replicas * s.column("pp"))))
    batch = np.where(given > 0, given, np.maximum(fits, 1.0))
    searching = (given == 0) & (fits > 1) & (s.phase != PHASE_CODES["both"])
    if (w.ttft_slo_s is None and w.tpot_slo_s is None) or not searching.any():
        return batch
    low, high = np.ones(n), np.where(searching, fits, 1.0)
    while np.any(low < high):
        middle = np.floor((low + high + 1) / 2)
        ok = np.logical_and(*_pass_slo_ok(s, _timing(s, middle)))
        low, high = np.where(ok, middle, low), np.where(ok, high, middle - 1)
    return np.where(searching, low, batch)


#: Quantile of the TTFT a pool's SLO bounds, as for colocated rows (``_largest_meeting_slos``).
POOL_SLO_QUANTILE = 0.9


def prefill_pool_ttft_quantile_s(pass_s, *, utilization, overhead_s: float, p: float):
    """The p-quantile of a prefill pool's TTFT (before the KV transfer and the decode pool's
    admission): the engine's per-request overhead, the wait for the pass running when the
    request arrives, then its own pass. Passes run back to back at ``utilization`` (the share
    of time the pool is busy; 1 at the rate a unit is counted for), and a request arrives at a
    uniformly random point of the running pass, so its wait is uniform on [0, utilization x
    pass] (the residual of a deterministic service; DistServe, Zhong et al. OSDI'24, sec. 4.1,
    prices the prefill queue of a batching pool the same way) and its p-quantile is
    p x utilization x pass. ``_serving.DisaggregatedSplit`` takes the mean, half a pass."""
    return overhead_s + (1.0 + p * np.asarray(utilization)) * np.asarray(pass_s)


def _pass_slo_ok(s: _Setup, timing: _Timing) -> tuple[np.ndarray, np.ndarray]:
    """(TTFT, TPOT) within the SLOs for a pool's pass; a phase without one passes. A prefill
    pool's p90 TTFT is taken at the rate its throughput is counted for: every unit busy, so a
    request also waits for the pass running when it arrives (``prefill_pool_ttft_quantile_s``)."""
    w = s.workload
    ttft = prefill_pool_ttft_quantile_s(
        timing.prefill_s,
        utilization=1.0,
        overhead_s=s.profile.request_overhead_s,
        p=POOL_SLO_QUANTILE,
    )
    ttft_ok = (s.phase == PHASE_CODES["decode"]) | (ttft <= (w.ttft_slo_s or np.inf))
    tpot_ok = (s.phase == PHASE_CODES["prefill"]) | (timing.step_s <= (w.tpot_slo_s or np.inf))
    return ttft_ok, tpot_ok


def estimate_inference_table(
    *,
    model: ModelSpec,
    cluster,
    workload: Inference,
    table: Mapping[str, np.ndarray],
    options: EstimateOptions | None = None,
    prompt_tokens=None,
) -> dict[str, np.ndarray]:
    """Inference cost of every row of ``table`` (columns in the docstrings of ``_inference_setup``,
    ``_inference_passes``, ``_inference_memory`` and this module). ``options`` supplies the
    calibration (default: the shipped one for the device) and the fragmentation reserve.
    ``prompt_tokens``, an array over rows, overrides ``workload.prompt_tokens`` (sequence sweeps).
    Rows are not checked against the model's rules here (``check_parallel_config`` does that).

    Rows that differ only in ``TRAINING_ONLY_COLUMNS`` are priced once (every formula here is
    row by row, so each row's result is the one it would have alone)."""
    priced = partial(_estimate_rows, model=model, cluster=cluster, workload=workload)
    first, inverse = _inference_layouts(table, prompt_tokens)
    if 2 * first.size > inverse.size:
        return priced(table=table, options=options, prompt_tokens=prompt_tokens)
    if prompt_tokens is not None and np.ndim(prompt_tokens) > 0:
        prompt_tokens = np.asarray(prompt_tokens)[first]
    columns = priced(table=select_rows(table, first), options=options, prompt_tokens=prompt_tokens)
    return {name: np.take(value, inverse) for name, value in columns.items()}


def _inference_layouts(
    table: Mapping[str, np.ndarray], prompt_tokens
) -> tuple[np.ndarray, np.ndarray]:
    """``_rows.distinct_rows`` of ``table`` over every column but ``TRAINING_ONLY_COLUMNS``
    (and over ``prompt_tokens`` where it is an array over rows)."""
    size = table_length(table)
    if size < 2:
        return np.arange(size), np.arange(size)
    values = [
        np.asarray(column) for name, column in table.items() if name not in TRAINING_ONLY_COLUMNS
    ]
    if prompt_tokens is not None and np.ndim(prompt_tokens) > 0:
        values.append(np.asarray(prompt_tokens))
    if any(value.shape != (size,) for value in values):
        return np.arange(size), np.arange(size)
    return distinct_rows(values, size=size)


def _estimate_rows(
    *,
    model: ModelSpec,
    cluster,
    workload: Inference,
    table: Mapping[str, np.ndarray],
    options: EstimateOptions | None,
    prompt_tokens,
) -> dict[str, np.ndarray]:
    """``estimate_inference_table`` on every row of ``table``."""
    s = _setup(
        model=model,
        cluster=cluster,
        workload=workload,
        table=table,
        options=options or EstimateOptions(),
        prompt_tokens=prompt_tokens,
    )
    fits = _fits(s)
    is_both = s.phase == PHASE_CODES["both"]
    batch = _pool_batch(s, fits)
    load, concurrency, cap = None, None, batch
    if is_both.any():
        concurrency, load, max_running = _colocated_load(s, iteration_cost(s))
        cap = np.where(is_both, np.ceil(max_running / s.column("pp")), batch)
        # what the engine runs at once: the clients in flight, no more than it admits (the rest
        # wait, ``_colocated_load``) nor than the memory holds
        running = np.minimum(concurrency, max_running)
        batch = np.where(
            is_both,
            np.ceil(np.minimum(running, np.maximum(fits, 1.0) * s.column("pp")) / s.column("pp")),
            batch,
        )
        batch = np.where(is_both & (s.column("batch_size") > 0), s.column("batch_size"), batch)
    timing = _timing(s, batch)
    memory = _memory_parts(s, batch)
    columns = _columns(
        s, batch=batch, timing=timing, memory=memory, load=load, concurrency=concurrency
    )
    # the batch cap an engine's launch sets: under a request rate the requests in flight
    # (``batch_size``) are a mean, and the engine admits up to what it holds
    columns["running_cap"] = np.where(
        is_both & (workload.request_rate_per_s is not None), cap, batch
    ).astype(np.int64)
    ttft_ok, tpot_ok = _pass_slo_ok(s, timing)
    if load is not None:
        ttft_ok = np.where(
            is_both,
            load.quantile("ttft", 0.9) <= (workload.ttft_slo_s or np.inf),
            ttft_ok,
        )
        tpot_ok = np.where(
            is_both,
            load.quantile("tpot", 0.9) <= (workload.tpot_slo_s or np.inf),
            tpot_ok,
        )
    capacity = s.cluster.memory_per_device_bytes
    reason = memory_reason(memory=memory, capacity_bytes=capacity)
    slo = np.where(
        ~ttft_ok,
        REASON_CODES["ttft_slo"],
        np.where(~tpot_ok, REASON_CODES["tpot_slo"], REASON_CODES["feasible"]),
    )
    reason = np.where(reason != 0, reason, slo)
    columns.update(
        memory_capacity_bytes=np.full(batch.shape, float(capacity)),
        feasible=reason == REASON_CODES["feasible"],
        reason=reason.astype(np.int64),
    )
    return columns


def _columns(
    s: _Setup, *, batch, timing: _Timing, memory, load: LoadTimes | None, concurrency
) -> dict[str, np.ndarray]:
    """Time, memory, latency and throughput columns of every row."""
    is_both, is_prefill, is_decode = (
        s.phase == PHASE_CODES[name] for name in ("both", "prefill", "decode")
    )
    ranks, replicas = s.stage_ranks, s.replicas
    prefill_rate = batch * s.prompt_tokens * replicas / (timing.prefill_s * ranks)
    decode_rate = batch * replicas / (timing.decode_s * ranks)
    nan = np.full(batch.shape, np.nan)
    ttft = np.where(is_decode, np.nan, timing.prefill_s)
    tpot = np.where(is_prefill, np.nan, timing.step_s)
    tokens = np.where(is_prefill, prefill_rate, batch * replicas / (timing.step_s * ranks))
    extra = {
        "ttft_p90_s": ttft,
        "ttft_p99_s": ttft,
        "tpot_p90_s": tpot,
        "tpot_p99_s": tpot,
        "e2e_s": nan,
    }
    in_flight = batch * s.column("pp") * replicas
    requests = np.where(
        is_prefill,
        prefill_rate * ranks / s.prompt_tokens,
        np.where(is_decode, tokens * ranks / s.output_tokens, nan),
    )
    if load is not None:
        ttft, tpot = (
            np.where(is_both, load.ttft_s, ttft),
            np.where(is_both, load.tpot_s, tpot),
        )
        devices = ranks * s.column("pp")  # a replica spans every pipeline stage
        tokens = np.where(
            is_both, load.requests_per_s * s.output_tokens * replicas / devices, tokens
        )
        for p, name in ((0.9, "p90"), (0.99, "p99")):
            extra[f"ttft_{name}_s"] = np.where(
                is_both, load.quantile("ttft", p), extra[f"ttft_{name}_s"]
            )
            extra[f"tpot_{name}_s"] = np.where(
                is_both, load.quantile("tpot", p), extra[f"tpot_{name}_s"]
            )
        extra["e2e_s"] = np.where(is_both, load.e2e_s, nan)
        in_flight = np.where(is_both, concurrency * replicas, in_flight)
        requests = np.where(is_both, load.requests_per_s * replicas, requests)
    columns = {f"time.{k}": v for k, v in timing.time.items()}
    columns.update({f"hidden.{k}": v for k, v in timing.hidden.items()})
    columns.update({f"memory.{k}": v for k, v in memory.items()})
    columns.update(
        step_time_s=timing.step_s,
        ttft_s=ttft,
        tpot_s=tpot,
        tokens_per_s_per_device=tokens,
        prefill_tokens_per_s_per_device=prefill_rate,
        decode_tokens_per_s_per_device=decode_rate,
        batch_size=batch.astype(np.int64),
        memory_per_device_bytes=sum(memory.values()),
        concurrency=in_flight,
        requests_per_s=requests,
        **extra,
    )
    return columns


def serving_inputs(
    *,
    model: ModelSpec,
    cluster,
    workload: Inference,
    table: Mapping[str, np.ndarray],
    options: EstimateOptions | None = None,
) -> tuple[IterationCost, LoadPolicy, np.ndarray]:
    """What the closed form and the simulator share for each row: the iteration cost, the
    admission policy of one replica (``max_running`` from the memory, or the row's batch) and
    the number of replicas the load spreads over."""
    s = _setup(
        model=model,
        cluster=cluster,
        workload=workload,
        table=table,
        options=options or EstimateOptions(),
    )
    given, pp = s.column("batch_size"), s.column("pp")
    max_running = np.where(given > 0, given * pp, _engine_admits(s))
    return iteration_cost(s), _policy(s, max_running), s.replicas
