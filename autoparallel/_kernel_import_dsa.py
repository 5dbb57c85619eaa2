"""The DSA lightning indexer's decode latency from aiconfigurator-core's ``sparse_attention`` tables.

DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5; arXiv:2512.02556 sec. 2.1) adds an indexer to
every MLA layer: its query and key projections, the FP8 scores of every cached key, and the top-k
selection of the keys the sparse attention then reads. SGLang's tables time one decode step of the
whole attention module twice, with the indexer (``dsa_generation_module``) and without it
(``dsa_generation_module_skip_indexer``: the sparse MLA attends the same keys), for the GLM-5
family's layer (64 query heads, indexer 32 heads x 128 dims, top 2048), each per-rank head count,
KV-cache dtype, GEMM dtype and attention kernel. The indexer's latency is the difference of two
rows alike in all of these (a GLM-5.x checkpoint with the indexer and one without; the family's
checkpoints share every dimension), by sequences and context length: the median over the pairs at
each point. It is kept as measured (microseconds) on the grids ``DSA_BATCH_GRID`` x
``DSA_CONTEXT_GRID`` (log-log interpolated between the measured lengths). The tables measure a
triangle of (sequences x context) up to a few hundred thousand cached tokens a step; past a
batch's longest measured context its latency grows at the marginal cost per cached token and
sequence measured between its two longest contexts (``_grid_curve``), and the curve is made
non-decreasing in sequences and in context.

Only the decode step is imported here: the context-phase tables (``dsa_context_module*``) mix
dense and sparse prefill kernels between the two rows of a pair, and their differences are not
monotone in the prompt length. Prefill takes the whole module as the tables time it instead
(``autoparallel._kernel_import_prefill_module``).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

from autoparallel._kernel_import_tables import _latest_tables, _read, measured_by
from topology import get_preset

#: Sequences per decode step and cached tokens per sequence of the curves: 2x and 4x apart.
DSA_BATCH_GRID = tuple(2**i for i in range(11))
DSA_CONTEXT_GRID = tuple(4**i for i in range(11))
#: The indexer the tables measure (the GLM-5 family's config.json: index_n_heads, index_head_dim).
DSA_INDEXER_SHAPE = {"index_heads": 32, "index_head_dim": 128}
#: Device folders whose SGLang tables are read -> preset.
DSA_DEVICES = {
    "h100_sxm": "dgx-h100",
    "h200_sxm": "dgx-h200",
    "b200_sxm": "dgx-b200",
    "gb200": "gb200-nvl72",
    "gb300": "gb300-nvl72",
}
_WITH, _WITHOUT = "sglang_dsa_indexer_", "sglang_dsa_skip_indexer_"


def _pair_key(row: dict, prefix: str) -> tuple:
    return (
        int(row["num_heads"]),
        int(row["tp_size"]),
        str(row["kv_cache_dtype"]),
        str(row["gemm_type"]),
        str(row["kernel_source"])[len(prefix) :],
        int(row["batch_size"]),
        int(row["step"]),
    )


def _medians(rows: list[dict]) -> dict[tuple[int, int], float]:
    """Median indexer latency (us) at each measured (sequences, context)."""
    with_indexer, without = {}, {}
    for row in rows:
        if "GLM-5" not in str(row["model"]):
            continue
        source = str(row["kernel_source"])
        if row["op_name"] == "dsa_generation_module" and source.startswith(_WITH):
            with_indexer[_pair_key(row, _WITH)] = float(row["latency"])
        elif row["op_name"] == "dsa_generation_module_skip_indexer" and source.startswith(_WITHOUT):
            without[_pair_key(row, _WITHOUT)] = float(row["latency"])
    by_point: dict[tuple[int, int], list[float]] = {}
    for key, latency in with_indexer.items():
        if key in without:
            by_point.setdefault((key[5], key[6]), []).append((latency - without[key]) * 1e3)
    return {point: statistics.median(values) for point, values in by_point.items()}


def _grid_curve(medians: dict[tuple[int, int], float]) -> np.ndarray | None:
    """(sequences, context) latency on the curve grids; None unless every batch of the grid and
    two contexts of one sequence are measured. Within a batch's measured contexts the latency
    is interpolated in the logs; below them it is the shortest's (the step's fixed cost); past
    the longest it grows at the batch's measured marginal cost per cached token and sequence
    (between its two longest contexts; a batch measured at one context takes the next smaller
    batch's)."""
    contexts = np.array(DSA_CONTEXT_GRID, dtype=np.float64)
    table = np.full((len(DSA_BATCH_GRID), contexts.size), np.nan)
    rate = None
    for i, batch in enumerate(DSA_BATCH_GRID):
        points = sorted((c, v) for (b, c), v in medians.items() if b == batch and v > 0)
        if not points or (rate is None and len(points) < 2):
            return None
        x = np.array([c for c, _ in points], dtype=np.float64)
        y = np.array([v for _, v in points])
        if len(points) >= 2:
            rate = max(y[-1] - y[-2], 0.0) / (batch * (x[-1] - x[-2]))
        inside = contexts <= x[-1]
        table[i, inside] = np.exp(
            np.interp(np.log(np.maximum(contexts[inside], x[0])), np.log(x), np.log(y))
        )
        table[i, ~inside] = y[-1] + rate * batch * (contexts[~inside] - x[-1])
    return np.maximum.accumulate(np.maximum.accumulate(table, axis=0), axis=1)


def dsa_indexer_curves(root: Path) -> list[dict]:
    """One decode-indexer curve per device of ``DSA_DEVICES`` whose newest SGLang table pairs
    rows with and without the indexer (module docstring)."""
    curves = []
    for device, preset in DSA_DEVICES.items():
        hardware = get_preset(preset).device
        for path in _latest_tables(
            root, device, "sparse_attention", "sglang", "dsa_generation_module_perf.parquet"
        ):
            table = _grid_curve(_medians(_read(path)))
            if table is None:
                continue
            curves.append(
                {
                    **measured_by(hardware.name, "sglang", path),
                    **DSA_INDEXER_SHAPE,
                    "file": str(path.relative_to(root.parent)),
                    "latency_us_by_batch": {
                        str(b): [float(f"{v:.3g}") for v in row]
                        for b, row in zip(DSA_BATCH_GRID, table)
                    },
                }
            )
            break
    return curves
