"""Hand every launch file of an export folder to one engine's own parser; print what it resolved.

    <engine venv>/bin/python benchmarks/engines/engine_parse.py ENGINE FOLDER

Runs inside the engine's virtual environment (benchmarks/engines/setup.sh) and imports nothing
from autoparallel: the engine alone decides. For each launch script it prints one JSON line
``{"file", "accepted", "error", "values"}``; ``values`` are read back from the engine's parsed
objects (not from the text), named tp, pp, dp, cp, ep, etp, attention_dp, micro_batch,
grad_accumulation, global_batch, recompute, zero, dtype, nnodes, nproc_per_node, node_rank,
pipeline_layers, ... so that check_exports.py can compare them with the plan.

Placeholders take fixed values: NODE_RANK from the file name's ``_node<k>`` (else 0),
MASTER_ADDR 10.0.0.1, MODEL_PATH /models/checkpoint, ``${NAME:-default}`` its default.

What is substituted for a GPU, and nothing else: Megatron-LM's validate_args and torchtitan's
float8 converter config ask the CUDA device for its architecture (get_device_arch_version,
torch.cuda.get_device_capability for --moe-grouped-gemm, has_cuda_capability); the driver answers 9.0 (Hopper, the plans' H100/H200/H800). DeepSpeed reads its
data-parallel world from an ``mpu`` (as Megatron-style launchers pass one) over a one-rank gloo
group.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import sys
import traceback
from pathlib import Path

FIXED = {"MASTER_ADDR": "10.0.0.1", "MODEL_PATH": "/models/checkpoint"}


def command_words(text: str, *, node_rank: int) -> tuple[dict[str, str], list[str]]:
    """(environment assignments, words) of the one command in a launch script."""
    body = [
        line
        for line in text.replace("\\\n", " ").splitlines()
        if line.strip() and not line.lstrip().startswith(("#", "set "))
    ]
    values = {**FIXED, "NODE_RANK": str(node_rank)}

    def substitute(match: re.Match) -> str:
        name, default = match.group(1), match.group(3)
        return values.get(name, os.environ.get(name, default or ""))

    words = shlex.split(re.sub(r"\$\{(\w+)(:-([^}]*))?\}", substitute, " ".join(body)))
    env = {}
    while words and re.fullmatch(r"\w+=.*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    return env, words


def torchrun_split(words: list[str]) -> tuple[dict, list[str]]:
    """torchrun's own parser for the launcher part; the rest is the training program's argv."""
    from torch.distributed.run import get_args_parser

    args = get_args_parser().parse_args(words[1:])
    program = [args.training_script, *args.training_script_args]
    if args.module:
        program = ["-m", *program]
    launch = {
        "nnodes": int(str(args.nnodes).split(":")[0]),
        "nproc_per_node": int(args.nproc_per_node),
        "node_rank": int(args.node_rank),
    }
    return launch, program


# ---------------------------------------------------------------------------- serving
def parse_vllm(env: dict, words: list[str]) -> dict:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.common.cli_args import validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    os.environ.update(env)
    parser = (
        FlexibleArgumentParser()
    )  # VLLM_TARGET_DEVICE=cpu is set before vllm is imported (main)
    ServeSubcommand().subparser_init(parser.add_subparsers())
    args = parser.parse_args(words[1:])
    validate_parsed_serve_args(args)
    if args.model_tag is not None:
        args.model = args.model_tag
    engine = AsyncEngineArgs.from_cli_args(args)
    eplb = getattr(engine, "eplb_config", None)
    return {
        "tp": engine.tensor_parallel_size,
        "pp": engine.pipeline_parallel_size,
        "dp": engine.data_parallel_size,
        "dp_local": engine.data_parallel_size_local,
        "dp_start_rank": engine.data_parallel_start_rank,
        "headless": bool(args.headless),
        "expert_parallel": bool(engine.enable_expert_parallel),
        "all2all_backend": engine.all2all_backend,
        "eplb": bool(engine.enable_eplb),
        "num_redundant_experts": getattr(eplb, "num_redundant_experts", 0)
        if engine.enable_eplb
        else 0,
        "kv_dtype": engine.kv_cache_dtype,
        "max_seqs": engine.max_num_seqs,
        "two_batch_overlap": bool(engine.enable_dbo),
        "nnodes": engine.nnodes,
        "node_rank": engine.node_rank,
        "dtype": str(engine.dtype),
        "model": engine.model,
        "kv_transfer": bool(engine.kv_transfer_config),
        "pp_layer_partition": env.get("VLLM_PP_LAYER_PARTITION"),
    }


def parse_sglang(env: dict, words: list[str]) -> dict:
    from sglang.srt.server_args import prepare_server_args

    os.environ.update(env)
    argv = words[3:] if words[:3] == ["python", "-m", "sglang.launch_server"] else words
    args = prepare_server_args(argv)
    attn_dp = getattr(args, "attn_dp_size", None) or (
        args.dp_size if getattr(args, "enable_dp_attention", False) else 1
    )
    return {
        "tp": args.tp_size,
        "pp": args.pp_size,
        "attention_dp": attn_dp,
        "ep": args.ep_size,
        "a2a_backend": str(args.moe_a2a_backend),
        "two_batch_overlap": bool(args.enable_two_batch_overlap),
        "nnodes": args.nnodes,
        "node_rank": args.node_rank,
        "kv_dtype": args.kv_cache_dtype,
        "max_running_requests": args.max_running_requests,
        "dtype": args.dtype,
        "num_redundant_experts": args.ep_num_redundant_experts,
        "disaggregation_mode": args.disaggregation_mode,
        "model": args.model_path,
        "init_expert_location": args.init_expert_location,
        "pp_layer_partition": env.get("SGLANG_PP_LAYER_PARTITION"),
    }


# ---------------------------------------------------------------------------- training
def parse_megatron(env: dict, words: list[str]) -> dict:
    launch, program = torchrun_split(words)
    os.environ.update(env)
    os.environ["WORLD_SIZE"] = str(launch["nnodes"] * launch["nproc_per_node"])
    os.environ["RANK"] = "0"
    import torch
    from megatron.training import arguments

    arguments.get_device_arch_version = lambda: (
        9
    )  # the GPU queries (Hopper); see the module docstring
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    sys.argv = program
    args = arguments.parse_args()
    arguments.validate_args(args)
    layers = None
    if args.pipeline_model_parallel_layout is not None:
        from megatron.core.transformer.pipeline_parallel_layer_layout import (
            PipelineParallelLayerLayout,
        )

        layout = PipelineParallelLayerLayout(
            args.pipeline_model_parallel_layout, args.pipeline_model_parallel_size
        )
        layout.validate_layer_layout(
            num_layers=args.num_layers, mtp_num_layers=args.mtp_num_layers
        )  # TransformerConfig's check
        layers = _megatron_layers(layout)
    zero = 3 if args.use_torch_fsdp2 else 1 if args.use_distributed_optimizer else 0
    return {
        **launch,
        "tp": args.tensor_model_parallel_size,
        "pp": args.pipeline_model_parallel_size,
        "cp": args.context_parallel_size,
        "dp": args.data_parallel_size,
        "ep": args.expert_model_parallel_size,
        "etp": args.expert_tensor_parallel_size,
        "sequence_parallel": bool(args.sequence_parallel),
        "micro_batch": args.micro_batch_size,
        "global_batch": args.global_batch_size,
        "grad_accumulation": args.global_batch_size
        // (args.micro_batch_size * args.data_parallel_size),
        "virtual_stages": args.virtual_pipeline_model_parallel_size or 1,
        "pipeline_layers": layers,
        "recompute": args.recompute_granularity or "none",
        "zero": zero,
        "dtype": "bf16" if args.bf16 else "fp32",
        "num_layers": args.num_layers,
        "hidden_size": args.hidden_size,
        "num_experts": args.num_experts,
        **_megatron_recipe(args),
    }


def _megatron_recipe(args) -> dict:
    """The software settings of a training recipe, as Megatron-LM resolved them."""
    cp_comm = args.cp_comm_type
    return {
        "ep_comm_overlap": bool(args.overlap_moe_expert_parallel_comm),
        "delay_wgrad_compute": bool(args.delay_wgrad_compute),
        "tp_comm_overlap": bool(args.tp_comm_overlap),
        "fp8_format": args.fp8,
        "fp8_recipe": args.fp8_recipe if args.fp8 else None,
        "bf16_layers": [args.num_layers_at_start_in_bf16, args.num_layers_at_end_in_bf16]
        if args.first_last_layers_bf16
        else [0, 0],
        "grad_reduce_in_bf16": bool(args.grad_reduce_in_bf16),
        "optimizer_moments": str(args.exp_avg_dtype).replace("torch.bfloat16", "bf16")
        if args.use_precision_aware_optimizer
        else "fp32",
        "cuda_graph_impl": args.cuda_graph_impl,
        "cuda_graph_scope": [getattr(s, "name", str(s)) for s in args.cuda_graph_scope or []],
        "recompute_modules": list(args.recompute_modules or []),
        "recompute_method": args.recompute_method,
        "recompute_num_layers": args.recompute_num_layers,
        "cpu_offloading_num_layers": args.cpu_offloading_num_layers,
        "optimizer_instances": args.num_distributed_optimizer_instances,
        "moe_token_dispatcher_type": args.moe_token_dispatcher_type,
        "moe_flex_dispatcher_backend": args.moe_flex_dispatcher_backend,
        "cp_comm_type": cp_comm[0] if isinstance(cp_comm, list) and len(cp_comm) == 1 else cp_comm,
    }


def _megatron_layers(layout) -> list[int]:
    """Decoder layers of each chunk, in chunk order (chunk c on pipeline rank c % pp)."""
    chunks = []
    pp = len(layout.layout)
    vpp = len(layout.layout[0])
    for virtual in range(vpp):
        for rank in range(pp):
            chunks.append(
                sum(1 for kind in layout.layout[rank][virtual] if "decoder" in str(kind).lower())
            )
    return chunks


def parse_torchtitan(env: dict, words: list[str]) -> dict:
    launch, program = torchrun_split(words)
    from torchtitan.components.quantization import float8

    float8.has_cuda_capability = lambda major, minor: (
        (9, 0) >= (major, minor)
    )  # the GPU query: Hopper (see module docstring)
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    argv = program[2:] if program[:2] == ["-m", "torchtitan.train"] else program
    config = ConfigManager().parse_args(argv)
    p, training = config.parallelism, config.training
    world = launch["nnodes"] * launch["nproc_per_node"]
    dims = ParallelDims(
        dp_replicate=p.data_parallel_replicate_degree,
        dp_shard=p.data_parallel_shard_degree,
        cp=p.context_parallel_degree,
        tp=p.tensor_parallel_degree,
        pp=p.pipeline_parallel_degree,
        ep=p.expert_parallel_degree,
        world_size=world,
    )
    dp = dims.dp_replicate * dims.dp_shard
    parts = p.module_fqns_per_model_part
    ac_name = type(config.activation_checkpoint).__qualname__.lower()
    ac = "selective" if "selective" in ac_name else "full" if "full" in ac_name else "none"
    return {
        **launch,
        "tp": dims.tp,
        "pp": dims.pp,
        "cp": dims.cp,
        "dp": dp,
        "dp_shard": dims.dp_shard,
        "dp_replicate": dims.dp_replicate,
        "ep": dims.ep,
        "sequence_parallel": bool(p.enable_sequence_parallel) and dims.tp > 1,
        "reshard_after_forward": p.fsdp_reshard_after_forward,
        "micro_batch": p.pipeline_parallel_microbatch_size
        if dims.pp > 1
        else training.local_batch_size,
        "global_batch": training.global_batch_size,
        "grad_accumulation": training.global_batch_size // (training.local_batch_size * dp),
        "pipeline_schedule": p.pipeline_parallel_schedule,
        "pipeline_layers": [sum(1 for name in part if name.startswith("layers.")) for part in parts]
        if parts
        else None,
        "recompute": ac,
        "dtype": training.mixed_precision_param,
        "seq_len": training.seq_len,
        "model_spec": type(config.model_spec).__name__,
        # the shape of the model the --module/--config pair builds
        "num_layers": len(config.model_spec.model.layers),
        "hidden_size": config.model_spec.model.dim,
    }


def parse_deepspeed(env: dict, words: list[str], folder: Path) -> dict:
    launch, program = torchrun_split(words)
    config_path = folder / program[program.index("--deepspeed_config") + 1]
    document = json.loads(config_path.read_text())
    dp = int(
        os.environ["CHECK_DP_WORLD"]
    )  # the plan's world / (tp * pp * cp): what a Megatron-style mpu reports
    import deepspeed
    from deepspeed.runtime.config import DeepSpeedConfig

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT="29533",
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
    )
    if not deepspeed.comm.is_initialized():
        deepspeed.init_distributed(dist_backend="gloo")

    class DataParallelWorld:
        def get_data_parallel_world_size(self) -> int:
            return dp

    config = DeepSpeedConfig(str(config_path), mpu=DataParallelWorld())
    return {
        **launch,
        "micro_batch": config.train_micro_batch_size_per_gpu,
        "grad_accumulation": config.gradient_accumulation_steps,
        "global_batch": config.train_batch_size,
        "dp": dp,
        "zero": config.zero_optimization_stage,
        "dtype": "bf16" if config.bfloat16_config.enabled else "fp32",
        "tp": document.get("tensor_parallel", {}).get("autotp_size", 1),
        "recompute": "full" if "activation_checkpointing" in document else "none",
    }


def main() -> None:
    engine, folder = sys.argv[1], Path(sys.argv[2])
    if engine == "vllm":
        os.environ["VLLM_TARGET_DEVICE"] = (
            "cpu"  # the CUDA wheel cannot find a GPU; its CPU platform parses
        )
    for path in sorted(folder.glob("*.sh")):
        node = re.search(r"_node(\d+)\.sh$", path.name)
        env, words = command_words(path.read_text(), node_rank=int(node.group(1)) if node else 0)
        captured = io.StringIO()
        try:
            with contextlib.redirect_stderr(captured):
                if engine == "deepspeed":
                    values = parse_deepspeed(env, words, folder)
                else:
                    values = {
                        "vllm": parse_vllm,
                        "sglang": parse_sglang,
                        "megatron": parse_megatron,
                        "torchtitan": parse_torchtitan,
                    }[engine](env, words)
            print(
                json.dumps(
                    {
                        "file": path.name,
                        "accepted": True,
                        "error": None,
                        "values": values,
                    },
                    default=str,
                ),
                flush=True,
            )
        except BaseException as error:
            # an engine refusing is the result we report (SystemExit from argparse too)
            said = [line.strip(" │╭╮╰╯─") for line in captured.getvalue().splitlines()]
            said = [
                line
                for line in said
                if line
                and (
                    "rror" in line
                    or "nrecognized" in line
                    or "invalid" in line
                    or "required" in line
                )
            ]
            message = f"{type(error).__name__}: {error}" + (
                f" ({' / '.join(said[-3:])})" if said else ""
            )
            print(
                json.dumps(
                    {
                        "file": path.name,
                        "accepted": False,
                        "error": message,
                        "values": {},
                        "traceback": traceback.format_exc().strip().splitlines()[-6:],
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
