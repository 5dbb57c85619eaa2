"""An attention layer's prefill at its whole module's measured latency (DSA and MLA layers).

The serving engines' operator tables time, in prefill, the whole attention module of DeepSeek
Sparse Attention layers (DeepSeek-V3.2, GLM-5: MLA projections, the lightning indexer's
projections, FP8 scores of every earlier key and top-k selection, the attention over the selected
keys, dense while a prompt is no longer than the top-k) and of DeepSeek-V3's MLA layers (its
projections and the explicit-form attention) (``_kernel_curves_module``). Where the serving
engine's curve covers the device and the model's architecture and shape, a prefill pass prices
each such
layer's attention block as the measured module: its projections leave the pass's GEMMs
(``_inference_passes._compute_time``), its core attention (and indexer) the roofline
(``_inference_compute._attention_time``), and its kernels pay no per-kernel floor on top
(``_inference_kernels._count_measured_kernels``). With context parallelism, which the tables do
not measure, each rank takes its share of the prompt's queries and so ``1/cp`` of the module
(its projections, scores and attention; the exchange of keys is priced with the pass's
communication). Decode keeps its pricing. Size of the correction (B200, 16 heads a rank, one
8,192-token prompt): a DSA layer's module is 5.1-6.2 ms in all three engines' tables against
1.2-1.8 ms of roofline; DeepSeek-V3's MLA module 0.59-0.65 ms (TensorRT-LLM, vLLM) against
0.88 ms, and at 32K tokens 4.3-5.6 ms against 10.4 ms.
"""

from __future__ import annotations

import numpy as np

from cost_model import _inference_ops as ops
from cost_model._inference_setup import _Setup
from cost_model._kernel_curves_module import has_prefill_module, module_shape, prefill_module_s

__all__ = ["MODULE_KERNELS", "module_rows", "prefill_module_time"]

#: Kernels of one MLA attention block the module holds (``_training_ops.kernels_per_layer``: the
#: projections with their two latent norms, 7, and the core attention).
MODULE_KERNELS = 8.0


def _kind(s: _Setup) -> str | None:
    attention = s.model.attention
    if attention.indexer_heads:
        return "dsa_prefill_module"
    if attention.kind == "mla" and attention.variant == "full":
        return "mla_prefill_module"
    return None


def _module_s(s: _Setup, p: ops.Pass) -> np.ndarray | None:
    kind = _kind(s)
    if kind is None:
        return None
    return s.rows.evaluate(
        prefill_module_s,
        kind=kind,
        device_name=s.hardware.name,
        engine=s.profile.engine,
        architecture=s.model.architecture,
        shape=module_shape(s.model),
        heads=s.model.attention.num_heads / s.shard,
        batch=p.batch,
        new_tokens=p.new_tokens,
        cached_tokens=p.cached_tokens,
    )


def module_rows(s: _Setup) -> np.ndarray:
    """Rows whose prefill prices each attention block as its measured module, (n,) bool: a DSA
    or MLA model whose engine's curve covers its device, architecture and shape."""
    if "_module_rows" not in s.__dict__:
        kind = _kind(s)
        covered = kind is not None and has_prefill_module(
            kind=kind,
            device_name=s.hardware.name,
            engine=s.profile.engine,
            architecture=s.model.architecture,
            shape=module_shape(s.model),
        )
        s.__dict__["_module_rows"] = np.full(s.column("cp").shape, covered)
    return s.__dict__["_module_rows"]


def prefill_module_time(s: _Setup, p: ops.Pass) -> np.ndarray:
    """Seconds of one layer's measured attention module over prefill pass ``p`` on one rank, its
    share ``1/cp`` of the prompt's (module docstring), (n,); zero on rows ``module_rows`` leaves
    out."""
    rows = module_rows(s)
    if p.decode or not rows.any():
        return np.zeros_like(s.column("cp"))
    measured = _module_s(s, p)
    assert measured is not None  # rows are covered
    return np.where(rows, measured / s.column("cp"), 0.0)
