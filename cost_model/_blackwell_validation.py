"""Validation on Blackwell: the published B200/GB200/GB300 training runs of
``data/published_runs_blackwell.json`` (NVIDIA's Megatron-core performance tables).

No calibration was fitted on any Blackwell run (``data/calibration.json`` has none for B200 or
GB200): these rows check the presets and the uncalibrated model, and are never fit inputs.
The compared figure is tokens/s per GPU (``Training.tokens_per_step`` over step time and GPUs).
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources

from cost_model._estimate import estimate_table
from cost_model._model_spec import ModelSpec
from cost_model._options import EstimateOptions
from cost_model._parallel import ParallelConfig
from cost_model._table import configs_to_table
from cost_model._validation_runs import apply_recorded_setup
from cost_model._workload import Training

__all__ = ["BLACKWELL_TOLERANCE", "blackwell_records", "blackwell_rows", "record_case"]

#: Mean |error| over the runs (the acceptance bound for the table).
BLACKWELL_TOLERANCE = 0.10


@lru_cache(maxsize=1)
def blackwell_records() -> tuple[dict, ...]:
    text = (resources.files("cost_model") / "data" / "published_runs_blackwell.json").read_text()
    return tuple(json.loads(text)["records"])


def record_case(record: dict):
    """The model, cluster (the preset scaled to the run's GPUs), workload and layout of a record."""
    from topology import get_preset

    model = ModelSpec.from_hf_config(record["model"], name=record["run"].split(" ")[0])
    preset = get_preset(record["preset"])
    cluster = preset.with_nodes(max(1, math.ceil(record["gpus"] / preset.devices_per_node)))
    workload = Training(
        sequence_length_tokens=record["sequence_length"],
        global_batch_sequences=record["global_batch_sequences"],
        precision=record["precision"],
        fp8_recipe=record["fp8_recipe"],
        gradient_dtype=record.get("gradient_dtype", "fp32"),
        framework=record["framework"],
    )
    return model, cluster, workload, ParallelConfig(**record["layout"])


def predicted_throughput(record: dict) -> tuple[float, float]:
    """(tokens/s per GPU, memory per device bytes) predicted for ``record`` under its recipe's
    recorded recompute and offload settings (``memory_setup``; ``apply_recorded_setup``)."""
    model, cluster, workload, config = record_case(record)
    config, workload, setup = apply_recorded_setup(
        record.get("memory_setup", {}), config=config, workload=workload
    )
    table = configs_to_table([config])
    # the recipe's software facts and its recompute and offload settings
    options = EstimateOptions(**record.get("estimate_options", {}), **setup)
    columns = estimate_table(model, cluster, workload, table, options=options)
    step = float(columns["step_time_s"][0])
    return workload.tokens_per_step / (step * config.world_size), float(
        columns["memory_per_device_bytes"][0]
    )


def blackwell_rows() -> list:
    """One ``ValidationRow`` (table ``blackwell_training``) per published run."""
    from cost_model._validation import ValidationRow

    rows = []
    for record in blackwell_records():
        tokens, _ = predicted_throughput(record)
        rows.append(
            ValidationRow(
                table="blackwell_training",
                run=record["run"],
                metric="tokens_per_s_per_gpu",
                unit="tokens/s",
                predicted=tokens,
                published=float(record["tokens_per_s_per_gpu"]),
            )
        )
    return rows
