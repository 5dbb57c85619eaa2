"""The DSA lightning indexer's decode step at its measured latency (``dsa_indexer_decode`` of
``data/kernel_curves.json``, imported by ``autoparallel._kernel_import_dsa`` from SGLang's
aiconfigurator-core tables: the attention module with the indexer less the same module without).

One curve per device: microseconds by sequences per step and cached tokens per sequence, for the
GLM-5 family's indexer (32 heads x 128 dims). It holds the indexer's projections, its FP8 scores
of every cached key and the top-k selection, which a roofline of the scores and the key reads
leaves out: measured at 1M cached tokens the step takes tens of times that roofline. Between grid
points the latency is interpolated in the logs; beyond the grids it grows in proportion to the
sequences or the context. An indexer of more heads adds its extra heads' scores at the roofline
(the caller's), one of other head dims or a device without a curve returns None.

In prefill the whole DSA attention module is measured instead (``_kernel_curves_module``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from cost_model._kernel_curves import DEVICE_ALIASES, kernel_curves

__all__ = ["MEASURED_INDEXER", "dsa_indexer_decode_s"]

#: The indexer shape the curves measure: heads, head dims.
MEASURED_INDEXER = (32, 128)


@lru_cache(maxsize=16)
def _table(device_name: str) -> np.ndarray | None:
    """log seconds (batches, contexts) of the device's curve, None without one."""
    name = DEVICE_ALIASES.get(device_name, device_name)
    data = kernel_curves()
    for curve in data.get("dsa_indexer_decode", []):
        if curve["device"] == name:
            rows = [curve["latency_us_by_batch"][str(b)] for b in data["dsa_indexer_batch_grid"]]
            return np.log(np.array(rows, dtype=np.float64) * 1e-6)
    return None


def _position(values: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lower grid index, the weight of the upper point, and the log distance past the grid's end."""
    log_grid = np.log(grid)
    x = np.log(np.maximum(values, grid[0]))
    inside = np.minimum(x, log_grid[-1])
    index = np.clip(np.searchsorted(log_grid, inside) - 1, 0, grid.size - 2)
    weight = (inside - log_grid[index]) / (log_grid[index + 1] - log_grid[index])
    return index, weight, x - inside


def dsa_indexer_decode_s(*, device_name: str, heads: int, head_dim: int, batch, context):
    """Seconds of one decode step's indexer on one rank, (n,): ``batch`` sequences (each new token
    one), ``context`` cached tokens per sequence. None unless a curve covers the device and the
    indexer's head dims are the measured ones; an indexer of fewer heads than measured takes the
    measured latency (an upper bound), of more the caller adds their scores."""
    if head_dim != MEASURED_INDEXER[1]:
        return None
    table = _table(device_name)
    if table is None:
        return None
    data = kernel_curves()
    batch, context = np.broadcast_arrays(
        np.asarray(batch, dtype=np.float64), np.asarray(context, dtype=np.float64)
    )
    bi, bw, b_past = _position(batch, np.asarray(data["dsa_indexer_batch_grid"], dtype=float))
    ci, cw, c_past = _position(context, np.asarray(data["dsa_indexer_context_grid"], dtype=float))
    low = (1.0 - cw) * table[bi, ci] + cw * table[bi, ci + 1]
    high = (1.0 - cw) * table[bi + 1, ci] + cw * table[bi + 1, ci + 1]
    return np.exp((1.0 - bw) * low + bw * high + b_past + c_past)
