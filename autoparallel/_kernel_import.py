"""Import public per-operator kernel tables into the cost model's kernel curves (fit inputs).

Source: NVIDIA's ``aiconfigurator-core`` package (PyPI, Apache-2.0), whose wheel ships
per-operator latency tables measured per device, engine and engine version under
``aiconfigurator_core/systems/data/<device>/<op>/<engine>/<version>/*.parquet``. Only
operator tables are read — the fused MoE expert layer (``moe/*/moe_perf.parquet``, for the
expert shapes of ``EXPERT_SHAPES``), MLA decode and prefill attention
(``mla/*/generation_mla_perf.parquet``, ``context_mla_perf.parquet``), the batched GEMMs of
absorbed MLA decode (``mla_bmm/*/mla_bmm_perf.parquet``, kept as measured), MHA/GQA context
and decode attention (``attention/*/context_attention_perf.parquet``,
``generation_attention_perf.parquet``) and dense GEMMs
(``gemm/*/gemm_perf.parquet``, on the grid of ``GEMM_M_GRID`` x ``GEMM_NK_GRID``^2; per-tensor
FP8 rows less the dynamic scale step of ``quantize/*/computescale_perf.parquet``) and the
serving engines' tensor-parallel all-reduce (``comm/*/custom_allreduce_perf.parquet``: latency by
message size and GPU count, kept as measured). End-to-end tables of whole serving
runs in the same package (``silicon_sample.csv``) are never opened: they are validation data,
not fit input (DESIGN.md, "Fidelity").

Each measured point becomes an *efficiency*: the project's own ideal time for the same work
(``cost_model._kernel_curves.grouped_gemm_ideal_s`` / ``mla_decode_ideal_s``, rooflines at the
device's peak FLOP/s and memory bandwidth) over the measured latency. The reduced curves —
efficiency at a fixed log grid of tokens per expert for each number of experts per device, one
per (device, engine, dtype); efficiency by context length and batch for MLA decode, one per head
count per rank — are written as one
small JSON file with the package, version, file and licence of every curve.

MLA decode also gets curves of one kernel from its authors' published figures (DeepSeek's
FlashMLA, ``cost_model/data/flashmla_decode.json``: README throughput at the benchmark's shapes,
``flashmla_decode_curves``), written with the imported ones under engine ``"flashmla"``.

Re-run: ``autoparallel profile --import-aiconfigurator PATH`` (PATH: an unpacked wheel or the
``aiconfigurator_core`` folder); needs ``pyarrow`` (``pip install pyarrow``).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np

from cost_model import (
    ALL_REDUCE_MESSAGE_BYTES,
    GEMM_M_GRID,
    GEMM_NK_GRID,
    GROUPED_GEMM_SHAPE,
    MLA_CURVE_HEADS,
    TOKENS_PER_EXPERT_GRID,
    attention_flops_per_key,
    dtype_bytes,
    expert_all_to_all_bytes,
    gemm_ideal_s,
    grouped_gemm_ideal_s,
    matmul_dtype_of,
    mla_decode_ideal_s,
    routed_bytes_per_assignment,
)
from topology import get_preset

logger = logging.getLogger(__name__)

PACKAGE = "aiconfigurator-core"
#: aiconfigurator device folder -> the preset whose peaks price the ideal time.
DEVICES = {
    "h100_sxm": "dgx-h100",
    "h200_sxm": "dgx-h200",
    "b200_sxm": "dgx-b200",
    "gb200": "gb200-nvl72",
}
#: aiconfigurator dtype names -> the project's weight dtypes (block-scaled FP8 is DeepSeek's).
DTYPES = {"bfloat16": "bf16", "fp8_block": "fp8", "nvfp4": "fp4", "int4_wo": "int4"}
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
ENGINES = ("trtllm", "sglang", "vllm")
FORBIDDEN_FILE = "silicon_sample"


def _read(path: Path) -> list[dict]:
    if FORBIDDEN_FILE in path.name:
        raise ValueError(
            f"file ({path.name}) holds end-to-end runs: validation data, never a fit input"
        )
    try:
        from pyarrow import parquet
    except ImportError:
        raise ImportError(
            "importing aiconfigurator tables needs pyarrow: pip install pyarrow"
        ) from None
    return parquet.read_table(path).to_pylist()


def _version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else -1 for p in re.split(r"[.a-z]+", version) if p)


def _latest_tables(root: Path, device: str, op: str, engine: str, name: str) -> list[Path]:
    folder = root / "systems" / "data" / device / op / engine
    versions = sorted(
        (p for p in folder.glob("*") if (p / name).exists()),
        key=lambda p: _version_key(p.name),
    )
    return [v / name for v in reversed(versions)]


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
#: runs (``cost_model._kernel_curves``), not on DeepSeek's alone; of two shapes with the same
#: slice (DeepSeek-V3's and Kimi-K2's), on the one measured nearest the rank's expert count.
EXPERT_SHAPES = (
    (*GROUPED_GEMM_SHAPE, 1),
    (*GROUPED_GEMM_SHAPE, 8),
    (4096, 1536, 128, 8, 1),
    (4096, 1536, 128, 8, 8),
    (4096, 14336, 8, 2, 1),
    (7168, 2048, 384, 8, 1),
    (7168, 2048, 384, 8, 8),
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
            side_bytes_per_assignment=_side_bytes(dtype, hidden=hidden, expert_ffn=inter),
            hidden_size=hidden,
            expert_ffn_size=inter,
        )
        efficiency = np.interp(np.log(TOKENS_PER_EXPERT_GRID), np.log(per_expert), ideal / measured)
        if len(tokens) >= 4:
            rows[str(experts // ep)] = [round(float(e), 4) for e in np.clip(efficiency, 1e-3, 1.0)]
    return {"experts_per_device": rows} if rows else {}


def _side_bytes(
    dtype: str, *, hidden: int = GROUPED_GEMM_SHAPE[0], expert_ffn: int = GROUPED_GEMM_SHAPE[1]
) -> float:
    """Memory passes per token copy of the fused MoE kernel, as the cost model counts them
    (``routed_bytes_per_assignment``) for an expert of the imported row's shape, bf16
    activations."""
    from autoparallel._catalog import get_model

    model = get_model("deepseek-v3")
    assert model.moe is not None  # the catalog's DeepSeek-V3 is an MoE
    model = model.model_copy(
        update={
            "hidden_size": hidden,
            "moe": model.moe.model_copy(update={"expert_ffn_hidden_size": expert_ffn}),
        }
    )
    cast = min(dtype_bytes(matmul_dtype_of(dtype)), 2.0)
    return float(routed_bytes_per_assignment(model, act=2.0, cast=cast, etp=1.0))


#: Fewest heads per rank of the MLA decode rows kept: the catalog's MLA models (64 or 128 heads)
#: at tensor parallelism up to 16.
MLA_MIN_HEADS = 4
#: MLA operator tables: file, and the batch sizes kept (decode: all; prefill: one prompt).
_MLA_TABLES = {
    "mla_decode": ("generation_mla_perf.parquet", None),
    "mla_prefill": ("context_mla_perf.parquet", (1,)),
}


def _mla_ideal_s(kind: str, *, hardware, batch: int, tokens: np.ndarray, heads: int) -> np.ndarray:
    """Ideal seconds of one MLA layer of DeepSeek-V3's head shape over ``heads`` heads on one
    rank: absorbed-form decode of one token at ``tokens`` context (every head reads the one
    latent), or an explicit-form causal prefill of a ``tokens`` prompt."""
    if kind == "mla_decode":
        return mla_decode_ideal_s(
            hardware=hardware, batch=batch, context_tokens=tokens, heads=heads
        )
    from autoparallel._catalog import get_model

    per_key = attention_flops_per_key(get_model("deepseek-v3"), decode=False) * heads / 128
    flops = batch * tokens * (tokens + 1.0) / 2.0 * per_key  # causal: query i attends i keys
    return flops / hardware.peak_flops_for("bf16")


def _mla_latencies(path: Path, kind: str) -> dict[int, dict[int, dict[int, float]]]:
    """Fastest measured seconds by heads per rank, then batch, then length: keys the decoded
    token attends (context plus itself) or the prompt's length; bf16 cache. The tables' heads
    are one rank's (``num_heads`` x ``tp_size`` is the model's); decode keeps every head count
    measured down to ``MLA_MIN_HEADS``, the heads a tensor-parallel rank runs (DeepSeek-V3's 128
    over tp 8: 16), prefill the 128 of one rank."""
    keep = _MLA_TABLES[kind][1]
    table: dict[int, dict[int, dict[int, float]]] = {}
    for row in _read(path):
        batch, heads = int(row["batch_size"]), int(row["num_heads"])
        if (
            (kind != "mla_decode" and heads != MLA_CURVE_HEADS)
            or heads < MLA_MIN_HEADS
            or row["kv_cache_dtype"] != "bfloat16"
            or (keep and batch not in keep)
        ):
            continue
        length = int(row["isl"]) + (int(row["step"]) if kind == "mla_decode" else 0)
        lengths = table.setdefault(heads, {}).setdefault(batch, {})
        lengths[length] = min(lengths.get(length, np.inf), float(row["latency"]) * 1e-3)
    kept = {
        heads: {batch: lengths for batch, lengths in batches.items() if len(lengths) >= 4}
        for heads, batches in table.items()
    }
    return {heads: batches for heads, batches in kept.items() if batches}


def _mla_curves(root: Path, device: str, engine: str, kind: str) -> list[dict]:
    """MLA attention efficiency by length for each measured batch (DeepSeek-V3's attention), one
    curve per head count per rank, from the newest table with 4+ lengths: on the lengths of the
    smallest batch, each batch's curve interpolated in log(length) and held beyond its longest
    measured length."""
    hardware = get_preset(DEVICES[device]).device
    for path in _latest_tables(root, device, "mla", engine, _MLA_TABLES[kind][0]):
        tables = _mla_latencies(path, kind)
        curves = []
        for heads, table in sorted(tables.items(), reverse=True):
            grid = np.array(sorted(table[min(table)]), dtype=np.float64)
            by_batch = {}
            for batch, lengths in sorted(table.items()):
                measured_at = np.array(sorted(lengths), dtype=np.float64)
                ideal = _mla_ideal_s(
                    kind, hardware=hardware, batch=batch, tokens=measured_at, heads=heads
                )
                efficiency = ideal / np.array([lengths[int(n)] for n in measured_at])
                values = np.interp(np.log(grid), np.log(measured_at), efficiency)
                by_batch[str(batch)] = [round(float(e), 4) for e in np.clip(values, 1e-3, 1.0)]
            curves.append(
                {
                    "device": hardware.name,
                    "engine": engine,
                    "engine_version": path.parent.name,
                    "dtype": "bf16",
                    "heads": heads,
                    "file": str(path.relative_to(root.parent)),
                    "context_tokens": grid.tolist(),
                    "efficiency_by_batch": by_batch,
                }
            )
        if curves:
            return curves
    return []


#: Published kernel figures kept as MLA decode curves: data file in ``cost_model/data`` -> engine
#: name of its curves (a kernel, not a serving engine: a workload asks for it by name,
#: ``Inference.mla_decode_kernel``).
PUBLISHED_MLA_DECODE = {"flashmla_decode.json": "flashmla"}


def flashmla_decode_curves() -> list[dict]:
    """FlashMLA's dense decoding kernel as MLA decode curves, one per query-head count, from its
    published throughput (``cost_model/data/flashmla_decode.json``, FlashMLA README at the commit
    it names): at each shape of the benchmark the README's figures come from, the kernel takes
    the longer of its FLOPs at the compute-bound figure and its bytes at the memory-bound one
    (FLOPs and bytes as the benchmark counts them); efficiency is the cost model's ideal time
    (``mla_decode_ideal_s`` at the preset's peaks) over that time."""
    from importlib import resources

    ((name, engine),) = PUBLISHED_MLA_DECODE.items()
    data = json.loads((resources.files("cost_model") / "data" / name).read_text())
    hardware = get_preset(data["device_preset"]).device
    context = np.asarray(data["cache_tokens"], dtype=np.float64)
    d, dv, size = data["head_dim_k"], data["head_dim_v"], data["element_bytes"]
    curves = []
    for heads in sorted(data["query_heads"], reverse=True):
        by_batch = {}
        for batch in data["batch"]:
            keys = batch * context
            flops = keys * heads * (d + dv) * 2.0
            bytes_moved = (keys * d + batch * heads * (d + dv)) * size
            kernel_s = np.maximum(
                flops / data["compute_bound_flops_per_s"],
                bytes_moved / data["memory_bound_bytes_per_s"],
            )
            ideal = mla_decode_ideal_s(
                hardware=hardware, batch=batch, context_tokens=context, heads=heads
            )
            by_batch[str(batch)] = [round(float(e), 4) for e in ideal / kernel_s]
        curves.append(
            {
                "device": hardware.name,
                "engine": engine,
                "engine_version": data["commit"][:7],
                "dtype": "bf16",
                "heads": heads,
                "file": f"{data['repository']} README.md@{data['commit'][:7]} (cost_model/data/{name})",
                "context_tokens": context.tolist(),
                "efficiency_by_batch": by_batch,
            }
        )
    return curves


#: Tokens per call at which the absorbed-MLA batched GEMMs are kept (the tables' grid up to 8K).
MLA_BMM_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
#: The two batched GEMMs of absorbed MLA decode (aiconfigurator ``mla_bmm`` op names): the
#: queries' no-RoPE part into the latent (``q_nope x W_UK``) and the attention output back to
#: the value heads (``x W_UV``), which together take the place of ``kv_b_proj``.
MLA_BMM_OPS = ("mla_gen_pre", "mla_gen_post")


def _mla_bmm_curves(root: Path, device: str, engine: str) -> list[dict]:
    """Seconds of the absorbed-MLA batched GEMM pair (``MLA_BMM_OPS``, summed) by heads per rank
    (4+) on ``MLA_BMM_TOKENS``, BF16 weights, kept as measured: from the newest
    ``mla_bmm/<engine>/<version>/mla_bmm_perf.parquet`` that times both at every grid point."""
    hardware = get_preset(DEVICES[device]).device
    for path in _latest_tables(root, device, "mla_bmm", engine, "mla_bmm_perf.parquet"):
        fastest: dict[tuple, float] = {}
        for row in _read(path):
            heads = int(row["num_heads"])
            if row["bmm_dtype"] != "bfloat16" or heads < MLA_MIN_HEADS:
                continue
            key = (row["op_name"], heads, int(row["num_tokens"]))
            fastest[key] = min(fastest.get(key, np.inf), float(row["latency"]) * 1e-3)
        by_heads = {}
        for heads in sorted({k[1] for k in fastest}):
            keys = [(op, heads, t) for t in MLA_BMM_TOKENS for op in MLA_BMM_OPS]
            if all(k in fastest for k in keys):
                by_heads[str(heads)] = [
                    float(f"{sum(fastest[(op, heads, t)] for op in MLA_BMM_OPS) * 1e6:.4g}")
                    for t in MLA_BMM_TOKENS
                ]
        if by_heads:
            return [
                {
                    "device": hardware.name,
                    "engine": engine,
                    "engine_version": path.parent.name,
                    "dtype": "bf16",
                    "ops": list(MLA_BMM_OPS),
                    "file": str(path.relative_to(root.parent)),
                    "latency_us_by_heads": by_heads,
                }
            ]
    return []


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


#: Engines whose context attention runs in FP8 over an FP8 KV cache: TensorRT-LLM builds FP8
#: context FMHA into an engine whose checkpoint is FP8-quantized (``tensorrt_llm/builder.py``:
#: ``use_fp8_context_fmha`` = quant_algo in (FP8, W4A8_AWQ, NVFP4) and the plugin option, whose
#: default is on: ``tensorrt_llm/plugin/plugin.py`` ``PluginConfig``), and its tables time that
#: kernel in their FP8-attention rows. The other engines' FP8-cache prefill is not priced as FP8.
FP8_CONTEXT_FMHA_ENGINES = ("trtllm",)
#: Context-attention grid: prompt lengths and (sequence, head) pairs per call, 4x apart.
ATTENTION_TOKENS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
ATTENTION_UNITS = (1, 4, 16, 64, 256, 1024, 4096)


def _context_attention_curves(root: Path, device: str, engine: str) -> list[dict]:
    """MHA/GQA context attention (FlashAttention-class, causal, bf16, head dim 128, no window)
    efficiency by prompt length and by the (sequence, head) pairs of one call (batch x query
    heads on the rank: the kernel's parallel work), from the newest table with 3+ lengths for
    every pair count: at each point the fastest over the measured key-value head counts, held
    beyond the longest measured length. Ideal: the causal score and value FLOPs,
    ``b * L (L + 1) / 2 * 4 * heads * 128``, at the BF16 peak. Engines that run FP8 context
    attention with an FP8 KV cache (``FP8_CONTEXT_FMHA_ENGINES``) get an ``fp8`` curve too, from
    their rows of FP8 attention over an FP8 cache, its ideal at the FP8 peak."""
    hardware = get_preset(DEVICES[device]).device
    units = {u: i for i, u in enumerate(ATTENTION_UNITS)}
    lengths = {n: i for i, n in enumerate(ATTENTION_TOKENS)}
    for path in _latest_tables(root, device, "attention", engine, "context_attention_perf.parquet"):
        dtypes = {"bfloat16": "bf16"}
        if engine in FP8_CONTEXT_FMHA_ENGINES:
            dtypes["fp8"] = "fp8"
        best = {name: np.zeros((len(units), len(lengths))) for name in dtypes}
        for row in _read(path):
            batch, heads, length = int(row["batch_size"]), int(row["num_heads"]), int(row["isl"])
            if (
                row["attn_dtype"] not in dtypes
                or row["kv_cache_dtype"] != row["attn_dtype"]
                or int(row["window_size"]) != 0
                or int(row["head_dim"]) != 128
                or batch * heads not in units
                or length not in lengths
            ):
                continue
            flops = batch * length * (length + 1) / 2.0 * 4.0 * heads * 128
            peak = hardware.peak_flops_for(dtypes[row["attn_dtype"]])
            efficiency = flops / peak / (float(row["latency"]) * 1e-3)
            cell = (units[batch * heads], lengths[length])
            table = best[row["attn_dtype"]]
            table[cell] = max(table[cell], efficiency)
        if (best["bfloat16"] > 0).sum(axis=1).min() < 3:
            continue
        # a long prompt of many sequences is not measured: its efficiency is held from the
        # longest measured (the kernel is saturated there)
        log_lengths = np.log(np.array(ATTENTION_TOKENS, dtype=np.float64))
        curves = []
        for name, table in best.items():
            if (table > 0).sum(axis=1).min() < 3:
                continue
            for i, row in enumerate(table):
                measured = row > 0
                table[i] = np.interp(log_lengths, log_lengths[measured], row[measured])
            curves.append(
                {
                    "device": hardware.name,
                    "engine": engine,
                    "engine_version": path.parent.name,
                    "dtype": dtypes[name],
                    "file": str(path.relative_to(root.parent)),
                    "efficiency_by_units": {
                        str(u): [round(float(e), 3) for e in np.clip(table[i], 1e-3, 1.0)]
                        for u, i in units.items()
                    },
                }
            )
        return curves
    return []


#: Decode-attention grid: keys the decoded token attends (the tables' ``isl + step``, 2x apart
#: from 64; a shorter context is held at 64's efficiency), (sequence, KV head) pairs of one call
#: (2x apart) and query heads per KV head (MHA, and the GQA groups of the catalog's models:
#: Llama-3 8B / Mixtral 4, Llama-3 70B / Qwen3 8, Qwen3-235B 16 on one rank; a group between is
#: interpolated). A 4x grid in either of the first two misprices the tables' own points by 5-8%
#: on average and up to 50% where the call turns from launch- to bandwidth-bound; the 2x grid by
#: 1-3% (Llama-3.1-70B and Qwen3-235B per-rank shapes, H100 / B200, SGLang / TensorRT-LLM).
DECODE_ATTENTION_TOKENS = tuple(2**i for i in range(6, 18))
DECODE_ATTENTION_UNITS = tuple(2**i for i in range(15))
DECODE_ATTENTION_GROUPS = (1, 4, 8, 16)
#: aiconfigurator device folders whose decode-attention tables are imported -> preset: the
#: kernel-curve devices and the A100 and GB300, whose attention tables the package also ships.
DECODE_ATTENTION_DEVICES = {**DEVICES, "a100_sxm": "dgx-a100", "gb300": "gb300-nvl72"}
#: KV-cache dtypes of the decode-attention tables -> the project's (the element bytes read).
KV_CACHE_DTYPES = {"bfloat16": ("bf16", 2.0), "fp8": ("fp8", 1.0)}


def _decode_attention_curves(root: Path, device: str, engine: str) -> list[dict]:
    """MHA/GQA decode attention (one query token per sequence, bf16 queries, head dim 128, no
    window) efficiency by the keys each sequence attends and by the (sequence, KV head) pairs of
    one call (batch x KV heads on the rank: the kernel's parallel work, each pair reading its
    own cache), for each query-head group size, one curve per KV-cache dtype, from the newest
    table: at each point the fastest kernel's, averaged over the measured KV-head counts whose
    pairs and group match (the pairs set the efficiency: at equal pairs the splits differ by a
    few percent, up to 20% at short contexts), held beyond the longest measured length (large batches of long contexts are not
    measured). Ideal: the roofline of the score and value FLOPs, ``b * n * 4 * heads * 128`` at
    the BF16 peak, and of the cache read, ``b * n * kv_heads * 2 * 128`` elements at the memory
    bandwidth (``n``: keys attended)."""
    hardware = get_preset(DECODE_ATTENTION_DEVICES[device]).device
    units = {u: i for i, u in enumerate(DECODE_ATTENTION_UNITS)}
    lengths = {n: i for i, n in enumerate(DECODE_ATTENTION_TOKENS)}
    groups = {g: i for i, g in enumerate(DECODE_ATTENTION_GROUPS)}
    peak = hardware.peak_flops_for("bf16")
    bandwidth = hardware.memory_bandwidth_bytes_per_s
    for path in _latest_tables(
        root, device, "attention", engine, "generation_attention_perf.parquet"
    ):
        fastest: dict[tuple, float] = {}  # per cell and KV-head count, over the kernels
        dtypes = {name: i for i, name in enumerate(KV_CACHE_DTYPES)}
        for row in _read(path):
            batch, heads = int(row["batch_size"]), int(row["num_heads"])
            kv_heads, length = int(row["num_key_value_heads"]), int(row["isl"]) + int(row["step"])
            if (
                row["attn_dtype"] != "bfloat16"
                or row["kv_cache_dtype"] not in dtypes
                or int(row.get("window_size") or 0) != 0  # the A100 tables have no windows
                or int(row["head_dim"]) != 128
                or int(row["beam_width"]) != 1
                or heads % kv_heads
                or heads // kv_heads not in groups
                or batch * kv_heads not in units
                or length not in lengths
            ):
                continue
            element = KV_CACHE_DTYPES[row["kv_cache_dtype"]][1]
            ideal = max(
                batch * length * 4.0 * heads * 128 / peak,
                batch * length * kv_heads * 2.0 * 128 * element / bandwidth,
            )
            key = (
                dtypes[row["kv_cache_dtype"]],
                groups[heads // kv_heads],
                units[batch * kv_heads],
                lengths[length],
                kv_heads,
            )
            fastest[key] = max(fastest.get(key, 0.0), ideal / (float(row["latency"]) * 1e-3))
        # the mean over the KV-head counts that make a cell's pairs (sequences x KV heads)
        sums = np.zeros((len(KV_CACHE_DTYPES), len(groups), len(units), len(lengths)))
        counts = np.zeros_like(sums)
        for key, efficiency in fastest.items():
            sums[key[:4]] += efficiency
            counts[key[:4]] += 1
        best = np.divide(sums, counts, out=np.zeros_like(sums), where=counts > 0)
        log_lengths = np.log(np.array(DECODE_ATTENTION_TOKENS, dtype=np.float64))
        curves = []
        for name, d in dtypes.items():
            by_group = {}
            for g, gi in groups.items():
                rows = {}
                for u, ui in units.items():
                    measured = best[d, gi, ui] > 0
                    if measured.sum() >= 3:
                        values = np.interp(
                            log_lengths, log_lengths[measured], best[d, gi, ui][measured]
                        )
                        # three significant digits: a launch-bound call of a few pairs over a
                        # short context runs at 1e-4 of the roofline
                        rows[str(u)] = [float(f"{e:.3g}") for e in np.clip(values, 1e-5, 1.0)]
                if rows:
                    by_group[str(g)] = rows
            if by_group:
                curves.append(
                    {
                        "device": hardware.name,
                        "engine": engine,
                        "engine_version": path.parent.name,
                        "dtype": KV_CACHE_DTYPES[name][0],
                        "file": str(path.relative_to(root.parent)),
                        "efficiency_by_group_units": by_group,
                    }
                )
        if curves:
            return curves
    return []


#: aiconfigurator device folders whose custom all-reduce tables are imported -> preset: the
#: kernel-curve devices and the A100 and GB300, whose all-reduce tables the package also ships.
ALLREDUCE_DEVICES = {**DEVICES, "a100_sxm": "dgx-a100", "gb300": "gb300-nvl72"}
#: Rows of each engine's table that time the kernel the engine runs in a serving pass: vLLM's
#: and SGLang's collectors time ``tensor_model_parallel_all_reduce`` (the engine's own choice per
#: size: its custom one-/two-shot kernel over NVLink peer memory below its size limit, 8 MiB by
#: default, NCCL above) inside a CUDA graph ("graph") and eagerly ("eager": each call adds the
#: collector's input copy and the host dispatch, not operator time); TensorRT-LLM's times its
#: ``AllReduce`` op with the AUTO strategy (one-shot / two-shot / NCCL by size) in a CUDA graph
#: (aiconfigurator ``collector/collect_all_reduce.py``). The graph rows are the operator.
ALLREDUCE_KERNELS = {
    "vllm": ("vLLM", "vLLM_custom_graph"),
    "sglang": ("SGLang", "SGLang_CustomAllReduce_graph"),
    "trtllm": ("TRTLLM", "TRTLLM"),
}


def _custom_allreduce_curves(root: Path, device: str, engine: str) -> list[dict]:
    """Latency of one tensor-parallel all-reduce at each size of ``ALL_REDUCE_MESSAGE_BYTES``, for
    each GPU count measured at all of them, from the newest
    ``comm/<engine>/<version>/custom_allreduce_perf.parquet`` whose rows are the engine's own (a
    folder may hold another engine's table: those rows are skipped). BF16 messages; the table's
    ``message_size`` counts elements (aiconfigurator's ops pass hidden x tokens)."""
    hardware = get_preset(ALLREDUCE_DEVICES[device]).device
    framework, kernel = ALLREDUCE_KERNELS[engine]
    grid = [int(b) for b in ALL_REDUCE_MESSAGE_BYTES]
    for path in _latest_tables(root, device, "comm", engine, "custom_allreduce_perf.parquet"):
        by_gpus: dict[int, dict[int, float]] = {}
        for row in _read(path):
            if (
                row["framework"] != framework
                or row["kernel_source"] != kernel
                or row["op_name"] != "all_reduce"
                or row["allreduce_dtype"] != "bfloat16"
            ):
                continue
            sizes = by_gpus.setdefault(int(row["num_gpus"]), {})
            size = 2 * int(row["message_size"])
            sizes[size] = min(sizes.get(size, np.inf), float(row["latency"]) * 1e-3)
        complete = {gpus: s for gpus, s in by_gpus.items() if all(b in s for b in grid)}
        if not complete:
            continue
        return [
            {
                "device": hardware.name,
                "engine": engine,
                "engine_version": path.parent.name,
                "dtype": "bf16",
                "kernel_source": kernel,
                "file": str(path.relative_to(root.parent)),
                "latency_us_by_gpus": {
                    str(gpus): [float(f"{sizes[b] * 1e6:.4g}") for b in grid]
                    for gpus, sizes in sorted(complete.items())
                },
            }
        ]
    return []


def import_aiconfigurator(path: str | Path, *, version: str) -> dict:
    """The reduced kernel curves of an unpacked ``aiconfigurator_core`` package at ``path``."""
    root = Path(path)
    if (root / "aiconfigurator_core").is_dir():
        root = root / "aiconfigurator_core"
    if not (root / "systems" / "data").is_dir():
        raise ValueError(
            f"path ({path}) must be an unpacked aiconfigurator-core wheel (no systems/data folder)"
        )
    grouped, mla, prefill, gemm, context, bmm, decode = [], [], [], [], [], [], []
    for device in DEVICES:
        for engine in ENGINES:
            gemm += _gemm_curves(root, device, engine)
            bmm += _mla_bmm_curves(root, device, engine)
            context += _context_attention_curves(root, device, engine)
            grouped += _grouped_gemm_curves(root, device, engine)
            mla += _mla_curves(root, device, engine, "mla_decode")
            prefill += _mla_curves(root, device, engine, "mla_prefill")
    mla += flashmla_decode_curves()
    decode = [
        curve
        for device in DECODE_ATTENTION_DEVICES
        for engine in ENGINES
        for curve in _decode_attention_curves(root, device, engine)
    ]
    allreduce = [
        curve
        for device in ALLREDUCE_DEVICES
        for engine in ENGINES
        for curve in _custom_allreduce_curves(root, device, engine)
    ]
    return {
        "_source": f"{PACKAGE} {version} (PyPI wheel, NVIDIA, Apache-2.0): per-operator tables under "
        "aiconfigurator_core/systems/data; each curve names its file. Derived by autoparallel._kernel_import "
        "(efficiency = the cost model's ideal time / measured latency); silicon_sample.csv is never read. "
        "MLA decode curves of engine 'flashmla': DeepSeek's published FlashMLA figures (cost_model/data/flashmla_decode.json).",
        "_license": "Apache-2.0 (derived data; copyright NVIDIA CORPORATION & AFFILIATES for the measurements)",
        "kind": "fit_input",
        "tokens_per_expert_grid": TOKENS_PER_EXPERT_GRID.tolist(),
        "grouped_gemm": grouped,
        "mla_decode": mla,
        "mla_prefill": prefill,
        "mla_bmm_tokens": list(MLA_BMM_TOKENS),
        "mla_bmm": bmm,
        "gemm_m_grid": GEMM_M_GRID.tolist(),
        "gemm_nk_grid": list(GEMM_NK_GRID),
        "gemm": gemm,
        "context_attention_tokens": list(ATTENTION_TOKENS),
        "context_attention": context,
        "decode_attention_tokens": list(DECODE_ATTENTION_TOKENS),
        "decode_attention": decode,
        "deepep_low_latency": fit_deepep_low_latency(root),
        "custom_allreduce_message_bytes": [int(b) for b in ALL_REDUCE_MESSAGE_BYTES],
        "custom_allreduce": allreduce,
    }


def write_kernel_curves(path: str | Path, *, output: str | Path, version: str) -> dict:
    """Import and write the curves as JSON; returns them."""
    curves = import_aiconfigurator(path, version=version)
    dump_kernel_curves(curves, output=output)
    return curves


def dump_kernel_curves(curves: dict, *, output: str | Path) -> None:
    """Write ``curves`` as the shipped JSON layout."""
    text = json.dumps(curves, indent=1)
    # one line per list of numbers: the file stays small and a re-import diffs point by point
    text = re.sub(
        r"\[\s*([-0-9.e,\s]+?)\s*\]",
        lambda m: "[" + " ".join(m.group(1).split()) + "]",
        text,
    )
    Path(output).write_text(text + "\n")


#: DeepEP low-latency tables measured on 1-8 nodes of 8 GPUs (hidden 7168, top-8 of 256 experts).
DEEPEP_LOW_LATENCY_TABLE = "h200_sxm/comm/sglang/0.5.6.post2/wideep_deepep_ll_perf.parquet"
_DEEPEP_GRID = {
    "latency_s": np.linspace(0.0, 40e-6, 81),
    "nvlink_efficiency": np.linspace(0.05, 1.0, 96),
    "rdma_efficiency": np.linspace(0.05, 1.2, 116),
}


def _deepep_points(rows: list[dict], *, direction: str) -> np.ndarray:
    """(nodes, intra bytes, inter bytes, seconds) per row, the bytes as the cost model counts them
    (``cost_model._kernel_curves.expert_all_to_all_bytes``: FP8 dispatch, BF16 combine)."""
    element = {"dispatch": 1.0, "combine": 2.0}[direction]
    points = []
    for row in rows:
        if (row["hidden_size"], row["num_topk"], row["num_experts"]) != (7168, 8, 256):
            continue
        nodes = int(row["node_num"])
        intra, inter = expert_all_to_all_bytes(
            rank_tokens=float(row["num_token"]),
            hidden_size=7168,
            element_bytes=element,
            copies=8.0,
            ep=8.0 * nodes,
            local=8.0,
            node_dedup=False,
        )
        points.append(
            (
                nodes,
                float(intra),
                float(inter),
                float(row[f"{direction}_avg_t_us"]) * 1e-6,
            )
        )
    return np.array(points)


def _fit_deepep(points: np.ndarray, hardware_links) -> tuple[np.ndarray, np.ndarray]:
    """Grid least squares on log(predicted / measured) of ``deepep_low_latency_s``; returns the
    parameters and the relative errors."""
    grid = np.stack(np.meshgrid(*_DEEPEP_GRID.values(), indexing="ij"), -1).reshape(-1, 3)
    intra_bw, inter_bw = hardware_links
    predicted = grid[:, :1] + np.maximum(
        points[None, :, 1] / (intra_bw * grid[:, 1:2]),
        points[None, :, 2] / (inter_bw * grid[:, 2:3]),
    )
    best = grid[np.argmin((np.log(predicted / points[None, :, 3]) ** 2).sum(axis=1))]
    fitted = best[0] + np.maximum(
        points[:, 1] / (intra_bw * best[1]), points[:, 2] / (inter_bw * best[2])
    )
    return best, fitted / points[:, 3] - 1.0


def fit_deepep_low_latency(root: Path) -> dict:
    """DeepEP low-latency dispatch / combine: a fixed latency plus the slower tier's bytes over
    its preset peak bandwidth times a fitted efficiency, fitted on the H200 operator table; with
    each multi-node count held out in turn (the single-node points alone fix the NVLink term)."""
    path = root / "systems" / "data" / DEEPEP_LOW_LATENCY_TABLE
    if not path.exists():
        return {}
    cluster = get_preset("dgx-h200")
    links = (
        cluster.intra_node.bandwidth_bytes_per_s,
        cluster.inter_node.bandwidth_bytes_per_s,
    )
    rows = _read(path)
    fits = {}
    for direction in ("dispatch", "combine"):
        points = _deepep_points(rows, direction=direction)
        best, errors = _fit_deepep(points, links)
        held_out = {}
        for nodes in (2, 4, 8):
            kept, out = points[points[:, 0] != nodes], points[points[:, 0] == nodes]
            params, _ = _fit_deepep(kept, links)
            predicted = params[0] + np.maximum(
                out[:, 1] / (links[0] * params[1]), out[:, 2] / (links[1] * params[2])
            )
            held_out[str(nodes)] = round(float(np.mean(np.abs(predicted / out[:, 3] - 1.0))), 3)
        fits[direction] = {
            **{
                name: round(float(value), 9 if name == "latency_s" else 3)
                for name, value in zip(_DEEPEP_GRID, best)
            },
            "points": len(points),
            "mean_abs_error": round(float(np.mean(np.abs(errors))), 3),
            "max_abs_error": round(float(np.max(np.abs(errors))), 3),
            "held_out_node_count_mean_abs_error": held_out,
        }
    return {
        "file": f"aiconfigurator_core/systems/data/{DEEPEP_LOW_LATENCY_TABLE}",
        "preset": "dgx-h200",
        **fits,
    }
