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
  at least ``FP8_MIN_FLOPS``, the size of a training step's fp8 GEMMs; recorded in the fit's
  ``parameters`` (``fp8_matmul_efficiency``, ``fp8_kernel_overhead_s``, ``fp8_block_...``), with
  residuals per decade of FLOPs and a held-out error (folds of weight shapes). ``_precision``
  prices fp8 GEMMs with them, not with the bf16 efficiency at the doubled peak. A100 has no fp8
  tensor cores and no fp8 fit; devices without tables (MI300X) have none either.
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

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cost_model._options import Calibration
from cost_model._pricing import op_time_s

PACKAGE = "aiconfigurator-core 0.12.0 (PyPI, Apache-2.0)"
FORBIDDEN_FILE = "silicon_sample"


@dataclass(frozen=True)
class OperatorHardware:
    """One calibrated hardware type: its aiconfigurator folder, the preset that prices it and the
    regex of the device names the calibration applies to (first match wins: GB200 before B200)."""

    key: str
    folder: str
    preset: str
    device_pattern: str


HARDWARE: tuple[OperatorHardware, ...] = (
    OperatorHardware("A100", "a100_sxm", "dgx-a100", "A100"),
    # The H800 is the H100 SXM's export variant: same SMs, clocks and HBM3 (NVIDIA H800 datasheet).
    OperatorHardware("H100", "h100_sxm", "dgx-h100", "H100|H800"),
    OperatorHardware("H200", "h200_sxm", "dgx-h200", "H200"),
    OperatorHardware("GB300", "gb300", "gb300-nvl72", "GB300"),
    OperatorHardware("GB200", "gb200", "gb200-nvl72", "GB200"),
    OperatorHardware("B200", "b200_sxm", "dgx-b200", "NVIDIA B200"),
)
ENGINES = ("trtllm", "sglang", "vllm")
#: Shapes a training micro-batch runs: at least 1024 tokens (rows) and widths of at least 1024
#: (every published run's tokens per micro-batch and hidden / tp); attention over sequences of
#: at least 1024 tokens with 64-128-wide heads.
TRAINING_RANGE = {"gemm_min_rows": 1024, "gemm_min_width": 1024, "attention_min_sequence": 1024}
#: Collectives of at least this many bytes (the bandwidth regime that training traffic is in).
MIN_COLLECTIVE_BYTES = 1 << 20
#: All-to-alls of groups of at least this many ranks fit the all-to-all's own parameters.
ALL_TO_ALL_MIN_GPUS = 4
#: FlashAttention-2 on A100: up to 73% of peak forward, 63% backward (arXiv:2307.08691, sec. 1).
FA2_FORWARD_PEAK_FRACTION = 0.73
FA2_BACKWARD_PEAK_FRACTION = 0.63
#: Backward FLOPs of fused attention over its forward (FlashAttention-2 sec. 3.1: 5 matmuls vs 2).
ATTENTION_BACKWARD_FLOPS = 2.5
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
#: Folds of the held-out check of an fp8 fit: the shapes grouped by weight (n, k).
FP8_HELD_OUT_FOLDS = 5
NCCL_OPS = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "alltoall": "all_to_all",
}
NCCL_DTYPE_BYTES = {"half": 2.0, "int8": 1.0}


# ---------------------------------------------------------------------------- reading the tables
def _read(path: Path) -> list[dict]:
    if FORBIDDEN_FILE in path.name:
        raise ValueError(
            f"file ({path.name}) holds end-to-end runs: validation data, never fit input"
        )
    from pyarrow import parquet  # type: ignore[import-untyped]

    return parquet.read_table(path).to_pylist()


def _version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else -1 for p in re.split(r"[.a-z]+", version) if p)


def _newest(folder: Path, name: str) -> Path | None:
    versions = sorted(
        (p for p in folder.glob("*") if (p / name).exists()), key=lambda p: _version_key(p.name)
    )
    return versions[-1] / name if versions else None


def _tables(root: Path, hardware: OperatorHardware, op: str, name: str) -> list[Path]:
    """The newest table of each engine for ``op`` (``comm/nccl``: the newest NCCL version)."""
    base = root / "systems" / "data" / hardware.folder
    if op == "nccl":
        found = _newest(base / "comm" / "nccl", name)
        return [found] if found else []
    return [p for p in (_newest(base / op / engine, name) for engine in ENGINES) if p]


def _relative(path: Path, root: Path) -> str:
    return str(path.relative_to(root))


@dataclass(frozen=True)
class OperatorRows:
    """Measured points of one operator class and the tables they came from."""

    kind: str  # gemm, attention, nccl
    columns: dict[str, np.ndarray]
    seconds: np.ndarray
    tables: tuple[str, ...]

    @property
    def count(self) -> int:
        return int(self.seconds.size)


def gemm_rows(root: Path, hardware: OperatorHardware, dtype: str = "bfloat16") -> OperatorRows:
    """GEMMs of the table's ``dtype`` (``bfloat16``, ``fp8``, ``fp8_block``) in
    ``TRAINING_RANGE``: the fastest engine's latency per (m, n, k)."""
    paths = _tables(root, hardware, "gemm", "gemm_perf.parquet")
    best: dict[tuple[int, int, int], float] = {}
    for path in paths:
        for row in _read(path):
            m, n, k = int(row["m"]), int(row["n"]), int(row["k"])
            if (
                row["gemm_dtype"] != dtype
                or m < TRAINING_RANGE["gemm_min_rows"]
                or min(n, k) < TRAINING_RANGE["gemm_min_width"]
            ):
                continue
            best[(m, n, k)] = min(best.get((m, n, k), math.inf), float(row["latency"]) * 1e-3)
    keys = sorted(best)
    shape = np.array(keys, dtype=np.float64).reshape(-1, 3)
    return OperatorRows(
        "gemm" if dtype == "bfloat16" else f"gemm_{dtype}",
        {"m": shape[:, 0], "n": shape[:, 1], "k": shape[:, 2]},
        np.array([best[key] for key in keys]),
        tuple(_relative(p, root) for p in paths),
    )


def attention_rows(root: Path, hardware: OperatorHardware) -> OperatorRows:
    """Causal bf16 prefill attention (no window) over sequences in ``TRAINING_RANGE``."""
    paths = _tables(root, hardware, "attention", "context_attention_perf.parquet")
    best: dict[tuple[int, ...], float] = {}
    for path in paths:
        for row in _read(path):
            if (
                row["attn_dtype"] != "bfloat16"
                or row["kv_cache_dtype"] != "bfloat16"
                or int(row.get("window_size", 0) or 0) != 0
                or int(row["isl"]) < TRAINING_RANGE["attention_min_sequence"]
                or int(row["head_dim"]) not in (64, 128)
            ):
                continue
            key = (
                int(row["batch_size"]),
                int(row["isl"]),
                int(row["num_heads"]),
                int(row["num_key_value_heads"]),
                int(row["head_dim"]),
            )
            best[key] = min(best.get(key, math.inf), float(row["latency"]) * 1e-3)
    keys = sorted(best)
    values = np.array(keys, dtype=np.float64).reshape(-1, 5)
    names = ("batch", "sequence", "heads", "kv_heads", "head_dim")
    return OperatorRows(
        "attention",
        {name: values[:, i] for i, name in enumerate(names)},
        np.array([best[key] for key in keys]),
        tuple(_relative(p, root) for p in paths),
    )


def nccl_rows(root: Path, hardware: OperatorHardware) -> OperatorRows:
    """NCCL collectives within one node, messages of at least ``MIN_COLLECTIVE_BYTES``."""
    paths = _tables(root, hardware, "nccl", "nccl_perf.parquet")
    ops, gpus, sizes, seconds = [], [], [], []
    for path in paths:
        for row in _read(path):
            nbytes = float(row["message_size"]) * NCCL_DTYPE_BYTES.get(row["nccl_dtype"], 0.0)
            if row["op_name"] not in NCCL_OPS or nbytes < MIN_COLLECTIVE_BYTES:
                continue
            ops.append(NCCL_OPS[row["op_name"]])
            gpus.append(float(row["num_gpus"]))
            sizes.append(nbytes)
            seconds.append(float(row["latency"]) * 1e-3)
    return OperatorRows(
        "nccl",
        {"op": np.array(ops), "gpus": np.array(gpus), "bytes": np.array(sizes)},
        np.array(seconds),
        tuple(_relative(p, root) for p in paths),
    )


# ---------------------------------------------------------------------------- the cost model's own pricing
def gemm_seconds(
    rows: OperatorRows,
    *,
    device,
    matmul_efficiency: float,
    overhead_s: float,
    dtype: str = "bf16",
):
    """One GEMM as the training model prices it: ``op_time_s`` plus the per-kernel cost. In
    ``fp8`` the two operands are read in 1 byte and the output written in bf16 (the scaled fp8
    GEMMs of the tables return bf16)."""
    m, n, k = rows.columns["m"], rows.columns["n"], rows.columns["k"]
    calibration = Calibration(matmul_efficiency=matmul_efficiency)
    operand_bytes = 1.0 if dtype == "fp8" else 2.0
    seconds = op_time_s(
        flops=2.0 * m * n * k,
        bytes_moved=operand_bytes * (m * k + k * n) + 2.0 * m * n,
        hardware=device,
        dtype=dtype,
        calibration=calibration,
    )
    return seconds + overhead_s


def attention_seconds(rows: OperatorRows, *, device, forward_efficiency: float, overhead_s: float):
    """One fused causal attention forward as ``core_attention_time`` prices it."""
    c = rows.columns
    tokens = c["batch"] * c["sequence"]
    per_key = 2.0 * c["heads"] * 2.0 * c["head_dim"]
    attended = (c["sequence"] + 1.0) / 2.0
    io_bytes = tokens * c["heads"] * 2.0 * 2.0 * c["head_dim"] * 2.0
    calibration = Calibration(attention_efficiency=forward_efficiency)
    seconds = op_time_s(
        flops=tokens * per_key * attended,
        bytes_moved=io_bytes,
        hardware=device,
        dtype="bf16",
        calibration=calibration,
        calls=c["batch"] * c["heads"],
        kind="attention",
    )
    return seconds + overhead_s


def nccl_seconds(
    rows: OperatorRows, *, cluster, collective_efficiency: float, overhead_s: float = 0.0
) -> np.ndarray:
    """``Cluster.collective_time`` of each measured call, over the collective efficiency, plus
    a fixed cost per call (the all-to-all's, ``_pricing.collective_time_s``)."""
    c = rows.columns
    out = np.empty(rows.count)
    for op in np.unique(c["op"]):
        where = c["op"] == op
        out[where] = cluster.collective_time(
            str(op),
            group_size=c["gpus"][where],
            ranks_per_node=c["gpus"][where],
            message_bytes=c["bytes"][where],
        )
    return out / collective_efficiency + overhead_s


def training_attention_efficiency(forward_efficiency: float) -> float:
    """The single efficiency of forward + backward (see the module docstring)."""
    backward = forward_efficiency * FA2_BACKWARD_PEAK_FRACTION / FA2_FORWARD_PEAK_FRACTION
    passes = 1.0 + ATTENTION_BACKWARD_FLOPS
    return passes / (1.0 / forward_efficiency + ATTENTION_BACKWARD_FLOPS / backward)


# ---------------------------------------------------------------------------- fitting
def _residual_summary(predicted: np.ndarray, measured: np.ndarray) -> dict[str, Any]:
    errors = predicted / measured - 1.0
    logs = np.log(predicted / measured)
    return {
        "points": int(measured.size),
        "rms_log_error": round(float(np.sqrt(np.mean(logs**2))), 4),
        "mean_abs_error": round(float(np.mean(np.abs(errors))), 4),
        "max_abs_error": round(float(np.max(np.abs(errors))), 4),
        "mean_error": round(float(np.mean(errors)), 4),
    }


def nelder_mead(
    loss: Callable[[np.ndarray], float], start: np.ndarray, *, max_evaluations: int = 600
) -> np.ndarray:
    """Nelder-Mead simplex minimization (Nelder & Mead, Computer Journal 1965), standard
    coefficients (reflection 1, expansion 2, contraction 0.5, shrink 0.5)."""
    simplex = [start] + [
        start + np.eye(len(start))[i] * 0.1 * max(abs(start[i]), 0.1) for i in range(len(start))
    ]
    values = [loss(point) for point in simplex]
    evaluations = len(values)
    while evaluations < max_evaluations and np.ptp(values) > 1e-12:
        order = np.argsort(values)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        value = loss(reflected)
        evaluations += 1
        if value < values[0]:
            expanded = centroid + 2.0 * (centroid - simplex[-1])
            expanded_value = loss(expanded)
            evaluations += 1
            simplex[-1], values[-1] = (
                (expanded, expanded_value) if expanded_value < value else (reflected, value)
            )
        elif value < values[-2]:
            simplex[-1], values[-1] = reflected, value
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            contracted_value = loss(contracted)
            evaluations += 1
            if contracted_value < values[-1]:
                simplex[-1], values[-1] = contracted, contracted_value
            else:
                simplex = [simplex[0] + 0.5 * (point - simplex[0]) for point in simplex]
                values = [values[0]] + [loss(point) for point in simplex[1:]]
                evaluations += len(simplex) - 1
    return simplex[int(np.argmin(values))]


def _inside(name: str, value: float) -> float:
    low, high = BOUNDS[name]
    return float(min(max(value, low), high))


def fit_kernels(gemm: OperatorRows, attention: OperatorRows, *, device) -> dict[str, float]:
    """(matmul efficiency, attention forward efficiency, per-kernel seconds). The GEMM rows fix
    the matmul efficiency and the fixed cost of a kernel (mean squared log-error); the attention
    rows then fix the attention forward efficiency with that fixed cost. Efficiencies are fitted
    as logits, the fixed cost as log-seconds: no clipping inside the fit."""

    def sigmoid(x: float) -> float:
        return 1.0 / (1.0 + math.exp(-x))

    def gemm_loss(x: np.ndarray) -> float:
        p = gemm_seconds(
            gemm, device=device, matmul_efficiency=sigmoid(x[0]), overhead_s=1e-6 * math.exp(x[1])
        )
        return float(np.mean(np.log(p / gemm.seconds) ** 2))

    best = nelder_mead(gemm_loss, np.array([math.log(0.75 / 0.25), math.log(3.0)]))
    best = nelder_mead(
        gemm_loss, best
    )  # a restart from the optimum: the simplex may have collapsed
    e_mm, overhead = sigmoid(best[0]), 1e-6 * math.exp(best[1])

    def attention_loss(x: np.ndarray) -> float:
        p = attention_seconds(
            attention, device=device, forward_efficiency=sigmoid(x[0]), overhead_s=overhead
        )
        return float(np.mean(np.log(p / attention.seconds) ** 2))

    e_fwd = sigmoid(nelder_mead(attention_loss, np.array([0.0]))[0]) if attention.count else 0.5
    return {
        "matmul_efficiency": e_mm,
        "attention_forward_efficiency": e_fwd,
        "overhead_s": overhead,
    }


def _logit(value: float) -> float:
    return math.log(value / (1.0 - value))


def fit_fp8_gemm(rows: OperatorRows, *, device) -> tuple[float, float]:
    """(efficiency as a fraction of the fp8 peak, per-kernel seconds) of the fp8 GEMMs of
    ``rows``: least squares on log(predicted / measured), the efficiency fitted as a logit and
    the fixed cost as log-seconds, as the bf16 fit."""

    def loss(x: np.ndarray) -> float:
        p = gemm_seconds(
            rows,
            device=device,
            matmul_efficiency=1.0 / (1.0 + math.exp(-x[0])),
            overhead_s=1e-6 * math.exp(x[1]),
            dtype="fp8",
        )
        return float(np.mean(np.log(p / rows.seconds) ** 2))

    best = nelder_mead(loss, np.array([_logit(0.6), math.log(5.0)]))
    best = nelder_mead(loss, best)
    return 1.0 / (1.0 + math.exp(-best[0])), 1e-6 * math.exp(best[1])


def _error_by_flops(rows: OperatorRows, predicted: np.ndarray) -> dict[str, float]:
    """Mean predicted/measured - 1 per decade of FLOPs per call (the size trend one efficiency
    and one fixed cost leave)."""
    flops = 2.0 * rows.columns["m"] * rows.columns["n"] * rows.columns["k"]
    decade = np.floor(np.log10(flops))
    return {
        f"1e{int(d)}": round(
            float(np.mean(predicted[decade == d] / rows.seconds[decade == d] - 1.0)), 4
        )
        for d in np.unique(decade)
    }


def _subset(rows: OperatorRows, where: np.ndarray) -> OperatorRows:
    return OperatorRows(
        rows.kind,
        {name: values[where] for name, values in rows.columns.items()},
        rows.seconds[where],
        rows.tables,
    )


def fp8_held_out(rows: OperatorRows, *, device) -> dict[str, Any]:
    """Held-out residuals of the fp8 fit: the shapes grouped by their weight (n, k), each fold of
    weights predicted with the efficiency fitted on the other folds."""
    weights = sorted({(n, k) for n, k in zip(rows.columns["n"], rows.columns["k"])})
    fold_of = {weight: i % FP8_HELD_OUT_FOLDS for i, weight in enumerate(weights)}
    folds = np.array([fold_of[(n, k)] for n, k in zip(rows.columns["n"], rows.columns["k"])])
    predicted = np.empty(rows.count)
    efficiencies = []
    for fold in range(FP8_HELD_OUT_FOLDS):
        test = folds == fold
        if not test.any():
            continue
        efficiency, overhead_s = fit_fp8_gemm(_subset(rows, ~test), device=device)
        efficiencies.append(efficiency)
        predicted[test] = gemm_seconds(
            _subset(rows, test),
            device=device,
            matmul_efficiency=efficiency,
            overhead_s=overhead_s,
            dtype="fp8",
        )
    summary = _residual_summary(predicted, rows.seconds)
    summary["folds"] = FP8_HELD_OUT_FOLDS
    summary["fold_efficiency_range"] = [round(min(efficiencies), 4), round(max(efficiencies), 4)]
    return summary


def collective_rows(nccl: OperatorRows) -> OperatorRows:
    """The all-reduce, all-gather and reduce-scatter rows (the all-to-all has its own fit)."""
    return _subset(nccl, nccl.columns["op"] != "all_to_all")


def fit_rate_and_overhead(modelled: np.ndarray, measured: np.ndarray) -> tuple[float, float]:
    """(efficiency, fixed seconds per call) minimising the squared log error of
    ``modelled / efficiency + fixed`` against ``measured``: the efficiency fitted as a logit and
    the fixed cost as log-seconds, as the GEMM fit (Nelder-Mead, restarted at its optimum)."""

    def loss(x: np.ndarray) -> float:
        predicted = modelled * (1.0 + math.exp(-x[0])) + 1e-6 * math.exp(x[1])
        return float(np.mean(np.log(predicted / measured) ** 2))

    best = nelder_mead(loss, np.array([_logit(0.6), math.log(5.0)]))
    best = nelder_mead(loss, best)  # a restart from the optimum: the simplex may have collapsed
    return 1.0 / (1.0 + math.exp(-best[0])), 1e-6 * math.exp(best[1])


def fit_collectives(rows: OperatorRows, *, cluster) -> tuple[float, float]:
    """(collective efficiency, fixed seconds per call) of the all-reduce, all-gather and
    reduce-scatter rows (``collective_rows``)."""
    modelled = nccl_seconds(rows, cluster=cluster, collective_efficiency=1.0)
    return fit_rate_and_overhead(modelled, rows.seconds)


def all_to_all_rows(nccl: OperatorRows) -> OperatorRows:
    """The all-to-all rows of groups of at least ``ALL_TO_ALL_MIN_GPUS`` ranks."""
    c = nccl.columns
    return _subset(nccl, (c["op"] == "all_to_all") & (c["gpus"] >= ALL_TO_ALL_MIN_GPUS))


def fit_all_to_all(rows: OperatorRows, *, cluster) -> tuple[float, float]:
    """(all-to-all efficiency, fixed seconds per call): ``fit_rate_and_overhead`` on the
    all-to-all rows."""
    modelled = nccl_seconds(rows, cluster=cluster, collective_efficiency=1.0)
    return fit_rate_and_overhead(modelled, rows.seconds)


def _error_by(rows: OperatorRows, predicted: np.ndarray, key: np.ndarray, label) -> dict:
    return {
        label(k): round(float(np.mean(predicted[key == k] / rows.seconds[key == k] - 1.0)), 4)
        for k in np.unique(key)
    }


def collective_residuals(rows: OperatorRows, predicted: np.ndarray) -> dict[str, Any]:
    """Residuals of a collective fit, with the mean error per group size (messages of at
    least 64 MiB) and per factor of 8 in message bytes from 1 MiB."""
    summary = _residual_summary(predicted, rows.seconds)
    large = rows.columns["bytes"] >= 64 * MIN_COLLECTIVE_BYTES
    summary["mean_error_by_gpus_from_64MiB"] = _error_by(
        _subset(rows, large), predicted[large], rows.columns["gpus"][large], lambda k: str(int(k))
    )
    band = np.floor(np.log2(rows.columns["bytes"] / MIN_COLLECTIVE_BYTES) / 3.0)
    summary["mean_error_by_size"] = _error_by(rows, predicted, band, lambda k: f"{int(8**k)}MiB")
    return summary


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
    collectives = collective_rows(nccl)
    collective, collective_overhead = (
        fit_collectives(collectives, cluster=cluster) if collectives.count else (1.0, 0.0)
    )
    all_to_all = all_to_all_rows(nccl)
    a2a_efficiency, a2a_overhead = (
        fit_all_to_all(all_to_all, cluster=cluster) if all_to_all.count else (None, 0.0)
    )
    inputs = []
    residuals: dict[str, Any] = {}
    for rows, predicted in (
        (gemm, gemm_seconds(gemm, device=device, matmul_efficiency=e_mm, overhead_s=overhead)),
        (
            attention,
            attention_seconds(
                attention, device=device, forward_efficiency=e_fwd, overhead_s=overhead
            ),
        ),
    ):
        if not rows.count:
            continue
        inputs.append(
            {
                "kind": rows.kind,
                "source": PACKAGE,
                "tables": list(rows.tables),
                "points": rows.count,
            }
        )
        residuals[rows.kind] = _residual_summary(predicted, rows.seconds)
    if collectives.count:
        inputs.append(
            {
                "kind": "nccl",
                "op": ["all_reduce", "all_gather", "reduce_scatter"],
                "source": PACKAGE,
                "tables": list(collectives.tables),
                "points": collectives.count,
            }
        )
        residuals["nccl"] = collective_residuals(
            collectives,
            nccl_seconds(
                collectives,
                cluster=cluster,
                collective_efficiency=collective,
                overhead_s=collective_overhead,
            ),
        )
    a2a_parameters: dict[str, float] = {}
    if a2a_efficiency is not None:
        a2a_parameters = {
            "all_to_all_efficiency": round(a2a_efficiency, 4),
            "all_to_all_overhead_s": round(a2a_overhead, 9),
        }
        inputs.append(
            {
                "kind": "nccl",
                "op": "all_to_all",
                "min_gpus": ALL_TO_ALL_MIN_GPUS,
                "source": PACKAGE,
                "tables": list(all_to_all.tables),
                "points": all_to_all.count,
            }
        )
        residuals["nccl_all_to_all"] = collective_residuals(
            all_to_all,
            nccl_seconds(
                all_to_all,
                cluster=cluster,
                collective_efficiency=a2a_efficiency,
                overhead_s=a2a_overhead,
            ),
        )
    fp8_parameters: dict[str, float] = {}
    fp8_held: dict[str, Any] = {}
    if "fp8" in device.peak_flops:
        for table_dtype, name in FP8_GEMM_DTYPES.items():
            rows = gemm_rows(root, hardware, table_dtype)
            flops = 2.0 * rows.columns["m"] * rows.columns["n"] * rows.columns["k"]
            rows = _subset(rows, flops >= FP8_MIN_FLOPS)
            if not rows.count:
                continue
            efficiency, fp8_overhead = fit_fp8_gemm(rows, device=device)
            fp8_parameters[f"{name}_matmul_efficiency"] = round(efficiency, 4)
            fp8_parameters[f"{name}_kernel_overhead_s"] = round(fp8_overhead, 9)
            predicted = gemm_seconds(
                rows,
                device=device,
                matmul_efficiency=efficiency,
                overhead_s=fp8_overhead,
                dtype="fp8",
            )
            inputs.append(
                {
                    "kind": "gemm",
                    "dtype": table_dtype,
                    "source": PACKAGE,
                    "tables": list(rows.tables),
                    "points": rows.count,
                }
            )
            residuals[rows.kind] = _residual_summary(predicted, rows.seconds)
            residuals[rows.kind]["mean_error_by_flops"] = _error_by_flops(rows, predicted)
            fp8_held[rows.kind] = fp8_held_out(rows, device=device)
    attention_efficiency = training_attention_efficiency(e_fwd)
    inputs.append(
        {
            "kind": "attention_backward_ratio",
            "source": "FlashAttention-2 (Dao 2023, arXiv:2307.08691) sec. 1 and 4.1: up to 73% of "
            "the A100 peak forward, 63% backward",
            "tables": [],
            "points": 2,
        }
    )
    fit = {
        "method": "least squares on log(predicted/measured) of single operators (Nelder-Mead): "
        "GEMMs fix the matmul efficiency and the per-kernel cost, attention then its forward "
        "efficiency, the fp8 GEMM tables (per-tensor/row scaled, block-scaled) each their fp8 "
        "efficiency and per-kernel cost (held_out: by weight shape, 5 folds); the all-reduce, "
        "all-gather and reduce-scatter rows the collective efficiency and fixed cost per call; "
        "the all-to-all rows (groups of 4 or more) their own efficiency and fixed cost per call",
        "fit_on": "operator measurements only",
        "preset": hardware.preset,
        "inputs": inputs,
        "training_range": dict(
            TRAINING_RANGE,
            collective_min_bytes=MIN_COLLECTIVE_BYTES,
            fp8_gemm_min_flops=FP8_MIN_FLOPS,
        ),
        "parameters": {
            "matmul_efficiency": round(e_mm, 4),
            "attention_forward_efficiency": round(e_fwd, 4),
            "attention_efficiency": round(attention_efficiency, 4),
            "kernel_overhead_s": round(overhead, 9),
            "collective_efficiency": round(collective, 4),
            "collective_overhead_s": round(collective_overhead, 9),
            **a2a_parameters,
            **fp8_parameters,
        },
        "assumptions": [
            "the FlashAttention-2 backward/forward peak ratio measured on A100 holds on "
            f"{hardware.key}",
            "intra-node NCCL efficiency applies to inter-node collectives",
        ],
        "residuals": residuals,
    }
    if fp8_held:
        fit["held_out"] = fp8_held
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
