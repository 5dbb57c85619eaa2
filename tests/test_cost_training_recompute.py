"""Step time of the framework's recompute and offload settings: each recomputed module or
layer costs its forward once more; CPU activation offloading costs only what its host copies
do not hide under the compute beside them."""

from __future__ import annotations

import numpy as np
import pytest

from autoparallel._catalog import get_model
from cost_model import ParallelConfig, Training
from cost_model._estimate import estimate_table
from cost_model._memory import offloaded_layer_bytes
from cost_model._model_spec import ModelSpec
from cost_model._options import EstimateOptions
from cost_model._stages import attention_replicated_parameters
from cost_model._table import configs_to_table
from cost_model._training_comm import table_collective_times
from cost_model._training_context import training_context
from cost_model._training_micro_batch import micro_batch_times
from cost_model._training_ops import (
    attention_projection_time,
    core_attention_time,
    mla_up_projection_time,
    rotary_time,
)
from topology import get_preset

DENSE = {
    "model_type": "llama",
    "num_hidden_layers": 16,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
}
WORKLOAD = Training(sequence_length_tokens=4096, global_batch_sequences=64)


def _context(model, config, *, cluster=None, **options):
    return training_context(
        model=model,
        cluster=cluster or get_preset("dgx-h100", num_nodes=1),
        workload=WORKLOAD,
        table=configs_to_table([config]),
        options=EstimateOptions(**options),
    )


def _columns(model, config, *, cluster=None, **options) -> dict[str, float]:
    columns = estimate_table(
        model,
        cluster or get_preset("dgx-h100", num_nodes=1),
        WORKLOAD,
        configs_to_table([config]),
        options=EstimateOptions(**options),
    )
    return {name: float(values[0]) for name, values in columns.items()}


@pytest.fixture(scope="module")
def deepseek() -> ModelSpec:
    return get_model("deepseek-v3")


@pytest.fixture(scope="module")
def dense() -> ModelSpec:
    return ModelSpec.from_hf_config(DENSE, name="dense-8b")


def test_mla_up_proj_recompute_costs_the_up_projection_forward_once_more(deepseek) -> None:
    """Megatron-core ``--recompute-modules mla_up_proj`` repeats the MLA up-projections (and the
    rotary embedding after them) in backward, and nothing else."""
    config = ParallelConfig(dp=8, ep=8, micro_batch_size=1, recompute="selective")
    ctx = _context(deepseek, config, recompute_modules=("mla_up_proj",))
    mb = micro_batch_times(ctx, table_collective_times(ctx))
    up = mla_up_projection_time(ctx)[0]
    assert mb.recompute[0, 0] == pytest.approx(deepseek.num_layers * up, rel=1e-12)
    # The up-projections are part of the attention projections, not all of them.
    assert 0 < up - rotary_time(ctx)[0] < attention_projection_time(ctx)[0]
    # No faster than their FLOPs at peak: the sharded attention weights less the output
    # projection, counted from the model's parameters.
    attention = deepseek.attention
    output = attention.num_heads * attention.v_head_dim * deepseek.hidden_size
    up_parameters = (
        deepseek.attention_parameters() - attention_replicated_parameters(deepseek) - output
    )
    flops = 2.0 * float(ctx.tokens[0]) * up_parameters
    assert up > flops / ctx.cluster.device.peak_flops_for("bf16")
    # Core attention, the default module, is no longer repeated.
    none = micro_batch_times(
        plain := _context(deepseek, config.model_copy(update={"recompute": "none"})),
        table_collective_times(plain),
    )
    assert mb.recompute[0, 0] < deepseek.num_layers * core_attention_time(ctx)[0]
    assert none.recompute[0, 0] == 0.0
    assert mb.forward[0, 0] == pytest.approx(none.forward[0, 0], rel=1e-12)


def test_selective_modules_add_their_forward_times(deepseek, dense) -> None:
    """Each module adds its own forward; mla_up_proj costs nothing without MLA; the default
    (core attention) is the Korthikanti selective recompute."""
    moe_config = ParallelConfig(dp=8, ep=8, micro_batch_size=1, recompute="selective")

    def recompute(model, config, modules) -> float:
        ctx = _context(model, config, recompute_modules=modules)
        return float(micro_batch_times(ctx, table_collective_times(ctx)).recompute[0, 0])

    core = recompute(deepseek, moe_config, ("core_attn",))
    up = recompute(deepseek, moe_config, ("mla_up_proj",))
    assert recompute(deepseek, moe_config, ("core_attn", "mla_up_proj")) == pytest.approx(core + up)
    act = recompute(deepseek, moe_config, ("moe_act",))
    whole = recompute(deepseek, moe_config, ("moe",))
    assert 0 < act < whole
    assert recompute(deepseek, moe_config, ("moe", "moe_act", "shared_experts")) == pytest.approx(
        whole
    )
    dense_config = ParallelConfig(dp=8, micro_batch_size=1, recompute="selective")
    assert recompute(dense, dense_config, ("mla_up_proj",)) == 0.0
    ctx = _context(dense, dense_config)
    assert recompute(dense, dense_config, ("core_attn",)) == pytest.approx(
        DENSE["num_hidden_layers"] * core_attention_time(ctx)[0], rel=1e-12
    )


def test_selective_recompute_of_the_moe_block_repeats_its_all_to_alls(deepseek) -> None:
    config = ParallelConfig(dp=8, ep=8, micro_batch_size=1, recompute="selective")
    act = _context(deepseek, config, recompute_modules=("moe_act",))
    whole = _context(deepseek, config, recompute_modules=("moe",))
    times = table_collective_times(act)
    ep = {
        name: micro_batch_times(ctx, times).comm["ep_comm"][0, 0]
        for name, ctx in (("act", act), ("whole", whole))
    }
    # Dispatch + combine once more per MoE layer, each waiting for the ranks' wake-up.
    sync = getattr(act.cluster.device, "collective_sync_s", 0.0)
    once = float(times.ep_exchange[0]) + 2.0 * sync
    assert ep["whole"] - ep["act"] == pytest.approx(act.layout.moe_layers[0, 0] * once, rel=1e-9)
    assert once > 0


def test_selective_recompute_of_core_attention_repeats_its_context_parallel_exchange(
    dense,
) -> None:
    """Megatron-core checkpoints the core attention, and Transformer Engine's context-parallel
    attention exchanges K/V inside it: the recompute repeats one forward exchange per layer
    (ring or all-gather), so selective recompute never prices below no recompute under cp."""
    for method in ("ring", "all_gather"):
        comm = {}
        for recompute in ("none", "selective"):
            config = ParallelConfig(dp=4, cp=2, micro_batch_size=1, recompute=recompute)
            ctx = _context(dense, config, context_parallel=method)
            times = table_collective_times(ctx)
            comm[recompute] = micro_batch_times(ctx, times).comm["cp_comm"][0, 0]
            forward = float(DENSE["num_hidden_layers"] * times.cp_ring[0])
        assert forward > 0
        # forward + backward (twice the traffic) without recompute, one forward more with it
        assert comm["none"] == pytest.approx(3.0 * forward, rel=1e-9)
        assert comm["selective"] == pytest.approx(4.0 * forward, rel=1e-9)
    # the recompute's larger overlap window no longer hides traffic that was never sent
    steps = {
        recompute: _columns(
            dense, ParallelConfig(dp=4, cp=2, micro_batch_size=1, recompute=recompute)
        )["step_time_s"]
        for recompute in ("none", "selective")
    }
    assert steps["selective"] > steps["none"]


def test_full_recompute_of_the_first_layers_repeats_only_their_forward(dense) -> None:
    """Megatron-core ``--recompute-method block --recompute-num-layers N``: N layers of each
    model chunk are recomputed, the rest keep their activations and are not."""
    full = ParallelConfig(dp=8, micro_batch_size=1, recompute="full")
    every = _columns(dense, full)["time.recompute"]
    assert every > 0
    layers = DENSE["num_hidden_layers"]
    for count in (1, 4, 8):
        some = _columns(dense, full, recompute_layers=count)["time.recompute"]
        assert some == pytest.approx(every * count / layers, rel=1e-12)
    assert _columns(dense, full, recompute_layers=layers + 4)["time.recompute"] == pytest.approx(
        every
    )
    # Interleaved: N layers of each of the v chunks a rank holds.
    chunked = ParallelConfig(
        dp=2,
        pp=2,
        virtual_stages=2,
        micro_batch_size=1,
        recompute="full",
        pipeline_schedule="interleaved_1f1b",
    )
    ctx = _context(dense, chunked, recompute_layers=2)
    np.testing.assert_array_equal(ctx.fully_recomputed_layers[:, 0], [4.0, 4.0, 4.0])


def test_offloading_is_free_when_the_copy_hides_under_the_next_layer(dense) -> None:
    """On Grace (NVLink-C2C) one layer's activations cross to the host faster than the next
    layer computes: the step is the same as without offloading."""
    cluster = get_preset("gb200-nvl72", num_nodes=1)
    config = ParallelConfig(dp=8, micro_batch_size=1, recompute="none")
    plain = _columns(dense, config, cluster=cluster)
    offloaded = _columns(dense, config, cluster=cluster, activation_offload_layers=8)
    ctx = _context(dense, config, cluster=cluster, activation_offload_layers=8)
    mb = micro_batch_times(ctx, table_collective_times(ctx))
    copy = offloaded_layer_bytes(ctx)[0, 0] / cluster.device.host_link_bandwidth_bytes_per_s
    assert copy < mb.dense_layer_forward[0]
    assert offloaded["time.offload"] == 0.0
    assert offloaded["step_time_s"] == pytest.approx(plain["step_time_s"], rel=1e-12)


def test_offloading_exposes_the_copy_beyond_the_layer_compute(dense) -> None:
    """Over a slow host link the copy outlasts the layer it runs beside: each offloaded layer
    exposes (copy - forward) + (copy - backward) per micro-batch, and the step grows by it."""
    preset = get_preset("dgx-h100", num_nodes=1)
    slow = preset.model_copy(
        update={"device": preset.device.model_copy(update={"host_link_bandwidth_bytes_per_s": 2e9})}
    )
    config = ParallelConfig(dp=8, micro_batch_size=1, recompute="none")
    plain = _columns(dense, config, cluster=slow)
    ctx = _context(dense, config, cluster=slow, activation_offload_layers=4)
    mb = micro_batch_times(ctx, table_collective_times(ctx))
    copy = offloaded_layer_bytes(ctx)[0, 0] / 2e9
    forward = mb.dense_layer_forward[0]
    backward = forward * (mb.backward[0, 0] + mb.recompute[0, 0]) / mb.forward[0, 0]
    assert copy > backward > forward
    per_micro_batch = 4 * ((copy - forward) + (copy - backward))
    four = _columns(dense, config, cluster=slow, activation_offload_layers=4)
    micro_batches = four["num_micro_batches"]
    assert four["time.offload"] == pytest.approx(micro_batches * per_micro_batch, rel=1e-9)
    assert four["step_time_s"] == pytest.approx(
        plain["step_time_s"] + four["time.offload"], rel=1e-9
    )
    two = _columns(dense, config, cluster=slow, activation_offload_layers=2)
    assert two["time.offload"] == pytest.approx(four["time.offload"] / 2.0, rel=1e-9)


def test_offloading_needs_the_host_link_bandwidth(dense) -> None:
    preset = get_preset("dgx-h100", num_nodes=1)
    unknown = preset.model_copy(
        update={
            "device": preset.device.model_copy(update={"host_link_bandwidth_bytes_per_s": None})
        }
    )
    config = ParallelConfig(dp=8, micro_batch_size=1)
    with pytest.raises(ValueError, match="host_link_bandwidth_bytes_per_s"):
        _columns(dense, config, cluster=unknown, activation_offload_layers=2)
    assert _columns(dense, config, cluster=unknown)["time.offload"] == 0.0


@pytest.mark.parametrize(
    ("preset", "bandwidth", "link"),
    [
        ("dgx-h100", 64e9, "PCIe Gen5"),
        ("dgx-b200", 64e9, "PCIe Gen5"),
        ("gb200-nvl72", 450e9, "NVLink-C2C"),
        ("gb300-nvl72", 450e9, "NVLink-C2C"),
    ],
)
def test_presets_state_their_host_link_with_a_source(preset, bandwidth, link) -> None:
    device = get_preset(preset).device
    assert device.host_link_bandwidth_bytes_per_s == bandwidth
    assert link in device.sources["host_link_bandwidth_bytes_per_s"]
