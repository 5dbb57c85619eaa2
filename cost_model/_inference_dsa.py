"""A DSA layer's prefill at its attention module's measured latency.

DeepSeek Sparse Attention layers (DeepSeek-V3.2, GLM-5) run, in prefill, their MLA projections,
the lightning indexer (projections, FP8 scores of every earlier key, top-k selection) and the
attention over the selected keys (dense while a prompt is no longer than the top-k). The engines'
operator tables time that whole module (``_kernel_curves_dsa.dsa_prefill_module_s``); where a
curve covers the device, the serving engine and the model's architecture, a prefill pass prices
each layer's attention block as the measured module: its projections leave the pass's GEMMs
(``_inference_passes._compute_time``), its core attention and indexer the roofline
(``_inference_compute._attention_time``), and its kernels pay no per-kernel floor on top
(``_inference_kernels._count_measured_kernels``). With context parallelism, which the tables
do not measure, each rank takes its share of the prompt's queries and so ``1/cp`` of the module
(its projections, scores and attention; the exchange of keys is priced with the pass's
communication). Decode keeps its pricing (the measured indexer step and MLA decode).
"""

from __future__ import annotations

import numpy as np

from cost_model import _inference_ops as ops
from cost_model._inference_setup import _Setup
from cost_model._kernel_curves_dsa import dsa_prefill_module_s

__all__ = ["MODULE_KERNELS", "dsa_module_rows", "dsa_prefill_module_time"]

#: Kernels of one MLA attention block the module holds (``_training_ops.kernels_per_layer``: the
#: projections with their two latent norms, 7, and the core attention).
MODULE_KERNELS = 8.0


def _module_s(s: _Setup, p: ops.Pass) -> np.ndarray | None:
    model = s.model
    if not model.attention.indexer_heads:
        return None
    return s.rows.evaluate(
        dsa_prefill_module_s,
        device_name=s.hardware.name,
        engine=s.profile.engine,
        architecture=model.architecture,
        heads=model.attention.num_heads / s.shard,
        batch=p.batch,
        new_tokens=p.new_tokens,
        cached_tokens=p.cached_tokens,
    )


def dsa_module_rows(s: _Setup) -> np.ndarray:
    """Rows whose prefill prices each DSA layer's attention as the measured module, (n,) bool:
    a sparse top-k model with a curve for its device, engine and architecture."""
    if "_dsa_module_rows" not in s.__dict__:
        one = ops.Pass(
            batch=np.ones_like(s.column("cp")),
            new_tokens=np.ones_like(s.column("cp")),
            cached_tokens=np.zeros_like(s.column("cp")),
            head_tokens=np.ones_like(s.column("cp")),
            decode=False,
        )
        covered = _module_s(s, one) is not None
        s.__dict__["_dsa_module_rows"] = np.full(s.column("cp").shape, covered)
    return s.__dict__["_dsa_module_rows"]


def dsa_prefill_module_time(s: _Setup, p: ops.Pass) -> np.ndarray:
    """Seconds of one DSA layer's measured attention module over prefill pass ``p`` on one rank,
    its share ``1/cp`` of the prompt's (module docstring), (n,); zero on rows
    ``dsa_module_rows`` leaves out."""
    rows = dsa_module_rows(s)
    if p.decode or not rows.any():
        return np.zeros_like(s.column("cp"))
    measured = _module_s(s, p)
    assert measured is not None  # rows are covered
    return np.where(rows, measured / s.column("cp"), 0.0)
