"""Error on published runs the calibration never saw: the figure to quote.

The global parameters of each hardware type are fitted on operator measurements only
(``_calibration_operators``: GEMM, attention and NCCL tables), so every published training run is
held out of the fit. ``leave_one_source_out`` keeps its name (the figure earlier versions
quoted) and now needs no refit: each source's runs are predicted by the shipped calibration, which
no source was part of. A hardware type without an operator fit gets its preset's reference
calibration carried over (``_calibration_transfer``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_model._error_band import GENERATIONS, parallelism_of
from cost_model._validation import ValidationRow, run_case
from cost_model._validation_cases import SOFTWARE, Case, training_cases

__all__ = [
    "ErrorSummary",
    "error_summary",
    "grouped_errors",
    "held_out_runs",
    "leave_one_source_out",
    "parallelism_label",
]


@dataclass(frozen=True)
class ErrorSummary:
    """Mean and max |relative error| over ``count`` figures from ``sources`` publications."""

    count: int
    sources: int
    mean_abs_error: float
    max_abs_error: float


def error_summary(rows: list[ValidationRow], cases: list[Case] | None = None) -> ErrorSummary:
    errors = np.abs([row.error for row in rows])
    sources = len({case.source for case in cases}) if cases is not None else 0
    return ErrorSummary(
        count=int(errors.size),
        sources=sources,
        mean_abs_error=float(errors.mean()),
        max_abs_error=float(errors.max()),
    )


def leave_one_source_out(
    *, max_evaluations: int = 0, cases: list[Case] | None = None
) -> list[ValidationRow]:
    """Each case's figures predicted by the shipped operator calibration, which no published run
    was fitted into (every source is left out). ``max_evaluations`` is accepted for callers of the
    former per-source refit and ignored."""
    del max_evaluations
    cases = training_cases() if cases is None else cases
    return [row for case in cases for row in run_case(case)]


def parallelism_label(case: Case) -> str:
    """The parallel dimensions a run uses (``_error_band.parallelism_of``)."""
    return parallelism_of(case.config)


#: How ``grouped_errors`` can group the rows: by publication, framework profile, parallelism.
GROUPINGS = {
    "source": lambda case: case.source,
    "framework": lambda case: (
        case.workload.framework or SOFTWARE.get(case.software, {}).get("framework", case.software)
    ),
    "parallelism": parallelism_label,
}


def case_of_rows(rows: list[ValidationRow], cases: list[Case]) -> list[Case]:
    """The case each row was computed from (matched on table, run and metric)."""
    by_key = {(case.table, case.run, metric[0]): case for case in cases for metric in case.metrics}
    return [by_key[(row.table, row.run, row.metric)] for row in rows]


def grouped_errors(
    rows: list[ValidationRow], cases: list[Case], *, by: str
) -> dict[str, dict[str, float]]:
    """Per group (``GROUPINGS[by]``): count, mean signed error (the bias: > 0 predicted too
    fast), mean and max |error|."""
    if by not in GROUPINGS:
        raise ValueError(f"by ({by!r}) must be one of {sorted(GROUPINGS)}")
    groups: dict[str, list[ValidationRow]] = {}
    for row, case in zip(rows, case_of_rows(rows, cases)):
        groups.setdefault(GROUPINGS[by](case), []).append(row)
    return {
        name: {
            "count": len(members),
            "mean_error": float(np.mean([row.speed_error for row in members])),
            "mean_abs_error": float(np.mean(np.abs([row.error for row in members]))),
            "max_abs_error": float(np.max(np.abs([row.error for row in members]))),
        }
        for name, members in groups.items()
    }


def held_out_runs(rows: list[ValidationRow], cases: list[Case]) -> list[dict]:
    """Each held-out figure with the regime its run belongs to, as ``_error_band`` reads them
    from ``data/calibration.json``: table, run, metric, source, GPU generation, MoE or dense,
    parallel dimensions and the speed error (> 0: predicted too fast)."""
    return [
        {
            "table": row.table,
            "run": row.run,
            "metric": row.metric,
            "source": case.source,
            "generation": GENERATIONS[case.hardware],
            "moe": case.model.moe is not None,
            "parallelism": parallelism_label(case),
            "speed_error": row.speed_error,
        }
        for row, case in zip(rows, case_of_rows(rows, cases))
    ]
