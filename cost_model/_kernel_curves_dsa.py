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

In prefill the whole DSA attention module is measured (``dsa_prefill_module``, imported by
``autoparallel._kernel_import_dsa_prefill`` from the engines' ``dsa_context_module`` tables):
milliseconds per layer by query heads per rank, prompts and prompt length, per device, engine and
architecture (``dsa_prefill_module_s``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from cost_model._kernel_curves import DEVICE_ALIASES, kernel_curves

__all__ = ["MEASURED_INDEXER", "dsa_indexer_decode_s", "dsa_prefill_module_s"]

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


# --- prefill: the whole attention module ------------------------------------------------------


def _prefill_grids() -> tuple[np.ndarray, np.ndarray]:
    """Prompts per batch and tokens per prompt of the prefill-module curves."""
    data = kernel_curves()
    return (
        np.asarray(data["dsa_prefill_batch_grid"], dtype=np.float64),
        np.asarray(data["dsa_prefill_tokens_grid"], dtype=np.float64),
    )


@lru_cache(maxsize=64)
def _prefill_tables(
    device_name: str, engine: str | None, architecture: str | None
) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """(head counts, log seconds (heads, batches, tokens)) of each curve for the device and
    architecture: the engine's own where it measured them, else every engine's."""
    name = DEVICE_ALIASES.get(device_name, device_name)
    curves = [
        c
        for c in kernel_curves().get("dsa_prefill_module", [])
        if c["device"] == name and c["architecture"] == architecture
    ]
    own = [c for c in curves if c["engine"] == engine]
    tables = []
    for curve in own or curves:
        grids = curve["latency_ms_by_heads"]
        heads = np.array(sorted(float(h) for h in grids))
        table = np.log(np.array([grids[str(int(h))] for h in heads], dtype=np.float64) * 1e-3)
        tables.append((heads, table))
    return tuple(tables)


def _log_position(values: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lower index and upper weight of ``values`` on ``grid`` (log scale, clamped to the grid)."""
    if grid.size == 1:
        return np.zeros(values.shape, dtype=int), np.zeros(values.shape)
    log_grid = np.log(grid)
    x = np.clip(np.log(values), log_grid[0], log_grid[-1])
    index = np.clip(np.searchsorted(log_grid, x) - 1, 0, grid.size - 2)
    return index, (x - log_grid[index]) / (log_grid[index + 1] - log_grid[index])


def _module_log_s(table: tuple[np.ndarray, np.ndarray], heads, batch, tokens) -> np.ndarray:
    """Log seconds of one curve at (heads, batch, tokens): interpolated in the logs; heads held
    at the measured range's ends, a batch past the grid or a fraction of a prompt in proportion
    to the prompts, tokens past the grid grown as its last segment (a power of 1 to 2)."""
    head_grid, values = table
    batch_grid, token_grid = _prefill_grids()
    batch = np.maximum(batch, 1e-12)
    hi, hw = _log_position(heads, head_grid)
    bi, bw = _log_position(np.maximum(batch, 1.0), batch_grid)
    ti, tw = _log_position(np.maximum(tokens, 1.0), token_grid)

    def at(h, b):  # log seconds at one head and batch index, interpolated over tokens
        low, high = values[h, b, ti], values[h, b, ti + 1]
        inside = (1.0 - tw) * low + tw * high
        past = np.log(np.maximum(tokens, 1.0) / token_grid[-1])
        last = values[h, b, -1] - values[h, b, -2]
        slope = np.clip(last / np.log(token_grid[-1] / token_grid[-2]), 1.0, 2.0)
        return inside + np.where(past > 0, slope * past, 0.0)

    def over_batch(h):
        return (1.0 - bw) * at(h, bi) + bw * at(h, bi + 1)

    log_s = (1.0 - hw) * over_batch(hi) + hw * over_batch(np.minimum(hi + 1, head_grid.size - 1))
    beyond = np.log(np.maximum(batch, 1.0) / batch_grid[-1])
    return log_s + np.maximum(beyond, 0.0) + np.minimum(np.log(batch), 0.0)


def dsa_prefill_module_s(
    *,
    device_name: str,
    engine: str | None,
    architecture: str | None,
    heads,
    batch,
    new_tokens,
    cached_tokens,
) -> np.ndarray | None:
    """Seconds of one DSA layer's attention module (projections, indexer, attention) on one rank
    of ``heads`` query heads over a prefill pass of ``batch`` prompts of ``new_tokens`` after
    ``cached_tokens`` cached ones each, (n,); None unless a curve covers the device and the
    model's architecture. A fresh prompt takes the measured module; a chunk after a cached
    prefix the module's growth from the prefix to the whole prompt plus its cost at one token
    (the fixed part of a pass): cumulative work, less what the prefix already did. Of several
    engines' curves (none of the engine's own) the fastest is taken."""
    tables = _prefill_tables(device_name, engine, architecture)
    if not tables:
        return None
    heads, batch, new, cached = np.broadcast_arrays(
        *(np.asarray(v, dtype=np.float64) for v in (heads, batch, new_tokens, cached_tokens))
    )
    best = None
    for table in tables:
        whole = np.exp(_module_log_s(table, heads, batch, cached + new))
        prefix = np.exp(_module_log_s(table, heads, batch, np.maximum(cached, 1.0)))
        fixed = np.exp(_module_log_s(table, heads, batch, np.ones_like(new)))
        seconds = np.where(cached > 0, np.maximum(whole - prefix, 0.0) + fixed, whole)
        best = seconds if best is None else np.minimum(best, seconds)
    return best
