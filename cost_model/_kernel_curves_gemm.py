"""Dense GEMM curves: projections, dense FFNs and shared experts at their measured efficiency.

Dense GEMMs (``gemm``: attention projections, dense FFN, shared experts) have curves by real
shape and weight scaling (FP8: block-scaled ``fp8``; per-tensor ``fp8_tensor`` with static
activation scales, TensorRT-LLM's table less its dynamic-scale step, ``gemm_curve_dtype``): efficiency (``gemm_ideal_s`` / measured latency, the fastest kernel the engine ships at
each point) on a grid of M (tokens in the call) x N x K (one rank's slice), trilinear in the logs
(``gemm_efficiency``); TP8 slices of DeepSeek-V3 run at 0.1-0.5 of FP8 peak where the training
calibration's one efficiency says 0.8. Prefill and decode price their dense GEMMs with them.
A table's point is the engine's whole W8A8 call: aiconfigurator's SGLang collector times the
per-token-group FP8 quantization of the activations and the DeepGEMM GEMM together, replayed in a
CUDA graph (``collector/sglang/collect_gemm.py``), so the activation cast the roofline leaves out
is in it. At decode's M they agree with DeepSeek's own kernel benchmarks (H800, DeepGEMM README
at commit a6d97a1, the GEMM alone: M = 64, N x K = 7168 x 16384 in 45 us, 4096 x 7168 in 13 us,
7168 x 2048 in 6 us; the H100 SGLang table, with the quantization: 48, 16 and 10 us). Pricing decode with them lowers Day-6's
SLO-bound decode unit (-18% -> -34% against the published rate) and the DeepSeek profile's
decode (-4% -> -12%): with GEMMs at DeepSeek's own measured speed, what those units over-price
lies elsewhere, in their MLA decode (``_kernel_curves_attention``: -17% and -7% with it).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from cost_model._kernel_curves import (
    _CURVE_WEIGHT_DTYPES,
    DEVICE_ALIASES,
    _engine_curves,
    _grid_position,
    kernel_curves,
    matmul_dtype_on,
)
from cost_model._units import dtype_bytes

#: Grid of the dense GEMM curves: M (tokens in the call) 1 .. 16384, dense through the ridge
#: region (tens to a thousand tokens) where efficiency moves most, and N / K (output / input width
#: of one rank's slice) 256 .. 16384, the widths of projections sliced over 1-16 ranks, with
#: 8192 (Llama-3-70B/405B's hidden size and its TP-sliced FFN and head widths) measured rather
#: than interpolated: between 7168 and 12288 the efficiency is not log-linear (H100 TensorRT-LLM
#: per-tensor FP8, N x K = 8192 x 14336 at 500 tokens: 107 us interpolated from the 7168 and
#: 12288 widths, 92 us in the table). Coarse enough that every device, engine and dtype fits
#: the small committed file.
GEMM_M_GRID = np.array([1.0, 4.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0, 16384.0])
GEMM_NK_GRID = (256, 512, 1024, 2048, 4096, 7168, 8192, 12288, 16384)


def gemm_ideal_s(*, hardware, dtype: str, m, n, k) -> np.ndarray:
    """Roofline seconds of one ``m x k`` by ``k x n`` GEMM with ``dtype`` weights: max(FLOPs at
    the GEMM dtype's peak, weight bytes at the memory bandwidth) — the cost model's own matmul
    roofline (``_pricing.op_time_s`` before efficiencies), so a curve is ideal / measured."""
    m, n, k = (np.asarray(x, dtype=np.float64) for x in (m, n, k))
    compute_s = 2.0 * m * n * k / hardware.peak_flops_for(matmul_dtype_on(hardware, dtype))
    weight_bytes = n * k * dtype_bytes(_CURVE_WEIGHT_DTYPES.get(dtype, dtype))
    return np.maximum(compute_s, weight_bytes / hardware.memory_bandwidth_bytes_per_s)


@lru_cache(maxsize=64)
def _gemm_tables(device_name: str, dtype: str, engine: str | None) -> np.ndarray | None:
    """Efficiency [M x N x K] on the GEMM grid: the engine's own curve, else the best of all."""
    device_name = DEVICE_ALIASES.get(device_name, device_name)
    curves = _engine_curves(
        [
            c
            for c in kernel_curves().get("gemm", ())
            if c["device"] == device_name and c["dtype"] == dtype
        ],
        engine,
    )
    if not curves:
        return None
    shape = (GEMM_M_GRID.size, len(GEMM_NK_GRID), len(GEMM_NK_GRID))  # M, N, K
    return np.max([np.reshape(c["efficiency_per_mille"], shape) / 1000.0 for c in curves], axis=0)


def gemm_efficiency(
    *, device_name: str, dtype: str, m, n, k, engine: str | None = None
) -> np.ndarray | None:
    """Measured efficiency (``gemm_ideal_s`` / latency) of a dense GEMM of ``m`` tokens through
    an ``n x k`` weight slice, trilinear in log(m), log(n), log(k) on ``GEMM_M_GRID`` x
    ``GEMM_NK_GRID``^2 and held beyond it; the serving ``engine``'s own kernels where its tables
    cover the device and dtype, else the best measured; None without a curve."""
    table = _gemm_tables(device_name, dtype, engine)
    if table is None:
        return None
    m, n, k = np.broadcast_arrays(
        *(np.atleast_1d(np.asarray(x, dtype=np.float64)) for x in (m, n, k))
    )
    widths = np.asarray(GEMM_NK_GRID, dtype=np.float64)
    (im, wm), (in_, wn), (ik, wk) = (
        _grid_position(m, GEMM_M_GRID),
        _grid_position(n, widths),
        _grid_position(k, widths),
    )
    value = np.zeros(m.shape)
    for dm, fm in ((0, 1.0 - wm), (1, wm)):
        for dn, fn in ((0, 1.0 - wn), (1, wn)):
            for dk, fk in ((0, 1.0 - wk), (1, wk)):
                value = value + fm * fn * fk * table[im + dm, in_ + dn, ik + dk]
    return value


#: Narrowest measured GEMM width: a slice narrower in N or K (a router's 128 experts' logits)
#: is priced at this width's latency, not at its efficiency over a smaller ideal. Below it the
#: call is one tile wide and launch-bound: SGLang's B200 BF16 table (aiconfigurator-core 0.12.0,
#: ``b200_sxm/gemm/sglang/0.5.14``) at M = 1, K = 4096 times N = 32, 64, 128, 256 at 4.5, 3.9,
#: 4.6, 4.2 us, where the efficiency held from N = 256 would price N = 128 at half of 4.2 us.
GEMM_MIN_WIDTH = float(GEMM_NK_GRID[0])


def _held_width(width) -> np.ndarray:
    """``width`` raised to ``GEMM_MIN_WIDTH``; an absent GEMM (width 0: no shared expert) stays 0."""
    width = np.asarray(width, dtype=np.float64)
    return np.where(width > 0, np.maximum(width, GEMM_MIN_WIDTH), 0.0)


def gemm_time_s(*, hardware, dtype: str, m, n, k, engine: str | None = None) -> np.ndarray | None:
    """One dense GEMM at its measured efficiency for its shape (``gemm_efficiency``): seconds,
    or None where no curve covers the device and dtype. N and K below the grid are priced at
    ``GEMM_MIN_WIDTH`` (the latency held, not the efficiency)."""
    n, k = _held_width(n), _held_width(k)
    efficiency = gemm_efficiency(
        device_name=hardware.name, dtype=dtype, m=m, n=n, k=k, engine=engine
    )
    if efficiency is None:
        return None
    return gemm_ideal_s(hardware=hardware, dtype=dtype, m=m, n=n, k=k) / efficiency


def projections_time_s(
    *, hardware, dtype: str, m, shard, projections, engine: str | None = None
) -> np.ndarray | None:
    """The GEMMs of one block (``projections``: (N, K, split) each, split "n", "k" or "" for the
    width tensor parallelism divides by ``shard``) over ``m`` tokens, each at its measured
    efficiency, summed; None without a curve. The same values as ``gemm_time_s`` per GEMM,
    computed per distinct ``shard`` (a few): the curve over M at each slice, then one
    interpolation in log(M) per row. A slice narrower than the grid is priced at
    ``GEMM_MIN_WIDTH``."""
    table = _gemm_tables(hardware.name, dtype, engine)
    if table is None:
        return None
    m = np.atleast_1d(np.asarray(m, dtype=np.float64))
    shards, inverse = np.unique(
        np.broadcast_to(np.asarray(shard, dtype=np.float64), m.shape), return_inverse=True
    )
    index, weight = _grid_position(m, GEMM_M_GRID)
    widths = np.asarray(GEMM_NK_GRID, dtype=np.float64)
    total = np.zeros(m.shape)
    for n, k, split in projections:
        n_rank = n / shards if split == "n" else np.full(shards.shape, float(n))
        k_rank = k / shards if split == "k" else np.full(shards.shape, float(k))
        n_rank, k_rank = _held_width(n_rank), _held_width(k_rank)
        (i_n, w_n), (i_k, w_k) = _grid_position(n_rank, widths), _grid_position(k_rank, widths)
        curves = np.zeros((shards.size, GEMM_M_GRID.size))  # efficiency over M, per shard
        for dn, fn in ((0, 1.0 - w_n), (1, w_n)):
            for dk, fk in ((0, 1.0 - w_k), (1, w_k)):
                curves += (fn * fk)[:, None] * table[:, i_n + dn, i_k + dk].T
        efficiency = (1.0 - weight) * curves[inverse, index] + weight * curves[inverse, index + 1]
        ideal = gemm_ideal_s(
            hardware=hardware, dtype=dtype, m=m, n=n_rank[inverse], k=k_rank[inverse]
        )
        total += ideal / efficiency
    return total
