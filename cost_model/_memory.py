"""Training memory per device, vectorized over a config table, for each pipeline rank.

* Model states (Rajbhandari et al., ZeRO, SC'20, sec. 3.1): 2 bytes per weight (bf16/fp16),
  fp32 main gradients (4 bytes; Megatron-LM keeps them, which is why Korthikanti et al. 2022
  Fig. 1 counts 18 bytes per parameter), and K = 12 bytes of Adam state (fp32 master, m, v;
  SGD: master + momentum). ZeRO-1 shards the optimizer states, ZeRO-2 also the gradients,
  ZeRO-3/FSDP also the weights; dense parameters over dp*cp, expert parameters over edp.
* Activations per layer and micro-batch (Korthikanti et al., arXiv:2205.05198, sec. 4 and
  Table 2): GPT's ``sbh(34 + 5as/h)`` written component by component so that GQA/MLA, SwiGLU and
  MoE layers follow the same accounting — inputs of the norms, projections and FFN, Q/K/V and
  the output-projection input, FFN intermediates, dropout masks, and the s x s scores (only
  when attention is unfused). Without SP the hidden-size terms are replicated over tp; with SP
  everything is split by tp. Selective recompute drops the scores; full recompute keeps each
  layer's input (2sbh) and one layer's activations while it is recomputed.
* Micro-batches in flight on pipeline rank r (Megatron-LM's warm-up counts): 1F1B and ZB-H1
  hold p - r, GPipe all m, interleaved 1F1B ((p - r - 1) * 2 + (v - 1) * p + 1) / v in units of
  the rank's layers — p + (p - 1)/v on the first rank (Korthikanti et al. sec. 4.2.3).
* Recompute and offload settings of the framework (``EstimateOptions``): selective recompute
  by Megatron-core module (``recompute_modules``), full recompute of the first layers of each
  model chunk (``recompute_layers``), CPU activation offloading (``activation_offload_layers``),
  distributed-optimizer instances (``optimizer_instances``).
* The loss: bytes per logit the framework holds there (``FrameworkProfile.loss_bytes_per_logit``:
  4 for a fused fp32 cross entropy, 12 for torchtitan's eager ``cross_entropy(logits.float())``,
  16 for its vocab-parallel loss with tp > 1, ``loss_parallel_bytes_per_logit``; 4 where
  torch.compile compiles the loss, ``compiled_loss_bytes_per_logit``);
  FSDP2 shards the fp32 master weights with no bf16 sharded copy
  (``FrameworkProfile.sharded_master_weights``); operator-level selective recompute rebuilds
  one layer's unsaved activations during the backward pass.
* ZeRO-3 under pipeline parallelism (``pipeline_unsharded_stage``): FSDP2 in
  torch.distributed.pipelining keeps each stage's parameters gathered and its gradients unsharded
  across the micro-batches of a step, reducing them once after the last one.
* Communication buffers (TP/EP/PP receive buffers; torch.distributed.pipelining keeps one per
  micro-batch, ``pipeline_buffer_bytes``) and an allocator fragmentation reserve.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np

from cost_model._precision import TP_FP8_GATHER_RECIPES, bf16_layer_fraction, caches_fp8_input
from cost_model._reasons import MEMORY_PARTS, memory_reason
from cost_model._stages import STAGES
from cost_model._table import RECOMPUTE_CODES, SCHEDULE_CODES
from cost_model._training_comm import (
    ACTIVATION_BYTES,
    fsdp_weight_gather_bytes,
    layer_parameter_split,
    sharding_buffer_bytes,
)

if TYPE_CHECKING:
    from cost_model._training_context import TrainingContext

__all__ = [
    "memory_columns",
    "micro_batches_in_flight",
    "offloaded_layer_bytes",
    "pipeline_unsharded_stage",
    "stage_memory",
]


def _model_state_bytes(ctx: TrainingContext) -> dict[str, np.ndarray]:
    parts = dict(ctx.parameters)
    expert = parts.pop("routed_experts")
    dense = sum(parts.values())
    dp_cp = ctx.column("dp") * ctx.column("cp")
    edp = dp_cp * ctx.column("tp") / (ctx.column("ep") * ctx.column("etp"))
    zero = np.asarray(ctx.table["zero_stage"])
    # With several distributed-optimizer instances each shards over its share of the ranks.
    instances = float(ctx.options.optimizer_instances)
    sharded = dense / np.maximum(dp_cp / instances, 1.0) + expert / np.maximum(edp / instances, 1.0)
    whole = dense + expert
    adam_states = 2.0 if ctx.workload.optimizer == "adam" else 1.0
    state_bytes = adam_states * ctx.optimizer_state_bytes + (
        4.0 if ctx.workload.master_weights_fp32 else 0.0
    )
    # FSDP2 shards the fp32 master weights themselves; the bf16 copies are the gathered layers
    # (``sharding_buffer_bytes``).
    master_only = (
        ctx.framework is not None
        and ctx.framework.sharded_master_weights
        and ctx.workload.master_weights_fp32
    )
    sharded_weights = 0.0 if master_only else 2.0
    held = pipeline_unsharded_stage(ctx)
    gradients = np.where(zero >= 2, sharded, whole) * ctx.grad_bytes
    copies = ctx.stage_copies  # a bidirectional schedule's two stages per rank
    return {
        "weights": copies
        * (
            np.where(zero >= 3, sharded * sharded_weights, whole * 2.0)
            + np.where(held, _unsharded_stage_weight_bytes(ctx), 0.0)
        ),
        # The sharded gradients appear only when the last micro-batch's gradients are
        # reduce-scattered, as the unsharded ones are freed (and the optimizer's zero_grad of
        # the step before freed the previous ones): the unsharded ones are the larger.
        "gradients": copies * np.where(held, whole * ctx.reduce_bytes, gradients),
        "optimizer_states": copies * np.where(zero >= 1, sharded, whole) * state_bytes,
    }


def pipeline_unsharded_stage(ctx: TrainingContext) -> np.ndarray:
    """Rows (n,) whose pipeline stages hold their parameters gathered and their gradients
    unsharded through the step: ZeRO-3 with pp > 1.

    ZeRO-3 with pipeline parallelism is FSDP2 under torch.distributed.pipelining (torchtitan,
    and ``autoparallel.apply_plan``); Megatron-LM refuses ``--use-torch-fsdp2`` with pp > 1 and
    DeepSpeed's pipeline engine ZeRO-2/3 (``data/engine_rules.json``). In torch 2.13:
    * ``_PipelineStageBase.backward_maybe_with_nosync`` (distributed/pipelining/stage.py) runs
      every micro-batch's backward of an FSDP stage with ``set_requires_gradient_sync(False)``,
      ``set_reshard_after_backward(False)`` and ``set_is_last_backward(False)``;
      ``perform_reduce_grad`` (the ``REDUCE_GRAD`` action after all micro-batches,
      schedules.py) re-enables them and runs each group's ``post_backward`` once. So after a
      stage's first backward every layer stays gathered and keeps its unsharded gradient
      until the end of the step.
    * ``FSDPParamGroup.post_backward`` without gradient sync calls
      ``FSDPParam.to_accumulated_grad_if_needed`` / ``accumulate_unsharded_grad_if_needed``
      (distributed/fsdp/_fully_shard/_fsdp_param.py): the unsharded gradient is kept in
      ``reduce_dtype`` when it differs from ``param_dtype`` (``init_dtype_attrs`` clamps it
      to None when equal), ``ctx.reduce_bytes``: fp32 under torchtitan's mixed-precision
      policy (bf16 parameters, fp32 reduction).
    * torchtitan also skips the reshard after forward under pp (``apply_fsdp``: the
      ``reshard_after_forward`` policy ``default`` is ``not pp_enabled``;
      torchtitan/parallelisms/parallelize_llama.py at 9dec370,
      torchtitan/distributed/fsdp.py ``get_fsdp_reshard_after_forward_policy`` today), so
      the gathered parameters are held from the first forward; with resharding after forward
      they are re-gathered in each backward and kept from there, the same hold at the
      backward peak.

    The step time prices the same stages' traffic once per step (``_training_dp``
    ``_pipeline_fsdp_comm``).
    """
    zero = np.asarray(ctx.table["zero_stage"])
    return (zero >= 3) & (ctx.column("pp") > 1)


def _unsharded_stage_weight_bytes(ctx: TrainingContext) -> np.ndarray:
    """Bytes (3, n) of a rank's gathered stage parameters (``pipeline_unsharded_stage``):
    the layers' non-expert weights at the all-gather's width (``fsdp_weight_gather_bytes``:
    1 with torchao's fp8 all-gather, whose ``fsdp_post_all_gather`` keeps the gathered fp8 data
    as the unsharded weight; torchao/float8/fsdp_utils.py ``WeightWithDynamicFloat8CastTensor``),
    the embedding, LM head and routed experts in bf16."""
    parts = dict(ctx.parameters)
    bf16 = parts.pop("embedding") + parts.pop("lm_head") + parts.pop("routed_experts")
    return sum(parts.values()) * fsdp_weight_gather_bytes(ctx) + bf16 * 2.0


def _layer_activation_bytes(
    ctx: TrainingContext, *, moe: bool, dropped: frozenset[str] = frozenset()
) -> np.ndarray:
    """Bytes one layer stores for one micro-batch on one rank (shape (n,)), less what the
    selective-recompute modules in ``dropped`` recompute instead of storing
    (``EstimateOptions.recompute_modules``; Megatron-core's output-discarding checkpoints
    keep the module's input and drop its outputs)."""
    model, attention, options = ctx.model, ctx.model.attention, ctx.options
    tp = ctx.column("tp")
    tokens, h = ctx.tokens, model.hidden_size
    sp = ctx.sequence_parallel
    # Norm inputs (2), their outputs (the attention and FFN inputs: 2), dropout masks (1 byte):
    # replicated without SP. Under SP the norm outputs are kept as the column-parallel GEMMs'
    # input: Megatron-core keeps the sequence shard and gathers it again in backward
    # (Korthikanti sec. 4.2.2); a DTensor plan keeps the gathered tensor
    # (``TrainingContext.tp_saves_gathered_input``, ``tp_gathered_input_bytes``). The runtime's
    # MoE block routes its sequence shard (only its shared experts gather it): counting its FFN
    # input gathered is an upper bound there.
    norm_outputs = 0.0 if "layernorm" in dropped else 2.0
    norm_output_terms = tokens * h * norm_outputs * ACTIVATION_BYTES
    other_terms = tokens * h * (2.0 * ACTIVATION_BYTES + (2.0 if options.hidden_dropout else 0.0))
    kept_norm_outputs = np.where(
        ctx.tp_saves_gathered_input,
        norm_output_terms * tp_gathered_input_bytes(ctx) / ACTIVATION_BYTES,
        norm_output_terms / tp,
    )
    replicated = np.where(sp, other_terms / tp + kept_norm_outputs, other_terms + norm_output_terms)
    heads = attention.num_heads / tp
    kv_heads = (attention.num_heads if attention.kind == "mla" else attention.num_kv_heads) / tp
    qkv = heads * attention.qk_head_dim + kv_heads * (
        attention.qk_head_dim + attention.value_head_dim
    )
    if attention.kind == "mla" and "mla_up_proj" in dropped:
        qkv = np.zeros_like(qkv)  # the up-projected, RoPE-applied Q/K/V: recomputed
    sharded = tokens * (qkv + heads * attention.value_head_dim) * ACTIVATION_BYTES
    if attention.kind == "mla":  # the low-rank latents feed the up-projections
        latents = attention.q_lora_rank + attention.kv_lora_rank + attention.qk_rope_head_dim
        sharded = sharded + tokens * latents * ACTIVATION_BYTES
    if moe:
        sharded = sharded + _moe_activation_bytes(ctx, dropped=dropped)
    elif "mlp" not in dropped:
        sharded = sharded + _ffn_activation_bytes(ctx, width=model.ffn_hidden_size / tp)
    scores = 0.0 if "core_attn" in dropped else _score_bytes(ctx)
    return replicated + sharded + scores - _fp8_cached_input_saving(ctx, moe=moe, dropped=dropped)


def _fp8_cached_input_saving(
    ctx: TrainingContext, *, moe: bool, dropped: frozenset[str] = frozenset()
) -> np.ndarray:
    """Bytes one layer saves per micro-batch when its fp8 GEMMs keep their inputs for the backward
    pass in fp8 (1 byte instead of 2): Transformer Engine's recipes (``_precision.caches_fp8_input``;
    DeepSeek-V3 report sec. 3.3.3 caches the linear layers' inputs in fp8 the same way).

    The inputs counted are those of the fp8 GEMMs in the accounting above: the QKV and (dense)
    FC1 input (the norm output; split by tp with SP, the sharded copy is kept and re-gathered,
    Korthikanti sec. 4.2.2), the output-projection input, the FC2 input; in an MoE layer the
    routed tokens entering the experts' FC1 and FC2 and the shared expert's FC2 input (the MoE
    layer's input stays bf16 for the router). Inputs a recompute module in ``dropped`` does not
    store save nothing."""
    if not caches_fp8_input(ctx):
        return np.zeros_like(ctx.tokens)
    model, tp = ctx.model, ctx.column("tp")
    sharded = ctx.sequence_parallel & (not ctx.tp_saves_gathered_input)
    hidden = np.where(sharded, ctx.tokens * model.hidden_size / tp, ctx.tokens * model.hidden_size)
    if "layernorm" in dropped:
        hidden = np.zeros_like(hidden)
    out_projection = ctx.tokens * model.attention.num_heads / tp * model.attention.value_head_dim
    if not moe or model.moe is None:
        fc = 0.0 if "mlp" in dropped else 1.0
        elements = (
            (1.0 + fc) * hidden + out_projection + fc * ctx.tokens * model.ffn_hidden_size / tp
        )
    else:
        spec = model.moe
        routed = ctx.moe_tokens * spec.top_k * ctx.options.expert_load_factor
        shared = 0.0 if dropped & {"moe", "shared_experts"} else 1.0
        shared_width = spec.num_shared_experts * spec.shared_ffn_size / tp
        fc1_input = 0.0 if "moe" in dropped else model.hidden_size
        fc2_input = (
            0.0 if dropped & {"moe", "moe_act"} else spec.expert_ffn_hidden_size / ctx.column("etp")
        )
        expert_inputs = routed * (fc1_input + fc2_input)
        elements = hidden + out_projection + expert_inputs + shared * ctx.tokens * shared_width
    return elements * (ACTIVATION_BYTES - 1.0) * (1.0 - bf16_layer_fraction(ctx))


def tp_gathered_input_bytes(ctx: TrainingContext) -> float:
    """Bytes per element of a column-parallel GEMM's input as a DTensor sequence-parallel plan
    keeps it for the weight gradient: the tensor its all-gather produced (torch
    ``ColwiseParallel`` after ``SequenceParallel`` / ``PrepareModuleInput``: the linear saves
    the gathered full-sequence input), bf16, or fp8 where the recipe casts before the gather
    (``_precision.TP_FP8_GATHER_RECIPES``: torchao ``PrepareFloat8ModuleInput``; ``Float8Linear``
    then saves the fp8 tensor it was given)."""
    workload = ctx.workload
    fp8_gather = workload.precision == "fp8" and workload.fp8_recipe in TP_FP8_GATHER_RECIPES
    return 1.0 if fp8_gather else ACTIVATION_BYTES


def _ffn_activation_bytes(ctx: TrainingContext, *, width) -> np.ndarray:
    """FC1 output (gate and up for SwiGLU) and the activation output, per token."""
    fc1 = 2.0 if ctx.model.ffn_activation == "swiglu" else 1.0
    return ctx.tokens * width * (fc1 + 1.0) * ACTIVATION_BYTES


def _moe_activation_bytes(ctx: TrainingContext, *, dropped: frozenset[str]) -> np.ndarray:
    """Routed tokens' expert inputs, FC1 outputs and activation outputs, the router's fp32
    logits and probabilities, the shared experts' intermediates; ``moe`` in ``dropped`` keeps
    only the layer input (counted with the norms), ``moe_act`` drops the activation outputs,
    ``shared_experts`` the shared experts' intermediates."""
    moe, h = ctx.model.moe, ctx.model.hidden_size
    assert moe is not None
    if "moe" in dropped:
        return np.zeros_like(ctx.tokens)
    routed = ctx.moe_tokens * moe.top_k * ctx.options.expert_load_factor
    fc1 = 2.0 if ctx.model.ffn_activation == "swiglu" else 1.0
    act = 0.0 if "moe_act" in dropped else 1.0
    # the activation's input in fp8 where the run caches it so (``moe_act_input_fp8``)
    fc1_bytes = 1.0 if ctx.options.moe_act_input_fp8 else ACTIVATION_BYTES
    width = moe.expert_ffn_hidden_size / ctx.column("etp")
    experts = routed * ((h + width * act) * ACTIVATION_BYTES + width * fc1 * fc1_bytes)
    router = ctx.moe_tokens * moe.num_routed_experts * 4.0 * 2.0  # fp32 logits and probabilities
    if "shared_experts" in dropped:
        return experts + router
    shared_width = moe.num_shared_experts * moe.shared_ffn_size / ctx.column("tp")
    return experts + router + _ffn_activation_bytes(ctx, width=shared_width)


def _score_bytes(ctx: TrainingContext) -> np.ndarray:
    """Unfused attention stores softmax output (2 bytes), dropout mask (1) and output (2) per
    score, the 5as^2b/t term; FlashAttention stores only an fp32 log-sum-exp per query."""
    heads = ctx.model.attention.num_heads / ctx.column("tp")
    if ctx.options.flash_attention:
        return ctx.tokens * heads * 4.0
    per_score = ACTIVATION_BYTES + (
        ACTIVATION_BYTES + 1.0 if ctx.options.attention_dropout else 0.0
    )
    return ctx.tokens * heads * ctx.workload.sequence_length_tokens * per_score


def op_level_selective_bytes(ctx: TrainingContext, *, default: np.ndarray) -> np.ndarray:
    """Activation bytes per micro-batch on each rank (3, n) under selective recompute, where
    the framework checkpoints at operator level (``_training_micro_batch._selective_recompute``):
    each layer keeps its input, the attention output and its fp32 log-sum-exp, and every second
    matmul output: torchtitan's policy (``_custom_policy`` of torchtitan's activation
    checkpointing, 9dec370 to b5bcd76) counts a block's matmuls in forward order (Q, K, V,
    output, then gate, up, down of a SwiGLU FFN or up, down) and saves the 1st, 3rd, 5th, ...:
    Q, V, gate and down. Run eagerly, selective checkpointing stores every output its policy
    saves; under torch.compile (``FrameworkProfile.compiled_blocks``) AOTAutograd's partitioner
    keeps only those the backward reads, which drops the last (down projection) output, read by
    nothing but the residual add (measured on torch 2.13: ``tests/test_memory_terms.py``).
    ``default`` (the Megatron accounting) elsewhere, and for MoE layers."""
    if ctx.framework is None or ctx.framework.selective_recompute != "every_second_matmul":
        return default
    model, attention, tp = ctx.model, ctx.model.attention, ctx.column("tp")
    heads, kv_heads = attention.num_heads / tp, np.maximum(attention.num_kv_heads / tp, 1.0)
    h, ffn = model.hidden_size, model.ffn_hidden_size / tp
    outputs: list[np.ndarray] = [
        heads * attention.qk_head_dim,
        kv_heads * attention.qk_head_dim,
        kv_heads * attention.value_head_dim,
        np.asarray(h, dtype=float),
        *([ffn, ffn] if model.ffn_activation == "swiglu" else [ffn]),
        np.asarray(h, dtype=float),
    ]
    saved = outputs[0::2]
    if ctx.framework.compiled_blocks and len(outputs) % 2 == 1:
        saved = saved[:-1]  # the down projection's output: the residual add's backward reads none
    kept = np.sum(np.broadcast_arrays(*saved), axis=0) + heads * attention.value_head_dim + h
    per_layer = ctx.tokens * (kept * ACTIVATION_BYTES + heads * 4.0)
    dense = ctx.layout.dense_layers * per_layer
    moe_share = np.where(
        ctx.layout.layers > 0, ctx.layout.moe_layers / np.maximum(ctx.layout.layers, 1), 0.0
    )
    return dense + moe_share * default


def micro_batches_in_flight(ctx: TrainingContext) -> np.ndarray:
    """Micro-batches of activations held by the first, a middle (rank 1) and the last rank: the
    forwards a rank runs before its first backward (per model chunk when interleaved)."""
    p, v, m = ctx.column("pp"), ctx.column("virtual_stages"), ctx.num_micro_batches
    rank = np.stack([np.zeros_like(p), np.where(p >= 3, 1.0, 0.0), p - 1.0])
    schedule = np.asarray(ctx.table["pipeline_schedule"])
    warmup = np.where(
        schedule == SCHEDULE_CODES["interleaved_1f1b"],
        (p - rank - 1.0) * 2.0 + (v - 1.0) * p,
        p - rank - 1.0,
    )
    held = np.minimum((warmup + 1.0) / v, m)
    # DualPipe holds pp + 1 micro-batches' activations of a stage on every rank (DeepSeek-V3
    # report Table 2: activation PP + 1 against 1F1B's PP), micro-batches entering both ends.
    two = ctx.stage_copies > 1.0
    held = np.where(two, np.minimum(p + 1.0, m), held)
    return np.where(schedule == SCHEDULE_CODES["gpipe"], m, held)


@dataclass(frozen=True)
class _StoredActivations:
    """Activation bytes one micro-batch leaves on each rank (3, n) under the recompute policy,
    before offloading, with the per-layer figures the transients need."""

    per_micro_batch: np.ndarray
    dense_layer: np.ndarray
    moe_layer: np.ndarray
    selective_layers: np.ndarray


def _stored_activations(ctx: TrainingContext) -> _StoredActivations:
    layout, options = ctx.layout, ctx.options
    dense = _layer_activation_bytes(ctx, moe=False)
    moe = _layer_activation_bytes(ctx, moe=True) if ctx.model.moe is not None else dense
    full_layers = layout.dense_layers * dense + layout.moe_layers * moe
    modules = frozenset(options.recompute_modules)
    selective_dense = _layer_activation_bytes(ctx, moe=False, dropped=modules)
    selective_moe = (
        _layer_activation_bytes(ctx, moe=True, dropped=modules)
        if ctx.model.moe is not None
        else selective_dense
    )
    selective_layers = layout.dense_layers * selective_dense + layout.moe_layers * selective_moe
    selective_layers = op_level_selective_bytes(
        ctx, default=selective_layers
    )  # torchtitan-style op SAC
    checkpoint = ctx.tokens * ctx.model.hidden_size * ACTIVATION_BYTES
    checkpoint = np.where(ctx.sequence_parallel, checkpoint / ctx.column("tp"), checkpoint)
    # Full recompute of every layer, or of the first ``recompute_layers`` of each model chunk
    # (Megatron-core's block method); the other layers keep all their activations.
    per_layer = full_layers / np.maximum(layout.layers, 1.0)
    recomputed = ctx.fully_recomputed_layers
    full_recompute = recomputed * checkpoint + (layout.layers - recomputed) * per_layer
    code = np.asarray(ctx.table["recompute"])
    per_micro_batch = np.where(
        code == RECOMPUTE_CODES["full"],
        full_recompute,
        np.where(code == RECOMPUTE_CODES["selective"], selective_layers, full_layers),
    )
    return _StoredActivations(per_micro_batch, dense, moe, selective_layers)


def offloaded_layer_bytes(ctx: TrainingContext) -> np.ndarray:
    """Bytes one offloaded layer copies to the host per micro-batch on each rank (3, n), and
    back for its backward: what a layer keeps under the recompute policy (the mean over the
    rank's layers, as the offloaded share is counted in ``_activation_bytes``)."""
    return _stored_activations(ctx).per_micro_batch / np.maximum(ctx.layout.layers, 1.0)


def _activation_bytes(ctx: TrainingContext) -> np.ndarray:
    layout, options = ctx.layout, ctx.options
    stored = _stored_activations(ctx)
    dense, moe, per_micro_batch = stored.dense_layer, stored.moe_layer, stored.per_micro_batch
    code = np.asarray(ctx.table["recompute"])
    # CPU activation offloading: the first ``activation_offload_layers`` layers' activations
    # live on the host but for the one layer in transit.
    offloaded = np.minimum(float(options.activation_offload_layers), layout.layers)
    kept_per_layer = per_micro_batch / np.maximum(layout.layers, 1.0)
    in_transit = np.where(offloaded > 0, np.maximum(dense, moe), 0.0)
    per_micro_batch = per_micro_batch - offloaded * kept_per_layer
    # Full recompute rebuilds one layer at a time in the backward pass; operator-level selective
    # recompute rebuilds what one layer did not save.
    largest = np.maximum(dense, moe)
    rebuilt = np.maximum(largest - stored.selective_layers / np.maximum(layout.layers, 1.0), 0.0)
    op_level = ctx.framework is not None and (
        ctx.framework.selective_recompute == "every_second_matmul"
    )
    transient = np.where(
        code == RECOMPUTE_CODES["full"],
        largest,
        np.where((code == RECOMPUTE_CODES["selective"]) & op_level, rebuilt, 0.0),
    )
    loss_bytes = _loss_bytes_per_logit(ctx)
    logits_per_micro_batch = (
        layout.has_lm_head * ctx.tokens * ctx.model.vocab_size / ctx.column("tp")
    )
    logits = logits_per_micro_batch * loss_bytes
    if options.pipeline_keeps_outputs:  # the last stage's bf16 logits of every micro-batch
        kept = np.where(ctx.column("pp") > 1, ctx.num_micro_batches, 0.0)
        logits = logits + kept * logits_per_micro_batch * ACTIVATION_BYTES
    elif ctx.torch_pipelining:  # those of the micro-batches in flight, until their backward
        held = np.where(ctx.column("pp") > 1, micro_batches_in_flight(ctx), 0.0)
        logits = logits + held * logits_per_micro_batch * ACTIVATION_BYTES
    return (
        micro_batches_in_flight(ctx) * per_micro_batch + np.maximum(transient, in_transit) + logits
    )


def _loss_bytes_per_logit(ctx: TrainingContext) -> np.ndarray | float:
    """Bytes per logit at the loss (n,): the framework's, its compiled figure where it compiles
    the loss (``FrameworkProfile.compiled_loss_bytes_per_logit``, unless the run kept it eager:
    ``EstimateOptions.eager_loss``), its loss-parallel figure with tp > 1
    (``FrameworkProfile.loss_parallel_bytes_per_logit``), 4 without a framework."""
    framework = ctx.framework
    if framework is None:
        return 4.0
    single = framework.loss_bytes_per_logit
    if framework.compiled_loss_bytes_per_logit is not None and not ctx.options.eager_loss:
        single = framework.compiled_loss_bytes_per_logit
    if framework.loss_parallel_bytes_per_logit is None:
        return single
    return np.where(ctx.column("tp") > 1, framework.loss_parallel_bytes_per_logit, single)


def pipeline_buffer_bytes(ctx: TrainingContext) -> np.ndarray:
    """Bytes (3, n) of the transfers between pipeline stages held on each pipeline rank.

    On torch.distributed.pipelining (``TrainingContext.torch_pipelining``) every model chunk but
    the first keeps a receive buffer per micro-batch for its input, every chunk but the last one
    for its output's gradient, and each chunk but the last holds the output of each micro-batch
    in flight until its backward; all are the size of the transfer between stages (the
    micro-batch's hidden states, split over tp where sequence parallelism leaves them as
    sequence shards). The input buffer
    of a micro-batch in flight is the chunk's first layer input, which the activations already
    hold: only the other micro-batches' input buffers add. (The last chunk's held outputs, the
    logits, are counted with the loss: ``_activation_bytes``.) Elsewhere a receive allocates
    its tensor per transfer and the sent output is freed: a send and a receive buffer of the
    same transfer at a time (Megatron-core ``schedules.get_tensor_shapes``: the sequence
    divided by tp under sequence parallelism)."""
    pp = ctx.column("pp")
    hidden = ctx.tokens * ctx.model.hidden_size * ACTIVATION_BYTES
    message = hidden / np.where(ctx.sequence_parallel, ctx.column("tp"), 1.0)
    if not ctx.torch_pipelining:
        return np.broadcast_to(np.where(pp > 1, 2.0 * message, 0.0), ctx.layout.layers.shape)
    v, m = ctx.column("virtual_stages"), ctx.num_micro_batches
    in_flight = micro_batches_in_flight(ctx)
    input_chunks = v - ctx.layout.has_embedding  # the model's first chunk takes the tokens
    sending_chunks = v - ctx.layout.has_lm_head  # the model's last chunk ends at the loss
    idle_inputs = np.maximum(m - in_flight, 0.0)
    buffers = input_chunks * idle_inputs + sending_chunks * (m + in_flight)
    return np.where(pp > 1, buffers * message, 0.0)


def _comm_buffer_bytes(ctx: TrainingContext) -> np.ndarray:
    hidden = ctx.tokens * ctx.model.hidden_size * ACTIVATION_BYTES
    tp_buffers = np.where(ctx.column("tp") > 1, 2.0 * hidden, 0.0)
    pp_buffers = pipeline_buffer_bytes(ctx)
    ep_buffers: np.ndarray | float = 0.0
    if ctx.model.moe is not None:
        routed = ctx.moe_tokens * ctx.model.moe.top_k * ctx.options.expert_load_factor
        ep_buffers = np.where(
            ctx.column("ep") > 1, 2.0 * routed * ctx.model.hidden_size * ACTIVATION_BYTES, 0.0
        )
    buffers = np.broadcast_to(tp_buffers + pp_buffers + ep_buffers, ctx.layout.layers.shape)
    # ZeRO-2/3 gathered weights and gradient bucket; a stage held unsharded under pp (counted
    # in ``weights`` and ``gradients``) adds only the param-dtype gradient autograd produces for
    # one layer before FSDP2's ``post_backward`` adds it into the accumulated one and frees it.
    dense_layer, moe_dense, moe_expert = layer_parameter_split(ctx)
    layer = np.maximum(dense_layer, moe_dense + moe_expert)
    held_gradient = (ctx.layout.layers > 0) * layer * ACTIVATION_BYTES
    sharding = np.where(pipeline_unsharded_stage(ctx), held_gradient, sharding_buffer_bytes(ctx))
    return buffers + sharding


def stage_memory(ctx: TrainingContext) -> dict[str, np.ndarray]:
    """Bytes per device by ``MEMORY_PARTS`` for each pipeline rank (rows ``STAGES``)."""
    parts = _model_state_bytes(ctx)
    parts["activations"] = _activation_bytes(ctx)
    parts["kv_cache"] = np.zeros(ctx.layout.layers.shape)
    parts["comm_buffers"] = _comm_buffer_bytes(ctx)
    parts["fragmentation"] = ctx.options.fragmentation_fraction * cast(
        np.ndarray, sum(parts.values())
    )
    assert tuple(parts) == tuple(MEMORY_PARTS[:3]) + (
        "activations",
        "kv_cache",
        "comm_buffers",
        "fragmentation",
    )
    return {part: np.broadcast_to(parts[part], ctx.layout.layers.shape) for part in MEMORY_PARTS}


def memory_columns(ctx: TrainingContext) -> dict[str, np.ndarray]:
    """``memory.<part>`` of the rank with the most memory, ``memory_per_device_bytes``,
    ``memory_stage`` (index into ``STAGES``) and the memory ``reason`` code."""
    per_stage = stage_memory(ctx)
    total = cast(np.ndarray, sum(per_stage.values()))
    worst = np.argmax(total, axis=0)[None, :]
    columns = {
        f"memory.{part}": np.take_along_axis(rows, worst, axis=0)[0]
        for part, rows in per_stage.items()
    }
    columns["memory_per_device_bytes"] = np.take_along_axis(total, worst, axis=0)[0]
    columns["memory_stage"] = worst[0]
    memory = {part: columns[f"memory.{part}"] for part in MEMORY_PARTS}
    columns["memory_reason"] = memory_reason(
        memory=memory, capacity_bytes=ctx.cluster.device.memory_bytes
    )
    assert len(STAGES) == total.shape[0]
    return columns
