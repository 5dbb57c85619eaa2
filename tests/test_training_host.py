"""Host issue time of a micro-batch (``_training_host``): a sync-free stretch takes max(host, GPU)
at least, the dropless dispatch's host sync splits the forward into per-layer stretches, CUDA
graphs remove what they capture; and the expert GEMM count the host and the GPU side share (two
``GroupedLinear`` calls per local expert)."""

from __future__ import annotations

import numpy as np
import pytest

from cost_model import EstimateOptions, ParallelConfig, Training, configs_to_table
from cost_model import _training_moe as moe_block
from cost_model._estimate import estimate_table
from cost_model._frameworks import framework_profile
from cost_model._model_spec import ModelSpec
from cost_model._training_context import training_context
from cost_model._training_host import (
    LayerGpuParts,
    exposed_host_s,
    host_parts,
    stretch_time_s,
)
from topology import get_preset


def _moe(*, layers: int = 4, experts: int = 128) -> ModelSpec:
    """A small fine-grained MoE: narrow experts, so a short micro-batch leaves the GPU little to
    do per expert while the host still issues one GEMM per local expert."""
    return ModelSpec.from_hf_config(
        {
            "model_type": "qwen3_moe",
            "num_hidden_layers": layers,
            "hidden_size": 1024,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "intermediate_size": 3072,
            "moe_intermediate_size": 256,
            "num_experts": experts,
            "num_experts_per_tok": 8,
            "vocab_size": 32000,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": False,
        },
        name="small-moe",
    )


def _workload(*, sequence: int = 256, batch: int = 64, framework: str | None = "megatron-core"):
    return Training(
        sequence_length_tokens=sequence,
        global_batch_sequences=batch,
        precision="bf16",
        framework=framework,
    )


def _graphs(cuda_graphs: str, **fields) -> EstimateOptions:
    """``cuda_graphs`` as Megatron-core allows it: a whole-iteration graph of an MoE model only
    with its experts' inputs padded to capacity (a sync-free dispatch)."""
    if cuda_graphs == "full_iteration":
        fields.update(moe_capacity_factor=1.0, moe_pad_to_capacity=True)
    return EstimateOptions(cuda_graphs=cuda_graphs, **fields)


def _step(model, workload, *, ep: int = 1, cuda_graphs: str = "none") -> float:
    config = ParallelConfig(dp=8, ep=ep, micro_batch_size=1)
    columns = estimate_table(
        model,
        get_preset("dgx-h100", num_nodes=1),
        workload,
        configs_to_table([config]),
        options=_graphs(cuda_graphs),
    )
    return float(columns["step_time_s"][0])


def _context(model, workload, *, ep: int = 1, cuda_graphs: str = "none", scope=None):
    options = (
        _graphs(cuda_graphs) if scope is None else _graphs(cuda_graphs, cuda_graph_scope=scope)
    )
    return training_context(
        model=model,
        cluster=get_preset("dgx-h100", num_nodes=1),
        workload=workload,
        table=configs_to_table([ParallelConfig(dp=8, ep=ep, micro_batch_size=1)]),
        options=options,
    )


def _gpu(
    *, before: float, after: float, experts: float = 0.0, rest: float = 0.0, backward: float = 0.0
):
    return LayerGpuParts(
        moe_before_sync=np.array([before]),
        moe_after_sync=np.array([after]),
        moe_experts=np.array([experts]),
        rest_forward=np.array([[rest]] * 3),
        backward=np.array([[backward]] * 3),
    )


def test_expert_segment_host_time_counts_two_grouped_linears_of_each_local_expert() -> None:
    model, workload = _moe(), _workload()
    profile = framework_profile("megatron-core")
    assert profile.expert_gemm_host_s > 0 and profile.host_ops is not None
    routing_s = profile.host_ops.moe_routing_op_host_s
    assert routing_s is not None
    fixed = profile.host_ops.expert_segment_forward * routing_s
    for ep, local in ((1, 128), (8, 16)):
        parts = host_parts(_context(model, workload, ep=ep))
        assert parts is not None
        expected = fixed + 2 * local * profile.expert_gemm_host_s
        assert parts.moe_after_sync_forward[0] == pytest.approx(expected)
        # Backward: a data- and a weight-gradient GEMM per forward expert GEMM.
        assert parts.moe_backward[0] > 4 * local * profile.expert_gemm_host_s


def test_a_stretch_takes_the_host_prefix_plus_the_gpu_suffix() -> None:
    one = np.array([1.0])
    # GPU-bound blocks: the GPU time; host-bound: the host time.
    assert stretch_time_s([(0.1 * one, one), (0.1 * one, one)])[0] == pytest.approx(2.0)
    assert stretch_time_s([(one, 0.1 * one), (one, 0.1 * one)])[0] == pytest.approx(2.0)
    # A host-heavy block before a GPU-heavy one cannot overlap them: host 1 then GPU 1.
    assert stretch_time_s([(one, 0.0 * one), (0.0 * one, one)])[0] == pytest.approx(2.0)
    # The other order overlaps: the GPU runs the first block while the host issues the second.
    assert stretch_time_s([(0.0 * one, one), (one, 0.0 * one)])[0] == pytest.approx(1.0)


def test_exposed_only_where_the_host_outlasts_the_gpu() -> None:
    ctx = _context(_moe(), _workload())
    parts = host_parts(ctx)
    assert parts is not None
    host_layer = float(parts.moe_after_sync_forward[0] + parts.attention_forward[0])
    busy = _gpu(before=10 * host_layer, after=10 * host_layer, rest=1.0, backward=100.0)
    forward, backward = exposed_host_s(ctx, gpu=busy)
    assert np.all(forward == 0.0) and np.all(backward == 0.0)
    idle = _gpu(before=0.0, after=0.0)
    forward, backward = exposed_host_s(ctx, gpu=idle)
    layers = ctx.layout.moe_layers
    assert np.all(forward >= layers * host_layer * (1 - 1e-9))
    assert np.all(backward > 0.0)


def test_the_host_sync_splits_the_forward_into_stretches() -> None:
    """Without the sync the host issues the experts of one layer while the GPU runs the
    attention of another; with it the experts' host time is exposed after each sync."""
    ctx = _context(_moe(), _workload())
    parts = host_parts(ctx)
    assert parts is not None
    after = float(parts.moe_after_sync_forward[0])
    gpu = _gpu(before=2.0 * after, after=0.0)  # the GPU work sits before the sync
    synced, _ = exposed_host_s(ctx, gpu=gpu)
    unsynced, _ = exposed_host_s(_context(_moe(), _workload(framework="torchtitan")), gpu=gpu)
    assert np.all(synced > 0.0)
    assert np.all(unsynced == 0.0)


def test_cuda_graphs_remove_the_host_cost_of_what_they_capture() -> None:
    model, workload = _moe(), _workload()
    eager = host_parts(_context(model, workload))
    partial = host_parts(_context(model, workload, cuda_graphs="partial"))
    router_only = host_parts(
        _context(model, workload, cuda_graphs="partial", scope=("moe_router", "moe_preprocess"))
    )
    assert eager is not None and partial is not None and router_only is not None
    assert partial.attention_forward[0] < eager.attention_forward[0]
    assert router_only.attention_forward[0] == eager.attention_forward[0]
    assert router_only.moe_before_sync_forward[0] < eager.moe_before_sync_forward[0]
    # The dropless dispatch, the experts and the combine stay eager under partial graphs.
    assert partial.moe_after_sync_forward[0] == eager.moe_after_sync_forward[0]
    assert host_parts(_context(model, workload, cuda_graphs="full_iteration")) is None
    assert host_parts(_context(model, _workload(framework=None))) is None


def test_a_measured_eager_op_cost_replaces_the_default(monkeypatch) -> None:
    ctx = _context(_moe(), _workload())
    base = host_parts(ctx)
    default = framework_profile(ctx.workload.framework).host_ops.eager_op_host_s
    monkeypatch.setattr(type(ctx.cluster.device), "eager_op_host_s", property(lambda _: 1e-3))
    measured = host_parts(ctx)
    assert base is not None and measured is not None
    ratio = 1e-3 / default
    assert measured.attention_forward[0] == pytest.approx(ratio * base.attention_forward[0])


def test_host_bound_step_is_slower_eager_than_fully_graphed() -> None:
    model, workload = _moe(), _workload()
    eager, graphed = _step(model, workload), _step(model, workload, cuda_graphs="full_iteration")
    partial = _step(model, workload, cuda_graphs="partial")
    assert eager > partial > graphed


def test_exposed_host_time_grows_with_moe_layers_and_micro_batches() -> None:
    def exposed(layers: int, batch: int) -> float:
        model, workload = _moe(layers=layers), _workload(batch=batch)
        return _step(model, workload) - _step(model, workload, cuda_graphs="full_iteration")

    base = exposed(4, 64)
    assert base > 0.0
    # Twice the MoE layers or twice the micro-batches: about twice the exposed host time (the
    # embedding and output layer's stretch does not double with the layers).
    assert exposed(8, 64) == pytest.approx(2.0 * base, rel=0.1)
    assert exposed(4, 128) == pytest.approx(2.0 * base, rel=1e-2)


def test_expert_gemm_calls_are_two_per_local_expert() -> None:
    """fc1 and fc2 are separate GroupedLinear calls, each one GEMM per local expert: in fp8 the
    experts pay the fp8 kernels' fixed cost per call twice per local expert."""
    model = _moe()
    workload = Training(
        sequence_length_tokens=256,
        global_batch_sequences=64,
        precision="fp8",
        framework="megatron-core",
    )
    ctx = _context(model, workload, ep=1)
    experts = moe_block.roofline_experts_time(ctx, activation_passes=0.0)[0]
    fewer = ctx.op(
        2.0 * moe_block.routed_assignments(ctx) * model.ffn_parameters(256),
        128 * model.ffn_parameters(256) * 2.0
        + moe_block.routed_assignments(ctx) * 2.0 * (1024 + 256) * 2.0,
        calls=128.0,
        role="expert",
    )[0]
    assert experts > fewer  # 256 calls pay twice the per-call cost of 128


def test_the_expert_segment_splits_into_dispatch_gemms_and_combine() -> None:
    """After the sync the host issues the dispatch (two all-to-alls and the sort), the expert
    GEMMs, then the activation and the combine; the three parts sum to the whole segment."""
    ctx = _context(_moe(), _workload(), ep=8)
    parts = host_parts(ctx)
    profile = framework_profile("megatron-core")
    assert parts is not None and profile.host_ops is not None
    routing_s = profile.host_ops.moe_routing_op_host_s
    assert routing_s is not None
    assert profile.host_ops.expert_dispatch_forward == 3
    assert parts.moe_dispatch_forward[0] == pytest.approx(3 * routing_s)
    assert parts.moe_experts_forward[0] == pytest.approx(2 * 16 * profile.expert_gemm_host_s)
    total = profile.host_ops.expert_segment_forward * routing_s + parts.moe_experts_forward[0]
    assert parts.moe_after_sync_forward[0] == pytest.approx(total)


def test_the_combine_cannot_hide_the_expert_gemms_issue_time() -> None:
    """The GPU reaches the combine only after the host has issued the last expert GEMM: GPU
    time in the combine does not hide the GEMMs' issue time, GPU time in the dispatch or the
    experts does. The two-block stretch (whole segment, then the rest) missed this."""
    ctx = _context(_moe(), _workload(), ep=8)
    parts = host_parts(ctx)
    assert parts is not None
    host_dispatch, host_gemms = parts.moe_dispatch_forward[0], parts.moe_experts_forward[0]
    host_after = float(parts.moe_after_sync_forward[0])
    after, before = 1.2 * host_after, 10.0 * host_after
    layers = ctx.layout.moe_layers
    # Half the segment's GPU time in the combine, none in the experts: exposed.
    late = _gpu(before=before, after=after, experts=0.0, rest=1.0, backward=100.0)
    forward, _ = exposed_host_s(ctx, gpu=late)
    per_layer = host_dispatch + host_gemms - after / 2.0
    assert per_layer > 0.0
    assert np.allclose(forward, layers * per_layer)
    one = np.ones(1)
    coarse = stretch_time_s([(host_after * one, after * one), (0.0 * one, before * one)])
    assert coarse[0] == pytest.approx(after + before)  # the coarse split exposed nothing
    # GPU time mostly in the experts, the dispatch's share outlasting its issue: the experts
    # run as they are issued, nothing exposed.
    longer = 2.0 * host_after
    assert (longer - 0.8 * longer) / 2.0 > host_dispatch
    early = _gpu(before=before, after=longer, experts=0.8 * longer, rest=1.0, backward=100.0)
    forward, _ = exposed_host_s(ctx, gpu=early)
    assert np.all(forward == 0.0)


def test_dispatch_operators_cannot_exceed_the_segment() -> None:
    counts = framework_profile("megatron-core").host_ops
    assert counts is not None
    data = counts.model_dump() | {"expert_dispatch_forward": counts.expert_segment_forward + 1}
    with pytest.raises(ValueError, match="expert_dispatch_forward"):
        type(counts).model_validate(data)


def test_fp8_expert_quantization_adds_its_recipe_launches_per_local_expert_and_call() -> None:
    profile = framework_profile("megatron-core")
    counts = profile.host_ops
    assert counts is not None
    op_s = counts.eager_op_host_s
    model = _moe()
    bf16 = host_parts(_context(model, _workload(), ep=8))
    assert bf16 is not None
    local = 16  # 128 experts over ep 8
    for recipe in ("current", "mxfp8", "delayed"):
        workload = _workload().model_copy(update={"precision": "fp8", "fp8_recipe": recipe})
        parts = host_parts(_context(model, workload, ep=8))
        assert parts is not None
        ops = counts.expert_quantization[recipe]
        extra_forward = parts.moe_experts_forward[0] - bf16.moe_experts_forward[0]
        extra_backward = parts.moe_backward[0] - bf16.moe_backward[0]
        assert extra_forward == pytest.approx(2 * local * ops.forward * op_s)
        assert extra_backward == pytest.approx(2 * local * ops.backward * op_s)
    # Current scaling launches amax (zero + reduce), scale and cast per expert; MXFP8 one cast.
    assert (
        counts.expert_quantization["current"].forward > counts.expert_quantization["mxfp8"].forward
    )


def test_expert_quantization_recipes_must_be_known_and_sourced() -> None:
    counts = framework_profile("megatron-core").host_ops
    assert counts is not None
    unknown = counts.model_dump() | {"expert_quantization": {"fp4": {"forward": 1, "backward": 1}}}
    with pytest.raises(ValueError, match="expert_quantization recipes"):
        type(counts).model_validate(unknown)
    unsourced = counts.model_dump() | {"expert_quantization_basis": ""}
    with pytest.raises(ValueError, match="expert_quantization_basis"):
        type(counts).model_validate(unsourced)


def test_a_grace_host_issues_every_operator_twice_as_slowly() -> None:
    """On GB200 (Grace host, ``host_op_time_factor`` 2) every host part of a layer, the expert
    GEMM calls among them, takes twice the x86 DGX host's."""
    model, workload = _moe(), _workload()
    parts = {}
    for preset in ("dgx-b200", "gb200-nvl72"):
        ctx = training_context(
            model=model,
            cluster=get_preset(preset, num_nodes=1),
            workload=workload,
            table=configs_to_table([ParallelConfig(dp=8, ep=8, micro_batch_size=1)]),
            options=EstimateOptions(),
        )
        parts[preset] = host_parts(ctx)
    x86, grace = parts["dgx-b200"], parts["gb200-nvl72"]
    assert x86 is not None and grace is not None
    for field in ("attention_forward", "moe_experts_forward", "moe_backward", "lm_head_backward"):
        assert getattr(grace, field)[0] == pytest.approx(2.0 * getattr(x86, field)[0])


def test_moe_routing_operators_cost_what_running_megatron_core_measured() -> None:
    """Megatron-core's router, dispatch preprocessing, dispatch and combine carry more Python
    per operator than a bare eager op: the profile's figure is the measured host time of that
    code (benchmarks/megatron_moe_host_check.py on an x86 host: the per-layer intercept over
    local expert counts, forward + backward) over the operators the profile counts for it; the
    shared experts and the attention keep the generic figure."""
    import json
    from pathlib import Path

    result = Path(__file__).resolve().parents[1] / "benchmarks/results/megatron_moe_host_h200.json"
    measured = json.loads(result.read_text())
    counts = framework_profile("megatron-core").host_ops
    assert counts is not None and counts.moe_routing_op_host_s is not None
    counted = (
        counts.router_forward
        + counts.router_backward
        + counts.dispatch_preprocess_forward
        + counts.dispatch_preprocess_backward
        + counts.expert_segment_forward
        + counts.expert_segment_backward
    )
    per_op = measured["fit"]["forward_backward_s"]["intercept_s"] / counted
    assert counts.moe_routing_op_host_s == pytest.approx(per_op, rel=0.01)  # 75.4 us
    assert counts.moe_routing_op_host_s > 3.0 * counts.eager_op_host_s
    parts = host_parts(_context(_moe(), _workload(), ep=8))
    assert parts is not None
    routing = counts.router_forward + counts.dispatch_preprocess_forward
    assert parts.moe_before_sync_forward[0] == pytest.approx(routing * counts.moe_routing_op_host_s)
    assert parts.attention_forward[0] == pytest.approx(
        counts.attention_forward * counts.eager_op_host_s
    )
