"""Fit the per-hardware calibration on operator tables only and write cost_model/data/calibration.json.

Usage:
    python benchmarks/calibrate_operators.py [PATH]

PATH: the ``aiconfigurator-core`` 0.12.0 package (default: the installed one, a test extra; else
an unpacked wheel at /tmp/aic/unpacked, got with
``pip download aiconfigurator-core==0.12.0 --no-deps -d /tmp/aic && cd /tmp/aic && unzip -q -o
*.whl -d unpacked``); needs ``pyarrow``. The fit (``cost_model._calibration_operators``) reads
bf16 and fp8 GEMM, context-attention and NCCL tables and a published FlashAttention-2 kernel figure; no whole
training or serving run is a fit input. Every published run is then predicted with the new
calibration and its error recorded as held out ("held_out" in the file).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cost_model import (
    _calibration_operators,
    _cross_validation,
    _options,
    _validation,
    _validation_cases,
)

CALIBRATION_FILE = REPO / "cost_model" / "data" / "calibration.json"
ABOUT = (
    "Global efficiency parameters per hardware type (never per run), fitted by "
    "benchmarks/calibrate_operators.py on single-operator measurements only (aiconfigurator-core "
    "0.12.0 bf16 and fp8 GEMM, context-attention and NCCL tables; the FlashAttention-2 paper's "
    "backward/forward "
    "kernel figures). Each entry's 'fit' names its inputs (tables, sources, points), the parameters "
    "and the operator-level residuals (predicted/measured - 1). No published training or serving "
    "run is a fit input: 'held_out' is the error on every published training run, all held out "
    "('per_run': each figure's speed error with its regime, which cost_model.training_error_band "
    "reads as an estimate's error bar)."
)


def _installed() -> Path:
    """The installed aiconfigurator-core package (a test extra), else the unpacked wheel."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path("/tmp/aic/unpacked")


def _root(path: Path) -> Path:
    for candidate in (path, path / "aiconfigurator_core"):
        if (candidate / "systems" / "data").is_dir():
            return candidate
    raise SystemExit(f"no aiconfigurator_core/systems/data under {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", default=_installed(), type=Path)
    args = parser.parse_args()
    root = _root(args.path)
    calibrations = []
    for calibration in _calibration_operators.calibrate_all(root):
        parameters, residuals = calibration.fit["parameters"], calibration.fit["residuals"]
        print(f"{calibration.device_pattern:12s} {parameters}")
        for kind, figures in residuals.items():
            print(f"    {kind:10s} {figures}")
        calibrations.append(calibration.model_dump(mode="json", exclude_none=True))
    document = {"about": ABOUT, "calibrations": calibrations}
    CALIBRATION_FILE.write_text(json.dumps(document, indent=1) + "\n")
    _options._shipped_calibrations.cache_clear()
    cases = _validation_cases.training_cases()
    rows = [row for case in cases for row in _validation.run_case(case)]
    document["held_out"] = {
        "training_runs": dataclasses.asdict(_cross_validation.error_summary(rows, cases)),
        "per_table": _validation.summarize(rows),
        "per_run": _cross_validation.held_out_runs(rows, cases),
    }
    print(f"held out, every published training run: {document['held_out']['training_runs']}")
    CALIBRATION_FILE.write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
