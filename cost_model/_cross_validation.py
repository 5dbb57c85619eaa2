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
    Case,
    ValidationRow,
    fit_calibration,
    run_case,
    training_cases,
)

__all__ = ["ErrorSummary", "error_summary", "leave_one_source_out"]


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
        count=int(errors.size), sources=sources, mean_abs_error=float(errors.mean()), max_abs_error=float(errors.max())
    )


def leave_one_source_out(*, max_evaluations: int = 80, cases: list[Case] | None = None) -> list[ValidationRow]:
    """Each case's figures predicted by a calibration fitted without its source."""
    cases = training_cases() if cases is None else cases
    rows: list[ValidationRow] = []
    for source in dict.fromkeys(case.source for case in cases):
        held_out = [case for case in cases if case.source == source]
        fits: dict[str, Calibration] = {}
        for hardware in dict.fromkeys(case.hardware for case in held_out):
            calibration = _calibration_without(source, hardware, cases=cases, max_evaluations=max_evaluations, fits=fits)
            for case in (case for case in held_out if case.hardware == hardware):
                rows.extend(run_case(case, calibration=calibration))
    return rows


def _calibration_without(
    source: str, hardware: str, *, cases: list[Case], max_evaluations: int, fits: dict[str, Calibration]
) -> Calibration:
    """The fit of ``hardware`` without ``source``; for a hardware type that is never fitted, its
    preset's reference calibration (fitted without ``source``) carried over, as
    ``calibration_for`` does for the shipped fit."""
    from cost_model._validation import _cluster

    device = _cluster(hardware, 8).device
    if hardware not in FIT_PARAMETERS:
        reference = next((key for key, preset in PRESETS.items() if preset == getattr(device, "calibration_reference", None)), None)
        if reference is None or reference not in FIT_PARAMETERS:
            return Calibration()
        hardware, fitted_for = reference, device
    else:
        fitted_for = None
    if hardware not in fits:
        fits[hardware] = _fit_without(source, hardware, cases=cases, max_evaluations=max_evaluations)
    if fitted_for is None:
        return fits[hardware]
    return transferred_calibration(fitted_for, [fits[hardware]]) or Calibration()


def _fit_without(source: str, hardware: str, *, cases: list[Case], max_evaluations: int) -> Calibration:
    others = [case for case in cases if case.hardware == hardware and case.source != source]
    if not others or hardware not in FIT_PARAMETERS:
        return Calibration()  # nothing left to fit on: the preset's own efficiencies
    return fit_calibration(hardware, max_evaluations=max_evaluations, cases=others)
