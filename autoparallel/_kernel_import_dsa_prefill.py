"""The DSA attention module's prefill latency from aiconfigurator-core's ``sparse_attention`` tables.

A DeepSeek Sparse Attention layer (DeepSeek-V3.2, GLM-5; arXiv:2512.02556 sec. 2.1) in prefill
runs its MLA projections, the lightning indexer (its projections, the FP8 scores of every earlier
key, the top-k selection) and the attention over the selected keys; engines switch to a dense
kernel while a prompt is no longer than the top-k. ``dsa_context_module_perf`` times that whole
module for one fresh prompt batch (``step`` 0: no cached prefix) on one GPU holding a rank's query
heads (``num_heads``: the model's heads over the attention tensor parallelism), by sequences
(``batch_size``) and prompt length (``isl``), for TensorRT-LLM, vLLM and SGLang, per architecture
(``DeepseekV32ForCausalLM``, ``GlmMoeDsaForCausalLM``). Every engine's table holds the same
order of latency (B200, 16 heads a rank, one 8,192-token prompt: 5.1-6.3 ms a layer), several
times what a roofline of the indexer's scores and the sparse attention gives.

Kept: the rows with block-scaled FP8 projections (``fp8_block``, the released checkpoints'
weights) and a BF16 KV cache, the median over the checkpoints of one architecture and over the
kernels an engine measured at one point (SGLang's dense and sparse paths), in microseconds on the
grids ``DSA_PREFILL_HEADS`` x ``DSA_PREFILL_BATCH`` x ``DSA_PREFILL_TOKENS``. The tables measure a
triangle (fewer long prompts in a batch); a cell past a batch's longest measured prompt takes the
largest measured smaller batch at that length scaled by the sequences (each prompt's attention is
its own), and one past every measured length grows as the last two measured lengths do (a power
of the length between 1 and 2: linear work and the indexer's quadratic scores). A module never
takes less for more prompts or a longer one: each grid is made non-decreasing along both (the
tables' short prompts are launch-bound, and their noise crosses). Other projection
dtypes and an FP8 KV cache change the module by up to ~30% in the tables (B200; mostly under
15%) and are priced on these curves.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

from autoparallel._kernel_import_dsa import DSA_DEVICES
from autoparallel._kernel_import_tables import ENGINES, _latest_tables, _read, measured_by
from topology import get_preset

#: Query heads per rank, prompts per batch and tokens per prompt of the stored grids.
DSA_PREFILL_HEADS = (8, 16, 32, 64, 128)
DSA_PREFILL_BATCH = (1, 4, 16, 64)
DSA_PREFILL_TOKENS = (1, 256, 1024, 2048, 4096, 8192, 16384, 32768)
_TABLE = "dsa_context_module_perf.parquet"


def _cells(rows: list[dict]) -> dict[str, dict[tuple[int, int, int], float]]:
    """Median latency (us) per architecture and (heads, batch, tokens) of the kept rows."""
    points: dict[str, dict[tuple[int, int, int], list[float]]] = {}
    for row in rows:
        if (
            row["op_name"] != "dsa_context_module"
            or row["gemm_type"] != "fp8_block"
            or row["kv_cache_dtype"] != "bfloat16"
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
    longest = {b: max((t for (bb, t) in cells if bb == b), default=0) for b in DSA_PREFILL_BATCH}
    grid = []
    for batch in DSA_PREFILL_BATCH:
        row = []
        for tokens in DSA_PREFILL_TOKENS:
            own = _interpolate(cells, batch, tokens) if tokens <= longest[batch] else None
            if own is None:
                smaller = [b for b in DSA_PREFILL_BATCH if b < batch and tokens <= longest[b]]
                base = smaller[-1] if smaller else 1
                scaled = _interpolate(cells, base, tokens)
                own = None if scaled is None else scaled * batch / base
            if own is None:
                return None
            row.append(own)
        grid.append(row)
    table = np.maximum.accumulate(np.maximum.accumulate(np.array(grid), axis=0), axis=1)
    return [[float(f"{v / 1e3:.3g}") for v in row] for row in table]


def dsa_prefill_curves(root: Path) -> list[dict]:
    """One prefill-module curve per device of ``DSA_DEVICES``, engine and architecture, from the
    newest table that measures the architecture (module docstring), over the head counts it
    measures."""
    curves = []
    for device, preset in DSA_DEVICES.items():
        hardware = get_preset(preset).device
        for engine in ENGINES:
            covered: set[str] = set()
            for path in _latest_tables(root, device, "sparse_attention", engine, _TABLE):
                for arch, cells in sorted(_cells(_read(path)).items()):
                    grids = {}
                    for heads in DSA_PREFILL_HEADS:
                        own = {(b, t): v for (h, b, t), v in cells.items() if h == heads}
                        grid = _heads_grid(own) if own else None
                        if grid is not None:
                            grids[str(heads)] = grid
                    if arch in covered or not grids:
                        continue
                    covered.add(arch)
                    curves.append(
                        {
                            **measured_by(hardware.name, engine, path),
                            "architecture": arch,
                            "file": str(path.relative_to(root.parent)),
                            "latency_ms_by_heads": grids,
                        }
                    )
    return curves
