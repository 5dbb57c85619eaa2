"""Subcommands of this group are registered here (see ``autoparallel.cli``)."""

from __future__ import annotations


def register(subparsers) -> None:  # noqa: ANN001 - argparse's private type
    """Add this group's subcommands."""
