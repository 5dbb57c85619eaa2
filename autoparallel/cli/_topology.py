"""``autoparallel clusters`` (presets, ``--nodes N`` scales them) and ``autoparallel probe`` (under torchrun)."""

from __future__ import annotations

import argparse
import os
import sys

from autoparallel.cli._args import output_file, positive_float, positive_int
from autoparallel.cli._render import (
    add_json_flag,
    console,
    console_error,
    error_console,
    fit_words,
    print_json,
)
from autoparallel.cli._render import table as table_of
from cost_model import human_bytes


def register(subparsers) -> None:  # argparse's private type
    """Add this group's subcommands."""
    clusters = subparsers.add_parser(
        "clusters", help="list the cluster presets (cited hardware and interconnect)"
    )
    clusters.add_argument("names", nargs="*", help="presets to show (default: all)")
    clusters.add_argument(
        "--nodes", type=positive_int, default=None, help="scale every listed preset to N nodes"
    )
    clusters.add_argument(
        "--sources", action="store_true", help="also print where every value comes from"
    )
    add_json_flag(clusters)
    clusters.set_defaults(func=_clusters)

    probe = subparsers.add_parser(
        "probe",
        help="measure this cluster (run under torchrun: torchrun --nproc-per-node N -m autoparallel.cli probe)",
    )
    probe.add_argument(
        "--output", type=output_file, default="cluster.json", help="cluster JSON written by rank 0"
    )
    probe.add_argument(
        "--report",
        type=output_file,
        default=None,
        help="full measurement report JSON (p2p matrix, collectives, compute)",
    )
    probe.add_argument(
        "--preset", default=None, help="preset the device peaks and scale-out tier are taken from"
    )
    probe.add_argument(
        "--p2p-bytes", type=positive_int, default=None, help="point-to-point message size"
    )
    probe.add_argument(
        "--sizes",
        type=positive_int,
        nargs="+",
        default=None,
        help="collective message sizes in bytes",
    )
    probe.add_argument(
        "--repeats", type=positive_int, default=5, help="timed repeats per measurement (>= 5)"
    )
    probe.add_argument(
        "--timeout-s",
        type=positive_float,
        default=60.0,
        help="per-operation timeout; a silent rank is named",
    )
    probe.add_argument("--run-name", default=None, help="name recorded in the measured provenance")
    add_json_flag(probe)
    probe.set_defaults(func=_probe)


def _gbps(value: float) -> str:
    return f"{value / 1e9:,.0f}" if value >= 10e9 else f"{value / 1e9:,.2f}"


def _clusters(args: argparse.Namespace) -> int:
    from topology import get_preset, list_presets

    names = args.names or list_presets()
    clusters = [get_preset(name, num_nodes=args.nodes) for name in names]
    if args.json:
        print_json([cluster.model_dump(mode="json") for cluster in clusters])
        return 0
    scaled = f" scaled to {args.nodes} nodes" if args.nodes else ""
    devices = table_of(
        f"Cluster presets{scaled}: devices",
        {
            "name": "text",
            "device": "text",
            "devices": "number",
            "bf16 TF/s": "number",
            "memory": "number",
            "TB/s": "number",
        },
    )
    networks = table_of(
        f"Cluster presets{scaled}: interconnect",
        {
            "name": "text",
            "scale-up GB/s": "number",
            "scale-out GB/s": "number",
            "fabrics": "text",
            "uncertain": "number",
        },
    )
    networks.caption = (
        "GB/s per device and direction; uncertain: values the sources mark as estimates"
    )
    for cluster in clusters:
        device = cluster.device
        bf16 = device.peak_flops.get("bf16") or max(device.peak_flops.values())
        devices.add_row(
            cluster.name,
            device.name,
            f"{cluster.num_nodes}x{cluster.devices_per_node}",
            f"{bf16 / 1e12:,.0f}" if bf16 >= 10e12 else f"{bf16 / 1e12:.2f}",
            human_bytes(device.memory_bytes),
            f"{device.memory_bandwidth_bytes_per_s / 1e12:.2f}",
        )
        networks.add_row(
            cluster.name,
            _gbps(cluster.intra_node.bandwidth_bytes_per_s),
            _gbps(cluster.inter_node.bandwidth_bytes_per_s),
            f"{cluster.intra_node.kind}, {cluster.inter_node.kind}",
            str(len(device.uncertain)),
        )
    console.print(fit_words(devices))
    console.print(fit_words(networks))
    if args.sources:
        for cluster in clusters:
            _print_sources(cluster)
    return 0


def _print_sources(cluster) -> None:
    from topology import value_status

    table = table_of(
        f"{cluster.name}: sources", {"value": "text", "status": "text", "source": "text"}
    )
    for name, (status, text) in value_status(cluster).items():
        table.add_row(name, "[yellow]uncertain[/]" if status == "uncertain" else status, text)
    console.print(table)


def _probe(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from topology import ProbeRankError, ProbeSettings, get_preset, probe

    settings = ProbeSettings(
        p2p_message_bytes=args.p2p_bytes,
        collective_message_bytes=tuple(args.sizes) if args.sizes else None,
        repeats=args.repeats,
        operation_timeout_s=args.timeout_s,
        run_name=args.run_name,
    )
    base = get_preset(args.preset) if args.preset else None
    is_rank0 = int(os.environ.get("RANK", "0")) == 0
    interactive = console.is_terminal and not args.json
    with Progress(console=console, disable=not (is_rank0 and interactive), transient=False) as bar:
        task = bar.add_task("probing", total=None)

        def progress(label: str, done: int, total: int) -> None:
            if interactive:
                bar.update(task, description=label, completed=done, total=total)
            elif is_rank0:  # a log line per step where no live bar can be drawn (CI, a pipe)
                error_console.print(
                    f"probe: {label} ({done}/{total})", highlight=False, markup=False
                )

        try:
            report = probe(
                settings=settings,
                base=base,
                output=args.output,
                report=args.report,
                progress=progress,
            )
        except ProbeRankError as error:
            # One line, then leave at once: the process group is broken and an orderly interpreter
            # shutdown could wait on it; the launcher sees the failure and ends the other ranks.
            console_error(str(error))
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
    if report is not None and args.json:
        print_json(report.model_dump_json())
        return 0
    if report is not None and report.p2p:
        slowest = report.slowest_link()
        console.print(
            f"wrote [bold]{args.output}[/] ({report.world_size} ranks, {report.backend}); slowest link "
            f"{slowest.from_device} -> {slowest.to_device} at {slowest.bandwidth_bytes_per_s / 1e9:.2f} GB/s"
        )
    return 0
