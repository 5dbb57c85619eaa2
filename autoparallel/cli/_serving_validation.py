"""``autoparallel validate --serving``: predicted vs measured end-to-end public serving results."""

from __future__ import annotations

import json

from rich.table import Table

from autoparallel.cli._render import console

#: Target of the serving model on these rows: mean |error| per metric kind, and per row.
TARGET_MEAN_ABS_ERROR = 0.15
TARGET_MAX_ABS_ERROR = 0.35


def print_serving_validation(*, as_json: bool, strict: bool) -> int:
    """Print every row of ``cost_model/data/serving_validation.json`` with its source and the
    summary per metric kind; with ``strict``, exit 1 when a kind misses the target."""
    from cost_model import (
        serving_validation_data,
        summarize_serving,
        summarize_serving_by_source,
        validate_serving,
    )

    rows = validate_serving()
    summary = summarize_serving(rows)
    by_source = summarize_serving_by_source(rows)
    sources = serving_validation_data()["sources"]
    if as_json:
        payload = [
            dict(row._asdict(), error=row.error, source_url=sources[row.source]["url"])
            for row in rows
        ]
        console.print_json(
            json.dumps(
                {
                    "rows": payload,
                    "summary": summary,
                    "summary_by_source": by_source,
                    "sources": sources,
                }
            )
        )
    else:
        _print_rows(rows, sources)
        _print_by_source(by_source)
        _print_summary(summary)
    missed = [kind for kind, figures in summary.items() if not _within(figures)]
    return 1 if strict and missed else 0


def _within(figures: dict) -> bool:
    return (
        figures["mean_abs_error"] <= TARGET_MEAN_ABS_ERROR
        and figures["max_abs_error"] <= TARGET_MAX_ABS_ERROR
    )


def _print_rows(rows, sources) -> None:
    table = Table(title="End-to-end public serving measurements (validation only, never fitted)")
    for column in (
        "run",
        "engine",
        "GPU",
        "deployment",
        "metric",
        "predicted",
        "measured",
        "error",
        "source",
    ):
        table.add_column(
            column,
            justify="right" if column in ("predicted", "measured", "error") else "left",
            overflow="fold",
        )
    for row in rows:
        color = "green" if abs(row.error) <= 0.15 else "yellow" if abs(row.error) <= 0.35 else "red"
        table.add_row(
            row.row_id,
            row.engine,
            row.gpu,
            row.deployment,
            f"{row.metric} [{row.unit}]",
            f"{row.predicted:,.1f}",
            f"{row.measured:,.1f}",
            f"[{color}]{100 * row.error:+.1f}%[/]",
            sources[row.source]["url"],
        )
    console.print(table)


def _print_by_source(by_source: dict) -> None:
    table = Table(title="Mean and largest |error| per source and metric")
    for column in ("source", "metric", "rows", "mean |error|", "max |error|"):
        table.add_column(column, justify="left" if column in ("source", "metric") else "right")
    for source, summary in by_source.items():
        for kind, figures in summary.items():
            table.add_row(
                source,
                kind,
                str(figures["count"]),
                f"{100 * figures['mean_abs_error']:.1f}%",
                f"{100 * figures['max_abs_error']:.1f}%",
            )
    console.print(table)


def _print_summary(summary: dict) -> None:
    table = Table(
        title="Mean and largest |error| per metric (target: mean <= 15%, every row <= 35%)"
    )
    for column in ("metric", "rows", "mean |error|", "max |error|", "within target"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for kind, figures in summary.items():
        ok = "[green]yes[/]" if _within(figures) else "[red]no[/]"
        table.add_row(
            kind,
            str(figures["count"]),
            f"{100 * figures['mean_abs_error']:.1f}%",
            f"{100 * figures['max_abs_error']:.1f}%",
            ok,
        )
    console.print(table)
