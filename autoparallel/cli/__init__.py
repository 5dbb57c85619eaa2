"""The ``autoparallel`` command. Thin: parse, call the library, render with rich.

Each subcommand group lives in its own module exposing ``register(subparsers)``; every parser
sets ``func`` to a callable taking the parsed ``argparse.Namespace`` and returning an exit code.
"""

from __future__ import annotations

import argparse
import logging
import sys
from importlib import import_module

_COMMAND_MODULES = (
    "autoparallel.cli._models",  # models, describe
    "autoparallel.cli._topology",  # clusters, probe
    "autoparallel.cli._cost",  # estimate, validate
    "autoparallel.cli._search",  # plan, explain, export
    "autoparallel.cli._profile",  # profile, stage-check
    "autoparallel.cli._engines",  # import-config
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autoparallel",
        description="Find and apply parallel layouts (TP/PP/EP/CP/DP) for huge MoE models.",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="log at INFO level")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in _COMMAND_MODULES:
        import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from autoparallel.cli._render import console_error

    try:
        return int(args.func(args) or 0)
    except ValueError as error:  # user errors (incl. InfeasiblePlanError): one clear line, exit 2
        console_error(str(error))
        return 2


if __name__ == "__main__":
    sys.exit(main())
