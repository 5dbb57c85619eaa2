"""vLLM's data-parallel ranks iterate together where the experts span them (``--data-parallel-
size`` with ``--enable-expert-parallel``; ``_serving_load.VLLM_DP_EP_COUPLING``): the cost model
couples them through the same machinery as SGLang's attention data parallel, and the closed form
and the simulator agree on it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autoparallel import get_model
from cost_model import Inference, ParallelConfig, ServingConfig, configs_to_table
from cost_model._inference_load import serving_inputs
from cost_model._serving_load import closed_loop
from cost_model._simulator import simulate
from topology import get_preset

DSV3 = get_model("deepseek-v3")
H200_NODE = get_preset("dgx-h200", num_nodes=1)
SPREAD = 0.5
WORKLOAD = Inference(
    prompt_tokens=4000,
    output_tokens=500,
    weight_dtype="fp8",
    prompt_tokens_cv=SPREAD,
    output_tokens_cv=SPREAD,
    serving_engine="vllm",
)
DP_EP = ParallelConfig(dp=8, ep=8)  # vllm serve --data-parallel-size 8 --enable-expert-parallel


def _inputs(config: ParallelConfig, workload: Inference = WORKLOAD, model=DSV3):
    table = configs_to_table([config], **ServingConfig().columns(workload=workload))
    cost, policy, _ = serving_inputs(model=model, cluster=H200_NODE, workload=workload, table=table)
    return cost.row(0), policy.row(0)


@pytest.fixture(scope="module")
def dp_ep():
    return _inputs(DP_EP)


def _ranks(policy) -> float:
    return float(np.asarray(policy.coupled_ranks)[0])


def test_vllm_ranks_are_coupled_where_the_experts_span_them(dp_ep) -> None:
    """Eight data-parallel ranks sharing one expert group step together; two replicas of
    tp 4 under an ep 8 group, two; tensor-parallel experts inside one replica, or a replica
    with its own experts, iterate alone."""
    assert _ranks(dp_ep[1]) == 8.0
    assert _ranks(_inputs(ParallelConfig(dp=2, tp=4, ep=8))[1]) == 2.0
    assert _ranks(_inputs(ParallelConfig(tp=8, ep=8))[1]) == 1.0
    assert _ranks(_inputs(ParallelConfig(dp=8))[1]) == 1.0  # each replica its own experts


def test_vllm_coupling_raises_tpot_in_both_models(dp_ep) -> None:
    """With lengths that vary, a prompt chunk on one rank makes every rank's iteration as long
    as that rank's mixed batch: the TPOT of the policy the cost model builds exceeds the
    uncoupled replica's by over 20% in the closed form and the simulator, which agree within
    10% either way."""
    cost, policy = dp_ep
    figures = {}
    for name, ranks in (("alone", 1.0), ("built", _ranks(policy))):
        run = dataclasses.replace(policy, coupled_ranks=np.array([ranks]))
        closed = closed_loop(cost=cost, policy=run, concurrency=np.array([8.0]))
        simulated = simulate(
            cost=cost,
            policy=run,
            concurrency=8,
            duration_s=2400.0 / ranks,  # the same number of requests either way
            prompt_tokens_cv=SPREAD,
            output_tokens_cv=SPREAD,
        ).summary()
        figures[name] = (float(closed.tpot_s[0]), simulated["tpot_mean_s"])
        assert figures[name][0] == pytest.approx(figures[name][1], rel=0.10), figures
    for source in (0, 1):
        assert figures["built"][source] > 1.2 * figures["alone"][source], figures


def test_the_graph_vote_adds_nothing_beyond_the_slowest_rank(dp_ep) -> None:
    """The ranks run a graph only where every rank's batch fits the capture sizes
    (``coordinate_batch_across_dp`` takes the minimum mode): a rank held eager by another's
    batch past the capture sizes costs at most that rank's own eager iteration, so the
    iteration's cost stays the slowest rank's, and mixed batches within them keep their
    piecewise graphs (a decode held by another rank's prompt costs its graphed time)."""
    cost, _ = dp_ep
    assert cost.prefill_graphs and cost.graph_max_tokens is not None
    past = np.array([[float(cost.graph_max_tokens[0]) + 1.0, 8192.0]])
    prompts_alone = cost.seconds(np.zeros_like(past), past)
    assert np.all(cost.eager(past, past))
    assert np.all(prompts_alone >= cost.eager_host_s[0] + cost.floor_s[0] - 1e-12)
    decodes = np.array([[1.0, 16.0, 256.0]])
    graphed = cost.seconds(decodes, np.zeros_like(decodes))
    np.testing.assert_allclose(cost.decode_in_extend_s(decodes), graphed)
