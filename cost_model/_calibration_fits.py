"""The cost model's own pricing of single operators and the fits of its calibration parameters.

Each measured operator is priced as the training model prices it: a GEMM with
``_pricing.op_time_s`` (the roofline of 2mnk FLOPs and the three operands' bytes) plus the fixed
per-kernel cost; fused causal attention as ``core_attention_time`` counts it (4·heads·head_dim
FLOPs per attended key, (s + 1)/2 keys per query under the causal mask); a collective with
``Cluster.collective_time`` of the hardware's preset over an efficiency, plus a fixed cost per
call (the Hockney alpha-beta form: R. W. Hockney, 'The communication challenge for MPP: Intel
Paragon and Meiko CS-2', Parallel Computing 20(3), 1994). Training runs the attention forward
and a backward of 2.5x its FLOPs (FlashAttention-2, Dao 2023, sec. 3.1) at less of the peak: up
to 63% against the forward's 73% on A100 (arXiv:2307.08691, sec. 1 and 4.1);
``training_attention_efficiency`` is the one efficiency giving the same forward + backward time.
The ratio holds on Hopper within a few percent: on one H200 (``benchmarks/attention_backward_check.py``,
``benchmarks/results/attention_h200.json``, causal bf16, 16 heads of 128, 2K-16K tokens) cuDNN's
fused attention's backward reaches 0.77-0.86 of its forward's rate and FlashAttention-2's
0.75-0.91, against 63/73 = 0.86.

Fit: least squares on log(predicted / measured) (Nelder-Mead; Nelder & Mead 1965), efficiencies
as logits and fixed costs as log-seconds, so no bound is active inside the fit. Residuals are
recorded per decade of FLOPs (fp8 GEMMs), per group size and per message size (collectives),
with a held-out error of the fp8 fits over folds of weight shapes. The choice of rows and of
which parameter each fixes is ``_calibration_operators``'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from cost_model._calibration_tables import MIN_COLLECTIVE_BYTES, OperatorRows, _subset
from cost_model._options import Calibration
from cost_model._pricing import op_time_s

#: FlashAttention-2 on A100: up to 73% of peak forward, 63% backward (arXiv:2307.08691, sec. 1).
FA2_FORWARD_PEAK_FRACTION = 0.73
FA2_BACKWARD_PEAK_FRACTION = 0.63
#: Backward FLOPs of fused attention over its forward (FlashAttention-2 sec. 3.1: 5 matmuls vs 2).
ATTENTION_BACKWARD_FLOPS = 2.5
#: Folds of the held-out check of an fp8 fit: the shapes grouped by weight (n, k).
FP8_HELD_OUT_FOLDS = 5
#: Bytes per activation element of the quantization each fp8 table point times before its GEMM
#: (a W8A8 call quantizes its input every call): read the bf16 activation, write its fp8 copy,
#: one fused pass, the least any table's call pays (aiconfigurator's SGLang collector times
#: ``sglang_per_token_group_quant_fp8`` + DeepGEMM per block-FP8 call; TensorRT-LLM's per-tensor
#: rows run the dynamic quantization, an amax pass more, ``collector/trtllm/collect_gemm.py``).
#: Training prices its own quantization kernels apart (``_precision.quantization_time_s``), so
#: the fp8 fit takes this pass out of the GEMM it fits.
FP8_TABLE_QUANTIZATION_BYTES = 3.0


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
    GEMMs of the tables return bf16), after the activation quantization the table's call times
    with it (``FP8_TABLE_QUANTIZATION_BYTES`` per input element, a memory-bound pass)."""
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
    if dtype == "fp8":
        seconds = seconds + op_time_s(
            flops=0.0,
            bytes_moved=FP8_TABLE_QUANTIZATION_BYTES * m * k,
            hardware=device,
            dtype="bf16",
            calibration=Calibration(),
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


def fit_fp8_gemm(rows: OperatorRows, *, device, weights=None) -> tuple[float, float]:
    """(efficiency as a fraction of the fp8 peak, per-kernel seconds) of the fp8 GEMMs of
    ``rows``: least squares on log(predicted / measured), the efficiency fitted as a logit and
    the fixed cost as log-seconds, as the bf16 fit; ``weights`` per row (e.g. equal weight per
    source where two sources are fitted together), uniform by default."""

    def loss(x: np.ndarray) -> float:
        p = gemm_seconds(
            rows,
            device=device,
            matmul_efficiency=1.0 / (1.0 + math.exp(-x[0])),
            overhead_s=1e-6 * math.exp(x[1]),
            dtype="fp8",
        )
        return float(np.average(np.log(p / rows.seconds) ** 2, weights=weights))

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
