"""Predicted vs published throughput and memory for every run of the published table.

Usage:
    python benchmarks/validate_published.py            # print the comparison and the summary

Every published run is validation only. The calibration it uses (cost_model/data/calibration.json)
is fitted on operator measurements by ``benchmarks/calibrate_operators.py`` (GEMM, attention and
NCCL tables); no run printed here is a fit input, so every error below is a held-out error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cost_model import _validation


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
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
