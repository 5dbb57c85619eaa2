"""Training recipe settings: the ``EstimateOptions`` a published recipe names and the cost model
prices (EP all-to-all overlap, CUDA graphs, what recompute repeats, CPU activation offloading,
distributed-optimizer instances, the MoE dispatcher, context-parallel traffic, ...).

``autoparallel estimate`` takes them with the layout they apply to and checks them against it
(``recipe_options(args, config=...)``); ``autoparallel plan`` takes the ones that are fixed
settings rather than searched dimensions (the recompute *policy* is searched; the modules
selective recompute repeats and the layers full recompute covers are not) and checks only the
rules that do not depend on the layout.
"""

from __future__ import annotations

import argparse
from typing import Any, get_args

from autoparallel.cli._args import positive_float, positive_int
from cost_model import EstimateOptions, framework_profile


def _choices(field: str) -> tuple[str, ...]:
    """The values an ``EstimateOptions`` field allows (a ``Literal`` or a tuple of one)."""
    annotation = EstimateOptions.model_fields[field].annotation
    while get_args(annotation) and not all(isinstance(a, str) for a in get_args(annotation)):
        annotation = get_args(annotation)[0]
    return tuple(get_args(annotation))


RECOMPUTE_MODULES = _choices("recompute_modules")
CUDA_GRAPHS = _choices("cuda_graphs")
CUDA_GRAPH_SCOPES = _choices("cuda_graph_scope")
EXPERT_DISPATCHERS = _choices("expert_dispatcher")
CONTEXT_PARALLEL_COMMS = _choices("context_parallel")

#: CLI destination -> ``EstimateOptions`` field, for the settings given on the command line.
_FIELDS = {
    "expert_parallel_comm_overlap": "expert_parallel_comm_overlap",
    "tp_comm_overlap": "tp_comm_overlap",
    "cuda_graphs": "cuda_graphs",
    "cuda_graph_scope": "cuda_graph_scope",
    "recompute_modules": "recompute_modules",
    "recompute_layers": "recompute_layers",
    "activation_offload_layers": "activation_offload_layers",
    "optimizer_instances": "optimizer_instances",
    "pipeline_keeps_outputs": "pipeline_keeps_outputs",
    "eager_loss": "eager_loss",
    "attention_kernel": "attention_kernel",
    "expert_dispatcher": "expert_dispatcher",
    "expert_dispatch_fp8": "expert_dispatch_fp8",
    "max_routed_nodes": "max_routed_nodes",
    "context_parallel_comm": "context_parallel",
    "bidirectional_pipeline": "bidirectional_pipeline",
    "moe_act_input_fp8": "moe_act_input_fp8",
    "moe_capacity_factor": "moe_capacity_factor",
    "moe_pad_to_capacity": "moe_pad_to_capacity",
}


def add_recipe_arguments(parser: argparse.ArgumentParser, *, searched_recompute: bool) -> None:
    """The training recipe flags (defaults: the ``EstimateOptions`` defaults, left unset so
    that only what is given reaches the estimate). ``searched_recompute``: the recompute policy
    is a searched dimension (``plan``), so the recompute flags apply to the layouts the search
    prices with that policy."""
    group = parser.add_argument_group(
        "training recipe",
        "settings of the framework run, priced by the cost model (training only)",
    )
    _add_overlap_arguments(group)
    _add_memory_arguments(group, searched_recompute=searched_recompute)
    _add_communication_arguments(group)


def _recompute_policy(name: str, *, searched_recompute: bool) -> str:
    """The layouts a recompute flag applies to, as its help text names them."""
    if searched_recompute:
        return f"layouts the search prices with {name} recompute"
    return f"--recompute {name}"


def _add_overlap_arguments(group) -> None:  # argparse's private type
    """EP and TP communication overlap and CUDA graphs."""
    group.add_argument(
        "--expert-parallel-comm-overlap",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run each micro-batch's EP all-to-alls beside another micro-batch's compute, "
        "priced per merged forward/backward layer pair with the warm-up and cool-down exposed "
        "(Megatron-core --overlap-moe-expert-parallel-comm with --delay-wgrad-compute; "
        "Megatron-Bridge moe_a2a_overlap); needs ep > 1, no full recompute and, with pp > 1, "
        "virtual stages",
    )
    group.add_argument(
        "--tp-comm-overlap",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="pipeline the sequence-parallel all-gathers and reduce-scatters with their GEMMs "
        "(Megatron-core --tp-comm-overlap; --no-tp-comm-overlap: every tensor-parallel "
        "collective exposed) (default: the framework profile's)",
    )
    group.add_argument(
        "--cuda-graphs",
        default=None,
        choices=CUDA_GRAPHS,
        help="what the run captures in CUDA graphs, priced as host issue time: partial = "
        "Transformer Engine per-layer graphs of --cuda-graph-scope (Megatron-core "
        "--cuda-graph-impl transformer_engine), full_iteration = the whole step "
        "(--cuda-graph-impl local --cuda-graph-scope full_iteration) (default none)",
    )
    group.add_argument(
        "--cuda-graph-scope",
        nargs="+",
        default=None,
        choices=CUDA_GRAPH_SCOPES,
        metavar="SCOPE",
        help="with --cuda-graphs partial: the captured scopes, of "
        f"{', '.join(CUDA_GRAPH_SCOPES)} (Megatron-core --cuda-graph-scope; default all three)",
    )


def _add_memory_arguments(group, *, searched_recompute: bool) -> None:  # argparse's private type
    """Recompute, activation offload, optimizer-state replicas and kept pipeline outputs."""

    def policy(name: str) -> str:
        return _recompute_policy(name, searched_recompute=searched_recompute)

    group.add_argument(
        "--recompute-modules",
        nargs="+",
        default=None,
        choices=RECOMPUTE_MODULES,
        metavar="MODULE",
        help=f"what selective recompute repeats, for {policy('selective')}, of "
        f"{', '.join(RECOMPUTE_MODULES)}; priced in activation memory and one more forward "
        "of each module (Megatron-core --recompute-modules; default core_attn)",
    )
    group.add_argument(
        "--recompute-layers",
        type=positive_int,
        default=None,
        metavar="N",
        help=f"for {policy('full')}: recompute only the first N layers of each model "
        "chunk (Megatron-core --recompute-method block --recompute-num-layers N; default every "
        "layer)",
    )
    group.add_argument(
        "--activation-offload-layers",
        type=positive_int,
        default=None,
        metavar="N",
        help="copy the saved activations of the first N layers to host memory and back, "
        "priced in memory and in exposed copy time over the device's host link "
        "(Megatron-core --cpu-offloading-num-layers N)",
    )
    group.add_argument(
        "--optimizer-instances",
        type=positive_int,
        default=None,
        metavar="N",
        help="replicas of the distributed optimizer's sharded states, each sharded over "
        "dp / N ranks; priced in memory (Megatron-core --num-distributed-optimizer-instances)",
    )
    group.add_argument(
        "--pipeline-keeps-outputs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the last pipeline stage keeps every micro-batch's logits until the step ends; "
        "priced in memory (torch.distributed.pipelining's step() without return_outputs=False)",
    )
    group.add_argument(
        "--eager-loss",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the loss runs eagerly although the framework compiles the model (torchtitan "
        "before 2025-04 or --compile.components model): 12 bytes per logit instead of 4; "
        "priced in memory",
    )
    group.add_argument(
        "--attention-kernel",
        default=None,
        choices=("cudnn", "flash2"),
        help="the fused attention kernel the run's framework release runs on Hopper, where it "
        "differs from the framework profile's: flash2 = torch SDPA's FlashAttention-2 backend "
        "(torchtitan before 2025-10), about 2x the time of a cuDNN-class kernel; priced in step "
        "time",
    )


def _add_communication_arguments(group) -> None:  # argparse's private type
    """MoE dispatch, context-parallel traffic and the bidirectional pipeline schedule."""
    group.add_argument(
        "--expert-dispatcher",
        default=None,
        choices=EXPERT_DISPATCHERS,
        help="MoE token dispatch: all_to_all = NCCL all-to-all (Megatron-core "
        "--moe-token-dispatcher-type alltoall), deepep = DeepEP kernels with node "
        "de-duplication (--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep), "
        "hybridep = the flex dispatcher's HybridEP backend, priced as DeepEP's kernels "
        "(--moe-flex-dispatcher-backend hybridep) (default all_to_all)",
    )
    group.add_argument(
        "--expert-dispatch-fp8",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="dispatch tokens in fp8 with per-128 scales, combine in bf16 (DeepSeek-V3 report "
        "sec. 3.3); priced in the dispatch bytes",
    )
    group.add_argument(
        "--max-routed-nodes",
        type=positive_int,
        default=None,
        metavar="N",
        help="with --expert-dispatcher deepep or hybridep: node-limited routing, each token to at most N "
        "nodes (DeepSeek-V3 report sec. 2.1.2; Megatron-core --moe-router-group-topk N with "
        "one expert group per node)",
    )
    group.add_argument(
        "--context-parallel-comm",
        default=None,
        choices=CONTEXT_PARALLEL_COMMS,
        help="context-parallel K/V traffic: ring = blocks passed around the ring under "
        "attention (Megatron-core --cp-comm-type p2p), all_gather = K/V gathered before "
        "attention, exposed (--cp-comm-type all_gather; Llama 3) (default ring)",
    )
    group.add_argument(
        "--moe-capacity-factor",
        type=positive_float,
        default=None,
        metavar="F",
        help="token dropping: each expert takes at most ceil(tokens x top-k / experts x F) "
        "tokens, the rest are dropped (Megatron-core --moe-expert-capacity-factor; default "
        "dropless)",
    )
    group.add_argument(
        "--moe-pad-to-capacity",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with --moe-capacity-factor: pad every expert's input to its capacity, so the "
        "experts compute F times the balanced load, the all-to-alls carry the padding and the "
        "dispatch needs no host sync, which lets --cuda-graphs full_iteration capture an MoE "
        "model (Megatron-core --moe-pad-expert-input-to-capacity)",
    )
    group.add_argument(
        "--bidirectional-pipeline",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a DualPipe-style schedule (DeepSeek-V3 report sec. 3.2.1): a forward and a "
        "backward chunk run together, each one's EP all-to-all hidden behind the other's "
        "compute, with DualPipe's bubble; each rank holds two stages and pp + 1 micro-batches' "
        "activations",
    )
    group.add_argument(
        "--moe-act-input-fp8",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with --precision fp8: the experts keep their activation's input for the backward "
        "pass in fp8 (DeepSeek-V3 report sec. 3.3.3); priced in activation memory",
    )


def recipe_flags_given(args: argparse.Namespace) -> list[str]:
    """The recipe flags on the command line, as typed."""
    return [
        "--" + dest.replace("_", "-") for dest in _FIELDS if getattr(args, dest, None) is not None
    ]


def recipe_options(args: argparse.Namespace, *, model=None, config=None) -> dict[str, Any]:
    """The ``EstimateOptions`` fields of the recipe flags given (none: ``{}``).

    Rules that hold for any model and layout are always checked; with ``model`` (a
    ``cost_model.ModelSpec``) also the rules of the model (the modules it has to recompute),
    with ``config`` (a ``cost_model.ParallelConfig``: ``estimate``'s layout) those of the layout.

    Raises:
        ValueError: a flag that contradicts another or the layout, naming both and the rule.
    """
    given = {
        field: getattr(args, dest)
        for dest, field in _FIELDS.items()
        if getattr(args, dest, None) is not None
    }
    if not getattr(args, "training", True):
        if given:
            names = ", ".join(recipe_flags_given(args))
            raise ValueError(f"{names} describe a training run; drop them for --inference")
        return {}
    for field in ("recompute_modules", "cuda_graph_scope"):
        if field in given:
            given[field] = tuple(dict.fromkeys(given[field]))  # the order given, no repeats
    _check_general(given)
    _check_precision(given, args)
    if model is not None:
        _check_model(given, model)
        _check_graphs(given, model, getattr(args, "framework", None))
    if config is not None:
        _check_layout(given, config, model)
    return given


def _check_precision(given: dict[str, Any], args: argparse.Namespace) -> None:
    """Transformer Engine's delayed scaling cannot recompute the fp8 inputs of moe_act and
    layernorm (Megatron-core ``TransformerConfig.__post_init__``)."""
    modules = set(given.get("recompute_modules", ())) & {"moe_act", "layernorm"}
    delayed = getattr(args, "precision", None) == "fp8" and args.fp8_recipe == "delayed"
    if modules and delayed:
        raise ValueError(
            f"--recompute-modules ({' '.join(sorted(modules))}) cannot run with --fp8-recipe "
            "delayed: delayed scaling does not support moe_act and layernorm recompute"
        )


def _check_model(given: dict[str, Any], model) -> None:
    modules = given.get("recompute_modules", ())
    moe = model.moe
    needs = {
        "mla_up_proj": (model.attention.kind == "mla", "multi-latent attention"),
        "moe_act": (moe is not None, "MoE layers"),
        "moe": (moe is not None, "MoE layers"),
        "shared_experts": (moe is not None and moe.num_shared_experts > 0, "shared experts"),
    }
    for module in modules:
        present, what = needs.get(module, (True, ""))
        if not present:
            raise ValueError(
                f"--recompute-modules ({' '.join(modules)}): {module} needs a model with "
                f"{what}; {model.name} has none"
            )
    for field, flag in (
        ("moe_capacity_factor", "--moe-capacity-factor"),
        ("moe_pad_to_capacity", "--moe-pad-to-capacity"),
    ):
        if given.get(field) and moe is None:
            raise ValueError(f"{flag} needs a MoE model; {model.name} has no MoE layers")
    if given.get("expert_parallel_comm_overlap") and moe is None:
        raise ValueError(
            f"--expert-parallel-comm-overlap needs a MoE model; {model.name} has no MoE layers"
        )


def _check_graphs(given: dict[str, Any], model, framework: str | None) -> None:
    """A whole-iteration CUDA graph cannot hold an MoE layer whose dispatch waits on the host
    (Megatron-core captures MoE layers only with drop-padding; ``cost_model`` refuses the same
    estimate)."""
    if given.get("cuda_graphs") != "full_iteration" or model.moe is None or framework is None:
        return
    if framework_profile(framework).moe_dispatch_host_sync and not given.get("moe_pad_to_capacity"):
        raise ValueError(
            f"--cuda-graphs full_iteration cannot capture {model.name}'s MoE layers under "
            f"--framework {framework}: its dropless dispatch copies the token counts to the "
            "host and waits; add --moe-capacity-factor F --moe-pad-to-capacity (static "
            "shapes) or capture --cuda-graphs partial"
        )


def _check_general(given: dict[str, Any]) -> None:
    scope = given.get("cuda_graph_scope")
    if scope is not None and given.get("cuda_graphs") != "partial":
        raise ValueError(
            f"--cuda-graph-scope ({' '.join(scope)}) needs --cuda-graphs partial (the scopes of "
            f"Transformer Engine per-layer graphs); --cuda-graphs is "
            f"{given.get('cuda_graphs', 'none')}"
        )
    if scope is not None and "moe_preprocess" in scope and "moe_router" not in scope:
        raise ValueError(
            f"--cuda-graph-scope ({' '.join(scope)}) must include moe_router with moe_preprocess "
            "(Megatron-core captures the dispatch preprocessing only after the router)"
        )
    if given.get("max_routed_nodes") is not None and given.get("expert_dispatcher") not in (
        "deepep",
        "hybridep",
    ):
        raise ValueError(
            f"--max-routed-nodes ({given['max_routed_nodes']}) needs --expert-dispatcher deepep "
            "or hybridep (node-limited routing is priced in the node de-duplicated dispatch)"
        )
    if given.get("moe_pad_to_capacity") and given.get("moe_capacity_factor") is None:
        raise ValueError(
            "--moe-pad-to-capacity needs --moe-capacity-factor (the capacity each expert's "
            "input is padded to)"
        )
    if given.get("expert_parallel_comm_overlap") and given.get("bidirectional_pipeline"):
        raise ValueError(
            "--expert-parallel-comm-overlap and --bidirectional-pipeline are two schedules that "
            "hide the same EP all-to-alls; give one"
        )


def _check_layout(given: dict[str, Any], config, model) -> None:
    recompute = config.recompute
    if "recompute_modules" in given and recompute != "selective":
        raise ValueError(
            f"--recompute-modules ({' '.join(given['recompute_modules'])}) needs --recompute "
            f"selective (the modules selective recompute repeats); --recompute is {recompute}"
        )
    if "recompute_layers" in given and recompute != "full":
        raise ValueError(
            f"--recompute-layers ({given['recompute_layers']}) needs --recompute full (the "
            f"layers of each model chunk full recompute covers); --recompute is {recompute}"
        )
    chunks = config.pp * config.virtual_stages
    if model is not None and given.get("recompute_layers", 0) > -(-model.num_layers // chunks):
        raise ValueError(
            f"--recompute-layers ({given['recompute_layers']}) must be at most the layers of one "
            f"model chunk ({-(-model.num_layers // chunks)}: {model.num_layers} layers over "
            f"pp*virtual_stages = {chunks} chunks)"
        )
    instances = given.get("optimizer_instances", 1)
    if instances > 1 and config.zero_stage == 0:
        raise ValueError(
            f"--optimizer-instances ({instances}) needs the distributed optimizer, "
            "--zero-stage >= 1; --zero-stage is 0"
        )
    if (config.dp * config.cp) % instances:
        raise ValueError(
            f"--optimizer-instances ({instances}) must divide dp*cp ({config.dp * config.cp}): "
            "each instance shards the states over an equal share of the data-parallel ranks"
        )
    if given.get("expert_parallel_comm_overlap"):
        _check_overlap(config)


def _check_overlap(config) -> None:
    """Megatron-core's checks of ``--overlap-moe-expert-parallel-comm``
    (``TransformerConfig.__post_init__``)."""
    if config.ep == 1:
        raise ValueError(
            "--expert-parallel-comm-overlap needs expert parallelism, --ep > 1; --ep is 1"
        )
    if config.pp > 1 and config.virtual_stages == 1:
        raise ValueError(
            f"--expert-parallel-comm-overlap with --pp {config.pp} needs an interleaved "
            "pipeline, --virtual-stages > 1; --virtual-stages is 1"
        )
    if config.recompute == "full":
        raise ValueError(
            "--expert-parallel-comm-overlap does not run with full recompute; --recompute is full"
        )
