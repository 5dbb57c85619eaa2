"""Every export of a fixed set of plans, handed to each engine's own parser, compared with the plan.

    bash benchmarks/engines/setup.sh                     # once: one venv per engine
    PYTHONPATH=. python benchmarks/engines/check_exports.py [--engines vllm,sglang,...] [--json out.json]

For each plan (training and serving, dense and MoE, colocated and disaggregated, single and
multi-node) and each engine of its kind, the plan is searched with ``engine=`` (so the layout is
one that engine runs), exported, written to a folder, and ``engine_parse.py`` runs inside the
engine's venv on every launch file. Each value the engine resolved (tp, pp, dp, cp, ep, etp,
attention-DP, micro-batch, gradient accumulation, global batch, recompute, ZeRO/FSDP, dtype, node
and process counts, pipeline layout, ...) is compared with the value computed here from the plan
(never from the export's text). TensorRT-LLM cannot be installed without a GPU: its exports are
checked against its documented options (``TRTLLM_OPTIONS`` below, from the trtllm-serve and LLM
API reference) by ``trtllm_check``.

Prints one line per export and a summary table (engine, version, exports, accepted, values
checked, mismatches); ``--json`` writes every answer.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import optuna

import autoparallel as ap
from autoparallel.export import export_plan, import_config
from autoparallel.export._common import serving_view
from autoparallel.export._import import flags, layout_key
from autoparallel.export._serving import _pools, sglang_expert_location
from cost_model import EstimateOptions, Inference, Training
from search import engine_data
from search._engines import engine_info

HERE = Path(__file__).resolve().parent
VENVS = Path(
    os.environ.get("ENGINES_VENV_DIR", Path.home() / ".cache" / "autoparallel" / "engine-venvs")
)
TRAINING_ENGINES = ("megatron", "torchtitan", "deepspeed")
SERVING_ENGINES = ("vllm", "sglang", "trtllm")
# TensorRT-LLM options as its source defines them (tensorrt_llm/commands/serve.py click options;
# tensorrt_llm/llmapi/llm_args.py fields), see cost_model/data/engine_rules.json "trtllm".
TRTLLM_OPTIONS = {
    "--gpus_per_node",
    "--tp_size",
    "--pp_size",
    "--ep_size",
    "--max_batch_size",
    "--extra_llm_api_options",
}
TRTLLM_YAML_KEYS = {
    "enable_attention_dp",
    "moe_expert_parallel_size",
    "moe_tensor_parallel_size",
    "kv_cache_config",
    "moe_config",
    "cache_transceiver_config",
}


@dataclass(frozen=True)
class PlanSpec:
    name: str
    model: str
    cluster: str
    nodes: int
    workload: Training | Inference
    disaggregate: bool = False
    estimate_options: EstimateOptions | None = None


TRAIN = Training(sequence_length_tokens=4096, global_batch_sequences=1024)
SERVE = Inference(
    prompt_tokens=2048, output_tokens=512, tpot_slo_s=0.05, disaggregation_allowed=False
)
SERVE_PD = Inference(
    prompt_tokens=4096, output_tokens=1024, tpot_slo_s=0.05, disaggregation_allowed=True
)
PLANS = (
    PlanSpec(
        "gpt3-175b training, 16 nodes",
        "gpt3-175b",
        "dgx-h100",
        16,
        Training(sequence_length_tokens=2048, global_batch_sequences=1536),
    ),
    PlanSpec("llama-3.1-405b training, 32 nodes", "llama-3.1-405b", "dgx-h100", 32, TRAIN),
    PlanSpec(
        "megatron-gpt-1.7b training, 1 node",
        "megatron-gpt-1.7b",
        "dgx-h100",
        1,
        Training(sequence_length_tokens=2048, global_batch_sequences=512),
    ),
    PlanSpec("mixtral-8x22b training, 8 nodes", "mixtral-8x22b", "dgx-h100", 8, TRAIN),
    PlanSpec("deepseek-v3 training, 64 nodes", "deepseek-v3", "hgx-h800", 64, TRAIN),
    PlanSpec("qwen3-235b-a22b training, 16 nodes", "qwen3-235b-a22b", "dgx-h200", 16, TRAIN),
    PlanSpec("deepseek-v3 serving, 2 nodes", "deepseek-v3", "dgx-h200", 2, SERVE),
    PlanSpec("deepseek-v3 serving, 16 nodes", "deepseek-v3", "dgx-h100", 16, SERVE),
    PlanSpec(
        "deepseek-v3 disaggregated, 16 nodes",
        "deepseek-v3",
        "dgx-h100",
        16,
        SERVE_PD,
        disaggregate=True,
    ),
    PlanSpec("llama-3.1-405b serving, 2 nodes", "llama-3.1-405b", "dgx-h100", 2, SERVE),
    PlanSpec("qwen3-235b-a22b serving, 1 node", "qwen3-235b-a22b", "dgx-h200", 1, SERVE),
    PlanSpec("mixtral-8x22b serving, 1 node", "mixtral-8x22b", "dgx-h100", 1, SERVE),
    PlanSpec(
        "qwen3-235b-a22b training with a Megatron-Bridge-style recipe, 16 nodes",
        "qwen3-235b-a22b",
        "dgx-h200",
        16,
        TRAIN,
        estimate_options=EstimateOptions(
            expert_parallel_comm_overlap=True,
            cuda_graphs="partial",
            cuda_graph_scope=("moe_router", "moe_preprocess"),
            expert_dispatcher="deepep",
            recompute_modules=("moe_act", "layernorm"),
            recompute_layers=2,
            tp_comm_overlap=True,
        ),
    ),
    PlanSpec("qwen3-30b-a3b training, 2 nodes", "qwen3-30b-a3b", "dgx-h100", 2, TRAIN),
    PlanSpec(
        "llama-3.1-8b fp8 training with bf16 gradients and optimizer moments, 1 node",
        "llama-3.1-8b",
        "dgx-h100",
        1,
        Training(
            sequence_length_tokens=4096,
            global_batch_sequences=256,
            precision="fp8",
            fp8_recipe="current",
            fp8_bf16_layers_at_start=1,
            fp8_bf16_layers_at_end=1,
            gradient_dtype="bf16",
            optimizer_state_dtype="bf16",
        ),
    ),
)


def search(spec: PlanSpec, engine: str) -> ap.ShardingPlan:
    cluster = ap.get_preset(spec.cluster, num_nodes=spec.nodes)
    return ap.find_plan(
        spec.model,
        cluster,
        spec.workload,
        n_trials=60,
        seed=0,
        engine=engine,
        disaggregate=spec.disaggregate,
        estimate_options=spec.estimate_options,
    )


# ---------------------------------------------------------------------------- expected values
def expected_training(plan: ap.ShardingPlan, engine: str) -> dict:
    c, job = plan.config, plan.job
    batch = int(job.global_batch_sequences)
    nodes = -(-plan.world_size // plan.devices_per_node)
    sizes = [s.stop_layer - s.start_layer for s in sorted(plan.stages, key=lambda s: s.chunk)]
    values = {
        "nnodes": nodes,
        "nproc_per_node": min(plan.world_size, plan.devices_per_node),
        "dp": c.dp,
        "tp": c.tp,
        "micro_batch": c.micro_batch_size,
        "global_batch": batch,
        "dtype": "bf16",
        "grad_accumulation": batch // (c.micro_batch_size * c.dp),
    }
    if engine == "deepspeed":
        values.update(zero=c.zero_stage, recompute="full" if c.recompute != "none" else "none")
        return values
    values.update(pp=c.pp, cp=c.cp, ep=c.ep, sequence_parallel=c.sequence_parallel and c.tp > 1)
    if engine == "megatron":
        zero = (
            {0: 0, 1: 1, 2: 1, 3: 3}[c.zero_stage] if c.dp * c.cp > 1 or c.zero_stage == 3 else None
        )
        values.update(
            etp=c.etp if plan.model.moe is not None else c.tp,
            virtual_stages=c.virtual_stages,
            recompute=c.recompute,
        )
        values.update(num_layers=plan.model.num_layers, hidden_size=plan.model.hidden_size)
        if zero is not None:
            values["zero"] = zero
        if c.pp > 1 and (c.virtual_stages > 1 or len(set(sizes)) > 1):
            values["pipeline_layers"] = sizes
        if plan.model.moe is not None:  # the dispatcher the plan was priced with
            deepep = plan.estimate_options and plan.estimate_options.expert_dispatcher == "deepep"
            values["moe_token_dispatcher_type"] = "flex" if deepep else "alltoall"
        if plan.estimate_options is not None:
            values.update(expected_megatron_recipe(plan))
        values.update(expected_megatron_precision(plan))
    if engine == "torchtitan":
        if c.pp > 1:
            values["pipeline_layers"] = sizes
            values["grad_accumulation"] = 1  # pipeline micro-batches carry the accumulation
            values["pipeline_schedule"] = {
                "gpipe": "GPipe",
                "1f1b": "1F1B",
                "interleaved_1f1b": "Interleaved1F1B",
            }[c.pipeline_schedule]
        values["recompute"] = c.recompute
        values["dtype"] = "bfloat16"
        if plan.model.name in engine_data()["torchtitan_configs"]:  # a config of its own shape
            values.update(num_layers=plan.model.num_layers, hidden_size=plan.model.hidden_size)
        values.update(
            dp_shard=c.dp if c.zero_stage else 1,
            dp_replicate=1 if c.zero_stage else c.dp,
        )
        if c.zero_stage and c.dp > 1:
            values["reshard_after_forward"] = "never" if c.zero_stage == 2 else "always"
    return values


def expected_megatron_precision(plan: ap.ShardingPlan) -> dict:
    """The training precision the plan was priced with, as Megatron-LM should resolve it."""
    job = plan.job
    if not isinstance(job, Training):
        return {}
    fp8 = job.precision == "fp8"
    recipes = {"delayed": "delayed", "current": "tensorwise", "tensorwise": "tensorwise"}
    recipes.update(blockwise="blockwise", mxfp8="mxfp8")
    return {
        "fp8_format": "hybrid" if fp8 else None,
        "fp8_recipe": recipes[job.fp8_recipe] if fp8 else None,
        "bf16_layers": [job.fp8_bf16_layers_at_start, job.fp8_bf16_layers_at_end]
        if fp8
        else [0, 0],
        "grad_reduce_in_bf16": job.gradient_dtype == "bf16",
        "optimizer_moments": job.optimizer_state_dtype,
    }


def expected_megatron_recipe(plan: ap.ShardingPlan) -> dict:
    """The software settings the plan was priced with, as Megatron-LM should resolve them."""
    c, options = plan.config, plan.estimate_options
    overlap = options.expert_parallel_comm_overlap and (
        c.ep > 1 and (c.pp == 1 or c.virtual_stages > 1) and c.recompute != "full"
    )  # Megatron-core's checks of the option
    values: dict = {
        "ep_comm_overlap": overlap,
        "delay_wgrad_compute": overlap,
        "tp_comm_overlap": bool(options.tp_comm_overlap) and c.tp > 1 and c.sequence_parallel,
        "cpu_offloading_num_layers": options.activation_offload_layers,
        "optimizer_instances": options.optimizer_instances,
        "cp_comm_type": "all_gather" if options.context_parallel == "all_gather" else "p2p",
    }
    if c.recompute == "selective" and options.recompute_modules != ("core_attn",):
        values["recompute_modules"] = list(options.recompute_modules)
    if c.recompute == "full":
        values["recompute_method"] = "uniform" if options.recompute_layers is None else "block"
        values["recompute_num_layers"] = options.recompute_layers or 1
    if options.cuda_graphs == "partial":
        values["cuda_graph_impl"] = "transformer_engine"
        values["cuda_graph_scope"] = list(options.cuda_graph_scope)
    if options.expert_dispatcher == "deepep":
        values["moe_token_dispatcher_type"] = "flex"
        values["moe_flex_dispatcher_backend"] = "deepep"
    return values


def expected_serving(plan: ap.ShardingPlan, engine: str, pool: tuple, file: str) -> dict:
    role, config, devices, settings = pool
    s = serving_view(plan, config, devices, settings)
    group = config.pp * s.instance_size
    nodes = -(-group // plan.devices_per_node)
    node = int(file.rsplit("_node", 1)[1].split(".")[0]) if "_node" in file else 0
    if engine == "vllm":
        values = {
            "tp": s.attention_tp,
            "pp": config.pp,
            "dp": s.attention_replicas,
            "expert_parallel": config.ep > 1,
            "max_seqs": s.batch_size,
            "kv_dtype": "fp8" if s.kv_dtype == "fp8" else "auto",
            "dtype": "bfloat16",
            "two_batch_overlap": s.two_batch_overlap and config.ep > 1,
            "num_redundant_experts": s.num_redundant_experts,
            "kv_transfer": role != "colocated",
        }
        if nodes > 1 and s.attention_replicas % nodes == 0:
            local = s.attention_replicas // nodes
            values.update(
                dp_local=local,
                headless=node > 0,
                dp_start_rank=node * local if node else None,
            )
        elif nodes > 1:
            values.update(nnodes=nodes, node_rank=node)
        return values
    values = {
        "tp": s.instance_size,
        "pp": config.pp,
        "attention_dp": s.attention_replicas,
        "ep": config.ep,
        "max_running_requests": s.batch_size * s.attention_replicas,
        "num_redundant_experts": s.num_redundant_experts,
        "two_batch_overlap": s.two_batch_overlap and config.ep == s.instance_size,
        "nnodes": nodes,
        "dtype": "bfloat16",
        "kv_dtype": "fp8_e4m3" if s.kv_dtype == "fp8" else "auto",
        "disaggregation_mode": "null" if role == "colocated" else role,
    }
    if sglang_expert_location(plan, config) is not None:
        values["init_expert_location"] = "sglang_expert_location.json"
    return values


# ---------------------------------------------------------------------------- running an engine
def run_engine(engine: str, folder: Path, env: dict[str, str]) -> list[dict]:
    python = VENVS / engine / "bin" / "python"
    if not python.exists():
        return [
            {
                "file": "*",
                "accepted": None,
                "error": f"not installed ({python} missing: run setup.sh {engine})",
                "values": {},
            }
        ]
    done = subprocess.run(
        [str(python), str(HERE / "engine_parse.py"), engine, str(folder)],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), **env},
        timeout=900,
    )
    answers = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if not answers:
        answers = [
            {
                "file": "*",
                "accepted": False,
                "error": (done.stderr.strip().splitlines() or ["no output"])[-1],
                "values": {},
            }
        ]
    return answers


def trtllm_check(result, plan: ap.ShardingPlan) -> list[dict]:
    """TensorRT-LLM against its documented options (no install without a GPU)."""
    answers = []
    for pool in _pools(plan):
        role, config, devices, settings = pool
        s = serving_view(plan, config, devices, settings)
        found = flags(result.files[f"launch_trtllm_{role}.sh"])
        yaml_text = result.files[f"extra_llm_api_options_{role}.yaml"]
        keys = {
            line.split(":")[0]
            for line in yaml_text.splitlines()
            if line and not line.startswith(" ")
        }
        unknown = sorted((set(found) - TRTLLM_OPTIONS) | (keys - TRTLLM_YAML_KEYS))
        values = {
            "tp": int(found["--tp_size"]),
            "pp": int(found["--pp_size"]),
            "ep": int(found["--ep_size"]),
            "attention_dp": "enable_attention_dp: true" in yaml_text,
            "moe_tp": _yaml_int(yaml_text, "moe_tensor_parallel_size"),
            "max_batch": int(found["--max_batch_size"]),
            "gpus_per_node": int(found["--gpus_per_node"]),
        }
        expected = {
            "moe_tp": s.instance_size // config.ep,
            "max_batch": s.batch_size * s.attention_replicas,
            "gpus_per_node": min(plan.devices_per_node, config.pp * s.instance_size),
            "tp": s.instance_size,
            "pp": config.pp,
            "ep": config.ep,
            "attention_dp": s.attention_tp == 1 and s.instance_size > 1,
        }
        answers.append(
            {
                "file": f"launch_trtllm_{role}.sh",
                "accepted": not unknown,
                "error": f"undocumented {unknown}" if unknown else None,
                "values": values,
                "expected": expected,
            }
        )
    return answers


def _yaml_int(text: str, key: str) -> int | None:
    for line in text.splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split(":", 1)[1])
    return None


def check(spec: PlanSpec, engine: str, workdir: Path) -> list[dict]:
    plan = search(spec, engine)
    result = export_plan(plan, format=engine)
    if engine == "trtllm":
        answers = trtllm_check(result, plan)
    else:
        folder = workdir / f"{PLANS.index(spec)}-{engine}"
        folder.mkdir(parents=True, exist_ok=True)
        for name, content in result.files.items():
            (folder / name).write_text(content)
        answers = run_engine(engine, folder, {"CHECK_DP_WORLD": str(plan.config.dp)})
        for answer in answers:
            if engine in TRAINING_ENGINES:
                answer["expected"] = expected_training(plan, engine)
            else:
                pool = next(
                    (p for p in _pools(plan) if f"_{p[0]}" in answer["file"]),
                    _pools(plan)[0],
                )
                answer["expected"] = expected_serving(plan, engine, pool, answer["file"])
    for answer in answers:
        got = answer["values"]
        answer["mismatches"] = {
            k: (v, got.get(k, "missing"))
            for k, v in answer.get("expected", {}).items()
            if answer["accepted"] and str(got.get(k, "missing")) != str(v)
        }
        answer.update(
            plan=spec.name,
            engine=engine,
            layout=str(plan.config),
            dropped=list(result.dropped),
        )
        answer["round_trip"] = round_trip(plan, engine, result, answer["file"])
    return answers


def round_trip(plan: ap.ShardingPlan, engine: str, result, file: str) -> bool:
    """``import_config`` of the launch file's pool equals that pool's layout (``layout_key``)."""
    if engine in TRAINING_ENGINES:
        config, files = plan.config, result.files
    else:
        role, config, _, _ = next((p for p in _pools(plan) if f"_{p[0]}" in file), _pools(plan)[0])
        files = {name: text for name, text in result.files.items() if f"_{role}" in name}
    back = import_config(engine, files, pp=config.pp, ep=config.ep)
    moe = plan.model.moe is not None
    return layout_key(back, engine=engine, moe=moe) == layout_key(config, engine=engine, moe=moe)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default=",".join(TRAINING_ENGINES + SERVING_ENGINES))
    parser.add_argument("--plans", default=None, help="comma-separated plan indices (default: all)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    engines = args.engines.split(",")
    chosen = [PLANS[int(i)] for i in args.plans.split(",")] if args.plans else list(PLANS)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as workdir:
        for spec in chosen:
            role = "training" if isinstance(spec.workload, Training) else "serving"
            for engine in (e for e in engines if engine_info(e)["role"] == role):
                for answer in check(spec, engine, Path(workdir)):
                    rows.append(answer)
                    verdict = (
                        "accepted"
                        if answer["accepted"]
                        else "REFUSED"
                        if answer["accepted"] is False
                        else "not run"
                    )
                    extra = f" mismatches {answer['mismatches']}" if answer["mismatches"] else ""
                    extra += "" if answer["round_trip"] else " IMPORT DIFFERS"
                    print(
                        f"{engine:10s} {spec.name:40s} {answer['file']:34s} {verdict}{extra}{'' if answer['accepted'] else ': ' + str(answer['error'])}",
                        flush=True,
                    )
    print(summary(rows, engines))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))
    ok = all(r["accepted"] is not False and not r["mismatches"] and r["round_trip"] for r in rows)
    return 0 if ok else 1


def summary(rows: list[dict], engines: list[str]) -> str:
    lines = [
        "| engine | version | plans | launch files | accepted as written | values checked | mismatches | import round trip |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for engine in engines:
        mine = [r for r in rows if r["engine"] == engine]
        ran = [r for r in mine if r["accepted"] is not None]
        accepted = [r for r in ran if r["accepted"]]
        checked = sum(len(r.get("expected", {})) for r in accepted)
        wrong = sum(len(r["mismatches"]) for r in accepted)
        how = " (options in its source)" if engine == "trtllm" else ""
        status = f"{len(accepted)}/{len(ran)}" if ran else "not installed"
        lines.append(
            f"| {engine}{how} | {engine_info(engine)['current']} | {len({r['plan'] for r in mine})} | "
            f"{len(mine)} | {status} | {checked} | {wrong} | {sum(r['round_trip'] for r in mine)}/{len(mine)} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
