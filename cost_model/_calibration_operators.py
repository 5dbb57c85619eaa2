"""Per-hardware calibration fitted on operator measurements only (fit on parts, validate on wholes).

The few global parameters of a ``Calibration`` are fitted, per hardware type, on single-operator
latencies — never on a whole training or serving run, which stay validation data:

* ``matmul_efficiency`` and ``kernel_overhead_s``: bf16 GEMM latencies, with the cost model's own
  pricing of one GEMM (``_pricing.op_time_s``: the roofline of 2mnk FLOPs and the three operands'
  bytes) plus the fixed per-kernel cost, in the range of shapes a training micro-batch runs
  (``TRAINING_RANGE``); then, with that fixed cost,
* the forward efficiency of fused causal attention: prefill ("context") attention latencies, the
  FLOPs counted as the cost model counts them (``core_attention_time``: 4·heads·head_dim FLOPs per
  attended key, (s + 1)/2 keys per query under the causal mask). Training runs the forward and a
  backward of 2.5x its FLOPs (FlashAttention-2, Dao 2023, sec. 3.1), and the backward kernel reaches
  less of the peak: up to 63% against the forward's 73% on A100 (FlashAttention-2, arXiv:2307.08691,
  sec. 1 and 4.1). ``attention_efficiency`` is the one efficiency giving the same forward +
  backward time: 3.5 / (1/e_fwd + 2.5/(e_fwd * 63/73)). The 63/73 ratio is the A100 figure and
  is carried to the other generations (an assumption, recorded in each entry).
* the fp8 GEMMs, per table dtype (``fp8``: per-tensor or per-row/column scales applied in the
  epilogue; ``fp8_block``: 1x128 / 128x128 block scales in the main loop): a fraction of the fp8
  peak and their own fixed cost per kernel (the fp8 kernels' rate keeps rising over a wider range
  of sizes than bf16's), fitted like the bf16 pair on the fastest engine's latency per shape of
  at least ``FP8_MIN_FLOPS``, the size of a training step's fp8 GEMMs (the per-tensor table on
  Hopper together with a first-party measurement of torch's cuBLASLt fp8 GEMM against bf16 on
  an H200, ``first_party_fp8_rows``, equal weight per source: the table alone priced the
  measured speed-ups 3-5% low at training sizes); recorded in the fit's
  ``parameters`` (``fp8_matmul_efficiency``, ``fp8_kernel_overhead_s``, ``fp8_block_...``), with
  residuals per decade of FLOPs and a held-out error (folds of weight shapes). Each table point
  is a whole W8A8 call, its activation quantization first: the fit prices that pass apart
  (``_calibration_fits.FP8_TABLE_QUANTIZATION_BYTES``, memory-bound) and fits the GEMM alone,
  since training prices its own quantization kernels; with the pass, the fits' rms log error
  halves (H100 per-tensor 0.166 -> 0.083, block-scaled 0.135 -> 0.090) and the H100 per-tensor
  efficiency from the table alone is 0.678 of the fp8 peak (0.625 with the pass absorbed; MAMF
  1402.6 / 1979 = 0.709), 0.715 with the first-party speed-ups beside it. ``_precision`` prices fp8 GEMMs with them, not with the bf16 efficiency at the doubled
  peak. A100 has no fp8 tensor cores and no fp8 fit; devices without tables (MI300X) have none
  either.
* ``collective_efficiency`` and ``collective_overhead_s``: NCCL all-reduce, all-gather and
  reduce-scatter latencies within one node (2-8 GPUs; nccl-tests "size" convention, the table's
  ``message_size`` in elements of its dtype), against ``Cluster.collective_time`` of the
  hardware's preset, for messages of at least 1 MiB: the sizes the shared calibration prices,
  from a decode step's tensor-parallel all-reduce (64 sequences x 7168 hidden x 2 bytes:
  0.9 MiB) to training's activations and gradient buckets (tens to hundreds of MiB). Two
  parameters, the Hockney alpha-beta form (R. W. Hockney, 'The communication challenge for
  MPP: Intel Paragon and Meiko CS-2', Parallel Computing 20(3), 1994: time = a fixed cost per
  message plus its size over the bandwidth) as the GEMM and all-to-all fits: the fraction of
  the modelled bandwidth reached and a fixed cost per call (NCCL's launch and protocol set-up,
  beyond the presets' per-step link latency). One constant alone must absorb that fixed cost
  into the bandwidth: fitted from 1 MiB up, it priced the 64-512 MiB messages of training's
  tensor- and data-parallel collectives 1.14-1.39x too slow (mean predicted / measured, H100
  to B200 tables), the fitted pair 0.99-1.08x. The residuals by group size and message size
  record what remains (2-GPU groups reach less of the link than the ring model gives them,
  8-GPU all-gathers and reduce-scatters more).
* ``all_to_all_efficiency`` and ``all_to_all_overhead_s``: the all-to-all rows alone (the
  expert dispatch and combine of MoE training; ``_pricing.collective_time_s`` prices an
  all-to-all with them), groups of at least ``ALL_TO_ALL_MIN_GPUS`` ranks. Two parameters, as
  the GEMM fit: the fraction of the modelled bandwidth reached and a fixed cost per call (the
  all-to-all of a few KiB takes 10-13 us on every table, against the presets' few-microsecond
  link latency: NCCL's launch and the set-up of one connection per peer). A single constant
  shared with the other collectives priced the all-to-all of the hundreds of MiB an
  expert-parallel layer moves 1.2-1.35x too slow (mean predicted / measured over the messages
  of at least 64 MiB of 4-8 GPUs: 1.22 H100, 1.28 GB200 (4 GPUs), 1.34 B200; the fitted pair:
  1.05, 1.03, 1.04). A 2-rank all-to-all is one send/recv pair (a rank's one peer gets
  NCCL's per-peer channels only); its bandwidth is 0.6-0.7x the 4-rank one on NVLink 5 (331
  vs 488 GB/s busBw at 512 MiB, B200 and GB200 tables) and rises further with 8 ranks (563):
  the regime of expert parallelism (8-64 ranks in the published MoE runs) starts at several
  peers, so 2-rank groups are left out. The residuals by group size record the rise.

Sources: NVIDIA's ``aiconfigurator-core`` 0.12.0 wheel (PyPI, Apache-2.0), per-operator tables
``systems/data/<device>/{gemm,attention,comm/nccl}/<engine>/<version>/*.parquet``; where several
engines measured a shape, the fastest (the kernel a tuned run uses). Its end-to-end tables
(``silicon_sample.csv``) are never opened. Fit: least squares on log(predicted / measured)
(Nelder-Mead; Nelder & Mead 1965), no bounds active at the optimum.
``benchmarks/calibrate_operators.py`` reads the tables and writes ``data/calibration.json``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cost_model._calibration_fits import (
    FP8_TABLE_QUANTIZATION_BYTES,
    _error_by_flops,
    _residual_summary,
    attention_seconds,
    collective_residuals,
    fit_all_to_all,
    fit_collectives,
    fit_fp8_gemm,
    fit_kernels,
    fp8_held_out,
    gemm_seconds,
    nccl_seconds,
    training_attention_efficiency,
)
from cost_model._calibration_tables import (
    ALL_TO_ALL_MIN_GPUS,
    HARDWARE,
    MIN_COLLECTIVE_BYTES,
    PACKAGE,
    TRAINING_RANGE,
    OperatorHardware,
    OperatorRows,
    _subset,
    all_to_all_rows,
    attention_rows,
    collective_rows,
    gemm_rows,
    nccl_rows,
)
from cost_model._options import Calibration
from cost_model._pricing import op_time_s

if TYPE_CHECKING:
    from topology import Cluster, HardwareSpec

#: Where a fitted parameter may lie. A value at a bound is a failed fit (the model lacks a term).
BOUNDS = {
    "matmul_efficiency": (0.3, 1.0),
    "attention_efficiency": (0.15, 1.0),
    "kernel_overhead_s": (0.0, 20e-6),
    "collective_efficiency": (0.5, 1.5),
    "collective_overhead_s": (0.0, 100e-6),
    "all_to_all_efficiency": (0.3, 1.5),
    "all_to_all_overhead_s": (0.0, 100e-6),
    "fp8_matmul_efficiency": (0.2, 1.0),
    "fp8_kernel_overhead_s": (0.0, 60e-6),
    "fp8_block_matmul_efficiency": (0.2, 1.0),
    "fp8_block_kernel_overhead_s": (0.0, 60e-6),
}
#: The fp8 GEMM tables' dtypes and the parameter each fixes (a fraction of the fp8 peak):
#: ``fp8`` holds scaled fp8 GEMMs with one scale per tensor or per row/column, applied in the
#: epilogue (TensorRT-LLM per-tensor, sgl-kernel ``fp8_scaled_mm`` per-token/per-channel, vLLM
#: ``CutlassFP8ScaledMMLinearKernel``); ``fp8_block`` the 1x128 / 128x128 block-scaled GEMMs
#: (DeepGEMM, FlashInfer), whose scales enter the main loop.
#: Each table fixes two parameters, as the bf16 one does: the efficiency and the fixed cost of
#: a kernel (the fp8 kernels' is their own: their rate ramps up over a longer range of sizes).
FP8_GEMM_DTYPES = {"fp8": "fp8", "fp8_block": "fp8_block"}
#: The fp8 GEMMs of a training step: at least 1e11 FLOPs per call. The fp8 layers of the
#: published fp8 runs are all above it (the smallest, llama3-8b's QKV under TP 8: 98,304 tokens x
#: 4096 x 768 x 2 = 6e11 FLOPs; DeepSeek-V3's expert GEMMs at a few thousand tokens per expert:
#: 4096 x 7168 x 2048 x 2 = 1.2e11). Below it the fp8 kernels' rate is still ramping up (47% of
#: its large-shape value at 1e10 FLOPs on H100), which one efficiency and one fixed cost cannot
#: follow over four decades; the residuals by decade record what is left.
FP8_MIN_FLOPS = 1e11


#: A first-party fp8/bf16 speed-up per shape (``data/fp8_gemm_first_party.json``,
#: ``benchmarks/fp8_gemm_check.py`` on an H200), fitted beside the imported per-tensor fp8 table
#: on the devices its ``device_patterns`` name, each source with equal weight.
FIRST_PARTY_FP8 = "fp8_gemm_first_party.json"


def first_party_fp8_rows(
    device: HardwareSpec, *, bf16_efficiency: float, bf16_overhead_s: float
) -> OperatorRows | None:
    """The first-party speed-ups as fp8 GEMM latencies on the bf16 fit's scale: each shape's
    bf16 latency as the bf16 fit prices it, over the measured speed-up, plus the activation
    quantization pass each table point times with its GEMM (``FP8_TABLE_QUANTIZATION_BYTES``), so
    that the rows join the table's in one fit; shapes of at least ``FP8_MIN_FLOPS``. None where
    the measurement does not cover ``device``."""
    data = json.loads((resources.files("cost_model") / "data" / FIRST_PARTY_FP8).read_text())
    if not re.search(data["device_patterns"], device.name):
        return None
    kept = [r for r in data["rows"] if 2.0 * r["m"] * r["n"] * r["k"] >= FP8_MIN_FLOPS]
    columns = {axis: np.array([float(r[axis]) for r in kept]) for axis in ("m", "n", "k")}
    shapes = OperatorRows(
        kind="gemm_fp8_first_party",
        columns=columns,
        seconds=np.ones(len(kept)),
        tables=(f"cost_model/data/{FIRST_PARTY_FP8}",),
    )
    bf16 = gemm_seconds(
        shapes, device=device, matmul_efficiency=bf16_efficiency, overhead_s=bf16_overhead_s
    )
    quantize = op_time_s(
        flops=0.0,
        bytes_moved=FP8_TABLE_QUANTIZATION_BYTES * columns["m"] * columns["k"],
        hardware=device,
        dtype="bf16",
        calibration=Calibration(),
    )
    speedup = np.array([float(r["speedup"]) for r in kept])
    return OperatorRows(
        kind=shapes.kind, columns=columns, seconds=bf16 / speedup + quantize, tables=shapes.tables
    )


def _joined(table: OperatorRows, other: OperatorRows) -> tuple[OperatorRows, np.ndarray]:
    """Both sources' rows as one fit input, each source weighing as much as the other."""
    columns = {axis: np.concatenate([table.columns[axis], other.columns[axis]]) for axis in "mnk"}
    rows = OperatorRows(
        kind=table.kind,
        columns=columns,
        seconds=np.concatenate([table.seconds, other.seconds]),
        tables=table.tables + other.tables,
    )
    weights = np.concatenate(
        [np.full(table.count, 1.0 / table.count), np.full(other.count, 1.0 / other.count)]
    )
    return rows, weights


def _inside(name: str, value: float) -> float:
    low, high = BOUNDS[name]
    return float(min(max(value, low), high))


@dataclass
class _FitRecord:
    """The inputs and residuals of one hardware's fit, in the order the record lists them."""

    inputs: list[dict[str, Any]] = field(default_factory=list)
    residuals: dict[str, Any] = field(default_factory=dict)


def _record_kernels(
    record: _FitRecord,
    *,
    gemm: OperatorRows,
    attention: OperatorRows,
    device: HardwareSpec,
    kernels: dict[str, float],
) -> None:
    """Record the bf16 GEMM and attention tables and their residuals under the kernel fit."""
    for rows, predicted in (
        (
            gemm,
            gemm_seconds(
                gemm,
                device=device,
                matmul_efficiency=kernels["matmul_efficiency"],
                overhead_s=kernels["overhead_s"],
            ),
        ),
        (
            attention,
            attention_seconds(
                attention,
                device=device,
                forward_efficiency=kernels["attention_forward_efficiency"],
                overhead_s=kernels["overhead_s"],
            ),
        ),
    ):
        if not rows.count:
            continue
        record.inputs.append(
            {
                "kind": rows.kind,
                "source": PACKAGE,
                "tables": list(rows.tables),
                "points": rows.count,
            }
        )
        record.residuals[rows.kind] = _residual_summary(predicted, rows.seconds)


def _fit_collectives(
    record: _FitRecord, *, nccl: OperatorRows, cluster: Cluster
) -> tuple[float, float]:
    """Fit and record the all-reduce, all-gather and reduce-scatter rows: (efficiency, s/call)."""
    collectives = collective_rows(nccl)
    if not collectives.count:
        return 1.0, 0.0
    efficiency, overhead_s = fit_collectives(collectives, cluster=cluster)
    record.inputs.append(
        {
            "kind": "nccl",
            "op": ["all_reduce", "all_gather", "reduce_scatter"],
            "source": PACKAGE,
            "tables": list(collectives.tables),
            "points": collectives.count,
        }
    )
    record.residuals["nccl"] = collective_residuals(
        collectives,
        nccl_seconds(
            collectives,
            cluster=cluster,
            collective_efficiency=efficiency,
            overhead_s=overhead_s,
        ),
    )
    return efficiency, overhead_s


def _fit_all_to_all(
    record: _FitRecord, *, nccl: OperatorRows, cluster: Cluster
) -> tuple[float | None, float]:
    """Fit and record the all-to-all rows: (efficiency, s/call); no efficiency without rows."""
    all_to_all = all_to_all_rows(nccl)
    if not all_to_all.count:
        return None, 0.0
    efficiency, overhead_s = fit_all_to_all(all_to_all, cluster=cluster)
    record.inputs.append(
        {
            "kind": "nccl",
            "op": "all_to_all",
            "min_gpus": ALL_TO_ALL_MIN_GPUS,
            "source": PACKAGE,
            "tables": list(all_to_all.tables),
            "points": all_to_all.count,
        }
    )
    record.residuals["nccl_all_to_all"] = collective_residuals(
        all_to_all,
        nccl_seconds(
            all_to_all,
            cluster=cluster,
            collective_efficiency=efficiency,
            overhead_s=overhead_s,
        ),
    )
    return efficiency, overhead_s


def _fit_fp8_gemms(
    record: _FitRecord,
    *,
    root: Path,
    hardware: OperatorHardware,
    device: HardwareSpec,
    bf16: tuple[float, float],
) -> tuple[dict[str, float], dict[str, Any]]:
    """Fit each fp8 GEMM table of at least ``FP8_MIN_FLOPS``, the per-tensor one together with
    the first-party speed-ups where they cover the device (``first_party_fp8_rows``, on the scale
    of the ``bf16`` (efficiency, per-kernel seconds) fit); return parameters and held-out (of the
    table alone)."""
    fp8_parameters: dict[str, float] = {}
    fp8_held: dict[str, Any] = {}
    if "fp8" not in device.peak_flops:
        return fp8_parameters, fp8_held
    for table_dtype, name in FP8_GEMM_DTYPES.items():
        rows = gemm_rows(root, hardware, table_dtype)
        flops = 2.0 * rows.columns["m"] * rows.columns["n"] * rows.columns["k"]
        rows = _subset(rows, flops >= FP8_MIN_FLOPS)
        if not rows.count:
            continue
        first_party = None
        if table_dtype == "fp8":
            first_party = first_party_fp8_rows(
                device, bf16_efficiency=bf16[0], bf16_overhead_s=bf16[1]
            )
        if first_party is None:
            efficiency, fp8_overhead = fit_fp8_gemm(rows, device=device)
        else:
            joined, weights = _joined(rows, first_party)
            efficiency, fp8_overhead = fit_fp8_gemm(joined, device=device, weights=weights)
            _record_first_party(record, first_party, device, efficiency, fp8_overhead)
        fp8_parameters[f"{name}_matmul_efficiency"] = round(efficiency, 4)
        fp8_parameters[f"{name}_kernel_overhead_s"] = round(fp8_overhead, 9)
        predicted = gemm_seconds(
            rows,
            device=device,
            matmul_efficiency=efficiency,
            overhead_s=fp8_overhead,
            dtype="fp8",
        )
        record.inputs.append(
            {
                "kind": "gemm",
                "dtype": table_dtype,
                "source": PACKAGE,
                "tables": list(rows.tables),
                "points": rows.count,
            }
        )
        record.residuals[rows.kind] = _residual_summary(predicted, rows.seconds)
        record.residuals[rows.kind]["mean_error_by_flops"] = _error_by_flops(rows, predicted)
        fp8_held[rows.kind] = fp8_held_out(rows, device=device)
    return fp8_parameters, fp8_held


def _record_first_party(
    record: _FitRecord, rows: OperatorRows, device: HardwareSpec, efficiency: float, overhead: float
) -> None:
    """The first-party fp8 input and its residuals in the fit record."""
    predicted = gemm_seconds(
        rows, device=device, matmul_efficiency=efficiency, overhead_s=overhead, dtype="fp8"
    )
    record.inputs.append(
        {
            "kind": "gemm",
            "dtype": "fp8",
            "source": "first-party: benchmarks/fp8_gemm_check.py on an NVIDIA H200 (fp8/bf16 "
            "speed-up per shape, on the bf16 fit's scale), fitted with the table, equal weight",
            "tables": list(rows.tables),
            "points": rows.count,
        }
    )
    record.residuals[rows.kind] = _residual_summary(predicted, rows.seconds)


#: The fit method, as the record states it.
_FIT_METHOD = (
    "least squares on log(predicted/measured) of single operators (Nelder-Mead): "
    "GEMMs fix the matmul efficiency and the per-kernel cost, attention then its forward "
    "efficiency, the fp8 GEMM tables (per-tensor/row scaled, block-scaled) each their fp8 "
    "efficiency and per-kernel cost (held_out: by weight shape, 5 folds); the all-reduce, "
    "all-gather and reduce-scatter rows the collective efficiency and fixed cost per call; "
    "the all-to-all rows (groups of 4 or more) their own efficiency and fixed cost per call"
)


def _fit_document(
    record: _FitRecord,
    *,
    hardware: OperatorHardware,
    parameters: dict[str, float],
    fp8_held: dict[str, Any],
) -> dict[str, Any]:
    """The fit record of one hardware: method, inputs, range, parameters and residuals."""
    record.inputs.append(
        {
            "kind": "attention_backward_ratio",
            "source": "FlashAttention-2 (Dao 2023, arXiv:2307.08691) sec. 1 and 4.1: up to 73% of "
            "the A100 peak forward, 63% backward",
            "tables": [],
            "points": 2,
        }
    )
    fit = {
        "method": _FIT_METHOD,
        "fit_on": "operator measurements only",
        "preset": hardware.preset,
        "inputs": record.inputs,
        "training_range": dict(
            TRAINING_RANGE,
            collective_min_bytes=MIN_COLLECTIVE_BYTES,
            fp8_gemm_min_flops=FP8_MIN_FLOPS,
        ),
        "parameters": parameters,
        "assumptions": [
            "the FlashAttention-2 backward/forward peak ratio measured on A100 holds on "
            f"{hardware.key}",
            "intra-node NCCL efficiency applies to inter-node collectives",
        ],
        "residuals": record.residuals,
    }
    if fp8_held:
        fit["held_out"] = fp8_held
    return fit


def calibrate_hardware(root: Path, hardware: OperatorHardware) -> Calibration:
    """The operator-fitted calibration of ``hardware`` with its fit record (inputs, residuals)."""
    from topology import get_preset

    cluster = get_preset(hardware.preset)
    device = cluster.device
    gemm, attention, nccl = (
        gemm_rows(root, hardware),
        attention_rows(root, hardware),
        nccl_rows(root, hardware),
    )
    kernels = fit_kernels(gemm, attention, device=device)
    e_mm, e_fwd, overhead = (
        kernels["matmul_efficiency"],
        kernels["attention_forward_efficiency"],
        kernels["overhead_s"],
    )
    record = _FitRecord()
    _record_kernels(record, gemm=gemm, attention=attention, device=device, kernels=kernels)
    collective, collective_overhead = _fit_collectives(record, nccl=nccl, cluster=cluster)
    a2a_efficiency, a2a_overhead = _fit_all_to_all(record, nccl=nccl, cluster=cluster)
    a2a_parameters: dict[str, float] = {}
    if a2a_efficiency is not None:
        a2a_parameters = {
            "all_to_all_efficiency": round(a2a_efficiency, 4),
            "all_to_all_overhead_s": round(a2a_overhead, 9),
        }
    fp8_parameters, fp8_held = _fit_fp8_gemms(
        record, root=root, hardware=hardware, device=device, bf16=(e_mm, overhead)
    )
    attention_efficiency = training_attention_efficiency(e_fwd)
    parameters = {
        "matmul_efficiency": round(e_mm, 4),
        "attention_forward_efficiency": round(e_fwd, 4),
        "attention_efficiency": round(attention_efficiency, 4),
        "kernel_overhead_s": round(overhead, 9),
        "collective_efficiency": round(collective, 4),
        "collective_overhead_s": round(collective_overhead, 9),
        **a2a_parameters,
        **fp8_parameters,
    }
    fit = _fit_document(record, hardware=hardware, parameters=parameters, fp8_held=fp8_held)
    return Calibration(
        device_pattern=hardware.device_pattern,
        matmul_efficiency=_inside("matmul_efficiency", e_mm),
        attention_efficiency=_inside("attention_efficiency", attention_efficiency),
        kernel_overhead_s=_inside("kernel_overhead_s", overhead),
        collective_efficiency=_inside("collective_efficiency", collective),
        collective_overhead_s=_inside("collective_overhead_s", collective_overhead),
        all_to_all_efficiency=(
            None if a2a_efficiency is None else _inside("all_to_all_efficiency", a2a_efficiency)
        ),
        all_to_all_overhead_s=_inside("all_to_all_overhead_s", a2a_overhead),
        fit=fit,
    )


#: Fitted parameters of a shipped entry (``Calibration`` field names).
FITTED_FIELDS: tuple[str, ...] = (
    "matmul_efficiency",
    "attention_efficiency",
    "kernel_overhead_s",
    "collective_efficiency",
    "collective_overhead_s",
    "all_to_all_efficiency",
    "all_to_all_overhead_s",
)


def at_bound(calibration: Calibration, *, tolerance: float = 1e-6) -> list[str]:
    """The fitted fields of ``calibration`` (and the fp8 GEMM efficiencies of its fit record)
    that sit at (or within ``tolerance`` of) a bound."""
    hits = []
    parameters = calibration.fit.get("parameters", {})
    values = {name: getattr(calibration, name) for name in FITTED_FIELDS}
    if calibration.all_to_all_efficiency is None:  # no all-to-all fit: neither of its two
        values.pop("all_to_all_efficiency")
        values.pop("all_to_all_overhead_s")
    values.update({n: parameters[n] for n in BOUNDS if n.startswith("fp8") and n in parameters})
    for name, value in values.items():
        low, high = BOUNDS[name]
        span = high - low
        if value is None or value - low <= tolerance * span or high - value <= tolerance * span:
            hits.append(name)
    return hits


def calibrate_all(root: Path, keys: Sequence[str] | None = None) -> list[Calibration]:
    return [calibrate_hardware(root, h) for h in HARDWARE if keys is None or h.key in keys]
