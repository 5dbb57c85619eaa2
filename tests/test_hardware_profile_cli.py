"""``--hardware-profile``: a profile measured on the cluster's device (``autoparallel profile``)
prices ``estimate`` and ``plan`` with its curves, and what it measured of the autoparallel
runtime's own modules applies only to jobs that runtime runs.

``benchmarks/results/profile_h200.json`` is a real profile, measured on one H200 by
``autoparallel profile --grid gpu``; ``profile_cpu_gloo_2ranks_1150.json`` one of this kind of
CPU machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autoparallel.cli import main
from cost_model import EstimateOptions, ParallelConfig, Training, configs_to_table
from cost_model._estimate import estimate_table
from topology import get_preset, load_hardware_profile

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
H200_PROFILE = RESULTS / "profile_h200.json"
CPU_PROFILE = RESULTS / "profile_cpu_gloo_2ranks_1150.json"
LLAMA = [
    "estimate",
    "--model",
    "llama-3.1-405b",
    "--cluster",
    "dgx-h200",
    "--tp",
    "8",
    "--pp",
    "8",
    "--ep",
    "1",
    "--json",
]


def _estimate(capsys, argv: list[str]) -> dict:
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _refused(capsys, argv: list[str]) -> str:
    assert main(argv) != 0
    return capsys.readouterr().err


def test_a_measured_h200_profile_prices_the_estimate(capsys):
    """The H200's measured GEMMs run 680-780 TFLOP/s (sustained large GEMMs throttle at the
    700 W limit), below the operator-table fit's 797: the profile's estimate is slower, by less
    than the gap of the two plateaus plus the runtime's own measured costs."""
    preset = _estimate(capsys, [*LLAMA, "--framework", "megatron-core"])
    measured = _estimate(
        capsys,
        [*LLAMA, "--framework", "megatron-core", "--hardware-profile", str(H200_PROFILE)],
    )
    ratio = measured["step_time_s"] / preset["step_time_s"]
    assert 1.0 < ratio < 1.3


def test_a_profile_of_another_device_type_is_refused_unless_forced(capsys):
    message = _refused(capsys, [*LLAMA, "--hardware-profile", str(CPU_PROFILE)])
    assert "--hardware-profile" in message and "'cpu'" in message and "'cuda'" in message
    assert "--force-profile" in message
    forced = _estimate(capsys, [*LLAMA, "--hardware-profile", str(CPU_PROFILE), "--force-profile"])
    assert forced["step_time_s"] > 0


def test_a_file_that_is_not_a_profile_is_refused_naming_the_flag(capsys, tmp_path):
    path = tmp_path / "not-a-profile.json"
    path.write_text(json.dumps({"rows": []}))
    message = _refused(capsys, [*LLAMA, "--hardware-profile", str(path)])
    assert "--hardware-profile" in message and "device_type" in message


def _step_time(profile, *, framework: str | None) -> float:
    from autoparallel._catalog import get_model

    cluster = get_preset("dgx-h200", num_nodes=1)
    cluster = cluster.model_copy(update={"device": cluster.device.with_profile(profile)})
    workload = Training(sequence_length_tokens=4096, global_batch_sequences=64, framework=framework)
    config = ParallelConfig(dp=8, tp=1, pp=1, ep=8, micro_batch_size=1, recompute="none")
    table = configs_to_table([config])
    result = estimate_table(
        model=get_model("qwen3-30b-a3b"),
        cluster=cluster,
        workload=workload,
        table=table,
        options=EstimateOptions(),
    )
    return float(np.asarray(result["step_time_s"])[0])


@pytest.fixture(scope="module")
def h200():
    return load_hardware_profile(H200_PROFILE)


def test_runtime_measurements_price_only_the_runtime(h200):
    """The profile's per-layer host cost is the autoparallel runtime's (its MoE layer loops
    over experts in Python): it slows a job that runtime runs, and leaves a Megatron-core job,
    whose host path its framework profile prices, where the device-level curves put it."""
    heavy = h200.model_copy(
        update={"host": h200.host.model_copy(update={"moe_layer_s": 1.0, "routed_expert_s": 0.0})}
    )
    assert _step_time(heavy, framework=None) > 2.0 * _step_time(h200, framework=None)
    assert _step_time(heavy, framework="megatron-core") == pytest.approx(
        _step_time(h200, framework="megatron-core")
    )


def test_host_time_on_an_accelerator_overlaps_the_kernels(h200):
    """On a GPU the host issues ahead of the device: a layer's host time below its kernel time
    costs nothing (the longer of the two counts), unlike on a CPU, where the same cores run
    both."""
    light = h200.model_copy(
        update={"host": h200.host.model_copy(update={"moe_layer_s": 1e-6, "routed_expert_s": 0.0})}
    )
    none = h200.model_copy(
        update={"host": h200.host.model_copy(update={"moe_layer_s": 0.0, "routed_expert_s": 0.0})}
    )
    assert _step_time(light, framework=None) == pytest.approx(_step_time(none, framework=None))


def test_device_level_profile_keeps_the_device_curves(h200):
    device = h200.device_level()
    assert device.host is None and device.norm is None and device.optimizer is None
    assert device.gemm == h200.gemm and device.memory == h200.memory
    assert device.eager_op_host_s == h200.eager_op_host_s


SERVING = [
    "estimate",
    "--model",
    "qwen3-30b-a3b",
    "--cluster",
    "dgx-h200",
    "--nodes",
    "1",
    "--inference",
    "--tp",
    "1",
    "--pp",
    "1",
    "--ep",
    "1",
    "--concurrency",
    "64",
    "--json",
]


def test_a_measured_graph_kernel_floor_prices_the_decode_step(capsys, h200, tmp_path):
    """The H200 profile's graph-replayed kernel (1.8 us) replaces the engine's 4 us default in
    every pass: a decode step of a few thousand kernels gets shorter, and a profile with a
    larger measured floor makes it longer."""
    assert h200.graph_kernel_floor_s is not None and 1e-6 < h200.graph_kernel_floor_s < 4e-6
    default = _estimate(capsys, SERVING)
    measured = _estimate(capsys, [*SERVING, "--hardware-profile", str(H200_PROFILE)])
    slow = tmp_path / "slow-floor.json"
    slow.write_text(h200.model_copy(update={"graph_kernel_floor_s": 2e-5}).model_dump_json())
    slower = _estimate(capsys, [*SERVING, "--hardware-profile", str(slow)])
    assert measured["tpot_s"] < default["tpot_s"] < slower["tpot_s"]


def test_a_dtype_the_profile_did_not_measure_keeps_the_operator_fit(capsys):
    """The H200 profile measured fp32, bf16 and fp16 GEMMs, no fp8: an fp8 job priced with it
    keeps the fp8 operator fit for its GEMMs (the preset's constant efficiency, as without a
    profile) and the profile for the rest. fp32's curve stands in only for a wider float a
    device may run through fp32 kernels (bf16 on a CPU): over the fp8 peak it priced an fp8
    training step 14x slower and a serving prefill 4x."""
    profile = load_hardware_profile(H200_PROFILE)
    assert "fp8" not in profile.gemm and "bf16" in profile.gemm
    device = get_preset("dgx-h200").device.with_profile(profile)
    flops = np.array([1e9, 1e12])
    assert np.allclose(device.gemm_efficiency(flops, "fp8"), device.matmul_efficiency)
    bf16 = profile.gemm["bf16"].rate_per_s(flops) / device.peak_flops_for("bf16")
    assert np.allclose(device.gemm_efficiency(flops, "bf16"), bf16)
    cpu = load_hardware_profile(CPU_PROFILE)
    if "bf16" not in cpu.gemm:  # a CPU without bf16 kernels prices bf16 on its fp32 curve
        assert cpu.gemm_curve("bf16") is cpu.gemm["fp32"]
    job = [*LLAMA, "--framework", "megatron-core", "--precision", "fp8"]
    table = _estimate(capsys, job)
    measured = _estimate(capsys, [*job, "--hardware-profile", str(H200_PROFILE)])
    assert 0.8 < measured["step_time_s"] / table["step_time_s"] < 1.3
    serving = ["estimate", "--model", "deepseek-v3", "--cluster", "dgx-h200", "--nodes", "1"]
    serving += ["--tp", "8", "--pp", "1", "--ep", "8", "--inference", "--weight-dtype", "fp8"]
    serving += ["--prompt-tokens", "2000", "--output-tokens", "500", "--json"]
    table = _estimate(capsys, serving)
    measured = _estimate(capsys, [*serving, "--hardware-profile", str(H200_PROFILE)])
    assert 0.8 < measured["ttft_s"] / table["ttft_s"] < 1.25


def test_a_measured_fp8_curve_prices_the_per_tensor_recipes() -> None:
    """A profile that timed fp8 GEMMs (``autoparallel profile``: per-tensor scales) prices the
    per-tensor recipes' GEMMs on that curve; the others (rowwise, block-scaled, MXFP8) keep the
    operator fit. Here the H200 profile with an fp8 curve at twice its bf16 rate: a
    tensorwise GEMM then costs half its bf16 time, a rowwise one what it cost without the curve."""
    from cost_model._options import calibration_for
    from cost_model._precision import fp8_gemm_time_s
    from cost_model._pricing import op_time_s

    profile = load_hardware_profile(H200_PROFILE)
    bf16 = profile.gemm["bf16"]
    fp8 = bf16.model_copy(update={"seconds": tuple(s / 2.0 for s in bf16.seconds)})
    with_fp8 = profile.model_copy(update={"gemm": {**profile.gemm, "fp8": fp8}})
    preset = get_preset("dgx-h200").device
    device, plain = preset.with_profile(with_fp8), preset.with_profile(profile)
    calibration = calibration_for(preset)
    flops = np.array([2.0 * 4096**3, 2.0 * 8192**3])

    def fp8_time(hardware, recipe: str) -> np.ndarray:
        return fp8_gemm_time_s(
            hardware=hardware, calibration=calibration, recipe=recipe, flops=flops, bytes_moved=0.0
        )

    bf16_time = op_time_s(
        flops=flops, bytes_moved=0.0, hardware=device, dtype="bf16", calibration=calibration
    )
    assert np.allclose(fp8_time(device, "tensorwise") * 2.0, bf16_time, rtol=1e-6)
    assert np.allclose(fp8_time(device, "rowwise"), fp8_time(plain, "rowwise"))
    assert np.all(fp8_time(device, "tensorwise") < fp8_time(plain, "tensorwise"))
