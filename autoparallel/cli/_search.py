"""``autoparallel plan``, ``autoparallel explain`` and ``autoparallel export``.

``autoparallel plan`` with no arguments plans ``ref-3t-moe`` inference (4,096-token prompts,
1,024 output tokens, TTFT <= 5 s, TPOT <= 50 ms) on one GB200 NVL72 rack (preset
``gb200-nvl72``: 72 GPUs in one NVLink domain) and writes ``plan.json``.
A study kept in ``--storage sqlite:///study.db`` can be opened with Optuna Dashboard:
``optuna-dashboard sqlite:///study.db`` (``pip install 'moe-autoparallel[dashboard]'``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from autoparallel.cli._args import (
    add_job_arguments,
    input_file,
    output_file,
    output_folder,
    positive_int,
    serving_precision,
    storage_url,
    training_options,
    with_network_override,
)
from autoparallel.cli._deployment import deployment_line, pool_lines
from autoparallel.cli._recipe_args import (
    add_recipe_arguments,
    recipe_flags_given,
    recipe_options,
)
from autoparallel.cli._render import add_json_flag, console, fit_words, print_json
from autoparallel.cli._render import table as table_of
from autoparallel.cli._routing_args import (
    add_routing_arguments,
    routing_flags_given,
    routing_options,
)
from autoparallel.cli._serving_args import (
    add_load_arguments,
    add_plan_slo_arguments,
    default_slo_named,
    load_fields,
    plan_slos,
)
from cost_model import describe_layout, framework_names, human_bytes, human_seconds

DEFAULT_CLUSTER = "gb200-nvl72"
DEFAULT_TRIALS = 250


def register(subparsers) -> None:  # argparse's private type
    plan = subparsers.add_parser("plan", help="search the best parallel layout and write plan.json")
    _plan_arguments(plan)
    plan.set_defaults(func=_plan)
    explain = subparsers.add_parser(
        "explain", help="breakdown, bottleneck and runners-up of a plan"
    )
    explain.add_argument("plan", nargs="?", default="plan.json", type=input_file)
    add_json_flag(explain)
    explain.set_defaults(func=_explain)
    export = subparsers.add_parser("export", help="launch arguments / config file of an engine")
    export.add_argument("plan", nargs="?", default="plan.json", type=input_file)
    export.add_argument(
        "--format",
        required=True,
        choices=("vllm", "sglang", "trtllm", "megatron", "torchtitan", "deepspeed"),
    )
    export.add_argument(
        "--model-path",
        default=None,
        help="checkpoint path or hub id (default: the model's hub id, else ${MODEL_PATH})",
    )
    export.add_argument(
        "--engine-version",
        default=None,
        help="engine release the recipe is for (default: the current one)",
    )
    export.add_argument(
        "--output-dir",
        type=output_folder,
        default=None,
        help="write the files here instead of printing them",
    )
    add_json_flag(export)
    export.set_defaults(func=_export)


def _plan_arguments(parser: argparse.ArgumentParser) -> None:
    add_job_arguments(parser, cluster=DEFAULT_CLUSTER, nodes=None, training=False)
    add_plan_slo_arguments(parser)
    add_load_arguments(parser, slo_ms=False)
    parser.add_argument(
        "--no-disaggregation", action="store_true", help="do not price a prefill/decode split"
    )
    parser.add_argument(
        "--objective",
        default=None,
        help="step_time, throughput, tpot, ttft, e2e, memory, memory_headroom or pareto "
        "(default: step_time for training, throughput for serving, e2e, the mean end-to-end "
        "latency, under --request-rate)",
    )
    parser.add_argument("--trials", type=positive_int, default=DEFAULT_TRIALS)
    parser.add_argument("--sampler", default=None, choices=("tpe", "nsga2", "random"))
    _study_arguments(parser)
    parser.add_argument(
        "--idle-devices",
        default="when_needed",
        choices=("never", "when_needed", "compare"),
        help="plan on fewer whole nodes when no layout uses them all (when_needed), or also compare them (compare)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=output_file, default="plan.json")
    parser.add_argument(
        "--engine",
        default=None,
        choices=("vllm", "sglang", "trtllm", "megatron", "torchtitan", "deepspeed"),
        help="keep only layouts this engine runs",
    )
    parser.add_argument(
        "--engine-version",
        default=None,
        help="with --engine: its release (default: the current one)",
    )
    parser.add_argument(
        "--framework",
        default=None,
        choices=framework_names(),
        help="training software profile (its defaults and host costs; CUDA graphs are priced "
        "against its host operator counts)",
    )
    add_recipe_arguments(parser, searched_recompute=True)
    add_routing_arguments(parser)
    add_json_flag(parser)
    parser.set_defaults(job_defaults={name: parser.get_default(name) for name in _JOB_ARGUMENTS})


def _study_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the search keeps its study and how its workers share it."""
    parser.add_argument(
        "--storage",
        default=None,
        type=storage_url,
        help="sqlite:///study.db, any RDB URL or journal:PATH (resumable; view with: optuna-dashboard sqlite:///study.db)",
    )
    parser.add_argument(
        "--workers", type=positive_int, default=1, help="worker processes searching one study"
    )
    parser.add_argument(
        "--heartbeat-s",
        type=positive_int,
        default=5,
        help="RDB storages: seconds between the heartbeats a worker sends for its running trial",
    )
    parser.add_argument(
        "--grace-period-s",
        type=positive_int,
        default=20,
        help="a trial with no heartbeat for this long (its worker died) is failed and retried; "
        "must exceed --heartbeat-s",
    )
    parser.add_argument(
        "--study",
        default=None,
        help="study name in --storage (default: derived from the job); workers on other machines join it by name",
    )
    parser.add_argument(
        "--from-study",
        action="store_true",
        help="write the plan from the study's finished trials without searching (the job is read from the study)",
    )


#: Arguments that describe the job; ``--from-study`` reads the job from the study instead.
_JOB_ARGUMENTS = (
    "model",
    "cluster",
    "nodes",
    "training",
    "objective",
    "sequence_length",
    "global_batch_tokens",
    "framework",
    "prompt_tokens",
    "output_tokens",
)


def _workload(args: argparse.Namespace):
    from cost_model import Inference, Training

    if args.training:
        return Training(
            sequence_length_tokens=args.sequence_length,
            global_batch_tokens=args.global_batch_tokens,
            **training_options(args),
            framework=args.framework,
        )
    return Inference(
        **load_fields(args),
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        prompt_tokens_cv=args.prompt_tokens_cv,
        output_tokens_cv=args.output_tokens_cv,
        prefix_cache_hit_rate=args.prefix_cache_hit_rate,
        **plan_slos(args),
        disaggregation_allowed=not args.no_disaggregation,
        **serving_precision(args),
    )


def _plan(args: argparse.Namespace) -> int:
    import optuna

    from autoparallel._planner import find_plan, resolve_cluster, resolve_model
    from cost_model import EstimateOptions, InfeasiblePlanError
    from search import SearchSettings

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.workers < 1:
        raise ValueError(f"--workers ({args.workers}) must be >= 1")
    if args.from_study:
        if flags := recipe_flags_given(args) + routing_flags_given(args):
            raise ValueError(
                f"--from-study ranks the trials the study already priced; drop {', '.join(flags)} "
                "(start a new study with them instead)"
            )
        return _plan_from_study(args)
    model = resolve_model(args.model)
    recipe = recipe_options(args, model=model) | routing_options(args, model=model)
    cluster = with_network_override(resolve_cluster(args.cluster, num_nodes=args.nodes), args)
    workload = _workload(args)
    if args.grace_period_s <= args.heartbeat_s:
        raise ValueError(
            f"--grace-period-s ({args.grace_period_s}) must be > --heartbeat-s "
            f"({args.heartbeat_s}): a live trial would be failed between two heartbeats"
        )
    settings = SearchSettings(
        study_name=args.study,
        idle_devices=args.idle_devices,
        heartbeat_interval_s=args.heartbeat_s,
        grace_period_s=args.grace_period_s,
    )
    if not args.json:
        console.print(
            f"Planning [bold]{model.name}[/] {workload.kind} on [bold]{cluster.num_devices}[/] x "
            f"{cluster.device.name} ({cluster.name}); budget {args.trials} trials (a small space is priced whole)"
        )
    with Progress(
        TextColumn("search"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=args.json,
    ) as bar:
        task = bar.add_task("search", total=args.trials)
        try:
            plan = find_plan(
                model,
                cluster,
                workload,
                objective=args.objective,
                n_trials=args.trials,
                sampler=args.sampler,
                storage=args.storage,
                seed=args.seed,
                workers=args.workers,
                settings=settings,
                engine=args.engine,
                engine_version=args.engine_version,
                estimate_options=EstimateOptions(**recipe) if recipe else None,
                progress=lambda done, total: bar.update(task, completed=done, total=total),
            )
        except InfeasiblePlanError as error:
            raise default_slo_named(error, args) from None
    return _write(
        plan,
        args.output,
        as_json=args.json,
        cluster=cluster,
        memory_fraction=getattr(args, "memory_fraction", None),
    )


def _plan_from_study(args: argparse.Namespace) -> int:
    """``plan --from-study``: rank the trials a (finished) study holds and write the plan."""
    from autoparallel._planner import find_plan
    from search import SearchSettings, load_study_job

    if args.storage is None:
        raise ValueError("--from-study (True) needs --storage: the URL of the study's database")
    given = [
        f"--{name.replace('_', '-')}"
        for name, default in args.job_defaults.items()
        if getattr(args, name) != default
    ]
    if given:
        raise ValueError(f"--from-study reads the job from the study; drop {', '.join(given)}")
    job = load_study_job(storage=args.storage, study_name=args.study)
    console.print(
        f"Writing the plan of study [bold]{job.study_name}[/] ({job.num_complete_trials} finished trials): "
        f"{job.model.name} {job.workload.kind} on {job.cluster.num_devices} x {job.cluster.device.name}"
    )
    settings = SearchSettings(
        study_name=job.study_name,
        bounds=job.bounds,
        coordinates=job.coordinates,
        idle_devices="never",
    )
    plan = find_plan(
        job.model,
        job.cluster,
        job.workload,
        objective=job.objective if len(job.objective) > 1 else job.objective[0],
        n_trials=0,
        storage=args.storage,
        settings=settings,
    )
    return _write(plan, args.output, as_json=args.json, cluster=job.cluster)


def _write(
    plan, output: Path, *, cluster, as_json: bool = False, memory_fraction: float | None = None
) -> int:
    path = plan.save(output)
    if as_json:
        print_json({"output": str(path), "plan": json.loads(plan.to_json())})
        return 0
    console.print(plan_table(plan))
    search = plan.provenance.search
    console.print(
        f"space {search.space_size:,} layouts ({search.num_meshes:,} meshes); {search.method} "
        f"{search.num_trials} trials, {search.rows_evaluated:,} layouts priced in {search.elapsed_s:.1f} s; "
        f"infeasible layouts: {_counts(search.infeasible_layouts)}"
    )
    from autoparallel._planner import LEAN_METHOD_SUFFIX

    if search.method.endswith(LEAN_METHOD_SUFFIX):
        console.print(
            f"the {search.num_trials} sampled trials found no fitting layout: this plan is the best "
            "of an exhaustive pass over the leanest switches (full recompute, micro-batch or batch 1); "
            "more --trials may find a faster one",
            highlight=False,
            markup=False,
        )
    if search.idle_reason:
        console.print(f"devices: {search.idle_reason}", highlight=False, markup=False)
    if line := deployment_line(plan):
        console.print(line)
    from autoparallel.cli._engines import engines_line

    console.print(engines_line(plan), highlight=False, markup=False)
    if plan.serving is not None:
        from autoparallel.cli._serving_args import simulated_line

        sized = (
            cluster
            if cluster.num_devices == plan.world_size
            else cluster.with_nodes(plan.world_size // plan.devices_per_node).with_devices_per_node(
                plan.devices_per_node
            )
        )
        console.print(simulated_line(plan, model=plan.model, cluster=sized, workload=plan.job))
        from autoparallel.cli._serving_args import pools_simulated_line, serving_error_bar_line

        if pools := pools_simulated_line(plan):
            console.print(pools)

        if bar := serving_error_bar_line(
            plan.model,
            sized,
            engine=plan.job.serving_engine,
            deployment=plan.deployment.kind,
            version=plan.job.serving_engine_version,
        ):
            console.print(bar, highlight=False, markup=False)
    elif plan.predicted is not None and plan.job.kind == "training":
        from autoparallel.cli._cost import (
            print_error_band,
            print_memory_error_band,
            print_memory_risk,
        )
        from cost_model import memory_error_band, training_error_band

        band = training_error_band(plan.model, cluster, plan.config)
        if band is not None:
            print_error_band(band, plan.predicted.step_time_s)
        memory_band = memory_error_band(plan.config)
        if memory_band is not None:
            print_memory_error_band(memory_band, plan.predicted.memory_per_device_bytes)
            print_memory_risk(memory_band, plan.predicted, memory_fraction=memory_fraction)
    console.print(f"wrote [bold]{path}[/]")
    return 0


def _counts(counts: dict) -> str:
    parts = [f"{name} {count:,}" for name, count in sorted(counts.items()) if count]
    return ", ".join(parts) or "none"


def describe_config(config, serving=None) -> str:
    """Compact one-line layout: ``tp4 pp2 dp8 ep32 etp1 sp zero1 1f1b mb1``."""
    c = config
    words = [f"tp{c.tp}", f"pp{c.pp}", f"dp{c.dp}"]
    words += [f"cp{c.cp}"] if c.cp > 1 else []
    words += [f"ep{c.ep}", f"etp{c.etp}"]
    words += ["attn-dp"] if c.attention_data_parallel else []
    words += ["sp"] if c.sequence_parallel else []
    if serving is None:
        words += [
            f"zero{c.zero_stage}",
            c.pipeline_schedule + (f"x{c.virtual_stages}" if c.virtual_stages > 1 else ""),
            f"mb{c.micro_batch_size}",
        ]
        words += [f"recompute={c.recompute}"] if c.recompute != "none" else []
    else:
        words += [f"batch{serving.batch_size}", f"kv-{serving.kv_dtype}"]
        words += (
            [f"+{serving.num_redundant_experts}redundant"] if serving.num_redundant_experts else []
        )
    return " ".join(words)


def _seconds(value) -> str:
    return "-" if value is None else human_seconds(value)


def plan_table(plan) -> Table:
    """The best layout and the runners-up: config, TTFT and TPOT (inference) or step time and MFU
    (training), tokens/s per device, memory per device, bottleneck."""
    inference = plan.serving is not None
    middle = (
        {"TTFT": "number", "TPOT": "number"} if inference else {"step": "number", "MFU": "number"}
    )
    columns = {
        "#": "number",
        "config": "text",
        **middle,
        "tok/s/dev": "number",
        "mem/dev": "number",
        "bottleneck": "text",
    }
    title = f"{plan.provenance.model_name} on {plan.world_size} devices ({plan.provenance.cluster_name})"
    if plan.deployment.note.startswith("no colocated layout meets the SLOs"):
        title += ": colocated layouts, none meeting the SLOs (the plan deploys the pools below)"
    table = table_of(title, columns)
    rows = [(plan.config, plan.predicted, plan.serving)] + [
        (a.config, a.predicted, a.serving) for a in plan.alternatives
    ]
    for index, (config, cost, serving) in enumerate(rows):
        if inference:
            figures = (_seconds(cost.ttft_s), _seconds(cost.tpot_s))
        else:
            figures = (
                human_seconds(cost.step_time_s),
                "-" if cost.mfu is None else f"{cost.mfu:.1%}",
            )
        table.add_row(
            str(index + 1),
            describe_config(config, serving),
            *figures,
            f"{cost.tokens_per_s_per_device:,.1f}"
            if cost.tokens_per_s_per_device is not None
            else "-",
            human_bytes(cost.memory_per_device_bytes),
            cost.bottleneck,
            style="bold green" if index == 0 else None,
        )
    fit_words(table)
    return table


def _explain(args: argparse.Namespace) -> int:
    from autoparallel.plan import load_plan

    plan = load_plan(Path(args.plan))
    cost = plan.predicted
    if args.json:
        print_json(_explanation(plan))
        return 0
    console.print(
        f"[bold]{plan.provenance.model_name}[/] on {plan.world_size} devices of {plan.provenance.cluster_name}: {describe_config(plan.config, plan.serving)}"
    )
    console.print(plan_table(plan))
    if settings := recipe_settings(plan):
        words = ", ".join(f"{name}={value}" for name, value in settings.items())
        console.print(f"priced with: {words}", highlight=False, markup=False)
    if cost is not None:
        console.print(_time_table(cost))
        console.print(_memory_table(cost))
        console.print(
            f"bottleneck: [bold]{cost.bottleneck}[/] ({human_seconds(cost.time_s.get(cost.bottleneck, 0.0))} of {human_seconds(cost.step_time_s)})"
        )
    for index, alternative in enumerate(plan.alternatives, start=2):
        console.print(
            f"#{index} {describe_config(alternative.config, alternative.serving)} lost: {alternative.reason_lost}"
        )
    if line := deployment_line(plan):
        console.print(line)
    for line in pool_lines(plan):
        console.print(line, highlight=False, markup=False)
    return 0


def recipe_settings(plan) -> dict:
    """The software settings the plan was priced with that differ from the cost model's
    defaults (``ShardingPlan.estimate_options``), as JSON values."""
    from cost_model import EstimateOptions

    if plan.estimate_options is None:
        return {}
    defaults = EstimateOptions().model_dump(mode="json")
    recorded = plan.estimate_options.model_dump(mode="json", exclude={"calibration"})
    return {name: value for name, value in recorded.items() if value != defaults[name]}


def _explanation(plan) -> dict:
    """What ``explain`` prints, as data: the layout, its predicted cost and why the others lost."""
    cost = plan.predicted
    return {
        "model": plan.provenance.model_name,
        "cluster": plan.provenance.cluster_name,
        "world_size": plan.world_size,
        "layout": describe_config(plan.config, plan.serving),
        "config": plan.config.model_dump(mode="json"),
        "predicted": None if cost is None else cost.model_dump(mode="json"),
        "bottleneck": None if cost is None else cost.bottleneck,
        "estimate_options": recipe_settings(plan) or None,
        "alternatives": [
            {"layout": describe_config(a.config, a.serving), "reason_lost": a.reason_lost}
            for a in plan.alternatives
        ],
        "deployment": deployment_line(plan).replace("[bold]", "").replace("[/]", "") or None,
        "pools": [
            {
                "role": pool.role,
                "units": pool.num_units,
                "devices_per_unit": pool.devices_per_unit,
                "layout": describe_layout(pool.config),
                "batch_size": pool.serving.batch_size,
                "predicted": None
                if pool.predicted is None
                else pool.predicted.model_dump(mode="json"),
            }
            for pool in plan.deployment.pools
        ],
    }


def _time_table(cost) -> Table:
    table = table_of(
        "time per step",
        {"part": "text", "exposed": "number", "hidden": "number", "share": "number"},
    )
    for part, seconds in sorted(cost.time_s.items(), key=lambda item: -item[1]):
        share = seconds / cost.step_time_s if cost.step_time_s else 0.0
        table.add_row(
            part,
            human_seconds(seconds),
            human_seconds(cost.hidden_time_s.get(part, 0.0)),
            f"{share:.1%}",
        )
    table.add_row("[bold]total", f"[bold]{human_seconds(cost.step_time_s)}", "", "")
    return fit_words(table)


def _memory_table(cost) -> Table:
    table = table_of("memory per device", {"part": "text", "bytes": "number"})
    for part, value in sorted(cost.memory_bytes.items(), key=lambda item: -item[1]):
        table.add_row(part, human_bytes(value))
    table.add_row(
        "[bold]total",
        f"[bold]{human_bytes(cost.memory_per_device_bytes)} of {human_bytes(cost.memory_capacity_bytes)}",
    )
    return fit_words(table)


def _export(args: argparse.Namespace) -> int:
    from autoparallel.cli._engines import export_command

    return export_command(args)
