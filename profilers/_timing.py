"""Device-agnostic timing: the current accelerator or the CPU, synchronized, median of repeats.

``torch.accelerator.current_accelerator()`` is ``None`` on a CPU-only machine; the device module
(``torch.get_device_module``) then is ``torch.cpu``, whose ``synchronize`` is a no-op. Kernels
on an accelerator run asynchronously, so every timed region is bracketed by a synchronize.

A call timed alone after an untimed preparation (``before_each``: a cache flush) is timed on an
accelerator by device events recorded on its stream around the call (``torch.Event``, any
backend): a wall clock around one synchronized call adds the host's launch and the synchronize's
round trip (15-50 us on a GPU: a 256^3 GEMM of about 5 us measured at 17 us per call on an
H200), which the cost model prices apart (``kernel_overhead_s``). The preparation's kernels are
still running when the start event is enqueued, so the device does not wait on the host there.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from topology.devices import current_device, device_memory_bytes, device_name
from topology.devices import synchronize_device as synchronize

__all__ = [
    "CLOCKS",
    "Timing",
    "cache_flusher",
    "current_device",
    "device_event_seconds",
    "device_memory_bytes",
    "device_name",
    "event_median_s",
    "measure",
    "synchronize",
]


CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}


@dataclass(frozen=True)
class Timing:
    """Seconds per call: median and the 10th/90th percentiles of ``repeats`` samples."""

    median_s: float
    p10_s: float
    p90_s: float
    repeats: int

    @property
    def spread(self) -> float:
        """Relative spread (p90 - p10) / median."""
        return (self.p90_s - self.p10_s) / self.median_s if self.median_s > 0 else 0.0

    def per_kernel(self, kernels: int) -> Timing:
        """Seconds per kernel of a call that runs ``kernels`` equal-sized ones."""
        return Timing(
            median_s=self.median_s / kernels,
            p10_s=self.p10_s / kernels,
            p90_s=self.p90_s / kernels,
            repeats=self.repeats,
        )


def _percentile(sorted_values: list[float], fraction: float) -> float:
    position = fraction * (len(sorted_values) - 1)
    low, high = math.floor(position), math.ceil(position)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def measure(
    fn: Callable[[], object],
    *,
    device: torch.device,
    warmup: int = 2,
    repeats: int = 5,
    min_sample_s: float = 2e-4,
    clock: str = "wall",
    before_each: Callable[[], object] | None = None,
) -> Timing:
    """Time ``fn``: ``warmup`` untimed calls, then ``repeats`` synchronized samples.

    A sample runs ``fn`` back to back enough times to last ``min_sample_s`` (timer resolution
    and a synchronize would otherwise dominate microsecond kernels) and reports seconds per call.
    ``clock="thread"`` counts the calling thread's CPU seconds instead of wall seconds: on a CPU
    shared with other jobs it measures the work of a single-threaded kernel, not its wait for a core
    (meaningless for accelerator kernels and for multi-threaded ones). ``before_each`` runs,
    untimed, before every call (e.g. ``cache_flusher``), and each sample is then one call.
    """
    if warmup < 0 or repeats < 1:
        raise ValueError(f"warmup ({warmup}) must be >= 0 and repeats ({repeats}) >= 1")
    if clock not in CLOCKS:
        raise ValueError(f"clock ({clock!r}) must be one of {sorted(CLOCKS)}")
    now = CLOCKS[clock]
    if before_each is not None:
        return _measure_each(
            fn, before_each, device=device, warmup=warmup, repeats=repeats, now=now
        )
    for _ in range(warmup):
        fn()
    synchronize(device)
    start = now()
    fn()
    synchronize(device)
    single = max(now() - start, 1e-9)
    inner = max(1, min(1000, math.ceil(min_sample_s / single)))
    samples = []
    for _ in range(repeats):
        synchronize(device)
        start = now()
        for _ in range(inner):
            fn()
        synchronize(device)
        samples.append(max(now() - start, 1e-9) / inner)
    samples.sort()
    return Timing(
        median_s=_percentile(samples, 0.5),
        p10_s=_percentile(samples, 0.1),
        p90_s=_percentile(samples, 0.9),
        repeats=repeats,
    )


def _summary(samples: list[float], repeats: int) -> Timing:
    samples = sorted(samples)
    return Timing(
        median_s=_percentile(samples, 0.5),
        p10_s=_percentile(samples, 0.1),
        p90_s=_percentile(samples, 0.9),
        repeats=repeats,
    )


def _measure_each(
    fn, before_each, *, device: torch.device, warmup: int, repeats: int, now
) -> Timing:
    for _ in range(warmup):
        before_each()
        fn()
    on_device = device.type != "cpu" and now is CLOCKS["wall"] and _has_timing_events(device)
    samples = []
    for _ in range(repeats):
        before_each()
        if on_device:
            samples.append(max(device_event_seconds(fn, device), 1e-9))
            continue
        synchronize(device)
        start = now()
        fn()
        synchronize(device)
        samples.append(max(now() - start, 1e-9))
    return _summary(samples, repeats)


def _has_timing_events(device: torch.device) -> bool:
    """Whether ``device``'s backend records timed events (``torch.Event``); a backend without
    them is timed by the wall clock around a synchronized call."""
    try:
        device_event_seconds(lambda: None, device)
    except (RuntimeError, NotImplementedError, ValueError, TypeError, AttributeError):
        return False
    return True


def device_event_seconds(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds ``fn``'s work takes on ``device``'s current stream: device events recorded around
    it (``torch.Event``, any accelerator backend), waited on."""
    start, end = (torch.Event(device=device, enable_timing=True) for _ in range(2))
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def event_median_s(
    fn: Callable[[], object], *, device: torch.device, warmup: int = 3, repeats: int = 10
) -> float:
    """Median of ``repeats`` ``device_event_seconds`` samples after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    return statistics.median(device_event_seconds(fn, device) for _ in range(repeats))


#: Bytes written between cold-cache calls: above any last-level cache (CPU L3, GPU L2), as
#: ``triton.testing.do_bench`` zeroes a 256 MB buffer before each run to flush the L2 cache.
CACHE_FLUSH_BYTES = 256 * 2**20


def cache_flusher(device: torch.device, nbytes: int = CACHE_FLUSH_BYTES) -> Callable[[], None]:
    """A call that evicts caches by writing ``nbytes`` on ``device``: kernels timed after it read
    their operands from memory, as a training step reads each weight once per pass."""
    buffer = torch.empty(max(nbytes // 4, 1), dtype=torch.float32, device=device)
    return lambda: buffer.fill_(1.0)
