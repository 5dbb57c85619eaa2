"""Costs a roofline of single kernels misses, measured with the runtime's own code.

* **Optimizer update**: one ``MasterWeightAdam`` step (AdamW over fp32 master weights, the
  copy back into the low-precision weight, zeroing the main gradient) over N parameters held
  in tensors of at most ``CHUNK_PARAMETERS``. Work = N x ``ADAM_UPDATE_BYTES``, the bytes
  ``cost_model`` counts per parameter (read the fp32 gradient, read and write the master weight
  and both moments, write the bf16 weight: 4 + 3 x 8 + 2; Megatron-LM's mixed-precision Adam).
* **Main-gradient accumulation**: ``main_grad.add_(grad)`` over the same tensors; work = N x 10
  bytes (read the 2-byte gradient, read and write the fp32 main gradient).
* **Layer host cost**: forward + backward of the runtime's reference decoder layers (a dense
  one, an MoE one with 2 and with 16 routed experts) at a vanishing size (hidden 32, 8 tokens):
  the time is then the per-operator dispatch and autograd bookkeeping, the intercept of layer
  time versus work.
* **Eager inference dispatch**: the host seconds per operator of a tiny decoder block run for
  inference without a CUDA graph (``torch.inference_mode``, no synchronization inside the timed
  region: Python module code, the dispatcher and, on an accelerator, the kernel launch). The
  block's ops are one kernel each (layer norm, two linears, SiLU, multiply, residual add) on
  tensors so small that their work is negligible, so the time per op is the host's launch
  cost, which bounds a pass an engine runs eagerly (``cost_model`` ``eager_kernel_host_s``).
* **Graph-replayed kernel floor**: on a CUDA device, the GPU seconds per kernel of a chain of
  tiny kernels (the eager block's ops, one 1-token pass after another) captured in one CUDA
  graph and replayed, timed by CUDA events: what a kernel costs a serving engine's decode step
  once the graph has removed its host launch (the launch-to-launch gap, the kernel's ramp and
  tail; ``cost_model`` ``kernel_floor_s``). None on a backend without CUDA graphs.
* With ranks: the extra step cost of a tensor-parallel (DTensor) weight over a plain tensor of
  its local shape, and the per-micro-batch cost of a ``torch.distributed.pipelining`` 1F1B
  schedule (the slope of step time over micro-batch count with stages doing almost no work,
  less the send/recv of the boundary activation, priced apart), and the extra time of a
  blocking all-reduce issued right after a compute segment over the same all-reduce alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from profilers._timing import measure, synchronize

#: Bytes per parameter of one AdamW step with fp32 master weights (module docstring).
ADAM_UPDATE_BYTES = 4.0 + 3 * 2 * 4.0 + 2.0
#: Bytes per parameter of one main-gradient accumulation (module docstring).
ACCUMULATE_BYTES = 2.0 + 2 * 4.0
CHUNK_PARAMETERS = 2**17
_TINY_HIDDEN, _TINY_TOKENS, _MANY_EXPERTS = 32, 8, 16


def _chunks(parameters: int) -> list[int]:
    full, rest = divmod(parameters, CHUNK_PARAMETERS)
    return [CHUNK_PARAMETERS] * full + ([rest] if rest else [])


def _adam(sizes: list[int], *, device: torch.device, dtype: torch.dtype):  # MasterWeightAdam
    from profilers._training_run import MasterWeightAdam

    weights = [torch.nn.Parameter(torch.randn(n, device=device, dtype=dtype) * 0.02) for n in sizes]
    optimizer = MasterWeightAdam(weights, learning_rate=1e-4)
    for master in optimizer.masters:
        master.grad.normal_()
    return optimizer


def update_points(
    *,
    parameters: tuple[int, ...],
    device: torch.device,
    dtype: torch.dtype,
    clock: str,
    warmup: int,
    repeats: int,
) -> tuple[list[tuple[float, float, str]], list[tuple[float, float, str]]]:
    """(optimizer rows, accumulation rows): (work bytes, median seconds, label) per size."""
    optimizer_rows, accumulate_rows = [], []
    for count in parameters:
        sizes = _chunks(count)
        optimizer = _adam(sizes, device=device, dtype=dtype)
        timing = measure(optimizer.step, device=device, warmup=warmup, repeats=repeats, clock=clock)
        label = f"N={count} in {len(sizes)} tensor(s)"
        optimizer_rows.append((count * ADAM_UPDATE_BYTES, timing.median_s, label))
        grads = [torch.randn(n, device=device, dtype=dtype) for n in sizes]
        mains = [master.grad for master in optimizer.masters]

        def accumulate(mains: list = mains, grads: list = grads) -> None:
            for main, grad in zip(mains, grads):
                main.add_(grad)

        timing = measure(accumulate, device=device, warmup=warmup, repeats=repeats, clock=clock)
        accumulate_rows.append((count * ACCUMULATE_BYTES, timing.median_s, label))
    return optimizer_rows, accumulate_rows


def _tiny_layers(
    num_experts: int, *, device: torch.device, dtype: torch.dtype
) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(dense, MoE) decoder layers of a reference-family model at a vanishing size."""
    from autoparallel.runtime import ReferenceMoETransformer, tiny_reference_spec

    spec = tiny_reference_spec(
        hidden_size=_TINY_HIDDEN, num_layers=2, num_experts=num_experts, top_k=2, vocab_size=64
    )
    model = ReferenceMoETransformer(spec, dtype=dtype).to(device)
    model.init_weights(seed=0)
    layers = model.model.layers
    return layers["0"], layers["1"]


def _fwd_bwd(
    layer: torch.nn.Module, *, device: torch.device, dtype: torch.dtype
) -> Callable[[], None]:
    hidden = torch.randn(
        1, _TINY_TOKENS, _TINY_HIDDEN, device=device, dtype=dtype, requires_grad=True
    )
    grad = torch.randn(1, _TINY_TOKENS, _TINY_HIDDEN, device=device, dtype=dtype)

    def call() -> None:
        layer(hidden).backward(grad)
        layer.zero_grad(set_to_none=True)
        hidden.grad = None

    return call


def layer_host_seconds(
    *, device: torch.device, dtype: torch.dtype, clock: str, warmup: int, repeats: int
) -> dict[str, float]:
    """``dense_layer_s``, ``moe_layer_s`` (without routed experts) and ``routed_expert_s``."""

    def seconds(layer: torch.nn.Module) -> float:
        call = _fwd_bwd(layer, device=device, dtype=dtype)
        return measure(
            call, device=device, warmup=warmup + 2, repeats=repeats, clock=clock
        ).median_s

    dense, few = _tiny_layers(2, device=device, dtype=dtype)
    _, many = _tiny_layers(_MANY_EXPERTS, device=device, dtype=dtype)
    dense_s, few_s, many_s = seconds(dense), seconds(few), seconds(many)
    per_expert = max((many_s - few_s) / (_MANY_EXPERTS - 2.0), 0.0)
    return {
        "dense_layer_s": dense_s,
        "moe_layer_s": max(few_s - 2.0 * per_expert, 0.0),
        "routed_expert_s": per_expert,
    }


def sharded_update_seconds(
    *,
    device: torch.device,
    dtype: torch.dtype,
    clock: str,
    warmup: int,
    repeats: int,
    count: int = 8,
    shape: tuple[int, int] = (256, 256),
) -> float:
    """Extra seconds per tensor-parallel weight per step (main-gradient accumulation + optimizer
    update) over plain tensors of the local shape (``shape``: the global weight, split on its
    first dimension); the slowest rank's, >= 0. Element-wise ops on
    a sharded DTensor communicate nothing: the extra is host dispatch, so the operator clock
    (thread CPU time for single-threaded CPU ranks) measures it."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    world = dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,))
    local = [
        torch.nn.Parameter(torch.randn(shape[0] // world, shape[1], device=device, dtype=dtype))
        for _ in range(count)
    ]
    sharded = [
        torch.nn.Parameter(
            distribute_tensor(torch.randn(shape, device=device, dtype=dtype), mesh, [Shard(0)])
        )
        for _ in range(count)
    ]
    timings = []
    for weights in (local, sharded):
        timings.append(
            _update_step_s(weights, device=device, clock=clock, warmup=warmup, repeats=repeats)
        )
    extra = torch.tensor([max(timings[1] - timings[0], 0.0) / count], dtype=torch.float64)
    dist.all_reduce(extra, op=dist.ReduceOp.MAX)
    return float(extra[0])


def _update_step_s(
    weights: list[torch.nn.Parameter],
    *,
    device: torch.device,
    clock: str,
    warmup: int,
    repeats: int,
) -> float:
    from profilers._training_run import MasterWeightAdam

    optimizer = MasterWeightAdam(weights, learning_rate=1e-4)
    grads = [torch.ones_like(w) for w in weights]

    def step() -> None:
        with torch.no_grad():
            for master, grad in zip(optimizer.masters, grads):
                master.grad.add_(grad)
        optimizer.step()

    dist.barrier()
    return measure(
        step, device=device, warmup=warmup + 1, repeats=repeats, min_sample_s=0.0, clock=clock
    ).median_s


def pipeline_micro_batch_seconds(*, device: torch.device, warmup: int, repeats: int) -> float:
    """Extra seconds per micro-batch and stage of a 1F1B schedule over every rank (one stage
    each, a tiny linear): the slope of step time from 2 to 8 micro-batches, less one forward
    and one backward send/recv of the boundary activation; the slowest rank's, >= 0."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    rank, world = dist.get_rank(), dist.get_world_size()
    shape = (1, _TINY_TOKENS, _TINY_HIDDEN)
    steps = {}
    for micro_batches in (2, 8):
        module = torch.nn.Linear(_TINY_HIDDEN, _TINY_HIDDEN, device=device)
        stage = PipelineStage(module, rank, world, device)
        schedule = Schedule1F1B(
            stage,
            n_microbatches=micro_batches,
            loss_fn=lambda out, target: (out - target).square().mean(),
        )
        batch = torch.randn((micro_batches,) + shape[1:], device=device)

        def step(schedule: Schedule1F1B = schedule, batch: torch.Tensor = batch) -> None:
            if rank == 0:
                schedule.step(batch)
            elif rank == world - 1:
                schedule.step(target=batch, losses=[])
            else:
                schedule.step()

        dist.barrier()
        steps[micro_batches] = measure(
            step, device=device, warmup=warmup + 1, repeats=repeats, min_sample_s=0.0, clock="wall"
        ).median_s
    slope = (steps[8] - steps[2]) / 6.0
    extra = torch.tensor(
        [max(slope - 2.0 * _send_recv_s(shape, device=device, repeats=repeats), 0.0)],
        dtype=torch.float64,
    )
    dist.all_reduce(extra, op=dist.ReduceOp.MAX)
    return float(extra[0])


def _send_recv_s(shape: tuple[int, ...], *, device: torch.device, repeats: int) -> float:
    """One-way time of the boundary activation between neighbouring ranks (half a round trip)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    buffer = torch.randn(shape, device=device)

    def ping() -> None:
        if rank % 2 == 0 and rank + 1 < world:
            dist.send(buffer, rank + 1)
            dist.recv(buffer, rank + 1)
        elif rank % 2 == 1:
            dist.recv(buffer, rank - 1)
            dist.send(buffer, rank - 1)

    dist.barrier()
    return (
        measure(
            ping, device=device, warmup=2, repeats=repeats, min_sample_s=0.0, clock="wall"
        ).median_s
        / 2.0
    )


def collective_sync_seconds(
    *, device: torch.device, dtype: torch.dtype, warmup: int, repeats: int
) -> float:
    """Extra wall seconds of an all-reduce (128 KiB) issued right after a GEMM, over the GEMM and
    the all-reduce timed apart: in a step, collectives sit between compute segments; the slowest
    rank's, >= 0."""
    x = torch.randn(128, 512, device=device, dtype=dtype)
    weight = torch.randn(256, 512, device=device, dtype=dtype)
    buffer = torch.zeros(2**16, device=device, dtype=dtype)

    def compute() -> None:
        torch.nn.functional.linear(x, weight)

    def reduce() -> None:
        dist.all_reduce(buffer)

    def both() -> None:
        compute()
        reduce()

    seconds = []
    for call in (compute, reduce, both):
        dist.barrier()
        seconds.append(
            measure(
                call,
                device=device,
                warmup=warmup + 3,
                repeats=max(repeats, 15),
                min_sample_s=0.0,
                clock="wall",
            ).median_s
        )
    extra = torch.tensor([max(seconds[2] - seconds[0] - seconds[1], 0.0)], dtype=torch.float64)
    dist.all_reduce(extra, op=dist.ReduceOp.MAX)
    return float(extra[0])


#: Operators of ``_EagerBlock.forward``, one kernel each.
EAGER_BLOCK_OPS = 6


class _EagerBlock(torch.nn.Module):
    """A decoder MLP block whose every op is one kernel (norm, up, SiLU, gate, down, residual)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(hidden)
        self.up = torch.nn.Linear(hidden, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, hidden, bias=False)
        self.act = torch.nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(self.norm(x))
        return x + self.down(self.act(h) * h)


def eager_op_host_seconds(
    *, device: torch.device, blocks: int = 16, warmup: int = 3, repeats: int = 9
) -> float:
    """Median host seconds per op of ``blocks`` tiny ``_EagerBlock`` forwards run eagerly for
    inference (module docstring). The device is idle when each sample starts and the host only
    enqueues: on an accelerator the kernels run behind it, each shorter than its launch."""
    stack = torch.nn.Sequential(*(_EagerBlock(_TINY_HIDDEN) for _ in range(blocks))).to(device)
    x = torch.randn(_TINY_TOKENS, _TINY_HIDDEN, device=device)
    samples = []
    with torch.inference_mode():
        for index in range(warmup + repeats):
            synchronize(device)
            start = time.perf_counter()
            stack(x)
            elapsed = time.perf_counter() - start
            if index >= warmup:
                samples.append(elapsed / (blocks * EAGER_BLOCK_OPS))
    synchronize(device)
    return sorted(samples)[len(samples) // 2]


def graph_kernel_floor_seconds(
    *, device: torch.device, blocks: int = 64, warmup: int = 3, repeats: int = 9
) -> float | None:
    """Median GPU seconds per kernel of ``blocks`` tiny ``_EagerBlock`` forwards captured in one
    CUDA graph and replayed (module docstring); None where the device is not a CUDA one."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    stack = torch.nn.Sequential(*(_EagerBlock(_TINY_HIDDEN) for _ in range(blocks))).to(device)
    x = torch.randn(1, _TINY_HIDDEN, device=device)
    with torch.inference_mode():
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(warmup):
                stack(x)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            stack(x)
        samples = []
        for index in range(warmup + repeats):
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            if index >= warmup:
                samples.append(start.elapsed_time(end) / 1e3 / (blocks * EAGER_BLOCK_OPS))
    return sorted(samples)[len(samples) // 2]
