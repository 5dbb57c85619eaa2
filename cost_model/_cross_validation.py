"""Leave-one-source-out error of the fitted calibration: the figure to quote.

The global parameters of each hardware type are fitted on end-to-end published runs
(``_validation.fit_calibration``), so their error on those same runs (the fit error) says
little about runs the fit never saw. Here, for each independent publication (``Case.source``)
the parameters of every hardware type it covers are refitted on all the *other* sources' runs
of that hardware, and its runs are predicted with them. A hardware type whose only source is
the one left out gets the uncalibrated defaults of its preset (no fitted value at all). A
hardware type that is never fitted (B200, GB200) is predicted as the shipped model predicts it:
with its preset's reference calibration (``_calibration_transfer``), here the reference
hardware's fit made without the left-out source.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_model._calibration_transfer import transferred_calibration
from cost_model._common import Calibration
from cost_model._validation import (
    FIT_PARAMETERS,
    PRESETS,
    SOFTWARE,
    Case,
    ValidationRow,
    fit_calibration,
    run_case,
    training_cases,
)

__all__ = [
    "ErrorSummary",
    "error_summary",
    "grouped_errors",
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
    *, max_evaluations: int = 80, cases: list[Case] | None = None
) -> list[ValidationRow]:
    """Each case's figures predicted by a calibration fitted without its source."""
    cases = training_cases() if cases is None else cases
    rows: list[ValidationRow] = []
    for source in dict.fromkeys(case.source for case in cases):
        held_out = [case for case in cases if case.source == source]
        fits: dict[str, Calibration] = {}
        for hardware in dict.fromkeys(case.hardware for case in held_out):
            calibration = _calibration_without(
                source, hardware, cases=cases, max_evaluations=max_evaluations, fits=fits
            )
            for case in (case for case in held_out if case.hardware == hardware):
                rows.extend(run_case(case, calibration=calibration))
    return rows


def _calibration_without(
    source: str,
    hardware: str,
    *,
    cases: list[Case],
    max_evaluations: int,
    fits: dict[str, Calibration],
) -> Calibration:
    """The fit of ``hardware`` without ``source``; for a hardware type that is never fitted, its
    preset's reference calibration (fitted without ``source``) carried over, as
    ``calibration_for`` does for the shipped fit."""
    from cost_model._validation import _cluster

    device = _cluster(hardware, 8).device
    if hardware not in FIT_PARAMETERS:
        reference = next(
            (
                key
                for key, preset in PRESETS.items()
                if preset == getattr(device, "calibration_reference", None)
            ),
            None,
        )
        if reference is None or reference not in FIT_PARAMETERS:
            return Calibration()
        hardware, fitted_for = reference, device
    else:
        fitted_for = None
    if hardware not in fits:
        fits[hardware] = _fit_without(
            source, hardware, cases=cases, max_evaluations=max_evaluations
        )
    if fitted_for is None:
        return fits[hardware]
    return transferred_calibration(fitted_for, [fits[hardware]]) or Calibration()


def _fit_without(
    source: str, hardware: str, *, cases: list[Case], max_evaluations: int
) -> Calibration:
    others = [case for case in cases if case.hardware == hardware and case.source != source]
    if not others or hardware not in FIT_PARAMETERS:
        return Calibration()  # nothing left to fit on: the preset's own efficiencies
    return fit_calibration(hardware, max_evaluations=max_evaluations, cases=others)


def parallelism_label(case: Case) -> str:
    """The parallel dimensions a run uses (``tp+pp+cp+ep``, ``zero3`` for sharded parameters;
    ``dp`` alone when it uses none)."""
    config = case.config
    parts = [name for name in ("tp", "pp", "cp", "ep") if getattr(config, name) > 1]
    if config.zero_stage == 3:
        parts.append("zero3")
    return "+".join(parts) or "dp"


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
    groups: dict[str, list[float]] = {}
    for row, case in zip(rows, case_of_rows(rows, cases)):
        groups.setdefault(GROUPINGS[by](case), []).append(row.error)
    return {
        name: {
            "count": len(errors),
            "mean_error": float(np.mean(errors)),
            "mean_abs_error": float(np.mean(np.abs(errors))),
            "max_abs_error": float(np.max(np.abs(errors))),
        }
        for name, errors in groups.items()
    }
