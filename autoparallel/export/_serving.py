"""Serving recipes: vLLM (``vllm serve``), SGLang (``python -m sglang.launch_server``) and
TensorRT-LLM (``trtllm-serve`` + ``--extra_llm_api_options`` YAML).

Flag names follow each engine's own parser at the version the recipe is stamped with: vLLM 0.33
``vllm/engine/arg_utils.py`` (``--data-parallel-size-local``, ``--data-parallel-address``,
``--data-parallel-rpc-port``, ``--headless``, ``--data-parallel-start-rank``, ``--all2all-backend``),
SGLang 0.5.23 ``srt/server_args.py`` (``--attn-dp-size`` replaces the deprecated
``--dp-size --enable-dp-attention``; ``--nnodes --node-rank --dist-init-addr``), TensorRT-LLM's
documented ``trtllm-serve`` options and LLM API (``enable_attention_dp``,
``moe_expert_parallel_size``).
"""

from __future__ import annotations

import json

from autoparallel.export._common import (
    Export,
    Recipe,
    Serving,
    command,
    describe,
    readme,
    rule_violations,
    script,
    serving_view,
    stage_sizes,
    training_only,
    uneven,
)
from autoparallel.plan import ServingSettings, ShardingPlan
from cost_model import ParallelConfig, sglang_uses_deepep

DP_RPC_PORT = 13345
SGLANG_PORT = 5000
SGLANG_EXPERT_LOCATION = "sglang_expert_location.json"


def _pools(
    plan: ShardingPlan,
) -> list[tuple[str, ParallelConfig, int, ServingSettings | None]]:
    """(name, unit config, devices, serving settings) of each deployment pool: the colocated
    layout, or the prefill and decode pools (each with its own settings) of a disaggregated plan."""
    if plan.disaggregated:
        return [
            (pool.role, pool.config, pool.num_devices, pool.serving)
            for pool in plan.deployment.pools
        ]
    return [("colocated", plan.config, plan.world_size, plan.serving)]


def _pipeline_partition(
    plan: ShardingPlan, config: ParallelConfig, variable: str
) -> dict[str, str]:
    """vLLM (``VLLM_PP_LAYER_PARTITION``) and SGLang (``SGLANG_PP_LAYER_PARTITION``) read an
    uneven layer split from an environment variable."""
    if config is not plan.config or config.pp == 1 or not uneven(plan):
        return {}
    return {variable: ",".join(str(size) for size in stage_sizes(plan))}


# ---------------------------------------------------------------------------- vLLM
def vllm(plan: ShardingPlan, recipe: Recipe) -> Export:
    files, dropped, notes = {}, [], []
    for name, config, devices, settings in _pools(plan):
        dropped += [f"{name}: {item}" for item in training_only(config)]
        dropped += [
            f"{name}: {item}"
            for item in rule_violations(
                plan, config, engine="vllm", version=recipe.version, serving=settings
            )
        ]
        pool_files, pool_notes = _vllm_pool(plan, config, devices, settings, recipe, phase=name)
        files.update(pool_files)
        notes += pool_notes
    if len(files) > 1:
        notes.append(
            "prefill and decode pools exchange KV caches through NixlConnector (--kv-transfer-config); "
            "a disaggregated-serving proxy in front sends each request to a prefill and then a decode deployment"
        )
    steps = [
        f"MASTER_ADDR=<address of node 0 of the deployment> bash {file} (on the node the file names)"
        for file in files
    ]
    files["README_vllm.md"] = readme(
        title="vLLM launch recipe",
        recipe=recipe,
        steps=steps,
        dropped=dropped,
        notes=notes,
        layout=describe(plan.config),
    )
    return Export("vllm", files, tuple(dropped), tuple(notes), recipe.version)


def _vllm_pool(
    plan: ShardingPlan,
    config: ParallelConfig,
    devices: int,
    settings: ServingSettings | None,
    recipe: Recipe,
    *,
    phase: str,
) -> tuple[dict[str, str], list[str]]:
    """One launch file per node of a deployment (node 0 serves the API; the others run headless)."""
    s = serving_view(plan, config, devices, settings)
    group = config.pp * s.instance_size  # devices of one vLLM deployment
    nodes = recipe.nodes(group)
    args = [
        "vllm",
        "serve",
        recipe.model_path,
        "--dtype",
        "bfloat16",
        "--tensor-parallel-size",
        str(s.attention_tp),
        "--pipeline-parallel-size",
        str(config.pp),
        "--data-parallel-size",
        str(s.attention_replicas),
    ]
    if config.ep > 1:
        low_latency = phase == "decode" or s.two_batch_overlap
        if s.all_to_all_backend != "auto":  # the kernels the plan priced for this pool
            low_latency = s.all_to_all_backend == "low_latency"
        backend = "deepep_low_latency" if low_latency else "deepep_high_throughput"
        args += ["--enable-expert-parallel", "--all2all-backend", backend]
    if s.num_redundant_experts:
        args += [
            "--enable-eplb",
            "--eplb-config",
            json.dumps({"num_redundant_experts": s.num_redundant_experts}),
        ]
    args += [
        "--kv-cache-dtype",
        "fp8" if s.kv_dtype == "fp8" else "auto",
        "--max-num-seqs",
        str(s.batch_size),
    ]
    if s.two_batch_overlap and config.ep > 1:
        args.append("--enable-dbo")
    if phase != "colocated":  # vLLM's disaggregated prefill: both pools run a KV connector
        args += [
            "--kv-transfer-config",
            json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"}),
        ]
    notes = [
        f"{phase}: {s.num_instances} deployment(s) of {group} devices on {nodes} node(s) each, behind a load balancer"
    ]
    env = _pipeline_partition(plan, config, "VLLM_PP_LAYER_PARTITION")
    header = [
        f"vLLM {recipe.version}, {phase} pool: {describe(config)}",
        f"{s.num_instances} x {group} devices",
    ]
    if nodes == 1:
        return {f"launch_vllm_{phase}.sh": script(command(args, env=env), header=header)}, notes
    files = {}
    for node in range(nodes):
        node_args = args + _vllm_node(config, s.attention_replicas, nodes, node, notes, phase)
        files[f"launch_vllm_{phase}_node{node}.sh"] = script(
            command(node_args, env=env), header=header + [f"node {node} of {nodes}"]
        )
    return files, notes


def _vllm_node(
    config: ParallelConfig,
    replicas: int,
    nodes: int,
    node: int,
    notes: list[str],
    phase: str,
) -> list[str]:
    """Per-node arguments: each node runs ``replicas / nodes`` local DP ranks; node 0 serves the
    API, the others run ``--headless`` from their start rank. When the DP ranks do not split
    over the nodes, tensor/pipeline groups span nodes (``--nnodes --node-rank --master-addr``)."""
    if replicas % nodes:
        if node == 0:
            notes.append(
                f"{phase}: {replicas} DP rank(s) over {nodes} nodes: tensor/pipeline groups span nodes (--nnodes/--node-rank)"
            )
        args = [
            "--nnodes",
            str(nodes),
            "--node-rank",
            str(node),
            "--master-addr",
            "${MASTER_ADDR}",
        ]
        return args + (["--headless"] if node else [])
    local = replicas // nodes
    args = [
        "--data-parallel-size-local",
        str(local),
        "--data-parallel-address",
        "${MASTER_ADDR}",
        "--data-parallel-rpc-port",
        str(DP_RPC_PORT),
    ]
    return args + (["--headless", "--data-parallel-start-rank", str(node * local)] if node else [])


# ---------------------------------------------------------------------------- SGLang
def sglang(plan: ShardingPlan, recipe: Recipe) -> Export:
    files, dropped, notes = {}, [], []
    for name, config, devices, settings in _pools(plan):
        dropped += [f"{name}: {item}" for item in training_only(config)]
        dropped += [
            f"{name}: {item}"
            for item in rule_violations(
                plan, config, engine="sglang", version=recipe.version, serving=settings
            )
        ]
        files[f"launch_sglang_{name}.sh"], pool_notes = _sglang_pool(
            plan, config, devices, settings, recipe, phase=name
        )
        notes += pool_notes
    if (location := sglang_expert_location(plan, plan.config)) is not None:
        files[SGLANG_EXPERT_LOCATION] = location
    if len(files) > 1 + (SGLANG_EXPERT_LOCATION in files):
        notes.append(
            "put sglang-router in PD mode in front: --pd-disaggregation --prefill <prefill urls> --decode <decode urls>"
        )
    steps = [
        f"on each node of a deployment: NODE_RANK=<0..nodes-1> MASTER_ADDR=<node 0 address> bash {file}"
        for file in files
        if file.endswith(".sh")
    ]
    if SGLANG_EXPERT_LOCATION in files:  # read by --init-expert-location on every node
        steps.insert(0, f"copy {SGLANG_EXPERT_LOCATION} beside the launch scripts on every node")
    files["README_sglang.md"] = readme(
        title="SGLang launch recipe",
        recipe=recipe,
        steps=steps,
        dropped=dropped,
        notes=notes,
        layout=describe(plan.config),
    )
    return Export("sglang", files, tuple(dropped), tuple(notes), recipe.version)


def _sglang_pool(
    plan: ShardingPlan,
    config: ParallelConfig,
    devices: int,
    settings: ServingSettings | None,
    recipe: Recipe,
    *,
    phase: str,
) -> tuple[str, list[str]]:
    """The launch script of one SGLang pool and its notes."""
    s = serving_view(plan, config, devices, settings)
    group = config.pp * s.instance_size
    args = [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        recipe.model_path,
        "--dtype",
        "bfloat16",
        "--tp-size",
        str(s.instance_size),
        "--pp-size",
        str(config.pp),
    ]
    if s.attention_replicas > 1:
        args += ["--attn-dp-size", str(s.attention_replicas)]
    # the predicate the cost model prices the MoE path by
    # (``cost_model._inference_comm._expert_comm``)
    deepep = bool(sglang_uses_deepep(tp=config.tp, ep=config.ep, etp=config.etp))
    args += _sglang_expert_args(plan=plan, config=config, s=s, deepep=deepep, phase=phase)
    args += [
        "--kv-cache-dtype",
        "fp8_e4m3" if s.kv_dtype == "fp8" else "auto",
        "--max-running-requests",
        str(s.batch_size * s.attention_replicas),
    ]
    if s.two_batch_overlap and deepep:
        args.append("--enable-two-batch-overlap")
    if phase != "colocated":
        args += ["--disaggregation-mode", phase]
    node_args, notes = _sglang_nodes(recipe=recipe, s=s, group=group, phase=phase)
    env = _pipeline_partition(plan, config, "SGLANG_PP_LAYER_PARTITION")
    header = [
        f"SGLang {recipe.version}, {phase} pool: {describe(config)}",
        f"{s.num_instances} x {group} devices",
    ]
    return script(command(args + node_args, env=env), header=header), notes


def _sglang_expert_args(
    *, plan: ShardingPlan, config: ParallelConfig, s: Serving, deepep: bool, phase: str
) -> list[str]:
    """SGLang's expert-parallel arguments: EP size, all-to-all backend, redundant experts and
    the plan's expert placement."""
    args: list[str] = []
    if config.ep > 1:
        args += [
            "--ep-size",
            str(config.ep),
            "--moe-a2a-backend",
            "deepep" if deepep else "none",
        ]
        if deepep:
            mode = s.all_to_all_backend  # the kernels the plan priced for this pool
            if mode == "auto":
                mode = "low_latency" if phase == "decode" else "normal"
            args += ["--deepep-mode", mode]
    if s.num_redundant_experts:
        args += [
            "--ep-num-redundant-experts",
            str(s.num_redundant_experts),
            "--enable-eplb",
        ]
    if sglang_expert_location(plan, config) is not None:
        args += ["--init-expert-location", SGLANG_EXPERT_LOCATION]
    return args


def _sglang_nodes(
    *, recipe: Recipe, s: Serving, group: int, phase: str
) -> tuple[list[str], list[str]]:
    """(multi-node arguments, notes) of one SGLang server of ``group`` devices."""
    nodes = recipe.nodes(group)
    notes = [
        f"{phase}: {s.num_instances} server(s) of {group} devices on {nodes} node(s) each, behind sglang-router"
    ]
    if nodes == 1:
        return [], notes
    if group % nodes:
        notes.append(
            f"{phase}: {group} devices do not split evenly over {nodes} nodes of {recipe.devices_per_host}"
        )
    args = [
        "--nnodes",
        str(nodes),
        "--node-rank",
        "${NODE_RANK}",
        "--dist-init-addr",
        f"${{MASTER_ADDR}}:{SGLANG_PORT}",
    ]
    return args, notes


def sglang_expert_location(plan: ShardingPlan, config: ParallelConfig) -> str | None:
    """The plan's expert placement as SGLang's ``--init-expert-location`` JSON: for every layer,
    ``physical_to_logical_map`` lists the expert held in each physical slot, EP rank after EP rank
    (``sglang/srt/eplb/expert_location.py`` ``init_by_mapping``; one row per hidden layer)."""
    placement = plan.expert_placement
    if (
        placement is None
        or config is not plan.config
        or placement.ep != config.ep
        or config.ep == 1
    ):
        return None
    slots: list[list[int]] = [[] for _ in range(placement.ep)]
    for expert, ranks in enumerate(placement.expert_to_ranks):
        for rank in ranks:
            slots[rank].append(expert)
    assert all(len(rank_slots) == placement.slots_per_rank for rank_slots in slots), (
        "placement slots"
    )
    row = [expert for rank_slots in slots for expert in rank_slots]
    return json.dumps({"physical_to_logical_map": [row] * plan.model.num_layers}) + "\n"


# ---------------------------------------------------------------------------- TensorRT-LLM
def trtllm(plan: ShardingPlan, recipe: Recipe) -> Export:
    files, dropped, notes = {}, [], []
    for name, config, devices, settings in _pools(plan):
        dropped += [f"{name}: {item}" for item in training_only(config)]
        dropped += [
            f"{name}: {item}"
            for item in rule_violations(
                plan, config, engine="trtllm", version=recipe.version, serving=settings
            )
        ]
        s = serving_view(plan, config, devices, settings)
        options_name = f"extra_llm_api_options_{name}.yaml"
        args = [
            "trtllm-serve",
            recipe.model_path,
            "--tp_size",
            str(s.instance_size),
            "--pp_size",
            str(config.pp),
            "--ep_size",
            str(config.ep),
            "--max_batch_size",
            str(s.batch_size * s.attention_replicas),
            "--gpus_per_node",
            str(min(plan.host_devices, config.pp * s.instance_size)),
            "--extra_llm_api_options",
            options_name,
        ]
        files[f"launch_trtllm_{name}.sh"] = script(
            command(args),
            header=[f"TensorRT-LLM {recipe.version}, {name} pool: {describe(config)}"],
        )
        files[options_name] = _trtllm_options(plan, config, s)
        notes.append(
            f"{name}: MoE tensor parallel = tp_size / ep_size = {s.instance_size // config.ep}; {s.num_instances} instance(s); "
            f"multi-node instances launch under mpirun/srun with trtllm-llmapi-launch"
        )
    steps = [f"bash {file}" for file in files if file.endswith(".sh")]
    files["README_trtllm.md"] = readme(
        title="TensorRT-LLM launch recipe",
        recipe=recipe,
        steps=steps,
        dropped=dropped,
        notes=notes,
        layout=describe(plan.config),
    )
    return Export("trtllm", files, tuple(dropped), tuple(notes), recipe.version)


def _trtllm_options(plan: ShardingPlan, config: ParallelConfig, s) -> str:
    attention_dp = s.instance_size > 1 and s.attention_tp < s.instance_size
    options = [
        f"enable_attention_dp: {'true' if attention_dp else 'false'}",
        f"moe_expert_parallel_size: {config.ep}",
        f"moe_tensor_parallel_size: {s.instance_size // config.ep}",
    ]
    if s.kv_dtype == "fp8":
        options.append("kv_cache_config:\n  dtype: fp8")
    if s.num_redundant_experts and plan.expert_placement is not None:
        slots = plan.expert_placement.num_experts + s.num_redundant_experts
        options.append(f"moe_config:\n  load_balancer:\n    num_slots: {slots}")
    if (
        config is not plan.config
    ):  # a pool of a disaggregated deployment (trtllm-serve disaggregated)
        options.append("cache_transceiver_config:\n  backend: DEFAULT")
    return "\n".join(options) + "\n"
