"""``autoparallel profile`` (measure this machine) and ``autoparallel stage-check`` (staged
validation of the cost model against measurements: op, layer, one device, the multi-device plans).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rich.table import Table

from autoparallel.cli._args import input_file, output_file, positive_float, positive_int
from autoparallel.cli._render import add_json_flag, console, print_json
from cost_model import human_seconds


def register(subparsers) -> None:  # argparse's private type
    """Add this group's subcommands."""
    _add_profile(subparsers=subparsers)
    _add_stage_check(subparsers=subparsers)


def _add_profile(*, subparsers) -> None:
    """Add ``profile``: measure efficiency curves, or import aiconfigurator's operator tables."""
    profile = subparsers.add_parser(
        "profile",
        help="measure GEMM/attention/expert/memory/collective efficiency curves; write a hardware profile JSON",
        description="Run under torchrun (one process per device), or launch --nproc ranks on this host.",
    )
    profile.add_argument(
        "--nproc",
        type=positive_int,
        default=1,
        help="ranks to launch on this host (ignored under torchrun)",
    )
    profile.add_argument(
        "--grid",
        choices=("tiny", "cpu", "gpu"),
        default=None,
        help="measurement grid (default: by device)",
    )
    profile.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="intra-op threads per rank (default: cores / nproc)",
    )
    profile.add_argument("--output", "-o", type=output_file, default="hardware-profile.json")
    profile.add_argument("--timeout-s", type=positive_float, default=1800.0)
    profile.add_argument(
        "--compare-preset",
        default=None,
        metavar="PRESET",
        help="also print measured GEMM efficiency against this cluster preset's device",
    )
    profile.add_argument(
        "--clock",
        choices=("auto", "wall", "thread"),
        default="auto",
        help="operator timing: auto = thread CPU time for 1-thread CPU ranks, else wall",
    )
    profile.add_argument(
        "--import-aiconfigurator",
        type=Path,
        default=None,
        metavar="PATH",
        help="instead of measuring: reduce an unpacked aiconfigurator-core wheel's operator tables "
        "into kernel curves (written to --output)",
    )
    profile.add_argument(
        "--aiconfigurator-version", default="0.12.0", help="version of the imported package"
    )
    add_json_flag(profile)
    profile.set_defaults(func=_profile)


def _add_stage_check(*, subparsers) -> None:
    """Add ``stage-check``: staged validation of the cost model against this host."""
    stage = subparsers.add_parser(
        "stage-check",
        help="staged validation: an op, a layer, one device, then tp2 and pp2 plans, predicted vs measured",
        description="Measures the small reference MoE model on this host (gloo ranks) and compares each stage "
        "with the cost model loaded with a hardware profile (time within 25%, memory within 15%).",
    )
    stage.add_argument(
        "--profile",
        type=input_file,
        required=True,
        help="hardware profile JSON (autoparallel profile)",
    )
    stage.add_argument(
        "--force", action="store_true", help="accept a profile measured on another device type"
    )
    stage.add_argument(
        "--plans",
        default="tp2,pp2",
        help="comma-separated plans: tpN, tpN+sp, ppN (default tp2,pp2)",
    )
    stage.add_argument("--hidden-size", type=positive_int, default=512)
    stage.add_argument("--num-layers", type=positive_int, default=4)
    stage.add_argument("--sequence-tokens", type=positive_int, default=64)
    stage.add_argument("--batch-sequences", type=positive_int, default=2)
    stage.add_argument(
        "--steps", type=positive_int, default=4, help="timed steps per run (medians)"
    )
    stage.add_argument(
        "--rounds",
        type=positive_int,
        default=1,
        help="repeat the device and plan runs in turn and pool their steps (shared machines)",
    )
    stage.add_argument(
        "--no-calibration", action="store_true", help="compare raw profile predictions only"
    )
    stage.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall seconds, or CPU seconds of the ranks against the prediction less the bubble "
        "(for a CPU shared with other jobs)",
    )
    stage.add_argument(
        "--output", "-o", type=output_file, default=None, help="write the report as JSON"
    )
    add_json_flag(stage)
    stage.set_defaults(func=_stage_check)


class _Bar:
    """A rich progress bar started lazily in the rank that reports progress."""

    def __init__(self) -> None:
        self._progress = self._task = None

    def __call__(self, done: int, total: int, label: str) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        if self._progress is None:
            self._progress = Progress(
                TextColumn("[bold]profile"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.description}"),
                console=console,
                transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task("", total=total)
        self._progress.update(self._task, completed=done, description=label)
        if done >= total:
            self._progress.stop()


def _profile(args: argparse.Namespace) -> int:
    if args.import_aiconfigurator is not None:
        from autoparallel._kernel_import import write_kernel_curves

        curves = write_kernel_curves(
            args.import_aiconfigurator, output=args.output, version=args.aiconfigurator_version
        )
        console.print(
            f"wrote {args.output}: {len(curves['grouped_gemm'])} grouped-GEMM, {len(curves['mla_decode'])} MLA decode, "
            f"{len(curves['mla_prefill'])} MLA prefill, {len(curves['linear_attention'])} Gated DeltaNet, "
            f"{len(curves['dsa_indexer_decode'])} DSA indexer and "
            f"{len(curves['dsa_prefill_module']) + len(curves['mla_prefill_module'])} prefill "
            "attention-module curves"
        )
        return 0
    from profilers import ProfileGrid, current_device, launch_profile

    grid_name = args.grid or ("cpu" if current_device().type == "cpu" else "gpu")
    world = int(os.environ.get("WORLD_SIZE", args.nproc))
    threads = args.threads or max(1, (os.cpu_count() or 1) // max(world, 1))
    profile = launch_profile(
        grid=ProfileGrid.preset(grid_name),
        num_processes=args.nproc,
        threads_per_rank=threads,
        timeout_s=args.timeout_s,
        on_progress=None if args.json else _Bar(),
        clock=args.clock,
    )
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    path = profile.save(args.output)
    if args.json:
        print_json(profile.model_dump_json())
        return 0
    console.print(_summary(profile))
    if args.compare_preset:
        console.print(_preset_comparison(profile, args.compare_preset))
    console.print(f"wrote {path} ({profile.device_type}: {profile.device_name})")
    return 0


def _preset_comparison(profile, preset_name: str) -> Table:  # topology.HardwareProfile
    """Best measured GEMM rate per dtype over the preset's peak, beside the preset's efficiency,
    and the constant efficiencies ``cost_model.calibrate`` fits to the curves."""
    from cost_model import calibrate
    from topology import get_preset

    cluster = get_preset(preset_name)
    device = cluster.device
    fit = calibrate(cluster=cluster, profile=profile).calibration
    table = Table(title=f"Measured vs preset {preset_name} ({device.name})")
    for column in (
        "dtype",
        "best measured",
        "preset peak",
        "measured / peak",
        "preset matmul_efficiency",
    ):
        table.add_column(column, justify="left" if column == "dtype" else "right")
    for dtype, curve in profile.gemm.items():
        peak = device.peak_flops.get(dtype)
        ratio = "-" if peak is None else f"{curve.best_rate_per_s / peak:.1%}"
        table.add_row(
            dtype,
            _rate(curve.best_rate_per_s, "FLOP"),
            "-" if peak is None else _rate(peak, "FLOP"),
            ratio,
            f"{device.matmul_efficiency:.1%}",
        )
    table.caption = (
        f"fitted plateau efficiencies: matmul {fit.matmul_efficiency:.1%}, memory "
        f"{fit.memory_bandwidth_efficiency:.1%}, collectives x{fit.collective_efficiency:.2f}"
    )
    return table


def _rate(value: float, unit: str) -> str:
    return f"{value / 1e12:.1f} T{unit}/s" if value >= 1e12 else f"{value / 1e9:.1f} G{unit}/s"


def _summary(profile) -> Table:  # topology.HardwareProfile
    table = Table(title=f"Hardware profile: {profile.device_name} ({profile.device_type})")
    for column in ("curve", "points", "smallest call", "best", "spread (median)"):
        table.add_column(column, justify="left" if column == "curve" else "right")
    families = [
        ("gemm", profile.gemm, "FLOP"),
        ("attention", profile.attention, "FLOP"),
        ("grouped_gemm", profile.grouped_gemm, "FLOP"),
    ]
    for family, curves, unit in families:
        for dtype, curve in curves.items():
            table.add_row(
                f"{family} {dtype}",
                str(len(curve.work)),
                _rate(curve.rates_per_s[0], unit),
                _rate(curve.best_rate_per_s, unit),
                f"{sorted(curve.spread)[len(curve.spread) // 2]:.0%}",
            )
    optional = (
        ("optimizer (AdamW)", profile.optimizer),
        ("gradient accumulation", profile.gradient_accumulation),
    )
    for family, curve in (("memory (add)", profile.memory), ("norm", profile.norm)) + optional:
        if curve is not None:
            table.add_row(
                family,
                str(len(curve.work)),
                _rate(curve.rates_per_s[0], "B"),
                _rate(curve.best_rate_per_s, "B"),
                f"{sorted(curve.spread)[len(curve.spread) // 2]:.0%}",
            )
    for op, by_size in profile.collectives.items():
        for size, curve in by_size.items():
            table.add_row(
                f"{op} n={size}",
                str(len(curve.work)),
                human_seconds(curve.seconds[0]),
                _rate(curve.best_rate_per_s, "B"),
                f"{sorted(curve.spread)[len(curve.spread) // 2]:.0%}",
            )
    eager = (
        ""
        if profile.eager_op_host_s is None
        else f", eager inference op {human_seconds(profile.eager_op_host_s)} on the host"
    )
    floor = (
        ""
        if profile.graph_kernel_floor_s is None
        else f", graph-replayed kernel {human_seconds(profile.graph_kernel_floor_s)} on the device"
    )
    table.caption = f"kernel overhead {human_seconds(profile.kernel_overhead_s)}{eager}{floor}{_host_caption(profile.host)}; {profile.provenance}"
    return table


def _host_caption(host) -> str:  # topology HostOverhead or None
    if host is None:
        return ""
    return (
        f"; host per layer (fwd+bwd) dense {human_seconds(host.dense_layer_s)}, MoE {human_seconds(host.moe_layer_s)} "
        f"+ {human_seconds(host.routed_expert_s)} per routed expert; per tensor-parallel weight update "
        f"{human_seconds(host.sharded_parameter_update_s)}; per pipeline micro-batch {human_seconds(host.pipeline_micro_batch_s)}; "
        f"per collective after compute {human_seconds(host.collective_sync_s)}"
    )


def _parse_plans(text: str, *, batch_sequences: int):  # tuple[ParallelConfig, ...]
    from cost_model import ParallelConfig

    configs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        base, plus, switch = item.partition("+")
        axis = base.rstrip("0123456789")
        degree = base[len(axis) :]
        if (
            axis not in ("tp", "pp")
            or not degree.isdigit()
            or int(degree) < 2
            or (plus and (switch, axis) != ("sp", "tp"))
        ):
            raise ValueError(f"--plans entry ({item!r}) must be tpN, tpN+sp or ppN with N >= 2")
        micro = 1 if axis == "pp" else batch_sequences
        configs.append(
            ParallelConfig(
                **{axis: int(degree)}, micro_batch_size=micro, sequence_parallel=bool(plus)
            )
        )
    if not configs:
        raise ValueError(f"--plans ({text!r}) must name at least one plan")
    return tuple(configs)


def _stage_check(args: argparse.Namespace) -> int:
    from profilers import TrainingSetup, cluster_from_profile, run_stages
    from topology import load_hardware_profile

    profile = load_hardware_profile(args.profile, expected_device_type="cpu", force=args.force)
    setup = TrainingSetup(
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        sequence_tokens=args.sequence_tokens,
        batch_sequences=args.batch_sequences,
        steps=args.steps,
    )
    configs = _parse_plans(args.plans, batch_sequences=args.batch_sequences)
    cluster = cluster_from_profile(profile, num_devices=max(2, max(c.world_size for c in configs)))
    with console.status("stage-check") as status:
        report = run_stages(
            setup=setup,
            cluster=cluster,
            configs=configs,
            calibrate_on_device=not args.no_calibration,
            progress=lambda stage: status.update(f"stage-check: {stage}"),
            clock=args.clock,
            rounds=args.rounds,
        )
    if args.output is not None:
        args.output.write_text(report.model_dump_json(indent=1) + "\n")
    if args.json:
        print_json(report.model_dump_json())
        return 0 if report.passed else 1
    console.print(_stage_table(report), width=max(console.width, 132))
    if report.calibration is not None:
        fit = report.calibration
        console.print(
            f"calibration (fitted on the one-device stage): matmul_efficiency {fit.matmul_efficiency:.3g}, "
            f"memory_bandwidth_efficiency {fit.memory_bandwidth_efficiency:.3g}, "
            f"kernel_overhead_s {fit.kernel_overhead_s:.3g}"
        )
    return 0 if report.passed else 1


def _percent(value) -> str:
    return "-" if value is None else f"{value:+.0%}"


def _stage_table(report) -> Table:  # profilers._stages.StagedReport
    from cost_model import human_bytes

    title = f"Staged validation on {report.cluster_name}, {report.clock} clock, {report.rounds} round(s)"
    table = Table(title=f"{title} (time tolerance 25%, memory 15%)")
    for column in (
        "stage",
        "what",
        "predicted",
        "calibrated",
        "measured",
        "error",
        "memory pred.",
        "measured",
        "error",
        "ok",
    ):
        table.add_column(column, justify="left" if column in ("stage", "what", "ok") else "right")
    for stage in report.stages:
        verdict = "[green]yes" if stage.passed else "[red]no"
        calibrated = (
            "-" if stage.calibrated_time_s is None else human_seconds(stage.calibrated_time_s)
        )
        table.add_row(
            stage.stage,
            stage.name,
            human_seconds(stage.predicted_time_s),
            calibrated,
            human_seconds(stage.measured_time_s),
            _percent(stage.time_error),
            "-"
            if stage.predicted_memory_bytes is None
            else human_bytes(stage.predicted_memory_bytes),
            "-"
            if stage.measured_memory_bytes is None
            else human_bytes(stage.measured_memory_bytes),
            _percent(stage.memory_error),
            verdict,
        )
    return table
