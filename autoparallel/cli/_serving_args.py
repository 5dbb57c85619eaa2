"""Serving-load options shared by ``plan`` and ``estimate``: how requests arrive, the SLOs in
milliseconds, the engine whose floors apply; and the rendering of a simulated layout."""

from __future__ import annotations

import argparse

from rich.table import Table

from autoparallel.cli._args import non_negative_float
from autoparallel.cli._render import console
from cost_model import human_seconds


def _positive(kind):
    """An argparse type: ``kind(text)``, which must be > 0 (argparse exits 2 naming the option)."""

    def parse(text: str):
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"({text}) must be > 0")
        return value

    parse.__name__ = kind.__name__
    return parse


def _milliseconds(text: str) -> float:
    return _positive(float)(text) / 1e3


def add_load_arguments(parser: argparse.ArgumentParser, *, slo_ms: bool) -> None:
    """``--concurrency`` / ``--request-rate`` (one of them), ``--serving-engine`` (and its
    ``--serving-engine-version``), and with
    ``slo_ms`` the SLOs in milliseconds (``--ttft-slo-ms``, ``--tpot-slo-ms``)."""
    load = parser.add_mutually_exclusive_group()
    load.add_argument(
        "--concurrency",
        type=_positive(int),
        default=None,
        help="serving: requests in flight (closed loop, as benchmarks drive it)",
    )
    load.add_argument(
        "--request-rate",
        type=_positive(float),
        default=None,
        help="serving: requests per second (open loop, Poisson)",
    )
    parser.add_argument(
        "--serving-engine",
        default="sglang",
        choices=("vllm", "sglang", "trtllm"),
        help="whose per-step floors apply",
    )
    parser.add_argument(
        "--serving-engine-version",
        default=None,
        help="the engine release that runs (e.g. 0.7.4): its defaults and floors instead of "
        "the current releases' (an unknown release is an error listing those with a profile)",
    )
    if slo_ms:
        parser.add_argument(
            "--ttft-slo-ms",
            dest="ttft_slo_s",
            type=_milliseconds,
            default=None,
            help="p90 TTFT limit in ms",
        )
        parser.add_argument(
            "--tpot-slo-ms",
            dest="tpot_slo_s",
            type=_milliseconds,
            default=None,
            help="p90 TPOT limit in ms",
        )


def load_fields(args: argparse.Namespace) -> dict:
    """``Inference`` fields of the load options (validated there: <= 0 is an error naming the field)."""
    fields = {"serving_engine": args.serving_engine}
    if args.serving_engine_version is not None:
        fields["serving_engine_version"] = args.serving_engine_version
    if args.concurrency is not None:
        fields["concurrency"] = args.concurrency
    if args.request_rate is not None:
        fields["request_rate_per_s"] = args.request_rate
    return fields


def print_simulation(run, workload) -> None:
    """The simulator's TTFT / TPOT / end-to-end latency next to the closed form's."""
    figures = run.result.summary()
    load = (
        f"{run.concurrency_per_replica} requests in flight per replica"
        if run.concurrency_per_replica is not None
        else f"{run.request_rate_per_s_per_replica:.3g} requests/s per replica (Poisson)"
    )
    table = Table(
        title=f"Serving simulator: {load} x {run.replicas:g} replicas, {run.result.simulated_s:,.0f} s simulated"
    )
    for column in ("metric", "mean", "p50", "p90", "p99", "closed form (mean / p90)"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    closed = run.closed_form
    for name, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "end-to-end")):
        reference = closed.get(f"{name}_s")
        p90 = closed.get(f"{name}_p90_s")
        shown = (
            "-"
            if reference is None
            else human_seconds(reference) + ("" if p90 is None else f" / {human_seconds(p90)}")
        )
        table.add_row(
            label,
            *(human_seconds(figures[f"{name}_{q}_s"]) for q in ("mean", "p50", "p90", "p99")),
            shown,
        )
    console.print(table)
    console.print(
        f"throughput: {figures['requests_per_s'] * run.replicas:,.2f} requests/s, "
        f"{figures['output_tokens_per_s'] * run.replicas:,.0f} output tokens/s; "
        f"SLOs (p90) {'met' if run.meets(workload) else '[red]missed[/]'}"
    )


def simulated_line(plan, *, model, cluster, workload) -> str:
    """The chosen layout run in the serving simulator at its chosen load: p90 TTFT and TPOT."""
    from cost_model import simulate_layout

    serving = plan.serving.serving_config()
    run = simulate_layout(
        model=model, cluster=cluster, workload=workload, config=plan.config, serving=serving
    )
    figures = run.result.summary()
    load = (
        f"{run.concurrency_per_replica * run.replicas:g} requests in flight"
        if run.concurrency_per_replica is not None
        else f"{workload.request_rate_per_s:g} requests/s"
    )
    verdict = "meets" if run.meets(workload) else "[red]misses[/]"
    # the simulator serves one colocated replica: say so where the plan deploys pools instead
    which = " (the colocated layout)" if plan.deployment.kind == "disaggregated" else ""
    return (
        f"serving simulator{which} at {load}: p90 TTFT {human_seconds(figures['ttft_p90_s'])}, "
        f"p90 TPOT {human_seconds(figures['tpot_p90_s'])} ({verdict} the SLOs), "
        f"{figures['output_tokens_per_s'] * run.replicas:,.0f} output tokens/s"
    )


def pools_simulated_line(plan) -> str | None:
    """The disaggregated pools in the serving simulator (``Deployment.simulated_*``): the rate
    they ran at against the split's own, their p90 TTFT and TPOT; None without them."""
    d, job = plan.deployment, plan.job
    if d.simulated_requests_per_s is None or not d.pools:
        return None
    devices = sum(pool.num_devices for pool in d.pools)
    designed = (d.disaggregated_output_tokens_per_s_per_device or 0.0) * devices
    ran = d.simulated_requests_per_s * job.output_tokens
    meets = (job.ttft_slo_s is None or (d.simulated_ttft_p90_s or 0.0) <= job.ttft_slo_s) and (
        job.tpot_slo_s is None or (d.simulated_tpot_p90_s or 0.0) <= job.tpot_slo_s
    )
    verdict = "meets" if meets else "[red]misses[/]"
    share = f", {ran / designed:.0%} of the split's closed-form rate" if designed > 0 else ""
    which = (
        "the disaggregated pools" if plan.disaggregated else "the disaggregated pools, not deployed"
    )
    return (
        f"serving simulator ({which}, Poisson arrivals) at "
        f"{d.simulated_requests_per_s:.3g} requests/s{share}: p90 TTFT "
        f"{human_seconds(d.simulated_ttft_p90_s or 0.0)}, p90 TPOT "
        f"{human_seconds(d.simulated_tpot_p90_s or 0.0)} ({verdict} the SLOs), "
        f"{d.simulated_output_tokens_per_s_per_device or 0.0:,.1f} output tokens/s per device"
    )


def serving_error_bar_line(
    model, cluster, *, engine: str, deployment: str, version: str | None = None
) -> str | None:
    """The error bar of a serving estimate: how the public measurements of its regime
    (``cost_model.serving_error_bands``: ``engine`` at release ``version``) compared with the
    model's TTFT and TPOT; None where no row covers it."""
    from cost_model import serving_error_bands

    bands = serving_error_bands(
        model, cluster, engine=engine, deployment=deployment, version=version
    )
    if not bands:
        return None
    parts = [
        f"{metric} {1 + band.low:.2f}-{1 + band.high:.2f}x (mean {100 * band.bias:+.0f}%)"
        for metric, band in bands.items()
    ]
    first = next(iter(bands.values()))
    plural = "s" if first.sources != 1 else ""
    return (
        f"Error bar: public runs like this one ({first.scope}; {first.count} measurements, "
        f"{first.sources} source{plural}, none fitted) measured "
        + " and ".join(parts)
        + " the model's figure (10th-90th percentile of measured / predicted)"
    )


#: The serving SLOs ``plan`` holds a layout to where the command line sets none (p90).
DEFAULT_TTFT_SLO_S = 5.0
DEFAULT_TPOT_SLO_MS = 50.0


def add_plan_slo_arguments(parser: argparse.ArgumentParser) -> None:
    """``plan``'s p90 TTFT and TPOT limits: None where not given (``plan_slos`` then takes the
    defaults, which ``default_slo_named`` names in an error)."""
    parser.add_argument(
        "--ttft-slo-s",
        type=non_negative_float,
        default=None,
        help=f"p90 time to first token limit (default {DEFAULT_TTFT_SLO_S:g} s; 0: none)",
    )
    parser.add_argument(
        "--ttft-slo-ms",
        dest="ttft_slo_s",
        type=_seconds_from_ms,
        help="the same, in ms",
    )
    parser.add_argument(
        "--tpot-slo-ms",
        type=non_negative_float,
        default=None,
        help=f"p90 time per output token limit (default {DEFAULT_TPOT_SLO_MS:g} ms; 0: none)",
    )


def _seconds_from_ms(text: str) -> float:
    return non_negative_float(text) / 1e3


def plan_slos(args: argparse.Namespace) -> dict:
    """``Inference`` SLO fields of ``plan``: the command line's, else the defaults; 0 is none."""
    ttft = DEFAULT_TTFT_SLO_S if args.ttft_slo_s is None else args.ttft_slo_s
    tpot_ms = DEFAULT_TPOT_SLO_MS if args.tpot_slo_ms is None else args.tpot_slo_ms
    return {"ttft_slo_s": ttft or None, "tpot_slo_s": tpot_ms / 1e3 or None}


def default_slo_named(error, args: argparse.Namespace):
    """``error`` of ``find_plan``, saying so where the SLO no layout meets is one the command
    line left at ``plan``'s default, and how to set or drop it."""
    from cost_model import InfeasiblePlanError

    defaulted = {
        "ttft_slo": (args.ttft_slo_s, f"{DEFAULT_TTFT_SLO_S:g} s p90 TTFT", "--ttft-slo-ms"),
        "tpot_slo": (args.tpot_slo_ms, f"{DEFAULT_TPOT_SLO_MS:g} ms p90 TPOT", "--tpot-slo-ms"),
    }
    if error.part not in defaulted or defaulted[error.part][0] is not None:
        return error
    _, slo, flag = defaulted[error.part]
    return InfeasiblePlanError(
        f"{error}; the {slo} SLO is plan's default: set {flag} to the one you need "
        f"({flag} 0: none)",
        part=error.part,
        smallest_devices=error.smallest_devices,
    )
