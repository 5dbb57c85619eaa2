"""Gated DeltaNet kernels at their measured latency: the causal convolution and the recurrence of
one linear-attention layer on one rank (``linear_attention`` of ``data/kernel_curves.json``,
imported by ``autoparallel._kernel_import_linear`` from aiconfigurator-core's tables).

A curve holds, per per-rank shape (key heads, value heads; 128-dim heads), the latency of both
kernels by sequences (decode: one new token each) and by sequences x prompt tokens (prefill), each
interpolated in the logs between its grid points.
A shape between two measured ones of the same value/key ratio is interpolated in the logs of the
value heads (the state each head carries, ``d_k x d_v``, is the work); beyond the measured heads,
sequences or prompt lengths the latency grows in proportion (the kernels are saturated at the
grids' ends). A device without a curve, other head dimensions and Mamba-2 layers return None:
the caller keeps its roofline.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from cost_model._kernel_curves import DEVICE_ALIASES, _engine_curves, kernel_curves

__all__ = ["gated_deltanet_time_s", "gated_deltanet_measured"]

_HEAD_DIMS = (128, 128)


@lru_cache(maxsize=64)
def _tables(device_name: str, engine: str | None) -> tuple[tuple[np.ndarray, ...], ...]:
    """Per curve of the device (the engine's own, else every engine's): key heads, value heads,
    decode latency (shapes, batches) and prefill latency (shapes, batches, tokens), seconds."""
    name = DEVICE_ALIASES.get(device_name, device_name)
    data = kernel_curves()
    curves = [c for c in data.get("linear_attention", []) if c["device"] == name]
    out = []
    for curve in _engine_curves(curves, engine):
        if tuple(curve["head_dims"]) != _HEAD_DIMS:
            continue
        shapes = sorted(curve["shapes"], key=lambda s: (s["key_heads"], s["value_heads"]))
        keys = np.array([s["key_heads"] for s in shapes], dtype=np.float64)
        values = np.array([s["value_heads"] for s in shapes], dtype=np.float64)
        decode = np.array([s["decode_us_by_batch"] for s in shapes]) * 1e-6
        batches = [str(b) for b in data["linear_attention_prefill_batch_grid"]]
        prefill = np.array([[s["prefill_us_by_batch"][b] for b in batches] for s in shapes]) * 1e-6
        out.append((keys, values, decode, prefill))
    return tuple(out)


def _grid(key: str) -> np.ndarray:
    return np.asarray(kernel_curves()[key], dtype=np.float64)


def _along(log_table: np.ndarray, grid: np.ndarray, where: np.ndarray) -> np.ndarray:
    """``log_table`` (..., grid) at ``where`` (rows of the leading axis alike), log-log
    interpolated and, past the grid's end, grown in proportion to ``where``."""
    log_grid = np.log(grid)
    x = np.log(np.maximum(where, grid[0]))
    inside = np.clip(x, log_grid[0], log_grid[-1])
    index = np.clip(np.searchsorted(log_grid, inside) - 1, 0, grid.size - 2)
    weight = (inside - log_grid[index]) / (log_grid[index + 1] - log_grid[index])
    low = np.take_along_axis(log_table, index[..., None], axis=-1)[..., 0]
    high = np.take_along_axis(log_table, index[..., None] + 1, axis=-1)[..., 0]
    return (1.0 - weight) * low + weight * high + np.maximum(x - log_grid[-1], 0.0)


def _shape_rows(keys, values, key_heads: float, value_heads: float) -> tuple[np.ndarray, float]:
    """Indices of the measured shapes of the value/key ratio nearest this one, ordered by value
    heads, and the log-value-heads position of this shape among them."""
    ratio = np.log(values / keys)
    nearest = np.abs(ratio - np.log(value_heads / key_heads))
    rows = np.flatnonzero(nearest <= nearest.min() + 1e-9)
    return rows[np.argsort(values[rows])], float(np.log(value_heads))


def _latency(table: np.ndarray, values: np.ndarray, rows: np.ndarray, log_v: float):
    """``table`` (shapes, ...) of the shapes ``rows`` at log value heads ``log_v``: interpolated in
    the logs between the two measured either side, in proportion beyond them."""
    log_values = np.log(values[rows])
    logs = np.log(table[rows])
    if rows.size == 1 or log_v <= log_values[0]:
        return logs[0] + (log_v - log_values[0]) * (log_v < log_values[0])
    if log_v >= log_values[-1]:
        return logs[-1] + (log_v - log_values[-1])
    i = int(np.searchsorted(log_values, log_v)) - 1
    w = (log_v - log_values[i]) / (log_values[i + 1] - log_values[i])
    return (1.0 - w) * logs[i] + w * logs[i + 1]


def gated_deltanet_measured(*, device_name: str, head_dims: tuple[int, int]) -> bool:
    """Whether a curve prices the Gated DeltaNet kernels of these head dims on the device."""
    return tuple(head_dims) == _HEAD_DIMS and bool(_tables(device_name, None))


def gated_deltanet_time_s(
    *,
    device_name: str,
    engine: str | None,
    key_heads,
    value_heads,
    head_dims: tuple[int, int],
    batch,
    new_tokens,
    decode: bool,
) -> np.ndarray | None:
    """Seconds of one Gated DeltaNet layer's convolution and recurrence on one rank, (n,): its
    per-rank ``key_heads`` and ``value_heads``, ``batch`` sequences of ``new_tokens`` each
    (prefill; decode: one token each). Where several engines measured the device and none is
    this engine, the fastest; None without a curve for the device and head dims."""
    if tuple(head_dims) != _HEAD_DIMS:
        return None
    tables = _tables(device_name, engine)
    if not tables:
        return None
    key_heads, value_heads, batch, new_tokens = np.broadcast_arrays(
        *(np.asarray(v, dtype=np.float64) for v in (key_heads, value_heads, batch, new_tokens))
    )
    batches, tokens = _grid("linear_attention_batch_grid"), _grid("linear_attention_tokens_grid")
    prefill_batches = _grid("linear_attention_prefill_batch_grid")
    best = np.full(batch.shape, np.inf)
    pairs = np.stack([key_heads.ravel(), value_heads.ravel()], axis=1)
    unique, inverse = np.unique(pairs, axis=0, return_inverse=True)
    inverse = inverse.reshape(batch.shape)
    for keys, values, decode_table, prefill_table in tables:
        seconds = np.empty(batch.shape)
        for u, (k, v) in enumerate(unique):
            rows, log_v = _shape_rows(keys, values, max(k, 1e-9), max(v, 1e-9))
            mask = inverse == u
            if decode:
                log_curve = _latency(decode_table, values, rows, log_v)
                curves = np.broadcast_to(log_curve, (int(mask.sum()), log_curve.size))
                seconds[mask] = np.exp(_along(curves, batches, batch[mask]))
            else:
                log_surface = _latency(prefill_table, values, rows, log_v)  # (batches, tokens)
                by_batch = _along(
                    np.broadcast_to(log_surface, (int(mask.sum()),) + log_surface.shape),
                    tokens,
                    new_tokens[mask][:, None],
                )
                seconds[mask] = np.exp(_along(by_batch, prefill_batches, batch[mask]))
        best = np.minimum(best, seconds)
    return best
