"""Training recipes: Megatron-LM (``torchrun pretrain_gpt.py`` arguments), torchtitan (0.3.0: the
``--module/--config`` command line with overrides; 0.2.2: a TOML job file) and DeepSpeed
(``ds_config.json`` + a torchrun launch).

Batch arithmetic is kept exact: the plan's global batch ``B`` sequences, micro-batch ``m`` and
data-parallel degree ``dp`` give ``B / (m * dp)`` micro-batches per step (pipeline micro-batches
with pp > 1, gradient-accumulation steps otherwise). DeepSpeed's own check is
``train_batch_size == micro * gradient_accumulation_steps * dp_world`` where its data-parallel
world excludes tp and pp (``deepspeed/runtime/config.py``), so ``dp_world = dp``.
"""

from __future__ import annotations

import json

from autoparallel.export._common import (
    Export,
    Recipe,
    command,
    describe,
    readme,
    rule_violations,
    script,
    stage_sizes,
)
from autoparallel.plan import ShardingPlan
from cost_model import EstimateOptions, ModelSpec, Training
from search import engine_data, version_key

MASTER_PORT = 29500


def _batch(plan: ShardingPlan) -> tuple[int, int]:
    """(sequence length, global batch in sequences); an inference plan gives (prompt, dp x micro)."""
    job = plan.job
    if isinstance(job, Training):
        return job.sequence_length_tokens, int(job.global_batch_sequences)
    return job.prompt_tokens, plan.config.dp * plan.config.micro_batch_size


def _serving_dropped(plan: ShardingPlan, engine: str) -> list[str]:
    serving = plan.serving
    if serving is None:
        return []
    return [
        (
            f"serving settings (batch {serving.batch_size}, KV {serving.kv_dtype}, {serving.num_redundant_experts} redundant experts, "
            f"two-batch overlap {serving.two_batch_overlap}) have no {engine} setting"
        )
    ]


def _model(plan: ShardingPlan) -> ModelSpec:
    return plan.model


def _partial_node(plan: ShardingPlan, recipe: Recipe) -> list[str]:
    """torchrun starts the same number of processes on every node: a world that is not a whole
    number of nodes cannot be launched as one job."""
    per_node = recipe.devices_per_node
    if plan.world_size <= per_node or plan.world_size % per_node == 0:
        return []
    nodes = recipe.nodes(plan.world_size)
    message = f"world {plan.world_size} is not a whole number of {per_node}-device nodes: "
    return [message + f"torchrun runs {per_node} processes on each of {nodes} nodes"]


def torchrun(plan: ShardingPlan, recipe: Recipe, entry: list[str]) -> list[str]:
    nodes = recipe.nodes(plan.world_size)
    return [
        "torchrun",
        "--nnodes",
        str(nodes),
        "--nproc-per-node",
        str(recipe.processes_per_node(plan.world_size)),
        "--node-rank",
        "${NODE_RANK}" if nodes > 1 else "0",
        "--master-addr",
        "${MASTER_ADDR}" if nodes > 1 else "127.0.0.1",
        "--master-port",
        str(MASTER_PORT),
        *entry,
    ]


def _steps(plan: ShardingPlan, recipe: Recipe, file: str) -> list[str]:
    nodes = recipe.nodes(plan.world_size)
    if nodes == 1:
        return [f"bash {file}"]
    return [
        f"on each of the {nodes} nodes: NODE_RANK=<0..{nodes - 1}> MASTER_ADDR=<address of node 0> bash {file}"
    ]


# ---------------------------------------------------------------------------- Megatron-LM
def megatron(plan: ShardingPlan, recipe: Recipe) -> Export:
    c = plan.config
    dropped = (
        _serving_dropped(plan, "Megatron-LM")
        + _partial_node(plan, recipe)
        + rule_violations(plan, c, engine="megatron", version=recipe.version)
    )
    notes: list[str] = []
    sequence, batch = _batch(plan)
    args = [
        "--num-layers",
        str(plan.model.num_layers),
        "--seq-length",
        str(sequence),
        "--bf16",
        *_megatron_model(_model(plan), recipe, notes),
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
    if c.zero_stage in (1, 2):
        args.append("--use-distributed-optimizer")
        notes.append(
            "Megatron's distributed optimizer shards optimizer states and reduce-scatters gradients (ZeRO-1/2)"
        )
    elif (
        c.zero_stage == 3
    ):  # Megatron-LM's torch FSDP2 path and the companions validate_args asks for
        args += [
            "--use-torch-fsdp2",
            "--no-gradient-accumulation-fusion",
            "--ckpt-format",
            "torch_dist",
            "--untie-embeddings-and-output-weights",
        ]
    args += ["--train-iters", "${TRAIN_ITERS:-1000}", "--lr", "${LR:-3e-4}"]
    if plan.serving is not None:
        notes.append(
            "the plan is for inference: batch and sequence are the serving batch and prompt"
        )
    words = torchrun(plan, recipe, ["pretrain_gpt.py"]) + args
    file = "megatron_args.sh"
    header = [
        f"Megatron-LM core_v{recipe.version}: {describe(c)}",
        "run from a Megatron-LM checkout",
    ]
    # Megatron (Hopper and before): tp/cp want one CUDA connection, its FSDP more than one (validate_args)
    connections = "32" if c.zero_stage == 3 else "1"
    files = {
        file: script(
            command(words, env={"CUDA_DEVICE_MAX_CONNECTIONS": connections}),
            header=header,
        )
    }
    files["README_megatron.md"] = readme(
        title="Megatron-LM launch recipe",
        recipe=recipe,
        steps=_steps(plan, recipe, file),
        dropped=dropped,
        notes=notes,
        layout=describe(c),
    )
    return Export("megatron", files, tuple(dropped), tuple(notes), recipe.version)


def _megatron_dispatcher(options: EstimateOptions) -> list[str]:
    """The token dispatcher the plan was priced with: DeepEP through the flex dispatcher, else
    the all-to-all one (``_training_comm`` prices an all-to-all), which Megatron-core does not
    default to (``TransformerConfig.moe_token_dispatcher_type`` defaults to ``allgather``,
    megatron-core 0.16.1 transformer_config.py)."""
    if options.expert_dispatcher == "deepep":
        return ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "deepep"]
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
    if options.cuda_graphs == "partial":
        args += ["--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope"]
        args += list(options.cuda_graph_scope)
    elif options.cuda_graphs == "full_iteration":
        args += ["--cuda-graph-impl", "local", "--cuda-graph-scope", "full_iteration"]
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
        "pipeline_keeps_outputs": "the last stage keeping every micro-batch's outputs",
    }
    for field, what in unmatched.items():
        if getattr(options, field) not in (None, False):
            dropped.append(f"{what} ({field}) has no Megatron-LM argument")
    return args


def _megatron_model(model: ModelSpec, recipe: Recipe, notes: list[str]) -> list[str]:
    """Model-shape arguments (Megatron builds the model from them; arguments.py names)."""
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
    args += ["--swiglu"] if model.ffn_activation == "swiglu" else []
    args += [] if model.linear_bias else ["--disable-bias-linear"]
    args += ["--add-qkv-bias"] if model.qkv_bias and not model.linear_bias else []
    args += [] if model.tie_word_embeddings else ["--untie-embeddings-and-output-weights"]
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
    if model.moe is not None:
        moe = model.moe
        dense, sparse = moe.num_dense_layers, model.num_layers - moe.num_dense_layers
        args += [
            "--num-experts",
            str(moe.num_routed_experts),
            "--moe-router-topk",
            str(moe.top_k),
            "--moe-ffn-hidden-size",
            str(moe.expert_ffn_hidden_size),
            "--moe-grouped-gemm",
            "--moe-layer-freq",
            f"([0]*{dense}+[1]*{sparse})" if dense else "1",
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


# ---------------------------------------------------------------------------- torchtitan
def torchtitan(plan: ShardingPlan, recipe: Recipe) -> Export:
    c = plan.config
    dropped = (
        _serving_dropped(plan, "torchtitan")
        + _partial_node(plan, recipe)
        + rule_violations(plan, c, engine="torchtitan", version=recipe.version)
    )
    notes: list[str] = []
    if version_key(recipe.version) < (0, 3, 0):
        return _torchtitan_toml(plan, recipe, dropped, notes)
    sequence, batch = _batch(plan)
    module, config_name = _torchtitan_config(plan, notes, dropped)
    local = batch // c.dp if c.pp > 1 else c.micro_batch_size
    args = [
        "-m",
        "torchtitan.train",
        "--module",
        module,
        "--config",
        config_name,
        "--hf_assets_path",
        recipe.model_path,
        "--training.seq_len",
        str(sequence),
        "--training.global_batch_size",
        str(batch),
        "--training.local_batch_size",
        str(local),
        "--training.mixed_precision_param",
        "bfloat16",
        *_titan_parallelism(plan),
    ]
    if c.pp > 1:
        # one word per model part, its module names joined by commas (torchtitan's list[str] rule)
        args += [
            "--parallelism.module_fqns_per_model_part",
            *(",".join(part) for part in model_parts(plan)),
        ]
    if (
        c.pp > 1 or c.ep > 1
    ):  # torchtitan's Trainer.Config check: its CUDA graphs run without PP or host-synchronizing EP
        args.append("--training.disable_cuda_graphs")
    args.append(
        f"activation-checkpoint:{c.recompute}"
    )  # a subcommand of the 0.3 config (tyro), after the options
    file = "launch_torchtitan.sh"
    words = torchrun(plan, recipe, args)
    header = [f"torchtitan {recipe.version}: {describe(c)}"]
    files = {file: script(command(words), header=header)}
    notes.append(
        f"grad accumulation: {batch // (local * c.dp)} step(s) of local batch {local} per data-parallel rank"
    )
    files["README_torchtitan.md"] = readme(
        title="torchtitan launch recipe",
        recipe=recipe,
        steps=_steps(plan, recipe, file),
        dropped=dropped,
        notes=notes,
        layout=describe(c),
    )
    return Export("torchtitan", files, tuple(dropped), tuple(notes), recipe.version)


def _titan_parallelism(plan: ShardingPlan) -> list[str]:
    c = plan.config
    shard, replicate = (c.dp, 1) if c.zero_stage >= 1 else (1, c.dp)
    schedule = {
        "gpipe": "GPipe",
        "1f1b": "1F1B",
        "interleaved_1f1b": "Interleaved1F1B",
        "zero_bubble": "1F1B",
    }[c.pipeline_schedule]
    return [
        "--parallelism.data_parallel_replicate_degree",
        str(replicate),
        "--parallelism.data_parallel_shard_degree",
        str(shard),
        "--parallelism.fsdp_reshard_after_forward",
        _reshard(c.zero_stage),
        "--parallelism.tensor_parallel_degree",
        str(c.tp),
        "--parallelism.enable_sequence_parallel"
        if c.sequence_parallel or c.tp == 1
        else "--parallelism.no-enable_sequence_parallel",
        "--parallelism.context_parallel_degree",
        str(c.cp),
        "--parallelism.pipeline_parallel_degree",
        str(c.pp),
        "--parallelism.pipeline_parallel_schedule",
        schedule,
        "--parallelism.pipeline_parallel_microbatch_size",
        str(c.micro_batch_size),
        "--parallelism.expert_parallel_degree",
        str(c.ep),
    ]


def _reshard(zero_stage: int) -> str:
    """FSDP2's reshard-after-forward policy of a ZeRO stage: ``never`` keeps the gathered
    parameters (ZeRO-2), ``always`` frees them (ZeRO-3); torchtitan's ``default`` means ``never``
    with pipeline parallel (torchtitan/distributed/fsdp.py), so it is never used."""
    return "never" if zero_stage in (1, 2) else "always"


def _torchtitan_config(plan: ShardingPlan, notes: list[str], dropped: list[str]) -> tuple[str, str]:
    configs = engine_data()["torchtitan_configs"]
    name = plan.model.name
    if name in configs:
        return tuple(configs[name])  # type: ignore[return-value]
    model = _model(plan)
    family = (
        "_family_dense"
        if model.moe is None
        else ("_family_moe_mla" if model.attention.kind == "mla" else "_family_moe")
    )
    module, config = configs[family]
    dropped.append(
        f"model shape: torchtitan {module} has no config for {name}; exported with {config} "
        f"(write a config_registry function with {name}'s shape and pass it as --config)"
    )
    return module, config


def model_parts(plan: ShardingPlan) -> list[list[str]]:
    """torchtitan module FQNs of each pipeline chunk (exact, uneven splits included)."""
    parts = []
    for stage in sorted(plan.stages, key=lambda s: s.chunk):
        names = ["tok_embeddings"] if stage.has_embedding else []
        names += [f"layers.{i}" for i in range(stage.start_layer, stage.stop_layer)]
        names += ["norm", "output"] if stage.has_lm_head else []
        parts.append(names)
    return parts


def _torchtitan_toml(
    plan: ShardingPlan, recipe: Recipe, dropped: list[str], notes: list[str]
) -> Export:
    """torchtitan 0.2.x: a TOML job file read with ``--job.config_file``."""
    c = plan.config
    sequence, batch = _batch(plan)
    local = batch // c.dp if c.pp > 1 else c.micro_batch_size
    shard, replicate = (c.dp, 1) if c.zero_stage >= 1 else (1, c.dp)
    schedule = {
        "gpipe": "GPipe",
        "1f1b": "1F1B",
        "interleaved_1f1b": "Interleaved1F1B",
        "zero_bubble": "1F1B",
    }[c.pipeline_schedule]
    model = _model(plan)
    flavor = "671B" if plan.model.name == "deepseek-v3" else "405B"
    name = "deepseek_v3" if model.moe is not None else "llama3"
    lines = [
        "[model]",
        f'name = "{name}"',
        f'flavor = "{flavor}"',
        f'hf_assets_path = "{recipe.model_path}"',
        "",
        "[training]",
        f"seq_len = {sequence}",
        f"global_batch_size = {batch}",
        f"local_batch_size = {local}",
        "",
        "[parallelism]",
        f"data_parallel_replicate_degree = {replicate}",
        f"data_parallel_shard_degree = {shard}",
        f'fsdp_reshard_after_forward = "{_reshard(c.zero_stage)}"',
        f"tensor_parallel_degree = {c.tp}",
        f"context_parallel_degree = {c.cp}",
        f"pipeline_parallel_degree = {c.pp}",
        f'pipeline_parallel_schedule = "{schedule}"',
        f"pipeline_parallel_microbatch_size = {c.micro_batch_size}",
        f"expert_parallel_degree = {c.ep}",
        f"expert_tensor_parallel_degree = {c.etp}",
    ]
    if c.pp > 1:
        lines.append("module_fqns_per_model_part = " + json.dumps(model_parts(plan)))
    lines += ["", "[activation_checkpoint]", f'mode = "{c.recompute}"']
    file = "launch_torchtitan.sh"
    words = torchrun(
        plan, recipe, ["-m", "torchtitan.train", "--job.config_file", "torchtitan.toml"]
    )
    files = {
        "torchtitan.toml": "\n".join(lines) + "\n",
        file: script(command(words), header=[f"torchtitan {recipe.version}: {describe(c)}"]),
    }
    files["README_torchtitan.md"] = readme(
        title="torchtitan launch recipe (TOML)",
        recipe=recipe,
        steps=_steps(plan, recipe, file),
        dropped=dropped,
        notes=notes,
        layout=describe(c),
    )
    return Export("torchtitan", files, tuple(dropped), tuple(notes), recipe.version)


# ---------------------------------------------------------------------------- DeepSpeed
def deepspeed(plan: ShardingPlan, recipe: Recipe) -> Export:
    c = plan.config
    _, batch = _batch(plan)
    dropped = (
        _serving_dropped(plan, "DeepSpeed")
        + _partial_node(plan, recipe)
        + rule_violations(plan, c, engine="deepspeed", version=recipe.version)
    )
    config: dict = {
        "train_batch_size": batch,
        "train_micro_batch_size_per_gpu": c.micro_batch_size,
        "gradient_accumulation_steps": max(1, batch // (c.dp * c.micro_batch_size)),
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": c.zero_stage},
    }
    if c.tp > 1:
        config["tensor_parallel"] = {"autotp_size": c.tp}
    if c.recompute != "none":
        config["activation_checkpointing"] = {
            "partition_activations": c.tp > 1,
            "contiguous_memory_optimization": False,
        }
    notes = [
        f"data-parallel world {c.dp} = world {plan.world_size} / (tp {c.tp} x pp {c.pp} x cp {c.cp})"
    ]
    if c.pp > 1:
        notes.append(
            f"pipeline: deepspeed.pipe.PipelineModule(num_stages={c.pp}, partition_method='custom' stage layers {stage_sizes(plan)})"
        )
    if c.ep > 1:
        notes.append(f"experts: deepspeed.moe.layer.MoE(ep_size={c.ep}) in the model code")
    file = "launch_deepspeed.sh"
    words = torchrun(
        plan,
        recipe,
        ["train.py", "--deepspeed", "--deepspeed_config", "ds_config.json"],
    )
    files = {
        "ds_config.json": json.dumps(config, indent=2) + "\n",
        file: script(command(words), header=[f"DeepSpeed {recipe.version}: {describe(c)}"]),
    }
    files["README_deepspeed.md"] = readme(
        title="DeepSpeed launch recipe",
        recipe=recipe,
        steps=_steps(plan, recipe, file),
        dropped=dropped,
        notes=notes,
        layout=describe(c),
    )
    return Export("deepspeed", files, tuple(dropped), tuple(notes), recipe.version)
