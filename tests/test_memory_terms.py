"""Memory terms of cost_model._memory reviewed against published breakdowns and runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from cost_model import ParallelConfig, Training
from cost_model._blackwell_validation import blackwell_records, record_case
from cost_model._estimate import estimate_table
from cost_model._memory import stage_memory
from cost_model._model_spec import ModelSpec
from cost_model._options import EstimateOptions
from cost_model._precision_validation import fp8_twin_records
from cost_model._table import configs_to_table
from cost_model._training_comm import layer_parameter_split, sharding_buffer_bytes
from cost_model._training_context import training_context
from topology import get_preset

MOE = {
    "model_type": "qwen3_moe",
    "num_hidden_layers": 4,
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 64,
    "num_experts_per_tok": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
}


def _memory(model, config, **workload) -> dict[str, float]:
    training = Training(sequence_length_tokens=4096, global_batch_sequences=64, **workload)
    ctx = training_context(
        model=model,
        cluster=get_preset("dgx-h100", num_nodes=4),
        workload=training,
        table=configs_to_table([config]),
        options=EstimateOptions(),
    )
    return {part: float(rows[0, 0]) for part, rows in stage_memory(ctx).items()}


@pytest.fixture(scope="module")
def moe_model() -> ModelSpec:
    return ModelSpec.from_hf_config(MOE, name="small-moe")


def test_transformer_engine_fp8_keeps_gemm_inputs_in_fp8_torchao_keeps_bf16(moe_model) -> None:
    config = ParallelConfig(dp=8, ep=8, micro_batch_size=1, recompute="none")
    bf16 = _memory(moe_model, config)["activations"]
    te = _memory(moe_model, config, precision="fp8", fp8_recipe="current")["activations"]
    torchao = _memory(moe_model, config, precision="fp8", fp8_recipe="tensorwise")["activations"]
    assert torchao == pytest.approx(bf16)
    assert 0.6 * bf16 < te < 0.95 * bf16


def test_expert_activations_split_over_expert_tensor_parallel(moe_model) -> None:
    whole = _memory(
        moe_model,
        ParallelConfig(dp=8, tp=2, ep=4, etp=1, micro_batch_size=1, sequence_parallel=True),
    )
    split = _memory(
        moe_model,
        ParallelConfig(dp=8, tp=2, ep=4, etp=2, micro_batch_size=1, sequence_parallel=True),
    )
    assert split["activations"] < whole["activations"]


def test_bf16_main_gradients_and_sharding_follow_the_zero_stage(moe_model) -> None:
    config = ParallelConfig(dp=16, ep=8, micro_batch_size=1, zero_stage=1)
    fp32 = _memory(moe_model, config)
    bf16 = _memory(moe_model, config, gradient_dtype="bf16")
    assert bf16["gradients"] == pytest.approx(fp32["gradients"] / 2.0)
    assert bf16["optimizer_states"] == pytest.approx(fp32["optimizer_states"])
    zero2 = _memory(moe_model, config.model_copy(update={"zero_stage": 2}))
    assert zero2["gradients"] < fp32["gradients"] / 2.0  # dense over dp=16, experts over edp=2


def _fits(model, cluster, workload, config) -> bool:
    columns = estimate_table(
        model, cluster, workload, configs_to_table([config]), options=EstimateOptions()
    )
    return bool(columns["memory_per_device_bytes"][0] <= cluster.device.memory_bytes)


def test_published_blackwell_runs_fit_unless_their_recipe_uses_a_technique_the_model_lacks() -> (
    None
):
    outcomes = {}
    for record in blackwell_records():
        model, cluster, workload, config = record_case(record)
        outcomes[record["run"]] = (
            _fits(model, cluster, workload, config),
            record.get("memory_note"),
        )
    assert len(outcomes) >= 8
    unexplained = [run for run, (fits, note) in outcomes.items() if not fits and not note]
    assert not unexplained
    assert all(
        not fits for fits, note in outcomes.values() if note
    )  # a note is only kept while it is needed


def test_published_twin_runs_fit_unless_noted() -> None:
    for record in fp8_twin_records():
        preset = get_preset(record["preset"])
        cluster = preset.with_nodes(max(1, math.ceil(record["gpus"] / preset.devices_per_node)))
        model = ModelSpec.from_hf_config(record["model"], name="twin")
        workload = Training(
            sequence_length_tokens=record["sequence_length"],
            global_batch_sequences=record["global_batch_sequences"],
            precision="fp8",
            fp8_recipe=record["fp8_recipe"],
            gradient_dtype=record.get("gradient_dtype", "fp32"),
        )
        fits = _fits(model, cluster, workload, ParallelConfig(**record["layout"]))
        assert fits or record.get("memory_note"), record["run"]


def test_fp8_cached_inputs_cut_the_activation_of_a_405b_pipeline_rank() -> None:
    record = next(r for r in blackwell_records() if r["run"] == "llama3.1-405b 256xGB200 fp8-cs")
    model, cluster, workload, config = record_case(record)
    bf16 = workload.model_copy(update={"precision": "bf16"})
    parts = {}
    for name, load in (("fp8", workload), ("bf16", bf16)):
        ctx = training_context(
            model=model,
            cluster=cluster,
            workload=load,
            table=configs_to_table([config]),
            options=EstimateOptions(),
        )
        parts[name] = stage_memory(ctx)["activations"]
    ratio = parts["fp8"] / parts["bf16"]
    assert np.all((ratio > 0.7) & (ratio < 0.9))


#: A small dense Llama-style config (tests/data/dense_8_layers.json).
DENSE = json.loads((Path(__file__).parent / "data" / "dense_8_layers.json").read_text())


def _dense_context(config: ParallelConfig, *, global_batch: int, framework: str | None, **workload):
    """A training context of the dense test model on one DGX H100 node."""
    return training_context(
        model=ModelSpec.from_hf_config(DENSE, name="dense"),
        cluster=get_preset("dgx-h100", num_nodes=1),
        workload=Training(
            sequence_length_tokens=4096,
            global_batch_sequences=global_batch,
            framework=framework,
            **workload,
        ),
        table=configs_to_table([config]),
        options=EstimateOptions(),
    )


def _activations(model, config, **options) -> float:
    ctx = training_context(
        model=model,
        cluster=get_preset("dgx-h100", num_nodes=1),
        workload=Training(sequence_length_tokens=4096, global_batch_sequences=64),
        table=configs_to_table([config]),
        options=EstimateOptions(**options),
    )
    return float(stage_memory(ctx)["activations"][0, 0])


def test_cpu_offloading_keeps_one_offloaded_layer_on_the_device() -> None:
    """Megatron-core --cpu-offloading-num-layers: each further offloaded layer frees one layer's
    activations; the first frees nothing, being the one in transit."""
    model = ModelSpec.from_hf_config(DENSE, name="dense")
    config = ParallelConfig(dp=8, micro_batch_size=1, recompute="none")
    kept = [_activations(model, config, activation_offload_layers=k) for k in range(4)]
    assert kept[1] == pytest.approx(kept[0])
    assert kept[1] - kept[2] == pytest.approx(kept[2] - kept[3])
    assert kept[2] < kept[1]


def test_block_recompute_of_some_layers_lies_between_none_and_full() -> None:
    model = ModelSpec.from_hf_config(DENSE, name="dense")
    plain = ParallelConfig(dp=8, micro_batch_size=1, recompute="none")
    full = plain.model_copy(update={"recompute": "full"})
    every = _activations(model, full)
    assert _activations(model, full, recompute_layers=8) == pytest.approx(every)
    some = [_activations(model, full, recompute_layers=k) for k in (2, 4)]
    assert every < some[1] < some[0] < _activations(model, plain)


def test_selective_recompute_modules_drop_what_they_recompute(moe_model) -> None:
    """core_attn (the default) keeps the Megatron selective accounting; the output-discarding
    modules drop their outputs; mla_up_proj only matters for MLA attention."""
    config = ParallelConfig(dp=8, ep=8, micro_batch_size=1, recompute="selective")
    default = _activations(moe_model, config)
    assert _activations(moe_model, config, recompute_modules=("core_attn",)) == default
    assert _activations(moe_model, config, recompute_modules=("core_attn", "mla_up_proj")) == (
        pytest.approx(default)
    )
    moe_act = _activations(moe_model, config, recompute_modules=("core_attn", "moe_act"))
    layernorm = _activations(moe_model, config, recompute_modules=("core_attn", "layernorm"))
    whole = _activations(moe_model, config, recompute_modules=("core_attn", "moe"))
    assert whole < moe_act < default
    assert layernorm < default


def test_distributed_optimizer_instances_shard_over_their_share_of_ranks() -> None:
    model = ModelSpec.from_hf_config(DENSE, name="dense")
    config = ParallelConfig(dp=8, micro_batch_size=1, zero_stage=1)

    def states(instances: int) -> float:
        ctx = training_context(
            model=model,
            cluster=get_preset("dgx-h100", num_nodes=1),
            workload=Training(sequence_length_tokens=4096, global_batch_sequences=64),
            table=configs_to_table([config]),
            options=EstimateOptions(optimizer_instances=instances),
        )
        return float(stage_memory(ctx)["optimizer_states"][0, 0])

    assert states(2) == pytest.approx(2.0 * states(1))


def _stage_parts(config, **workload) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Memory parts per pipeline rank (3,) and each rank's parameters per device (3,)."""
    model = ModelSpec.from_hf_config(DENSE, name="dense")
    ctx = training_context(
        model=model,
        cluster=get_preset("dgx-h100", num_nodes=2),
        workload=Training(sequence_length_tokens=4096, global_batch_sequences=64, **workload),
        table=configs_to_table([config]),
        options=EstimateOptions(),
    )
    parameters = sum(ctx.parameters.values())[:, 0]
    return {part: rows[:, 0] for part, rows in stage_memory(ctx).items()}, parameters


def test_fsdp_pipeline_stage_holds_its_gathered_weights_and_unsharded_gradients() -> None:
    """torch.distributed.pipelining runs an FSDP2 stage's backwards without gradient sync or
    reshard: each rank holds its stage's bf16 parameters and, with an fp32 reduce dtype
    (torchtitan), fp32 unsharded gradients, beyond its fp32 sharded master weights."""
    fsdp = ParallelConfig(dp=4, pp=2, micro_batch_size=1, zero_stage=3)
    parts, parameters = _stage_parts(fsdp, framework="torchtitan")
    assert parts["weights"] == pytest.approx(2.0 * parameters)  # master weights: optimizer
    assert parts["gradients"] == pytest.approx(4.0 * parameters)
    # Without a framework the reduction runs in the main-gradient dtype (fp32 here).
    plain, _ = _stage_parts(fsdp)
    assert plain["gradients"] == pytest.approx(4.0 * parameters)
    assert plain["weights"] == pytest.approx(2.0 * parameters + 2.0 * parameters / 4)
    # No per-layer gathers or fp32 gradient bucket on top: one layer's bf16 gradient waits to
    # be added into the accumulated one (less than ZeRO-2's fp32 bucket of one layer).
    zero2, _ = _stage_parts(fsdp.model_copy(update={"zero_stage": 2}), framework="torchtitan")
    assert np.all(parts["comm_buffers"] < zero2["comm_buffers"])


def test_fsdp_without_pipeline_or_below_zero3_holds_no_unsharded_stage() -> None:
    """pp = 1 (FSDP reshards each layer and reduce-scatters every backward) and ZeRO-2 under pp
    keep the sharded accounting: the held stage appears only for ZeRO-3 with pp > 1, where
    it costs the stage's bf16 weights and the unsharded share of its fp32 gradients."""
    single, parameters = _stage_parts(
        ParallelConfig(dp=8, micro_batch_size=1, zero_stage=3), framework="torchtitan"
    )
    assert single["weights"] == pytest.approx(0.0)
    assert single["gradients"] == pytest.approx(4.0 * parameters / 8)
    layout = ParallelConfig(dp=4, pp=2, micro_batch_size=1, zero_stage=3)
    pipelined, stage = _stage_parts(layout, framework="torchtitan")
    zero2, _ = _stage_parts(layout.model_copy(update={"zero_stage": 2}), framework="torchtitan")
    assert zero2["gradients"] == pytest.approx(4.0 * stage / 4)
    held = pipelined["weights"] + pipelined["gradients"] - zero2["gradients"]
    assert held == pytest.approx(2.0 * stage + 4.0 * stage * 3 / 4)


def test_fsdp2_holds_a_layers_bf16_gradients_beside_its_reduce_scatter_input() -> None:
    """torch's FSDP2 copies a layer's autograd gradients (bf16) into a reduce-scatter input of
    the reduce dtype and frees them only after, while the previous layer's input is still held:
    one layer of bf16 gradients more than a ZeRO-3 that reduces in place, none under ZeRO-2."""

    def buffers(config, **workload) -> tuple[float, float]:
        ctx = training_context(
            model=ModelSpec.from_hf_config(DENSE, name="dense"),
            cluster=get_preset("dgx-h100", num_nodes=2),
            workload=Training(sequence_length_tokens=4096, global_batch_sequences=64, **workload),
            table=configs_to_table([config]),
            options=EstimateOptions(),
        )
        layer = float(np.asarray(layer_parameter_split(ctx)[0]).ravel()[0])
        return float(sharding_buffer_bytes(ctx)[0, 0]), layer

    zero3 = ParallelConfig(dp=8, micro_batch_size=1, zero_stage=3)
    fsdp2, layer = buffers(zero3, framework="torchtitan")
    plain, _ = buffers(zero3)
    assert layer > 0 and fsdp2 - plain == pytest.approx(2.0 * layer)
    zero2 = zero3.model_copy(update={"zero_stage": 2})
    assert buffers(zero2, framework="torchtitan")[0] == pytest.approx(buffers(zero2)[0])


def test_fp8_all_gather_keeps_the_stage_layers_in_fp8() -> None:
    """torchao's fp8 all-gather (tensorwise) leaves the gathered fp8 data as the unsharded
    weight: the held layers take 1 byte per parameter, the embedding and LM head 2."""
    fsdp = ParallelConfig(dp=4, pp=4, micro_batch_size=1, zero_stage=3)
    bf16, parameters = _stage_parts(fsdp, framework="torchtitan")
    fp8, _ = _stage_parts(fsdp, framework="torchtitan", precision="fp8", fp8_recipe="tensorwise")
    ends = 32000 * 2048  # the first rank's embedding, the last rank's LM head
    first, last = 0, 2
    for rank in (first, last):
        assert fp8["weights"][rank] == pytest.approx(parameters[rank] + ends, rel=1e-3)
        assert bf16["weights"][rank] == pytest.approx(2.0 * parameters[rank])
    assert fp8["weights"][1] == pytest.approx(parameters[1])  # a middle rank: layers only
    assert fp8["gradients"] == pytest.approx(bf16["gradients"])


def test_torchtitan_loss_parallel_holds_more_per_logit_than_its_single_rank_loss() -> None:
    """torchtitan's vocab-parallel loss (tp > 1) holds 16 bytes per logit in its backward, its
    eager single-rank cross entropy 12; a framework without loss parallel keeps its figure."""
    from cost_model._memory import _loss_bytes_per_logit

    def per_logit(tp: int, framework: str | None) -> float:
        config = ParallelConfig(dp=8 // tp, tp=tp, micro_batch_size=1, sequence_parallel=tp > 1)
        ctx = _dense_context(config, global_batch=64, framework=framework)
        return float(np.asarray(_loss_bytes_per_logit(ctx)).reshape(-1)[0])

    assert per_logit(2, "torchtitan") == 16.0
    assert per_logit(1, "torchtitan") == 12.0
    assert per_logit(2, "megatron-core") == per_logit(1, "megatron-core") == 4.0
    assert per_logit(2, None) == 4.0


def test_a_compiled_cross_entropy_saves_only_the_bf16_logits_and_row_statistics() -> None:
    """What ``FrameworkProfile.compiled_loss_bytes_per_logit`` rests on, measured: torchtitan's
    loss (``cross_entropy(pred.flatten(0, 1).float(), labels)``) run eagerly saves fp32 tensors
    of the logits' shape for its backward; under torch.compile AOTAutograd saves only the bf16
    logits themselves (already alive: 2 bytes) and per-row fp32 statistics, and Inductor's
    backward writes the gradient in bf16 (2 bytes), with no fp32 copy of the logits."""
    import torch
    import torch.nn.functional as F

    rows, vocab = 64, 1024

    def loss_fn(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))

    def saved(fn) -> tuple[list[tuple[torch.dtype, int, bool]], torch.dtype]:
        logits = torch.randn(1, rows, vocab, dtype=torch.bfloat16, requires_grad=True)
        labels = torch.randint(0, vocab, (1, rows))
        found: list[tuple[torch.dtype, int, bool]] = []

        def pack(t: torch.Tensor) -> torch.Tensor:
            same = t.untyped_storage().data_ptr() == logits.untyped_storage().data_ptr()
            found.append((t.dtype, t.numel(), same))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = fn(logits, labels)
        loss.backward()
        assert logits.grad is not None
        return found, logits.grad.dtype

    eager, _ = saved(loss_fn)
    assert any(d == torch.float32 and n == rows * vocab and not same for d, n, same in eager)
    compiled, grad_dtype = saved(torch.compile(loss_fn))
    full = [(d, same) for d, n, same in compiled if n == rows * vocab]
    assert full == [(torch.bfloat16, True)]  # the logits themselves, no copy
    assert all(n <= rows for d, n, same in compiled if n != rows * vocab)  # per-row statistics
    assert grad_dtype == torch.bfloat16


def test_a_compiling_framework_holds_four_bytes_per_logit_unless_its_loss_stayed_eager() -> None:
    """torchtitan compiles its loss under --compile (from bbb1b616e, 2025-04-02): 4 bytes per
    logit at tp 1 instead of the eager 12; a run that kept the loss eager (torchtitan at
    9dec370) records it (``EstimateOptions.eager_loss``); tp > 1 keeps the loss-parallel 16."""
    from cost_model._memory import _loss_bytes_per_logit

    def per_logit(tp: int, *, eager_loss: bool) -> float:
        config = ParallelConfig(dp=8 // tp, tp=tp, micro_batch_size=1, sequence_parallel=tp > 1)
        ctx = training_context(
            model=ModelSpec.from_hf_config(DENSE, name="dense"),
            cluster=get_preset("dgx-h100", num_nodes=1),
            workload=Training(
                sequence_length_tokens=4096,
                global_batch_sequences=64,
                framework="torchtitan-compile",
            ),
            table=configs_to_table([config]),
            options=EstimateOptions(eager_loss=eager_loss),
        )
        return float(np.asarray(_loss_bytes_per_logit(ctx)).reshape(-1)[0])

    assert per_logit(1, eager_loss=False) == 4.0
    assert per_logit(1, eager_loss=True) == 12.0
    assert per_logit(2, eager_loss=False) == per_logit(2, eager_loss=True) == 16.0


def test_a_pipeline_that_returns_its_outputs_keeps_every_micro_batch_of_logits() -> None:
    """torch.distributed.pipelining's last stage appends each micro-batch's output to
    ``output_chunks`` when the schedule returns them: the last rank holds m micro-batches of
    bf16 logits instead of the one in flight (1F1B) its schedule holds until the backward; the
    other ranks, and a run without a pipeline, hold nothing more."""
    model = ModelSpec.from_hf_config(DENSE, name="dense")

    def activations(config: ParallelConfig, keeps: bool) -> np.ndarray:
        ctx = training_context(
            model=model,
            cluster=get_preset("dgx-h100", num_nodes=1),
            workload=Training(sequence_length_tokens=4096, global_batch_sequences=64),
            table=configs_to_table([config]),
            options=EstimateOptions(pipeline_keeps_outputs=keeps),
        )
        return stage_memory(ctx)["activations"][:, 0]

    pipelined = ParallelConfig(dp=2, tp=2, pp=2, micro_batch_size=2, sequence_parallel=True)
    added = activations(pipelined, True) - activations(pipelined, False)
    micro_batches = 64 / (2 * 2)
    logits = 2 * 4096 * 32000 / 2 * 2.0  # tokens x vocab / tp, bf16
    assert added[:2] == pytest.approx([0.0, 0.0])  # first and middle (here the first) rank
    assert added[2] == pytest.approx((micro_batches - 1) * logits)
    single = ParallelConfig(dp=4, tp=2, micro_batch_size=2, sequence_parallel=True)
    assert activations(single, True) == pytest.approx(activations(single, False))


def test_torch_pipelining_keeps_a_receive_buffer_per_micro_batch() -> None:
    """On torch.distributed.pipelining (autoparallel's runtime, torchtitan) a stage keeps an input
    and an output-gradient buffer per micro-batch and the outputs of the micro-batches in flight;
    Megatron-core allocates a send and a receive buffer per transfer. 1F1B, pp 4, 16
    micro-batches: the first rank holds 4 in flight, rank 1 three, the last one."""
    from cost_model._memory import pipeline_buffer_bytes

    config = ParallelConfig(dp=1, tp=2, pp=4, micro_batch_size=2, sequence_parallel=True)

    def buffers(framework: str | None) -> np.ndarray:
        ctx = _dense_context(config, global_batch=32, framework=framework)
        return pipeline_buffer_bytes(ctx)[:, 0]

    hidden = 2 * 4096 * DENSE["hidden_size"] * 2.0  # micro-batch tokens x width, bf16
    message = hidden / 2  # over tp
    m = 16
    # first: no input buffers; gradient buffers and the 4 outputs in flight
    # middle (rank 1): 16 - 3 idle inputs, 16 gradient buffers, 3 outputs in flight
    # last: 16 - 1 idle inputs; its output is the logits, counted with the loss
    expected = [(m + 4) * message, ((m - 3) + m + 3) * message, (m - 1) * message]
    assert buffers(None) == pytest.approx(expected)
    assert buffers("torchtitan") == pytest.approx(expected)
    assert buffers("megatron-core") == pytest.approx([2 * message] * 3)


def test_a_dtensor_plan_keeps_the_gathered_input_of_its_column_parallel_gemms(monkeypatch) -> None:
    """Under sequence parallelism Megatron-core keeps each norm output as its sequence shard and
    gathers it again in backward; a DTensor plan (torchtitan, autoparallel's runtime) keeps the
    gathered whole sequence: per layer and micro-batch two norm outputs x tokens x width x
    (1 - 1/tp) more, at 1 byte per element where tensorwise float8 gathers in fp8. Compared:
    torchtitan's profile as shipped and with ``tp_saves_gathered_input`` off."""
    import cost_model._training_context as context
    from cost_model._frameworks import framework_profile
    from cost_model._memory import _layer_activation_bytes

    config = ParallelConfig(dp=1, tp=4, micro_batch_size=2, sequence_parallel=True)
    shipped = framework_profile("torchtitan")
    assert shipped.tp_saves_gathered_input

    def layer(gathered: bool, **workload) -> float:
        profile = shipped.model_copy(update={"tp_saves_gathered_input": gathered})
        monkeypatch.setattr(context, "framework_profile", lambda name: profile)
        ctx = _dense_context(config, global_batch=8, framework="torchtitan", **workload)
        return float(_layer_activation_bytes(ctx, moe=False)[0])

    tokens, width = 2 * 4096, DENSE["hidden_size"]
    norm_outputs = 2 * tokens * width
    assert layer(True) - layer(False) == pytest.approx(norm_outputs * 2.0 * (1 - 1 / 4))
    fp8 = {"precision": "fp8", "fp8_recipe": "tensorwise"}
    assert layer(True, **fp8) - layer(False, **fp8) == pytest.approx(norm_outputs * (1.0 - 2.0 / 4))
