"""``StepProfiler``: wall time per training step and phase, communication wait, peak memory and
per-layer expert load of a model (typically one under ``autoparallel.apply_plan``).

Peak memory is the allocator's view, comparable with the cost model's memory breakdown: on an
accelerator the device allocator's ``max_memory_allocated`` since the step began; on cpu the
tensor bytes alive before the step (parameters, gradients, optimizer states: unique storages)
plus the largest rise of tensor memory the torch profiler records during one profiled step.
The process RSS rise is reported beside it (it also counts the Python heap and libraries).
Communication wait is the union of the intervals of collective and point-to-point operators in
the profiled step (gloo collectives block the caller, so on cpu this is their full time).
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from profilers._timing import current_device, synchronize

_COMM_MARKERS = (
    "c10d",
    "gloo",
    "nccl",
    "allreduce",
    "all_reduce",
    "allgather",
    "all_gather",
    "reduce_scatter",
    "reducescatter",
    "all_to_all",
    "alltoall",
    "broadcast",
    "send",
    "recv",
    "wait_tensor",
)
DEFAULT_ROUTER_PATTERNS = ("*router", "*.gate", "gate")


@dataclass(frozen=True)
class StepReport:
    """Measurements of the steps run under one ``StepProfiler`` (all times in seconds)."""

    device_type: str
    step_times_s: tuple[float, ...]
    phase_times_s: dict[str, tuple[float, ...]]
    comm_time_s: float | None
    profiled_step_time_s: float | None
    static_memory_bytes: float
    peak_memory_bytes: float | None
    peak_rss_delta_bytes: float | None
    expert_load: dict[str, tuple[int, ...]] = field(default_factory=dict)
    cpu_times_s: tuple[float, ...] = ()
    phase_cpu_times_s: dict[str, tuple[float, ...]] = field(default_factory=dict)

    @property
    def median_cpu_time_s(self) -> float | None:
        """Median process CPU seconds per step: the work done, whatever else shares the cores."""
        return statistics.median(self.cpu_times_s) if self.cpu_times_s else None

    @property
    def median_step_time_s(self) -> float:
        if not self.step_times_s:
            raise ValueError("step_times_s (()) is empty: no step was timed")
        return statistics.median(self.step_times_s)

    def median_phase_s(self, phase: str, *, clock: str = "wall") -> float:
        """Median seconds of ``phase``: wall, or process CPU seconds (``clock="cpu"``)."""
        return statistics.median(
            (self.phase_cpu_times_s if clock == "cpu" else self.phase_times_s)[phase]
        )

    def to_dict(self) -> dict:
        return {
            "device_type": self.device_type,
            "median_step_time_s": self.median_step_time_s if self.step_times_s else None,
            "step_times_s": list(self.step_times_s),
            "median_cpu_time_s": self.median_cpu_time_s,
            "median_phase_times_s": {
                name: statistics.median(v) for name, v in self.phase_times_s.items()
            },
            "comm_time_s": self.comm_time_s,
            "profiled_step_time_s": self.profiled_step_time_s,
            "static_memory_bytes": self.static_memory_bytes,
            "peak_memory_bytes": self.peak_memory_bytes,
            "peak_rss_delta_bytes": self.peak_rss_delta_bytes,
            "expert_load": {name: list(counts) for name, counts in self.expert_load.items()},
        }


def _rss_bytes() -> float:
    with open("/proc/self/statm") as handle:
        return float(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _RssSampler:
    """Samples the process RSS every ``interval_s`` in a thread; keeps the maximum."""

    def __init__(self, interval_s: float = 5e-3) -> None:
        self.interval_s, self.peak, self._stop = interval_s, 0.0, threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _RssSampler:
        if os.path.exists("/proc/self/statm"):
            self.peak = _rss_bytes()
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, _rss_bytes())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self.peak = max(self.peak, _rss_bytes())


def live_tensor_bytes(
    *, modules: Iterable[nn.Module], optimizers: Iterable[torch.optim.Optimizer] = ()
) -> float:
    """Bytes of the unique storages of parameters, gradients, buffers, the optimizers' own
    parameters (master weights) and their gradients, and optimizer states."""
    seen: dict[int, int] = {}

    def add(tensor) -> None:
        local = getattr(tensor, "_local_tensor", tensor)  # a DTensor counts its local shard
        if isinstance(local, torch.Tensor) and local.device.type != "meta":
            storage = local.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()

    for module in modules:
        for tensor in list(module.parameters()) + list(module.buffers()):
            add(tensor)
            if tensor.grad is not None:
                add(tensor.grad)
    for optimizer in optimizers:
        for group in optimizer.param_groups:  # master weights (mixed precision) and their grads
            for tensor in group["params"]:
                add(tensor)
                if tensor.grad is not None:
                    add(tensor.grad)
        for state in optimizer.state.values():
            for value in state.values():
                add(value)
    return float(sum(seen.values()))


def _is_comm(name: str) -> bool:
    lowered = name.lower()
    return any(marker in lowered for marker in _COMM_MARKERS)


def _union_seconds(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total * 1e-6  # the profiler reports microseconds


def _peak_rise_bytes(events) -> float:
    """Largest rise of the running sum of per-operator self memory (allocations minus frees)."""
    running = peak = 0.0
    for event in sorted(events, key=lambda e: e.time_range.start):
        running += event.self_cpu_memory_usage if hasattr(event, "self_cpu_memory_usage") else 0
        peak = max(peak, running)
    return peak


class StepProfiler:
    """Time training steps and their phases; profile one step for communication and memory.

    Usage::

        profiler = StepProfiler(modules=[model], optimizers=[optimizer])
        for _ in range(steps):
            with profiler.step():
                with profiler.phase("forward"):
                    loss = model(batch)
                ...
        with profiler.profiled_step():  # one extra step under torch.profiler
            ...
        report = profiler.report()

    Forward hooks on the router modules (names matching ``router_patterns``; a router returns a
    tensor of integer expert indices, alone or in a tuple) count tokens per expert. The hooks are
    removed by ``close()`` (or leaving a ``with StepProfiler(...)`` block). Not thread-safe.
    """

    def __init__(
        self,
        *,
        modules: Iterable[nn.Module],
        optimizers: Iterable[torch.optim.Optimizer] = (),
        router_patterns: tuple[str, ...] = DEFAULT_ROUTER_PATTERNS,
        device: torch.device | None = None,
    ) -> None:
        self.modules, self.optimizers = list(modules), list(optimizers)
        self.device = device or current_device()
        self._steps: list[float] = []
        self._cpu: list[float] = []
        self._phases: dict[str, list[float]] = defaultdict(list)
        self._phase_cpu: dict[str, list[float]] = defaultdict(list)
        self._load: dict[str, torch.Tensor] = {}
        self._comm_s: float | None = None
        self._profiled_s: float | None = None
        self._static = 0.0
        self._peak: float | None = None
        self._rss_delta: float | None = None
        self._rss_base = _rss_bytes() if os.path.exists("/proc/self/statm") else None
        self._hooks = [
            module.register_forward_hook(self._router_hook(name))
            for root in self.modules
            for name, module in root.named_modules()
            if any(fnmatch.fnmatchcase(name, pattern) for pattern in router_patterns)
        ]

    def __enter__(self) -> StepProfiler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def _router_hook(self, name: str):
        def hook(module: nn.Module, inputs, output) -> None:
            outputs = output if isinstance(output, (tuple, list)) else (output,)
            indices = next(
                (t for t in outputs if isinstance(t, torch.Tensor) and not t.is_floating_point()),
                None,
            )
            if indices is None:
                return
            indices = (
                getattr(indices, "_local_tensor", indices)
                .detach()
                .reshape(-1)
                .to("cpu", torch.int64)
            )
            declared = getattr(module, "num_experts", 0) or getattr(module, "out_features", 0)
            num_experts = int(declared or int(indices.max()) + 1)
            counts = torch.bincount(indices, minlength=num_experts)
            previous = self._load.get(name)
            self._load[name] = counts if previous is None else previous + counts[: len(previous)]

        return hook

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time one phase (forward, backward, optimizer, ...) of the current step."""
        synchronize(self.device)
        start, cpu_start = time.perf_counter(), time.process_time()
        yield
        synchronize(self.device)
        self._phases[name].append(time.perf_counter() - start)
        self._phase_cpu[name].append(time.process_time() - cpu_start)

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Time one whole step; on an accelerator, track its peak memory. (The process RSS is
        sampled in ``profiled_step`` only: a sampling thread competes for the GIL and, when every
        core runs a rank, for a core, and would slow down the steps it times.)"""
        self._reset_device_peak()
        synchronize(self.device)
        start, cpu_start = time.perf_counter(), time.process_time()
        yield
        synchronize(self.device)
        self._steps.append(time.perf_counter() - start)
        self._cpu.append(time.process_time() - cpu_start)
        self._note_device_peak()

    @contextlib.contextmanager
    def profiled_step(self) -> Iterator[None]:
        """Run one step under ``torch.profiler``: communication wait and (on cpu) peak tensor
        memory. Its time is reported apart: the profiler slows the step down."""
        from torch.profiler import ProfilerActivity, profile

        self._static = live_tensor_bytes(modules=self.modules, optimizers=self.optimizers)
        synchronize(self.device)
        start = time.perf_counter()
        with (
            _RssSampler() as sampler,
            profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof,
        ):
            yield
            synchronize(self.device)
        self._profiled_s = time.perf_counter() - start
        self._note_rss(sampler.peak)
        events = list(prof.events())
        self._comm_s = _union_seconds(
            [(e.time_range.start, e.time_range.end) for e in events if _is_comm(e.name)]
        )
        if self.device.type == "cpu":
            self._peak = max(self._peak or 0.0, self._static + _peak_rise_bytes(events))

    def _reset_device_peak(self) -> None:
        if self.device.type != "cpu":
            module = torch.get_device_module(self.device)
            module.reset_peak_memory_stats()

    def _note_device_peak(self) -> None:
        if self.device.type != "cpu":
            peak = float(torch.get_device_module(self.device).max_memory_allocated())
            self._peak = max(self._peak or 0.0, peak)

    def _note_rss(self, peak_rss: float) -> None:
        if self._rss_base is not None and peak_rss:
            self._rss_delta = max(self._rss_delta or 0.0, peak_rss - self._rss_base)

    def report(self) -> StepReport:
        return StepReport(
            device_type=self.device.type,
            step_times_s=tuple(self._steps),
            phase_times_s={name: tuple(times) for name, times in self._phases.items()},
            comm_time_s=self._comm_s,
            profiled_step_time_s=self._profiled_s,
            static_memory_bytes=self._static,
            peak_memory_bytes=self._peak,
            peak_rss_delta_bytes=self._rss_delta,
            expert_load={
                name: tuple(int(c) for c in counts) for name, counts in self._load.items()
            },
            cpu_times_s=tuple(self._cpu),
            phase_cpu_times_s={name: tuple(times) for name, times in self._phase_cpu.items()},
        )


def merge_reports(reports: list[StepReport]) -> StepReport:
    """One report from several runs of the same step (rounds interleaved with other work, so
    that a burst of load on a shared machine hits some samples, not one run): times are pooled
    (medians are then over every step), memory peaks are the largest, expert counts are summed."""
    if not reports:
        raise ValueError("reports ([]) must hold at least one StepReport")

    def pooled(name: str) -> dict[str, tuple[float, ...]]:
        keys = dict.fromkeys(key for report in reports for key in getattr(report, name))
        return {
            key: tuple(v for report in reports for v in getattr(report, name).get(key, ()))
            for key in keys
        }

    def largest(values) -> float | None:
        present = [v for v in values if v is not None]
        return max(present) if present else None

    load: dict[str, tuple[int, ...]] = {}
    for report in reports:
        for layer, counts in report.expert_load.items():
            previous = load.get(layer, (0,) * len(counts))
            load[layer] = tuple(a + b for a, b in zip(previous, counts))
    first = reports[0]
    return StepReport(
        device_type=first.device_type,
        step_times_s=tuple(t for r in reports for t in r.step_times_s),
        phase_times_s=pooled("phase_times_s"),
        comm_time_s=largest(r.comm_time_s for r in reports),
        profiled_step_time_s=largest(r.profiled_step_time_s for r in reports),
        static_memory_bytes=max(r.static_memory_bytes for r in reports),
        peak_memory_bytes=largest(r.peak_memory_bytes for r in reports),
        peak_rss_delta_bytes=largest(r.peak_rss_delta_bytes for r in reports),
        expert_load=load,
        cpu_times_s=tuple(t for r in reports for t in r.cpu_times_s),
        phase_cpu_times_s=pooled("phase_cpu_times_s"),
    )
