"""Shared rich helpers for the CLI.

On a terminal, output is laid out for the terminal's width (tables keep names and numbers whole:
numeric columns never wrap, text columns fold). When stdout is not a terminal (a pipe or a file),
nothing is wrapped: lines keep their full length so scripts and shell files stay intact.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rich import box
from rich.console import Console
from rich.errors import MarkupError
from rich.markup import escape
from rich.table import Table
from rich.text import Text

# Wide enough that no line a command prints is ever wrapped when not on a terminal.
_UNWRAPPED_WIDTH = 10_000


def _console(*, stderr: bool) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=_UNWRAPPED_WIDTH, soft_wrap=True)


console = _console(stderr=False)
error_console = _console(stderr=True)


def console_error(message: str) -> None:
    """One line on stderr: ``error: <message>`` (newlines folded, so the error stays one line)."""
    error_console.print(
        f"[bold red]error:[/] {escape(' '.join(message.split()))}",
        highlight=False,
        markup=True,
        soft_wrap=True,
    )


def print_json(payload: Any) -> None:
    """Machine-readable output: JSON on stdout, one document, never wrapped or colored."""
    text = payload if isinstance(payload, str) else json.dumps(payload, default=str, indent=2)
    sys.stdout.write(text.rstrip("\n") + "\n")
    sys.stdout.flush()


def add_json_flag(parser) -> None:  # argparse.ArgumentParser
    """``--json``: print the command's results as one JSON document instead of tables."""
    parser.add_argument(
        "--json", action="store_true", help="print the results as JSON (for scripts)"
    )


def table(title: str, columns: dict[str, str]) -> Table:
    """A compact table (no vertical rules) whose ``columns`` map header -> ``"number"``
    (right-aligned, never wrapped) or ``"text"`` (wraps between words, never inside one: see
    ``fit_words``). Sized so the commands' tables fit 80 columns."""
    result = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for name, kind in columns.items():
        if kind == "number":
            result.add_column(name, justify="right", no_wrap=True)
        else:
            result.add_column(name, overflow="fold")
    return result


def fit_words(result: Table) -> Table:
    """Give each text column at least the width of its longest word, so no name is cut."""
    for column in result.columns:
        if column.no_wrap:
            continue
        words = [word for cell in column.cells for word in _plain(cell).split()]
        longest = max((len(word) for word in words), default=0)
        column.min_width = max(column.min_width or 0, longest, len(str(column.header)))
    return result


def _plain(cell: object) -> str:
    """A cell's visible text (markup such as ``[bold]`` removed)."""
    if isinstance(cell, str):
        try:
            return Text.from_markup(cell).plain
        except MarkupError:
            return cell
    return str(cell.plain) if isinstance(cell, Text) else str(cell)
