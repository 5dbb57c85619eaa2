"""Host-bound eager passes: a pass an engine runs without a CUDA graph takes the larger of its GPU
time and the host time of launching its kernels; graphed passes keep the per-kernel floor."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from autoparallel import get_model
from cost_model import (
    EstimateOptions,
    Inference,
    ParallelConfig,
    ServingConfig,
    configs_to_table,
    estimate_inference_table,
)
from cost_model import _inference_setup as inference_setup
from cost_model._inference_kernels import (
    REFERENCE_EAGER_OP_HOST_S,
    _kernels_per_pass,
    eager_kernel_host_s,
)
from cost_model._inference_setup import _setup
from cost_model._serving_profile import serving_profile
from cost_model._serving_replica import GRID_TOKENS, IterationCost
from cost_model._simulator import _ScalarCost
from topology import get_preset

DSV3 = get_model("deepseek-v3")
H200_NODE = get_preset("dgx-h200", num_nodes=1)
PLAN = ParallelConfig(tp=8, ep=8)
HOST_S = 5e-3
FLOOR_S = 2e-4


def _cost(*, linear_s: float, host_s: float | None, prefill_graphs: bool) -> IterationCost:
    """One row whose linear part is ``linear_s`` at every grid size, no attention."""
    flat = np.full((1, GRID_TOKENS.size), linear_s)
    return IterationCost(
        flat,
        np.zeros(1),
        np.zeros(1),
        np.full(1, FLOOR_S),
        flat.copy(),
        None if host_s is None else np.full(1, host_s),
        np.full(1, 512.0),
        prefill_graphs,
    )


def _seconds(cost: IterationCost, decodes: float, prompt_tokens: float) -> float:
    return float(cost.seconds(np.array([decodes]), np.array([prompt_tokens]))[0])


def test_an_eager_pass_slower_on_the_gpu_than_its_launches_is_unchanged() -> None:
    gpu_bound = _cost(linear_s=20e-3, host_s=HOST_S, prefill_graphs=False)
    no_term = _cost(linear_s=20e-3, host_s=None, prefill_graphs=False)
    for decodes, prompt_tokens in itertools.product((0, 1, 600), (0, 1, 4000)):
        assert _seconds(gpu_bound, decodes, prompt_tokens) == _seconds(
            no_term, decodes, prompt_tokens
        )


def test_a_one_token_eager_pass_is_host_bound_and_a_graphed_one_keeps_its_floor() -> None:
    cost = _cost(linear_s=1e-5, host_s=HOST_S, prefill_graphs=False)
    # one prompt token: prefill runs eagerly on an engine that graphs decode only
    assert _seconds(cost, 0, 1) == pytest.approx(HOST_S + FLOOR_S, rel=1e-12)
    # one decode: replayed from a graph, its GPU time (per-kernel floor included) stands
    assert _seconds(cost, 1, 0) == pytest.approx(1e-5 + FLOOR_S, rel=1e-12)
    # a decode batch above the largest graph runs eagerly too
    assert _seconds(cost, 600, 0) == pytest.approx(HOST_S + FLOOR_S, rel=1e-12)
    # an engine with piecewise prefill graphs replays a small prefill iteration
    graphed = _cost(linear_s=1e-5, host_s=HOST_S, prefill_graphs=True)
    assert _seconds(graphed, 0, 100) == pytest.approx(1e-5 + FLOOR_S, rel=1e-12)
    assert _seconds(graphed, 0, 1000) == pytest.approx(HOST_S + FLOOR_S, rel=1e-12)


def test_the_simulator_prices_eager_iterations_as_the_closed_form() -> None:
    for prefill_graphs, linear_s in itertools.product((False, True), (1e-5, 20e-3)):
        cost = _cost(linear_s=linear_s, host_s=HOST_S, prefill_graphs=prefill_graphs)
        scalar = _ScalarCost(cost)
        for decodes, prompt_tokens in itertools.product((0, 1, 37, 600), (0, 1, 300, 4000)):
            expected = _seconds(cost, decodes, prompt_tokens)
            assert scalar(decodes, prompt_tokens) == pytest.approx(expected, rel=1e-12)


def _pass_times(monkeypatch, *, prompt_tokens: int, host_s: float) -> tuple[float, float]:
    """(prefill pool TTFT, decode pool TPOT) of one sequence under SGLang's profile with
    ``eager_kernel_host_s = host_s``."""
    profile = serving_profile("sglang").model_copy(update={"eager_kernel_host_s": host_s})
    monkeypatch.setattr(inference_setup, "serving_profile", lambda engine, version=None: profile)
    workload = Inference(prompt_tokens=prompt_tokens, output_tokens=100, weight_dtype="fp8")
    times = []
    for phase, column in (("prefill", "ttft_s"), ("decode", "tpot_s")):
        table = configs_to_table(
            [PLAN], **ServingConfig(phase=phase, batch_size=1).columns(workload=workload)
        )
        out = estimate_inference_table(
            model=DSV3, cluster=H200_NODE, workload=workload, table=table
        )
        times.append(float(out[column][0]))
    return times[0], times[1]


def test_deepseek_prefill_of_one_token_waits_for_its_launches(monkeypatch) -> None:
    """SGLang runs extend batches eagerly: a one-token prefill of DeepSeek-V3 launches more
    host time than the GPU needs, so the pass is the launches; a 4000-token prompt is
    GPU-bound and the decode step replays a graph, so neither moves with the host cost."""
    prefill_without, decode_without = _pass_times(monkeypatch, prompt_tokens=1, host_s=0.0)
    prefill_host, decode_host = _pass_times(monkeypatch, prompt_tokens=1, host_s=20e-6)
    kernels = np.max(
        _kernels_per_pass(
            _setup(
                model=DSV3,
                cluster=H200_NODE,
                workload=Inference(prompt_tokens=1, output_tokens=100, weight_dtype="fp8"),
                table=configs_to_table(
                    [PLAN],
                    **ServingConfig(phase="prefill", batch_size=1).columns(
                        workload=Inference(prompt_tokens=1, output_tokens=100, weight_dtype="fp8")
                    ),
                ),
                options=EstimateOptions(),
            )
        )
    )
    assert kernels * 20e-6 > prefill_without  # the premise: launching is the longer
    assert prefill_host == pytest.approx(kernels * 20e-6, rel=1e-9)
    assert decode_host == decode_without
    long_without, _ = _pass_times(monkeypatch, prompt_tokens=4000, host_s=0.0)
    long_host, _ = _pass_times(monkeypatch, prompt_tokens=4000, host_s=20e-6)
    assert long_host == long_without


def test_a_measured_eager_dispatch_time_scales_the_engine_default_by_the_host() -> None:
    """The profile times a plain PyTorch block: a host twice as fast as the reference x86 one
    halves the engine's per-kernel cost (its modules' Python stays the engine's)."""
    profile = serving_profile("vllm")
    half = REFERENCE_EAGER_OP_HOST_S / 2.0
    measured = SimpleNamespace(hardware=SimpleNamespace(eager_op_host_s=half), profile=profile)
    unmeasured = SimpleNamespace(hardware=SimpleNamespace(eager_op_host_s=None), profile=profile)
    assert eager_kernel_host_s(measured) == pytest.approx(profile.eager_kernel_host_s / 2.0)
    assert eager_kernel_host_s(unmeasured) == profile.eager_kernel_host_s


def test_a_grace_host_takes_twice_the_engine_default_per_launch() -> None:
    """The engines' default host time per kernel was measured on x86 DGX hosts; GB200 and GB300
    issue from a Grace CPU, which the engines' own operator tables time at about twice that
    (``HardwareSpec.host_op_time_factor``). A measured value is the host's own."""
    profile = serving_profile("sglang")
    for preset, factor in (("dgx-b200", 1.0), ("gb200-nvl72", 2.0), ("gb300-nvl72", 2.0)):
        device = get_preset(preset).device
        assert device.host_op_time_factor == factor
        setup = SimpleNamespace(hardware=device, profile=profile)
        assert eager_kernel_host_s(setup) == pytest.approx(factor * profile.eager_kernel_host_s)
    measured = SimpleNamespace(
        hardware=SimpleNamespace(
            eager_op_host_s=REFERENCE_EAGER_OP_HOST_S, host_op_time_factor=2.0
        ),
        profile=profile,
    )
    assert eager_kernel_host_s(measured) == pytest.approx(profile.eager_kernel_host_s)
