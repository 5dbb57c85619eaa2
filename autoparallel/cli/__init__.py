"""The ``autoparallel`` command. Thin: parse, call the library, render with rich.

Each subcommand group lives in its own module exposing ``register(subparsers)``; every parser
sets ``func`` to a callable taking the parsed ``argparse.Namespace`` and returning an exit code.
"""

from __future__ import annotations

import argparse
import logging
import sys
from importlib import import_module
from typing import NoReturn

from pydantic import ValidationError

_COMMAND_MODULES = (
    "autoparallel.cli._models",  # models, describe
    "autoparallel.cli._topology",  # clusters, probe
    "autoparallel.cli._cost",  # estimate, validate
    "autoparallel.cli._search",  # plan, explain, export
    "autoparallel.cli._profile",  # profile, stage-check
    "autoparallel.cli._day0",  # coverage, day0
    "autoparallel.cli._engines",  # import-config
)


class _OneLineParser(argparse.ArgumentParser):
    """Bad arguments end in one line naming the command and the argument (exit 2); ``--help``
    still shows the full usage. Sub-command parsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        from autoparallel.cli._render import console_error

        console_error(f"{self.prog}: {message} (see {self.prog} --help)")
        sys.exit(2)


def _exit_past_stray_threads(code: int) -> None:
    """End the process now if a thread that is not a daemon is still running after Ctrl-C.

    Optuna runs each trial of a storage with heartbeats beside a heartbeat thread that is not a
    daemon (``optuna.storages._heartbeat.HeartbeatThread``), stopped by the ``with`` block that
    started it; an interrupt that lands after the thread has started and before that block is
    entered leaves it beating, and the interpreter would wait for it at exit forever. What the
    search finished is already committed to its storage, and a trial left RUNNING is failed by
    the next run's stale-trial check (``search._liveness``), so nothing is lost by not waiting.
    """
    import os
    import threading

    current = threading.current_thread()
    if any(t is not current and not t.daemon and t.is_alive() for t in threading.enumerate()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog="autoparallel",
        description="Find and apply parallel layouts (TP/PP/EP/CP/DP) for huge MoE models.",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="log at INFO level")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in _COMMAND_MODULES:
        import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; user errors, missing files and Ctrl-C end in one line on stderr."""
    from autoparallel.cli._render import console_error

    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except (
            SystemExit
        ) as exited:  # --help (0) or a bad argument, already reported in one line (2)
            return exited.code if isinstance(exited.code, int) else 2
        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.WARNING,
            format="%(levelname)s %(name)s: %(message)s",
        )
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        from search import raise_if_interrupted, remembered_interrupts

        with remembered_interrupts():  # a Ctrl-C swallowed in a weakref callback still stops
            code = int(args.func(args) or 0)
            raise_if_interrupted()
        return code
    except KeyboardInterrupt:
        console_error("interrupted (Ctrl-C); a search with --storage resumes from its study")
        if argv is None:  # the program itself, not a caller in the same process
            _exit_past_stray_threads(130)
        return 130
    except ValidationError as error:  # a JSON file or value that does not fit its model
        console_error(_describe_validation_error(error))
        return 2
    except ValueError as error:  # user errors (incl. InfeasiblePlanError): one clear line, exit 2
        console_error(str(error))
        return 2
    except OSError as error:  # a missing file, a folder where a file belongs, no permission
        console_error(_describe_os_error(error))
        return 2


def _describe_validation_error(error: ValidationError, *, shown: int = 4) -> str:
    problems = [
        f"{'.'.join(str(part) for part in item['loc']) or '(document)'}: {item['msg']}"
        for item in error.errors()
    ]
    more = f"; and {len(problems) - shown} more" if len(problems) > shown else ""
    return f"{error.title}: " + "; ".join(problems[:shown]) + more


def _describe_os_error(error: OSError) -> str:
    reasons = {
        FileNotFoundError: "no such file or folder",
        IsADirectoryError: "is a folder, not a file",
        NotADirectoryError: "a part of the path is not a folder",
        PermissionError: "permission denied",
    }
    reason = reasons.get(type(error), error.strerror or str(error))
    return f"{error.filename}: {reason}" if error.filename else f"{reason}: {error}"


if __name__ == "__main__":
    sys.exit(main())
