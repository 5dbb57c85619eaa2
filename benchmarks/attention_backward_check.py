"""Fused causal attention forward and backward on a CUDA device: the backward's efficiency
relative to the forward's, per attention backend.

The training calibration prices fused attention's forward + backward with one efficiency derived
from the forward's and the ratio of backward to forward efficiency that FlashAttention-2 reports
on A100 (63% / 73% of peak, arXiv:2307.08691 sec. 1 and 4.1; ``_calibration_fits``). This
measures that ratio on the device at hand: ``torch.nn.functional.scaled_dot_product_attention``
with ``is_causal=True`` in bf16 under each backend torch offers there (FlashAttention-2,
cuDNN's fused attention, the kernel family Transformer Engine runs on Hopper), forward alone
and forward + backward, timed by CUDA events (median of ``--repeats`` after warm-up).

FLOPs are counted as the cost model counts them (``ModelSpec.attention_flops_per_token``: 4 x
heads x head_dim per attended key, (S + 1) / 2 keys per query under the causal mask), the
backward as 2.5x the forward (FlashAttention-2 sec. 3.1: five matmuls against two). Printed per
shape and backend: forward and backward TFLOP/s, and backward / forward efficiency; the
baseline measured in the same run is the forward.

    python benchmarks/attention_backward_check.py [--output benchmarks/results/attention_<device>.json]
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


#: (sequence tokens, batch): about 32k tokens per call, as a training micro-batch.
SHAPES = ((2048, 16), (4096, 8), (8192, 4), (16384, 2))
#: Heads / head dim: 16 heads of 128 (Llama 3 70B's 64 under TP 4). Keys and values have as
#: many heads as the queries: grouped-query attention reads fewer of them but runs the same
#: FLOPs, and every backend takes this layout.
HEADS, KV_HEADS, HEAD_DIM = 16, 16, 128
BACKWARD_FLOPS = 2.5  # FlashAttention-2 sec. 3.1


def _forward_flops(tokens: int, batch: int) -> float:
    return batch * tokens * 4.0 * HEADS * HEAD_DIM * (tokens + 1) / 2.0


def _measure(backend, tokens: int, batch: int, *, warmup: int, repeats: int) -> dict:
    from torch.nn.attention import sdpa_kernel

    shape_q = (batch, HEADS, tokens, HEAD_DIM)
    shape_kv = (batch, KV_HEADS, tokens, HEAD_DIM)
    q = torch.randn(shape_q, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(shape_kv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(shape_kv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(shape_q, device="cuda", dtype=torch.bfloat16)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def forward():
        return sdpa(q, k, v, is_causal=True)

    def forward_backward():
        out = forward()
        out.backward(grad)
        q.grad = k.grad = v.grad = None

    with sdpa_kernel([backend]):
        with torch.no_grad():
            forward_ms = _ms(forward, warmup=warmup, repeats=repeats)
        both_ms = _ms(forward_backward, warmup=warmup, repeats=repeats)
    flops = _forward_flops(tokens, batch)
    backward_ms = both_ms - forward_ms
    return {
        "backend": backend.name,
        "sequence_tokens": tokens,
        "batch": batch,
        "heads": HEADS,
        "kv_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "forward_flops": flops,
        "forward_ms": forward_ms,
        "forward_backward_ms": both_ms,
        "forward_tflops": flops / forward_ms / 1e9,
        "backward_tflops": BACKWARD_FLOPS * flops / backward_ms / 1e9,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit(
            "attention_backward_check needs a CUDA device (torch.cuda.is_available() is False)"
        )
    from torch.nn.attention import SDPBackend

    rows = []
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        for tokens, batch in SHAPES:
            try:
                row = _measure(backend, tokens, batch, warmup=args.warmup, repeats=args.repeats)
            except RuntimeError as error:  # a backend this build or shape lacks
                print(f"{backend.name} S={tokens}: {str(error).splitlines()[0]}")
                continue
            rows.append(row)
            print(
                f"{backend.name:16s} S={tokens:6d} b={batch:2d}: forward "
                f"{row['forward_tflops']:6.1f} TFLOP/s, backward {row['backward_tflops']:6.1f} "
                f"TFLOP/s, backward / forward {row['backward_tflops'] / row['forward_tflops']:.3f}",
                flush=True,
            )
    write_report(stem="attention", doc=__doc__, output=args.output, rows=rows)


if __name__ == "__main__":
    main()
