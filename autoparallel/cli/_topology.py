"""``autoparallel clusters`` (presets, ``--nodes N`` scales them) and ``autoparallel probe`` (under torchrun)."""

from __future__ import annotations

import argparse
import os

from rich.table import Table

from autoparallel.cli._render import console


def register(subparsers) -> None:  # noqa: ANN001 - argparse's private type
    """Add this group's subcommands."""
    clusters = subparsers.add_parser("clusters", help="list the cluster presets (cited hardware and interconnect)")
    clusters.add_argument("names", nargs="*", help="presets to show (default: all)")
    clusters.add_argument("--nodes", type=int, default=None, help="scale every listed preset to N nodes")
    clusters.add_argument("--sources", action="store_true", help="also print where every value comes from")
    clusters.set_defaults(func=_clusters)

    probe = subparsers.add_parser(
        "probe", help="measure this cluster (run under torchrun: torchrun --nproc-per-node N -m autoparallel.cli probe)"
    )
    probe.add_argument("--output", default="cluster.json", help="cluster JSON written by rank 0")
    probe.add_argument("--report", default=None, help="full measurement report JSON (p2p matrix, collectives, compute)")
    probe.add_argument("--preset", default=None, help="preset the device peaks and scale-out tier are taken from")
    probe.add_argument("--p2p-bytes", type=int, default=None, help="point-to-point message size")
    probe.add_argument("--sizes", type=int, nargs="+", default=None, help="collective message sizes in bytes")
    probe.add_argument("--repeats", type=int, default=5, help="timed repeats per measurement (>= 5)")
    probe.add_argument("--timeout-s", type=float, default=60.0, help="per-operation timeout; a silent rank is named")
    probe.add_argument("--run-name", default=None, help="name recorded in the measured provenance")
    probe.set_defaults(func=_probe)


def _gbps(value: float) -> str:
    return f"{value / 1e9:,.0f}" if value >= 10e9 else f"{value / 1e9:,.2f}"


def _clusters(args: argparse.Namespace) -> int:
    from topology import get_preset, list_presets

    names = args.names or list_presets()
    clusters = [get_preset(name, num_nodes=args.nodes) for name in names]
    table = Table(title="Cluster presets" + (f" scaled to {args.nodes} nodes" if args.nodes else ""),
                  caption="bandwidths per device and direction; uncertain: values the sources mark as estimates")
    for column, width in (("name", 14), ("device", 10), ("devices", 0), ("bf16 TF/s", 0), ("memory GB", 0), ("TB/s", 0),
                          ("scale-up GB/s", 0), ("scale-out GB/s", 0), ("fabrics", 10), ("uncertain", 0)):
        table.add_column(column, justify="left" if width else "right", min_width=width or None,
                         no_wrap=column == "name", overflow="fold")
    for cluster in clusters:
        device = cluster.device
        bf16 = device.peak_flops.get("bf16") or max(device.peak_flops.values())
        table.add_row(
            cluster.name, device.name, f"{cluster.num_nodes}x{cluster.devices_per_node}",
            f"{bf16 / 1e12:,.0f}" if bf16 >= 10e12 else f"{bf16 / 1e12:.2f}",
            f"{device.memory_bytes / 1e9:,.0f}", f"{device.memory_bandwidth_bytes_per_s / 1e12:.2f}",
            _gbps(cluster.intra_node.bandwidth_bytes_per_s), _gbps(cluster.inter_node.bandwidth_bytes_per_s),
            f"{cluster.intra_node.kind}, {cluster.inter_node.kind}", str(len(device.uncertain)),
        )
    console.print(table)
    if args.sources:
        for cluster in clusters:
            _print_sources(cluster)
    return 0


def _print_sources(cluster) -> None:  # noqa: ANN001
    from topology import value_status

    table = Table(title=f"{cluster.name}: sources", show_lines=True)
    table.add_column("value")
    table.add_column("status")
    table.add_column("source", overflow="fold")
    for name, source in value_status(cluster).items():
        status, text = source
        table.add_row(name, "[yellow]uncertain[/]" if status == "uncertain" else status, text)
    console.print(table)


def _probe(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from topology import ProbeSettings, get_preset, probe

    settings = ProbeSettings(
        p2p_message_bytes=args.p2p_bytes, collective_message_bytes=tuple(args.sizes) if args.sizes else None,
        repeats=args.repeats, operation_timeout_s=args.timeout_s, run_name=args.run_name,
    )
    base = get_preset(args.preset) if args.preset else None
    is_rank0 = int(os.environ.get("RANK", "0")) == 0
    with Progress(console=console, disable=not is_rank0, transient=False) as bar:
        task = bar.add_task("probing", total=None)

        def progress(label: str, done: int, total: int) -> None:
            bar.update(task, description=label, completed=done, total=total)

        report = probe(settings=settings, base=base, output=args.output, report=args.report, progress=progress)
    if report is not None and report.p2p:
        slowest = report.slowest_link()
        console.print(
            f"wrote [bold]{args.output}[/] ({report.world_size} ranks, {report.backend}); slowest link "
            f"{slowest.from_device} -> {slowest.to_device} at {slowest.bandwidth_bytes_per_s / 1e9:.2f} GB/s"
        )
    return 0
