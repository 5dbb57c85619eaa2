"""``autoparallel estimate`` (cost of one layout) and ``autoparallel validate`` (predicted vs published)."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict

from autoparallel.cli._args import (
    add_inter_node_argument,
    add_job_arguments,
    inter_node_bytes_per_s,
    non_negative_int,
    positive_int,
    serving_precision,
    training_options,
    with_network_override,
)
from autoparallel.cli._layout_defaults import DEFAULT_TP, DEFAULT_TRAINING_PP, estimate_config
from autoparallel.cli._recipe_args import add_recipe_arguments, recipe_options
from autoparallel.cli._render import console, fit_words, print_json
from autoparallel.cli._render import table as table_of
from autoparallel.cli._routing_args import add_routing_arguments, routing_options
from autoparallel.cli._serving_args import add_load_arguments, load_fields, print_simulation
from cost_model import (
    framework_names,
    human_bytes,
    human_seconds,
    memory_error_band,
    minimum_redundant_experts,
    training_error_band,
)

DEFAULT_CLUSTER = "dgx-h200"
DEFAULT_NODES = 128


def register(subparsers) -> None:
    estimate = subparsers.add_parser(
        "estimate", help="time, memory, MFU and tokens/s of one parallel layout"
    )
    _estimate_arguments(estimate)
    estimate.set_defaults(func=_estimate)
    validate = subparsers.add_parser(
        "validate", help="predicted vs published throughput and memory of known runs"
    )
    validate.add_argument(
        "--table", action="append", default=None, help="only this published table (repeatable)"
    )
    validate.add_argument(
        "--json", action="store_true", help="print the rows as JSON instead of tables"
    )
    validate.add_argument(
        "--strict", action="store_true", help="exit 1 when a table is outside its tolerance"
    )
    add_inter_node_argument(validate)
    validate.add_argument(
        "--loso",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="report the error over every published training run, all held out (the calibration is fitted on operator tables only)",
    )
    validate.add_argument(
        "--loso-evaluations",
        type=positive_int,
        default=80,
        help="loss evaluations per leave-one-out fit",
    )
    validate.add_argument(
        "--serving", action="store_true", help="end-to-end public serving measurements (TTFT, TPOT)"
    )
    validate.set_defaults(func=_validate)


def _estimate_arguments(parser: argparse.ArgumentParser) -> None:
    add_job_arguments(parser, cluster=DEFAULT_CLUSTER, nodes=DEFAULT_NODES, training=True)
    parser.add_argument(
        "--framework", default=None, choices=framework_names(), help="training software profile"
    )
    parser.add_argument(
        "--batch-size",
        type=non_negative_int,
        default=0,
        help="inference: sequences per replica (0: largest that fits)",
    )
    parser.add_argument(
        "--num-redundant-experts",
        type=non_negative_int,
        default=None,
        help="inference: extra expert slots over the ep ranks (default: the fewest that fill every rank, EPLB)",
    )
    parser.add_argument(
        "--tp",
        type=positive_int,
        default=None,
        help=f"default: {DEFAULT_TP}, at most the node's devices and those the given cp, dp and "
        "pp leave",
    )
    for axis in ("cp", "etp"):
        parser.add_argument(f"--{axis}", type=positive_int, default=1)
    parser.add_argument(
        "--pp",
        type=positive_int,
        default=None,
        help="default: 1 for serving; for training the largest divisor of the devices left "
        f"after tp*cp (and --dp, if given) up to {DEFAULT_TRAINING_PP}",
    )
    parser.add_argument(
        "--ep",
        type=positive_int,
        default=None,
        help="default: 1 for a dense model; for an MoE model the largest that divides both its "
        "routed experts and the devices of a pipeline stage (dp*cp*tp) over etp",
    )
    parser.add_argument(
        "--dp", type=positive_int, default=None, help="default: the devices left after tp*pp*cp"
    )
    parser.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--attention-data-parallel", action=argparse.BooleanOptionalAction, default=False
    )
    parser.add_argument("--zero-stage", type=int, default=1, choices=(0, 1, 2, 3))
    parser.add_argument(
        "--schedule", default="1f1b", choices=("gpipe", "1f1b", "interleaved_1f1b", "zero_bubble")
    )
    parser.add_argument("--virtual-stages", type=positive_int, default=1)
    parser.add_argument("--micro-batch-size", type=positive_int, default=1)
    parser.add_argument("--recompute", default="full", choices=("none", "selective", "full"))
    add_recipe_arguments(parser, searched_recompute=False)
    add_routing_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the CostBreakdown as JSON")
    add_load_arguments(parser, slo_ms=True)
    parser.add_argument(
        "--simulate",
        action="store_true",
        help="serving: also run the iteration-level serving simulator",
    )


def _estimate(args: argparse.Namespace) -> int:
    from autoparallel._planner import resolve_cluster, resolve_model

    model = resolve_model(args.model)
    cluster = with_network_override(resolve_cluster(args.cluster, num_nodes=args.nodes), args)
    config = estimate_config(args, cluster, model)
    options = recipe_options(args, model=model, config=config) | routing_options(args, model=model)
    if args.training:
        workload, breakdown = _estimate_training(args, model, cluster, config, options)
    else:
        workload, breakdown = _estimate_serving(args, model, cluster, config, options)
    band = training_error_band(model, cluster, config) if args.training else None
    memory_band = memory_error_band(config) if args.training else None
    if args.json:
        document = json.loads(breakdown.model_dump_json())
        document["config"] = config.model_dump(mode="json")  # the layout priced, defaults filled
        if band is not None:
            document["error_band"] = _band_document(band, breakdown.step_time_s)
        if memory_band is not None:
            low, high = memory_band.scaled_range(breakdown.memory_per_device_bytes)
            document["memory_error_band"] = {
                **asdict(memory_band),
                "memory_range_bytes": [low, high],
            }
        print_json(document)
        return 0
    _print_estimate_header(model, cluster, config, options)
    _print_breakdown(breakdown)
    if band is not None:
        print_error_band(band, breakdown.step_time_s)
    if memory_band is not None:
        print_memory_error_band(memory_band, breakdown.memory_per_device_bytes)
        print_memory_risk(memory_band, breakdown, memory_fraction=args.memory_fraction)
    if not args.training:
        _print_serving_extras(args, model, cluster, config, workload, options)
    return 0


def _estimate_training(args: argparse.Namespace, model, cluster, config, options: dict):
    from cost_model import Training, estimate

    workload = Training(
        sequence_length_tokens=args.sequence_length,
        global_batch_tokens=args.global_batch_tokens,
        **training_options(args),
        framework=args.framework,
    )
    return workload, estimate(model, cluster, workload, config, **options)


def _estimate_serving(args: argparse.Namespace, model, cluster, config, options: dict):
    """``options``: the ``EstimateOptions`` fields given (``routing_options``)."""
    from cost_model import Inference, estimate

    workload = Inference(
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        prompt_tokens_cv=args.prompt_tokens_cv,
        output_tokens_cv=args.output_tokens_cv,
        prefix_cache_hit_rate=args.prefix_cache_hit_rate,
        **serving_precision(args),
        ttft_slo_s=args.ttft_slo_s,
        tpot_slo_s=args.tpot_slo_s,
        **load_fields(args),
    )
    redundant = args.num_redundant_experts
    if redundant is None:
        redundant = (
            minimum_redundant_experts(num_experts=model.moe.num_routed_experts, ep=config.ep)
            if model.moe
            else 0
        )
    breakdown = estimate(
        model,
        cluster,
        workload,
        config,
        batch_size=args.batch_size,
        num_redundant_experts=redundant,
        **options,
    )
    return workload, breakdown


def _print_estimate_header(model, cluster, config, options: dict) -> None:
    """The model, cluster and layout priced, the calibration used and the recipe given."""
    from cost_model import calibration_for

    title = f"{model.name} on {cluster.num_devices} x {cluster.device.name} ({cluster.name})"
    calibration = calibration_for(cluster.device)
    fitted = (
        f"fitted for {calibration.device_pattern!r}"
        if calibration.fit
        else "none (preset efficiencies)"
    )
    if "transferred_from" in calibration.fit:
        fitted = f"carried over from {calibration.fit['transferred_from']!r} (relative to the matmul ceilings)"
    console.print(f"[bold]{title}[/]\n{config!r}\ncalibration: {fitted}")
    if options:
        words = ", ".join(f"{name}={value}" for name, value in options.items())
        console.print(f"recipe: {words}", highlight=False, markup=False)


def _print_serving_extras(
    args: argparse.Namespace, model, cluster, config, workload, options: dict
) -> None:
    """A serving estimate's error bar and, with ``--simulate``, the simulator's run under the
    estimate's ``options``."""
    from autoparallel.cli._serving_args import serving_error_bar_line

    if bar := serving_error_bar_line(
        model,
        cluster,
        engine=workload.serving_engine,
        deployment="colocated",
        version=workload.serving_engine_version,
    ):
        console.print(bar, highlight=False, markup=False)
    if args.simulate:
        from cost_model import EstimateOptions, ServingConfig, simulate_layout

        serving = ServingConfig(batch_size=args.batch_size)
        print_simulation(
            simulate_layout(
                model=model,
                cluster=cluster,
                workload=workload,
                config=config,
                serving=serving,
                options=EstimateOptions(**options),
            ),
            workload,
        )


def _band_document(band, step_time_s: float) -> dict:
    low, high = band.time_range_s(step_time_s)
    return {**asdict(band), "step_time_range_s": [low, high]}


def print_error_band(band, step_time_s: float) -> None:
    """The estimate's error bar: the held-out published runs of its regime."""
    _print_band(
        band,
        opening=f"Error bar: {band.count} published runs like this one",
        held_out=", all held out,",
        directions=("too fast", "too slow"),
        measured="their published step times",
        span=tuple(human_seconds(v) for v in band.time_range_s(step_time_s)),
    )


def print_memory_error_band(band, predicted_bytes: float) -> None:
    """The memory estimate's error bar: the published peak-memory runs of its regime."""
    _print_band(
        band,
        opening=f"Memory error bar: {band.count} published peaks like this one",
        held_out="",
        directions=("low", "high"),
        measured="the published peaks",
        span=tuple(human_bytes(v) for v in band.scaled_range(predicted_bytes)),
    )


def print_memory_risk(band, predicted, *, memory_fraction: float | None = None) -> None:
    """A warning where the memory error bar's upper end passes the device (its whole memory,
    not the ``--memory-fraction`` share the layout was priced against): the layout fits as
    priced, but runs like it peaked higher than their predictions by enough not to."""
    capacity = predicted.memory_capacity_bytes / (memory_fraction or 1.0)
    high = band.scaled_range(predicted.memory_per_device_bytes)[1]
    if high <= capacity:
        return
    console.print(
        f"[bold]Memory at risk:[/] {human_bytes(predicted.memory_per_device_bytes)} predicted of "
        f"{human_bytes(capacity)}, up to {human_bytes(high)} at the 90th percentile of the memory "
        f"error bar of {band.scope.split(';')[0]} ({human_bytes(high - capacity)} over); "
        f"`--memory-fraction {math.floor(100.0 / (1.0 + band.high)) / 100.0:.2f}` plans within "
        "that, `--objective "
        "memory_headroom` or `--objective pareto` finds layouts with more room",
        highlight=False,
    )


def _print_band(band, *, opening, held_out, directions, measured, span) -> None:
    """One error-bar sentence: the runs of the band's scope, their mean signed and absolute
    error (``directions``: the words for a positive and a negative bias), and the 10th-90th
    percentile range ``span`` scaled to this estimate."""
    plural = "s" if band.sources != 1 else ""
    direction = directions[0] if band.bias >= 0 else directions[1]
    console.print(
        f"{opening} ({band.scope}; {band.sources} source{plural}){held_out} were predicted "
        f"{100 * abs(band.bias):.0f}% {direction} on average (mean |error| "
        f"{100 * band.mean_abs_error:.0f}%); {measured} were {1 + band.low:.2f}-"
        f"{1 + band.high:.2f}x the predictions (10th-90th percentile): "
        f"[bold]{span[0]} to {span[1]}[/] for this one",
        highlight=False,
    )


def _print_breakdown(breakdown) -> None:
    times = table_of(
        f"Time per step: {human_seconds(breakdown.step_time_s)} (bottleneck: {breakdown.bottleneck})",
        {"part": "text", "exposed": "number", "hidden": "number", "share": "number"},
    )
    for part, seconds in breakdown.time_s.items():
        hidden = breakdown.hidden_time_s.get(part, 0.0)
        share = seconds / breakdown.step_time_s if breakdown.step_time_s else 0.0
        times.add_row(
            part,
            human_seconds(seconds),
            human_seconds(hidden) if hidden else "-",
            f"{100 * share:.1f}%",
        )
    console.print(fit_words(times))
    memory = table_of(
        f"Memory per device: {human_bytes(breakdown.memory_per_device_bytes)} of "
        f"{human_bytes(breakdown.memory_capacity_bytes)}",
        {"part": "text", "bytes": "number"},
    )
    for part, value in breakdown.memory_bytes.items():
        memory.add_row(part, human_bytes(value))
    console.print(fit_words(memory))
    figures = {
        "MFU": breakdown.mfu,
        "tokens/s/device": breakdown.tokens_per_s_per_device,
        "TTFT": breakdown.ttft_s,
        "TPOT": breakdown.tpot_s,
        "batch size": breakdown.batch_size,
    }
    for name, value in figures.items():
        if value is None:
            continue
        if name == "MFU":
            text = f"{100 * value:.1f}%"
        elif name in ("TTFT", "TPOT"):
            text = human_seconds(value)
        else:
            text = f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"
        console.print(f"{name}: [bold]{text}[/]")


def _validate(args: argparse.Namespace) -> int:
    from cost_model import TOLERANCES, summarize, validate_published
    from topology import network_override

    if args.serving:
        from autoparallel.cli._serving_validation import print_serving_validation

        return print_serving_validation(as_json=args.json, strict=args.strict)

    with network_override(inter_node_bytes_per_s=inter_node_bytes_per_s(args)):
        rows = validate_published()
    if args.table:
        unknown = set(args.table) - {row.table for row in rows}
        if unknown:
            raise ValueError(
                f"--table ({sorted(unknown)}) must name published tables: {sorted({r.table for r in rows})}"
            )
        rows = [row for row in rows if row.table in args.table]
    summary = summarize(rows)
    generalization = _generalization(args) if args.loso and not args.table else None
    if args.json:
        payload = [dict(row.model_dump(), error=row.error) for row in rows]
        print_json({"rows": payload, "summary": summary, "training_runs": generalization})
    else:
        _print_validation(rows, summary, TOLERANCES)
        if generalization is not None:
            _print_generalization(generalization)
    outside = [
        table for table, figures in summary.items() if not _within(figures, TOLERANCES.get(table))
    ]
    return 1 if args.strict and outside else 0


def _generalization(args: argparse.Namespace) -> dict:
    """Fit error and leave-one-source-out error over every published training throughput run."""
    from dataclasses import asdict

    from cost_model import (
        VALIDATION_GROUPINGS,
        error_summary,
        grouped_errors,
        leave_one_source_out,
        run_case,
        training_cases,
    )

    cases = training_cases()
    fitted = [row for case in cases for row in run_case(case)]
    held_out = leave_one_source_out(max_evaluations=args.loso_evaluations, cases=cases)
    fit_errors = {(row.table, row.run, row.metric): row.error for row in fitted}
    return {
        "fit": asdict(error_summary(fitted, cases)),
        "leave_one_source_out": asdict(error_summary(held_out, cases)),
        "leave_one_source_out_runs": [
            dict(
                row.model_dump(),
                error=row.error,
                fit_error=fit_errors[(row.table, row.run, row.metric)],
            )
            for row in held_out
        ],
        "leave_one_source_out_groups": {
            by: grouped_errors(held_out, cases, by=by) for by in VALIDATION_GROUPINGS
        },
    }


def _print_generalization(figures: dict) -> None:
    table = table_of(
        "Training runs: every run held out (calibration fitted on operator tables only)",
        {
            "calibration": "text",
            "runs": "number",
            "sources": "number",
            "mean |error|": "number",
            "max |error|": "number",
        },
    )
    labels = {
        "fit": "operator-fitted calibration, no run a fit input",
        "leave_one_source_out": "each source predicted without being fitted on",
    }
    for key, label in labels.items():
        f = figures[key]
        table.add_row(
            label,
            str(f["count"]),
            str(f["sources"]),
            f"{100 * f['mean_abs_error']:.1f}%",
            f"{100 * f['max_abs_error']:.1f}%",
        )
    runs = table_of(
        "Leave-one-source-out error per training run",
        {"table": "text", "run": "text", "fit error": "number", "held-out error": "number"},
    )
    for row in figures["leave_one_source_out_runs"]:
        runs.add_row(
            row["table"],
            row["run"],
            f"{100 * row['fit_error']:+.1f}%",
            f"{100 * row['error']:+.1f}%",
        )
    console.print(fit_words(runs))
    for by, groups in figures["leave_one_source_out_groups"].items():
        grouped = table_of(
            f"Held-out error by {by}, every run held out (bias > 0: predicted too fast)",
            {
                by: "text",
                "runs": "number",
                "bias": "number",
                "mean |error|": "number",
                "max |error|": "number",
            },
        )
        for name, g in sorted(groups.items(), key=lambda item: -item[1]["mean_abs_error"]):
            grouped.add_row(
                name,
                str(g["count"]),
                f"{100 * g['mean_error']:+.1f}%",
                f"{100 * g['mean_abs_error']:.1f}%",
                f"{100 * g['max_abs_error']:.1f}%",
            )
        console.print(fit_words(grouped))
    console.print(fit_words(table))


def _within(figures: dict, tolerance) -> bool:
    if tolerance is None:
        return True
    mean, largest = tolerance
    return (mean is None or figures["mean_abs_error"] <= mean) and (
        largest is None or figures["max_abs_error"] <= largest
    )


def _print_validation(rows, summary, tolerances) -> None:
    for table_name in summary:
        table = table_of(
            table_name,
            {
                "run": "text",
                "metric": "text",
                "predicted": "number",
                "published": "number",
                "error": "number",
            },
        )
        for row in (r for r in rows if r.table == table_name):
            color = (
                "green" if abs(row.error) <= 0.05 else "yellow" if abs(row.error) <= 0.12 else "red"
            )
            table.add_row(
                row.run,
                f"{row.metric} [{row.unit}]",
                f"{row.predicted:,.3f}",
                f"{row.published:,.3f}",
                f"[{color}]{100 * row.error:+.1f}%[/]",
            )
        console.print(fit_words(table))
    overview = table_of(
        "Mean and max absolute error per table",
        {
            "table": "text",
            "rows": "number",
            "mean |err|": "number",
            "max |err|": "number",
            "bound mean/max": "number",
            "within": "text",
        },
    )
    for table_name, figures in summary.items():
        tolerance = tolerances.get(table_name)
        label = (
            "-"
            if tolerance is None
            else " / ".join("-" if t is None else f"{100 * t:.0f}%" for t in tolerance)
        )
        if tolerance is None:  # a sensitivity or context table: no bound, so no verdict
            verdict = "- (no bound)"
        else:
            verdict = "[green]yes[/]" if _within(figures, tolerance) else "[red]no[/]"
        overview.add_row(
            table_name,
            str(figures["count"]),
            f"{100 * figures['mean_abs_error']:.1f}%",
            f"{100 * figures['max_abs_error']:.1f}%",
            label,
            verdict,
        )
    console.print(fit_words(overview))
