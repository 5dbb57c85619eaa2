"""Seconds of one collective of each kind a training step issues, for every row of a table.

The collectives depend only on the mesh of a row (``MESH_COLUMNS``), not on its switches
(recompute, ZeRO stage, schedule, sequence parallel pick among the variants computed here), so
a large table is priced once per distinct mesh and the results are scattered back. The pass
counts are applied by ``_training_micro_batch``, the overlap by ``_training``.

Sources: TP all-reduce, or reduce-scatter + all-gather with SP, of the hidden activation
(Shoeybi et al. 2019 sec. 3; Korthikanti et al. 2022 sec. 4.2.2); EP all-to-all dispatch and
combine of tokens x top-k x hidden x imbalance, with the expert-TP gather/scatter (DeepSeek-V3
report, arXiv:2412.19437, sec. 3.2.2; Megatron-core MoE), or DeepEP's de-duplicated dispatch
(the inference path's bytes, priced by the fit on DeepEP's measured normal kernels,
``_kernel_curves_comm.deepep_normal_s``), fp8 dispatch / bf16 combine; CP ring: one K/V block per
step, cp - 1 steps per layer (Liu et al., arXiv:2310.01889), or an all-gather of K/V (Llama 3); PP:
each tp rank sends 1/tp of the boundary
activation (Narayanan et al. SC'21 sec. 4.1); DP: gradient all-reduce, or reduce-scatter of
gradients + all-gather of bf16 weights (ZeRO-1/2), or per layer and micro-batch an all-gather
before its forward and again before its backward and a reduce-scatter after it (ZeRO-3/FSDP)
(Rajbhandari et al., ZeRO, SC'20 sec. 7).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, cast

import numpy as np

from cost_model._kernel_curves_comm import deepep_normal_s, expert_all_to_all_bytes
from cost_model._pricing import collective_time_s, expert_dispatch_time_s
from cost_model._stages import layer_weights_per_device

ACTIVATION_BYTES = 2.0  # bf16/fp16 activations (fp8 training keeps bf16 activations between GEMMs)
#: Columns that decide every collective's group, placement and message.
MESH_COLUMNS: tuple[str, ...] = (
    "dp",
    "tp",
    "pp",
    "cp",
    "ep",
    "etp",
    "micro_batch_size",
    "virtual_stages",
)
_DISTINCT_MIN_ROWS = 2048


@dataclass(frozen=True)
class FsdpLayerTimes:
    """ZeRO-3/FSDP collectives of one layer, seconds per row (n,): all-gather of its bf16
    weights (before its forward, and again before its backward) and reduce-scatter of its
    gradients after its backward, for a dense and an MoE layer (the MoE layer's experts over
    edp, the rest over dp*cp); ``ends_*`` the embedding and LM head of a rank, (3, n)."""

    dense_gather: np.ndarray
    dense_scatter: np.ndarray
    moe_gather: np.ndarray
    moe_scatter: np.ndarray
    ends_gather: np.ndarray
    ends_scatter: np.ndarray

    def take(self, index: np.ndarray) -> FsdpLayerTimes:
        return FsdpLayerTimes(**{f.name: getattr(self, f.name)[..., index] for f in fields(self)})


@dataclass(frozen=True)
class CollectiveTimes:
    """One collective of each kind, seconds; (n,) per row or (3, n) per pipeline rank and row."""

    tp_all_reduce: np.ndarray  # the hidden activation, all-reduce over tp
    tp_split: np.ndarray  # the same as reduce-scatter + all-gather (sequence parallel; the
    # all-gather in fp8 where the recipe has one)
    tp_gather: np.ndarray  # the all-gather of tp_split alone
    tp_mla_backward: np.ndarray  # MLA without SP: backward all-reduces beyond the attention input's
    ep_exchange: np.ndarray  # forward dispatch + combine, expert-TP gather + scatter
    ep_exchange_backward: np.ndarray  # the same in backward (gradients, bf16)
    cp_ring: np.ndarray  # the cp - 1 ring steps of one layer
    pp_p2p: np.ndarray  # one boundary send/recv
    dp_all_reduce: np.ndarray  # (3, n) gradients, dense over dp*cp plus experts over edp
    dp_gradient_scatter: np.ndarray  # (3, n) ZeRO-1/2: reduce-scatter of the rank's gradients
    dp_weight_gather: np.ndarray  # (3, n) ZeRO-1/2: all-gather of the rank's updated bf16 weights
    fsdp_layer: FsdpLayerTimes

    def take(self, index: np.ndarray) -> CollectiveTimes:
        taken: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            taken[f.name] = (
                value.take(index) if isinstance(value, FsdpLayerTimes) else value[..., index]
            )
        return CollectiveTimes(**taken)


def distinct_rows(table, columns: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(first row of each distinct combination of ``columns``, row -> combination index)."""
    key = np.zeros(len(table[columns[0]]), dtype=np.int64)
    radix = 1
    for name in columns:
        values, codes = np.unique(np.asarray(table[name]), return_inverse=True)
        radix *= len(values)
        if radix >= 2**62:  # too many combinations for one int64 key: compare whole rows
            stacked = np.stack([np.asarray(table[c], dtype=np.float64) for c in columns], axis=1)
            _, first, inverse = np.unique(stacked, axis=0, return_index=True, return_inverse=True)
            return first, inverse.reshape(-1)
        key = key * len(values) + codes
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


def table_collective_times(ctx) -> CollectiveTimes:
    """``collective_times`` of every row, computed once per distinct mesh."""
    rows = len(ctx.tokens)
    if rows < _DISTINCT_MIN_ROWS:
        return collective_times(ctx)
    first, inverse = distinct_rows(ctx.table, MESH_COLUMNS)
    if len(first) > rows // 2:
        return collective_times(ctx)
    return collective_times(ctx.restricted(first)).take(inverse)


def collective_times(ctx) -> CollectiveTimes:
    tp_all_reduce, tp_scatter, tp_gather = _tp(ctx)
    dp_all_reduce, dp_gradient_scatter, dp_weight_gather = _dp(ctx)
    ep_forward, ep_backward = _ep(ctx)
    return CollectiveTimes(
        tp_all_reduce=tp_all_reduce,
        tp_split=tp_scatter + tp_gather,
        tp_gather=tp_gather,
        tp_mla_backward=_tp_mla_backward(ctx, tp_all_reduce),
        ep_exchange=ep_forward,
        ep_exchange_backward=ep_backward,
        cp_ring=_cp(ctx),
        pp_p2p=_pp(ctx),
        dp_all_reduce=dp_all_reduce,
        dp_gradient_scatter=dp_gradient_scatter,
        dp_weight_gather=dp_weight_gather,
        fsdp_layer=_fsdp_layer(ctx),
    )


def _tp(ctx) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(all-reduce, reduce-scatter, all-gather) of the hidden activation over tp, one of each
    per layer, block and pass. Under sequence parallelism with a recipe of
    ``_precision.TP_FP8_GATHER_RECIPES`` both all-gathers move 1 byte per element: in forward
    (and its full-recompute repeat) the input of the column-parallel GEMMs is cast to fp8 before
    it is gathered (torchao ``PrepareFloat8ModuleInput`` / ``Float8ColwiseParallel``
    ``_prepare_input_fn``); in backward the output gradient of the row-parallel GEMMs is cast to
    fp8 before the all-gather that undoes the forward reduce-scatter (torchao
    ``Float8RowwiseParallel._prepare_output_fn`` applies ``NoopFwToFloat8BwDynamic`` after the
    output's ``redistribute``, so in backward the float8 cast runs first and the gather moves
    the fp8 gradient; ``torchao/float8/float8_tensor_parallel.py``, the plan torchtitan applies
    with tensorwise float8). The reduce-scatters (the forward GEMM output, the backward input
    gradient) stay bf16."""
    from cost_model._precision import TP_FP8_GATHER_RECIPES

    tp = ctx.column("tp")
    elements = ctx.tokens * ctx.model.hidden_size
    message = elements * ACTIVATION_BYTES
    all_reduce = ctx.collective("all_reduce", axis="tp", group_size=tp, message_bytes=message)
    scatter = ctx.collective("reduce_scatter", axis="tp", group_size=tp, message_bytes=message)
    workload = ctx.workload
    fp8_gather = workload.precision == "fp8" and workload.fp8_recipe in TP_FP8_GATHER_RECIPES
    gather = ctx.collective(
        "all_gather",
        axis="tp",
        group_size=tp,
        message_bytes=elements * 1.0 if fp8_gather else message,
    )
    return all_reduce, scatter, gather


def mla_backward_widths(model) -> tuple[int, ...]:
    """Widths of the replicated tensors whose gradients MLA all-reduces over tp in backward: the
    per-head up-projections (column-parallel) read the replicated query and KV latents, and every
    head's RoPE key is one shared vector, so each input's gradient is a sum over the tp ranks'
    heads (DeepSeek-V2, arXiv:2405.04434, sec. 2.1; Megatron-core MLA's column-parallel
    ``linear_q_up_proj`` / ``linear_kv_up_proj``). Without query compression the query projection
    reads the layer input itself. Empty for other attention kinds."""
    a = model.attention
    if a.kind != "mla":
        return ()
    return (a.q_lora_rank or model.hidden_size, a.kv_lora_rank, a.qk_rope_head_dim)


def _tp_mla_backward(ctx, hidden_all_reduce: np.ndarray) -> np.ndarray:
    """Backward seconds per layer of MLA's input-gradient all-reduces (``mla_backward_widths``)
    beyond the one all-reduce of the hidden-size attention input that ``tp_all_reduce`` counts."""
    widths = mla_backward_widths(ctx.model)
    if not widths:
        return np.zeros_like(hidden_all_reduce)
    tp = ctx.column("tp")
    each = [
        ctx.collective(
            "all_reduce",
            axis="tp",
            group_size=tp,
            message_bytes=ctx.tokens * width * ACTIVATION_BYTES,
        )
        for width in widths
    ]
    return sum(each) - hidden_all_reduce


#: fp8 dispatch: one byte per element plus one fp32 scale per 128 elements (DeepSeek-V3 report
#: sec. 3.3.2, the 1x128 activation tiles).
FP8_DISPATCH_BYTES = 1.0 + 4.0 / 128.0


def _ep(ctx) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of one MoE layer's dispatch + combine and the expert-TP
    gather/scatter. The forward dispatch may travel in fp8 (``expert_dispatch_fp8``); the
    combine and both backward exchanges (gradients) in bf16."""
    moe = ctx.model.moe
    if moe is None:
        zero = np.zeros_like(ctx.tokens)
        return zero, zero
    tokens = ctx.moe_tokens * ctx.options.expert_load_factor
    dispatch_bytes = FP8_DISPATCH_BYTES if ctx.options.expert_dispatch_fp8 else ACTIVATION_BYTES
    forward = _exchange(ctx, tokens, dispatch_bytes, direction="dispatch") + _exchange(
        ctx, tokens, ACTIVATION_BYTES, direction="combine"
    )
    # DeepEP's backward runs the other kernel of each pair: a dispatch carries the combine's
    # gradient, a combine the dispatch's.
    backward = _exchange(ctx, tokens, ACTIVATION_BYTES, direction="dispatch") + _exchange(
        ctx, tokens, ACTIVATION_BYTES, direction="combine"
    )
    message = tokens * moe.top_k * ctx.model.hidden_size * ACTIVATION_BYTES
    etp = ctx.column("etp")
    gather = ctx.collective("all_gather", axis="etp", group_size=etp, message_bytes=message * etp)
    scatter = ctx.collective(
        "reduce_scatter", axis="etp", group_size=etp, message_bytes=message * etp
    )
    return forward + gather + scatter, backward + gather + scatter


def _exchange(ctx, tokens: np.ndarray, element_bytes: float, *, direction: str) -> np.ndarray:
    """One ``direction`` (dispatch or combine) exchange: an NCCL all-to-all of every routed copy
    (Megatron-core's alltoall dispatcher), or DeepEP's normal kernels (``_deepep_exchange``),
    which also price HybridEP (Megatron-core's flex dispatcher backend ``hybridep``,
    ``token_dispatcher.py`` ``_HybridEPManager``): it too dispatches each token once per
    destination rank with the expert routing map beside it and combines each token's expert
    outputs on their rank before the return trip (NVIDIA Technical Blog, "Optimizing
    Communication for Mixture-of-Experts Training with Hybrid Expert Parallel", 2026-02), and
    no operator measurement of its own kernels is shipped."""
    moe = ctx.model.moe
    if ctx.options.expert_dispatcher in ("deepep", "hybridep"):
        return _deepep_exchange(ctx, tokens, element_bytes, direction=direction)
    message = tokens * moe.top_k * ctx.model.hidden_size * element_bytes
    return ctx.collective(
        "all_to_all", axis="ep", group_size=ctx.column("ep"), message_bytes=message
    )


def _deepep_exchange(
    ctx, tokens: np.ndarray, element_bytes: float, *, direction: str
) -> np.ndarray:
    """One ``direction`` (dispatch or combine) by DeepEP's normal kernels, the inference path's
    bytes (``_kernel_curves_comm.expert_all_to_all_bytes``: per-node de-duplication) with
    node-limited routing capping the remote copies at ``max_routed_nodes``, priced by the fit on
    DeepEP's
    measured normal kernels (``_kernel_curves_comm.deepep_normal_s``); without a shipped fit, by the
    topology over the calibrated collective efficiency (``_pricing.expert_dispatch_time_s``)."""
    moe = ctx.model.moe
    ep = ctx.column("ep")
    local = np.minimum(np.asarray(ctx.local["ep"], dtype=np.float64), ep)
    intra_bytes, inter_bytes = expert_all_to_all_bytes(
        rank_tokens=tokens,
        hidden_size=ctx.model.hidden_size,
        element_bytes=element_bytes,
        copies=moe.top_k * ctx.column("etp"),
        ep=ep,
        local=local,
        node_dedup=True,
    )
    if ctx.options.max_routed_nodes is not None:
        token_bytes = np.asarray(tokens, dtype=np.float64) * ctx.model.hidden_size * element_bytes
        inter_bytes = np.minimum(inter_bytes, token_bytes * ctx.options.max_routed_nodes)
    fitted = deepep_normal_s(
        direction=direction,
        intra_bytes=intra_bytes,
        inter_bytes=np.where(ep > local, inter_bytes, 0.0),
        nodes=ep / local,
        cluster=ctx.cluster,
    )
    if fitted is not None:
        return np.where(ep > 1, fitted, 0.0)
    return expert_dispatch_time_s(
        cluster=ctx.cluster,
        calibration=ctx.calibration,
        hidden_size=ctx.model.hidden_size,
        top_k=moe.top_k,
        ep=ep,
        etp=ctx.column("etp"),
        ep_per_node=ctx.local["ep"],
        rank_tokens=tokens,
        element_bytes=element_bytes,
        node_dedup=True,
        max_routed_nodes=ctx.options.max_routed_nodes,
    )


def _kv_width_per_rank(ctx) -> np.ndarray:
    a = ctx.model.attention
    if a.kind == "mla":  # K and V after the up-projection, every head (Megatron-core MLA with CP)
        return a.num_heads * (a.qk_head_dim + a.value_head_dim) / ctx.column("tp")
    return np.maximum(a.num_kv_heads / ctx.column("tp"), 1.0) * 2.0 * a.head_dim


def _point_to_point(
    ctx, *, active: np.ndarray, same_node: np.ndarray, message: np.ndarray
) -> np.ndarray:
    return collective_time_s(
        cluster=ctx.cluster,
        op="send_recv",
        group_size=np.where(active, 2.0, 1.0),
        ranks_per_node=np.where(same_node & active, 2.0, 1.0),
        message_bytes=message,
        calibration=ctx.calibration,
    )


def _cp(ctx) -> np.ndarray:
    """One layer's forward context-parallel exchange: the cp - 1 ring steps of one K/V block
    (``ring``), or one all-gather of every rank's K/V (``all_gather``, Llama 3 report sec.
    3.3.2; its backward re-gathers and reduce-scatters the same size)."""
    cp = ctx.column("cp")
    block = ctx.tokens * _kv_width_per_rank(ctx) * ACTIVATION_BYTES
    if ctx.options.context_parallel == "all_gather":
        gathered = ctx.collective("all_gather", axis="cp", group_size=cp, message_bytes=block * cp)
        return np.where(cp > 1, gathered, 0.0)
    step = _point_to_point(ctx, active=cp > 1, same_node=ctx.local["cp"] >= cp, message=block)
    return (cp - 1.0) * step


def _pp(ctx) -> np.ndarray:
    message = ctx.tokens * ctx.model.hidden_size * ACTIVATION_BYTES / ctx.column("tp")
    return _point_to_point(
        ctx, active=ctx.column("pp") > 1, same_node=ctx.local["pp"] >= 2, message=message
    )


def sharded_parameters(ctx) -> tuple[np.ndarray, np.ndarray]:
    """(dense, expert) parameters per device of each stage, both stages' under a bidirectional
    schedule (``TrainingContext.stage_copies``): expert gradients reduce over edp, the rest over
    dp*cp (Megatron-core)."""
    parts = dict(ctx.parameters)
    expert = parts.pop("routed_experts")
    return cast(np.ndarray, sum(parts.values())) * ctx.stage_copies, expert * ctx.stage_copies


def _dp(ctx) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Whole-rank data-parallel collectives (3, n): gradient all-reduce (ZeRO-0), gradient
    reduce-scatter and weight all-gather (ZeRO-1/2; Megatron-core distributed optimizer)."""
    dense, expert = sharded_parameters(ctx)
    totals = [np.zeros(dense.shape) for _ in range(3)]
    for params, group, axis in _dp_groups(ctx, dense=dense, expert=expert):
        grads, weights = params * ctx.reduce_bytes, params * 2.0
        totals[0] += ctx.collective("all_reduce", axis=axis, group_size=group, message_bytes=grads)
        totals[1] += ctx.collective(
            "reduce_scatter", axis=axis, group_size=group, message_bytes=grads
        )
        totals[2] += ctx.collective(
            "all_gather", axis=axis, group_size=group, message_bytes=weights
        )
    return totals[0], totals[1], totals[2]


def _dp_groups(ctx, *, dense, expert) -> tuple:
    """(parameters, group size, placement axis) of the dense (dp*cp) and expert (edp) groups."""
    dp_cp = ctx.column("dp") * ctx.column("cp")
    edp = dp_cp * ctx.column("tp") / (ctx.column("ep") * ctx.column("etp"))
    return ((dense, dp_cp, "dp_cp"), (expert, edp, "edp"))


def _fsdp_layer(ctx) -> FsdpLayerTimes:
    """Per-layer ZeRO-3/FSDP collectives: FSDP2 wraps each transformer block (torchtitan's
    ``apply_fsdp``), DeepSpeed ZeRO-3 fetches each submodule's parameters on first use
    (Rajbhandari et al., ZeRO, SC'20 sec. 7.3; ZeRO-Infinity, SC'21 sec. 6). Messages are the
    full unsharded layer (nccl-tests size); the group's path (NVLink inside a node, the node's
    NICs shared by the node's concurrent groups across nodes) comes from ``collective_time``."""
    dense_layer, moe_dense, moe_expert = layer_parameter_split(ctx)
    parts = dict(ctx.parameters)
    ends = parts["embedding"] + parts["lm_head"]
    zero = np.zeros_like(ends)
    times: dict[str, Any] = {}
    layer_gather = fsdp_weight_gather_bytes(ctx)
    for name, dense, expert in (
        ("dense", dense_layer, 0.0 * dense_layer),
        ("moe", moe_dense, moe_expert),
        ("ends", ends, zero),
    ):
        gather, scatter = 0.0, 0.0
        groups = _dp_groups(ctx, dense=dense, expert=expert)
        for (params, group, axis), width in zip(
            groups, (2.0 if name == "ends" else layer_gather, 2.0)
        ):
            gather = gather + ctx.collective(
                "all_gather", axis=axis, group_size=group, message_bytes=params * width
            )
            scatter = scatter + ctx.collective(
                "reduce_scatter",
                axis=axis,
                group_size=group,
                message_bytes=params * ctx.reduce_bytes,
            )
        times[f"{name}_gather"], times[f"{name}_scatter"] = gather, scatter
    return FsdpLayerTimes(**times)


def fsdp_weight_gather_bytes(ctx) -> float | np.ndarray:
    """Bytes per parameter of the per-layer FSDP all-gather of a layer's non-expert weights: 1
    when fp8 training casts them to fp8 before the gather (``_precision.FSDP_FP8_GATHER_RECIPES``:
    torchao's ``enable_fsdp_float8_all_gather`` with tensorwise scaling), else 2 (bf16). Norm
    weights (a few thousand parameters a layer) are counted with them; the embedding, the LM head
    and the routed experts gather bf16. torchtitan turns the fp8 gather on only where the
    data-parallel shard dimension is more than one rank (``enable_fsdp_float8_all_gather =
    parallel_dims.dp_shard_enabled and float8.enable_fsdp_float8_all_gather``: torchtitan/float8.py
    at 9dec370, 2024-12, and torchtitan/components/quantization/float8.py through 2026-04): FSDP
    over the context-parallel ranks alone (dp 1, cp > 1) gathers bf16, (n,) per row."""
    from cost_model._precision import FSDP_FP8_GATHER_RECIPES

    workload = ctx.workload
    if workload.precision == "fp8" and workload.fp8_recipe in FSDP_FP8_GATHER_RECIPES:
        return np.where(ctx.column("dp") > 1, 1.0, 2.0)
    return 2.0


def layer_parameter_split(ctx) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Parameters per device (n,) of one dense layer, and of one MoE layer without and with only
    its routed experts (the experts reduce over edp, the rest over dp*cp)."""
    dense_layer, moe_layer = layer_weights_per_device(model=ctx.model, table=ctx.table)
    moe = ctx.model.moe
    if moe is None:
        return dense_layer, moe_layer, np.zeros_like(moe_layer)
    redundant = np.asarray(ctx.table.get("num_redundant_experts", 0), dtype=np.float64)
    experts = (
        (moe.num_routed_experts + redundant)
        / ctx.column("ep")
        * ctx.model.ffn_parameters(moe.expert_ffn_hidden_size)
        / ctx.column("etp")
    )
    return dense_layer, moe_layer - experts, np.broadcast_to(experts, moe_layer.shape)


def sharding_buffer_bytes(ctx) -> np.ndarray:
    """Bytes per device (3, n) that sharded data parallelism holds beyond the shards.

    ZeRO-3/FSDP: the unsharded bf16 weights of the layer being computed and of the one being
    prefetched (FSDP2's default one-layer prefetch; Zhao et al., PyTorch FSDP, VLDB 2023 sec.
    3.3), the root's embedding and LM head kept unsharded between forward and backward, and one
    layer's unsharded gradients waiting for their reduce-scatter. ZeRO-2: that gradient bucket
    (gradients are partitioned as they are reduced; ZeRO SC'20 sec. 5.2). ZeRO-0/1 reduce in
    place in the whole gradient buffer the ``gradients`` part already counts.

    torch's FSDP2 (the frameworks whose shards are the fp32 master weights,
    ``FrameworkProfile.sharded_master_weights``) also holds the gradients autograd produced for
    the layer, in the parameters' bf16, beside that bucket: ``foreach_reduce`` allocates the
    reduce-scatter input in the reduce dtype and copies the gradients into it before freeing
    them, and the previous layer's input stays referenced until this layer's ``post_backward``
    releases it (torch 2.6 ``FSDPParamGroup.post_backward``, ``comm_ctx.reduce_scatter_state``;
    torch 2.13 ``reduce_scatter_states``, at most ``reduce_scatter_max_input_buffers`` = 1),
    so a layer's backward ends with one layer in the reduce dtype and one in bf16.
    """
    dense_layer, moe_dense, moe_expert = layer_parameter_split(ctx)
    layer = np.maximum(dense_layer, moe_dense + moe_expert)
    zero = np.asarray(ctx.table["zero_stage"])
    parts = dict(ctx.parameters)
    ends = parts["embedding"] + parts["lm_head"]
    occupied = ctx.layout.layers > 0
    gathered = np.where(zero == 3, occupied * 2.0 * layer * 2.0 + ends * 2.0, 0.0)
    fsdp2 = ctx.framework is not None and ctx.framework.sharded_master_weights
    autograd_gradient = 2.0 if fsdp2 else 0.0
    bucket = np.where(zero >= 2, occupied * layer * ctx.grad_bytes, 0.0)
    held = np.where(zero == 3, occupied * layer * autograd_gradient, 0.0)
    return gathered + bucket + held
