"""Extract fp8/bf16 GEMM speed-up curves from aiconfigurator-core's GEMM tables (operator data)."""

import itertools
import json
import sys

import numpy as np
import pyarrow.parquet as pq

ROOT = sys.argv[1]
DEVICES = {"H100": "h100_sxm", "B200": "b200_sxm", "GB200": "gb200"}
out = {}
for name, folder in DEVICES.items():
    t = pq.read_table(f"{ROOT}/{folder}/gemm/trtllm/1.3.0rc20/gemm_perf.parquet").to_pydict()
    cols = {c: np.array(t[c]) for c in ("m", "n", "k", "latency", "gemm_dtype", "kernel_source")}
    rates = {}
    for dtype in ("bfloat16", "fp8", "fp8_block"):
        sel = (
            (cols["gemm_dtype"] == dtype)
            & (cols["m"] >= 256)
            & (cols["n"] >= 256)
            & (cols["k"] >= 256)
        )
        for m, n, k, lat in zip(
            cols["m"][sel], cols["n"][sel], cols["k"][sel], cols["latency"][sel]
        ):
            rates.setdefault((int(m), int(n), int(k)), {})[dtype] = 2.0 * m * n * k / (lat * 1e-3)
    points = []
    edges = 2.0 ** np.arange(28, 46)
    for low, high in itertools.pairwise(edges):
        shapes = [
            (s, r)
            for s, r in rates.items()
            if low <= 2.0 * s[0] * s[1] * s[2] < high and "bfloat16" in r
        ]
        if len(shapes) < 5:
            continue
        row = {
            "flops_per_call": float(np.sqrt(low * high)),
            "num_shapes": len(shapes),
            "bf16_flops_per_s": float(np.median([r["bfloat16"] for _, r in shapes])),
        }
        for dtype, key in (("fp8", "tensorwise"), ("fp8_block", "blockwise")):
            ratios = [r[dtype] / r["bfloat16"] for _, r in shapes if dtype in r]
            if ratios:
                row[f"{key}_speedup"] = round(float(np.median(ratios)), 4)
        row["bf16_flops_per_s"] = float(f"{row['bf16_flops_per_s']:.4g}")
        points.append(row)
    out[name] = points
json.dump(out, sys.stdout, indent=1)
