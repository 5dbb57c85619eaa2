"""The fused attention kernel a training framework runs: torch SDPA's FlashAttention-2 backend on
Hopper against the cuDNN-class kernels of the imported tables (``data/attention_kernels.json``)."""

from __future__ import annotations

import json
from importlib import resources

import numpy as np
import pytest
from pydantic import ValidationError

from cost_model import EstimateOptions, ParallelConfig, Training
from cost_model._frameworks import framework_profile
from cost_model._precision_validation import fp8_twin_records
from cost_model._table import configs_to_table
from cost_model._training_context import training_context
from cost_model._training_ops import (
    attention_kernel,
    core_attention_time,
    flash2_time_ratio,
)
from cost_model._validation_cases import published_records
from cost_model._validation_runs import run_model
from topology import get_preset

DATA = json.loads((resources.files("cost_model") / "data" / "attention_kernels.json").read_text())[
    "flash2_over_cudnn"
]


def _llama8b():
    (record,) = [r for r in published_records() if r.get("table") == "torchtitan_h200_fsdp"][:1]
    return run_model(record)


def _context(preset: str, *, kernel: str | None, measured: bool = False):
    workload = Training(
        sequence_length_tokens=8192, global_batch_sequences=16, framework="torchtitan-compile"
    )
    return training_context(
        model=_llama8b(),
        cluster=get_preset(preset, num_nodes=1),
        workload=workload,
        table=configs_to_table([ParallelConfig(dp=8, zero_stage=3, micro_batch_size=2)]),
        options=EstimateOptions(attention_kernel=kernel, measured_attention=measured),
    )


def test_the_ratio_lies_within_every_measurement_it_cites() -> None:
    ratio = DATA["time_ratio"]
    for point in DATA["points"]:
        assert "github.com" in point["source"]
        if "time_ratio_low" in point:
            assert point["time_ratio_low"] <= ratio <= point["time_ratio_high"]
        else:
            assert abs(ratio / point["time_ratio"] - 1.0) < 0.10


def test_flash2_on_hopper_is_the_measured_curve_times_the_ratio() -> None:
    """On an H200 the FlashAttention-2 run prices attention at the cuDNN-class curve of its
    shape times the measured ratio, slower than the profile's default kernel."""
    flash2 = _context("dgx-h200", kernel="flash2")
    default = _context("dgx-h200", kernel=None)
    assert attention_kernel(flash2) == "flash2" and attention_kernel(default) == "cudnn"
    assert flash2_time_ratio(flash2.cluster.device.name) == DATA["time_ratio"]
    # the tables' cuDNN-class curve at the run's shape (the measured-attention price)
    curve = core_attention_time(_context("dgx-h200", kernel=None, measured=True))
    np.testing.assert_allclose(core_attention_time(flash2), DATA["time_ratio"] * curve, rtol=1e-9)
    assert np.all(core_attention_time(flash2) > core_attention_time(default))


def test_flash2_is_not_repriced_where_the_ratio_is_not_measured() -> None:
    """On an A100, FlashAttention-2 is the kernel class the tables measure: no ratio applies."""
    assert flash2_time_ratio(get_preset("dgx-a100").device.name) is None
    np.testing.assert_array_equal(
        core_attention_time(_context("dgx-a100", kernel="flash2")),
        core_attention_time(_context("dgx-a100", kernel=None)),
    )


def test_an_unknown_kernel_is_a_clear_error() -> None:
    with pytest.raises(ValidationError, match="attention_kernel"):
        EstimateOptions(attention_kernel="flash3")


def test_profiles_name_their_kernel_and_old_torchtitan_runs_record_flash2() -> None:
    """Today's profiles run cuDNN-class kernels, each with its source; every validation run that
    records FlashAttention-2 is a torchtitan run on Hopper with the reason."""
    for name in ("megatron-core", "torchtitan", "torchtitan-compile"):
        profile = framework_profile(name)
        assert profile.attention_kernel == "cudnn"
        assert len(profile.attention_kernel_source) > 80
    assert "6a3a9da95" in framework_profile("torchtitan").attention_kernel_source
    recorded = [
        r for r in published_records() if "attention_kernel" in r.get("estimate_options", {})
    ]
    recorded += [
        r for r in fp8_twin_records() if "attention_kernel" in r.get("estimate_options", {})
    ]
    assert len(recorded) >= 10
    for record in recorded:
        assert record["estimate_options"]["attention_kernel"] == "flash2"
        assert record["framework"].startswith("torchtitan")
        assert record["preset"] in ("dgx-h100", "dgx-h200")
        assert "FlashAttention-2" in record["attention_kernel_note"]
