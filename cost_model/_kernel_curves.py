"""Kernel curves: the imported per-operator tables (fit inputs), their devices and lookups.

The curves live in ``cost_model/data/kernel_curves.json``, written by
``autoparallel profile --import-aiconfigurator`` from NVIDIA's aiconfigurator-core operator
tables (Apache-2.0; every curve names its file and its expert shape). Efficiency curves hold
``ideal time / measured latency``, the ideal time the cost model's own for the same work; a few
kinds are kept as measured latencies. Each kind is priced by its own module: grouped expert
GEMMs (``_kernel_curves_moe``), MLA and MHA/GQA attention (``_kernel_curves_attention``), dense
GEMMs (``_kernel_curves_gemm``), DeepEP dispatch and combine and tensor-parallel all-reduces
(``_kernel_curves_comm``), Gated DeltaNet convolution and recurrence (``_kernel_curves_linear``). This module loads the file, maps devices that share another's kernels
(``DEVICE_ALIASES``), picks the engines' curves (``_engine_curves``) and holds the log-scale
interpolation the others share.

Where several engines measured one device and dtype, the best efficiency at each point is used
unless an ``engine`` is asked for: the fastest kernel measured for that shape (TRT-LLM's CUTLASS
grouped GEMM where the Triton kernels of untuned configs fall behind), the one a deployment
tuned for its shape runs. Curves of one kernel from its authors' published figures
(``PUBLISHED_KERNELS``) are priced only where asked for by name. A device or dtype without a
curve returns ``None`` and the caller keeps its roofline pricing.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

import numpy as np

_FILE = "kernel_curves.json"
#: Devices whose kernels are another's: the H800 is the H100 SXM's export variant, with the same
#: SMs, clocks and HBM3 and a narrower NVLink (NVIDIA H800 datasheet), which kernels do not see.
DEVICE_ALIASES = {"NVIDIA H800 SXM": "NVIDIA H100 SXM"}
_WEIGHT_ONLY = {"int4": "bf16"}  # dtype the GEMM runs in for weight-only formats
#: Dense GEMM curve dtypes that name a scaling as well as a dtype -> the weight dtype: per-tensor
#: FP8 with static activation scales (``gemm_curve_dtype``); ``fp8`` curves are block-scaled.
_CURVE_WEIGHT_DTYPES = {"fp8_tensor": "fp8"}


def matmul_dtype_of(weight_dtype: str) -> str:
    weight_dtype = _CURVE_WEIGHT_DTYPES.get(weight_dtype, weight_dtype)
    return _WEIGHT_ONLY.get(weight_dtype, weight_dtype)


def matmul_dtype_on(hardware, weight_dtype: str) -> str:
    """The dtype a GEMM of ``weight_dtype`` weights runs in on ``hardware``: its own where the
    device has tensor cores for it (a peak), else bf16 — weights widened inside the kernel
    (FP4 on Hopper: Marlin and Triton W4A16, ``_serving_precision``)."""
    dtype = matmul_dtype_of(weight_dtype)
    return dtype if dtype in hardware.peak_flops else "bf16"


def gemm_curve_dtype(weight_dtype: str, fp8_scaling: str = "block") -> str:
    """The dense GEMM curve that prices ``weight_dtype`` weights: FP8 weights with per-tensor
    scales (``fp8_scaling`` ``"tensor"``: ModelOpt FP8 checkpoints, TensorRT-LLM
    ``QuantAlgo.FP8``) take the ``fp8_tensor`` curves, whose activation scales are static;
    block-scaled FP8 (DeepSeek-V3's 128 x 128 weight tiles, 1 x 128 activation groups) the
    ``fp8`` ones. They are different kernels (cuBLAS FP8 with one scale; a main loop that
    rescales every 128-deep K block): on H100 (TensorRT-LLM tables, Llama-3-70B's TP2 q/k/v
    slice, 5120 x 8192) 20.8 against 21.5 us at 1 token, 22 against 29 us at 86 and 328
    against 433 us at 5000."""
    return "fp8_tensor" if weight_dtype == "fp8" and fp8_scaling == "tensor" else weight_dtype


@lru_cache(maxsize=1)
def kernel_curves() -> dict:
    """The shipped curves (``cost_model/data/kernel_curves.json``); empty when absent."""
    folder = resources.files("cost_model") / "data"
    path = folder / _FILE
    return (
        json.loads(path.read_text()) if path.is_file() else {"grouped_gemm": [], "mla_decode": []}
    )


#: Curves of one kernel from its authors' published figures, not of a serving engine's tables:
#: priced only where asked for by name (``Inference.mla_decode_kernel``), never in the best over
#: engines (a serving engine that does not run the kernel by default does not get it).
PUBLISHED_KERNELS = frozenset({"flashmla"})


def _engine_curves(curves: list[dict], engine: str | None) -> list[dict]:
    """The serving engine's own curves where it measured them, else every engine's (best)."""
    own = [c for c in curves if c.get("engine") == engine]
    return own or [c for c in curves if c.get("engine") not in PUBLISHED_KERNELS]


def _grid_position(values: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lower index and weight of ``values`` between the points of ``grid`` (log scale, clamped)."""
    log_grid = np.log(grid)
    where = np.clip(np.log(np.maximum(values, 1e-9)), log_grid[0], log_grid[-1])
    index = np.clip(np.searchsorted(log_grid, where) - 1, 0, grid.size - 2)
    return index, (where - log_grid[index]) / (log_grid[index + 1] - log_grid[index])


def _log_bracket(values: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Indices of the grid points either side of ``values`` and the weight of the upper one,
    linear in the logs and clamped at the grid's ends (a one-point grid holds its value)."""
    if grid.size == 1:
        zero = np.zeros(values.shape, dtype=np.int64)
        return zero, zero, np.zeros(values.shape)
    index, weight = _grid_position(values, grid)
    return index, index + 1, weight


def _between_rows(rows: np.ndarray, row_keys: np.ndarray, where: np.ndarray) -> np.ndarray:
    """Linear interpolation between ``rows`` (keys ascending) at ``where``, clamped at the ends."""
    if len(row_keys) == 1:
        return rows[0]
    index = np.clip(np.searchsorted(row_keys, where) - 1, 0, len(row_keys) - 2)
    weight = np.clip((where - row_keys[index]) / (row_keys[index + 1] - row_keys[index]), 0.0, 1.0)
    columns = np.arange(rows.shape[1])
    return (1 - weight) * rows[index, columns] + weight * rows[index + 1, columns]
