"""Shared rich helpers for the CLI."""

from __future__ import annotations

from rich.console import Console

console = Console()
error_console = Console(stderr=True)


def console_error(message: str) -> None:
    error_console.print(f"[bold red]error:[/] {message}", highlight=False)
