"""Coupled data-parallel ranks: ranks of one engine instance that iterate together.

The data-parallel attention ranks of one SGLang instance iterate together
(``DP_ATTENTION_COUPLING``), as do vLLM's data-parallel ranks whose experts span them
(``VLLM_DP_EP_COUPLING``) and TensorRT-LLM's attention data-parallel ranks
(``TRTLLM_ATTENTION_DP_COUPLING``): where their requests drift apart (output lengths that vary, or
Poisson arrivals), a rank's decode iteration lasts another rank's prefill iteration whenever
one of them prefills (``_coupled_decode_s``; under Poisson arrivals a two-state Markov chain of
iterations, ``_coupled_poisson_decode_s``), and under Poisson arrivals, where the engine
replays a decode graph only on equal batches (TensorRT-LLM), the drifted ranks' decodes run
without one (``_drifted_decode_s``); lock-step waves of equal requests prefill on every rank at
once, so they stall no further. Used by the closed form (``_serving_load``).
"""

from __future__ import annotations

import numpy as np

from cost_model._serving_replica import IterationCost, LoadPolicy

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

#: Coupling of TensorRT-LLM's attention data-parallel ranks (``enable_attention_dp``), priced with
#: the same machinery as ``DP_ATTENTION_COUPLING``: each rank schedules its own requests, a rank
#: without any runs a dummy request (``py_executor.py`` ``_pad_attention_dp_dummy_request``), and
#: the MoE layers' collectives span the ranks, so an iteration lasts its slowest rank (a rank's
#: context request holds the others' generation steps). The graph rule is stricter than SGLang's:
#: before each forward the ranks all-gather ``[can_run_cuda_graph, batch_size]`` and no rank
#: replays a graph unless every rank runs generation requests only and all batch sizes are equal
#: (``cuda_graph_runner.py`` ``maybe_get_cuda_graph``; ``model_engine.py``
#: ``_maybe_get_cuda_graph`` in the 2025 releases); only ``cuda_graph_config.enable_padding``,
#: off by default, pads the ranks to the largest batch first
#: (``ServingProfile.graphs_need_equal_batches``).
#: In a closed loop each rank keeps its clients' requests running (a finished request's successor
#: arrives at once and runs its context in a mixed iteration, graphless anyway), so the decode
#: batches stay equal and the rule adds nothing; under Poisson arrivals the ranks' counts drift
#: apart independently, so most decode iterations run without a graph unless each rank holds
#: about one request (an idle rank's dummy request makes its batch one:
#: ``_equal_batches_chance``; ``_drifted_decode_s``, in ``_coupled_poisson_decode_s``).
TRTLLM_ATTENTION_DP_COUPLING = (
    "trtllm enable_attention_dp: ranks iterate together, graphs need equal batches"
)


#: Largest per-rank request count the equal-batch chance sums over (``_equal_batches_chance``):
#: beyond it a Poisson count's terms are negligible wherever the ranks could still be equal.
_EQUAL_BATCH_COUNTS = 256
_LOG_FACTORIALS = np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, _EQUAL_BATCH_COUNTS + 1)))))


def _equal_batches_chance(decodes, ranks) -> np.ndarray:
    """Chance that ``ranks`` ranks, each decoding a Poisson number of requests of mean
    ``decodes`` (the requests in an M/G/inf system under Poisson arrivals), run equal batches
    when a rank without requests runs one dummy request (TensorRT-LLM's
    ``_pad_attention_dp_dummy_request``): sum over k of P(batch = k)^ranks, with
    P(batch = 1) = P(0) + P(1)."""
    mean = np.maximum(np.asarray(decodes, dtype=np.float64), 1e-12)[..., None]
    k = np.arange(_EQUAL_BATCH_COUNTS + 1, dtype=np.float64)
    pmf = np.exp(k * np.log(mean) - mean - _LOG_FACTORIALS)
    batch = pmf[..., 1:].copy()  # batch sizes 1, 2, ...
    batch[..., 0] += pmf[..., 0]  # an idle rank runs one dummy request
    return np.sum(batch ** np.asarray(ranks, dtype=np.float64)[..., None], axis=-1)


def _drifted_decode_s(
    *, cost: IterationCost, policy: LoadPolicy, col, decodes, decode_s
) -> np.ndarray:
    """Mean seconds of a decode iteration of coupled ranks whose batches drift apart (Poisson
    arrivals) where the engine replays a decode graph only when every rank's batch is equal
    (``TRTLLM_ATTENTION_DP_COUPLING``): unless the ranks all run full (``decodes`` at the
    requests a rank admits), an iteration whose batches differ (``1 - _equal_batches_chance``)
    replays no graph and costs the decodes' eager pass (``IterationCost.decode_in_extend_s``);
    ``decode_s`` elsewhere."""
    if not policy.graphs_need_equal_batches:
        return decode_s
    ranks = col(policy.coupled_ranks)
    drifted = (ranks > 1.0) & (np.asarray(decodes) < col(policy.max_running))
    if not np.any(drifted):
        return decode_s
    unequal = 1.0 - _equal_batches_chance(decodes, np.broadcast_to(ranks, np.shape(decodes)))
    eager = np.maximum(decode_s, cost.decode_in_extend_s(decodes))
    return np.where(drifted, unequal * eager + (1.0 - unequal) * decode_s, decode_s)


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
    instance's iterations that an arrival may land in (``_serving_landing.arrival_residual``)."""
    ranks = col(policy.coupled_ranks)
    if not np.any(ranks > 1.0):
        return decode_s, (own_share, prefill_iteration_s, decode_s)
    decode_s = _drifted_decode_s(
        cost=cost, policy=policy, col=col, decodes=decodes, decode_s=decode_s
    )
    stretched = np.maximum(prefill_iteration_s, cost.decode_in_extend_s(decodes))
    after_decode = 1.0 - np.exp(-ranks * rate * decode_s)
    after_prefill = 1.0 - np.exp(-ranks * rate * stretched)
    # a share (<= 1 exactly: 1 + a - b >= a); clipped, for rounding can carry it past 1
    prefilling = np.clip(
        after_decode / np.maximum(1.0 + after_decode - after_prefill, 1e-9), 0.0, 1.0
    )
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
