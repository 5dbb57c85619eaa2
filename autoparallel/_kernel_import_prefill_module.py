"""Attention modules' prefill latency from aiconfigurator-core's module tables.

Two kinds of attention layer are timed whole in prefill, for one fresh prompt batch (``step`` 0:
no cached prefix) on one GPU holding a rank's query heads (``num_heads``: the model's heads over
the attention tensor parallelism), by sequences (``batch_size``) and prompt length (``isl``):

* ``dsa_prefill_module``: a DeepSeek Sparse Attention layer (DeepSeek-V3.2, GLM-5;
  arXiv:2512.02556 sec. 2.1), ``sparse_attention/<engine>/<version>/dsa_context_module_perf``
  (TensorRT-LLM, vLLM, SGLang; ``DeepseekV32ForCausalLM``, ``GlmMoeDsaForCausalLM``): its MLA
  projections, the lightning indexer (its projections, the FP8 scores of every earlier key, the
  top-k selection) and the attention over the selected keys, dense while a prompt is no longer
  than the top-k. Every engine's table holds the same order of latency (B200, 16 heads a rank,
  one 8,192-token prompt: 5.1-6.3 ms a layer), several times a roofline of the same work.
* ``mla_prefill_module``: a DeepSeek-V3 MLA layer, ``mla/<engine>/<version>/
  mla_context_module_perf`` (TensorRT-LLM, vLLM; ``DeepseekV3ForCausalLM``; SGLang's tables
  time the attention kernel alone, ``context_mla_perf``): its projections and the explicit-form
  attention (vLLM's rows of a BF16 MLA computation, ``mla_dtype``). vLLM 0.24.0's B200 table was
  re-collected with the engine's fused norms and anchored at -9% against an in-engine per-layer
  trace (its ``collection_meta.yaml``).

vLLM 0.24.0's DSA tables (provenance ``legacy``: the module run eagerly outside the engine) hold a
launch-bound floor of about 1.5 ms a layer at short prompts on x86 hosts (3 ms on Grace) that
TensorRT-LLM's (0.08 ms) and SGLang's (0.8 ms) do not show: their short-prompt values are an upper
bound of the engine's compiled execution; from 4K tokens on the three engines agree.

Kept: the rows with block-scaled FP8 projections (``fp8_block``, the released checkpoints'
weights) and a BF16 KV cache, the median over the checkpoints of one architecture and over the
kernels an engine measured at one point (SGLang's dense and sparse DSA paths, vLLM's attention
backends), in milliseconds on the grids ``PREFILL_MODULE_HEADS`` x ``PREFILL_MODULE_BATCH`` x
``PREFILL_MODULE_TOKENS``. The tables measure a triangle (fewer long prompts in a batch); a cell
past a batch's longest measured prompt takes the largest measured smaller batch at that length
scaled by the sequences (each prompt's attention is its own), and one past every measured length
grows as the last two measured lengths do (a power of the length between 1 and 2: linear work
and quadratic scores). A module never takes less for more prompts or a longer one: each grid is
made non-decreasing along both (the tables' short prompts are launch-bound, and their noise
crosses). Other projection dtypes and an FP8 KV cache change the module by up to ~30% in the
tables (B200 DSA; mostly under 15%) and are priced on these curves.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

from autoparallel._catalog import get_model
from autoparallel._kernel_import_dsa import DSA_DEVICES
from autoparallel._kernel_import_tables import ENGINES, _latest_tables, _read, measured_by
from cost_model import module_shape
from topology import get_preset

#: Query heads per rank, prompts per batch and tokens per prompt of the stored grids.
PREFILL_MODULE_HEADS = (8, 16, 32, 64, 128)
PREFILL_MODULE_BATCH = (1, 4, 16, 64)
PREFILL_MODULE_TOKENS = (1, 256, 1024, 2048, 4096, 8192, 16384, 32768)
#: Architecture of a table -> the catalog model whose shape (``cost_model.module_shape``) its
#: checkpoints share; a table of another architecture is not kept.
MEASURED_MODELS = {
    "DeepseekV3ForCausalLM": "deepseek-v3",
    "DeepseekV32ForCausalLM": "deepseek-v3.2",
    "GlmMoeDsaForCausalLM": "glm-5",
}
#: Curve kind -> (operator folder, table, op_name of the kept rows).
PREFILL_MODULE_TABLES = {
    "dsa_prefill_module": (
        "sparse_attention",
        "dsa_context_module_perf.parquet",
        "dsa_context_module",
    ),
    "mla_prefill_module": ("mla", "mla_context_module_perf.parquet", "mla_context_module"),
}


def _cells(rows: list[dict], op_name: str) -> dict[str, dict[tuple[int, int, int], float]]:
    """Median latency (us) per architecture and (heads, batch, tokens) of the kept rows."""
    points: dict[str, dict[tuple[int, int, int], list[float]]] = {}
    for row in rows:
        if (
            row["op_name"] != op_name
            or row["gemm_type"] != "fp8_block"
            or row["kv_cache_dtype"] != "bfloat16"
            or row.get("mla_dtype", "bfloat16") != "bfloat16"
            or int(row["step"]) != 0
        ):
            continue
        key = (int(row["num_heads"]), int(row["batch_size"]), int(row["isl"]))
        points.setdefault(str(row["architecture"]), {}).setdefault(key, []).append(
            float(row["latency"]) * 1e3
        )
    return {
        arch: {key: statistics.median(values) for key, values in cells.items()}
        for arch, cells in points.items()
    }


def _interpolate(cells: dict[tuple[int, int], float], batch: int, tokens: int) -> float | None:
    """One batch's latency at ``tokens`` from its measured lengths: interpolated in the logs,
    held at the shortest below them, grown as the last two measured lengths past them; None
    unless two lengths are measured."""
    measured = sorted((t, v) for (b, t), v in cells.items() if b == batch and v > 0)
    if len(measured) < 2:
        return None
    x = np.log([t for t, _ in measured])
    y = np.log([v for _, v in measured])
    point = np.log(max(tokens, measured[0][0]))
    if point <= x[-1]:
        return float(np.exp(np.interp(point, x, y)))
    slope = float(np.clip((y[-1] - y[-2]) / (x[-1] - x[-2]), 1.0, 2.0))
    return float(np.exp(y[-1] + slope * (point - x[-1])))


def _heads_grid(cells: dict[tuple[int, int], float]) -> list[list[float]] | None:
    """(batch, tokens) latencies (ms) of one head count on the grids (module docstring); None unless
    one prompt is measured at two lengths."""
    longest = {b: max((t for (bb, t) in cells if bb == b), default=0) for b in PREFILL_MODULE_BATCH}
    grid = []
    for batch in PREFILL_MODULE_BATCH:
        row = []
        for tokens in PREFILL_MODULE_TOKENS:
            own = _interpolate(cells, batch, tokens) if tokens <= longest[batch] else None
            if own is None:
                smaller = [b for b in PREFILL_MODULE_BATCH if b < batch and tokens <= longest[b]]
                base = smaller[-1] if smaller else 1
                scaled = _interpolate(cells, base, tokens)
                own = None if scaled is None else scaled * batch / base
            if own is None:
                return None
            row.append(own)
        grid.append(row)
    table = np.maximum.accumulate(np.maximum.accumulate(np.array(grid), axis=0), axis=1)
    return [[float(f"{v / 1e3:.3g}") for v in row] for row in table]


def prefill_module_curves(root: Path, kind: str) -> list[dict]:
    """One ``kind`` curve (``PREFILL_MODULE_TABLES``) per device of ``DSA_DEVICES``, engine and
    architecture, from the newest table that measures the architecture (module docstring), over
    the head counts it measures."""
    folder, table, op_name = PREFILL_MODULE_TABLES[kind]
    curves = []
    for device, preset in DSA_DEVICES.items():
        hardware = get_preset(preset).device
        for engine in ENGINES:
            covered: set[str] = set()
            for path in _latest_tables(root, device, folder, engine, table):
                for arch, cells in sorted(_cells(_read(path), op_name).items()):
                    grids = {}
                    for heads in PREFILL_MODULE_HEADS:
                        own = {(b, t): v for (h, b, t), v in cells.items() if h == heads}
                        grid = _heads_grid(own) if own else None
                        if grid is not None:
                            grids[str(heads)] = grid
                    if arch in covered or not grids or arch not in MEASURED_MODELS:
                        continue
                    covered.add(arch)
                    curves.append(
                        {
                            **measured_by(hardware.name, engine, path),
                            "architecture": arch,
                            "shape": module_shape(get_model(MEASURED_MODELS[arch])),
                            "file": str(path.relative_to(root.parent)),
                            "latency_ms_by_heads": grids,
                        }
                    )
    return curves
