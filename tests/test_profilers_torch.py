"""Operator, collective and step profilers with torch on this machine (tiny grids; gloo ranks)."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from torch import nn

from autoparallel.cli import main as cli_main
from autoparallel.testing import run_ranks
from profilers import (
    ProfileGrid,
    StepProfiler,
    launch_profile,
    live_tensor_bytes,
    measure,
    profile_hardware,
)
from topology import HardwareSpec, load_hardware_profile

TINY = ProfileGrid.preset("tiny")


def test_measure_reports_median_of_synchronized_samples():
    timing = measure(lambda: time.sleep(0.002), device=torch.device("cpu"), warmup=1, repeats=5)
    assert 0.0018 < timing.median_s < 0.02 and timing.p10_s <= timing.median_s <= timing.p90_s
    assert timing.repeats == 5 and timing.spread >= 0
    with pytest.raises(ValueError, match="repeats"):
        measure(lambda: None, device=torch.device("cpu"), repeats=0)
    # The thread clock counts CPU work: a sleeping thread does none.
    asleep = measure(
        lambda: time.sleep(0.002), device=torch.device("cpu"), warmup=0, repeats=3, clock="thread"
    )
    assert asleep.median_s < 0.001
    with pytest.raises(ValueError, match="clock .'sundial'"):
        measure(lambda: None, device=torch.device("cpu"), clock="sundial")


def test_cold_cache_measurement_flushes_before_every_untimed_call():
    from profilers._timing import cache_flusher

    calls, flushes = [], []
    flush = cache_flusher(torch.device("cpu"), 1 << 20)
    timing = measure(
        lambda: calls.append(1),
        device=torch.device("cpu"),
        warmup=2,
        repeats=5,
        before_each=lambda: (flushes.append(1), flush()),
    )
    assert (
        len(calls) == len(flushes) == 7 and timing.repeats == 5
    )  # one call per sample, none batched
    # The flush is not timed: a slow flush before a no-op call leaves the call's time tiny.
    slow = measure(
        lambda: None,
        device=torch.device("cpu"),
        warmup=0,
        repeats=3,
        before_each=lambda: time.sleep(0.01),
    )
    assert slow.median_s < 0.005


def test_grid_rejects_unknown_names():
    with pytest.raises(ValueError, match="dtypes entry .'int3'"):
        ProfileGrid(dtypes=("fp32", "int3"))
    with pytest.raises(ValueError, match="grid .'huge'"):
        ProfileGrid.preset("huge")
    with pytest.raises(ValueError, match="extra"):
        ProfileGrid(gemm_size=(1,))
    with pytest.raises(ValueError, match=r"sharded_linear_widths entry \(0\) must be > 0"):
        ProfileGrid(sharded_linear_widths=(64, 0))
    with pytest.raises(ValueError, match="collective_bytes must list at least one size"):
        ProfileGrid(collective_bytes=())


def test_single_process_profile_has_every_operator_curve():
    profile = profile_hardware(grid=TINY)
    assert profile.device_type == "cpu" and profile.collectives == {}
    assert set(profile.attention) == set(profile.grouped_gemm) == {"fp32", "bf16"}
    # per-tensor float8 GEMMs (torch._scaled_mm, which this CPU build runs) make their own curve
    assert set(profile.gemm) == {"fp32", "bf16", "fp8"}
    assert profile.gemm["fp8"].labels[0].startswith("m=n=k=16 (x W^T, float8_e4m3fn")
    gemm = profile.gemm["fp32"]
    # One GEMM's work per point (the mean of its 3 layouts), the size the cost model asks about.
    assert gemm.work == (2.0 * 16**3, 2.0 * 64**3, 2.0 * 128**3) and all(
        s > 0 for s in gemm.seconds
    )
    assert profile.memory.labels[0].startswith("add") and profile.norm is not None
    assert profile.kernel_overhead_s > 0 and profile.provenance.startswith("measured")
    spec = HardwareSpec.from_profile(profile)
    assert 0 < float(spec.gemm_efficiency(gemm.work[0], "fp32")) <= 1.0
    # Eager inference dispatch per op of a tiny block: host microseconds, read by the serving model.
    assert 0.0 < profile.eager_op_host_s < 1e-3 and spec.eager_op_host_s == profile.eager_op_host_s
    assert profile.norm.labels[0].startswith("runtime RMSNorm fwd+bwd")
    # The runtime's master-weight AdamW: 30 bytes per parameter; accumulation into main grads: 10.
    assert profile.optimizer.work == (2**10 * 30.0, 2**14 * 30.0)
    assert profile.gradient_accumulation.work == (2**10 * 10.0, 2**14 * 10.0)
    assert (
        profile.optimizer.seconds[1] > profile.gradient_accumulation.seconds[1]
    )  # 10+ passes against one
    host = profile.host
    assert (
        host.dense_layer_s > 0 and host.moe_layer_s > 0
    )  # a decoder layer costs host time at any size
    assert (
        host.sharded_parameter_update_s == host.pipeline_micro_batch_s == 0.0
    )  # no ranks, not measured


def _profile_rank(rank: int, world_size: int):
    return profile_hardware(grid=TINY)


@pytest.mark.distributed
def test_two_ranks_measure_collectives_and_agree():
    first, second = run_ranks(_profile_rank, 2, timeout_s=120)
    assert first == second  # every rank returns the reduced profile
    assert set(first.collectives) == {"all_reduce", "send_recv"}
    assert first.sharded_module_overhead_s > 0  # DTensor dispatch costs host time on every rank
    assert (
        len(first.sharded_linear.work) == 4
        and first.sharded_module_overhead_s in first.sharded_linear.seconds
    )
    assert list(first.sharded_linear.seconds) == sorted(
        first.sharded_linear.seconds
    )  # running max over sizes
    assert first.operator_clock == "thread"  # one intra-op thread per rank on a CPU
    assert first.collectives["all_reduce"][2].work == (4096.0, 65536.0)
    assert first.host.sharded_parameter_update_s > 0  # a DTensor update dispatches through DTensor
    assert (
        first.host.pipeline_micro_batch_s >= 0
        and first.host.collective_sync_s >= 0
        and first.optimizer is not None
    )


@pytest.mark.distributed
def test_cli_profile_writes_a_loadable_profile(tmp_path, capsys):
    path = tmp_path / "cpu-profile.json"
    command = [
        "profile",
        "--nproc",
        "2",
        "--grid",
        "tiny",
        "--output",
        str(path),
        "--compare-preset",
        "cpu-loopback",
    ]
    assert cli_main(command) == 0
    assert "measured / peak" in capsys.readouterr().out
    profile = load_hardware_profile(path, expected_device_type="cpu")
    assert profile.collectives["send_recv"][2].seconds[0] > 0
    assert "2 cpu rank(s), backend gloo" in profile.provenance
    assert launch_profile(grid=TINY).device_type == "cpu"  # one process: no collectives
    with pytest.raises(ValueError, match="num_processes"):
        launch_profile(grid=TINY, num_processes=0)


class _Router(nn.Linear):
    def forward(self, x):
        return self.weight.new_ones(1), (x @ self.weight.T).topk(2, dim=-1).indices


class _Toy(nn.Module):
    def __init__(self, width: int = 32, experts: int = 4) -> None:
        super().__init__()
        self.gate = _Router(width, experts, bias=False)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        self.gate(x)
        return self.down(torch.relu(self.up(x)))


def _train(model, optimizer, profiler, x, *, steps: int, reduce: bool = False) -> None:
    def one_step():
        with profiler.phase("forward"):
            loss = model(x).square().mean()
        with profiler.phase("backward"):
            loss.backward()
            if reduce:
                for parameter in model.parameters():
                    if parameter.grad is not None:  # the router is not on the loss path
                        dist.all_reduce(parameter.grad)
        with profiler.phase("optimizer"):
            optimizer.step()
            optimizer.zero_grad()

    for _ in range(steps):
        with profiler.step():
            one_step()
    with profiler.profiled_step():
        one_step()


def test_step_profiler_times_phases_counts_experts_and_peak_memory():
    torch.manual_seed(0)
    model, x = _Toy(), torch.randn(256, 32)
    optimizer = torch.optim.AdamW(model.parameters())
    with StepProfiler(modules=[model], optimizers=[optimizer]) as profiler:
        _train(model, optimizer, profiler, x, steps=3)
        report = profiler.report()
    assert len(report.step_times_s) == 3 and set(report.phase_times_s) == {
        "forward",
        "backward",
        "optimizer",
    }
    assert report.median_phase_s("forward") < report.median_step_time_s
    counts = report.expert_load["gate"]
    assert len(counts) == 4 and sum(counts) == 4 * 256 * 2  # 3 timed + 1 profiled step, top-2
    parameter_bytes = sum(p.numel() * 4 for p in model.parameters())
    trained = [
        p for p in model.parameters() if p is not model.gate.weight
    ]  # the router gets no gradient
    states = sum(
        2 * p.numel() * 4 + 4 for p in trained
    )  # AdamW exp_avg, exp_avg_sq and a float32 step
    assert report.static_memory_bytes == parameter_bytes + states
    activations = 256 * 4 * 32 * 4  # the up projection's output alone
    assert report.peak_memory_bytes >= report.static_memory_bytes + activations
    assert report.comm_time_s == 0.0 and report.to_dict()["median_step_time_s"] > 0
    assert not profiler._hooks  # removed on exit
    assert live_tensor_bytes(modules=[model]) == parameter_bytes


def _comm_rank(rank: int, world_size: int):
    torch.manual_seed(rank)
    model, x = _Toy(width=64), torch.randn(128, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    profiler = StepProfiler(modules=[model], optimizers=[optimizer])
    _train(model, optimizer, profiler, x, steps=2, reduce=True)
    return profiler.report()


@pytest.mark.distributed
def test_step_profiler_measures_communication_wait():
    reports = run_ranks(_comm_rank, 2, timeout_s=120)
    for report in reports:
        assert 0 < report.comm_time_s < report.profiled_step_time_s


def test_a_backend_without_timed_events_is_timed_by_the_wall_clock():
    """Cold-cache calls on an accelerator are timed by device events; the CPU backend records
    none (``torch.Event`` has no timing there), so its calls keep the wall clock."""
    from profilers._timing import _has_timing_events, measure

    cpu = torch.device("cpu")
    assert not _has_timing_events(cpu)
    timing = measure(lambda: torch.ones(256).sum(), device=cpu, repeats=3, before_each=lambda: None)
    assert timing.median_s > 0


def test_a_kernel_the_device_lacks_is_left_out_of_the_profile_not_fatal(monkeypatch):
    """An optional point (the fp8 GEMMs) whose build raises on this device is skipped: the
    profile has no such curve and the estimate keeps the operator fit for that dtype; a required
    point that raises still stops the profile."""
    import profilers._ops as ops

    def missing(device):
        raise RuntimeError("no float8 GEMM kernel on this device")

    real = ops._fp8_gemm_point

    def lacking(size: int):
        point = real(size)
        return ops.Point(point.family, point.key, point.label, point.work, missing, optional=True)

    monkeypatch.setattr(ops, "_fp8_gemm_point", lacking)
    profile = profile_hardware(grid=TINY)
    assert "fp8" not in profile.gemm and {"fp32", "bf16"} <= set(profile.gemm)
    monkeypatch.setattr(
        ops,
        "_fp8_gemm_point",
        lambda size: ops.Point("gemm", "fp8", "required", 1.0, missing, optional=False),
    )
    with pytest.raises(RuntimeError, match="no float8 GEMM kernel"):
        profile_hardware(grid=TINY)
