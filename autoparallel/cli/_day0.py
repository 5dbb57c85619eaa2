"""``autoparallel coverage`` (which operators a device backend runs natively) and
``autoparallel day0`` (from a config.json and a cluster to one report folder)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table

from autoparallel.cli._render import console, console_error

DEVICES = ("cuda", "musa", "npu", "xpu", "cpu", "privateuseone")
_STATUS_STYLE = {"done": "green", "skipped": "yellow", "failed": "bold red", "resumed": "dim"}


def register(subparsers) -> None:
    coverage = subparsers.add_parser(
        "coverage",
        help="ATen operators of a model: native, composite, fallback or missing on a device",
    )
    coverage.add_argument("model", help="catalog name or path to a HuggingFace config.json")
    coverage.add_argument(
        "--device",
        default=None,
        help=f"device type ({', '.join(DEVICES)}, or the PrivateUse1 backend's name; "
        "default: this machine's)",
    )
    coverage.add_argument(
        "--output", "-o", type=Path, default=None, help="write the full report as JSON"
    )
    coverage.add_argument("--all", action="store_true", help="list native operators too")
    coverage.set_defaults(func=_coverage)

    day0 = subparsers.add_parser(
        "day0", help="describe, coverage, cluster, plans, exports, staged checks, sweep: one report"
    )
    day0.add_argument("config", type=Path, help="the model's HuggingFace config.json")
    day0.add_argument(
        "--cluster", required=True, help="preset name or a probe result (cluster .json)"
    )
    day0.add_argument(
        "--engine",
        default=None,
        help="vllm, sglang, trtllm (serving) or megatron, torchtitan, deepspeed (training)",
    )
    day0.add_argument(
        "--training", action="store_true", help="plan training (default: training and serving)"
    )
    day0.add_argument(
        "--serving", action="store_true", help="plan serving (default: training and serving)"
    )
    day0.add_argument("--output-dir", type=Path, default=Path("day0-report"))
    day0.add_argument(
        "--resume",
        action="store_true",
        help="skip the steps an earlier run in --output-dir finished",
    )
    day0.add_argument(
        "--device", default=None, help="device type for the coverage step (default: this machine's)"
    )
    day0.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="plan on this many nodes (default: the smallest that fits)",
    )
    day0.add_argument(
        "--probe-ranks",
        type=int,
        default=0,
        help="measure this machine: `autoparallel probe` on N ranks under torchrun "
        "(the preset gives the peaks)",
    )
    day0.add_argument("--trials", type=int, default=60, help="search budget per plan")
    day0.add_argument("--no-coverage", action="store_true", help="skip the operator coverage step")
    day0.add_argument(
        "--no-stages", action="store_true", help="skip the staged checks on this machine"
    )
    day0.add_argument(
        "--ttft-slo-s", type=float, default=5.0, help="time to first token limit (0: none)"
    )
    day0.add_argument(
        "--tpot-slo-ms", type=float, default=50.0, help="time per output token limit (0: none)"
    )
    day0.set_defaults(func=_day0)


def _coverage(args: argparse.Namespace) -> int:
    from autoparallel.day0 import operator_coverage
    from autoparallel.day0._coverage import local_device

    with console.status("recording operators (training, prefill, decode)"):
        report = operator_coverage(args.model, device=args.device or local_device())
    table = Table(
        title=f"{report.model_name}: operators on {report.device} ({report.dispatch_key})"
    )
    for column in ("operator", "status", "FLOPs", "bytes", "calls", "paths", "why"):
        table.add_column(
            column,
            justify="right" if column in ("FLOPs", "bytes", "calls") else "left",
            overflow="fold",
        )
    for operator in report.operators:
        if operator.status != "native" or args.all:
            table.add_row(
                operator.name,
                operator.status,
                f"{operator.flop_share:.2%}",
                f"{operator.byte_share:.2%}",
                str(operator.calls),
                ",".join(operator.phases),
                operator.reason,
            )
    console.print(table)
    shares = report.share_by_status()
    console.print(
        "FLOP share: " + ", ".join(f"{status} {share:.1%}" for status, share in shares.items())
    )
    if args.output is not None:
        console.print(f"wrote {report.save(args.output)}")
    return 0


def _day0(args: argparse.Namespace) -> int:
    import optuna

    from autoparallel.day0._run import Day0Options, Day0StepError, run_day0

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    options = Day0Options(
        config_path=args.config,
        cluster=args.cluster,
        output_dir=args.output_dir,
        engine=args.engine,
        training=args.training,
        serving=args.serving,
        device=args.device,
        nodes=args.nodes,
        probe_ranks=args.probe_ranks,
        trials=args.trials,
        coverage=not args.no_coverage,
        stages=not args.no_stages,
        ttft_slo_s=args.ttft_slo_s or None,
        tpot_slo_s=(args.tpot_slo_ms / 1e3) or None,
    )
    status = console.status("day0")
    status.start()

    def progress(step: str, record) -> None:
        if record.status == "running":
            status.update(f"day0: {step}")
            return
        style = _STATUS_STYLE.get(record.status, "")
        note = f" — {record.reason}" if record.reason else ""
        console.print(
            f"[{style}]{record.status:>8}[/] {step} ({record.elapsed_s:.1f} s){note}",
            highlight=False,
        )

    try:
        run_day0(options, resume=args.resume, progress=progress)
    except Day0StepError as error:
        status.stop()
        console_error(str(error))
        return 1
    finally:
        status.stop()
    console.print(f"wrote [bold]{options.output_dir / 'report.md'}[/] and report.json")
    return 0
