"""Engine defaults that depend on the device and the release (``_serving_profile``): SGLang's
chunked-prefill budget, largest decode CUDA graph and static memory fraction, as each release's
``server_args.py`` sets them from the device memory (MiB) and the tensor-parallel size."""

from __future__ import annotations

import numpy as np
import pytest

from autoparallel import get_model
from cost_model import Inference, ParallelConfig
from cost_model._inference_load import serving_inputs
from cost_model._serving_columns import ServingConfig
from cost_model._serving_profile import _with_base, serving_profile
from cost_model._table import configs_to_table
from topology import get_preset

MIB = 2.0**20


def _device(preset: str):
    return get_preset(preset).device


def _defaults(version: str | None, preset: str, tp: float) -> tuple[float, float, float]:
    profile, device = serving_profile("sglang", version), _device(preset)
    memory = device.memory_bytes
    return (
        profile.token_budget(memory, device.name),
        float(profile.graph_tokens(memory, np.array([tp]), device.name)[0]),
        float(
            profile.memory_fraction(np.array([tp]), memory_bytes=memory, device_name=device.name)[0]
        ),
    )


@pytest.mark.parametrize(
    ("version", "profile"),
    [
        ("0.4.3.post2", "0.4.2-0.4.3"),
        ("0.4.7", "0.4.6-0.4.7"),
        ("0.4.10", "0.4.8-0.5.2"),
        ("0.5.2", "0.4.8-0.5.2"),
        ("0.5.6.post1", "0.5.3-0.5.9"),
        ("0.5.9", "0.5.3-0.5.9"),
        ("0.5.10", "0.5.10-0.5.23"),
        (None, "0.5.10-0.5.23"),
    ],
)
def test_each_release_takes_the_profile_of_its_rules(version, profile) -> None:
    assert serving_profile("sglang", version).version == profile


def test_current_sglang_budget_graph_and_fraction_follow_the_device() -> None:
    """0.5.3 on: 8192 tokens on an 80 or 141 GB device, 16384 on a B200 (>= 160 GiB), 4096 on a
    40 GB A100; decode graphs up to 512 at tp >= 4, 256 at tp < 4, 160 at tp 8 under 60 GiB;
    the fraction (M - R) / M with R = 512 + 1.5 x budget + 2 x graph + 128 x tp x pp MiB (at
    least 10 GiB above 60 GiB), rounded to 3 decimals."""
    for preset, budget, graph in (
        ("dgx-h100", 8192, 512),
        ("dgx-h200", 8192, 512),
        ("dgx-b200", 16384, 512),
        ("mi300x", 16384, 512),
        ("dgx-a100-40gb", 4096, 160),
    ):
        got = _defaults(None, preset, 8.0)
        mib = _device(preset).memory_bytes / MIB
        reserved = 512 + 1.5 * budget + 2 * graph + 128 * 8
        if mib > 60 * 1024:
            reserved = max(reserved, 10 * 1024)
        assert got == (budget, graph, round((mib - reserved) / mib, 3)), preset
    assert _defaults(None, "dgx-h100", 1.0)[1] == 256
    assert _defaults(None, "dgx-b200", 1.0)[1] == 512


def test_older_sglang_releases_keep_their_own_rules() -> None:
    """0.4.8-0.5.2: decode graphs up to 160 below 90 GiB and 256 below 160,000 MiB, a reserve of
    (9.5 or 12 + tp x pp / 2) GiB; 0.4.6: 8192 tokens everywhere, the tp table at or under
    80 GiB and (M - 13 GiB) / M above; 0.4.2-0.4.3: decode graphs up to 160, 256 on AMD."""
    h100 = _device("dgx-h100").memory_bytes / MIB
    h200 = _device("dgx-h200").memory_bytes / MIB
    assert _defaults("0.4.10", "dgx-h100", 8.0) == (
        8192,
        160,
        round((h100 - (9.5 + 4) * 1024) / h100, 3),
    )
    assert _defaults("0.4.10", "dgx-h200", 8.0) == (8192, 256, round((h200 - 16 * 1024) / h200, 3))
    assert _defaults("0.4.10", "dgx-b200", 8.0)[:2] == (16384, 512)
    assert _defaults("0.4.6", "dgx-h100", 8.0) == (8192, 160, 0.81)
    assert _defaults("0.4.6", "dgx-b200", 8.0)[:2] == (8192, 256)
    assert _defaults("0.4.6", "dgx-h200", 8.0)[2] == pytest.approx((h200 - 13 * 1024) / h200)
    assert _defaults("0.4.3", "dgx-h200", 8.0)[1] == 160
    assert _defaults("0.4.3", "mi300x", 8.0)[1] == 256


def _policy_and_cost(preset: str, workload: Inference, config: ParallelConfig):
    cluster = get_preset(preset)
    table = configs_to_table([config], **ServingConfig().columns(workload=workload))
    cost, policy, _ = serving_inputs(
        model=get_model("qwen3-235b-a22b"), cluster=cluster, workload=workload, table=table
    )
    return policy, cost


def test_the_serving_model_runs_the_device_default_unless_the_workload_sets_one() -> None:
    config = ParallelConfig(tp=8, etp=8)
    current = Inference(prompt_tokens=2000, output_tokens=500, serving_engine="sglang")
    b200, _ = _policy_and_cost("dgx-b200", current, config)
    h200, _ = _policy_and_cost("dgx-h200", current, config)
    assert (b200.max_batched_tokens, h200.max_batched_tokens) == (16384, 8192)
    fixed = current.model_copy(update={"max_batched_tokens": 4096})
    assert _policy_and_cost("dgx-b200", fixed, config)[0].max_batched_tokens == 4096
    older = current.model_copy(update={"serving_engine_version": "0.4.6"})
    assert _policy_and_cost("dgx-b200", older, config)[0].max_batched_tokens == 8192
    # the largest decode graph: 512 tokens per micro-batch at tp 8 on 0.5.x, 160 on 0.4.10's
    # H100; larger decode iterations pay the eager launch time
    _, cost = _policy_and_cost("dgx-h100", current, config)
    _, old_cost = _policy_and_cost(
        "dgx-h100", current.model_copy(update={"serving_engine_version": "0.4.10"}), config
    )
    assert float(cost.graph_max_tokens[0]) == 512 and float(old_cost.graph_max_tokens[0]) == 160
    assert old_cost.eager(np.array([300.0]), np.array([0.0]))[0]
    assert not cost.eager(np.array([300.0]), np.array([0.0]))[0]


def test_a_profile_extends_one_other_version_of_its_engine() -> None:
    rows = [
        {"engine": "sglang", "version": "a", "default": True, "x": 1, "sources": {"x": "s"}},
        {"engine": "sglang", "version": "b", "extends": "a", "y": 2, "sources": {"y": "t"}},
    ]
    merged = _with_base(rows[1], rows)
    assert merged["x"] == 1 and merged["y"] == 2 and merged["default"] is False
    assert merged["sources"] == {"x": "s", "y": "t"} and "extends" not in merged
    with pytest.raises(ValueError, match=r"extends \('c'\) must name exactly one"):
        _with_base({**rows[1], "extends": "c"}, rows)


def _setup_of(
    model: str, preset: str, config: ParallelConfig, version: str | None = None, **serving
):
    from cost_model._inference_setup import _setup
    from cost_model._options import EstimateOptions

    workload = Inference(
        prompt_tokens=2000,
        output_tokens=500,
        serving_engine="sglang",
        serving_engine_version=version,
    )
    table = configs_to_table([config], **ServingConfig(**serving).columns(workload=workload))
    return _setup(
        model=get_model(model),
        cluster=get_preset(preset),
        workload=workload,
        table=table,
        options=EstimateOptions(),
    )


def test_current_sglang_graphs_prompt_iterations_up_to_its_budget_where_it_keeps_them_on() -> None:
    """From 0.5.10 an extend batch replays a prefill CUDA graph up to the chunked-prefill size
    (2048 tokens for an MLA model); the engine turns them off under DP attention, pipeline
    parallelism, DeepEP, on AMD and in disaggregated pools; before 0.5.10 it prefills eagerly."""
    tp8 = ParallelConfig(tp=8, etp=8)
    assert _setup_of("qwen3-235b-a22b", "dgx-h200", tp8).prefill_graph_tokens[0] == 8192
    assert _setup_of("qwen3-235b-a22b", "dgx-b200", tp8).prefill_graph_tokens[0] == 16384
    assert _setup_of("deepseek-v3", "dgx-h200", tp8).prefill_graph_tokens[0] == 2048
    for setup in (
        _setup_of("qwen3-235b-a22b", "dgx-h200", tp8, "0.5.6"),
        _setup_of("qwen3-235b-a22b", "mi300x", tp8),
        _setup_of("qwen3-235b-a22b", "dgx-h200", ParallelConfig(tp=4, etp=4, pp=2)),
        _setup_of("qwen3-235b-a22b", "dgx-h200", ParallelConfig(tp=8, ep=8)),  # DeepEP
        _setup_of(
            "deepseek-v3", "dgx-h200", ParallelConfig(tp=8, etp=8, attention_data_parallel=True)
        ),
        _setup_of("qwen3-235b-a22b", "dgx-h200", tp8, phase="prefill"),
    ):
        assert setup.prefill_graph_tokens[0] == 0.0


def test_a_graphed_prefill_is_not_host_bound() -> None:
    """A 2000-token prompt alone: 0.5.6 launches its extend pass eagerly, bound by the host's
    launches (``eager_pass_host_s``); 0.5.12 replays a graph, so its iteration is the GPU time,
    the same as 0.5.6's wherever the GPU outlasts the launches."""
    config = ParallelConfig(tp=8, etp=8)
    workload = Inference(prompt_tokens=2000, output_tokens=500, serving_engine="sglang")
    costs = {}
    for version in ("0.5.6", "0.5.12"):
        _, cost = _policy_and_cost(
            "dgx-h200", workload.model_copy(update={"serving_engine_version": version}), config
        )
        costs[version] = cost
    prompt, none = np.array([2000.0]), np.array([0.0])
    assert costs["0.5.6"].eager(prompt, prompt)[0] and not costs["0.5.12"].eager(prompt, prompt)[0]
    eager_s = float(costs["0.5.6"].seconds(none, prompt)[0])
    graphed_s = float(costs["0.5.12"].seconds(none, prompt)[0])
    host = float(costs["0.5.6"].eager_host_s[0])
    assert eager_s >= host + float(costs["0.5.6"].floor_s[0]) - 1e-12
    assert graphed_s < eager_s
    # decode iterations are graphed in both up to 512 tokens per micro-batch
    decodes = np.array([256.0])
    assert costs["0.5.6"].seconds(decodes, none)[0] == pytest.approx(
        costs["0.5.12"].seconds(decodes, none)[0]
    )


def test_sglang_reserves_graph_memory_per_data_parallel_attention_rank() -> None:
    """With DP attention (dp = tp) SGLang 0.5.x reserves cuda_graph_max_bs x dp x 3 MiB more, and
    x 1.5 more above a graph batch of 300: 18 GiB at tp 8 with 512-token graphs, a pool ~13%
    of an H200 smaller; 0.4.8-0.5.2 reserve 4 GiB more."""
    device = _device("dgx-h200")
    mib = device.memory_bytes / MIB
    tp = np.array([8.0, 8.0])
    dp = np.array([False, True])
    current = serving_profile("sglang").memory_fraction(
        tp, memory_bytes=device.memory_bytes, device_name=device.name, attention_dp=dp
    )
    base = 512 + 1.5 * 8192 + 2 * 512 + 1024
    assert list(current) == [
        round((mib - base) / mib, 3),
        round((mib - base - 512 * 8 * 4.5) / mib, 3),
    ]
    older = serving_profile("sglang", "0.5.1").memory_fraction(
        tp, memory_bytes=device.memory_bytes, device_name=device.name, attention_dp=dp
    )
    assert older[0] - older[1] == pytest.approx(4096 / mib, abs=1.5e-3)
    admitted = [
        _policy_and_cost(
            "dgx-h200",
            Inference(prompt_tokens=2000, output_tokens=500, weight_dtype="fp8"),
            ParallelConfig(tp=8, etp=8, attention_data_parallel=flag),
        )[0].max_running
        for flag in (False, True)
    ]
    assert float(np.asarray(admitted[1])[0]) < float(np.asarray(admitted[0])[0])
