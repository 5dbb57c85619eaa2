"""One serving replica's iteration: what an iteration costs and what the engine admits.

The policy priced (``_serving_load``) is iteration-level continuous batching with chunked
prefill (Yu et al., Orca, OSDI'22; Kwon et al., vLLM, SOSP'23; Agrawal et al., Sarathi-Serve,
OSDI'24). Each iteration's time is ``IterationCost.seconds(decodes, prefill_tokens)``: the cost
model's pass time at that many tokens (the same function drives the simulator, ``_simulator``),
plus the engine's per-iteration floors (``_serving_profile.ServingProfile``). ``LoadPolicy`` is
what the engine of one replica admits: the token budget per iteration, the requests the KV
cache holds, chunking and mixing of prefill with decode.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

#: Tokens per iteration at which the pass time is priced; between them it is interpolated
#: linearly, beyond the last extrapolated with the last slope.
GRID_TOKENS = np.array([1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0])


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
    engine graphs decode only or past ``prefill_graph_max_tokens``, or one of more than
    ``graph_max_tokens`` tokens) is
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
    #: the largest iteration carrying prompt tokens that replays one, where ``prefill_graphs``
    #: (None: ``graph_max_tokens``)
    prefill_graph_max_tokens: np.ndarray | None = None  # (n,)

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
        if self.eager_host_s is None:
            return seconds
        eager = np.asarray(decodes) > self.prompt_graph_limit(column)
        gpu = seconds - column(self.floor_s)
        eager_s = np.maximum(gpu, column(self.eager_host_s)) + column(self.floor_s)
        return np.where(eager, eager_s, seconds)

    def prompt_graph_limit(self, column=lambda v: v):
        """The largest iteration carrying prompt tokens that replays a graph (0: none; an (n,)
        array shaped by ``column``, or a scalar)."""
        if not self.prefill_graphs:
            return 0.0
        if self.prefill_graph_max_tokens is None:
            return np.inf if self.graph_max_tokens is None else column(self.graph_max_tokens)
        return column(self.prefill_graph_max_tokens)

    def eager(self, tokens, prefill_tokens, column=lambda v: v) -> np.ndarray:
        """Whether an iteration of ``tokens`` tokens, ``prefill_tokens`` of them from prompts,
        runs without a CUDA graph; ``column`` shapes an (n,) array against ``tokens``."""
        limit = np.inf if self.graph_max_tokens is None else column(self.graph_max_tokens)
        prompts = np.asarray(prefill_tokens) > 0
        tokens = np.asarray(tokens)
        return np.where(prompts, tokens > self.prompt_graph_limit(column), tokens > limit)

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
            None if self.prefill_graph_max_tokens is None else self.prefill_graph_max_tokens[pick],
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
    #: coupled ranks replay a decode graph only where their batches are equal
    #: (``ServingProfile.graphs_need_equal_batches``, ``TRTLLM_ATTENTION_DP_COUPLING``)
    graphs_need_equal_batches: bool = False

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
            self.graphs_need_equal_batches,
        )


def _pick(values, pick: slice) -> np.ndarray:
    """``values[pick]`` of an (n,) column; a scalar as a 1-element array."""
    values = np.atleast_1d(np.asarray(values, dtype=np.float64))
    return values if values.size == 1 else values[pick]


def as_columns(reference: np.ndarray):
    """Lift (n,) per-row values against ``reference``'s shape, (n,) or (n, k)."""
    if reference.ndim == 2:
        return lambda v: np.asarray(v, dtype=np.float64)[:, None]
    return lambda v: np.asarray(v, dtype=np.float64)
