"""SGLang's and TensorRT-LLM's data-parallel attention ranks, and vLLM's data-parallel ranks whose experts span them,
iterate together: the closed form and the simulator price the coupling
(``_serving_coupling.DP_ATTENTION_COUPLING``, ``VLLM_DP_EP_COUPLING``,
``TRTLLM_ATTENTION_DP_COUPLING``) and agree on it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autoparallel import get_model
from cost_model import Inference, ParallelConfig, ServingConfig, configs_to_table
from cost_model._inference_load import serving_inputs
from cost_model._serving_load import closed_loop
from cost_model._serving_open_loop import open_loop
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
    serving_engine="sglang",
)
ATTENTION_DP = ParallelConfig(tp=8, ep=8, attention_data_parallel=True)


def _inputs(config: ParallelConfig, workload: Inference = WORKLOAD):
    table = configs_to_table([config], **ServingConfig().columns(workload=workload))
    cost, policy, _ = serving_inputs(model=DSV3, cluster=H200_NODE, workload=workload, table=table)
    return cost.row(0), policy.row(0)


@pytest.fixture(scope="module")
def attention_dp():
    return _inputs(ATTENTION_DP)


def test_only_sglang_attention_data_parallel_ranks_are_coupled(attention_dp) -> None:
    """Eight attention replicas of one SGLang instance iterate together; tensor-parallel
    attention, or vLLM's replicas whose experts stay inside each, iterate alone
    (below: vLLM's ranks whose experts span them are coupled)."""
    _, policy = attention_dp
    assert float(np.asarray(policy.coupled_ranks)[0]) == 8.0
    _, tensor_parallel = _inputs(ParallelConfig(tp=8, ep=8))
    assert float(np.asarray(tensor_parallel.coupled_ranks)[0]) == 1.0
    vllm = WORKLOAD.model_copy(update={"serving_engine": "vllm"})
    _, vllm_policy = _inputs(ParallelConfig(tp=8, ep=8), vllm)  # experts within one replica
    assert float(np.asarray(vllm_policy.coupled_ranks)[0]) == 1.0


def test_a_decode_beside_a_prefill_runs_without_its_graph(attention_dp) -> None:
    """A decode batch in an iteration where another rank prefills replays no CUDA graph: it
    costs at least its graphed time and at least the host time of an eager pass."""
    cost, _ = attention_dp
    decodes = np.array([[1.0, 16.0, 256.0]])  # one row, three batches
    graphed = cost.seconds(decodes, np.zeros_like(decodes))
    eager = cost.decode_in_extend_s(decodes)
    assert np.all(eager >= graphed)
    assert np.all(eager >= cost.eager_host_s[0] + cost.floor_s[0] - 1e-12)


@pytest.mark.parametrize("concurrency", [2, 8])
def test_closed_form_and_simulator_agree_on_coupled_ranks(attention_dp, concurrency) -> None:
    """With lengths that vary, each rank's prompts arrive at its own iterations and stall the
    decodes of all eight: TPOT rises well above the uncoupled replica's in both models, which
    agree within 10%; the TTFT, a rank's own prefill, barely moves."""
    cost, policy = attention_dp
    figures = {}
    for ranks in (1.0, 8.0):
        coupled = dataclasses.replace(policy, coupled_ranks=np.array([ranks]))
        closed = closed_loop(cost=cost, policy=coupled, concurrency=np.array([float(concurrency)]))
        simulated = simulate(
            cost=cost,
            policy=coupled,
            concurrency=concurrency,
            duration_s=3000.0 / ranks,  # the same number of requests either way
            prompt_tokens_cv=SPREAD,
            output_tokens_cv=SPREAD,
        )
        assert simulated.ranks == int(ranks)
        summary = simulated.summary()
        figures[ranks] = (float(closed.tpot_s[0]), summary["tpot_mean_s"])
        assert float(closed.tpot_s[0]) == pytest.approx(summary["tpot_mean_s"], rel=0.10)
        assert float(closed.ttft_s[0]) == pytest.approx(summary["ttft_mean_s"], rel=0.10)
    for source in (0, 1):
        assert figures[8.0][source] > 1.3 * figures[1.0][source], figures


def test_fewer_requests_than_coupled_ranks_prefill_whole_prompts() -> None:
    """Two clients on eight attention-DP ranks: two ranks hold a request each, the others idle.
    The closed form spread them as a quarter of a request per rank and priced a prefill of a
    quarter prompt (TTFT 0.15 s against the simulator's 0.53 s); a busy rank runs the whole
    prompt, and only the busy ranks send prompts."""
    from cost_model._simulator_layout import simulate_layout

    for concurrency in (2, 4, 8):
        workload = WORKLOAD.model_copy(
            update={"concurrency": concurrency, "prompt_tokens_cv": 0.0, "output_tokens_cv": 0.0}
        )
        layout = simulate_layout(
            model=DSV3, cluster=H200_NODE, workload=workload, config=ATTENTION_DP
        )
        closed, simulated = layout.closed_form, layout.result
        assert closed["ttft_s"] == pytest.approx(np.mean(simulated.ttft_s), rel=0.02), concurrency
        assert closed["tpot_s"] == pytest.approx(np.mean(simulated.tpot_s), rel=0.02), concurrency


def test_clients_are_dealt_round_robin_over_the_coupled_ranks(attention_dp) -> None:
    """The layout simulation gave every attention-DP rank ``round(clients / ranks)`` clients, at
    least one: two clients on eight ranks ran eight, ten ran eight and twelve ran sixteen. The
    clients are now dealt round robin (a tuple of per-rank counts to ``simulate``); with equal
    requests the fullest ranks (``ceil``) pace the lock-step waves, in the closed form too
    (it priced the mean, 1.25 requests a rank: TTFT 0.65 s against 1.02 s)."""
    from cost_model._simulator_layout import simulate_layout

    cost, policy = attention_dp
    two = simulate(cost=cost, policy=policy, concurrency=(1, 1, 0, 0, 0, 0, 0, 0), duration_s=600)
    eight = simulate(cost=cost, policy=policy, concurrency=1, duration_s=600)
    assert two.ranks == eight.ranks == 8
    assert 3.0 < eight.ttft_s.size / two.ttft_s.size < 5.0  # a quarter of the requests
    with pytest.raises(ValueError, match=r"must give each of the 8 coupled ranks"):
        simulate(cost=cost, policy=policy, concurrency=(1, 1))
    for concurrency, per_rank in ((10, 1.25), (12, 1.5)):
        workload = WORKLOAD.model_copy(
            update={"concurrency": concurrency, "prompt_tokens_cv": 0.0, "output_tokens_cv": 0.0}
        )
        layout = simulate_layout(
            model=DSV3, cluster=H200_NODE, workload=workload, config=ATTENTION_DP
        )
        assert layout.concurrency_per_replica == per_rank
        closed, simulated = layout.closed_form, layout.result
        assert closed["ttft_s"] == pytest.approx(np.mean(simulated.ttft_s), rel=0.02), concurrency
        assert closed["tpot_s"] == pytest.approx(np.mean(simulated.tpot_s), rel=0.02), concurrency


def test_lock_step_waves_prefill_on_every_rank_at_once(attention_dp) -> None:
    """Equal requests sent together keep every rank's waves aligned: the ranks prefill in the
    same iterations, so coupling them adds no stall in either model."""
    cost, policy = attention_dp
    equal = dataclasses.replace(policy, output_tokens_cv=0.0, prompt_tokens_cv=0.0)
    tpots = []
    for ranks in (1.0, 4.0):
        coupled = dataclasses.replace(equal, coupled_ranks=np.array([ranks]))
        closed = closed_loop(cost=cost, policy=coupled, concurrency=np.array([4.0]))
        simulated = simulate(cost=cost, policy=coupled, concurrency=4, num_requests=12)
        tpots.append((float(closed.tpot_s[0]), float(np.mean(simulated.tpot_s))))
    assert tpots[0][0] == pytest.approx(tpots[1][0], rel=1e-9)
    assert tpots[0][1] == pytest.approx(tpots[1][1], rel=0.02)


def test_poisson_arrivals_on_coupled_ranks(attention_dp) -> None:
    """Under Poisson arrivals a prompt on any of the eight ranks holds every rank's decodes,
    and prefills cluster (a long prefill iteration gathers arrivals on many ranks): both models
    put the coupled TPOT well above the uncoupled one, and the closed form's Markov chain of
    iterations, whose prompt iterations last the slowest rank's drawn prompts and whose decode
    iterations the largest rank's batch (``_serving_prompts``), stays within 15% of the
    simulator (25% before those two terms)."""
    cost, policy = attention_dp
    rate = 0.2
    tpots = {}
    for ranks in (1.0, 8.0):
        coupled = dataclasses.replace(policy, coupled_ranks=np.array([ranks]))
        closed = open_loop(cost=cost, policy=coupled, request_rate_per_s=np.array([rate]))
        simulated = simulate(
            cost=cost,
            policy=coupled,
            request_rate_per_s=rate,
            duration_s=4800.0 / ranks,
            prompt_tokens_cv=SPREAD,
            output_tokens_cv=SPREAD,
        ).summary()
        tpots[ranks] = (float(closed.tpot_s[0]), simulated["tpot_mean_s"])
        assert tpots[ranks][0] == pytest.approx(tpots[ranks][1], rel=0.15), tpots
    for source in (0, 1):
        assert tpots[8.0][source] > 2.0 * tpots[1.0][source], tpots


# ---------------------------------------------------------------- vLLM data parallel + EP
#: vLLM's data-parallel ranks iterate together where the experts span them (``--data-parallel-
#: size`` with ``--enable-expert-parallel``; ``_serving_coupling.VLLM_DP_EP_COUPLING``): the same
#: machinery as SGLang's attention data parallel.
VLLM_WORKLOAD = WORKLOAD.model_copy(update={"serving_engine": "vllm"})
DP_EP = ParallelConfig(dp=8, ep=8)  # vllm serve --data-parallel-size 8 --enable-expert-parallel


def _vllm_inputs(config: ParallelConfig):
    return _inputs(config, VLLM_WORKLOAD)


@pytest.fixture(scope="module")
def dp_ep():
    return _vllm_inputs(DP_EP)


def _ranks(policy) -> float:
    return float(np.asarray(policy.coupled_ranks)[0])


def test_vllm_ranks_are_coupled_where_the_experts_span_them(dp_ep) -> None:
    """Eight data-parallel ranks sharing one expert group step together; two replicas of
    tp 4 under an ep 8 group, two; tensor-parallel experts inside one replica, or a replica
    with its own experts, iterate alone."""
    assert _ranks(dp_ep[1]) == 8.0
    assert _ranks(_vllm_inputs(ParallelConfig(dp=2, tp=4, ep=8))[1]) == 2.0
    assert _ranks(_vllm_inputs(ParallelConfig(tp=8, ep=8))[1]) == 1.0
    assert _ranks(_vllm_inputs(ParallelConfig(dp=8))[1]) == 1.0  # each replica its own experts


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


# ---------------------------------------------------------------- TensorRT-LLM attention DP
#: TensorRT-LLM's attention data-parallel ranks iterate together like SGLang's, and replay a
#: decode graph only when every rank's batch is equal (``enable_padding`` off by default;
#: ``_serving_coupling.TRTLLM_ATTENTION_DP_COUPLING``).
TRTLLM_WORKLOAD = WORKLOAD.model_copy(update={"serving_engine": "trtllm"})
#: a host three times slower per eager kernel than the profile's default (a measured profile or
#: a Grace host), so that an eager decode pass outlasts the graphed one at these batches
SLOW_HOST_S = 0.05


@pytest.fixture(scope="module")
def trtllm_attention_dp():
    cost, policy = _inputs(ATTENTION_DP, TRTLLM_WORKLOAD)
    return dataclasses.replace(cost, eager_host_s=np.array([SLOW_HOST_S])), policy


def test_trtllm_attention_dp_ranks_are_coupled_and_need_equal_batches(trtllm_attention_dp) -> None:
    """Eight TensorRT-LLM attention replicas iterate together and replay a decode graph only on
    equal batches; tensor-parallel attention iterates alone."""
    _, policy = trtllm_attention_dp
    assert _ranks(policy) == 8.0
    assert policy.graphs_need_equal_batches
    _, tensor_parallel = _inputs(ParallelConfig(tp=8, ep=8), TRTLLM_WORKLOAD)
    assert _ranks(tensor_parallel) == 1.0
    _, sglang = _inputs(ATTENTION_DP)
    assert not sglang.graphs_need_equal_batches


def _tpot_under_each_rule(cost, policy, **load) -> dict[bool, tuple[float, float]]:
    """(closed form, simulator) mean TPOT of drifting requests (lengths spread by ``SPREAD``)
    with the graph rule off and on: ``load`` is a closed loop's ``concurrency`` or an open
    loop's ``request_rate_per_s``."""
    figures = {}
    for rule in (False, True):
        ranked = dataclasses.replace(policy, graphs_need_equal_batches=rule)
        if "concurrency" in load:
            closed = closed_loop(
                cost=cost, policy=ranked, concurrency=np.array([float(load["concurrency"])])
            )
        else:
            closed = open_loop(
                cost=cost,
                policy=ranked,
                request_rate_per_s=np.array([load["request_rate_per_s"]]),
            )
        simulated = simulate(
            cost=cost,
            policy=ranked,
            duration_s=400.0 if "concurrency" in load else 600.0,
            prompt_tokens_cv=SPREAD,
            output_tokens_cv=SPREAD,
            **load,
        ).summary()
        figures[rule] = (float(closed.tpot_s[0]), simulated["tpot_mean_s"])
    return figures


@pytest.mark.parametrize("concurrency", [2, 8])
def test_trtllm_closed_loop_keeps_equal_batches(trtllm_attention_dp, concurrency) -> None:
    """In a closed loop every rank keeps its clients' requests decoding (a finished request's
    successor runs its context in a mixed iteration, graphless anyway), so the ranks' decode
    batches stay equal and the graph rule adds next to nothing: the closed form is unchanged,
    the simulator within 5%, and the two agree within 10%."""
    figures = _tpot_under_each_rule(*trtllm_attention_dp, concurrency=concurrency)
    for rule in (False, True):
        assert figures[rule][0] == pytest.approx(figures[rule][1], rel=0.10), figures
    assert figures[True][0] == pytest.approx(figures[False][0], rel=1e-9)
    assert figures[True][1] == pytest.approx(figures[False][1], rel=0.05)


def test_trtllm_lock_step_ranks_keep_their_graphs(trtllm_attention_dp) -> None:
    """Equal requests sent together keep every rank's batch equal: the graph rule adds nothing
    in either model."""
    cost, policy = trtllm_attention_dp
    equal = dataclasses.replace(policy, output_tokens_cv=0.0, prompt_tokens_cv=0.0)
    tpots = []
    for rule in (False, True):
        lock_step = dataclasses.replace(equal, graphs_need_equal_batches=rule)
        closed = closed_loop(cost=cost, policy=lock_step, concurrency=np.array([32.0]))
        simulated = simulate(cost=cost, policy=lock_step, concurrency=32, num_requests=96)
        tpots.append((float(closed.tpot_s[0]), float(np.mean(simulated.tpot_s))))
    assert tpots[0][0] == pytest.approx(tpots[1][0], rel=1e-9)
    assert tpots[0][1] == pytest.approx(tpots[1][1], rel=1e-9)


@pytest.mark.parametrize("rate", [0.05, 0.2])
def test_trtllm_poisson_arrivals_decode_without_graphs(trtllm_attention_dp, rate) -> None:
    """Under Poisson arrivals the ranks' batches drift apart and are rarely all equal, so no rank
    replays its decode graph: where an eager pass outlasts the graphed decode, both models put
    TPOT above the same ranks under SGLang's rule (graphs whenever no rank prefills), at least
    the eager pass, and the closed form within 25% of the simulator (as for SGLang's ranks)."""
    figures = _tpot_under_each_rule(*trtllm_attention_dp, request_rate_per_s=rate)
    for rule in (False, True):
        assert figures[rule][0] == pytest.approx(figures[rule][1], rel=0.25), figures
    for source in (0, 1):
        assert figures[True][source] > 1.2 * figures[False][source], figures
        assert figures[True][source] >= SLOW_HOST_S, figures


def test_trtllm_idle_ranks_run_a_dummy_request(trtllm_attention_dp) -> None:
    """At a load where a rank rarely holds more than one request, the ranks' batches are mostly
    equal - one request, or the dummy request an idle rank runs - so the graph rule adds under 5%
    in both models."""
    figures = _tpot_under_each_rule(*trtllm_attention_dp, request_rate_per_s=0.002)
    for source in (0, 1):
        assert figures[True][source] == pytest.approx(figures[False][source], rel=0.05), figures


def test_overloaded_coupled_ranks_keep_a_finite_tpot_spread(attention_dp) -> None:
    """Past saturation the prefill share of the coupled instance's iterations rounds to just
    over 1 (``a / (1 + a - b)`` with ``b`` at 1): the p90 TPOT spread took the square root of a
    negative variance (NaN, 'invalid value encountered in sqrt') on overloaded rates of eight
    coupled ranks. The share is clipped to [0, 1]: every rate prices a finite spread."""
    import warnings

    cost, policy = attention_dp
    coupled = dataclasses.replace(policy, coupled_ranks=np.array([8.0]))
    for rate in np.geomspace(30.0, 90.0, 12):
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            times = open_loop(cost=cost, policy=coupled, request_rate_per_s=np.array([rate]))
        assert np.isfinite(times.tpot_spread_s).all(), rate
