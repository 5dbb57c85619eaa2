"""torchtitan export: 0.3.0's ``--module/--config`` command line with overrides, or 0.2.x's
TOML job file (``--job.config_file``).

Data parallel is FSDP2 sharding under ZeRO (``data_parallel_shard_degree = dp``) and replication
without it; reshard-after-forward is ``never`` for ZeRO-1/2 and ``always`` for ZeRO-3
(torchtitan's ``default`` means ``never`` with pipeline parallel, torchtitan/distributed/fsdp.py,
so it is never written). Pipeline chunks are written exactly, one word of module FQNs per model
part. A model without a torchtitan config is exported with its family's config and the shape
mismatch goes to ``Export.dropped``. Batch arithmetic and the shared launch helpers:
``_training``.
"""

from __future__ import annotations

import json

from autoparallel.export._common import (
    Export,
    Recipe,
    command,
    describe,
    script,
)
from autoparallel.export._training import (
    _batch,
    _model,
    finished_export,
    torchrun,
    training_dropped,
)
from autoparallel.plan import ShardingPlan
from search import engine_data, version_key

__all__ = ["model_parts", "torchtitan"]


def torchtitan(plan: ShardingPlan, recipe: Recipe) -> Export:
    c = plan.config
    dropped = training_dropped(plan, recipe, engine="torchtitan", label="torchtitan")
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
    return finished_export(
        "torchtitan",
        files,
        title="torchtitan launch recipe",
        plan=plan,
        recipe=recipe,
        script_file=file,
        dropped=dropped,
        notes=notes,
    )


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
    flavor = configs["_flavors"].get(name)
    if flavor is not None:  # the engine has the shape, but no config that trains it
        module, config, shape = flavor
        dropped.append(
            f"model shape: torchtitan {module} has no config for {name}; exported with {config} "
            f"(write a config_registry function returning model_registry({shape!r}) and pass it "
            "as --config)"
        )
        return module, config
    module, config = configs[_family(plan)]
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


def _family(plan: ShardingPlan) -> str:
    """The key of the plan's model family in the engine data: dense, MoE, or MoE with MLA."""
    model = _model(plan)
    if model.moe is None:
        return "_family_dense"
    return "_family_moe_mla" if model.attention.kind == "mla" else "_family_moe"


def _toml_model(plan: ShardingPlan, dropped: list[str]) -> tuple[str, str]:
    """torchtitan 0.2.x's ``[model]`` name and flavor of the plan's model; a model it has no
    flavor of is exported with its family's, the mismatch in ``dropped``."""
    models = engine_data()["torchtitan_toml_models"]
    name = plan.model.name
    if name in models:
        return tuple(models[name])  # type: ignore[return-value]
    module, flavor = models[_family(plan)]
    dropped.append(
        f"model shape: torchtitan {module} has no flavor for {name}; exported with {flavor} "
        f"(add a flavor with {name}'s shape to torchtitan/models/{module}/__init__.py)"
    )
    return module, flavor


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
    name, flavor = _toml_model(plan, dropped)
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
    return finished_export(
        "torchtitan",
        files,
        title="torchtitan launch recipe (TOML)",
        plan=plan,
        recipe=recipe,
        script_file=file,
        dropped=dropped,
        notes=notes,
    )
