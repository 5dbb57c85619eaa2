"""Modelled step-time parts of the published MoE training runs, next to what the run took.

Usage:
    python benchmarks/moe_breakdown.py                 # every MoE run of megatron_bridge_perf
    python benchmarks/moe_breakdown.py Qwen3_30B B200  # the runs whose name holds every word

For each run: the step time and its parts as ``estimate_table`` prices them (compute, each
communication kind, bubble), the host-issue parts of one MoE layer against the GPU parts they
are compared with (``cost_model._training_host``), and the gap between the published and the
predicted step spread over the busiest rank's layer passes (micro-batches x MoE layers of the
rank): seconds per layer and micro-batch the model does not account for. A gap
that is about constant per layer pass, whatever the tokens of a micro-batch, points at a
per-pass cost (host issue, synchronization); one that grows with the tokens at the GPU work.
Published runs are validation only: nothing here feeds a fit.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cost_model import _validation, _validation_cases
from cost_model._training_context import training_context
from cost_model._training_host import host_parts

PARTS = ("compute", "ep_comm", "pp_comm", "dp_comm", "tp_comm", "bubble", "recompute")


def _first(value) -> float:
    return float(np.ravel(value)[0])


def breakdown(case: _validation_cases.Case) -> dict[str, float]:
    """The run's modelled step parts, host parts of one MoE layer and the published gap."""
    config, workload, setup = _validation.memory_inputs(case)
    cluster = _validation._cluster(case.hardware, config.world_size)
    options = _validation._options(case, None, cluster, setup=setup)
    table = _validation.configs_to_table([config])
    columns = _validation.estimate_table(case.model, cluster, workload, table, options=options)
    ctx = training_context(
        model=case.model, cluster=cluster, workload=workload, table=table, options=options
    )
    row = _validation.run_case(case)[0]
    step = _first(columns["step_time_s"])
    published_step = step * row.predicted / row.published  # throughput metric: time scales 1/x
    moe_layers = float(np.max(ctx.layout.moe_layers))  # of the busiest rank, all its chunks
    passes = _first(columns["num_micro_batches"]) * moe_layers
    out = {
        "error": row.error,
        "step_s": step,
        "published_step_s": published_step,
        "gap_per_layer_pass_ms": 1e3 * (published_step - step) / passes,
        "micro_batches": _first(columns["num_micro_batches"]),
        "moe_layers_per_rank": moe_layers,
    }
    out.update({part: _first(columns[f"time.{part}"]) for part in PARTS})
    parts = host_parts(ctx)
    if parts is not None:
        out["host_moe_layer_forward_ms"] = 1e3 * _first(
            parts.attention_forward + parts.moe_before_sync_forward + parts.moe_after_sync_forward
        )
        out["host_moe_layer_backward_ms"] = 1e3 * _first(
            parts.attention_backward + parts.moe_backward
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("words", nargs="*", help="keep runs whose name holds every word")
    args = parser.parse_args()
    for case in _validation_cases.training_cases():
        if case.table != "megatron_bridge_perf" or case.model.moe is None:
            continue
        if not all(word in case.run for word in args.words):
            continue
        config = _validation.memory_inputs(case)[0]
        b = breakdown(case)
        print(
            f"{case.run}: error {b['error']:+.1%}; tp{config.tp} pp{config.pp} "
            f"vp{config.virtual_stages} ep{config.ep} mb{config.micro_batch_size}, "
            f"{b['micro_batches']:.0f} micro-batches x {b['moe_layers_per_rank']:.0f} MoE layers"
        )
        print(
            f"  step {b['step_s']:.2f} s (published {b['published_step_s']:.2f} s): "
            + ", ".join(f"{part} {b[part]:.2f}" for part in PARTS if b[part])
        )
        host = (
            f"host per MoE layer {b['host_moe_layer_forward_ms']:.2f} ms forward, "
            f"{b['host_moe_layer_backward_ms']:.2f} ms backward; "
            if "host_moe_layer_forward_ms" in b
            else ""
        )
        print(f"  {host}unaccounted {b['gap_per_layer_pass_ms']:+.2f} ms per layer pass")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
