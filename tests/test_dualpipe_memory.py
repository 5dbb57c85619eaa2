"""DeepSeek-V3's memory setup: DualPipe's two stages per rank and pp + 1 micro-batches in
flight, bf16 optimizer moments, fp8 SwiGLU inputs; and the report's pre-training run, which fits
its 80 GB H800s under them."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from autoparallel import get_model
from autoparallel.cli import main
from cost_model import EstimateOptions, ParallelConfig, Training
from cost_model._memory import micro_batches_in_flight, stage_memory
from cost_model._options import Calibration
from cost_model._table import configs_to_table
from cost_model._training_comm import collective_times
from cost_model._training_context import training_context
from cost_model._training_dp import _optimizer_update_bytes
from cost_model._validation import peak_memory_bytes, run_case
from cost_model._validation_cases import training_cases
from topology import get_preset

MODEL = get_model("deepseek-v3")
CLUSTER = get_preset("hgx-h800", num_nodes=64)
CONFIG = ParallelConfig(dp=32, pp=16, ep=32, zero_stage=1, recompute="selective")


def _workload(**changes) -> Training:
    return Training(
        sequence_length_tokens=4096,
        global_batch_sequences=1024,
        precision="fp8",
        fp8_recipe="blockwise",
        framework="megatron-core",
        **changes,
    )


def _ctx(*, workload: Training | None = None, **options):
    return training_context(
        model=MODEL,
        cluster=CLUSTER,
        workload=workload or _workload(),
        table=configs_to_table([CONFIG]),
        options=EstimateOptions(calibration=Calibration(), **options),
    )


def _parts(ctx) -> dict[str, np.ndarray]:
    return {part: np.asarray(bytes_).reshape(-1) for part, bytes_ in stage_memory(ctx).items()}


def test_a_bidirectional_pipeline_holds_two_stages_and_pp_plus_one_micro_batches() -> None:
    # DeepSeek-V3 report Table 2: DualPipe parameters 2x, activations PP + 1 (1F1B: 1x, PP)
    one_f_one_b, dual = _ctx(), _ctx(bidirectional_pipeline=True)
    assert np.asarray(dual.stage_copies).tolist() == [2.0]
    assert np.asarray(one_f_one_b.stage_copies).tolist() == [1.0]
    single, double = _parts(one_f_one_b), _parts(dual)
    for part in ("weights", "gradients", "optimizer_states"):
        assert double[part] == pytest.approx(2.0 * single[part], rel=1e-12), part
    held_1f1b = np.asarray(micro_batches_in_flight(one_f_one_b)).reshape(-1)
    held_dual = np.asarray(micro_batches_in_flight(dual)).reshape(-1)
    assert held_1f1b.tolist() == [16.0, 15.0, 1.0]  # first, a middle and the last rank
    assert held_dual.tolist() == [17.0, 17.0, 17.0]
    # each rank reduces both stages' gradients and gathers both stages' weights
    single_t, dual_t = collective_times(one_f_one_b), collective_times(dual)
    for name in ("dp_gradient_scatter", "dp_weight_gather"):
        ratio = np.asarray(getattr(dual_t, name)) / np.asarray(getattr(single_t, name))
        assert np.all((ratio > 1.9) & (ratio < 2.05)), name


def test_bf16_optimizer_moments_take_two_bytes_each() -> None:
    fp32, bf16 = _ctx(), _ctx(workload=_workload(optimizer_state_dtype="bf16"))
    # Adam: master 4 + m and v at 4 (fp32) or 2 (bf16) bytes per parameter
    ratio = _parts(bf16)["optimizer_states"] / _parts(fp32)["optimizer_states"]
    assert ratio == pytest.approx(np.full(3, 8.0 / 12.0), rel=1e-12)
    # the update reads the gradient, reads and writes master, m and v, writes the weight
    assert _optimizer_update_bytes(fp32) == 4.0 + 2.0 * 12.0 + 2.0
    assert _optimizer_update_bytes(bf16) == 4.0 + 2.0 * 8.0 + 2.0


def test_fp8_swiglu_inputs_halve_the_experts_activation_input_bytes() -> None:
    plain = _parts(_ctx(recompute_modules=("moe_act",)))
    fp8 = _parts(_ctx(recompute_modules=("moe_act",), moe_act_input_fp8=True))
    ctx = _ctx()
    moe = MODEL.moe
    assert moe is not None
    routed = float(np.asarray(ctx.moe_tokens).reshape(-1)[0]) * moe.top_k
    # 2 x the expert width (gate and up) per routed copy, one byte less each, per MoE layer held
    saved = routed * 2.0 * moe.expert_ffn_hidden_size
    layers = np.asarray(ctx.layout.moe_layers).reshape(-1)
    held = np.asarray(micro_batches_in_flight(ctx)).reshape(-1)
    assert plain["activations"] - fp8["activations"] == pytest.approx(
        saved * layers * held, rel=1e-9
    )


def test_fp8_only_options_need_fp8_training() -> None:
    with pytest.raises(ValueError, match=r"moe_act_input_fp8 \(True\).*'bf16'"):
        _ctx(
            workload=Training(sequence_length_tokens=4096, global_batch_sequences=1024),
            moe_act_input_fp8=True,
        )


def test_deepseek_v3_pre_training_is_priced_within_ten_percent_and_fits_its_80_gb() -> None:
    case = next(c for c in training_cases() if c.table == "deepseek_v3_report")
    assert case.source == "deepseek_v3_report" and case.config.world_size == 2048
    (row,) = run_case(case)
    assert abs(row.error) < 0.10  # 1,439 predicted against 1,543 tokens/s per GPU
    needed, capacity = peak_memory_bytes(case)
    assert needed < capacity == 80e9
    # without DualPipe's second stage and extra micro-batch the same layout would look far
    # roomier: the terms are what bring it near the device's memory
    options = dict(case.estimate_options)
    options["bidirectional_pipeline"] = False
    one_f_one_b = case.__class__(**{**case.__dict__, "estimate_options": tuple(options.items())})
    assert peak_memory_bytes(one_f_one_b)[0] < needed - 10e9


def test_estimate_cli_takes_the_optimizer_moment_dtype_and_fp8_swiglu_inputs(capsys) -> None:
    common = [
        "estimate", "--model", "deepseek-v3", "--cluster", "hgx-h800", "--nodes", "256",
        "--sequence-length", "4096", "--global-batch-tokens", str(15360 * 4096),
        "--fp8-recipe", "blockwise", "--pp", "16", "--ep", "64", "--dp", "128",
        "--zero-stage", "1", "--recompute", "selective",
        "--recompute-modules", "layernorm", "mla_up_proj", "moe_act",
        "--bidirectional-pipeline", "--expert-dispatcher", "deepep", "--expert-dispatch-fp8",
        "--max-routed-nodes", "4", "--framework", "megatron-core", "--json",
    ]  # fmt: skip

    def run(*extra: str) -> tuple[int, str, str]:
        code = main([*common, *extra])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    # fp32 moments and bf16 SwiGLU inputs: the layout does not fit, and the error says by how much
    code, _, err = run("--precision", "fp8")
    assert code != 0
    needed = float(re.search(r"needs ([0-9.]+) GB", err).group(1))
    code, out, err = run(
        "--precision", "fp8", "--optimizer-state-dtype", "bf16", "--moe-act-input-fp8"
    )
    assert code == 0, err
    assert json.loads(out)["memory_per_device_bytes"] / 1e9 < min(needed, 80.0)
    code, _, err = run("--precision", "bf16", "--moe-act-input-fp8")
    assert code != 0 and "moe_act_input_fp8" in err
