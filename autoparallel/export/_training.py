"""Training recipes: Megatron-LM (``torchrun pretrain_gpt.py`` arguments), torchtitan (0.3.0: the
``--module/--config`` command line with overrides; 0.2.2: a TOML job file) and DeepSpeed
(``ds_config.json`` + a torchrun launch).

Batch arithmetic is kept exact: the plan's global batch ``B`` sequences, micro-batch ``m`` and
data-parallel degree ``dp`` give ``B / (m * dp)`` micro-batches per step (pipeline micro-batches
with pp > 1, gradient-accumulation steps otherwise). DeepSpeed's own check is
``train_batch_size == micro * gradient_accumulation_steps * dp_world`` where its data-parallel
world excludes tp and pp (``deepspeed/runtime/config.py``), so ``dp_world = dp``.

This module holds the launch helpers the training exporters share (batch arithmetic, the
torchrun command, dropped serving settings, whole-node worlds) and the DeepSpeed exporter;
Megatron-LM lives in ``_megatron`` and torchtitan in ``_torchtitan``.
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
from cost_model import ModelSpec, Training

__all__ = ["deepspeed", "finished_export", "torchrun", "training_dropped"]


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
    per_node = recipe.devices_per_host
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


def training_dropped(plan: ShardingPlan, recipe: Recipe, *, engine: str, label: str) -> list[str]:
    """What a training export of ``plan`` for ``engine`` (named ``label`` in the notes) cannot
    carry: the serving settings, a partial node, and the engine's own layout rules."""
    return (
        _serving_dropped(plan, label)
        + _partial_node(plan, recipe)
        + rule_violations(plan, plan.config, engine=engine, version=recipe.version)
        + ([] if engine == "megatron" else _precision_dropped(plan, label))
    )


def _precision_dropped(plan: ShardingPlan, label: str) -> list[str]:
    """The training precision the plan was priced with beyond bf16 mixed precision, which the
    ``label`` export does not write (Megatron-LM's writes it: ``_megatron.megatron_precision``)."""
    job = plan.job
    if not isinstance(job, Training):
        return []
    unwritten = []
    if job.precision != "bf16":
        recipe = f", recipe {job.fp8_recipe!r}" if job.precision == "fp8" else ""
        unwritten.append(f"{job.precision} training (precision{recipe})")
    if job.optimizer_state_dtype != "fp32":
        unwritten.append(f"{job.optimizer_state_dtype} optimizer moments (optimizer_state_dtype)")
    if not unwritten:
        return []
    return [f"{' and '.join(unwritten)}: the {label} script trains in bf16 with fp32 moments"]


def _steps(plan: ShardingPlan, recipe: Recipe, file: str) -> list[str]:
    nodes = recipe.nodes(plan.world_size)
    if nodes == 1:
        return [f"bash {file}"]
    return [
        f"on each of the {nodes} nodes: NODE_RANK=<0..{nodes - 1}> MASTER_ADDR=<address of node 0> bash {file}"
    ]


# ---------------------------------------------------------------------------- DeepSpeed
def finished_export(
    engine: str,
    files: dict[str, str],
    *,
    title: str,
    plan: ShardingPlan,
    recipe: Recipe,
    script_file: str,
    dropped: list[str],
    notes: list[str],
) -> Export:
    """The ``engine`` export of ``files`` and its ``README_<engine>.md``: the recipe, the launch
    steps of ``script_file``, the settings dropped, the notes and the layout."""
    files[f"README_{engine}.md"] = readme(
        title=title,
        recipe=recipe,
        steps=_steps(plan, recipe, script_file),
        dropped=dropped,
        notes=notes,
        layout=describe(plan.config),
    )
    return Export(engine, files, tuple(dropped), tuple(notes), recipe.version)


def deepspeed(plan: ShardingPlan, recipe: Recipe) -> Export:
    c = plan.config
    _, batch = _batch(plan)
    dropped = training_dropped(plan, recipe, engine="deepspeed", label="DeepSpeed")
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
    return finished_export(
        "deepspeed",
        files,
        title="DeepSpeed launch recipe",
        plan=plan,
        recipe=recipe,
        script_file=file,
        dropped=dropped,
        notes=notes,
    )
