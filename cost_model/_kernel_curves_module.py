"""An attention layer's whole module in prefill at its measured latency (``dsa_prefill_module`` and
``mla_prefill_module`` of ``data/kernel_curves.json``, imported by
``autoparallel._kernel_import_prefill_module`` from the serving engines' aiconfigurator-core
tables: DeepSeek Sparse Attention's ``dsa_context_module``, MLA's ``mla_context_module``).

One curve per device, engine and architecture: milliseconds of one layer's module (its
projections, a DSA layer's indexer, the attention) on one rank, by query heads per rank, prompts
per batch and prompt length. Between grid points the latency is interpolated in the logs; head
counts outside a curve's are held at its ends; a batch past the grid, or a fraction of a prompt,
costs in proportion to the prompts; lengths past the grid grow as the last segment does (a power
of the length between 1 and 2). Only the serving engine's own curve prices its rows, and only a
model of the measured shape (``module_shape``: hidden size, MLA ranks and head dims, indexer): a
device, engine, architecture or shape without one returns None and the caller keeps its pricing
(``ref-3t-moe``, DeepSeek-V3's architecture at hidden size 8192, is not DeepSeek-V3's module).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from cost_model._kernel_curves import (
    DEVICE_ALIASES,
    _grid_position,
    _log_bracket,
    kernel_curves,
)

__all__ = ["MODULE_KINDS", "has_prefill_module", "module_shape", "prefill_module_s"]

#: Curve kinds: DeepSeek Sparse Attention layers and (dense) MLA layers.
MODULE_KINDS = ("dsa_prefill_module", "mla_prefill_module")


#: The fields of a model an attention module's latency depends on besides its query heads.
_SHAPE_FIELDS = (
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "indexer_heads",
    "indexer_head_dim",
    "topk_tokens",
)


def module_shape(model) -> dict[str, int]:
    """What a measured attention module fixes of ``model`` (a ``ModelSpec``): its hidden size,
    MLA ranks and head dims and DSA indexer; the query heads are a curve's axis."""
    attention = model.attention
    shape = {"hidden_size": int(model.hidden_size)}
    for field in _SHAPE_FIELDS:
        value = getattr(attention, field)
        shape[field] = 0 if value is None else int(value)
    return shape


def _grids() -> tuple[np.ndarray, np.ndarray]:
    """Prompts per batch and tokens per prompt of the module curves."""
    data = kernel_curves()
    return (
        np.asarray(data["prefill_module_batch_grid"], dtype=np.float64),
        np.asarray(data["prefill_module_tokens_grid"], dtype=np.float64),
    )


@lru_cache(maxsize=64)
def _table(
    kind: str,
    device_name: str,
    engine: str | None,
    architecture: str | None,
    shape: tuple[tuple[str, int], ...],
) -> tuple[np.ndarray, np.ndarray] | None:
    """(head counts, log seconds (heads, batches, tokens)) of the engine's curve for the device,
    architecture and model shape, None without one."""
    name = DEVICE_ALIASES.get(device_name, device_name)
    for curve in kernel_curves().get(kind, []):
        if (curve["device"], curve["engine"], curve["architecture"]) == (
            name,
            engine,
            architecture,
        ) and tuple(sorted(curve["shape"].items())) == shape:
            grids = curve["latency_ms_by_heads"]
            heads = np.array(sorted(float(h) for h in grids))
            rows = [grids[str(int(h))] for h in heads]
            return heads, np.log(np.array(rows, dtype=np.float64) * 1e-3)
    return None


def _module_log_s(table: tuple[np.ndarray, np.ndarray], heads, batch, tokens) -> np.ndarray:
    """Log seconds of one curve at (heads, batch, tokens) (module docstring)."""
    head_grid, values = table
    batch_grid, token_grid = _grids()
    batch = np.maximum(batch, 1e-12)
    h0, h1, hw = _log_bracket(heads, head_grid)
    bi, bw = _grid_position(np.maximum(batch, 1.0), batch_grid)
    ti, tw = _grid_position(np.maximum(tokens, 1.0), token_grid)

    def at(h, b):  # log seconds at one head and batch index, interpolated over tokens
        low, high = values[h, b, ti], values[h, b, ti + 1]
        inside = (1.0 - tw) * low + tw * high
        past = np.log(np.maximum(tokens, 1.0) / token_grid[-1])
        last = values[h, b, -1] - values[h, b, -2]
        slope = np.clip(last / np.log(token_grid[-1] / token_grid[-2]), 1.0, 2.0)
        return inside + np.where(past > 0, slope * past, 0.0)

    def over_batch(h):
        return (1.0 - bw) * at(h, bi) + bw * at(h, bi + 1)

    log_s = (1.0 - hw) * over_batch(h0) + hw * over_batch(h1)
    beyond = np.log(np.maximum(batch, 1.0) / batch_grid[-1])
    return log_s + np.maximum(beyond, 0.0) + np.minimum(np.log(batch), 0.0)


def has_prefill_module(
    *, kind: str, device_name: str, engine: str | None, architecture: str | None, shape: dict
) -> bool:
    """Whether the serving engine's ``kind`` curve covers the device, architecture and shape."""
    key = tuple(sorted(shape.items()))
    return _table(kind, device_name, engine, architecture, key) is not None


def prefill_module_s(
    *,
    kind: str,
    device_name: str,
    engine: str | None,
    architecture: str | None,
    shape: dict[str, int],
    heads,
    batch,
    new_tokens,
    cached_tokens,
) -> np.ndarray | None:
    """Seconds of one layer's attention module of ``kind`` on one rank of ``heads`` query heads
    over a prefill pass of ``batch`` prompts of ``new_tokens`` after ``cached_tokens`` cached ones
    each, (n,); None unless the serving engine's curve covers the device and the model's
    architecture and ``shape`` (``module_shape``). A fresh prompt takes the measured module; a chunk after a cached prefix the
    module's growth from the prefix to the whole prompt plus its cost at one token (the fixed
    part of a pass): cumulative work, less what the prefix already did."""
    if kind not in MODULE_KINDS:
        raise ValueError(f"kind ({kind!r}) must be one of {MODULE_KINDS}")
    table = _table(kind, device_name, engine, architecture, tuple(sorted(shape.items())))
    if table is None:
        return None
    heads, batch, new, cached = np.broadcast_arrays(
        *(np.asarray(v, dtype=np.float64) for v in (heads, batch, new_tokens, cached_tokens))
    )
    whole = np.exp(_module_log_s(table, heads, batch, cached + new))
    prefix = np.exp(_module_log_s(table, heads, batch, np.maximum(cached, 1.0)))
    fixed = np.exp(_module_log_s(table, heads, batch, np.ones_like(new)))
    return np.where(cached > 0, np.maximum(whole - prefix, 0.0) + fixed, whole)
