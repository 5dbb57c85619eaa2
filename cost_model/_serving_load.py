"""Serving under load: TTFT, TPOT and end-to-end latency of continuous batching (closed form).

The policy modelled is iteration-level continuous batching with chunked prefill, as vLLM V1,
SGLang and TensorRT-LLM run it (Yu et al., Orca, OSDI'22: iteration-level scheduling; Kwon et
al., vLLM, SOSP'23: admission by free KV blocks; Agrawal et al., Sarathi-Serve, OSDI'24: a token
budget per iteration, decodes first, the rest filled with prefill chunks; Zheng et al., SGLang,
NeurIPS'24). Every iteration runs one token of each decoding request and at most
``max_batched_tokens - decodes`` prompt tokens of the waiting requests, first come first served;
a request is admitted while the KV cache holds it (``max_running`` per replica). Two defaults
differ by engine (``ServingProfile``, each with its documentation as source): whether prefill
and decode mix in one iteration (vLLM V1 and TensorRT-LLM's in-flight batching do; SGLang runs
a waiting prefill alone, with the whole budget, and the decodes wait for it) and whether a long
prompt is chunked (TensorRT-LLM's default prefills whole prompts).

Each iteration's time is ``IterationCost.seconds(decodes, prefill_tokens)``: the cost model's
pass time at that many tokens (the same function drives the simulator, ``_simulator``), plus the
engine's per-iteration floors (``ServingProfile``).

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
``_admission_wait``) (``open_loop``).

The data-parallel attention ranks of one SGLang instance iterate together
(``DP_ATTENTION_COUPLING``), as do vLLM's data-parallel ranks whose experts span them
(``VLLM_DP_EP_COUPLING``): where their requests drift apart (output lengths that vary, or
Poisson arrivals), a rank's decode iteration lasts another rank's prefill iteration whenever
one of them prefills (``_coupled_decode_s``); lock-step waves of equal requests prefill on
every rank at once, so they stall no further.

Percentiles (open loop): a request's TPOT averages its ``O - 1`` iterations, a share of which
carries prompts; p-quantiles are ``T + z_p σ / sqrt(O - 1)`` (central limit). The TTFT's
queueing part is taken exponential with its mean beyond the zero-wait mass (the M/G/1 tail,
Kingman 1962): quantile ``W / ρ · ln(ρ / (1 - p))`` where ``p > 1 - ρ``; the wait for the
running iteration is uniform over a length-biased iteration. A closed loop of equal requests
runs in lock-step waves, so its percentiles equal its means (the simulator shows the spread
random lengths add); on an engine that prefills without the decodes a wave's prompts finish at
evenly filled positions, and a percentile is the position it falls on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache, cached_property
from importlib import resources
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

Engine = Literal["vllm", "sglang", "trtllm"]
#: Tokens per iteration at which the pass time is priced; between them it is interpolated
#: linearly, beyond the last extrapolated with the last slope.
GRID_TOKENS = np.array([1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0])
#: Standard normal quantiles of the reported percentiles.
Z_SCORES = {0.5: 0.0, 0.9: 1.2815515655446004, 0.99: 2.3263478740408408}
_OPEN_LOOP_STEPS = 24


class ServingProfile(BaseModel):
    """Per-step and per-request floors of one engine (``data/serving_profiles.json``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: Engine
    version: str
    #: release prefixes this profile describes (``"0.7.3"`` matches ``"0.7.3.dev138+g21f6ca217"``)
    releases: tuple[str, ...] = Field(min_length=1)
    #: whether this is the engine's profile when no version is named (its current releases)
    default: bool = False
    kernel_floor_s: float = Field(ge=0)
    #: host seconds of one kernel of an eager pass (no CUDA graph): module code, dispatcher, launch
    eager_kernel_host_s: float = Field(ge=0)
    #: whether an iteration carrying prompt tokens replays a CUDA graph (up to ``graph_max_tokens``)
    prefill_graphs: bool
    #: the largest iteration, in tokens per forward, that replays a CUDA graph
    graph_max_tokens: int = Field(ge=0)
    sampling_s: float = Field(ge=0)
    scheduler_s: float = Field(ge=0)
    request_overhead_s: float = Field(ge=0)
    max_batched_tokens: int = Field(gt=0)
    chunked_prefill: bool
    mixed_prefill_decode: bool
    #: share of the device memory the engine's static pool may take (weights and KV cache:
    #: vLLM ``gpu_memory_utilization``, SGLang ``mem_fraction_static``), or, with
    #: ``kv_memory_of == "free"``, of the memory left after the weights that the KV cache takes
    #: (TensorRT-LLM ``free_gpu_memory_fraction``)
    kv_memory_fraction: float = Field(gt=0, le=1)
    kv_memory_of: Literal["total", "free"]
    #: the engine's default fraction by tensor-parallel size, where it depends on it (SGLang
    #: ``mem_fraction_static``): the value of the largest key <= tp; ``kv_memory_fraction``
    #: below every key or without any
    kv_memory_fraction_by_tp: dict[int, float] = {}
    #: the forward pass the engine profiles before it sizes its KV pool, whose peak activation
    #: memory the pool loses: ``"none"`` (the fraction itself leaves the rest of the device to
    #: activations and graphs: SGLang ``mem_fraction_static``), or a dummy pass of the engine's
    #: token budget split over ``"running_cap"`` sequences (vLLM ``profile_run``:
    #: ``max_num_seqs`` of them, one sampled token each) or over sequences of the model's whole
    #: ``"context"`` (TensorRT-LLM's dummy context requests of ``max_seq_len`` tokens)
    kv_sizing_pass: Literal["none", "running_cap", "context"]
    #: tokens the fused MoE kernel holds intermediate buffers for at once (it loops over chunks
    #: of them: vLLM ``VLLM_FUSED_MOE_CHUNK_SIZE``); None: every token of the pass at once
    moe_chunk_tokens: int | None = Field(default=None, gt=0)
    #: share of a request's output tokens (at most ``admission_output_clip`` of them) that its
    #: admission reserves in the KV cache, beyond its prompt
    admission_output_share: float = Field(ge=0, le=1)
    admission_output_clip: float = Field(gt=0)
    #: the engine's default cap on the requests one instance runs at once (vLLM
    #: ``max_num_seqs``, TensorRT-LLM ``max_batch_size``, SGLang ``max_running_requests``)
    max_running_requests: int = Field(gt=0)
    #: vLLM's smaller default on devices under ``small_device_below_gib`` or named here
    max_running_requests_small_device: int | None = Field(default=None, gt=0)
    small_device_below_gib: float | None = Field(default=None, gt=0)
    small_devices: tuple[str, ...] = ()
    #: SGLang derives its cap from the KV pool: at least ``min_running_requests``,
    #: ``running_requests_per_context`` per context length of pool tokens, and at most
    #: ``running_requests_pool_token_share`` of the pool's tokens
    min_running_requests: int | None = Field(default=None, gt=0)
    running_requests_per_context: float | None = Field(default=None, gt=0)
    running_requests_pool_token_share: float | None = Field(default=None, gt=0, le=1)
    #: per tensor-parallel size, the largest all-reduce (bytes per rank) the engine runs fused
    #: with the residual add and RMSNorm after it, one kernel instead of two (vLLM's
    #: AllReduceFusionPass); absent sizes, and engines without the fusion, run them apart
    fused_allreduce_norm_max_bytes: dict[int, float] = {}
    sources: dict[str, str]

    def running_cap(
        self, *, device_name: str, memory_bytes: float, pool_tokens, context_tokens: float
    ) -> np.ndarray:
        """Requests one engine instance runs at once by its defaults, before the KV pool's own
        limit: ``pool_tokens`` (per row) is what its KV pool holds, ``context_tokens`` the
        model's context length."""
        pool_tokens = np.maximum(np.asarray(pool_tokens, dtype=np.float64), 0.0)
        cap = float(self.max_running_requests)
        small = self.max_running_requests_small_device
        if small is not None and (
            (
                self.small_device_below_gib is not None
                and memory_bytes < self.small_device_below_gib * 2**30
            )
            or any(name.lower() in device_name.lower() for name in self.small_devices)
        ):
            cap = float(small)
        caps = np.full(pool_tokens.shape, cap)
        if self.running_requests_per_context is not None:
            sized = np.floor(pool_tokens / context_tokens * self.running_requests_per_context)
            caps = np.minimum(caps, np.maximum(sized, self.min_running_requests or 1))
        if self.running_requests_pool_token_share is not None:
            caps = np.minimum(caps, np.floor(pool_tokens * self.running_requests_pool_token_share))
        return np.maximum(caps, 1.0)

    def memory_fraction(self, tp: np.ndarray) -> np.ndarray:
        """The default memory fraction at each row's tensor-parallel size ``tp``."""
        fraction = np.full(np.shape(tp), self.kv_memory_fraction)
        for size in sorted(self.kv_memory_fraction_by_tp):
            fraction = np.where(tp >= size, self.kv_memory_fraction_by_tp[size], fraction)
        return fraction

    @property
    def iteration_floor_s(self) -> float:
        """Paid once per iteration whatever it holds: sampling and the exposed scheduler."""
        return self.sampling_s + self.scheduler_s


def _release_parts(version: str) -> list[str]:
    """Dotted components of a version, its local part (``+g...``) dropped."""
    return version.strip().split("+", 1)[0].split(".")


@cache
def _profiles() -> tuple[ServingProfile, ...]:
    data = json.loads(
        (resources.files("cost_model") / "data" / "serving_profiles.json").read_text()
    )
    return tuple(ServingProfile(**row) for row in data["profiles"])


@cache
def serving_profile(engine: str, version: str | None = None) -> ServingProfile:
    """The shipped profile of ``engine`` at ``version`` (None: its current releases, the
    default profile). A version names the release it ran, e.g. ``"0.7.4.dev181+gf35f8e22"``;
    the profile whose release prefix matches the most dotted components is taken. Raises
    ``ValueError`` naming the known engines, or the known releases of ``engine``."""
    own = [profile for profile in _profiles() if profile.engine == engine]
    if not own:
        engines = sorted({profile.engine for profile in _profiles()})
        raise ValueError(f"serving_engine ({engine!r}) must be one of {engines}")
    if version is None:
        (default,) = [profile for profile in own if profile.default]
        return default
    parts = _release_parts(version)
    best, best_length = None, 0
    for profile in own:
        for release in profile.releases:
            prefix = _release_parts(release)
            if parts[: len(prefix)] == prefix and len(prefix) > best_length:
                best, best_length = profile, len(prefix)
    if best is None:
        known = "; ".join(f"{', '.join(profile.releases)} ({profile.version})" for profile in own)
        raise ValueError(
            f"serving_engine_version ({version!r}) of {engine} must start with a release "
            f"that has a profile: {known}"
        )
    return best


@dataclass(frozen=True)
class IterationCost:
    """Seconds of one iteration of a replica, per row of a config table.

    ``linear_s[:, g]`` is the time of everything but core attention of a decode-only iteration
    of ``GRID_TOKENS[g]`` tokens (the decode pass: grouped expert GEMMs at their measured
    efficiency, low-latency all-to-all); ``prefill_linear_s[:, g]`` the same for an iteration
    that carries prompt tokens, priced as the prefill pass a prefill pool runs (an engine runs
    such a batch in its prefill form: SGLang's extend mode with DeepEP's normal kernels, no
    CUDA graph). Decode attention costs ``decode_attention_s`` per decoding request and prefill
    ``prefill_token_s`` per prompt token (its core attention at the prompt's token-weighted
    mean context); ``floor_s`` is paid once per iteration. An iteration with prompt tokens
    costs at least what its decodes alone cost.

    An iteration the engine runs without a CUDA graph (one carrying prompt tokens where the
    engine graphs decode only, or one of more than ``graph_max_tokens`` tokens) is
    host-bound where launching its kernels takes longer than running them: the host enqueues
    kernels ahead of the GPU asynchronously, so its pass takes ``max(GPU time, eager_host_s)``
    (``eager_host_s``: kernels x host seconds per eager kernel, ``ServingProfile``). A graphed
    iteration keeps the per-kernel floor its GPU time already holds.
    """

    linear_s: np.ndarray  # (n, g)
    decode_attention_s: np.ndarray  # (n,)
    prefill_token_s: np.ndarray  # (n,)
    floor_s: np.ndarray  # (n,)
    prefill_linear_s: np.ndarray  # (n, g)
    eager_host_s: np.ndarray | None = None  # (n,); None: never host-bound
    #: the largest iteration (tokens over the pipeline's micro-batches) that replays a graph
    graph_max_tokens: np.ndarray | None = None  # (n,)
    prefill_graphs: bool = True

    def seconds(self, decodes, prefill_tokens) -> np.ndarray:
        """Iteration time with ``decodes`` decoding requests and ``prefill_tokens`` prompt
        tokens; arrays broadcast against ``(n,)`` or ``(n, k)``."""
        decodes = np.asarray(decodes, dtype=np.float64)
        prefill_tokens = np.asarray(prefill_tokens, dtype=np.float64)
        tokens = np.maximum(decodes + prefill_tokens, 1.0)
        two_d = tokens.ndim == 2
        column = (lambda v: v[:, None]) if two_d else (lambda v: v)
        tokens = np.broadcast_to(tokens, tokens.shape if two_d else self.floor_s.shape)
        alone = np.broadcast_to(np.maximum(decodes, 1.0), tokens.shape)
        decode_only = _interpolate(self.linear_s, self._segments, alone)
        with_prompts = np.maximum(
            _interpolate(self.prefill_linear_s, self._prefill_segments, tokens), decode_only
        )
        linear = np.where(prefill_tokens > 0, with_prompts, decode_only)
        gpu = (
            linear
            + column(self.decode_attention_s) * decodes
            + column(self.prefill_token_s) * prefill_tokens
        )
        if self.eager_host_s is not None:
            eager = self.eager(tokens, prefill_tokens, column)
            gpu = np.where(eager, np.maximum(gpu, column(self.eager_host_s)), gpu)
        return gpu + column(self.floor_s)

    def decode_in_extend_s(self, decodes) -> np.ndarray:
        """Seconds of a decode-only batch of ``decodes`` (broadcast against ``(n,)`` or
        ``(n, k)``) run in an iteration where another data-parallel attention rank of the
        instance prefills: no decode CUDA graph replays (``DP_ATTENTION_COUPLING``), so where
        the engine graphs decode only it is host-bound at ``eager_host_s``."""
        decodes = np.asarray(decodes, dtype=np.float64)
        column = (lambda v: v[:, None]) if decodes.ndim == 2 else (lambda v: v)
        seconds = self.seconds(decodes, np.zeros_like(decodes))
        if self.eager_host_s is None or self.prefill_graphs:
            return seconds
        gpu = seconds - column(self.floor_s)
        return np.maximum(gpu, column(self.eager_host_s)) + column(self.floor_s)

    def eager(self, tokens, prefill_tokens, column=lambda v: v) -> np.ndarray:
        """Whether an iteration of ``tokens`` tokens, ``prefill_tokens`` of them from prompts,
        runs without a CUDA graph; ``column`` shapes an (n,) array against ``tokens``."""
        limit = np.inf if self.graph_max_tokens is None else column(self.graph_max_tokens)
        prompts = (np.asarray(prefill_tokens) > 0) & (not self.prefill_graphs)
        return (np.asarray(tokens) > limit) | prompts

    @cached_property
    def _segments(self) -> tuple[np.ndarray, np.ndarray]:
        return _segments(self.linear_s)

    @cached_property
    def _prefill_segments(self) -> tuple[np.ndarray, np.ndarray]:
        return _segments(self.prefill_linear_s)

    def row(self, index: int) -> IterationCost:
        """The cost of one row (arrays of length 1), for the simulator."""
        pick = slice(index, index + 1)
        return IterationCost(
            self.linear_s[pick],
            self.decode_attention_s[pick],
            self.prefill_token_s[pick],
            self.floor_s[pick],
            self.prefill_linear_s[pick],
            None if self.eager_host_s is None else self.eager_host_s[pick],
            None if self.graph_max_tokens is None else self.graph_max_tokens[pick],
            self.prefill_graphs,
        )


def _segments(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(intercept at zero tokens, slope) of each grid segment of ``values`` (n, g): (n, g - 1)."""
    slope = np.diff(values, axis=1) / np.diff(GRID_TOKENS)
    return values[:, :-1] - slope * GRID_TOKENS[:-1], slope


def _interpolate(values: np.ndarray, segments, tokens: np.ndarray) -> np.ndarray:
    """Piecewise-linear ``values`` (n, g) over ``GRID_TOKENS`` at ``tokens`` (n,) or (n, k),
    given its ``_segments``. The grid is 4^0 .. 4^7, so a token count's segment is half its
    binary exponent."""
    intercept, slope = segments
    count = GRID_TOKENS.size - 1
    exponent = np.frexp(tokens)[1] - 1  # floor(log2(tokens)) for tokens >= 1
    segment = np.clip(exponent // 2, 0, count - 1)
    rows = np.arange(values.shape[0]) * count
    flat = segment + (rows[:, None] if tokens.ndim == 2 else rows)
    return intercept.ravel()[flat] + slope.ravel()[flat] * tokens


@dataclass(frozen=True)
class LoadPolicy:
    """What the engine of one replica admits: scalars or (n,) arrays."""

    prompt_tokens: np.ndarray  # uncached prompt tokens per request (prefilled)
    output_tokens: np.ndarray
    max_running: np.ndarray  # requests the KV cache holds
    max_batched_tokens: float
    request_overhead_s: float
    #: a prompt longer than the budget is split over iterations (else prefilled whole)
    chunked_prefill: bool = True
    #: an iteration with prompt tokens also runs the decodes (else they wait for it)
    mixed_prefill_decode: bool = True
    #: coefficient of variation of the output length (spread of the time a request holds KV)
    output_tokens_cv: float = 0.0
    #: coefficient of variation of the uncached prompt length
    prompt_tokens_cv: float = 0.0
    #: data-parallel attention ranks whose iterations run together (``DP_ATTENTION_COUPLING``,
    #: ``VLLM_DP_EP_COUPLING``);
    #: 1 where each replica iterates alone
    coupled_ranks: np.ndarray | float = 1.0

    def row(self, index: int) -> LoadPolicy:
        """The policy of one row (arrays of length 1), for the simulator."""
        pick = slice(index, index + 1)
        return LoadPolicy(
            np.asarray(self.prompt_tokens)[pick],
            np.asarray(self.output_tokens)[pick],
            np.asarray(self.max_running)[pick],
            self.max_batched_tokens,
            self.request_overhead_s,
            self.chunked_prefill,
            self.mixed_prefill_decode,
            self.output_tokens_cv,
            self.prompt_tokens_cv,
            _pick(self.coupled_ranks, pick),
        )


def _pick(values, pick: slice) -> np.ndarray:
    """``values[pick]`` of an (n,) column; a scalar as a 1-element array."""
    values = np.atleast_1d(np.asarray(values, dtype=np.float64))
    return values if values.size == 1 else values[pick]


#: Coupling of the data-parallel attention ranks of one SGLang instance
#: (``--enable-dp-attention``). Each rank runs its own scheduler and requests, but every
#: iteration (a) all-gathers the ranks' token counts and forward modes over the TP group before
#: the step, (b) runs a forward on every rank, one without requests an idle batch
#: (``get_idle_batch``) when any rank has tokens, since the MoE layers (and the TP collectives
#: after the gather) run over the tokens of all ranks together, and (c) replays a decode CUDA
#: graph only where every rank decodes: the graph vote is min-reduced and ``is_extend_in_batch``
#: max-reduced over the ranks (SGLang 0.5.23 ``prepare_mlp_sync_batch_raw`` and
#: ``MLPSyncBatchInfo.all_gather`` in ``srt/managers/scheduler_components/dp_attn.py``; the same
#: all-gather of ``global_num_tokens``, idle batch and forward-mode vote for the graph in the
#: early-2025 releases' ``Scheduler.prepare_dp_attn_batch``, ``srt/managers/scheduler.py``,
#: 0.4.x). So an iteration lasts as long as its slowest rank, and a prompt on one rank holds
#: the decodes of every other rank for its prefill iteration, which they run without a graph.
DP_ATTENTION_COUPLING = "sglang --enable-dp-attention: ranks iterate together"

#: Coupling of vLLM's data-parallel ranks under expert parallelism (``--data-parallel-size``
#: with ``--enable-expert-parallel``: the experts span the attention replicas), priced with the
#: same machinery as ``DP_ATTENTION_COUPLING``. The MoE layers' collectives run over every DP
#: rank, so all step together: ``DPEngineCoreProc.run_busy_loop`` (``v1/engine/core.py``) runs
#: ``execute_dummy_batch`` on a rank without scheduled requests while the wave runs, and
#: all-reduces the ranks' unfinished requests each step (``_has_global_unfinished_reqs``);
#: before each forward the ranks all-reduce their token counts and CUDA-graph modes
#: (``coordinate_batch_across_dp`` in ``v1/worker/dp_utils.py``, called from
#: ``GPUModelRunner._determine_batch_execution_and_padding``): the mode is the minimum over
#: the ranks (any rank eager, all eager) and, under a graph, every rank pads to the largest
#: count (``_post_process_dp_padding``; the counts reach the MoE layers as
#: ``forward_context.DPMetadata``); read in vLLM 0.33. vLLM mixes a rank's prompt chunks with
#: its decodes, so where another rank prefills, a rank's decode iteration lasts that rank's
#: mixed iteration (``prefill_iteration_s``, the slowest rank); the graph vote adds nothing
#: beyond it: mixed batches replay piecewise graphs (``prefill_graphs``), and a batch past the
#: capture sizes is eager on its own rank as well, so that rank already costs at least the
#: eager host time the others are held to.
VLLM_DP_EP_COUPLING = "vllm --data-parallel-size with --enable-expert-parallel: ranks step together"


def _coupled_decode_s(
    *,
    cost: IterationCost,
    policy: LoadPolicy,
    col,
    decodes,
    own_share,
    prefill_iteration_s,
    decode_s,
) -> np.ndarray:
    """Mean seconds of an iteration that runs this rank's decodes (``decode_s`` alone) when
    it is coupled to ``coupled_ranks - 1`` others (``DP_ATTENTION_COUPLING``), each carrying
    prompts in a share ``own_share`` of its iterations independently: with probability
    ``1 - (1 - own_share)^(R - 1)`` another rank prefills, and the iteration lasts its prefill
    iteration (``prefill_iteration_s``, priced with every rank's tokens through the MoE: an
    upper bound when the others decode) or this rank's decodes without a graph, the longer."""
    others = np.maximum(col(policy.coupled_ranks) - 1.0, 0.0)
    if not np.any(others > 0):
        return decode_s
    held = 1.0 - (1.0 - np.clip(own_share, 0.0, 1.0)) ** others
    stretched = np.maximum(prefill_iteration_s, cost.decode_in_extend_s(decodes))
    return (1.0 - held) * decode_s + held * stretched


def _coupled_poisson_decode_s(
    *,
    cost: IterationCost,
    policy: LoadPolicy,
    col,
    decodes,
    own_share,
    rate,
    prefill_iteration_s,
    decode_s,
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Mean seconds of an iteration that runs this rank's decodes under Poisson arrivals at
    ``rate`` per rank when ``R = coupled_ranks`` ranks iterate together
    (``DP_ATTENTION_COUPLING``). An iteration prefills (on some rank) when any request of the
    instance arrived during the previous one, so prefill iterations cluster: a long one
    gathers arrivals on many ranks, which then prefill together. As a two-state Markov chain
    of iterations (decode ``D`` = ``decode_s``, prefill ``S`` = the longer of
    ``prefill_iteration_s`` and the decodes without a graph), ``a = 1 - exp(-R rate D)`` and
    ``b = 1 - exp(-R rate S)`` are the chances that a decode or a prefill iteration is followed
    by a prefill; prefills take ``pi = a / (1 + a - b)`` of the iterations, and the iterations
    other than this rank's own prefills (``own_share`` of them, at ``prefill_iteration_s``)
    average ``(pi S + (1 - pi) D - own_share prefill_iteration_s) / (1 - own_share)``.

    Returns that mean, and the (prefill share, prefill seconds, decode seconds) of the
    instance's iterations that an arrival may land in (``_residual``)."""
    ranks = col(policy.coupled_ranks)
    if not np.any(ranks > 1.0):
        return decode_s, (own_share, prefill_iteration_s, decode_s)
    stretched = np.maximum(prefill_iteration_s, cost.decode_in_extend_s(decodes))
    after_decode = 1.0 - np.exp(-ranks * rate * decode_s)
    after_prefill = 1.0 - np.exp(-ranks * rate * stretched)
    prefilling = after_decode / np.maximum(1.0 + after_decode - after_prefill, 1e-9)
    mean_s = prefilling * stretched + (1.0 - prefilling) * decode_s
    own = np.clip(own_share, 0.0, 1.0 - 1e-9)
    others_s = np.maximum(mean_s - own * prefill_iteration_s, (1.0 - own) * decode_s) / (1.0 - own)
    coupled = ranks > 1.0
    mix = (
        np.where(coupled, prefilling, own_share),
        np.where(coupled, stretched, prefill_iteration_s),
        decode_s,
    )
    return np.where(coupled, others_s, decode_s), mix


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


def _as_columns(reference: np.ndarray):
    """Lift (n,) per-row values against ``reference``'s shape, (n,) or (n, k)."""
    if reference.ndim == 2:
        return lambda v: np.asarray(v, dtype=np.float64)[:, None]
    return lambda v: np.asarray(v, dtype=np.float64)


def closed_loop(*, cost: IterationCost, policy: LoadPolicy, concurrency) -> LoadTimes:
    """``concurrency`` requests in flight per replica (scalar, (n,) or (n, k)), each sent as
    soon as the previous one completes (a benchmark client with ``--max-concurrency``).

    Requests sent together are prefilled together: ``n`` running requests of ``P``-token
    prompts fall into ``m = ceil(n P / B)`` groups whose prompts share an iteration of
    ``n P / m`` tokens (``B`` the budget left by the decodes); a prompt longer than ``B`` spans
    ``k = ceil(P / B)`` iterations. A request's cycle is ``k`` prefill iterations and ``O - 1``
    decode iterations, ``m - k`` of which carry the other groups' prompts; a completion sends
    the next request at an iteration's end, so it waits for no running iteration. When the
    groups' prompts need more iterations than a cycle has, prefill is budget-bound: every
    iteration is full and the completion rate is ``B / (P T)``.
    """
    concurrency = np.asarray(concurrency, dtype=np.float64)
    col = _as_columns(concurrency)
    prompt, output, budget = (
        col(policy.prompt_tokens),
        col(policy.output_tokens),
        policy.max_batched_tokens,
    )
    mixed = policy.mixed_prefill_decode
    running = np.minimum(concurrency, col(policy.max_running))
    budget_left = np.maximum(np.where(mixed, budget - running, budget), 1.0)
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
    decode_s = cost.seconds(running, np.zeros_like(group_tokens))
    if policy.output_tokens_cv > 0:
        return _desynchronized_closed_loop(
            cost=cost,
            policy=policy,
            concurrency=concurrency,
            running=running,
            budget_left=budget_left if policy.chunked_prefill else np.maximum(budget_left, prompt),
            decode_s=decode_s,
        )
    if not mixed:
        return _unmixed_closed_loop(
            policy=policy,
            concurrency=concurrency,
            running=running,
            output=output,
            chunks=chunks,
            groups=groups,
            prefill_s=cost.seconds(np.zeros_like(group_tokens), group_tokens),
            decode_s=decode_s,
        )
    prefill_s = cost.seconds(running - group_size, group_tokens)
    cycle_iterations = output - 1.0 + chunks
    bound = groups > cycle_iterations  # budget-bound prefill: every iteration full
    others = np.clip(groups - chunks, 0.0, output - 1.0)
    cycle_s = np.where(
        bound,
        cycle_iterations * prefill_s,
        groups * prefill_s + (cycle_iterations - groups) * decode_s,
    )
    rate = np.where(bound, budget_left / (prompt * prefill_s), running / cycle_s)
    tpot = np.where(
        bound,
        prefill_s,
        (others * prefill_s + (output - 1.0 - others) * decode_s) / np.maximum(output - 1.0, 1.0),
    )
    e2e_running = np.where(bound, running / rate, chunks * prefill_s + (output - 1.0) * tpot)
    admission_wait = (concurrency - running) / rate
    ttft = policy.request_overhead_s + e2e_running - (output - 1.0) * tpot + admission_wait
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

    As in the simulator, a new request reaches the scheduler at the end of the iteration that
    completed its predecessor. A real client's request first crosses the HTTP server and the
    tokenizer (``request_overhead_s``), lands inside a later iteration and waits for its rest
    (the engines ingest requests between iterations, e.g. SGLang's ``event_loop_normal``): at
    most one iteration, not modelled here. Prompt lengths that vary with equal outputs leave
    the requests prefilled together ending together, so only the output's spread selects
    this form (on an engine that mixes, such groups split unevenly over the budget's
    iterations, which neither form prices).
    """
    col = _as_columns(concurrency)
    prompt, output = col(policy.prompt_tokens), col(policy.output_tokens)
    decode_steps = np.maximum(output - 1.0, 1.0)
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
    own_tokens = prompt * (1.0 + sent)
    own_s = np.maximum(prompt * (1.0 + sent / 2.0) / budget_left, 1.0) * cost.seconds(
        np.maximum(decodes - 1.0 - sent, 0.0), np.minimum(own_tokens, budget_left)
    )
    share = with_prompts * batch_iterations  # prompt iterations per decode step
    decode_s = _coupled_decode_s(
        cost=cost,
        policy=policy,
        col=col,
        decodes=running,
        own_share=with_prompts,
        prefill_iteration_s=batch_s / batch_iterations,
        decode_s=decode_s,
    )
    if mixed:
        share = np.minimum(share, 1.0)
        tpot = share * batch_s / batch_iterations + (1.0 - share) * decode_s
        step_spread = np.sqrt(share * (1.0 - share)) * np.abs(batch_s / batch_iterations - decode_s)
    else:
        tpot = decode_s + share * batch_s / batch_iterations
        step_spread = np.sqrt(with_prompts * (1.0 - with_prompts)) * batch_s
    rate = running / (own_s + (output - 1.0) * tpot)
    admission_wait = (concurrency - running) / rate
    ttft = policy.request_overhead_s + own_s + admission_wait
    # own prompt (spread cv) plus Poisson(a) others: Var = P^2 (cv^2 + a (1 + cv^2)), taken
    # proportional to the prefill's time (an upper bound: the pass's fixed part does not vary)
    cv2 = policy.prompt_tokens_cv**2
    ttft_spread = own_s * np.sqrt(cv2 + sent * (1.0 + cv2)) / (1.0 + sent)
    return LoadTimes(
        ttft,
        tpot,
        ttft + (output - 1.0) * tpot,
        rate,
        running,
        tpot_spread_s=step_spread / np.sqrt(decode_steps),
        ttft_spread_s=ttft_spread,
    )


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
    col = _as_columns(rate)
    prompt, output, budget = (
        col(policy.prompt_tokens),
        col(policy.output_tokens),
        policy.max_batched_tokens,
    )
    mixed = policy.mixed_prefill_decode
    slots = col(policy.max_running)
    iteration = cost.seconds(np.zeros_like(rate * prompt), np.minimum(prompt, budget))
    tpot = iteration
    previous = iteration
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
        prefill_s = cost.seconds(with_prompts, np.minimum(prompt_tokens / share, budget_left))
        decode_s, instance_mix = _coupled_poisson_decode_s(
            cost=cost,
            policy=policy,
            col=col,
            decodes=decodes,
            own_share=share,
            rate=rate,
            prefill_iteration_s=prefill_s,
            decode_s=cost.seconds(decodes, np.zeros_like(prefill_s)),
        )
        iteration = share * prefill_s + (1.0 - share) * decode_s
        # unmixed: a decode step waits for the prompt iterations between two decode iterations
        tpot = iteration if mixed else iteration / np.maximum(1.0 - share, 1e-9)
    utilization = prompt_tokens / budget_left
    chunks = (
        np.ceil(prompt / budget_left) if policy.chunked_prefill else np.ones_like(prompt_tokens)
    )
    # requests holding a KV slot, as offered (Little: arrival rate x time held); at most
    # ``slots`` run, the rest wait for admission (``_admission_wait``)
    offered = rate * (chunks * iteration + (output - 1.0) * tpot)
    running = np.minimum(offered, slots)
    # Each request adds work to every iteration it spans: past a rate, more decodes make longer
    # iterations make more decodes, and the substitution diverges instead of settling.
    settled = iteration <= previous * (1.0 + 1e-3)
    stable = (utilization < 1.0) & (offered < slots) & settled
    admission_s, admission_busy = _admission_wait(
        running=offered,
        slots=slots,
        rate=rate,
        hold_cv=policy.output_tokens_cv,
    )
    queue_wait = np.where(
        stable,
        utilization * chunks * prefill_s / (2.0 * np.maximum(1.0 - utilization, 1e-9))
        + admission_s,
        np.inf,
    )
    busy = np.minimum(rate * (chunks + output - 1.0) * iteration, 1.0)  # P(engine busy at arrival)
    own = np.minimum(prompt + prompt_tokens, np.maximum(budget_left, prompt / chunks))
    service = cost.seconds(with_prompts, own) + (chunks - 1.0) * cost.seconds(
        with_prompts, budget_left
    )
    # an arrival waits for the instance's running iteration: busy where any coupled rank is
    residual = _residual(1.0 - (1.0 - busy) ** col(policy.coupled_ranks), *instance_mix)
    ttft = policy.request_overhead_s + residual[0] + queue_wait + service
    spread = np.sqrt(share * (1.0 - share)) * np.abs(
        prefill_s - decode_s
    )  # iterations with and without prompts

    def unbounded(v):
        return np.where(stable, v, np.inf)

    return LoadTimes(
        unbounded(ttft),
        unbounded(tpot),
        unbounded(ttft + (output - 1.0) * tpot),
        rate,
        running,
        wait_s=queue_wait,
        busy=np.minimum(np.maximum(utilization, admission_busy), 1.0),
        tpot_spread_s=spread / np.sqrt(np.maximum(output - 1.0, 1.0)),
        residual=residual,
        stable=stable,
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


def _residual(busy, share, prefill_s, decode_s) -> tuple[np.ndarray, dict[float, np.ndarray]]:
    """Wait for the iteration running when a request arrives: with probability ``busy`` the
    engine runs one, picked length-biased (a long prefill iteration is more likely hit); the
    wait is uniform over it. Mean ``busy E[T^2] / (2 E[T])``; quantiles from the share of time
    spent in prefill iterations."""
    mean_iteration = share * prefill_s + (1.0 - share) * decode_s
    mean = busy * (share * prefill_s**2 + (1.0 - share) * decode_s**2) / (2.0 * mean_iteration)
    prefill_time_share = share * prefill_s / mean_iteration
    quantiles = {}
    for p in Z_SCORES:
        longest = np.where(p > 1.0 - prefill_time_share, prefill_s, decode_s)
        quantiles[p] = np.where(
            p > 1.0 - busy,
            longest * np.clip((p - (1.0 - busy)) / np.maximum(busy, 1e-9), 0, 1),
            0.0,
        )
    return mean, quantiles
