"""The bytes per logit torchtitan's loss holds, measured on torch: its eager
``cross_entropy(pred.flatten(0, 1).float(), labels)`` on one rank's logits and the same loss
on vocab-sharded DTensor logits under ``loss_parallel`` (tp > 1), on forked gloo ranks, against
``FrameworkProfile.loss_bytes_per_logit`` and ``loss_parallel_bytes_per_logit``."""

from __future__ import annotations

import time

import pytest

from autoparallel.testing import run_ranks
from cost_model._frameworks import framework_profile

pytestmark = pytest.mark.distributed

ROWS, VOCAB = 1024, 4096


def _peak_bytes_per_local_logit(rank: int, world_size: int, parallel: bool) -> float:
    """Peak bytes the loss's forward and backward allocate beyond the bf16 logits they start
    from, per logit of the rank's slice (torch.profiler's memory events over one step)."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import loss_parallel
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    logits = torch.randn(1, ROWS, VOCAB, dtype=torch.bfloat16)
    labels = torch.randint(0, VOCAB, (1, ROWS))
    if parallel:
        pred = distribute_tensor(logits, mesh, [Shard(-1)]).requires_grad_()
    else:  # one rank's vocabulary slice, as torchtitan's loss at tp 1 sees its whole vocabulary
        pred = logits[..., : VOCAB // world_size].contiguous().requires_grad_()
        labels = labels % (VOCAB // world_size)

    def step() -> None:
        if parallel:
            with loss_parallel():
                F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1)).backward()
        else:
            F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1)).backward()
        pred.grad = None

    step()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        start = time.time_ns()
        step()
        end = time.time_ns()
    events = sorted(
        (event.start_ns(), event.nbytes())
        for event in prof.profiler.kineto_results.events()
        if event.name() == "[memory]"
    )
    live = peak = 0
    for t, nbytes in events:
        live += nbytes
        if start <= t <= end:
            peak = max(peak, live)
    return peak / (ROWS * VOCAB // world_size)


def test_the_loss_holds_what_the_torchtitan_profile_prices_per_logit() -> None:
    """Eager: the fp32 log-softmax output, the incoming and the outgoing gradient, 12 bytes per
    logit; under loss_parallel its backward also builds zeros_like(x) + exp(x), 16 (measured
    12.0 and 16.01 at these sizes, torch 2.13)."""
    profile = framework_profile("torchtitan")
    single = run_ranks(_peak_bytes_per_local_logit, 2, args=(False,), timeout_s=120)
    parallel = run_ranks(_peak_bytes_per_local_logit, 2, args=(True,), timeout_s=120)
    for measured in single:
        assert measured == pytest.approx(profile.loss_bytes_per_logit, rel=0.02)
    for measured in parallel:
        assert measured == pytest.approx(profile.loss_parallel_bytes_per_logit, rel=0.02)
