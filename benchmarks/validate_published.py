"""Predicted vs published throughput and memory for every run of the published table.

Usage:
    python benchmarks/validate_published.py            # print the comparison and the summary
    python benchmarks/validate_published.py --fit      # refit the per-hardware calibration first
                                                        # and write cost_model/data/calibration.json

The fit is a least-squares fit of a few global efficiency parameters per hardware type on the
throughput rows (``cost_model._validation.fit_calibration``); it never uses a per-run factor.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cost_model import _common, _cross_validation, _validation

CALIBRATION_FILE = REPO / "cost_model" / "data" / "calibration.json"


def refit(max_evaluations: int) -> None:
    calibrations = []
    for hardware in _validation.FIT_PARAMETERS:
        started = time.perf_counter()
        calibration = _validation.fit_calibration(hardware, max_evaluations=max_evaluations)
        seconds = time.perf_counter() - started
        print(
            f"fitted {hardware} in {seconds:.0f} s: rms log error {calibration.fit['rms_log_error']}"
        )
        calibrations.append(calibration.model_dump(mode="json", exclude_none=True))
    cases = _validation.training_cases()
    fitted = [
        row
        for case in cases
        for row in _validation.run_case(case, calibration=_match(calibrations, case))
    ]
    held_out = _cross_validation.leave_one_source_out(max_evaluations=max_evaluations, cases=cases)
    summary = {
        "fit": dataclasses.asdict(_cross_validation.error_summary(fitted, cases)),
        "leave_one_source_out": dataclasses.asdict(
            _cross_validation.error_summary(held_out, cases)
        ),
        "max_evaluations": max_evaluations,
    }
    print(f"fit error {summary['fit']}; leave-one-source-out {summary['leave_one_source_out']}")
    document = {
        "about": (
            "Global efficiency parameters per hardware type (never per run), fitted by "
            "benchmarks/validate_published.py --fit on the throughput rows of "
            "cost_model/data/published_runs.json; each entry's 'fit' lists the rows, the start "
            "values and the residuals (predicted/published - 1). 'cross_validation': the error of "
            "the fit on its own rows and the leave-one-source-out error (each publication "
            "predicted by a fit on the others), the figure to quote."
        ),
        "calibrations": calibrations,
        "cross_validation": summary,
    }
    CALIBRATION_FILE.write_text(json.dumps(document, indent=1) + "\n")
    _common._shipped_calibrations.cache_clear()


def _match(calibrations: list[dict], case) -> _common.Calibration:
    """The just-fitted calibration of the case's hardware (the shipped file is not yet written)."""
    import re

    from cost_model._calibration_transfer import transferred_calibration

    device = _validation._cluster(case.hardware, 8).device
    fitted = [_common.Calibration.model_validate(entry) for entry in calibrations]
    for calibration in fitted:
        if re.search(calibration.device_pattern, device.name):
            return calibration
    # A generation never fitted gets its reference's fit carried over, as calibration_for does.
    return transferred_calibration(device, fitted) or _common.Calibration()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--fit", action="store_true", help="refit the calibration and write it first"
    )
    parser.add_argument("--max-evaluations", type=int, default=300)
    args = parser.parse_args()
    if args.fit:
        refit(args.max_evaluations)
    rows = _validation.validate_published()
    print(
        f"{'table':26s} {'run':6s} {'metric':32s} {'predicted':>10s} {'published':>10s} {'error':>8s}"
    )
    for row in rows:
        print(
            f"{row.table:26s} {row.run:6s} {row.metric:32s} {row.predicted:10.3f} {row.published:10.3f} "
            f"{100 * row.error:+7.1f}%"
        )
    print()
    print(f"{'table':26s} {'rows':>4s} {'mean |error|':>13s} {'max |error|':>12s}")
    for table, summary in _validation.summarize(rows).items():
        print(
            f"{table:26s} {summary['count']:4d} {100 * summary['mean_abs_error']:12.1f}% "
            f"{100 * summary['max_abs_error']:11.1f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
