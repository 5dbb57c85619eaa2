"""Fused MoE expert-layer curves from aiconfigurator-core's ``moe/*/moe_perf.parquet`` tables.

Each measured point, for the expert shapes of ``EXPERT_SHAPES``, becomes an *efficiency*: the
project's own ideal time for the same work
(``cost_model._kernel_curves_moe.grouped_gemm_ideal_s``, a roofline at the device's peak FLOP/s and
memory bandwidth, with the memory passes per token copy
the cost model counts, ``routed_bytes_per_assignment``) over the measured latency, reduced to
the fixed log grid ``TOKENS_PER_EXPERT_GRID`` of tokens per expert for each number of experts
per device, one curve per (device, engine, dtype, expert shape).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from autoparallel._kernel_import_tables import DEVICES, DTYPES, _latest_tables, _read
from cost_model import (
    GROUPED_GEMM_SHAPE,
    TOKENS_PER_EXPERT_GRID,
    dtype_bytes,
    grouped_gemm_ideal_s,
    matmul_dtype_on,
    routed_bytes_per_assignment,
)
from topology import get_preset

#: Expert shapes (hidden, expert FFN width, routed experts, top-k, expert tensor-parallel size)
#: imported from the MoE tables: DeepSeek-V3's small experts first (``GROUPED_GEMM_SHAPE``),
#: then the same split over 8 ranks (the tensor-parallel experts of a TP8 deployment: a
#: 7168 x 256 slice per rank), Qwen3-235B-A22B's smaller experts, whole and over 8 ranks (a
#: 4096 x 192 slice: without it a TP8 Qwen3 rank was priced on DeepSeek's 7168 x 256 slice), and
#: Mixtral-8x7B's large ones, and Kimi-K2's 384 experts of DeepSeek-V3's size (Kimi-K2 / K2.5
#: ``config.json``: hidden 7168, moe_intermediate_size 2048, n_routed_experts 384, top-8), whole
#: and over 8 ranks. The efficiency of a memory-bound grouped GEMM at a few tokens per expert depends on
#: how many weight bytes each expert streams against the fixed routing, permute and ramp of
#: the fused layer, so a model is priced on the measured shape nearest the slice one rank
#: runs (``cost_model._kernel_curves_moe``), not on DeepSeek's alone; of two shapes with the same
#: slice (DeepSeek-V3's and Kimi-K2's), on the one measured nearest the rank's expert count.
#: gpt-oss-120b's experts (``config.json``: hidden 2880, intermediate_size 2880, 128 local
#: experts, top-4; MXFP4 weights), whole and over 8 ranks, and gpt-oss-20b's 32.
EXPERT_SHAPES = (
    (*GROUPED_GEMM_SHAPE, 1),
    (*GROUPED_GEMM_SHAPE, 8),
    (4096, 1536, 128, 8, 1),
    (4096, 1536, 128, 8, 8),
    (4096, 14336, 8, 2, 1),
    (7168, 2048, 384, 8, 1),
    (7168, 2048, 384, 8, 8),
    (2880, 2880, 128, 4, 1),
    (2880, 2880, 128, 4, 8),
    (2880, 2880, 32, 4, 1),
)


def _grouped_gemm_curves(root: Path, device: str, engine: str) -> list[dict]:
    """One curve per (dtype, expert shape) from the newest table that has the shape."""
    hardware = get_preset(DEVICES[device]).device
    curves: list[dict] = []
    done: set[tuple] = set()
    for path in _latest_tables(root, device, "moe", engine, "moe_perf.parquet"):
        points: dict[tuple, float] = {}
        for row in _read(path):
            dtype = DTYPES.get(row["moe_dtype"])
            shape = (
                row["hidden_size"],
                row["inter_size"],
                row["num_experts"],
                row["topk"],
                row["moe_tp_size"],
            )
            if (
                dtype is None
                or (dtype, shape) in done
                or shape not in EXPERT_SHAPES
                or row["distribution"] != "balanced"
            ):
                continue
            key = (dtype, shape, int(row["moe_ep_size"]), int(row["num_tokens"]))
            points[key] = min(
                points.get(key, np.inf), float(row["latency"]) * 1e-3
            )  # fastest kernel, ms -> s
        for dtype, shape in sorted({k[:2] for k in points} - done):
            curve = _reduce_grouped(points, dtype=dtype, shape=shape, hardware=hardware)
            if curve:
                curves.append(
                    {
                        "device": hardware.name,
                        "engine": engine,
                        "engine_version": path.parent.name,
                        "dtype": dtype,
                        "shape": _shape_fields(shape),
                        "file": str(path.relative_to(root.parent)),
                        **curve,
                    }
                )
                done.add((dtype, shape))
    return curves


def _shape_fields(shape: tuple) -> dict[str, int]:
    """The expert slice one rank runs: its FFN width is the expert's over the tensor-parallel size."""
    hidden, inter, experts, top_k, tp = shape
    return {
        "hidden_size": hidden,
        "expert_ffn_size": inter // tp,
        "num_experts": experts,
        "top_k": top_k,
        "expert_tensor_parallel": tp,
    }


def _reduce_grouped(points: dict, *, dtype: str, shape: tuple, hardware) -> dict:
    """Efficiency on ``TOKENS_PER_EXPERT_GRID`` for each measured experts-per-device count."""
    hidden, inter, experts, top_k, tp = shape
    inter = inter // tp  # the slice one rank runs
    rows = {}
    for ep in sorted({k[2] for k in points if k[:2] == (dtype, shape)}):
        tokens = np.array(
            sorted(k[3] for k in points if k[:3] == (dtype, shape, ep)), dtype=np.float64
        )
        measured = np.array([points[(dtype, shape, ep, int(t))] for t in tokens])
        per_expert = tokens * top_k / experts
        ideal = grouped_gemm_ideal_s(
            hardware=hardware,
            dtype=dtype,
            tokens_per_expert=per_expert,
            experts_per_device=experts / ep,
            touched_fraction=np.minimum(1.0, tokens * top_k / experts),
            side_bytes_per_assignment=_side_bytes(dtype, hardware, hidden=hidden, expert_ffn=inter),
            hidden_size=hidden,
            expert_ffn_size=inter,
        )
        efficiency = np.interp(np.log(TOKENS_PER_EXPERT_GRID), np.log(per_expert), ideal / measured)
        if len(tokens) >= 4:
            rows[str(experts // ep)] = [round(float(e), 4) for e in np.clip(efficiency, 1e-3, 1.0)]
    return {"experts_per_device": rows} if rows else {}


def _side_bytes(
    dtype: str,
    hardware,
    *,
    hidden: int = GROUPED_GEMM_SHAPE[0],
    expert_ffn: int = GROUPED_GEMM_SHAPE[1],
) -> float:
    """Memory passes per token copy of the fused MoE kernel, as the cost model counts them
    (``routed_bytes_per_assignment``) for an expert of the imported row's shape, bf16
    activations cast to the GEMM's dtype on ``hardware`` (none for a weight-only kernel)."""
    from autoparallel._catalog import get_model

    model = get_model("deepseek-v3")
    assert model.moe is not None  # the catalog's DeepSeek-V3 is an MoE
    model = model.model_copy(
        update={
            "hidden_size": hidden,
            "moe": model.moe.model_copy(update={"expert_ffn_hidden_size": expert_ffn}),
        }
    )
    cast = min(dtype_bytes(matmul_dtype_on(hardware, dtype)), 2.0)
    return float(routed_bytes_per_assignment(model, act=2.0, cast=cast, etp=1.0))
