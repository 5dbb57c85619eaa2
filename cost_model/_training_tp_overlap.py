"""Tensor-parallel traffic a framework can hide: each collective behind the GEMM it is fused with.

The frameworks that overlap sequence-parallel communication split each all-gather or
reduce-scatter into ``tp`` chunks pipelined with one GEMM: the GEMM that consumes the gathered
tensor, or the one that produces the tensor to scatter. Megatron-core's ``--tp-comm-overlap``
(TransformerEngine userbuffers; ``megatron/core/model_parallel_config.py``: ``tp_comm_overlap_ag``
and ``tp_comm_overlap_rs`` "overlap with GEMM by pipelining", ``tp_comm_bulk_wgrad`` the
all-gather beside the backward data-gradient GEMM, ``tp_comm_bulk_dgrad`` the reduce-scatter
beside the weight-gradient GEMM, all on by default) and torch's asynchronous tensor parallel
(``torch/_inductor/fx_passes/micro_pipeline_tp.py``: ``fuse_all_gather_matmul`` into the
matmuls consuming the all-gather, ``fuse_matmul_reduce_scatter`` where one matmul produces the
reduce-scatter's input, ``_find_producer_matmul``) both work this way. The rest of the layer
(core attention, norms, activations) runs with no collective beside it.

Of a collective of ``C`` seconds pipelined with a GEMM of ``G`` seconds in ``tp`` chunks, the
first chunk of the all-gather (the last of the reduce-scatter) has no GEMM chunk beside it, so at
most ``min(C, G (tp - 1) / tp)`` hides (the same bound for the reduce-scatter, mirrored).

Pairs per layer and forward pass (a full recompute repeats them): the attention block's
all-gather with the Q/K/V projections and its reduce-scatter with the output projection, the
feed-forward block's all-gather with the up (and gate) projection and its reduce-scatter with the
down projection. Backward (each GEMM's data and weight gradients, each of the forward's FLOPs):
the all-gather of the output gradient with the data-gradient GEMM of the row-parallel projection
(output, down) that consumes it; the reduce-scatter of the column-parallel block's input gradient
with that block's weight-gradient GEMM in Megatron-core (``tp_comm_bulk_dgrad``), and with
nothing under torch's pass when the block has several linears (Q, K and V; gate and up): their
input gradient is a sum of matmuls, which ``_find_producer_matmul`` does not match
(``FrameworkProfile.tp_overlap_input_gradient_scatter``). An MoE layer's feed-forward block is
its MoE block: its pairs take half of the block's forward time each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from cost_model._training_ops import attention_projection_time, dense_ffn_time, moe_ffn_time

if TYPE_CHECKING:
    from cost_model._training_comm import CollectiveTimes
    from cost_model._training_context import TrainingContext

__all__ = ["tp_hideable_seconds"]


def _output_projection_share(model) -> float:
    """Share of the attention block's projection weights in its output projection."""
    a = model.attention
    return a.num_heads * a.value_head_dim * model.hidden_size / model.attention_parameters()


def _down_projection_share(model) -> float:
    """Share of a dense feed-forward block's weights in its down projection: 1/3 for a gated
    (SwiGLU) block, 1/2 otherwise."""
    return 1.0 / 3.0 if model.ffn_activation == "swiglu" else 0.5


def _pair_hideable(
    *, gather: np.ndarray, scatter: np.ndarray, column: np.ndarray, row: np.ndarray, ctx
) -> np.ndarray:
    """Hideable seconds of one block (a column-parallel GEMM of ``column`` seconds forward before
    a row-parallel one of ``row``) over its forward passes and its backward."""
    tp = ctx.column("tp")
    reach = (tp - 1.0) / tp
    forward = np.minimum(gather, reach * column) + np.minimum(scatter, reach * row)
    framework = ctx.framework
    assert framework is not None  # tp_hideable_seconds prices no pairs without one
    backward = np.minimum(gather, reach * row) + np.where(
        framework.tp_overlap_input_gradient_scatter, np.minimum(scatter, reach * column), 0.0
    )
    return (1.0 + ctx.full_recompute_share) * forward + backward


def tp_hideable_seconds(ctx: TrainingContext, times: CollectiveTimes) -> np.ndarray:
    """Seconds of one micro-batch's tensor-parallel traffic its framework can hide on each
    pipeline rank: the sum over layers of each collective's hideable share beside its GEMM
    (module docstring). Infinite where the traffic is not sequence-parallel (the all-reduces
    take the shared window), and without a framework profile (no pairing is known)."""
    if ctx.framework is None:
        return np.full(np.shape(ctx.tokens), np.inf)
    gather = times.tp_gather
    scatter = times.tp_split - times.tp_gather
    model, layout = ctx.model, ctx.layout
    projections = attention_projection_time(ctx)
    output = projections * _output_projection_share(model)
    attention = _pair_hideable(
        gather=gather, scatter=scatter, column=projections - output, row=output, ctx=ctx
    )
    ffn = dense_ffn_time(ctx)
    down = ffn * _down_projection_share(model)
    dense = _pair_hideable(gather=gather, scatter=scatter, column=ffn - down, row=down, ctx=ctx)
    if model.moe is None:
        moe = np.zeros_like(dense)
    else:
        half = moe_ffn_time(ctx) / 2.0
        moe = _pair_hideable(gather=gather, scatter=scatter, column=half, row=half, ctx=ctx)
    hideable = layout.layers * attention + layout.dense_layers * dense + layout.moe_layers * moe
    return np.where(ctx.sequence_parallel, hideable, np.inf)
