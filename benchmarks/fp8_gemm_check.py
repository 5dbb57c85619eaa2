"""First-party check of the FP8 GEMM speed-up curves on a CUDA device (Hopper or newer).

``cost_model/data/fp8_gemm_curves.json`` is extracted from an imported operator table
(aiconfigurator-core's TensorRT-LLM GEMM latencies). This script measures the same quantity
on the device at hand, through torch's own kernels (cuBLASLt via ``torch._scaled_mm``), so the
import can be checked against a second, independent operator measurement:

  * ``bf16``: ``torch.mm`` of an m x k activation by a k x n weight, bf16 out;
  * ``tensorwise``: the same product in float8_e4m3fn with one fp32 scale per tensor;
  * ``rowwise``: float8_e4m3fn with one scale per activation row and per weight column;
  * ``quantize``: the cast of the m x k bf16 activation to fp8 with its scale (amax, divide,
    cast): the extra kernel a current-scaling recipe runs before each fp8 GEMM.

Each figure is the median of ``--repeats`` CUDA-event-timed calls after warm-up, inputs resident
(a GEMM of these sizes reads its operands once). Printed per shape: bf16 TFLOP/s, each fp8
kernel's speed-up over bf16 measured in the same run (the baseline), the quantize time as a
fraction of the bf16 GEMM, and the speed-up the cost model prices for that shape on the preset
(``--preset``, by default the one named after the device): its calibrated bf16 GEMM against
``cost_model._precision.fp8_gemm_time_s`` (the fp8 fit on the imported table).

    python benchmarks/fp8_gemm_check.py [--output benchmarks/results/fp8_gemm_<device>.json]
    python benchmarks/fp8_gemm_check.py --compare benchmarks/results/fp8_gemm_h200.json  # no GPU

``benchmarks/results/fp8_gemm_h200.json`` is the reference measurement (one NVIDIA H200 SXM at
its 700 W limit, torch 2.11 + CUDA 13.0); ``tests/test_fp8_gemm_first_party.py`` checks the
cost model's Hopper fp8 pricing against it; ``--append`` adds a repeat run to it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._device_report import write_report
from profilers._timing import event_median_s


def _ms(call, *, warmup: int, repeats: int) -> float:
    """Median CUDA-event milliseconds of ``call`` (``profilers._timing.event_median_s``)."""
    return 1e3 * event_median_s(call, device=torch.device("cuda"), warmup=warmup, repeats=repeats)


#: (n, k) weight shapes of common dense and expert projections (Llama 3 8B/70B, DeepSeek-V3
#: experts, square), each timed at every token count in ``TOKENS``.
WEIGHTS = ((4096, 4096), (14336, 4096), (4096, 14336), (8192, 8192), (28672, 8192), (2048, 7168))
TOKENS = (128, 512, 2048, 8192, 16384)
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn (OCP FP8 specification)


def _quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = x.abs().amax().float().clamp(min=1e-12) / FP8_MAX
    return (x / scale).to(FP8), scale


def _shape(m: int, n: int, k: int, *, warmup: int, repeats: int) -> dict:
    device = torch.device("cuda")
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
    x8, sx = _quantize(x)
    w8, sw = _quantize(w)
    row_x = torch.full((m, 1), float(sx), device=device, dtype=torch.float32)
    col_w = torch.full((1, n), float(sw), device=device, dtype=torch.float32)
    flops = 2.0 * m * n * k
    row: dict = {"m": m, "n": n, "k": k, "flops": flops}
    row["bf16_ms"] = _ms(lambda: torch.mm(x, w.t()), warmup=warmup, repeats=repeats)
    kernels = {
        "tensorwise": lambda: torch._scaled_mm(x8, w8.t(), sx, sw, out_dtype=torch.bfloat16),
        "rowwise": lambda: torch._scaled_mm(x8, w8.t(), row_x, col_w, out_dtype=torch.bfloat16),
    }
    for name, call in kernels.items():
        try:
            row[f"{name}_ms"] = _ms(call, warmup=warmup, repeats=repeats)
        except RuntimeError as error:  # a scaling mode this torch/cuBLASLt build lacks
            row[f"{name}_error"] = str(error).splitlines()[0]
    row["quantize_ms"] = _ms(lambda: _quantize(x), warmup=warmup, repeats=repeats)
    return row


def modelled_seconds(rows: list[dict], *, preset: str, recipe: str = "tensorwise") -> tuple:
    """(bf16, fp8) seconds the cost model prices for each measured shape on ``preset``: one
    GEMM call each, its operands and output in bf16 bytes (as training prices them)."""
    import numpy as np

    from cost_model._options import calibration_for
    from cost_model._precision import fp8_gemm_time_s
    from cost_model._pricing import op_time_s
    from topology import get_preset

    hardware = get_preset(preset).device
    calibration = calibration_for(hardware)
    m, n, k = (np.array([row[axis] for row in rows], dtype=np.float64) for axis in "mnk")
    flops, moved = 2.0 * m * n * k, 2.0 * (m * k + n * k + m * n)
    bf16 = op_time_s(
        flops=flops, bytes_moved=moved, hardware=hardware, dtype="bf16", calibration=calibration
    )
    fp8 = fp8_gemm_time_s(
        hardware=hardware, calibration=calibration, recipe=recipe, flops=flops, bytes_moved=moved
    )
    return bf16, fp8


def compare(report: dict, *, preset: str, min_flops: float = 1e11) -> dict:
    """Measured against modelled, per shape and as geometric means over the shapes of at least
    ``min_flops`` (a training step's fp8 GEMMs, ``_calibration_operators.FP8_MIN_FLOPS``)."""
    import numpy as np

    rows = report["rows"]
    runs = [rows, *report.get("repeat_runs", [])]
    for run in runs[1:]:
        if [(r["m"], r["n"], r["k"]) for r in run] != [(r["m"], r["n"], r["k"]) for r in rows]:
            raise ValueError("repeat_runs must time the same shapes, in order, as rows")
    bf16, fp8 = modelled_seconds(rows, preset=preset)

    def measured(key: str) -> np.ndarray:  # geometric mean over the runs, per shape
        times = np.array([[row[key] / 1e3 for row in run] for run in runs])
        return np.exp(np.mean(np.log(times), axis=0))

    measured_bf16, measured_fp8 = measured("bf16_ms"), measured("tensorwise_ms")
    speedup_ratio = (bf16 / fp8) / (measured_bf16 / measured_fp8)
    run_speedups = np.array([[r["bf16_ms"] / r["tensorwise_ms"] for r in run] for run in runs])
    big = np.array([row["flops"] >= min_flops for row in rows])

    def geo(values) -> float:
        return float(np.exp(np.mean(np.log(values[big]))))

    return {
        "preset": preset,
        "modelled_speedup": (bf16 / fp8).tolist(),
        "speedup_ratio": speedup_ratio.tolist(),
        "training_shapes": int(big.sum()),
        "geo_bf16_ratio": geo(bf16 / measured_bf16),
        "geo_fp8_ratio": geo(fp8 / measured_fp8),
        "geo_speedup_ratio": geo(speedup_ratio),
        "max_speedup_error": float(np.max(np.abs(speedup_ratio[big] - 1.0))),
        "runs": len(runs),
        # the largest run-to-run difference of a shape's measured speed-up (max / min - 1)
        "run_spread": float(np.max(run_speedups.max(axis=0)[big] / run_speedups.min(axis=0)[big]))
        - 1.0,
    }


def _print_comparison(report: dict, preset: str) -> None:
    result = compare(report, preset=preset)
    print(f"cost model on preset {preset} (modelled / measured):")
    for row, modelled, ratio in zip(
        report["rows"], result["modelled_speedup"], result["speedup_ratio"]
    ):
        print(
            f"  m={row['m']:6d} n={row['n']:6d} k={row['k']:6d}  fp8 speed-up "
            f"modelled x{modelled:.2f} measured x{modelled / ratio:.2f}"
        )
    print(
        f"  shapes of >= 1e11 FLOPs ({result['training_shapes']}): bf16 time "
        f"{result['geo_bf16_ratio']:.3f}, fp8 time {result['geo_fp8_ratio']:.3f}, "
        f"speed-up {result['geo_speedup_ratio']:.3f} (geometric means), largest speed-up "
        f"error {result['max_speedup_error']:.1%}; {result['runs']} run(s), measured speed-ups "
        f"differing by up to {result['run_spread']:.1%} between runs"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--preset", default=None, help="cluster preset to compare with")
    parser.add_argument(
        "--compare", type=Path, default=None, help="compare a saved result only (no GPU needed)"
    )
    parser.add_argument(
        "--append",
        type=Path,
        default=None,
        help="add this run to a saved result's repeat_runs (same shapes) instead of a new file",
    )
    args = parser.parse_args()
    if args.compare is not None:
        report = json.loads(args.compare.read_text())
        _print_comparison(report, args.preset or _preset_for(report["device"]))
        return
    if not torch.cuda.is_available():
        raise SystemExit("fp8_gemm_check needs a CUDA device (torch.cuda.is_available() is False)")
    name = torch.cuda.get_device_name()
    if torch.cuda.get_device_capability() < (8, 9):
        raise SystemExit(f"device {name!r} has no FP8 tensor cores (compute capability < 8.9)")
    rows = []
    print(f"{name}: bf16 TFLOP/s, fp8 speed-up over bf16 (same run), quantize / bf16 GEMM")
    for n, k in WEIGHTS:
        for m in TOKENS:
            row = _shape(m, n, k, warmup=args.warmup, repeats=args.repeats)
            rows.append(row)
            tflops = row["flops"] / row["bf16_ms"] / 1e9
            parts = [f"m={m:6d} n={n:6d} k={k:6d}  bf16 {tflops:6.1f}"]
            for kernel in ("tensorwise", "rowwise"):
                if f"{kernel}_ms" in row:
                    parts.append(f"{kernel} x{row['bf16_ms'] / row[f'{kernel}_ms']:.2f}")
            parts.append(f"quantize {row['quantize_ms'] / row['bf16_ms']:.2f}")
            print("  ".join(parts), flush=True)
    if args.append is not None:
        report = json.loads(args.append.read_text())
        report.setdefault("repeat_runs", []).append(rows)
        args.append.write_text(json.dumps(report, indent=1) + "\n")
        print(f"added a run to {args.append}")
    else:
        report = write_report(stem="fp8_gemm", doc=__doc__, output=args.output, rows=rows)
    _print_comparison(report, args.preset or _preset_for(name))


def _preset_for(device_name: str) -> str:
    # GB200 before B200: the one name holds the other.
    presets = (
        ("H200", "dgx-h200"),
        ("H100", "dgx-h100"),
        ("GB200", "gb200-nvl72"),
        ("B200", "dgx-b200"),
    )
    for fragment, preset in presets:
        if fragment in device_name:
            return preset
    raise SystemExit(f"no preset known for device {device_name!r}: pass --preset")


if __name__ == "__main__":
    main()
