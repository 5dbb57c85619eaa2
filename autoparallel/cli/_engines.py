"""``autoparallel export`` (its body) and ``autoparallel import-config``.

Exports are written as plain text to stdout or to files (never through rich: a terminal-wide
wrap would break a shell script); ``--output-dir`` writes every file, the README note included.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "import-config",
        help="read an engine's launch arguments/config back into a parallel layout",
    )
    parser.add_argument(
        "engine",
        choices=("vllm", "sglang", "trtllm", "megatron", "torchtitan", "deepspeed"),
    )
    parser.add_argument(
        "files",
        nargs="+",
        type=Path,
        help="launch script(s) and config file(s) of the engine",
    )
    parser.add_argument(
        "--pp",
        type=int,
        default=1,
        help="DeepSpeed: pipeline stages (set in model code)",
    )
    parser.add_argument(
        "--ep",
        type=int,
        default=1,
        help="DeepSpeed: expert-parallel size (set in model code)",
    )
    parser.set_defaults(func=_import_config)


def engines_line(plan) -> str:
    """Which engines (current releases) run the plan's layout, and why the others do not."""
    from autoparallel.export import runnable_engines
    from autoparallel.export._common import engine_role

    role = "serving" if plan.serving is not None else "training"
    parts = []
    for engine, broken in runnable_engines(plan).items():
        if engine_role(engine) != role:
            continue
        parts.append(f"{engine} yes" if not broken else f"{engine} no ({broken[0].split(' [')[0]})")
    if role == "training":
        # the library's own runtime applies every training layout the search prices (pipeline
        # schedules through torch.distributed.pipelining, zero-bubble one stage per rank among
        # them; tests/test_runtime_pp.py checks each against the unsharded model)
        parts.append("autoparallel.apply_plan yes")
    return f"{role} engines that run this layout: " + "; ".join(parts)


def export_command(args: argparse.Namespace) -> int:
    from autoparallel.export import export_plan
    from autoparallel.plan import load_plan

    result = export_plan(
        load_plan(Path(args.plan)),
        format=args.format,
        model_path=args.model_path,
        engine_version=args.engine_version,
    )
    if getattr(args, "json", False):
        from autoparallel.cli._render import print_json

        print_json(
            {"format": args.format, "files": dict(result.files), "dropped": list(result.dropped)}
        )
        return 0
    if args.output_dir is None:
        sys.stdout.write(result.render())
        return 0
    args.output_dir.mkdir(parents=True, exist_ok=True)
    for name, content in result.files.items():
        path = args.output_dir / name
        path.write_text(content)
        if name.endswith(".sh"):
            path.chmod(0o755)
        sys.stdout.write(f"wrote {path}\n")
    for item in result.dropped:
        sys.stdout.write(f"dropped: {item}\n")
    return 0


def _import_config(args: argparse.Namespace) -> int:
    from autoparallel.cli._search import describe_config
    from autoparallel.export import import_config

    missing = [str(path) for path in args.files if not path.exists()]
    if missing:
        raise ValueError(f"files ({', '.join(missing)}) do not exist")
    config = import_config(
        args.engine,
        {path.name: path.read_text() for path in args.files},
        pp=args.pp,
        ep=args.ep,
    )
    sys.stdout.write(describe_config(config) + "\n" + config.model_dump_json() + "\n")
    return 0
