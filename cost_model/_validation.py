"""Predicted vs published: the rows of every validation table, their summary and TOLERANCES.

Each published training case (``_validation_cases``) is re-run through ``estimate_table``
with the parallel layout and the software of the run, on a cluster preset of its hardware,
and compared in the table's own metric (``run_case``); the memory tables
(``korthikanti_fig1_memory``, the published peak memory per device) are compared per GiB.
``TOLERANCES`` bounds each table's mean and max error.

The DeepSeek serving rows (Day-6 production, and the profiles of the same units) come from
``cost_model._inference_validation``.
Every run here is validation only: the calibration (``data/calibration.json``) is fitted on
operator measurements (``cost_model._calibration_operators``), never on these figures.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from cost_model._estimate import estimate_table
from cost_model._memory import stage_memory
from cost_model._options import Calibration, EstimateOptions, calibration_for
from cost_model._parallel import ParallelConfig
from cost_model._stages import STAGES
from cost_model._table import configs_to_table
from cost_model._training_context import training_context
from cost_model._validation_cases import (
    PRESETS,
    SOFTWARE,
    Case,
    _korthikanti_model,
    _table5_config,
    peak_memory_cases,
    published_records,
    training_cases,
)
from cost_model._validation_runs import apply_recorded_setup
from cost_model._workload import Training

GIB = 1024.0**3

#: Bounds per table: (max mean |error|, max |error|), None where not bounded. Every training
#: figure is held out (the calibration is fitted on operator tables only); the bounds are the
#: measured held-out state (benchmarks/validate_published.py), a little above it, not targets.
#: The collectives' fixed cost per call (``Calibration.collective_overhead_s``) brought the
#: fitted bandwidth of 64-512 MiB collectives to the NCCL tables (it was 14-39% slow): the
#: A100 tables without tensor-parallel overlap gained (SC'21 9.0 -> 6.0% mean, Korthikanti
#: 9.3 -> 5.0%, README 2022 6.1 -> 2.5%), while H100 runs whose tensor-parallel traffic is
#: priced as hidden behind compute came out faster (Llama 3 Table 4 8.7 -> 14.5%, the
#: Megatron-core H100 README 15.7 -> 17.4%): the slow collectives had offset an overlap that is
#: priced more completely than runs reach (torchtitan's async tensor parallel gained 1.09x in
#: bf16 and 1.16x in fp8 on Llama 3 70B, benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md;
#: the model hides all of it). Day-6 serving rows must each be within 25%; the fully loaded
#: DeepSeek profiles, the model's own bar, 10%.
TOLERANCES: dict[str, tuple[float | None, float | None]] = {
    "megatron_sc21_table1": (0.07, 0.14),  # measured 6.0% mean, 12.4% max
    "korthikanti_table5": (0.06, 0.15),  # measured 5.0%, 13.3%
    "megatron_readme_2022_mfu": (0.03, 0.06),  # measured 2.5%, 4.9%
    "korthikanti_fig1_memory": (None, 0.05),  # measured 2.0% max
    "torchtitan_h100_peak_memory": (None, 0.10),  # measured 5.6% max, all low (4.0% mean)
    "torchtitan_h200_peak_memory": (None, 0.10),  # measured 7.0% max, both low
    # measured 7.1% mean, 21.2% max: the 405B 1F1B row is 21% low (its interleaved twin +1%),
    # terms the model does not source yet (see data/published_peak_memory.json 'about').
    "torchtitan_h100_peak_memory_tp_pp": (0.10, 0.22),
    # measured 15.1% mean, 16.6% max: the four 405B 1F1B runs of torchtitan's Table 6 (TP 8,
    # PP 8, CP 1-8) are all 10-14 GiB low, as Table 5's 1F1B run is (data 'about').
    "torchtitan_h100_peak_memory_4d": (0.16, 0.17),
    # measured 14.6% mean, 32.1% max: 1.7B and 7.1B +32% and +31% fast, 32B 25% slow (its
    # fp32 gradient reduce-scatter over 48 nodes is priced mostly exposed).
    "megatron_readme_h100": (0.15, None),
    "torchtitan_a100_fsdp": (0.04, 0.10),  # measured 3.1%, 8.8%
    # measured 13.1%, 13.9%: Trainy's Llama 3.1 8B FSDP + compile + float8 runs on 32 and 64
    # H200, whose torchtitan (e7c0cae) ran torch SDPA's FlashAttention-2 kernels on Hopper
    # (EstimateOptions.attention_kernel, data/attention_kernels.json: 21-22% fast priced at the
    # calibration's attention efficiency), are still 12-14% slower than predicted, while their
    # peak memory is within 3% and the same recipe's fp8/bf16 speed-ups (fp8_twins) within 10%.
    "torchtitan_h200_fsdp": (0.14, 0.15),
    # measured 14.5%, 22.5%: the 131K-context row is 22% fast (its exposed K/V all-gather and
    # attention are priced, the report's document mask is not).
    "llama3_table4": (0.15, 0.23),
    # measured -6.7%: DeepSeek-V3's pre-training (2048 H800, PP 16 DualPipe, EP 64, fine-grained
    # fp8), its GPU hours per trillion tokens; priced with DualPipe's two stages and pp + 1
    # micro-batches per rank, bf16 optimizer moments and fp8 SwiGLU inputs, it fits its 80 GB
    # (72.3 GB predicted).
    "deepseek_v3_report": (None, 0.10),
    # measured +10.4%, +10.2%, +10.6%: Nemotron-4 340B's pre-training on 1536-6144 H100 (TP 8,
    # PP 12 interleaved), its NeMo recipe's settings where the report states none (virtual
    # stages 8, tensor-parallel communication exposed); predicted fast like Llama 3's Table 4.
    "nemotron4_340b_report": (0.13, 0.15),
    # Not bounded: the MoE runs on x86 hosts with Megatron-core's alltoall dispatcher are priced
    # far too fast (measured 16.2% mean, 89.5% max: Qwen3-30B-A3B at micro-batch 1 on B200
    # +68..+75%, on H100 +54..+90%) while the same models with HybridEP on GB200 are within
    # 10%: the published tables show a cost per micro-batch (the same B200 layout runs 18,066
    # tokens/s/GPU token-dropping, 9,299 dropless, 26,695 at micro-batch 4 with HybridEP), not
    # the expert GEMMs, which are large at 2048 tokens per expert; shown so the gap stays visible.
    "megatron_bridge_perf": (None, None),
    "dsv3_day6": (None, 0.25),
    "dsv3_profile": (None, 0.10),
    "fp8_twins": (None, 0.10),
    # Twins on a device with no fp8 GEMM table (MI300X): their fp8 GEMMs are priced with the
    # fallback ratio, nothing measured; shown, marked, not bounded.
    "fp8_twins_no_fp8_curve": (None, None),
    # measured 2.9% mean, 7.3% max (70B bf16 +7%): asynchronous TP hides each collective only
    # beside the GEMM it is fused with (``_training_tp_overlap``); hidden behind the whole layer
    # the speed-ups came out 1.32-1.40x against 1.09-1.16x published.
    "torchtitan_async_tp": (0.05, 0.10),
    # Ratios of torchtitan's 2024-12 runs (``_ratio_validation``): interleaved 1F1B over 1F1B on
    # the 405B run of Table 5, +0.6% (1.287x against 1.28x); torch.compile over eager on the 8B
    # FSDP runs of Tables 1 and 3, +1.5% and +1.0%; the Table 4 async-TP pair joins
    # ``torchtitan_async_tp`` (+7.1%).
    "torchtitan_schedules": (None, 0.05),
    "torchtitan_compile": (None, 0.05),
    # measured 18.6% mean, 27.5% max: at the same tokens per rank, throughput as context
    # parallelism grows from 1 to 8 (sequence 32K to 256K) falls faster than predicted on the
    # 8B and 405B runs of Tables 2 and 6 (CP 8: 0.141 and 0.211 of CP 1 published, 0.177 and
    # 0.268 predicted; 8B CP 2 the one row predicted slower, -8%); not explained (data 'about').
    "torchtitan_context_parallel": (0.19, 0.28),
    "blackwell_training": (0.13, None),  # measured 12.6% mean, 75.2% max
}


class ValidationRow(BaseModel):
    """One compared figure. ``error`` is (predicted - published) / published."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    table: str
    run: str
    metric: str
    unit: str
    predicted: float
    published: float

    @property
    def error(self) -> float:
        return (self.predicted - self.published) / self.published

    @property
    def speed_error(self) -> float:
        """The predicted speed over the published one, less 1 (> 0: predicted too fast): the
        ``error`` of a throughput or MFU figure, published / predicted - 1 of a time (unit s)."""
        if self.unit == "s":
            return self.published / self.predicted - 1.0
        return self.error


def memory_inputs(case: Case) -> tuple[ParallelConfig, Training, dict[str, Any]]:
    """The layout, workload and ``EstimateOptions`` fields of ``case`` with its recipe's
    recorded settings applied (``apply_recorded_setup``): the recompute policy (and its modules
    or layer count), CPU activation offloading, the main-gradient dtype. Both the throughput
    (``run_case``) and the memory checks (``peak_memory_bytes``) estimate from them."""
    return apply_recorded_setup(
        dict(case.memory_setup), config=case.config, workload=_workload(case)
    )


def recipe_estimate(case: Case, *, micro_batch: int | None = None) -> tuple[dict, Any, Any]:
    """(estimate columns, cluster, workload) of ``case`` under its recipe's recorded settings
    (``memory_inputs``); ``micro_batch`` replaces the run's, the global batch scaled with it."""
    config, workload, options = memory_inputs(case)
    cluster = _cluster(case.hardware, config.world_size)
    if micro_batch is not None:
        scale = micro_batch / config.micro_batch_size
        config = config.model_copy(update={"micro_batch_size": micro_batch})
        workload = workload.model_copy(
            update={"global_batch_sequences": int(workload.sequences_per_step * scale)}
        )
    columns = estimate_table(
        case.model,
        cluster,
        workload,
        configs_to_table([config]),
        options=_options(case, None, cluster, setup=options),
    )
    return columns, cluster, workload


def peak_memory_bytes(case: Case, *, micro_batch: int | None = None) -> tuple[float, float]:
    """(predicted peak bytes per device, device capacity) of ``case`` under its recipe's memory
    settings (``recipe_estimate``)."""
    columns, cluster, _ = recipe_estimate(case, micro_batch=micro_batch)
    return float(columns["memory_per_device_bytes"][0]), float(cluster.device.memory_bytes)


def _cluster(hardware: str, gpus: int):
    from topology import get_preset

    preset = get_preset(PRESETS[hardware])
    return preset.with_nodes(max(1, math.ceil(gpus / preset.devices_per_node)))


def _options(
    case: Case, calibration: Calibration | None, cluster, *, setup: dict[str, Any] | None = None
) -> EstimateOptions:
    """The calibration, the run's dropout (a hyperparameter of the run, not the software) and
    loss kernel, its recorded ``EstimateOptions`` facts and the recipe's settings ``setup``
    (``memory_inputs``)."""
    base = calibration if calibration is not None else calibration_for(cluster.device)
    software = SOFTWARE.get(case.software, {})
    recorded = ("hidden_dropout", "attention_dropout", "unfused_cross_entropy")
    run_facts = {key: software[key] for key in recorded if key in software}
    return EstimateOptions(
        calibration=base, **run_facts, **dict(case.estimate_options), **(setup or {})
    )


def _workload(case: Case) -> Training:
    """The case's workload with the framework profile of its software."""
    framework = SOFTWARE.get(case.software, {}).get("framework")
    return (
        case.workload
        if framework is None
        else case.workload.model_copy(update={"framework": framework})
    )


def run_case(case: Case, *, calibration: Calibration | None = None) -> list[ValidationRow]:
    """Estimate ``case`` under its recipe's recorded settings (``memory_inputs``) and compare
    each of its metrics."""
    config, workload, setup = memory_inputs(case)
    cluster = _cluster(case.hardware, config.world_size)
    options = _options(case, calibration, cluster, setup=setup)
    columns = estimate_table(
        case.model, cluster, workload, configs_to_table([config]), options=options
    )
    return [
        ValidationRow(
            table=case.table,
            run=case.run,
            metric=name,
            unit=unit,
            predicted=fn(columns, case),
            published=published,
        )
        for name, unit, published, fn in case.metrics
    ]


def memory_rows(*, calibration: Calibration | None = None) -> list[ValidationRow]:
    """Korthikanti Fig. 1: parameters + optimizer of a middle rank; activations of the first."""
    rows = []
    table5 = {r["model"]: r for r in published_records() if r["table"] == "korthikanti_table5"}
    for r in (r for r in published_records() if r["table"] == "korthikanti_fig1_memory"):
        run = table5[r["model"]]
        model = _korthikanti_model(r["model"])
        workload = Training(
            sequence_length_tokens=run["seq_len"],
            global_batch_sequences=run["global_batch"],
            precision="fp16",
        )
        case = Case(
            r["table"],
            r["model"],
            "A100",
            model,
            workload,
            _table5_config(run, selective=True),
            "megatron_2021",
        )
        plain = case.config.model_copy(update={"recompute": "none", "sequence_parallel": False})
        none, selective = (
            _stage_memory(case, config, calibration) for config in (plain, case.config)
        )
        middle, first = STAGES.index("middle"), STAGES.index("first")
        states = sum(none[part][middle, 0] for part in ("weights", "gradients", "optimizer_states"))
        for metric, predicted, published in (
            ("params_optimizer", states, r["params_optimizer_GiB"]),
            (
                "activations_no_recompute",
                none["activations"][first, 0],
                r["activations_no_recompute_GiB"],
            ),
            (
                "activations_sp_selective",
                selective["activations"][first, 0],
                r["activations_seqpar_selective_GiB"],
            ),
        ):
            rows.append(
                ValidationRow(
                    table=r["table"],
                    run=r["model"],
                    metric=metric,
                    unit="GiB",
                    predicted=predicted / GIB,
                    published=published,
                )
            )
    return rows


def _stage_memory(
    case: Case, config: ParallelConfig, calibration: Calibration | None
) -> dict[str, np.ndarray]:
    cluster = _cluster(case.hardware, config.world_size)
    ctx = training_context(
        model=case.model,
        cluster=cluster,
        workload=_workload(case),
        table=configs_to_table([config]),
        options=_options(case, calibration, cluster),
    )
    return stage_memory(ctx)


def training_rows(*, calibration: Calibration | None = None) -> list[ValidationRow]:
    """Every training comparison: throughput tables and the Fig. 1 memory table."""
    rows = [row for case in training_cases() for row in run_case(case, calibration=calibration)]
    return rows + memory_rows(calibration=calibration)


def inference_rows() -> list[ValidationRow]:
    """DeepSeek serving rows from ``cost_model._inference_validation``: the Day-6 production
    averages, the Day-6 prefill row under other prompt-length spreads (not bounded: it shows what
    the spread carries), then the fully loaded profiles of the same units."""
    from cost_model._inference_validation import (
        day6_prefill_by_prompt_cv,
        validate_dsv3_day6,
        validate_dsv3_profile,
    )

    tables = {
        "dsv3_day6": validate_dsv3_day6(),
        "dsv3_day6_by_prompt_cv": day6_prefill_by_prompt_cv(),
        "dsv3_profile": validate_dsv3_profile(),
    }
    return [
        ValidationRow(
            table=table,
            run=item.name,
            metric=item.metric,
            unit=item.unit,
            predicted=item.predicted,
            published=item.published,
        )
        for table, items in tables.items()
        for item in items
    ]


def peak_memory_rows() -> list[ValidationRow]:
    """Predicted vs published peak memory per device (GiB), one row per run."""
    return [
        ValidationRow(
            table=case.table,
            run=case.run,
            metric="peak_memory",
            unit="GiB",
            predicted=peak_memory_bytes(case)[0] / GIB,
            published=published,
        )
        for case, published in peak_memory_cases()
    ]


def validate_published(*, include_inference: bool = True) -> list[ValidationRow]:
    """Every comparison of the published table, in table order."""
    from cost_model._blackwell_validation import blackwell_rows
    from cost_model._precision_validation import fp8_twin_rows
    from cost_model._ratio_validation import ratio_rows
    from cost_model._tp_overlap_validation import async_tp_rows

    extra = fp8_twin_rows() + async_tp_rows() + ratio_rows() + blackwell_rows()
    extra = extra + peak_memory_rows()
    return training_rows() + extra + (inference_rows() if include_inference else [])


def summarize(rows: list[ValidationRow]) -> dict[str, dict[str, float]]:
    """Per table: number of figures, mean and max absolute relative error."""
    summary: dict[str, dict[str, float]] = {}
    for table in dict.fromkeys(row.table for row in rows):
        errors = np.abs([row.error for row in rows if row.table == table])
        summary[table] = {
            "count": int(errors.size),
            "mean_abs_error": float(errors.mean()),
            "max_abs_error": float(errors.max()),
        }
    return summary


# ---------------------------------------------------------------------------- calibration
#: Hardware type -> regex of the device names its calibration applies to (``data/calibration.json``,
#: fitted on operator tables by ``benchmarks/calibrate_operators.py``; no run here is a fit input).
DEVICE_PATTERNS = {
    "A100": "A100",
    "H100": "H100|H800",
    "H200": "H200",
    "B200": "NVIDIA B200",
    "GB200": "GB200",
}
