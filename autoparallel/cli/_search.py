"""``autoparallel plan``, ``autoparallel explain`` and ``autoparallel export``.

``autoparallel plan`` with no arguments plans ``ref-3t-moe`` inference (4,096-token prompts,
1,024 output tokens, TTFT <= 5 s, TPOT <= 50 ms) on one GB200 NVL72 rack (preset
``gb200-nvl72``: 72 GPUs in one NVLink domain) and writes ``plan.json``.
A study kept in ``--storage sqlite:///study.db`` can be opened with Optuna Dashboard:
``optuna-dashboard sqlite:///study.db`` (``pip install 'moe-autoparallel[dashboard]'``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from autoparallel.cli._args import add_job_arguments
from autoparallel.cli._render import console
from autoparallel.cli._serving_args import add_load_arguments, load_fields
from cost_model._units import human_bytes, human_seconds

DEFAULT_CLUSTER = "gb200-nvl72"
DEFAULT_TRIALS = 250


def register(subparsers) -> None:  # noqa: ANN001 - argparse's private type
    plan = subparsers.add_parser("plan", help="search the best parallel layout and write plan.json")
    _plan_arguments(plan)
    plan.set_defaults(func=_plan)
    explain = subparsers.add_parser("explain", help="breakdown, bottleneck and runners-up of a plan")
    explain.add_argument("plan", nargs="?", default="plan.json")
    explain.set_defaults(func=_explain)
    export = subparsers.add_parser("export", help="launch arguments / config file of an engine")
    export.add_argument("plan", nargs="?", default="plan.json")
    export.add_argument("--format", required=True, choices=("vllm", "sglang", "trtllm", "megatron", "torchtitan", "deepspeed"))
    export.add_argument("--model-path", default=None, help="checkpoint path or hub id (default: the plan's model name)")
    export.add_argument("--output-dir", type=Path, default=None, help="write the files here instead of printing them")
    export.set_defaults(func=_export)


def _plan_arguments(parser: argparse.ArgumentParser) -> None:
    add_job_arguments(parser, cluster=DEFAULT_CLUSTER, nodes=None, training=False)
    parser.add_argument("--ttft-slo-s", type=float, default=5.0, help="p90 time to first token limit (0: none)")
    parser.add_argument("--ttft-slo-ms", dest="ttft_slo_s", type=lambda ms: float(ms) / 1e3, help="the same, in ms")
    parser.add_argument("--tpot-slo-ms", type=float, default=50.0, help="p90 time per output token limit (0: none)")
    add_load_arguments(parser, slo_ms=False)
    parser.add_argument("--no-disaggregation", action="store_true", help="do not price a prefill/decode split")
    parser.add_argument("--objective", default=None, help="step_time, throughput, tpot, ttft, memory, memory_headroom or pareto")
    parser.add_argument("--trials", type=int, default=DEFAULT_TRIALS)
    parser.add_argument("--sampler", default=None, choices=("tpe", "nsga2", "random"))
    parser.add_argument(
        "--storage", default=None,
        help="sqlite:///study.db, any RDB URL or journal:PATH (resumable; view with: optuna-dashboard sqlite:///study.db)",
    )
    parser.add_argument("--workers", type=int, default=1, help="worker processes searching one study")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=Path("plan.json"))


def _workload(args: argparse.Namespace):  # noqa: ANN202
    from cost_model import Inference, Training

    if args.training:
        return Training(sequence_length_tokens=args.sequence_length, global_batch_tokens=args.global_batch_tokens)
    return Inference(
        **load_fields(args),
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        prompt_tokens_cv=args.prompt_tokens_cv,
        output_tokens_cv=args.output_tokens_cv,
        prefix_cache_hit_rate=args.prefix_cache_hit_rate,
        ttft_slo_s=args.ttft_slo_s or None,
        tpot_slo_s=(args.tpot_slo_ms / 1e3) or None,
        disaggregation_allowed=not args.no_disaggregation,
    )


def _plan(args: argparse.Namespace) -> int:
    import optuna

    from autoparallel._planner import find_plan, resolve_cluster, resolve_model

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    model = resolve_model(args.model)
    cluster = resolve_cluster(args.cluster, num_nodes=args.nodes)
    workload = _workload(args)
    console.print(
        f"Planning [bold]{model.name}[/] {workload.kind} on [bold]{cluster.num_devices}[/] x {cluster.device.name} "
        f"({cluster.name}); budget {args.trials} trials (a small space is priced whole)"
    )
    with Progress(TextColumn("search"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("search", total=args.trials)
        plan = find_plan(
            model, cluster, workload, objective=args.objective, n_trials=args.trials, sampler=args.sampler,
            storage=args.storage, seed=args.seed, workers=args.workers,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    path = plan.save(args.output)
    console.print(plan_table(plan))
    search = plan.provenance.search
    console.print(
        f"space {search['space_size']:,} layouts ({search['num_meshes']:,} meshes); {search['method']} "
        f"{search['num_trials']} trials, {search['rows_evaluated']:,} layouts priced in {search['elapsed_s']:.1f} s; "
        f"infeasible layouts: {_counts(search['infeasible_layouts'])}"
    )
    if line := deployment_line(plan):
        console.print(line)
    if plan.serving is not None:
        from autoparallel.cli._serving_args import simulated_line

        console.print(simulated_line(plan, model=model, cluster=cluster, workload=workload))
    console.print(f"wrote [bold]{path}[/]")
    return 0


def deployment_line(plan) -> str:  # noqa: ANN001
    """Colocated vs disaggregated serving, when the plan priced both."""
    if not plan.disaggregation:
        return ""
    search = plan.provenance.search
    pools = " + ".join(
        f"{p.phase} {p.num_devices} devices (units tp{p.config.tp} pp{p.config.pp} dp{p.config.dp} ep{p.config.ep}"
        f"{' attn-dp' if p.config.attention_data_parallel else ''})"
        for p in plan.disaggregation
    )
    return (
        f"deployment: [bold]{search['deployment']}[/] — colocated {search['colocated_output_tokens_per_s_per_device']:,.1f} "
        f"vs disaggregated {search['disaggregated_output_tokens_per_s_per_device']:,.1f} output tokens/s per device "
        f"({pools}; the {search['disaggregated_bottleneck']} pool binds)"
    )


def _counts(counts: dict) -> str:
    parts = [f"{name} {count:,}" for name, count in sorted(counts.items()) if count]
    return ", ".join(parts) or "none"


def describe_config(config, serving=None) -> str:  # noqa: ANN001
    """Compact one-line layout: ``tp4 pp2 dp8 ep32 etp1 sp zero1 1f1b mb1``."""
    c = config
    words = [f"tp{c.tp}", f"pp{c.pp}", f"dp{c.dp}"]
    words += [f"cp{c.cp}"] if c.cp > 1 else []
    words += [f"ep{c.ep}", f"etp{c.etp}"]
    words += ["attn-dp"] if c.attention_data_parallel else []
    words += ["sp"] if c.sequence_parallel else []
    if serving is None:
        words += [f"zero{c.zero_stage}", c.pipeline_schedule + (f"x{c.virtual_stages}" if c.virtual_stages > 1 else ""), f"mb{c.micro_batch_size}"]
        words += [f"recompute={c.recompute}"] if c.recompute != "none" else []
    else:
        words += [f"batch{serving.batch_size}", f"kv-{serving.kv_dtype}"]
        words += [f"+{serving.num_redundant_experts}redundant"] if serving.num_redundant_experts else []
    return " ".join(words)


def _seconds(value) -> str:  # noqa: ANN001
    return "-" if value is None else human_seconds(value)


def plan_table(plan) -> Table:  # noqa: ANN001
    """The best layout and the runners-up: config, TTFT and TPOT (inference) or step time and MFU
    (training), tokens/s per device, memory per device, bottleneck."""
    inference = plan.serving is not None
    table = Table(title=f"{plan.provenance.model_name} on {plan.world_size} devices ({plan.provenance.cluster_name})")
    middle = ("TTFT", "TPOT") if inference else ("step", "MFU")
    for column in ("#", "config", *middle, "tokens/s/device", "memory/device", "bottleneck"):
        table.add_column(column, justify="left" if column in ("config", "bottleneck") else "right", overflow="fold")
    rows = [(plan.config, plan.predicted, plan.serving)] + [(a.config, a.predicted, a.serving) for a in plan.alternatives]
    for index, (config, cost, serving) in enumerate(rows):
        if inference:
            figures = (_seconds(cost.ttft_s), _seconds(cost.tpot_s))
        else:
            figures = (human_seconds(cost.step_time_s), "-" if cost.mfu is None else f"{cost.mfu:.1%}")
        table.add_row(
            str(index + 1), describe_config(config, serving), *figures,
            f"{cost.tokens_per_s_per_device:,.1f}" if cost.tokens_per_s_per_device is not None else "-",
            human_bytes(cost.memory_per_device_bytes), cost.bottleneck, style="bold green" if index == 0 else None,
        )
    return table


def _explain(args: argparse.Namespace) -> int:
    from autoparallel._plan import load_plan

    plan = load_plan(Path(args.plan))
    cost = plan.predicted
    console.print(f"[bold]{plan.provenance.model_name}[/] on {plan.world_size} devices of {plan.provenance.cluster_name}: {describe_config(plan.config, plan.serving)}")
    console.print(plan_table(plan))
    if cost is not None:
        console.print(_time_table(cost))
        console.print(_memory_table(cost))
        console.print(f"bottleneck: [bold]{cost.bottleneck}[/] ({human_seconds(cost.time_s.get(cost.bottleneck, 0.0))} of {human_seconds(cost.step_time_s)})")
    for index, alternative in enumerate(plan.alternatives, start=2):
        console.print(f"#{index} {describe_config(alternative.config, alternative.serving)} lost: {alternative.reason_lost}")
    if line := deployment_line(plan):
        console.print(line)
    return 0


def _time_table(cost) -> Table:  # noqa: ANN001
    table = Table(title="time per step")
    for column in ("part", "exposed", "hidden", "share"):
        table.add_column(column, justify="left" if column == "part" else "right")
    for part, seconds in sorted(cost.time_s.items(), key=lambda item: -item[1]):
        share = seconds / cost.step_time_s if cost.step_time_s else 0.0
        table.add_row(part, human_seconds(seconds), human_seconds(cost.hidden_time_s.get(part, 0.0)), f"{share:.1%}")
    table.add_row("[bold]total", f"[bold]{human_seconds(cost.step_time_s)}", "", "")
    return table


def _memory_table(cost) -> Table:  # noqa: ANN001
    table = Table(title="memory per device")
    table.add_column("part")
    table.add_column("bytes", justify="right")
    for part, value in sorted(cost.memory_bytes.items(), key=lambda item: -item[1]):
        table.add_row(part, human_bytes(value))
    table.add_row("[bold]total", f"[bold]{human_bytes(cost.memory_per_device_bytes)} of {human_bytes(cost.memory_capacity_bytes)}")
    return table


def _export(args: argparse.Namespace) -> int:
    from autoparallel._export import export_plan
    from autoparallel._plan import load_plan

    result = export_plan(load_plan(Path(args.plan)), format=args.format, model_path=args.model_path)
    if args.output_dir is None:
        console.print(result.render(), highlight=False, markup=False)
        return 0
    args.output_dir.mkdir(parents=True, exist_ok=True)
    for name, content in result.files.items():
        (args.output_dir / name).write_text(content)
        console.print(f"wrote {args.output_dir / name}")
    for item in result.dropped:
        console.print(f"dropped: {item}", highlight=False, markup=False)
    return 0
