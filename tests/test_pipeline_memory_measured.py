"""The memory model's pipeline terms against the bytes real torch code holds: FSDP2 stages kept
gathered, fp32 gradient accumulation, per-micro-batch receive buffers, kept outputs and full
activation checkpointing under torch.distributed.pipelining's 1F1B and interleaved 1F1B, measured
on forked gloo ranks with torch.profiler's memory timeline (``autoparallel.testing``)."""

from __future__ import annotations

import numpy as np
import pytest

from autoparallel.testing import run_ranks
from autoparallel.testing._pipeline_memory import (
    MICRO_BATCH,
    SEQUENCE,
    measure_rank,
    model_config,
)
from cost_model import EstimateOptions, ParallelConfig, Training
from cost_model._memory import stage_memory
from cost_model._model_spec import ModelSpec
from cost_model._table import configs_to_table
from cost_model._training_context import training_context
from topology import get_preset

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

PP, LAYERS, MICRO_BATCHES = 2, 4, 4


def _predicted(schedule: str, *, keeps_outputs: bool = True) -> list[float]:
    """The model's bytes on the first and the last pipeline rank (no fragmentation reserve:
    the CPU allocator keeps none)."""
    config = ParallelConfig(
        pp=PP,
        zero_stage=3,
        micro_batch_size=MICRO_BATCH,
        recompute="full",
        pipeline_schedule=schedule,
        virtual_stages=2 if schedule == "interleaved_1f1b" else 1,
    )
    workload = Training(
        sequence_length_tokens=SEQUENCE,
        global_batch_sequences=MICRO_BATCH * MICRO_BATCHES,
        framework="torchtitan",
    )
    ctx = training_context(
        model=ModelSpec.from_hf_config(model_config(LAYERS), name="measured"),
        cluster=get_preset("dgx-h100", num_nodes=1),
        workload=workload,
        table=configs_to_table([config]),
        # torch.distributed.pipelining's step() returns (keeps) the last stage's outputs
        options=EstimateOptions(pipeline_keeps_outputs=keeps_outputs, fragmentation_fraction=0.0),
    )
    total = np.asarray(sum(stage_memory(ctx).values()))
    return [float(total[0].ravel()[0]), float(total[-1].ravel()[0])]


def _measured() -> dict[str, list[float]]:
    return {
        schedule: [
            rank["peak_bytes"]
            for rank in run_ranks(
                measure_rank, PP, args=(schedule, LAYERS, MICRO_BATCHES), timeout_s=300
            )
        ]
        for schedule in ("1f1b", "interleaved_1f1b")
    }


def test_each_rank_holds_what_the_model_prices_and_interleaving_holds_more() -> None:
    """Per pipeline rank the model is within 10% of the peak bytes torch holds (measured
    2026-12: -6% / +4% under 1F1B, -8% / +2% interleaved, first / last rank). Two stages per rank
    hold more than one (the warm-up forwards of both chunks, a receive buffer per micro-batch
    and chunk), in torch's live bytes as in the model: the order the published Llama 3.1 405B
    runs report the other way round is not torch's on this code."""
    measured = _measured()
    predicted = {schedule: _predicted(schedule) for schedule in measured}
    for schedule, peaks in measured.items():
        for guess, peak in zip(predicted[schedule], peaks, strict=True):
            assert abs(guess / peak - 1.0) < 0.10, (schedule, guess, peak)
    for rank in range(PP):
        assert measured["interleaved_1f1b"][rank] > measured["1f1b"][rank]
        assert predicted["interleaved_1f1b"][rank] > predicted["1f1b"][rank]
    # negative control: the last stage's kept outputs (step() returns every micro-batch's
    # logits) left out, the last rank's prediction moves away from what torch holds
    last = measured["1f1b"][-1]
    dropped = _predicted("1f1b", keeps_outputs=False)[-1]
    assert abs(dropped / last - 1.0) > abs(predicted["1f1b"][-1] / last - 1.0) + 0.03
