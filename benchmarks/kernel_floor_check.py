"""GPU time per kernel when the host launch cost is gone: a CUDA graph of many tiny kernels.

Decode steps of serving engines run under CUDA graphs, which remove the CPU launch cost but not
the GPU's own per-kernel latency (launch into the graph, grid start, drain). This measures it:
``--kernels`` small kernels (a bf16 ``linear`` of a few tokens, an element-wise add, an RMS
norm, in turn) captured in one CUDA graph, replayed and timed with CUDA events; the figure is
graph time / kernels. The baseline, measured in the same run, is the same sequence launched
eagerly (host launch cost included), so the ratio shows what graphs save.

    python benchmarks/kernel_floor_check.py [--kernels 3000] [--output PATH]
"""

from __future__ import annotations

import argparse
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


def _sequence(kernels: int, hidden: int, tokens: int):
    device = torch.device("cuda")
    x = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16)
    w = torch.randn(hidden, hidden, device=device, dtype=torch.bfloat16) * 0.02
    norm = torch.nn.RMSNorm(hidden, device=device, dtype=torch.bfloat16)

    def run() -> torch.Tensor:
        y = x
        for i in range(kernels // 3):
            y = torch.nn.functional.linear(y, w)
            y = y + x
            y = norm(y) if i % 2 else y * 0.5
        return y

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit(
            "kernel_floor_check needs a CUDA device (torch.cuda.is_available() is False)"
        )
    rows = []
    for hidden, tokens in ((1024, 1), (4096, 8), (7168, 64)):
        run = _sequence(args.kernels, hidden, tokens)
        with torch.inference_mode():
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    run()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run()
            launched = 3 * (args.kernels // 3)
            graph_ms = _ms(graph.replay, warmup=0, repeats=args.repeats)
            eager_ms = _ms(run, warmup=0, repeats=args.repeats)
        row = {
            "hidden": hidden,
            "tokens": tokens,
            "ops": launched,
            "graph_us_per_op": graph_ms * 1e3 / launched,
            "eager_us_per_op": eager_ms * 1e3 / launched,
        }
        rows.append(row)
        print(
            f"hidden {hidden:5d} tokens {tokens:3d}: graph {row['graph_us_per_op']:.2f} us/op, "
            f"eager {row['eager_us_per_op']:.2f} us/op (graph/eager {graph_ms / eager_ms:.2f})",
            flush=True,
        )
    write_report(stem="kernel_floor", doc=__doc__, output=args.output, rows=rows)


if __name__ == "__main__":
    main()
