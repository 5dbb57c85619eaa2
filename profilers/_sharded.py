"""Host overhead of a tensor-parallel (DTensor) linear layer, measured on the live process group.

On a CPU or with small layers, the time of a sharded linear is dominated not by its GEMM but by
DTensor's dispatch (sharding propagation, redistribution bookkeeping) on the host. The
measurement: forward + backward of a column-parallel then row-parallel pair of small linears on
a (batch, sequence, hidden) activation (Megatron's MLP split, Shoeybi et al. 2019 sec. 3) over a
mesh of the whole world, minus the pair's GEMM work (the same pair unsharded, divided by the
world size) and the two all-reduces the split adds (timed alone), per linear.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from profilers._timing import measure


def _pair(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(width, 2 * width, bias=False), nn.Linear(2 * width, width, bias=False)
    )


def _fwd_bwd(module: nn.Module, x: torch.Tensor):
    def call() -> None:
        module(x).sum().backward()

    return call


#: Sequences and tokens of the measured activation; its width is the grid's
#: (``ProfileGrid.sharded_linear_widths``).
SEQUENCES, TOKENS = 2, 64


def sharded_module_overhead_s(
    *,
    device: torch.device,
    clock: str,
    warmup: int,
    repeats: int,
    dtype: torch.dtype = torch.float32,
    shape: tuple[int, int, int] = (2, 64, 64),
) -> float:
    """Extra seconds per tensor-parallel linear (forward + backward), max over ranks, >= 0.

    Use the wall clock: the split synchronizes the ranks twice per pair, and waiting for the
    slower rank is part of what a sharded layer costs."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    world = dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,))
    x = torch.randn(shape, device=device, dtype=dtype)
    plain, sharded = (_pair(shape[-1]).to(device=device, dtype=dtype) for _ in range(2))
    parallelize_module(sharded, mesh, {"0": ColwiseParallel(), "1": RowwiseParallel()})
    buffer = torch.randn(shape, device=device, dtype=dtype)
    timings = []
    for call in (_fwd_bwd(plain, x), _fwd_bwd(sharded, x), lambda: dist.all_reduce(buffer)):
        dist.barrier()
        timings.append(
            measure(
                call,
                device=device,
                warmup=warmup + 3,
                repeats=repeats,
                min_sample_s=0.0,
                clock=clock,
            )
        )
    plain_s, sharded_s, reduce_s = (t.median_s for t in timings)
    overhead = torch.tensor(
        [max(sharded_s - plain_s / world - 2.0 * reduce_s, 0.0) / 2.0], dtype=torch.float64
    )
    dist.all_reduce(overhead, op=dist.ReduceOp.MAX)
    return float(overhead[0])


def sharded_linear_points(
    *,
    device: torch.device,
    warmup: int,
    repeats: int,
    dtype: torch.dtype,
    widths: tuple[int, ...] = (64, 256, 512, 1024),
) -> list[tuple[float, float, str]]:
    """(activation bytes, extra wall seconds per linear, label) of a (``SEQUENCES``,
    ``TOKENS``, width) activation at each of ``widths``."""
    element = torch.empty((), dtype=dtype).element_size()
    points = []
    for shape in ((SEQUENCES, TOKENS, width) for width in widths):
        seconds = sharded_module_overhead_s(
            device=device, clock="wall", warmup=warmup, repeats=repeats, dtype=dtype, shape=shape
        )
        points.append(
            (
                float(shape[0] * shape[1] * shape[2] * element),
                max(seconds, 1e-7),
                "x".join(map(str, shape)),
            )
        )
    return points
