"""``estimate`` (one config -> ``CostBreakdown``) and ``estimate_table`` (a config table -> columns).

There is one implementation of the formulas, over tables: ``estimate`` builds a table of one
row, calls ``estimate_table`` and turns the row into a ``CostBreakdown`` (raising
``InfeasiblePlanError`` when it does not fit). Training is priced by ``_training`` and
``_memory``; inference by ``_inference_load.estimate_inference_table``.

Columns of a training estimate: ``time.<part>`` for ``TRAINING_TIME_PARTS`` (exposed seconds;
they sum to ``step_time_s``), ``hidden.<kind>`` (communication hidden behind compute),
``memory.<part>`` for ``MEMORY_PARTS`` (they sum to ``memory_per_device_bytes``, the rank with the
most memory), ``step_time_s``, ``memory_capacity_bytes``, ``feasible``, ``reason`` (code in
``REASON_CODES``), ``mfu``, ``tokens_per_s_per_device``, ``num_micro_batches``,
``bottleneck_stage`` and ``memory_stage`` (indices into ``STAGES``), ``model_flops_per_step``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from cost_model._breakdown import CostBreakdown, InfeasiblePlanError
from cost_model._memory import memory_columns
from cost_model._model_spec import ModelSpec
from cost_model._options import EstimateOptions
from cost_model._parallel import ParallelConfig
from cost_model._reasons import REASON_CODES, REASON_LABELS
from cost_model._rules import check_sequence_fits, check_table
from cost_model._table import configs_to_table
from cost_model._training import model_flops_per_step, training_time_columns
from cost_model._training_context import training_context
from cost_model._units import human_bytes
from cost_model._workload import Inference, Training

__all__ = ["estimate", "estimate_table", "breakdown_from_row"]


def estimate_table(
    model: ModelSpec,
    cluster,
    workload: Training | Inference,
    table: Mapping[str, np.ndarray],
    *,
    options: EstimateOptions | None = None,
) -> dict[str, np.ndarray]:
    """Cost of every row of ``table`` (see ``cost_model._table``); columns in the module docstring.

    A row the model's layout rules reject (``check_parallel_config``, over the table:
    ``check_table``) raises ``ValueError`` naming it and the rule; a row whose global batch does
    not divide into ``dp * micro_batch_size`` is reported infeasible, not raised.
    """
    check_table(table, model, expert_slots_fixed=not isinstance(workload, Inference))
    if isinstance(workload, Inference):
        from cost_model._inference_load import estimate_inference_table

        return estimate_inference_table(
            model=model, cluster=cluster, workload=workload, table=table, options=options
        )
    if not isinstance(workload, Training):
        raise ValueError(f"workload ({type(workload).__name__}) must be Training or Inference")
    return _training_table(model, cluster, workload, table, options or EstimateOptions())


def _training_table(
    model, cluster, workload: Training, table, options: EstimateOptions
) -> dict[str, np.ndarray]:
    ctx = training_context(
        model=model, cluster=cluster, workload=workload, table=table, options=options
    )
    columns = training_time_columns(ctx)
    columns.update(memory_columns(ctx))
    reason = np.where(
        ctx.batch_divides, columns.pop("memory_reason"), REASON_CODES["batch_not_divisible"]
    )
    step = columns["step_time_s"]
    world = ctx.column("dp") * ctx.column("cp") * ctx.column("tp") * ctx.column("pp")
    flops = model_flops_per_step(model=model, workload=workload)
    peak = cluster.device.peak_flops_for(workload.precision)
    columns.update(
        reason=reason.astype(np.int64),
        feasible=reason == REASON_CODES["feasible"],
        memory_capacity_bytes=np.full(step.shape, float(cluster.device.memory_bytes)),
        mfu=flops / (step * world * peak),
        tokens_per_s_per_device=workload.tokens_per_step / (step * world),
        num_micro_batches=ctx.num_micro_batches,
        model_flops_per_step=np.full(step.shape, flops),
    )
    return columns


def estimate(
    model: ModelSpec, cluster, workload: Training | Inference, config: ParallelConfig, **options
) -> CostBreakdown:
    """Cost of one ``config``; ``options`` are ``EstimateOptions`` fields, plus for inference
    ``ServingConfig`` fields (batch_size, num_redundant_experts, kv_dtype, ...).

    Raises ``ValueError`` for a config the model's rules reject and ``InfeasiblePlanError``
    naming the memory part (or SLO) that does not fit.
    """
    config.validate_for(model, num_redundant_experts=int(options.get("num_redundant_experts", 0)))
    if config.world_size > cluster.num_devices:
        raise ValueError(
            f"dp*cp*tp*pp ({config.world_size}) must be <= the cluster's devices ({cluster.num_devices})"
        )
    if isinstance(workload, Inference):
        from cost_model._reasons import REASON_CODES as inference_reasons
        from cost_model._serving_columns import ServingConfig

        serving = ServingConfig(
            **{k: v for k, v in options.items() if k in ServingConfig.model_fields}
        )
        rest = EstimateOptions(
            **{k: v for k, v in options.items() if k not in ServingConfig.model_fields}
        )
        table = configs_to_table([config], **serving.columns(workload=workload))
        columns = estimate_table(model, cluster, workload, table, options=rest)
        labels = {code: label for label, code in inference_reasons.items()}
    else:
        if config.attention_data_parallel:
            raise ValueError(
                "attention_data_parallel (True) is an inference layout; training needs False"
            )
        check_sequence_fits(config, workload.sequence_length_tokens)
        config.num_micro_batches(workload.sequences_per_step)
        table = configs_to_table([config])
        columns = estimate_table(
            model, cluster, workload, table, options=EstimateOptions(**options)
        )
        labels = REASON_LABELS
    breakdown = breakdown_from_row(columns, 0)
    if not bool(columns["feasible"][0]):
        raise _infeasible(
            breakdown, labels[int(columns["reason"][0])], training=isinstance(workload, Training)
        )
    return breakdown


def _infeasible(breakdown: CostBreakdown, reason: str, *, training: bool) -> InfeasiblePlanError:
    if reason in ("ttft_slo", "tpot_slo"):
        return InfeasiblePlanError(
            f"the plan misses the {reason.replace('_', ' ').upper()}", part=reason
        )
    part = max(breakdown.memory_bytes, key=lambda name: breakdown.memory_bytes[name])
    needed, available = breakdown.memory_per_device_bytes, breakdown.memory_capacity_bytes
    return InfeasiblePlanError(
        f"memory per device needs {human_bytes(needed)}, the device has {human_bytes(available)}; "
        f"the largest part is {part} ({human_bytes(breakdown.memory_bytes[part])})",
        part=part,
        needed_bytes=needed,
        available_bytes=available,
        suggestion="raise tp/pp/ep, the ZeRO stage or recompute, or lower micro_batch_size"
        if training
        else "raise tp/pp/ep, lower batch_size or use a smaller kv_dtype",
    )


def _optional(columns: Mapping[str, np.ndarray], name: str, index: int) -> float | None:
    if name not in columns:
        return None
    value = float(columns[name][index])
    return None if np.isnan(value) else value


def breakdown_from_row(columns: Mapping[str, np.ndarray], index: int) -> CostBreakdown:
    """Row ``index`` of an ``estimate_table`` result as a ``CostBreakdown``."""
    time = {name[5:]: float(v[index]) for name, v in columns.items() if name.startswith("time.")}
    hidden = {
        name[7:]: float(v[index]) for name, v in columns.items() if name.startswith("hidden.")
    }
    memory = {
        name[7:]: float(v[index]) for name, v in columns.items() if name.startswith("memory.")
    }
    batch = _optional(columns, "batch_size", index)
    cap = _optional(columns, "running_cap", index)
    return CostBreakdown(
        step_time_s=float(columns["step_time_s"][index]),
        time_s=time,
        hidden_time_s=hidden,
        memory_per_device_bytes=float(columns["memory_per_device_bytes"][index]),
        memory_bytes=memory,
        memory_capacity_bytes=float(columns["memory_capacity_bytes"][index]),
        mfu=_optional(columns, "mfu", index),
        tokens_per_s_per_device=_optional(columns, "tokens_per_s_per_device", index),
        ttft_s=_optional(columns, "ttft_s", index),
        tpot_s=_optional(columns, "tpot_s", index),
        e2e_s=_optional(columns, "e2e_s", index),
        batch_size=None if batch is None else int(batch),
        running_cap=None if cap is None else int(cap),
        bottleneck=max(time, key=lambda name: time[name]) if time else "",
    )
