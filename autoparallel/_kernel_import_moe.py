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

from autoparallel._kernel_import_moe_routing import (
    DEEPSEEK_V3_GROUPING,
    GROUPED_SHAPES,
    MIN_LATENCY_SOURCE,
    rank0_load,
)
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
        # (dtype, shape, routed by DeepSeek-V3's gate) -> {(ep, tokens): fastest latency}
        points: dict[tuple, dict[tuple[int, int], float]] = {}
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
            gated = row.get("kernel_source") == MIN_LATENCY_SOURCE
            table = points.setdefault((dtype, shape, gated), {})
            key = (int(row["moe_ep_size"]), int(row["num_tokens"]))
            table[key] = min(table.get(key, np.inf), float(row["latency"]) * 1e-3)  # ms -> s
        for dtype, shape in sorted({k[:2] for k in points} - done):
            curve = _merged_curve(
                [
                    _reduce_grouped(
                        table,
                        dtype=dtype,
                        shape=shape,
                        hardware=hardware,
                        grouping=_grouping(engine, shape, gated, table, dtype, hardware),
                    )
                    for (d, s, gated), table in sorted(points.items())
                    if (d, s) == (dtype, shape)
                ]
            )
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


def _grouping(
    engine: str, shape: tuple, gated: bool, table: dict, dtype: str, hardware
) -> tuple[int, int] | None:
    """The routing a table's tokens went through (``_kernel_import_moe_routing``): DeepSeek-V3's
    gate for TensorRT-LLM's min-latency kernel; for an SGLang or vLLM table of DeepSeek-V3's
    experts the gate where the collector ran it, i.e. where the table priced as balanced work
    beats the roofline at some point (older collectors routed plainly: their tables priced that
    way sit at the bandwidth the other shapes reach, and priced as gated work at half of it);
    plain top-k otherwise."""
    if gated:
        return DEEPSEEK_V3_GROUPING
    grouping = GROUPED_SHAPES.get(shape[:4]) if engine in ("sglang", "vllm") else None
    if grouping is None:
        return None
    plain = _efficiencies(table, dtype=dtype, shape=shape, hardware=hardware, grouping=None)
    whole = [e for ep, (_, e, _) in plain.items() if ep == 1] or [e for _, e, _ in plain.values()]
    return grouping if any(np.max(e) > 1.0 for e in whole) else None


def _merged_curve(curves: list[dict]) -> dict:
    """The best efficiency at each grid point over one table's kernels (each with its routing)."""
    merged: dict[str, list[float]] = {}
    for curve in curves:
        for count, values in curve.get("experts_per_device", {}).items():
            merged[count] = (
                values
                if count not in merged
                else [max(a, b) for a, b in zip(merged[count], values, strict=True)]
            )
    return (
        {"experts_per_device": dict(sorted(merged.items(), key=lambda kv: -int(kv[0])))}
        if merged
        else {}
    )


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


def _balanced_ideal_s(per_expert, *, dtype: str, shape: tuple, hardware, touched=None):
    """The cost model's ideal time of ``per_expert`` tokens on each of one rank's experts of
    ``shape``, the experts whose weights are read being ``touched`` (a fraction; by default the
    balanced spread's, ``min(1, per_expert)``)."""
    hidden, inter, experts, _, tp = shape
    inter = inter // tp  # the slice one rank runs
    per_expert = np.asarray(per_expert, dtype=np.float64)
    return grouped_gemm_ideal_s(
        hardware=hardware,
        dtype=dtype,
        tokens_per_expert=per_expert,
        experts_per_device=1.0,
        touched_fraction=np.minimum(1.0, per_expert) if touched is None else touched,
        side_bytes_per_assignment=_side_bytes(dtype, hardware, hidden=hidden, expert_ffn=inter),
        hidden_size=hidden,
        expert_ffn_size=inter,
    )


def _efficiencies(
    table: dict, *, dtype: str, shape: tuple, hardware, grouping: tuple[int, int] | None
) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per expert-parallel size: (tokens per local expert, ideal time / latency, latency) of each
    measured token count, in increasing tokens per expert. Plainly routed balanced tokens spread
    evenly, ``tokens * top_k / experts`` per expert, the expectation the cost model queries a
    curve with. A table whose tokens went through a grouped routing (``grouping``,
    ``_kernel_import_moe_routing``) timed other work on its rank: its points are that work's, the
    rank's assignments per local expert and the experts whose weights it read (``rank0_load``)."""
    experts, top_k = shape[2], shape[3]
    out = {}
    for ep in sorted({k[0] for k in table}):
        tokens = np.array(sorted(k[1] for k in table if k[0] == ep), dtype=np.float64)
        local = experts // ep
        measured = np.array([table[(ep, int(t))] for t in tokens])
        if grouping is None:
            per_expert = tokens * top_k / experts
            touched = np.minimum(1.0, per_expert)
        else:
            load = np.array(
                [rank0_load(int(t), experts, top_k, ep, grouping) for t in tokens], dtype=float
            )
            per_expert, touched = load[:, 0] / local, load[:, 1] / local
        # the ideal scales with the rank's expert count: price one expert's share, times it
        ideal = local * _balanced_ideal_s(
            per_expert, dtype=dtype, shape=shape, hardware=hardware, touched=touched
        )
        keep = per_expert > 0  # a rank the routing sent nothing timed no expert work
        order = np.argsort(per_expert[keep], kind="stable")
        out[ep] = tuple(v[keep][order] for v in (per_expert, ideal / measured, measured))
    return out


def _reduce_grouped(
    table: dict, *, dtype: str, shape: tuple, hardware, grouping: tuple[int, int] | None
) -> dict:
    """Efficiency on ``TOKENS_PER_EXPERT_GRID`` for each measured experts-per-device count.

    Between measured points the efficiency is interpolated in log(tokens per expert) and held
    beyond them. A grouped routing loads the timed rank more than the balanced spread (four
    experts take every token), so such a table has no point below about one token per expert
    on a wide expert-parallel rank; there the latency of its least loaded point is held instead
    (a kernel takes no less time for less work than that point's), the efficiency falling with
    the balanced work's ideal time."""
    experts = shape[2]
    rows = {}
    for ep, (per_expert, efficiency, measured) in _efficiencies(
        table, dtype=dtype, shape=shape, hardware=hardware, grouping=grouping
    ).items():
        grid = np.interp(np.log(TOKENS_PER_EXPERT_GRID), np.log(per_expert), efficiency)
        if grouping is not None:
            below = TOKENS_PER_EXPERT_GRID < per_expert[0]
            held = (experts // ep) * _balanced_ideal_s(
                TOKENS_PER_EXPERT_GRID[below], dtype=dtype, shape=shape, hardware=hardware
            )
            grid[below] = held / measured[0]
        if per_expert.size >= 4:
            rows[str(experts // ep)] = [round(float(e), 4) for e in np.clip(grid, 1e-3, 1.0)]
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
