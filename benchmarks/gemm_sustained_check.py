"""Sustained bf16 GEMM rate on a CUDA device: the first second against the rest.

Operator tables time a kernel a few times after a warm-up; a training step runs GEMMs back to
back for seconds, long enough for the device to reach its power limit and lower its clocks.
This runs one ``m x k @ k x n`` bf16 GEMM back to back for ``--seconds`` and reports the rate
in each window of ``--window`` seconds (CUDA events around a batch of products), with the SM
clock and board power ``nvidia-smi`` reads at the end of each window. The baseline, measured
in the same run, is the first window's rate.

    python benchmarks/gemm_sustained_check.py [--size 8192] [--seconds 20] [--output PATH]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._device_report import write_report


def _smi() -> dict:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.split(",")
        return {"sm_clock_mhz": float(out[0]), "power_w": float(out[1])}
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--window", type=float, default=1.0)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit(
            "gemm_sustained_check needs a CUDA device (torch.cuda.is_available() is False)"
        )
    n = args.size
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    flops = 2.0 * n**3
    torch.mm(a, b, out=out)
    torch.cuda.synchronize()
    start_event, end_event = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    start_event.record()
    for _ in range(5):
        torch.mm(a, b, out=out)
    end_event.record()
    end_event.synchronize()
    per_call_s = start_event.elapsed_time(end_event) / 5e3
    batch = max(1, int(args.window / per_call_s))
    windows = []
    began = time.perf_counter()
    while time.perf_counter() - began < args.seconds:
        start_event, end_event = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start_event.record()
        for _ in range(batch):
            torch.mm(a, b, out=out)
        end_event.record()
        end_event.synchronize()
        rate = batch * flops / (start_event.elapsed_time(end_event) / 1e3)
        windows.append({"t_s": time.perf_counter() - began, "tflops": rate / 1e12, **_smi()})
        print(
            f"t={windows[-1]['t_s']:5.1f} s  {rate / 1e12:6.1f} TFLOP/s  "
            f"{windows[-1].get('sm_clock_mhz', 0):.0f} MHz  {windows[-1].get('power_w', 0):.0f} W",
            flush=True,
        )
    first, rest = windows[0]["tflops"], [w["tflops"] for w in windows[1:]]
    if rest:
        print(f"sustained / first window: {sum(rest) / len(rest) / first:.3f}")
    write_report(stem="gemm_sustained", doc=__doc__, output=args.output, size=n, windows=windows)


if __name__ == "__main__":
    main()
