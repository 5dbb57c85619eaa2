"""FP8 training priced per operator (cost_model._precision) and its bf16/fp8 twin validation."""

from __future__ import annotations

import json
from importlib import resources

import numpy as np
import pytest

from cost_model import ParallelConfig, Training, estimate, estimate_table
from cost_model._memory import _fp8_cached_input_saving, stage_memory
from cost_model._model_spec import ModelSpec
from cost_model._options import EstimateOptions
from cost_model._precision import (
    FP8_RECIPES,
    caches_fp8_input,
    fp8_gemm_speedup,
    quantization_bytes,
    quantization_time_s,
    rowwise_post_scale_bytes,
)
from cost_model._precision_validation import (
    FP8_TWIN_TOLERANCE,
    fp8_twin_records,
    fp8_twin_speedups,
)
from cost_model._table import configs_to_table
from cost_model._training_context import training_context
from cost_model._training_ops import attention_projection_time
from topology import get_preset

LLAMA_8B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
}


@pytest.fixture(scope="module")
def model() -> ModelSpec:
    return ModelSpec.from_hf_config(LLAMA_8B, name="llama3-8b")


def _context(model, *, precision: str, recipe: str = "tensorwise", framework: str | None = None):
    workload = Training(
        sequence_length_tokens=8192,
        global_batch_sequences=8,
        precision=precision,
        fp8_recipe=recipe,
        framework=framework,
    )
    table = configs_to_table(
        [ParallelConfig(dp=8, zero_stage=1, micro_batch_size=1, recompute="selective")]
    )
    return training_context(
        model=model,
        cluster=get_preset("dgx-h100"),
        workload=workload,
        table=table,
        options=EstimateOptions(),
    )


def test_fp8_gemm_speedup_grows_with_size_and_stays_below_the_peak_ratio() -> None:
    device = get_preset("dgx-h100").device
    sizes = np.array([1e9, 1e11, 1e12, 1e13])
    speedup = fp8_gemm_speedup(hardware=device, recipe="tensorwise", flops_per_call=sizes)
    assert np.all(np.diff(speedup) > 0)
    peak_ratio = device.peak_flops_for("fp8") / device.peak_flops_for("bf16")
    assert speedup[0] < 1.0
    assert 1.5 < speedup[-1] < peak_ratio
    blockwise = fp8_gemm_speedup(hardware=device, recipe="blockwise", flops_per_call=1e12)
    assert blockwise < speedup[2]


def test_unknown_recipe_is_rejected_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="fp8_recipe"):
        fp8_gemm_speedup(hardware=get_preset("dgx-h100").device, recipe="int8", flops_per_call=1e12)


def test_only_fp8_roles_speed_up_router_head_and_attention_stay_bf16(model) -> None:
    bf16, fp8 = _context(model, precision="bf16"), _context(model, precision="fp8")
    flops, moved = np.array([1e12]), np.array([1e9])
    for role in ("router", "lm_head"):
        assert fp8.op(flops, moved, role=role) == pytest.approx(bf16.op(flops, moved, role=role))
    assert fp8.op(flops, moved, kind="attention") == pytest.approx(
        bf16.op(flops, moved, kind="attention")
    )
    assert fp8.op(flops, moved, role="linear") < 0.7 * bf16.op(flops, moved, role="linear")


def test_quantization_kernels_cost_nothing_in_bf16_and_follow_the_recipe_bytes(
    model,
) -> None:
    assert quantization_time_s(_context(model, precision="bf16"), moe=False)[0] == 0.0
    times = {
        recipe: quantization_time_s(_context(model, precision="fp8", recipe=recipe), moe=False)[0]
        for recipe in FP8_RECIPES
    }
    assert times["delayed"] > 0.0
    assert times["rowwise"] > times["tensorwise"] > times["delayed"]


def test_torchao_mxfp8_casts_each_operand_twice_and_keeps_the_bf16_input(model) -> None:
    te = _context(model, precision="fp8", recipe="mxfp8", framework="megatron-core")
    torchao = _context(model, precision="fp8", recipe="mxfp8", framework="torchtitan-compile")
    # Transformer Engine: one read, both fp8 layouts and their 1x32 scales written.
    assert quantization_bytes(te) == (2.0 + 2.0 * (1.0 + 1.0 / 32.0), 4.0)
    # torchao mx_mm: a dim0 and a dim1 kernel, each reading the bf16 operand.
    assert quantization_bytes(torchao) == (2.0 * (3.0 + 1.0 / 32.0),) * 2
    assert quantization_time_s(torchao, moe=False)[0] > 1.3 * quantization_time_s(te, moe=False)[0]
    assert caches_fp8_input(te) and not caches_fp8_input(torchao)
    # The recipes torchao already names keep their bytes under either framework.
    for recipe in ("tensorwise", "rowwise"):
        pair = [
            quantization_bytes(_context(model, precision="fp8", recipe=recipe, framework=name))
            for name in ("megatron-core", "torchtitan-compile")
        ]
        assert pair[0] == pair[1] == (FP8_RECIPES[recipe], 4.0)
    # Activation memory: the fp8 copy saves a byte per cached input element under TE only.
    assert _fp8_cached_input_saving(te, moe=False)[0] > 0.0
    assert _fp8_cached_input_saving(torchao, moe=False)[0] == 0.0


def test_torchao_rowwise_scales_its_backward_gemm_outputs_in_a_pass_of_their_own(model) -> None:
    """torchao runs rowwise's slow-accumulation backward GEMMs on the tensorwise kernel and
    multiplies the bf16 outputs by their scales afterwards: the weight gradients always (their
    consumer is outside the compiled graph), the input gradients too where nothing fuses them."""
    compiled = _context(model, precision="fp8", recipe="rowwise", framework="torchtitan-compile")
    eager = _context(model, precision="fp8", recipe="rowwise", framework="torchtitan")
    weights = model.attention_parameters() + model.ffn_parameters(model.ffn_hidden_size)
    assert rowwise_post_scale_bytes(compiled, moe=False)[0] == pytest.approx(4.0 * weights)
    # Eager: the input gradients too, tokens x (attention and FFN input widths).
    inputs = 8192 * (2 * model.hidden_size + model.hidden_size + model.ffn_hidden_size)
    assert rowwise_post_scale_bytes(eager, moe=False)[0] == pytest.approx(4.0 * (weights + inputs))
    # Only torchao's rowwise: Transformer Engine, other recipes and bf16 move nothing.
    for context in (
        _context(model, precision="fp8", recipe="rowwise", framework="megatron-core"),
        _context(model, precision="fp8", recipe="tensorwise", framework="torchtitan-compile"),
        _context(model, precision="bf16", recipe="rowwise", framework="torchtitan-compile"),
    ):
        assert rowwise_post_scale_bytes(context, moe=False)[0] == 0.0
    # It is priced with the recipe's quantization passes.
    te_like = _context(model, precision="fp8", recipe="rowwise", framework="megatron-core")
    assert quantization_time_s(compiled, moe=False)[0] > quantization_time_s(te_like, moe=False)[0]


def test_fp8_step_is_faster_than_bf16_but_far_from_twice(model) -> None:
    cluster = get_preset("dgx-h100")
    config = ParallelConfig(dp=8, zero_stage=3, micro_batch_size=1, recompute="selective")
    steps = {
        precision: estimate(
            model,
            cluster,
            Training(
                sequence_length_tokens=8192,
                global_batch_sequences=8,
                precision=precision,
            ),
            config,
        ).step_time_s
        for precision in ("bf16", "fp8")
    }
    assert 1.05 < steps["bf16"] / steps["fp8"] < 1.6


def test_bf16_main_gradients_halve_gradient_memory(model) -> None:
    table = configs_to_table(
        [ParallelConfig(dp=8, zero_stage=0, micro_batch_size=1, recompute="full")]
    )
    memory = {}
    for dtype in ("fp32", "bf16"):
        workload = Training(
            sequence_length_tokens=8192, global_batch_sequences=8, gradient_dtype=dtype
        )
        ctx = training_context(
            model=model,
            cluster=get_preset("dgx-h100"),
            workload=workload,
            table=table,
            options=EstimateOptions(),
        )
        memory[dtype] = stage_memory(ctx)["gradients"][0, 0]
    assert memory["bf16"] == pytest.approx(memory["fp32"] / 2.0)


def test_twin_runs_are_validation_rows_from_two_or_more_sources_never_fit_inputs() -> None:
    records = fp8_twin_records()
    bounded = [r for r in records if not r.get("excluded")]
    assert len(bounded) >= 10
    assert len({r["source"].split(",")[0].split(";")[0] for r in bounded}) >= 2
    curves = (resources.files("cost_model") / "data" / "fp8_gemm_curves.json").read_text()
    assert "fp8_twins" not in curves and "tokens_per_s" not in curves
    source = (resources.files("cost_model") / "_precision.py").read_text()
    assert "fp8_twins" not in source
    assert all(r["source"] and r["bf16_tokens_per_s_per_gpu"] > 0 for r in records)
    assert all(json.dumps(r["layout"]) for r in records)
    from cost_model._frameworks import framework_names

    assert all(r["framework"] in framework_names() for r in records)
    # Each async-TP twin's profile hides tensor-parallel traffic; its vanilla-TP twin's does not.
    from cost_model._frameworks import framework_profile

    for record in records:
        overlap = framework_profile(record["framework"]).tp_comm_overlap
        assert (overlap > 0.0) == (
            "async TP" in record["run"] or record["framework"] == "megatron-core"
        )


def test_twins_on_devices_with_a_measured_fp8_gemm_curve_are_within_tolerance() -> None:
    rows = [row for row in fp8_twin_speedups() if not row["excluded"] and row["fp8_operator"]]
    assert len(rows) >= 8
    errors = {row["run"]: row["predicted"] / row["published"] - 1.0 for row in rows}
    assert all(abs(error) <= FP8_TWIN_TOLERANCE for error in errors.values()), errors


def test_first_and_last_layers_in_bf16_slow_the_end_ranks_only(model) -> None:
    cluster = get_preset("dgx-h100", num_nodes=2)
    config = ParallelConfig(dp=4, pp=4, micro_batch_size=1, recompute="selective", zero_stage=1)
    table = configs_to_table([config])
    times = {}
    for name, edges in (("fp8", 0), ("edges", 2)):
        workload = Training(
            sequence_length_tokens=8192,
            global_batch_sequences=32,
            precision="fp8",
            fp8_bf16_layers_at_start=edges,
            fp8_bf16_layers_at_end=edges,
        )
        ctx = training_context(
            model=model, cluster=cluster, workload=workload, table=table, options=EstimateOptions()
        )
        times[name] = np.broadcast_to(attention_projection_time(ctx), (3, 1))[:, 0]
    assert times["edges"][0] > times["fp8"][0] and times["edges"][2] > times["fp8"][2]
    assert times["edges"][1] == pytest.approx(times["fp8"][1])  # a middle rank holds no end layer


def test_fp8_gemms_are_priced_from_the_calibrations_fp8_operator_fit(model) -> None:
    from cost_model._options import calibration_for
    from cost_model._precision import fp8_gemm_fit
    from cost_model._pricing import op_time_s

    ctx = _context(model, precision="fp8")
    calibration = calibration_for(ctx.cluster.device)
    efficiency, overhead = fp8_gemm_fit(calibration, "tensorwise")
    # A fraction of the fp8 peak below the bf16 one: fp8 is not the bf16 efficiency at 2x peak.
    assert 0.2 < efficiency < calibration.matmul_efficiency
    flops, moved, calls = np.array([4e12]), np.array([1e8]), np.array([2.0])
    expected = op_time_s(
        flops=flops,
        bytes_moved=moved,
        hardware=ctx.cluster.device,
        dtype="fp8",
        calibration=calibration.model_copy(update={"matmul_efficiency": efficiency}),
        calls=calls,
    ) + calls * (overhead - calibration.kernel_overhead_s)
    assert ctx.op(flops, moved, calls, role="linear") == pytest.approx(expected)
    # The 1x128 block-scaled recipe takes the block-scaled table's fit; MXFP8, a cuBLASLt GEMM
    # in Transformer Engine and torchao, the per-tensor (vendor library) table's.
    assert fp8_gemm_fit(calibration, "blockwise") != fp8_gemm_fit(calibration, "tensorwise")
    assert fp8_gemm_fit(calibration, "mxfp8") == fp8_gemm_fit(calibration, "tensorwise")


def test_a_device_without_fp8_operator_tables_is_marked_not_bounded() -> None:
    from cost_model._precision_validation import NO_FP8_CURVE, fp8_twin_rows

    rows = fp8_twin_rows()
    marked = [row for row in rows if row.table == "fp8_twins_no_fp8_curve"]
    assert marked and all("MI300X" in row.run and NO_FP8_CURVE in row.run for row in marked)
    assert not any("MI300X" in row.run for row in rows if row.table == "fp8_twins")
    from cost_model._validation import TOLERANCES

    assert TOLERANCES["fp8_twins_no_fp8_curve"] == (None, None)


def _fsdp_tp_context(
    model,
    *,
    precision: str,
    recipe: str,
    tp: int = 1,
    sequence_parallel: bool | None = None,
    config: ParallelConfig | None = None,
    global_batch_sequences: int = 16,
):
    """A ZeRO-3 training context on two H100 nodes, sequences of 8192 tokens: FSDP x ``tp`` with
    selective recompute, or ``config``."""
    if config is None:
        config = ParallelConfig(
            dp=16 // tp,
            tp=tp,
            zero_stage=3,
            micro_batch_size=1,
            recompute="selective",
            sequence_parallel=tp > 1 if sequence_parallel is None else sequence_parallel,
        )
    workload = Training(
        sequence_length_tokens=8192,
        global_batch_sequences=global_batch_sequences,
        precision=precision,
        fp8_recipe=recipe,
    )
    return training_context(
        model=model,
        cluster=get_preset("dgx-h100", num_nodes=2),
        workload=workload,
        table=configs_to_table([config]),
        options=EstimateOptions(),
    )


def test_tensorwise_fp8_halves_the_fsdp_weight_gather_only(model) -> None:
    from cost_model._training_comm import collective_times

    gathers = {
        (precision, recipe): collective_times(
            _fsdp_tp_context(model, precision=precision, recipe=recipe)
        ).fsdp_layer
        for precision, recipe in (("bf16", "tensorwise"), ("fp8", "tensorwise"), ("fp8", "rowwise"))
    }
    bf16, tensorwise, rowwise = (
        gathers[("bf16", "tensorwise")],
        gathers[("fp8", "tensorwise")],
        gathers[("fp8", "rowwise")],
    )
    assert tensorwise.dense_gather[0] < 0.75 * bf16.dense_gather[0]
    assert rowwise.dense_gather[0] == pytest.approx(bf16.dense_gather[0])
    assert tensorwise.dense_scatter[0] == pytest.approx(bf16.dense_scatter[0])
    assert np.allclose(tensorwise.ends_gather, bf16.ends_gather)


def test_fp8_fsdp_gather_needs_a_data_parallel_shard_dimension(model) -> None:
    """torchtitan enables torchao's fp8 all-gather only with dp_shard > 1: FSDP over context-
    parallel ranks alone gathers, and a pipeline stage holds, its weights in bf16."""
    from cost_model._memory import _unsharded_stage_weight_bytes
    from cost_model._training_comm import fsdp_weight_gather_bytes

    def context(dp: int, cp: int):
        config = ParallelConfig(dp=dp, cp=cp, pp=2, zero_stage=3, recompute="full")
        return _fsdp_tp_context(
            model, precision="fp8", recipe="tensorwise", config=config, global_batch_sequences=64
        )

    sharded, cp_only = context(dp=8, cp=1), context(dp=1, cp=8)
    assert np.all(fsdp_weight_gather_bytes(sharded) == 1.0)
    assert np.all(fsdp_weight_gather_bytes(cp_only) == 2.0)
    held = _unsharded_stage_weight_bytes(cp_only) / _unsharded_stage_weight_bytes(sharded)
    assert np.all((held > 1.6) & (held <= 2.0))  # the layers double, the ends stay bf16


def test_tensorwise_fp8_gathers_in_fp8_and_reduce_scatters_in_bf16_under_sequence_parallel(
    model,
) -> None:
    from cost_model._training_comm import collective_times

    contexts = {
        (precision, recipe): _fsdp_tp_context(model, precision=precision, recipe=recipe, tp=8)
        for precision, recipe in (("bf16", "tensorwise"), ("fp8", "tensorwise"), ("fp8", "rowwise"))
    }
    bf16, fp8, rowwise = (collective_times(ctx) for ctx in contexts.values())
    ctx = contexts[("bf16", "tensorwise")]
    tp, message = ctx.column("tp"), ctx.tokens * ctx.model.hidden_size * 2.0
    scatter = ctx.collective("reduce_scatter", axis="tp", group_size=tp, message_bytes=message)
    fp8_gather = ctx.collective("all_gather", axis="tp", group_size=tp, message_bytes=message / 2)
    # Forward input and backward output-gradient gathers move 1 byte; the scatters stay bf16.
    assert fp8.tp_split[0] == pytest.approx((scatter + fp8_gather)[0])
    assert fp8.tp_split[0] < bf16.tp_split[0]
    assert rowwise.tp_split[0] == pytest.approx(bf16.tp_split[0])
    assert fp8.tp_all_reduce[0] == pytest.approx(bf16.tp_all_reduce[0])  # no SP: no fp8 gather


def test_tensorwise_casts_sequence_parallel_tensors_on_their_shard_before_the_gather(model) -> None:
    from cost_model._precision import (
        TRANSPOSED_COPY_BYTES,
        _cast_before_gather_elements,
        _layer_quantized_elements,
    )

    def context(recipe: str, *, sequence_parallel: bool):
        return _fsdp_tp_context(
            model, precision="fp8", recipe=recipe, tp=8, sequence_parallel=sequence_parallel
        )

    sp, no_sp = (
        context("tensorwise", sequence_parallel=True),
        context("tensorwise", sequence_parallel=False),
    )
    # Attention and FFN inputs (forward), their output projections' gradients (backward).
    cast = _cast_before_gather_elements(sp, moe=False)[0]
    assert cast == pytest.approx(4 * 8192 * model.hidden_size)
    assert _cast_before_gather_elements(no_sp, moe=False)[0] == 0.0
    assert (
        _cast_before_gather_elements(context("rowwise", sequence_parallel=True), moe=False)[0]
        == 0.0
    )
    # Amax and cast on the 1/tp shard; the gathered tensor's transposed copy reads and writes.
    elements, weights = (x[0] for x in _layer_quantized_elements(sp, moe=False))
    per_element = FP8_RECIPES["tensorwise"]
    full = per_element * elements + 4.0 * weights
    on_shard = (per_element - TRANSPOSED_COPY_BYTES) / 8.0 + 2.0 * TRANSPOSED_COPY_BYTES
    expected = full - (per_element - on_shard) * cast
    ratio = quantization_time_s(sp, moe=False)[0] / quantization_time_s(no_sp, moe=False)[0]
    assert ratio == pytest.approx(expected / full, rel=0.05)
    assert ratio < 0.7


def test_bf16_end_layers_price_whole_estimates_of_every_pipeline_depth(model) -> None:
    # The end layers make the ranks' layer times differ (3, n); one pipeline stage (the first
    # and last rank the same) and ZeRO-3's per-layer windows take them as such.
    cluster = get_preset("dgx-h100", num_nodes=1)
    table = configs_to_table(
        [
            ParallelConfig(tp=8, dp=1),
            ParallelConfig(tp=4, dp=2, zero_stage=3),
            ParallelConfig(tp=2, pp=2, dp=2, zero_stage=1),
        ]
    )
    steps = {}
    for edges in (0, 1):
        workload = Training(
            sequence_length_tokens=4096,
            global_batch_sequences=256,
            precision="fp8",
            fp8_bf16_layers_at_start=edges,
            fp8_bf16_layers_at_end=edges,
        )
        steps[edges] = estimate_table(model, cluster, workload, table)["step_time_s"]
    assert np.all(np.isfinite(steps[1])) and not np.allclose(steps[1], steps[0])
