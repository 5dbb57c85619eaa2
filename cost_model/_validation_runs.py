"""Published training runs recorded in one generic form (``"format": "run"`` records of
``data/published_runs.json``): the model as its HuggingFace config, the hardware preset, the
parallel layout, the software (a framework profile) and one published figure.

Each record names its ``source`` (the table it was read from) and a ``source_id`` (the
independent publication, the unit the leave-one-source-out error leaves out) and lists what
the publication does not state and had to be assumed (``assumed``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cost_model._model_spec import ModelSpec
from cost_model._parallel import ParallelConfig
from cost_model._training import model_flops_per_step
from cost_model._workload import Training

#: Dense bf16 tensor peak of each hardware type, FLOP/s (the MFU denominators the sources use).
BF16_PEAK_FLOPS = {
    "A100": 312e12,
    "H100": 989e12,
    "B200": 2250e12,
    "GB200": 2500e12,
    "GB300": 2500e12,
}


def _tokens_per_s_per_gpu(columns: dict, case) -> float:
    tokens = case.workload.tokens_per_step
    return float(tokens / (columns["step_time_s"][0] * case.config.world_size))


def _mfu_pct(columns: dict, case) -> float:
    """MFU in the convention the sources state it in: the full attention square (Megatron-LM,
    torchtitan and PaLM App. B count it so; see ``model_flops_per_step``)."""
    flops = model_flops_per_step(model=case.model, workload=case.workload, attention="full_square")
    peak = BF16_PEAK_FLOPS[case.hardware]
    return float(100.0 * flops / (columns["step_time_s"][0] * case.config.world_size * peak))


METRICS: dict[str, tuple[str, Callable]] = {
    "tokens_per_s_per_gpu": ("tokens/s per GPU", _tokens_per_s_per_gpu),
    "mfu_pct": ("%", _mfu_pct),
}


def run_config(record: dict) -> ParallelConfig:
    gpus, tp, pp, cp = record["gpus"], record["tp"], record["pp"], record["cp"]
    v = record.get("virtual_stages", 1)
    return ParallelConfig(
        dp=gpus // (tp * pp * cp),
        tp=tp,
        pp=pp,
        cp=cp,
        ep=record.get("ep", 1),
        etp=record.get("etp", 1),
        sequence_parallel=record.get("sequence_parallel", False),
        zero_stage=record["zero_stage"],
        pipeline_schedule=record.get("pipeline_schedule", "interleaved_1f1b" if v > 1 else "1f1b"),
        virtual_stages=v,
        micro_batch_size=record["micro_batch"],
        recompute=record["recompute"],
    )


def run_model(record: dict) -> ModelSpec:
    return ModelSpec.from_hf_config(record["hf_config"], name=record["run"])


def run_workload(record: dict) -> Training:
    """The run's training workload; ``fp8_recipe`` where its table states one (Megatron-Bridge's
    FP8-CS: current scaling, FP8-MX / MXFP8: MXFP8), else the default; the optimizer moments'
    dtype where the publication states it."""
    recipe = {"fp8_recipe": record["fp8_recipe"]} if "fp8_recipe" in record else {}
    if "optimizer_state_dtype" in record:  # the run's optimizer moments (DeepSeek-V3: bf16)
        recipe["optimizer_state_dtype"] = record["optimizer_state_dtype"]
    return Training(
        sequence_length_tokens=record["seq_len"],
        global_batch_sequences=record["global_batch"],
        precision=record["precision"],
        framework=record["framework"],
        **recipe,
    )


def run_metric(record: dict) -> tuple[str, str, float, Callable]:
    unit, function = METRICS[record["metric"]]
    return (record["metric"], unit, float(record["published"]), function)


#: ``memory_setup`` keys that are ``EstimateOptions`` fields (the rest: the recompute policy
#: and gradient dtype, and facts kept for the record: FSDP, CUDA graphs, MoE dispatcher).
SETUP_OPTIONS = (
    "recompute_modules",
    "recompute_layers",
    "activation_offload_layers",
    "optimizer_instances",
    "pipeline_keeps_outputs",
    "eager_loss",
)


def apply_recorded_setup(
    setup: Mapping[str, Any], *, config: ParallelConfig, workload: Training
) -> tuple[ParallelConfig, Training, dict[str, Any]]:
    """The layout, workload and ``EstimateOptions`` fields of a run with its recipe's recorded
    settings (``memory_setup`` of the record) applied, for its step time and its memory alike:
    the recompute policy (and its modules or layer count), CPU activation offloading,
    distributed-optimizer instances, the main-gradient dtype."""
    if "recompute" in setup:
        config = config.model_copy(update={"recompute": setup["recompute"]})
    if "gradient_dtype" in setup:
        workload = workload.model_copy(update={"gradient_dtype": setup["gradient_dtype"]})
    options = {key: setup[key] for key in SETUP_OPTIONS if key in setup}
    return config, workload, options
