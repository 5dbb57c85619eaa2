"""Megatron-LM export: the ``torchrun pretrain_gpt.py`` arguments of a plan.

Model-shape arguments use Megatron's ``arguments.py`` names (Megatron builds the model from
them); the token dispatcher is the one the plan was priced with (DeepEP through the flex
dispatcher, else all-to-all, which Megatron-core does not default to:
``TransformerConfig.moe_token_dispatcher_type`` defaults to ``allgather``, megatron-core 0.16.1
transformer_config.py); recompute is selective with the priced modules, or full over uniform or
block layers; an uneven or interleaved pipeline is written exactly as
``--pipeline-model-parallel-layout``. A software setting Megatron-core has no argument for goes
to ``Export.dropped``. Batch arithmetic and the shared launch helpers: ``_training``.
"""

from __future__ import annotations

from autoparallel.export._common import (
    Export,
    Recipe,
    command,
    describe,
    script,
    stage_sizes,
)
from autoparallel.export._training import (
    _batch,
    _model,
    finished_export,
    torchrun,
    training_dropped,
)
from autoparallel.plan import ShardingPlan
from cost_model import EstimateOptions, ModelSpec, ParallelConfig, Training

__all__ = [
    "megatron",
    "megatron_layout",
    "megatron_pipeline",
    "megatron_precision",
    "megatron_recipe",
]


def megatron(plan: ShardingPlan, recipe: Recipe) -> Export:
    """The Megatron-LM export of ``plan``: its launch script, README, dropped settings, notes."""
    c = plan.config
    dropped = training_dropped(plan, recipe, engine="megatron", label="Megatron-LM")
    notes: list[str] = []
    sequence, batch = _batch(plan)
    args = [
        "--num-layers",
        str(plan.model.num_layers),
        "--seq-length",
        str(sequence),
        "--bf16",
        *_megatron_model(_model(plan), recipe, notes, dropped=dropped),
        "--tensor-model-parallel-size",
        str(c.tp),
        "--pipeline-model-parallel-size",
        str(c.pp),
        "--context-parallel-size",
        str(c.cp),
        "--micro-batch-size",
        str(c.micro_batch_size),
        "--global-batch-size",
        str(batch),
    ]
    options = plan.estimate_options or EstimateOptions()
    if plan.moe_mesh_axes:
        args += [
            "--expert-model-parallel-size",
            str(c.ep),
            "--expert-tensor-parallel-size",
            str(c.etp),
        ]
        args += _megatron_dispatcher(options)
    if c.sequence_parallel and c.tp > 1:
        args.append("--sequence-parallel")
    args += megatron_pipeline(plan)
    args += _megatron_recompute(c, options)
    args += megatron_recipe(plan, dropped)
    args += _megatron_sharding(c, notes=notes)
    args += megatron_precision(plan, dropped)
    args += ["--train-iters", "${TRAIN_ITERS:-1000}", "--lr", "${LR:-3e-4}"]
    if plan.serving is not None:
        notes.append(
            "the plan is for inference: batch and sequence are the serving batch and prompt"
        )
    file = "megatron_args.sh"
    files = {file: _megatron_script(plan, recipe=recipe, args=args)}
    return finished_export(
        "megatron",
        files,
        title="Megatron-LM launch recipe",
        plan=plan,
        recipe=recipe,
        script_file=file,
        dropped=dropped,
        notes=notes,
    )


#: The plan's fp8 scaling recipe -> Megatron-core's ``--fp8-recipe`` (TransformerConfig
#: ``fp8_recipe``: tensorwise is Transformer Engine's current scaling, Float8CurrentScaling;
#: blockwise its 1x128 / 128x128 block scaling, Float8BlockScaling); torchao's row-wise scaling
#: has none.
MEGATRON_FP8_RECIPES = {
    "delayed": "delayed",
    "current": "tensorwise",
    "tensorwise": "tensorwise",
    "blockwise": "blockwise",
    "mxfp8": "mxfp8",
}


def megatron_precision(plan: ShardingPlan, dropped: list[str]) -> list[str]:
    """Megatron-core arguments of the training precision the plan was priced with (``plan.job``):
    fp8 GEMMs (``--fp8-format hybrid``: E4M3 forward, E5M2 gradients, and ``--fp8-recipe``) with
    the bf16 layers kept at each end, bf16 gradient reduction, bf16 optimizer moments (the
    precision-aware optimizer); what Megatron-core has no argument for goes to ``dropped``."""
    job = plan.job
    if not isinstance(job, Training):
        return []
    args: list[str] = []
    if job.precision == "fp8":
        recipe = MEGATRON_FP8_RECIPES.get(job.fp8_recipe)
        if recipe is None:
            dropped.append(
                f"the fp8 recipe ({job.fp8_recipe!r}) has no Megatron-core --fp8-recipe: the script "
                "trains in bf16"
            )
        else:
            args += ["--fp8-format", "hybrid", "--fp8-recipe", recipe]
            start, end = job.fp8_bf16_layers_at_start, job.fp8_bf16_layers_at_end
            if start or end:
                args += ["--first-last-layers-bf16"]
                args += ["--num-layers-at-start-in-bf16", str(start)]
                args += ["--num-layers-at-end-in-bf16", str(end)]
    elif job.precision == "fp16":
        dropped.append("fp16 training (precision) is not written: the script trains in bf16")
    if job.gradient_dtype == "bf16" and job.master_weights_fp32:
        args.append("--grad-reduce-in-bf16")
    if job.optimizer_state_dtype == "bf16":
        args += ["--use-precision-aware-optimizer"]
        args += ["--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"]
    if not job.master_weights_fp32:
        dropped.append(
            "no fp32 master weights (master_weights_fp32 False) has no Megatron-LM argument: "
            "its optimizer keeps fp32 main parameters"
        )
    return args


def _megatron_sharding(c: ParallelConfig, *, notes: list[str]) -> list[str]:
    """The optimizer-state and parameter sharding arguments of the plan's ZeRO stage."""
    if c.zero_stage in (1, 2):
        notes.append(
            "Megatron's distributed optimizer shards optimizer states and reduce-scatters gradients (ZeRO-1/2)"
        )
        return ["--use-distributed-optimizer"]
    if c.zero_stage == 3:
        # Megatron-LM's torch FSDP2 path and the companions validate_args asks for
        return [
            "--use-torch-fsdp2",
            "--no-gradient-accumulation-fusion",
            "--ckpt-format",
            "torch_dist",
            "--untie-embeddings-and-output-weights",
        ]
    return []


def _megatron_script(plan: ShardingPlan, *, recipe: Recipe, args: list[str]) -> str:
    """The ``torchrun pretrain_gpt.py`` launch script with Megatron's arguments."""
    c = plan.config
    words = torchrun(plan, recipe, ["pretrain_gpt.py"]) + args
    header = [
        f"Megatron-LM core_v{recipe.version}: {describe(c)}",
        "run from a Megatron-LM checkout",
    ]
    # Megatron (Hopper and before): tp/cp want one CUDA connection, its FSDP more than one (validate_args)
    connections = "32" if c.zero_stage == 3 else "1"
    return script(
        command(words, env={"CUDA_DEVICE_MAX_CONNECTIONS": connections}),
        header=header,
    )


def _megatron_dispatcher(options: EstimateOptions) -> list[str]:
    """The token dispatcher the plan was priced with: DeepEP or HybridEP through the flex
    dispatcher (``TransformerConfig.moe_flex_dispatcher_backend``: 'deepep', 'hybridep' or
    'ncclep'), else the all-to-all one (``_training_comm`` prices an all-to-all), which
    Megatron-core does not default to (``TransformerConfig.moe_token_dispatcher_type`` defaults
    to ``allgather``, megatron-core 0.16.1 transformer_config.py)."""
    if options.expert_dispatcher in ("deepep", "hybridep"):
        backend = options.expert_dispatcher
        return ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", backend]
    return ["--moe-token-dispatcher-type", "alltoall"]


def _megatron_recompute(c, options: EstimateOptions) -> list[str]:
    """Megatron-core's recompute arguments: selective with the modules the plan was priced with,
    full of every layer (uniform, one layer per checkpoint) or of the first
    ``recompute_layers`` of each chunk (block)."""
    if c.recompute == "selective":
        modules = options.recompute_modules
        chosen = [] if modules == ("core_attn",) else ["--recompute-modules", *modules]
        return ["--recompute-granularity", "selective", *chosen]
    if c.recompute == "full":
        method, layers = (
            ("uniform", 1)
            if options.recompute_layers is None
            else ("block", options.recompute_layers)
        )
        return [
            "--recompute-granularity",
            "full",
            "--recompute-method",
            method,
            "--recompute-num-layers",
            str(layers),
        ]
    return []


def megatron_recipe(plan: ShardingPlan, dropped: list[str]) -> list[str]:
    """Megatron-core arguments of the software settings the plan was priced with
    (``ShardingPlan.estimate_options``, beside recompute); a setting Megatron-core has no
    argument for goes to ``dropped``."""
    options = plan.estimate_options
    if options is None:
        return []
    args: list[str] = []
    c = plan.config
    if options.expert_parallel_comm_overlap:
        # Megatron-core's checks of the option; the cost model prices it inert elsewhere
        if c.ep > 1 and (c.pp == 1 or c.virtual_stages > 1) and c.recompute != "full":
            # Megatron-Bridge's moe_a2a_overlap sets both
            args += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
        else:
            dropped.append(
                "EP all-to-all overlap (expert_parallel_comm_overlap) is not written: "
                "Megatron-core runs it only with ep > 1, virtual stages when pp > 1 and no full "
                "recompute"
            )
    if options.tp_comm_overlap:
        if c.tp > 1 and c.sequence_parallel:
            args.append("--tp-comm-overlap")
        else:
            dropped.append(
                "tensor-parallel communication overlap (tp_comm_overlap) is not written: "
                "Megatron-core pipelines it only with tp > 1 and sequence parallel"
            )
    if options.cuda_graphs == "partial":
        args += ["--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope"]
        args += list(options.cuda_graph_scope)
    elif options.cuda_graphs == "full_iteration":
        args += ["--cuda-graph-impl", "local", "--cuda-graph-scope", "full_iteration"]
    if options.moe_capacity_factor is not None:
        args += ["--moe-expert-capacity-factor", f"{options.moe_capacity_factor:g}"]
        if options.moe_pad_to_capacity:
            args.append("--moe-pad-expert-input-to-capacity")
    if options.activation_offload_layers:
        args += ["--cpu-offloading-num-layers", str(options.activation_offload_layers)]
    if options.optimizer_instances > 1:
        args += ["--num-distributed-optimizer-instances", str(options.optimizer_instances)]
    if options.context_parallel == "all_gather":
        args += ["--cp-comm-type", "all_gather"]
    unmatched = {
        "expert_dispatch_fp8": "fp8 dispatch with bf16 combine",
        "max_routed_nodes": f"node-limited routing to {options.max_routed_nodes} nodes (set "
        "--moe-router-num-groups / --moe-router-group-topk by the model's expert groups)",
        "bidirectional_pipeline": "a DualPipe-style bidirectional pipeline",
        "moe_act_input_fp8": "the experts' activation inputs kept in fp8",
        "pipeline_keeps_outputs": "the last stage keeping every micro-batch's outputs",
        "eager_loss": "an eager loss beside a compiled model",
    }
    for field, what in unmatched.items():
        if getattr(options, field) not in (None, False):
            dropped.append(f"{what} ({field}) has no Megatron-LM argument")
    return args


def _unbuilt_attention(model: ModelSpec) -> list[str]:
    """What of the model's attention the exported arguments do not build: attention other than
    full (windows, chunks, linear layers, DSA's indexer) or a gated attention output."""
    a = model.attention
    unbuilt = []
    if a.variant != "full":
        unbuilt.append(f"attention variant {a.variant!r}")
    if a.full_layer_fraction:
        unbuilt.append(f"full attention in {a.full_layer_fraction:.0%} of the layers only")
    if a.output_gate:
        unbuilt.append("the gated attention output")
    if a.indexer_heads:
        unbuilt.append("the DSA indexer")
    return unbuilt


def _megatron_model(
    model: ModelSpec, recipe: Recipe, notes: list[str], *, dropped: list[str] | None = None
) -> list[str]:
    """Model-shape arguments (Megatron builds the model from them; arguments.py names). What
    the arguments cannot build goes to ``dropped`` (``_unbuilt_attention``)."""
    unbuilt = _unbuilt_attention(model)
    if unbuilt and dropped is not None:
        dropped.append(
            f"{', '.join(unbuilt)} (model.attention) has no Megatron-LM model argument here: the "
            "script builds full attention"
        )
    args = [
        "--tokenizer-type",
        "HuggingFaceTokenizer",
        "--tokenizer-model",
        recipe.model_path,
    ]
    attention = model.attention
    args += [
        "--hidden-size",
        str(model.hidden_size),
        "--ffn-hidden-size",
        str(model.ffn_hidden_size),
        "--num-attention-heads",
        str(attention.num_heads),
        "--max-position-embeddings",
        str(model.max_context_tokens),
        "--vocab-size",
        str(model.vocab_size),
        "--normalization",
        "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm",
        "--position-embedding-type",
        "rope" if model.position_embedding == "rope" else "learned_absolute",
    ]
    args += {"swiglu": ["--swiglu"], "relu2": ["--squared-relu"]}.get(model.ffn_activation, [])
    args += [] if model.linear_bias else ["--disable-bias-linear"]
    args += ["--add-qkv-bias"] if model.qkv_bias and not model.linear_bias else []
    args += [] if model.tie_word_embeddings else ["--untie-embeddings-and-output-weights"]
    # the query and key norms of Qwen3 (Megatron-LM arguments.py: --qk-layernorm)
    args += ["--qk-layernorm"] if attention.qk_norm else []
    if attention.kind == "mla":
        args += [
            "--multi-latent-attention",
            "--kv-lora-rank",
            str(attention.kv_lora_rank),
            "--qk-head-dim",
            str(attention.qk_nope_head_dim),
            "--qk-pos-emb-head-dim",
            str(attention.qk_rope_head_dim),
            "--v-head-dim",
            str(attention.v_head_dim),
        ]
        args += ["--q-lora-rank", str(attention.q_lora_rank)] if attention.q_lora_rank else []
    else:
        args += ["--kv-channels", str(attention.head_dim)]
        if attention.num_kv_heads != attention.num_heads:
            args += [
                "--group-query-attention",
                "--num-query-groups",
                str(attention.num_kv_heads),
            ]
    return args + _megatron_moe(model)


def _megatron_moe(model: ModelSpec) -> list[str]:
    """The MoE arguments: experts, top-k, expert width, which layers are MoE, shared experts."""
    moe = model.moe
    if moe is None:
        return []
    dense, sparse = moe.num_dense_layers, model.num_layers - moe.num_dense_layers
    pattern = ",".join("1" if model.is_moe_layer(i) else "0" for i in range(model.num_layers))
    args = [
        "--num-experts",
        str(moe.num_routed_experts),
        "--moe-router-topk",
        str(moe.top_k),
        "--moe-ffn-hidden-size",
        str(moe.expert_ffn_hidden_size),
        "--moe-grouped-gemm",
        "--moe-layer-freq",
        f"[{pattern}]"
        if moe.moe_layer_step > 1
        else (f"([0]*{dense}+[1]*{sparse})" if dense else "1"),
    ]
    if moe.num_shared_experts:
        shared = moe.num_shared_experts * (
            moe.shared_expert_ffn_hidden_size or moe.expert_ffn_hidden_size
        )
        args += ["--moe-shared-expert-intermediate-size", str(shared)]
    return args


def megatron_layout(plan: ShardingPlan) -> str:
    """``--pipeline-model-parallel-layout``: chunks in order (chunk i on pipeline rank i % pp),
    ``E`` embedding, ``t`` a transformer layer, ``L`` the loss head, ``|`` between chunks."""
    parts = []
    for stage in sorted(plan.stages, key=lambda s: s.chunk):
        size = stage.stop_layer - stage.start_layer
        text = ("E" if stage.has_embedding else "") + (f"t*{size}" if size > 1 else "t" * size)
        text += "L" if stage.has_lm_head else ""
        parts.append(text)
    return "|".join(parts)


def megatron_pipeline(plan: ShardingPlan) -> list[str]:
    """Exact stage layers: the layout string whenever the split is uneven or interleaved."""
    c = plan.config
    sizes = stage_sizes(plan)
    if c.pp == 1:
        return []
    if c.virtual_stages == 1 and len(set(sizes)) == 1:
        return []
    return ["--pipeline-model-parallel-layout", megatron_layout(plan)]
