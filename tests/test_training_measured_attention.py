"""Training core attention priced at the measured efficiency of its shape (opt-in)."""

from __future__ import annotations

import numpy as np
import pytest

from cost_model import EstimateOptions, ModelSpec, ParallelConfig, Training
from cost_model._calibration_fits import training_attention_efficiency
from cost_model._kernel_curves_attention import context_attention_time_s
from cost_model._table import configs_to_table
from cost_model._training_context import training_context
from cost_model._training_ops import core_attention_time
from topology import get_preset

LLAMA3_8B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
}


def _core(preset: str, *, measured: bool, sequence: int = 8192) -> float:
    model = ModelSpec.from_hf_config(LLAMA3_8B, name="llama3-8b")
    ctx = training_context(
        model=model,
        cluster=get_preset(preset),
        workload=Training(sequence_length_tokens=sequence, global_batch_sequences=16),
        table=configs_to_table([ParallelConfig(dp=8, micro_batch_size=2)]),
        options=EstimateOptions(measured_attention=measured),
    )
    return float(np.ravel(core_attention_time(ctx))[0])


def test_long_sequence_attention_runs_at_its_measured_efficiency() -> None:
    """At 8K tokens the measured kernels run near 0.5 of the B200 peak where the single fitted
    efficiency is 0.29: the forward is the curve's, charged at its forward + backward
    efficiency (the calibration's backward/forward relation)."""
    calibrated, measured = _core("dgx-b200", measured=False), _core("dgx-b200", measured=True)
    assert measured < 0.75 * calibrated
    device = get_preset("dgx-b200").device
    tokens, heads = 2 * 8192, 32
    flops = tokens * 2.0 * heads * 256 * (8192 + 1) / 2.0
    forward = context_attention_time_s(
        hardware=device, flops=flops, bytes_moved=0.0, tokens=8192, units=2 * heads
    )
    assert forward is not None
    assert measured == pytest.approx(float(forward[0]) / training_attention_efficiency(1.0))


def test_measured_attention_is_off_by_default_and_needs_a_curve() -> None:
    """Without the option, or on a device the tables do not cover (A100), the calibration's
    single efficiency prices attention."""
    assert EstimateOptions().measured_attention is False
    assert _core("dgx-a100", measured=True) == _core("dgx-a100", measured=False)
