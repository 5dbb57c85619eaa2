"""Grouped expert GEMM curves: routed experts at their measured efficiency by tokens per expert.

A serving layer's routed experts run as grouped GEMMs whose M is the tokens each expert gets —
a few to a few hundred — not one matmul over all of a rank's tokens. Their efficiency is a
measured curve: ``ideal time / measured latency`` as a function of tokens per expert, experts per
device and weight dtype, where the ideal time is the cost model's own for the same work
(``grouped_gemm_ideal_s``: the roofline of the expert FFNs' FLOPs and weight bytes, plus the
permute / activation / un-permute memory passes that the fused MoE kernel also runs,
``_inference_ops.routed_bytes_per_assignment``).

The curves live in ``cost_model/data/kernel_curves.json``, written by
``autoparallel profile --import-aiconfigurator`` from NVIDIA's aiconfigurator-core operator
tables (Apache-2.0; every curve names its file and its expert shape), each point priced as the
work its collector's routing made on the timed rank: the SGLang and vLLM tables of DeepSeek-V3's
experts and TensorRT-LLM's min-latency kernel route their balanced logits through DeepSeek-V3's
group-limited gate, which reads half of the experts and piles four of them with every token
(``autoparallel._kernel_import_moe_routing``). Grouped-GEMM curves are
measured on several expert shapes (DeepSeek-V3's 7168 x 2048, Qwen3-235B's 4096 x 1536,
Mixtral-8x7B's 4096 x 14336, Kimi-K2's 384 experts of DeepSeek-V3's size, and the 7168 x 256
and 4096 x 192 slices of DeepSeek-V3's, Kimi-K2's and Qwen3-235B's experts over 8 tensor-parallel
ranks); a model is priced on the shape nearest the slice one rank runs in log(weight elements per
expert matrix), of two with that slice on the one measured nearest its expert count, since at a
few tokens per expert the fused layer's fixed routing, permute and ramp weigh against the bytes
each expert streams. Where several engines measured
one device and dtype, the best efficiency at each point is used unless an ``engine`` is asked
for: the fastest kernel measured for that shape (TRT-LLM's CUTLASS grouped GEMM where the
Triton kernels of untuned configs fall behind), the one a deployment tuned for its shape runs.
A device or dtype without a curve returns ``None`` and the caller keeps its roofline pricing.

Interpolation: linear in log(tokens per expert) (clamped at the grid's ends) and in log(experts
per device) between measured counts.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from cost_model._kernel_curves import (
    DEVICE_ALIASES,
    _engine_curves,
    kernel_curves,
    matmul_dtype_on,
)
from cost_model._units import dtype_bytes

#: (hidden, expert FFN width, routed experts, top-k) of DeepSeek-V3's experts: the default shape
#: of a lookup and of a curve that names none.
GROUPED_GEMM_SHAPE = (7168, 2048, 256, 8)
#: Tokens per expert at which curves are stored: 1/32 .. 512 by powers of two.
TOKENS_PER_EXPERT_GRID = np.exp2(np.arange(-5.0, 10.0))
_LOG_TOKENS_GRID = np.log(TOKENS_PER_EXPERT_GRID)


def grouped_gemm_ideal_s(
    *,
    hardware,
    dtype: str,
    tokens_per_expert,
    experts_per_device,
    touched_fraction,
    side_bytes_per_assignment=0.0,
    hidden_size: int = GROUPED_GEMM_SHAPE[0],
    expert_ffn_size: int = GROUPED_GEMM_SHAPE[1],
) -> np.ndarray:
    """Roofline seconds of one device's grouped expert GEMMs (SwiGLU: 3 matrices per expert) plus
    their memory passes: max(FLOPs / peak, weight bytes / bandwidth) + side bytes / bandwidth."""
    assignments = np.asarray(tokens_per_expert, dtype=np.float64) * np.asarray(
        experts_per_device, dtype=np.float64
    )
    weights_per_expert = 3.0 * hidden_size * expert_ffn_size
    flops = 2.0 * weights_per_expert * assignments
    weight_bytes = (
        np.asarray(experts_per_device)
        * np.asarray(touched_fraction)
        * weights_per_expert
        * dtype_bytes(dtype)
    )
    bandwidth = hardware.memory_bandwidth_bytes_per_s
    compute_s = flops / hardware.peak_flops_for(matmul_dtype_on(hardware, dtype))
    side_s = np.asarray(side_bytes_per_assignment) * assignments / bandwidth
    return np.maximum(compute_s, weight_bytes / bandwidth) + side_s


def _curve_shape(curve: dict) -> tuple[int, ...]:
    """(hidden, expert FFN width one rank runs, ...) of a curve; DeepSeek-V3's where unnamed."""
    shape = curve.get("shape")
    return GROUPED_GEMM_SHAPE if shape is None else tuple(shape.values())


@lru_cache(maxsize=64)
def _grouped_tables(
    device_name: str, dtype: str, engine: str | None
) -> list[tuple[float, np.ndarray, np.ndarray]]:
    """Per measured expert shape: (log of its weight elements per expert matrix, log2 experts
    per device, efficiency [counts x grid]), the best over the chosen engines' curves."""
    device_name = DEVICE_ALIASES.get(device_name, device_name)
    matching = [
        c
        for c in kernel_curves()["grouped_gemm"]
        if c["device"] == device_name and c["dtype"] == dtype
    ]
    curves = _engine_curves(matching, engine)
    tables = []
    for shape in sorted({_curve_shape(c) for c in curves}):
        same = [c for c in curves if _curve_shape(c) == shape]
        counts = sorted({int(k) for c in same for k in c["experts_per_device"]})
        grid = np.array(
            [
                np.max(
                    [
                        c["experts_per_device"][str(n)]
                        for c in same
                        if str(n) in c["experts_per_device"]
                    ],
                    axis=0,
                )
                for n in counts
            ]
        )
        elements = np.log(float(shape[0]) * float(shape[1]))
        tables.append((elements, np.log2(np.array(counts, dtype=np.float64)), grid))
    return tables


def grouped_gemm_efficiency(
    *,
    device_name: str,
    dtype: str,
    tokens_per_expert,
    experts_per_device,
    expert_elements=None,
    engine: str | None = None,
) -> np.ndarray | None:
    """Measured efficiency of grouped expert GEMMs (see the module docstring), or None.

    ``expert_elements`` (hidden x expert FFN width, per row; default DeepSeek-V3's) picks the
    measured expert shape nearest in log scale: at a few tokens per expert the fused layer's
    fixed routing, permute and ramp weigh against the bytes each expert streams, so a small
    expert's efficiency would misprice a large one (Mixtral-8x22B at 1 token: 0.2-0.3 on
    DeepSeek's 7168 x 2048 experts, 0.5-0.6 on Mixtral-8x7B's 4096 x 14336 ones). Of shapes
    with the same slice, the one measured at the expert count nearest ``experts_per_device`` (in
    log scale): Kimi-K2's 384 experts per rank on its own table, not held at DeepSeek-V3's 256
    (SGLang's B200 NVFP4 fused MoE over 8-way expert TP, 1K tokens: 0.33 ms on Kimi-K2's 384
    experts, 0.23 ms on DeepSeek-V3's 256, which streams two thirds of the weights). ``engine``
    selects the serving engine's own kernels where its tables cover the device and dtype."""
    tables = _grouped_tables(device_name, dtype, engine)
    if not tables:
        return None
    log_tokens = np.log(
        np.maximum(np.atleast_1d(np.asarray(tokens_per_expert, dtype=np.float64)), 1e-9)
    )
    where = np.log2(np.maximum(np.asarray(experts_per_device, dtype=np.float64), 1e-9))
    target = np.log(
        np.asarray(
            expert_elements
            if expert_elements is not None
            else GROUPED_GEMM_SHAPE[0] * GROUPED_GEMM_SHAPE[1],
            dtype=np.float64,
        )
    )
    shape = np.broadcast_shapes(log_tokens.shape, where.shape, target.shape)
    nearest = _nearest_table(tables, target=target, where=np.broadcast_to(where, shape))
    log_tokens, where = np.broadcast_to(log_tokens, shape), np.broadcast_to(where, shape)
    if isinstance(nearest, int):  # one table for every row, found without a row-wise search
        return _table_efficiency(tables[nearest], log_tokens=log_tokens, where=where)
    picked = np.unique(nearest)
    if picked.size == 1:  # every row on one shape (the usual case: one model per table)
        return _table_efficiency(tables[int(picked[0])], log_tokens=log_tokens, where=where)
    result = np.zeros(shape)
    for index in picked:  # only the shapes some row is nearest to, each on its own rows
        mine = nearest == index
        result[mine] = _table_efficiency(
            tables[int(index)], log_tokens=log_tokens[mine], where=where[mine]
        )
    return result


def _nearest_table(tables, *, target: np.ndarray, where: np.ndarray) -> np.ndarray | int:
    """Index of the table each row is priced on: of the shapes nearest ``target`` (log
    elements), the one measured at the count nearest ``where`` (log2 experts per device). One
    index (an int) where every row has the same target and one table alone is nearest it (the
    usual case: one model per table), with ``where`` finite on every row."""
    if len(tables) == 1:
        return 0
    flat = np.ravel(target)
    if flat.size and bool(np.all(flat == flat[0])) and bool(np.isfinite(where).all()):
        # one target: the nearest shapes are the same on every row, only their counts differ
        gaps = [abs(float(flat[0]) - elements) for elements, _, _ in tables]
        nearest = [index for index, gap in enumerate(gaps) if gap == min(gaps)]
        if len(nearest) == 1:
            return nearest[0]
        counts = [_count_gap(where, tables[index][1]) for index in nearest]
        return np.asarray(nearest)[np.argmin(np.stack(counts), axis=0)]
    distance = [np.abs(target - elements) for elements, _, _ in tables]
    closest = np.minimum.reduce(distance) if len(distance) > 1 else distance[0]
    counts = []
    for (_, log_counts, _), gap in zip(tables, distance, strict=True):
        candidate = gap == closest
        counts.append(
            np.where(candidate, _count_gap(where, log_counts), np.inf)
            if np.any(candidate)
            else np.full(where.shape, np.inf)
        )
    return np.argmin(np.stack(counts), axis=0)


def _count_gap(where: np.ndarray, log_counts: np.ndarray) -> np.ndarray:
    """Distance from ``where`` to the nearest of ``log_counts`` (ascending): one of the two
    counts either side of it, since the rounded differences are monotonic along the grid."""
    if log_counts.size == 1:
        return np.abs(where - log_counts[0])
    upper = np.clip(np.searchsorted(log_counts, where), 1, log_counts.size - 1)
    return np.minimum(np.abs(where - log_counts[upper - 1]), np.abs(where - log_counts[upper]))


def _table_efficiency(table, *, log_tokens: np.ndarray, where: np.ndarray) -> np.ndarray:
    """One table's efficiency at each row: linear in log tokens along the two measured counts
    either side of ``where``, then linear between them (``_between_rows``), computed on those
    two counts only."""
    _, log_counts, grid = table
    if log_counts.size == 1:
        return _interp_rows(log_tokens, grid, np.zeros(log_tokens.shape, dtype=np.int64))
    index = np.clip(np.searchsorted(log_counts, where) - 1, 0, log_counts.size - 2)
    weight = np.clip(
        (where - log_counts[index]) / (log_counts[index + 1] - log_counts[index]), 0.0, 1.0
    )
    lower, upper = _interp_rows(log_tokens, grid, index), _interp_rows(log_tokens, grid, index + 1)
    return (1 - weight) * lower + weight * upper


def _interp_rows(x: np.ndarray, grid: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``np.interp(x, log(TOKENS_PER_EXPERT_GRID), grid[row])`` element by element with each
    element's own ``row``, by numpy's own arithmetic (``arr_interp``: the slope of the segment,
    the other end where that is NaN, the end values outside the grid)."""
    xp = _LOG_TOKENS_GRID
    slopes = (grid[:, 1:] - grid[:, :-1]) / (xp[1:] - xp[:-1])
    segment = np.clip(np.searchsorted(xp, x, side="right") - 1, 0, xp.size - 2)
    low, high = grid[rows, segment], grid[rows, segment + 1]
    slope = slopes[rows, segment]
    value = slope * (x - xp[segment]) + low
    if np.isnan(value).any():
        again = slope * (x - xp[segment + 1]) + high
        again = np.where(np.isnan(again) & (low == high), low, again)
        value = np.where(np.isnan(value), again, value)
    value = np.where(x == xp[segment], low, value)
    value = np.where(x <= xp[0], grid[rows, 0], value)
    value = np.where(x >= xp[-1], grid[rows, -1], value)
    return np.where(np.isnan(x), x, value)


def grouped_experts_time_s(
    *,
    hardware,
    dtype: str,
    tokens_per_expert,
    experts_per_device,
    touched_fraction,
    side_bytes_per_assignment,
    hidden_size: int,
    expert_ffn_size,
    engine: str | None = None,
) -> np.ndarray | None:
    """One device's routed experts as the grouped GEMMs that run: ``experts_per_device`` experts of
    M = ``tokens_per_expert`` each, the ideal time over the measured efficiency for that M, expert
    count and weight dtype; None where no curve covers the device and dtype."""
    efficiency = grouped_gemm_efficiency(
        device_name=hardware.name,
        dtype=dtype,
        tokens_per_expert=tokens_per_expert,
        experts_per_device=experts_per_device,
        expert_elements=hidden_size * np.asarray(expert_ffn_size, dtype=np.float64),
        engine=engine,
    )
    if efficiency is None:
        return None
    ideal = grouped_gemm_ideal_s(
        hardware=hardware,
        dtype=dtype,
        tokens_per_expert=tokens_per_expert,
        experts_per_device=experts_per_device,
        touched_fraction=touched_fraction,
        side_bytes_per_assignment=side_bytes_per_assignment,
        hidden_size=hidden_size,
        expert_ffn_size=expert_ffn_size,
    )
    return ideal / efficiency
