"""ZeRO-3 data-parallel traffic per step: per micro-batch without a pipeline, once per step for
the gradients of a pipeline stage (FSDP2 under torch.distributed.pipelining)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cost_model import ParallelConfig, Training
from cost_model._memory import pipeline_unsharded_stage
from cost_model._model_spec import ModelSpec
from cost_model._options import EstimateOptions
from cost_model._table import configs_to_table
from cost_model._training_comm import table_collective_times
from cost_model._training_context import training_context
from cost_model._training_dp import _data_parallel_comm
from cost_model._training_micro_batch import micro_batch_times
from topology import get_preset

#: A small dense Llama-style config (tests/data/dense_8_layers.json).
DENSE = json.loads((Path(__file__).parent / "data" / "dense_8_layers.json").read_text())
MODEL = ModelSpec.from_hf_config(DENSE, name="dense")
PIPELINED = ParallelConfig(dp=8, pp=2, micro_batch_size=1, zero_stage=3)


def _context(configs, *, micro_batches: int, framework: str | None):
    dp = configs[0].dp
    training = Training(
        sequence_length_tokens=4096,
        global_batch_sequences=dp * micro_batches,
        framework=framework,
    )
    return training_context(
        model=MODEL,
        cluster=get_preset("dgx-h100", num_nodes=2),
        workload=training,
        table=configs_to_table(configs),
        options=EstimateOptions(),
    )


def _dp_comm(configs, *, micro_batches: int, framework: str | None = "torchtitan"):
    """(total, exposed, collective times) data-parallel seconds per step on each rank (3, n),
    every second of compute free to hide it."""
    ctx = _context(configs, micro_batches=micro_batches, framework=framework)
    times = table_collective_times(ctx)
    mb = micro_batch_times(ctx, times)
    compute = mb.forward + mb.backward + mb.recompute
    total, hidden = _data_parallel_comm(ctx, free_compute=compute, times=times, mb=mb)
    return total, total - hidden, times, ctx


def _stage_collectives(times, ctx):
    """(one gather, one reduce-scatter) of every layer of each rank, (3, n), ends included."""
    layer, layout = times.fsdp_layer, ctx.layout
    gather = layout.dense_layers * layer.dense_gather + layer.ends_gather
    scatter = layout.dense_layers * layer.dense_scatter + layer.ends_scatter
    return gather, scatter


def test_torchtitan_pipeline_stage_gathers_and_reduces_once_per_step() -> None:
    """torchtitan keeps a pipelined ZeRO-3 stage gathered from the first forward (reshard
    policy ``default``: not pp_enabled) and pipelining reduce-scatters its gradients once,
    after the last backward: the traffic and what of it shows do not grow with the micro-batch
    count, and the reduce-scatter, with nothing left to run beside it, shows whole."""
    total_4, exposed_4, times, ctx = _dp_comm([PIPELINED], micro_batches=4)
    total_16, exposed_16, _, _ = _dp_comm([PIPELINED], micro_batches=16)
    assert np.all(total_16 == pytest.approx(total_4))
    assert np.all(exposed_16 == pytest.approx(exposed_4))
    gather, scatter = _stage_collectives(times, ctx)
    assert np.all(total_4 == pytest.approx(gather + scatter))
    # One gather pass: the first layer's and the root's gathers at least, all of it at most.
    first = times.fsdp_layer.dense_gather + times.fsdp_layer.ends_gather
    assert np.all(exposed_4 >= scatter + first - 1e-12)
    assert np.all(exposed_4 <= gather + scatter + 1e-12)


def test_resharding_after_forward_regathers_each_backward_but_reduces_once() -> None:
    """autoparallel's runtime frees a ZeRO-3 layer after each forward: every pass that follows
    a forward gathers again (m + 1 per step under 1F1B and GPipe alike), the gradients still
    reduce once."""
    for schedule in ("1f1b", "gpipe"):
        config = PIPELINED.model_copy(update={"pipeline_schedule": schedule})
        total_4, exposed_4, times, ctx = _dp_comm([config], micro_batches=4, framework=None)
        total_16, exposed_16, _, _ = _dp_comm([config], micro_batches=16, framework=None)
        gather, scatter = _stage_collectives(times, ctx)
        layers = gather - times.fsdp_layer.ends_gather
        assert np.all(
            total_4 == pytest.approx(5.0 * layers + times.fsdp_layer.ends_gather + scatter)
        )
        assert np.all(total_16 - total_4 == pytest.approx(12.0 * layers))
        # Twelve more gather passes, each exposing its first gather and at most all of it.
        grown = exposed_16 - exposed_4
        assert np.all(grown >= 12.0 * times.fsdp_layer.dense_gather - 1e-12)
        assert np.all(grown <= 12.0 * layers + 1e-12)


def test_fsdp_without_a_pipeline_gathers_and_reduces_every_micro_batch() -> None:
    """pp = 1: FSDP2 reduce-scatters every backward (torchtitan's gradient accumulation keeps
    gradient sync on) and regathers each layer for forward and backward, so the traffic and
    what shows of it scale with the micro-batch count."""
    single = ParallelConfig(dp=16, micro_batch_size=1, zero_stage=3)
    total_4, exposed_4, times, ctx = _dp_comm([single], micro_batches=4)
    total_16, exposed_16, _, _ = _dp_comm([single], micro_batches=16)
    gather, scatter = _stage_collectives(times, ctx)
    layers = gather - times.fsdp_layer.ends_gather
    assert np.all(total_4 == pytest.approx(4.0 * (gather + layers + scatter)))
    assert np.all(total_16 == pytest.approx(4.0 * total_4))
    assert np.all(exposed_16 == pytest.approx(4.0 * exposed_4))


def test_step_time_and_memory_hold_the_same_pipeline_stages() -> None:
    """The once-per-step pricing applies exactly where the memory holds the stage unsharded
    (``pipeline_unsharded_stage``): ZeRO-3 with pp > 1, not ZeRO-2 nor pp = 1."""
    configs = [
        PIPELINED,
        PIPELINED.model_copy(update={"zero_stage": 2}),
        ParallelConfig(dp=16, micro_batch_size=1, zero_stage=3),
        ParallelConfig(dp=16, micro_batch_size=1, zero_stage=2),
    ]
    dp = [ParallelConfig(**{**c.model_dump(), "dp": 8}) for c in configs]
    total_4, _, _, ctx = _dp_comm(dp, micro_batches=4)
    total_16, _, _, _ = _dp_comm(dp, micro_batches=16)
    once = np.all(np.isclose(total_16, total_4), axis=0)
    held = pipeline_unsharded_stage(ctx)
    zero = np.asarray(ctx.table["zero_stage"])
    assert held.tolist() == [True, False, False, False]
    # ZeRO-2 gathers once per step too; among ZeRO-3 layouts only the held one stops growing.
    assert (once & (zero == 3)).tolist() == held.tolist()
