"""``cost_model.calibrate``: least-squares fit of global efficiencies from step rows or a profile."""

from __future__ import annotations

import pytest
from test_profilers_profile import profile_document

from autoparallel import get_model
from cost_model import Calibration, ParallelConfig, StepMeasurement, Training, calibrate, estimate
from profilers import cluster_from_profile
from topology import HardwareProfile, get_preset

MODEL = get_model("tiny-moe")


def _cluster():
    return cluster_from_profile(HardwareProfile.model_validate(profile_document()), num_devices=2)


def _rows(cluster, truth: Calibration, *, noise=(1.0, 1.0, 1.0, 1.0)):
    rows = []
    cases = [
        (ParallelConfig(), 64, 2),
        (ParallelConfig(), 256, 4),
        (ParallelConfig(tp=2), 128, 2),
        (ParallelConfig(pp=2), 128, 4),
    ]
    for (config, tokens, batch), factor in zip(cases, noise):
        workload = Training(sequence_length_tokens=tokens, global_batch_sequences=batch)
        for parts in (("compute",), ("optimizer",)):
            truth_cost = estimate(MODEL, cluster, workload, config, calibration=truth)
            measured = sum(truth_cost.time_s[p] for p in parts) * factor
            rows.append(
                StepMeasurement(
                    label=f"{config.tp}x{config.pp} {tokens} {parts[0]}",
                    model=MODEL,
                    workload=workload,
                    config=config,
                    parts=parts,
                    measured_s=measured,
                )
            )
    return rows


def test_recovers_known_efficiencies_from_step_rows():
    cluster = _cluster()
    truth = Calibration(
        matmul_efficiency=0.3, memory_bandwidth_efficiency=0.45, kernel_overhead_s=5e-6
    )  # the profile's launch cost
    result = calibrate(cluster=cluster, measurements=_rows(cluster, truth))
    assert result.calibration.matmul_efficiency == pytest.approx(0.3, rel=1e-3)
    assert result.calibration.memory_bandwidth_efficiency == pytest.approx(0.45, rel=1e-3)
    assert result.rms_log_error_after < 1e-4 < 0.3 < result.rms_log_error_before
    assert result.calibration.fit["rows"] == 8 and len(result.rows) == 8
    assert all(abs(row.error_after) < 1e-3 for row in result.rows)


def test_noisy_rows_leave_a_residual_but_improve():
    cluster = _cluster()
    truth = Calibration(
        matmul_efficiency=0.5, memory_bandwidth_efficiency=0.2, kernel_overhead_s=5e-6
    )
    result = calibrate(
        cluster=cluster, measurements=_rows(cluster, truth, noise=(1.1, 0.9, 1.05, 0.95))
    )
    assert 0.4 < result.calibration.matmul_efficiency < 0.6
    assert 0.0 < result.rms_log_error_after < 0.12 < result.rms_log_error_before


def test_efficiencies_stay_within_bounds():
    cluster = _cluster()
    truth = Calibration(
        matmul_efficiency=0.8, memory_bandwidth_efficiency=0.8, kernel_overhead_s=5e-6
    )
    rows = _rows(cluster, truth)
    # Efficiencies may not exceed 1: a device measured faster than its peak stays at the bound.
    fast = [row.model_copy(update={"measured_s": row.measured_s / 10}) for row in rows]
    result = calibrate(cluster=cluster, measurements=fast)
    assert (
        result.calibration.matmul_efficiency
        == result.calibration.memory_bandwidth_efficiency
        == 1.0
    )
    assert result.rms_log_error_after == pytest.approx(
        result.rms_log_error_before
    )  # nothing better inside the bounds


def test_rejects_bad_requests():
    cluster = _cluster()
    rows = _rows(cluster, Calibration())
    with pytest.raises(ValueError, match="parameters entry .'peak_flops'"):
        calibrate(cluster=cluster, measurements=rows, parameters=("peak_flops",))
    with pytest.raises(ValueError, match="exactly one"):
        calibrate(cluster=cluster)
    with pytest.raises(ValueError, match=r"measurements \(1 rows\) must be >= parameters \(2"):
        calibrate(cluster=cluster, measurements=rows[:1])


def test_profile_fits_constant_efficiencies_of_a_preset():
    profile = HardwareProfile.model_validate(profile_document())
    preset = get_preset("cpu-loopback")
    result = calibrate(cluster=preset, profile=profile)
    calibration = result.calibration
    # The synthetic curve plateaus at 4e10 and 5e10 FLOP/s against the preset's fp32 peak.
    expected = ((2e10 * 2.5e10) ** 0.5) / preset.device.peak_flops["bf16"]  # bf16 is fitted first
    assert calibration.matmul_efficiency == pytest.approx(min(expected, 1.0), rel=1e-6)
    assert 0 < calibration.collective_efficiency <= 2.0
    assert result.rms_log_error_after <= result.rms_log_error_before + 1e-12
    assert {row.label.split()[0] for row in result.rows} >= {"gemm", "memory", "all_reduce"}
