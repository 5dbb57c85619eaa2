"""The result file of a device benchmark: the device, torch and CUDA versions, the method (the
first line of the benchmark's docstring) and its rows, written under ``benchmarks/results``
unless an output path is given."""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def write_report(*, stem: str, doc: str, output: Path | None = None, **fields) -> dict:
    """Write ``fields`` with the device's identity to ``output`` or
    ``results/<stem>_<device>.json``; return the report."""
    import torch

    name = torch.cuda.get_device_name()
    report = {
        "device": name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "method": doc.strip().splitlines()[0],
        **fields,
    }
    path = output or RESULTS / f"{stem}_{name.replace(' ', '_')}.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {path}")
    return report
