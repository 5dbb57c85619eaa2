"""Regenerate ``cost_model/data/fp8_gemm_curves.json`` from operator measurements.

The source is the GEMM table of the Apache-2.0 ``aiconfigurator-core`` wheel (NVIDIA-collected
kernel latencies per (m, n, k) and dtype; never its silicon_sample.csv):

    pip download aiconfigurator-core==0.12.0 --no-deps -d /tmp/aic && unzip -q /tmp/aic/*.whl -d /tmp/aic/x
    python benchmarks/extract_fp8_gemm_curves.py /tmp/aic/x/aiconfigurator_core/systems/data

Needs ``pyarrow`` (not a project dependency: this is a one-off extraction, its output is shipped).
Per device, shapes with m, n, k >= 256 are binned by FLOPs per call (powers of two); each bin
keeps the median bf16 rate and the median per-shape speed-up of the per-tensor (``fp8``) and the
block-scaled (``fp8_block``) kernels over bf16.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import numpy as np

DEVICES = {"H100": "h100_sxm", "B200": "b200_sxm", "GB200": "gb200"}
TABLE = "gemm/trtllm/1.3.0rc20/gemm_perf.parquet"
OUTPUT = Path(__file__).resolve().parents[1] / "cost_model" / "data" / "fp8_gemm_curves.json"


def _rates(path: Path) -> dict[tuple[int, int, int], dict[str, float]]:
    import pyarrow.parquet as pq

    table = pq.read_table(path).to_pydict()
    columns = {name: np.array(table[name]) for name in ("m", "n", "k", "latency", "gemm_dtype")}
    rates: dict[tuple[int, int, int], dict[str, float]] = {}
    large = (columns["m"] >= 256) & (columns["n"] >= 256) & (columns["k"] >= 256)
    for dtype in ("bfloat16", "fp8", "fp8_block"):
        rows = large & (columns["gemm_dtype"] == dtype)
        for m, n, k, latency_ms in zip(*(columns[c][rows] for c in ("m", "n", "k", "latency"))):
            rates.setdefault((int(m), int(n), int(k)), {})[dtype] = (
                2.0 * m * n * k / (latency_ms * 1e-3)
            )
    return rates


def curve(path: Path) -> list[dict]:
    """Binned bf16 rate and fp8/bf16 speed-ups of one device's table."""
    rates = _rates(path)
    points = []
    for low, high in itertools.pairwise(2.0 ** np.arange(28, 46)):
        shapes = [
            r
            for s, r in rates.items()
            if low <= 2.0 * s[0] * s[1] * s[2] < high and "bfloat16" in r
        ]
        if len(shapes) < 5:
            continue
        point = {
            "flops_per_call": round(float(np.sqrt(low * high)), -3),
            "num_shapes": len(shapes),
            "bf16_flops_per_s": float(f"{np.median([r['bfloat16'] for r in shapes]):.4g}"),
        }
        for dtype, key in (("fp8", "tensorwise"), ("fp8_block", "blockwise")):
            ratios = [r[dtype] / r["bfloat16"] for r in shapes if dtype in r]
            point[f"{key}_speedup"] = round(float(np.median(ratios)), 4)
        points.append(point)
    return points


def main(root: str) -> None:
    document = json.loads(OUTPUT.read_text())
    document["curves"] = {
        name: curve(Path(root) / folder / TABLE) for name, folder in DEVICES.items()
    }
    OUTPUT.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
