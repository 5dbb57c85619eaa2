"""Shared vocabulary of the cost tables: memory parts and the ``reason`` codes.

``MEMORY_PARTS`` names the ``memory.<part>`` columns (and the parts of
``CostBreakdown.memory_bytes``); ``REASON_CODES`` the codes of the ``reason`` column, 0 feasible,
then the memory part to blame (``memory_reason``), then other reasons a row is infeasible.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

#: Parts of ``memory.<part>`` columns and of ``CostBreakdown.memory_bytes``, both halves.
MEMORY_PARTS: tuple[str, ...] = (
    "weights",
    "gradients",
    "optimizer_states",
    "activations",
    "kv_cache",
    "comm_buffers",
    "fragmentation",
)
#: ``reason`` column codes: 0 feasible; 1..7 the memory part that is largest when memory does
#: not fit (``MEMORY_PARTS[code - 1]``); further codes for other reasons a row is infeasible.
REASON_CODES: dict[str, int] = {
    "feasible": 0,
    **{part: index + 1 for index, part in enumerate(MEMORY_PARTS)},
    "batch_not_divisible": 8,
    "ttft_slo": 9,
    "tpot_slo": 10,
    "no_batch_fits": 11,
}
REASON_LABELS: dict[int, str] = {code: label for label, code in REASON_CODES.items()}


def memory_reason(*, memory: Mapping[str, np.ndarray], capacity_bytes: float) -> np.ndarray:
    """Reason code per row: 0 if the parts fit in ``capacity_bytes``, else 1 + index of the
    largest ``MEMORY_PARTS`` part (the one to blame in ``InfeasiblePlanError``)."""
    parts = [np.asarray(memory.get(part, 0.0), dtype=np.float64) for part in MEMORY_PARTS]
    shape = np.broadcast_shapes(*(part.shape for part in parts))
    stacked = np.stack([np.broadcast_to(part, shape) for part in parts])
    total = stacked.sum(axis=0)
    return np.where(total <= capacity_bytes, 0, 1 + np.argmax(stacked, axis=0))
