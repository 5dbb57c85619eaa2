"""``autoparallel profile`` (measure this machine) and ``autoparallel stage-check`` (staged
validation of the cost model against measurements: op, layer, one device, the multi-device plans).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rich.table import Table

from autoparallel.cli._render import console
from cost_model._units import human_seconds


def register(subparsers) -> None:  # noqa: ANN001 - argparse's private type
    """Add this group's subcommands."""
    profile = subparsers.add_parser(
        "profile",
        help="measure GEMM/attention/expert/memory/collective efficiency curves; write a hardware profile JSON",
        description="Run under torchrun (one process per device), or launch --nproc ranks on this host.",
    )
    profile.add_argument("--nproc", type=int, default=1, help="ranks to launch on this host (ignored under torchrun)")
    profile.add_argument("--grid", choices=("tiny", "cpu", "gpu"), default=None, help="measurement grid (default: by device)")
    profile.add_argument("--threads", type=int, default=None, help="intra-op threads per rank (default: cores / nproc)")
    profile.add_argument("--output", "-o", type=Path, default=Path("hardware-profile.json"))
    profile.add_argument("--timeout-s", type=float, default=1800.0)
    profile.set_defaults(func=_profile)


class _Bar:
    """A rich progress bar started lazily in the rank that reports progress."""

    def __init__(self) -> None:
        self._progress = self._task = None

    def __call__(self, done: int, total: int, label: str) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        if self._progress is None:
            self._progress = Progress(
                TextColumn("[bold]profile"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("{task.description}"), console=console, transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task("", total=total)
        self._progress.update(self._task, completed=done, description=label)
        if done >= total:
            self._progress.stop()


def _profile(args: argparse.Namespace) -> int:
    from profilers import ProfileGrid, current_device, launch_profile

    grid_name = args.grid or ("cpu" if current_device().type == "cpu" else "gpu")
    world = int(os.environ.get("WORLD_SIZE", args.nproc))
    threads = args.threads or max(1, (os.cpu_count() or 1) // max(world, 1))
    profile = launch_profile(
        grid=ProfileGrid.preset(grid_name), num_processes=args.nproc, threads_per_rank=threads,
        timeout_s=args.timeout_s, on_progress=_Bar(),
    )
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    path = profile.save(args.output)
    console.print(_summary(profile))
    console.print(f"wrote {path} ({profile.device_type}: {profile.device_name})")
    return 0


def _rate(value: float, unit: str) -> str:
    return f"{value / 1e9:.1f} G{unit}/s"


def _summary(profile) -> Table:  # noqa: ANN001 - topology.HardwareProfile
    table = Table(title=f"Hardware profile: {profile.device_name} ({profile.device_type})")
    for column in ("curve", "points", "smallest call", "best", "spread (median)"):
        table.add_column(column, justify="left" if column == "curve" else "right")
    families = [("gemm", profile.gemm, "FLOP"), ("attention", profile.attention, "FLOP"),
                ("grouped_gemm", profile.grouped_gemm, "FLOP")]
    for family, curves, unit in families:
        for dtype, curve in curves.items():
            table.add_row(f"{family} {dtype}", str(len(curve.work)), _rate(curve.rates_per_s[0], unit),
                          _rate(curve.best_rate_per_s, unit), f"{sorted(curve.spread)[len(curve.spread) // 2]:.0%}")
    for family, curve in (("memory (add)", profile.memory), ("norm", profile.norm)):
        if curve is not None:
            table.add_row(family, str(len(curve.work)), _rate(curve.rates_per_s[0], "B"), _rate(curve.best_rate_per_s, "B"),
                          f"{sorted(curve.spread)[len(curve.spread) // 2]:.0%}")
    for op, by_size in profile.collectives.items():
        for size, curve in by_size.items():
            table.add_row(f"{op} n={size}", str(len(curve.work)), human_seconds(curve.seconds[0]),
                          _rate(curve.best_rate_per_s, "B"), f"{sorted(curve.spread)[len(curve.spread) // 2]:.0%}")
    table.caption = f"kernel overhead {human_seconds(profile.kernel_overhead_s)}; {profile.provenance}"
    return table
