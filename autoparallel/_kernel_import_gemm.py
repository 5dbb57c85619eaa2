"""Dense GEMM curves from aiconfigurator-core's ``gemm/*/gemm_perf.parquet`` tables.

Efficiency (the cost model's ideal time, ``cost_model._kernel_curves_gemm.gemm_ideal_s``, over the
measured latency) on the grid of ``GEMM_M_GRID`` x ``GEMM_NK_GRID``^2, one curve per (device,
engine, dtype); per-tensor FP8 rows less the dynamic scale step of
``quantize/*/computescale_perf.parquet`` (``_static_fp8_latency``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from autoparallel._kernel_import_tables import DEVICES, DTYPES, _latest_tables, _read
from cost_model import GEMM_M_GRID, GEMM_NK_GRID, gemm_ideal_s
from topology import get_preset

logger = logging.getLogger(__name__)

#: Dense GEMM dtypes beyond ``DTYPES``: per-tensor FP8 (``fp8`` rows: TensorRT-LLM's
#: ``QuantAlgo.FP8``, ModelOpt's FP8 checkpoints) -> the curves of per-tensor FP8 with static
#: activation scales (``_static_fp8_latency``), where the engine's quantize tables time the
#: dynamic scale computation the GEMM rows hold.
GEMM_DTYPES = {**DTYPES, "fp8": "fp8_tensor"}
#: Engines whose per-tensor FP8 GEMM rows become ``fp8_tensor`` curves: TensorRT-LLM's, whose
#: GEMM collector runs dynamic per-tensor quantization and whose compute-scale table times
#: exactly its amax step (dynamic less static per-tensor quantization of the same input). SGLang's
#: compute-scale table holds zeros and vLLM's times per-token scaling, so neither isolates what
#: its GEMM rows hold: their per-tensor rows are not imported (a lookup falls back to the
#: TensorRT-LLM curve, ``_kernel_curves._engine_curves``).
STATIC_FP8_ENGINES = ("trtllm",)


def _compute_scale_s(root: Path, device: str, engine: str) -> dict[tuple[int, int], float]:
    """Seconds of the dynamic per-tensor FP8 scale computation by (m, k), from the newest
    ``quantize/<engine>/<version>/computescale_perf.parquet``; empty where none. aiconfigurator's
    TensorRT-LLM collector (``collector/trtllm/collect_computescale.py``) times
    ``quantize_e4m3_per_tensor`` (amax, then the cast) and ``static_quantize_e4m3_per_tensor``
    (the cast alone) on the same (m, k) BF16 input in a CUDA graph and writes the difference."""
    if engine not in STATIC_FP8_ENGINES:
        return {}
    for path in _latest_tables(root, device, "quantize", engine, "computescale_perf.parquet"):
        return {
            (int(row["m"]), int(row["k"])): float(row["latency"]) * 1e-3
            for row in _read(path)
            if row["quant_dtype"] == "fp8"
        }
    return {}


def _static_fp8_latency(latency: float, m: int, k: int, compute_scale: dict) -> float | None:
    """A per-tensor FP8 GEMM row's seconds with static activation scales, or None (no
    compute-scale point at its (m, k)). aiconfigurator's TensorRT-LLM GEMM collector loads no
    ``input_scale`` (``collector/trtllm/collect_gemm.py``), so its ``fp8`` rows run
    ``FP8QDQLinearMethod``'s dynamic quantization (amax + cast, then the cuBLAS FP8 GEMM:
    ``tensorrt_llm/_torch/modules/linear.py``); a checkpoint with static input scales (ModelOpt
    FP8) casts with the stored scale and skips the amax: the row less its compute-scale time."""
    scale = compute_scale.get((m, k))
    return None if scale is None else max(latency - scale, 0.0)


def _gemm_curves(root: Path, device: str, engine: str) -> list[dict]:
    """Dense GEMM efficiency on ``GEMM_M_GRID`` x ``GEMM_NK_GRID``^2 per dtype, from the newest
    ``gemm_perf.parquet`` whose rows cover the grid: at each (m, n, k) the fastest kernel the
    engine ships (it picks per shape), then at each grid M the mean over the measured M within
    its octave (M / sqrt 2 .. M * sqrt 2): the tables measure M on and one past tile
    boundaries, and a serving iteration's M is not tile-aligned. Per-tensor FP8 rows become
    ``fp8_tensor`` curves (static activation scales, ``_static_fp8_latency``) where the engine
    measured the compute-scale op, and are skipped elsewhere."""
    hardware = get_preset(DEVICES[device]).device
    widths = {int(w): i for i, w in enumerate(GEMM_NK_GRID)}
    log_grid = np.log(GEMM_M_GRID)
    compute_scale = _compute_scale_s(root, device, engine)
    for path in _latest_tables(root, device, "gemm", engine, "gemm_perf.parquet"):
        fastest: dict[tuple, float] = {}
        for row in _read(path):
            dtype = GEMM_DTYPES.get(row["gemm_dtype"])
            n, k = int(row["n"]), int(row["k"])
            if dtype is None or n not in widths or k not in widths:
                continue
            latency: float | None = float(row["latency"]) * 1e-3
            if dtype == "fp8_tensor":
                latency = _static_fp8_latency(latency, int(row["m"]), k, compute_scale)
                if latency is None:
                    continue
            key = (dtype, int(row["m"]), n, k)
            fastest[key] = min(fastest.get(key, np.inf), latency)
        curves = []
        for dtype in sorted({key[0] for key in fastest}):
            sums = np.zeros((GEMM_M_GRID.size, len(widths), len(widths)))
            counts = np.zeros_like(sums)
            for (d, m, n, k), latency in fastest.items():
                if d != dtype:
                    continue
                band = np.abs(np.log(m) - log_grid) <= 0.5 * np.log(2.0)
                ideal = gemm_ideal_s(hardware=hardware, dtype=dtype, m=m, n=n, k=k)
                sums[band, widths[n], widths[k]] += float(ideal) / latency
                counts[band, widths[n], widths[k]] += 1
            if not counts.all():
                logger.info("%s %s %s: GEMM grid not covered, skipped", path, dtype, engine)
                continue
            efficiency = np.clip(sums / counts, 1e-3, 1.0)
            curves.append(
                {
                    "device": hardware.name,
                    "engine": engine,
                    "engine_version": path.parent.name,
                    "dtype": dtype,
                    "file": str(path.relative_to(root.parent)),
                    # thousandths as integers, one line per M (N-major over N x K): the grids
                    # are most of the file's numbers
                    "efficiency_per_mille": np.rint(efficiency * 1000)
                    .astype(int)
                    .reshape(GEMM_M_GRID.size, -1)
                    .tolist(),
                }
            )
        if curves:
            return curves
    return []
