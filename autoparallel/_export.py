"""Exports of a ``ShardingPlan`` to the launch arguments or config files of common engines.

Serving: vLLM (``vllm serve``), SGLang (``python -m sglang.launch_server``), TensorRT-LLM
(``trtllm-serve`` + ``--extra_llm_api_options`` YAML). Training: Megatron-LM (``pretrain_gpt.py``
arguments), torchtitan (TOML job config), DeepSpeed (``ds_config.json``). Any plan can be exported
to any format; what a format cannot express is listed in ``Export.dropped`` (never silently).

Vocabulary of the serving engines, mapped from the plan's mesh (``cp`` is 1 for inference):
an *instance* is one engine process group serving one copy of the model per pipeline: its size
``G = max(tp, ep * etp)`` ranks, attention split ``attention_tp`` ways (1 under
attention-data-parallel, else ``tp``) and replicated ``G / attention_tp`` times (the engines'
"DP attention"), experts split ``ep`` ways with ``etp = G / ep`` tensor shards. The world holds
``world / (pp * G)`` instances behind a router.

Flag names follow the engines' documentation: vLLM ``docs.vllm.ai`` (serving/expert_parallel_deployment,
config/parallel ``EPLBConfig``), SGLang ``docs.sglang.io`` (server arguments, expert parallelism,
DP attention), TensorRT-LLM LLM API options (``enable_attention_dp``, ``moe_expert_parallel_size``),
Megatron-LM ``megatron/training/arguments.py``, torchtitan ``torchtitan/config/job_config.py``
(``[parallelism]``), DeepSpeed config JSON (``zero_optimization``, ``tensor_parallel.autotp_size``).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Callable

from autoparallel.plan import Deployment, ShardingPlan
from cost_model import Training

FORMATS = ("vllm", "sglang", "trtllm", "megatron", "torchtitan", "deepspeed")


@dataclass(frozen=True)
class Export:
    """``files`` maps a file name to its content (the launch script or config); ``dropped`` says
    what of the plan the format cannot express."""

    format: str
    files: dict[str, str]
    dropped: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def render(self) -> str:
        parts = [f"# {name}\n{content}" for name, content in self.files.items()]
        parts += [f"# dropped: {item}" for item in self.dropped]
        parts += [f"# note: {item}" for item in self.notes]
        return "\n".join(parts) + "\n"


def export_plan(plan: ShardingPlan, *, format: str, model_path: str | None = None) -> Export:  # noqa: A002 - CLI word
    """The ``format`` export of ``plan``; ``model_path`` defaults to the plan's model name."""
    if format not in _EXPORTERS:
        raise ValueError(f"format ({format!r}) must be one of {list(FORMATS)}")
    return _EXPORTERS[format](plan, model_path or plan.provenance.model_name)


# ---------------------------------------------------------------------------- shared facts
@dataclass(frozen=True)
class _Serving:
    instance_size: int
    attention_tp: int
    attention_replicas: int
    num_instances: int
    batch_size: int
    kv_dtype: str
    num_redundant_experts: int
    two_batch_overlap: bool
    all_to_all_backend: str = "auto"


def _serving(plan: ShardingPlan) -> _Serving:
    c = plan.config
    attention_tp = 1 if c.attention_data_parallel else c.tp
    instance = max(c.tp, c.ep * c.etp)
    serving = plan.serving
    return _Serving(
        instance_size=instance,
        attention_tp=attention_tp,
        attention_replicas=instance // attention_tp,
        num_instances=plan.world_size // (c.pp * instance),
        batch_size=serving.batch_size if serving else c.micro_batch_size,
        kv_dtype=serving.kv_dtype if serving else "bf16",
        num_redundant_experts=serving.num_redundant_experts if serving else 0,
        two_batch_overlap=serving.two_batch_overlap if serving else False,
        all_to_all_backend=serving.all_to_all_backend if serving else "auto",
    )


def _training_only(plan: ShardingPlan) -> list[str]:
    c = plan.config
    dropped = []
    if c.zero_stage:
        dropped.append(f"zero_stage {c.zero_stage} (a training setting; serving holds no optimizer state)")
    if c.recompute != "none":
        dropped.append(f"recompute {c.recompute!r} (a training setting)")
    if c.pp > 1 and (c.pipeline_schedule != "1f1b" or c.virtual_stages > 1):
        dropped.append(f"pipeline_schedule {c.pipeline_schedule!r} x{c.virtual_stages} (serving engines run their own pipeline)")
    if c.cp > 1:
        dropped.append(f"cp {c.cp} (context parallel is not a serving option of this engine)")
    return dropped


def _serving_dropped(plan: ShardingPlan, engine: str) -> list[str]:
    """Serving settings a training engine has no flag for."""
    serving = plan.serving
    if serving is None:
        return []
    return [
        f"serving settings (batch {serving.batch_size}, KV {serving.kv_dtype}, "
        f"{serving.num_redundant_experts} redundant experts, two-batch overlap {serving.two_batch_overlap}) have no {engine} setting"
    ]


def _uneven_stages(plan: ShardingPlan) -> str | None:
    sizes = [s.stop_layer - s.start_layer for s in plan.stages]
    return None if len(set(sizes)) <= 1 else f"uneven stage split {sizes} (the engine splits layers evenly)"


def _command(words: list[str]) -> str:
    """One ``--flag value`` per line; ``${VAR}`` placeholders stay unquoted for the shell."""
    groups: list[list[str]] = [[]]
    for word in words:
        if word.startswith("--") and groups[-1]:
            groups.append([])
        groups[-1].append(word)
    quote = lambda w: w if w.startswith("${") else shlex.quote(w)  # noqa: E731
    return " \\\n    ".join(" ".join(quote(w) for w in group) for group in groups) + "\n"


def _kv_dtype(plan_dtype: str, names: dict[str, str]) -> str | None:
    return names.get(plan_dtype)


# ---------------------------------------------------------------------------- serving engines
def _vllm(plan: ShardingPlan, model_path: str) -> Export:
    c, s = plan.config, _serving(plan)
    dropped = _training_only(plan)
    args = ["vllm", "serve", model_path, "--tensor-parallel-size", str(s.attention_tp),
            "--pipeline-parallel-size", str(c.pp), "--data-parallel-size", str(s.attention_replicas)]
    if c.ep > 1:
        args.append("--enable-expert-parallel")
        if c.ep * c.etp != s.instance_size or c.etp > 1:
            dropped.append(f"ep {c.ep} x etp {c.etp}: vLLM's expert parallel spans all tp x dp ranks ({s.instance_size}) with etp 1")
    elif c.etp != c.tp and plan.moe_mesh_axes:
        dropped.append(f"etp {c.etp}: without expert parallel vLLM shards experts over tp ({c.tp})")
    if s.num_redundant_experts:
        args += ["--enable-eplb", "--eplb-config", json.dumps({"num_redundant_experts": s.num_redundant_experts})]
    kv = _kv_dtype(s.kv_dtype, {"bf16": "auto", "fp8": "fp8"})
    if kv is None:
        dropped.append(f"kv_dtype {s.kv_dtype!r} (vLLM KV cache: auto or fp8)")
    else:
        args += ["--kv-cache-dtype", kv]
    args += ["--max-num-seqs", str(s.batch_size)]
    if s.two_batch_overlap:
        args.append("--enable-dbo")  # vLLM's dual batch overlap (DP+EP deployments)
    dropped += _disaggregation_dropped(plan, "vLLM")
    notes = (f"{s.num_instances} instances of {c.pp * s.instance_size} devices behind a load balancer",)
    if uneven := _uneven_stages(plan):
        dropped.append(uneven)
    return Export("vllm", {"launch_vllm.sh": _command(args)}, tuple(dropped), notes)


def _sglang(plan: ShardingPlan, model_path: str) -> Export:
    c, s = plan.config, _serving(plan)
    dropped = _training_only(plan)
    args = ["python", "-m", "sglang.launch_server", "--model-path", model_path,
            "--tp-size", str(s.instance_size), "--pp-size", str(c.pp)]
    if s.attention_replicas > 1:
        # SGLang's DP attention: dp-size attention replicas inside the tp-size ranks; pure
        # attention-DP is dp-size == tp-size.
        args += ["--dp-size", str(s.attention_replicas), "--enable-dp-attention"]
    if c.ep > 1:
        args += ["--ep-size", str(c.ep), "--moe-a2a-backend", "deepep"]
        if s.all_to_all_backend != "auto":  # a pool's own DeepEP kernels (normal prefill, low-latency decode)
            args += ["--deepep-mode", s.all_to_all_backend]
    if s.num_redundant_experts:
        args += ["--ep-num-redundant-experts", str(s.num_redundant_experts), "--enable-eplb"]
    kv = _kv_dtype(s.kv_dtype, {"bf16": "auto", "fp8": "fp8_e4m3"})
    if kv is None:
        dropped.append(f"kv_dtype {s.kv_dtype!r} (SGLang KV cache: auto, fp8_e4m3 or fp8_e5m2)")
    else:
        args += ["--kv-cache-dtype", kv]
    args += ["--max-running-requests", str(s.batch_size * s.attention_replicas)]
    if s.two_batch_overlap:
        args.append("--enable-two-batch-overlap")
    nodes = max(1, (c.pp * s.instance_size) // _devices_per_node(plan))
    if nodes > 1:
        args += ["--nnodes", str(nodes), "--node-rank", "${NODE_RANK}", "--dist-init-addr", "${MASTER_ADDR}:5000"]
    if uneven := _uneven_stages(plan):
        dropped.append(uneven)
    notes = (f"{s.num_instances} instances behind sglang-router; MoE tp per expert = tp-size / ep-size = {s.instance_size // c.ep}",)
    files = {"launch_sglang.sh": _command(args)}
    for pool in plan.deployment.pools if _disaggregated(plan) else ():
        unit = plan.model_copy(update={"config": pool.config, "world_size": pool.devices_per_unit, "serving": pool.serving,
                                       "deployment": Deployment()})
        unit_args = _sglang(unit, model_path).files["launch_sglang.sh"].rstrip("\n")
        files[f"launch_sglang_{pool.role}.sh"] = f"# {pool.num_units} units of {pool.devices_per_unit} devices\n{unit_args} \\\n    --disaggregation-mode {pool.role}\n"
    return Export("sglang", files, tuple(dropped), notes)


def _disaggregated(plan: ShardingPlan) -> bool:
    return plan.disaggregated


def _disaggregation_dropped(plan: ShardingPlan, engine: str) -> list[str]:
    if not _disaggregated(plan):
        return []
    pools = ", ".join(f"{p.role} {p.num_devices} devices" for p in plan.deployment.pools)
    return [f"prefill/decode disaggregation ({pools}): {engine} needs a KV-transfer deployment; the colocated layout is exported"]


def _devices_per_node(plan: ShardingPlan) -> int:
    return plan.devices_per_node


def _trtllm(plan: ShardingPlan, model_path: str) -> Export:
    c, s = plan.config, _serving(plan)
    dropped = _training_only(plan)
    if s.attention_tp not in (1, s.instance_size):
        dropped.append(
            f"attention tp {s.attention_tp} inside an instance of {s.instance_size}: TensorRT-LLM runs attention "
            f"either tp {s.instance_size} or data-parallel; exported as attention data-parallel"
        )
    args = ["trtllm-serve", model_path, "--tp_size", str(s.instance_size), "--pp_size", str(c.pp),
            "--ep_size", str(c.ep), "--max_batch_size", str(s.batch_size), "--extra_llm_api_options", "extra_llm_api_options.yaml"]
    options: list[str] = [f"enable_attention_dp: {'true' if s.instance_size > 1 and s.attention_tp < s.instance_size else 'false'}"]
    if s.kv_dtype == "fp8":
        options.append("kv_cache_config:\n  dtype: fp8")
    elif s.kv_dtype != "bf16":
        dropped.append(f"kv_dtype {s.kv_dtype!r} (TensorRT-LLM KV cache: auto or fp8)")
    if s.num_redundant_experts and plan.expert_placement is not None:
        slots = plan.expert_placement.num_experts + s.num_redundant_experts
        options.append(f"moe_config:\n  load_balancer:\n    num_slots: {slots}")
    if s.two_batch_overlap:
        dropped.append("two_batch_overlap (no TensorRT-LLM LLM API option for it)")
    dropped += _disaggregation_dropped(plan, "TensorRT-LLM")
    if uneven := _uneven_stages(plan):
        dropped.append(uneven)
    notes = (f"MoE tensor parallel = tp_size / ep_size = {s.instance_size // c.ep}; {s.num_instances} instances",)
    files = {"launch_trtllm.sh": _command(args), "extra_llm_api_options.yaml": "\n".join(options) + "\n"}
    return Export("trtllm", files, tuple(dropped), notes)


# ---------------------------------------------------------------------------- training engines
def _batch(plan: ShardingPlan) -> tuple[int, int]:
    """(sequence length, global batch in sequences) of the plan's workload (inference: prompt, dp x batch)."""
    job = plan.job
    if isinstance(job, Training):
        return job.sequence_length_tokens, int(job.global_batch_sequences)
    return job.prompt_tokens, plan.config.dp * plan.config.micro_batch_size


def _megatron(plan: ShardingPlan, model_path: str) -> Export:
    c = plan.config
    dropped, notes = _serving_dropped(plan, "Megatron-LM"), []
    sequence, batch = _batch(plan)
    num_layers = plan.stages[-1].stop_layer
    args = ["torchrun", "pretrain_gpt.py", "--num-layers", str(num_layers), "--seq-length", str(sequence),
            "--tensor-model-parallel-size", str(c.tp), "--pipeline-model-parallel-size", str(c.pp),
            "--context-parallel-size", str(c.cp), "--micro-batch-size", str(c.micro_batch_size),
            "--global-batch-size", str(batch)]
    if plan.moe_mesh_axes:
        args += ["--expert-model-parallel-size", str(c.ep), "--expert-tensor-parallel-size", str(c.etp)]
    if c.sequence_parallel:
        args.append("--sequence-parallel")
    args += _megatron_pipeline(plan, dropped)
    args += {"none": [], "selective": ["--recompute-granularity", "selective"],
             "full": ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]}[c.recompute]
    if c.zero_stage in (1, 2):
        args.append("--use-distributed-optimizer")
        if c.zero_stage == 2:
            notes.append("Megatron's distributed optimizer shards optimizer states and reduce-scatters gradients (ZeRO-2-like)")
    elif c.zero_stage == 3:
        # Megatron-LM's FSDP2 path wants these companions (its docs: "How to use pytorch FSDP2?")
        args += ["--use-torch-fsdp2", "--no-gradient-accumulation-fusion", "--ckpt-format", "torch_dist"]
        notes.append("ZeRO-3 exported as Megatron's torch FSDP2 path")
    if c.attention_data_parallel:
        dropped.append("attention_data_parallel (an inference layout; Megatron runs attention with tp)")
    if plan.serving is not None:
        notes.append("the plan is for inference: batch and sequence are the serving batch and prompt")
    return Export("megatron", {"megatron_args.sh": _command(args)}, tuple(dropped), tuple(notes))


def _megatron_pipeline(plan: ShardingPlan, dropped: list[str]) -> list[str]:
    c = plan.config
    sizes = [s.stop_layer - s.start_layer for s in plan.stages]
    args: list[str] = []
    if c.pp > 1 and c.pipeline_schedule in ("gpipe", "zero_bubble"):
        dropped.append(f"pipeline_schedule {c.pipeline_schedule!r} (Megatron-LM core runs 1F1B); exported as 1F1B")
    if c.virtual_stages > 1:
        if len(set(sizes)) > 1:
            dropped.append(f"uneven virtual-stage split {sizes}: Megatron needs equal chunks; exported with {sizes[0]} layers per chunk")
        args += ["--num-layers-per-virtual-pipeline-stage", str(sizes[0])]
    elif c.pp > 1 and len(set(sizes)) > 1:
        first, last, middle = sizes[0], sizes[-1], sizes[1:-1]
        args += ["--decoder-first-pipeline-num-layers", str(first), "--decoder-last-pipeline-num-layers", str(last)]
        if len(set(middle)) > 1:
            dropped.append(f"middle stages {middle}: Megatron splits the middle evenly")
    return args


def _torchtitan(plan: ShardingPlan, model_path: str) -> Export:
    c = plan.config
    dropped, notes = _serving_dropped(plan, "torchtitan"), []
    sequence, batch = _batch(plan)
    shard = c.dp if c.zero_stage >= 1 else 1
    replicate = 1 if c.zero_stage >= 1 else c.dp
    schedule = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved_1f1b": "Interleaved1F1B", "zero_bubble": "1F1B"}[c.pipeline_schedule]
    if c.pp > 1 and c.pipeline_schedule == "zero_bubble":
        dropped.append("pipeline_schedule 'zero_bubble' with one stage per rank (torchtitan's zero-bubble schedules are looped); exported as 1F1B")
    if c.tp > 1 and not c.sequence_parallel:
        notes.append("torchtitan always applies sequence parallel with tp > 1")
    if c.ep > 1 and c.etp not in (1, c.tp):
        dropped.append(f"etp {c.etp}: torchtitan supports expert_tensor_parallel_degree 1 or equal to tp ({c.tp})")
    if c.zero_stage in (1, 2):
        notes.append(f"ZeRO-{c.zero_stage} exported as FSDP2 with reshard_after_forward = never")
    if c.attention_data_parallel:
        dropped.append("attention_data_parallel (an inference layout)")
    parts = _model_parts(plan)
    lines = [
        "[training]", f"seq_len = {sequence}", f"global_batch_size = {batch}",
        f"local_batch_size = {batch // c.dp}", "",
        "[parallelism]", f"data_parallel_replicate_degree = {replicate}", f"data_parallel_shard_degree = {shard}",
        f'fsdp_reshard_after_forward = "{"never" if c.zero_stage in (1, 2) else "default"}"',
        f"tensor_parallel_degree = {c.tp}", f"context_parallel_degree = {c.cp}",
        f"pipeline_parallel_degree = {c.pp}", f'pipeline_parallel_schedule = "{schedule}"',
        f"pipeline_parallel_microbatch_size = {c.micro_batch_size}",
        f"expert_parallel_degree = {c.ep}", f"expert_tensor_parallel_degree = {c.etp}",
    ]
    if c.pp > 1:
        lines.append("module_fqns_per_model_part = " + json.dumps(parts))
    lines += ["", "[activation_checkpoint]", f'mode = "{c.recompute}"']
    return Export("torchtitan", {"torchtitan.toml": "\n".join(lines) + "\n"}, tuple(dropped), tuple(notes))


def _model_parts(plan: ShardingPlan) -> list[list[str]]:
    """torchtitan module FQNs of each pipeline chunk (exact, uneven splits included)."""
    parts = []
    for stage in plan.stages:
        names = ["tok_embeddings"] if stage.has_embedding else []
        names += [f"layers.{i}" for i in range(stage.start_layer, stage.stop_layer)]
        names += ["norm", "output"] if stage.has_lm_head else []
        parts.append(names)
    return parts


def _deepspeed(plan: ShardingPlan, model_path: str) -> Export:
    c = plan.config
    _, batch = _batch(plan)
    dropped = _serving_dropped(plan, "DeepSpeed")
    config = {
        "train_batch_size": batch,
        "train_micro_batch_size_per_gpu": c.micro_batch_size,
        "gradient_accumulation_steps": max(1, batch // (c.dp * c.micro_batch_size)),
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": c.zero_stage},
    }
    if c.tp > 1:
        config["tensor_parallel"] = {"autotp_size": c.tp}
    if c.recompute != "none":
        config["activation_checkpointing"] = {"partition_activations": c.tp > 1, "contiguous_memory_optimization": False}
        if c.recompute == "selective":
            dropped.append("recompute 'selective' (DeepSpeed checkpoints whole layers): exported as full")
    if c.cp > 1:
        dropped.append(f"cp {c.cp} (ring context parallel; DeepSpeed's Ulysses sequence parallel is a different scheme)")
    if c.sequence_parallel:
        dropped.append("sequence_parallel (Megatron-style SP has no DeepSpeed config key)")
    notes = []
    if c.pp > 1:
        notes.append(f"pipeline: build deepspeed.pipe.PipelineModule(num_stages={c.pp}) with the plan's stage layers")
        if c.pipeline_schedule != "1f1b" or c.virtual_stages > 1:
            dropped.append(f"pipeline_schedule {c.pipeline_schedule!r} x{c.virtual_stages} (DeepSpeed runs 1F1B)")
    if c.ep > 1:
        notes.append(f"experts: deepspeed.moe.layer.MoE(ep_size={c.ep}) in the model code")
        if c.etp > 1:
            dropped.append(f"etp {c.etp} (DeepSpeed-MoE has no expert tensor parallel)")
    if c.attention_data_parallel:
        dropped.append("attention_data_parallel (an inference layout)")
    return Export("deepspeed", {"ds_config.json": json.dumps(config, indent=2) + "\n"}, tuple(dropped), tuple(notes))


_EXPORTERS: dict[str, Callable[[ShardingPlan, str], Export]] = {
    "vllm": _vllm,
    "sglang": _sglang,
    "trtllm": _trtllm,
    "megatron": _megatron,
    "torchtitan": _torchtitan,
    "deepspeed": _deepspeed,
}
