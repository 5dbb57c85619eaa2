"""Timing primitives of the probe, one rank's side. torch is imported inside functions only.

Device-agnostic: the accelerator torch reports (``torch.accelerator.current_accelerator()``)
or the CPU, its default process-group backend (``dist.get_default_backend_for_device``), and
``time.perf_counter`` around the device module's ``synchronize`` where there is one. Every
communication waits with a timeout; a failure is diagnosed through the rendezvous store (each
surviving rank posts that it failed, then waits for the others) and raised as
``ProbeRankError`` naming the ranks that never answered.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from topology.devices import synchronize_device as synchronize


class ProbeRankError(RuntimeError):
    """A probe step failed because ``ranks`` did not answer (dead, hung or unreachable)."""

    def __init__(self, message: str, *, ranks: Sequence[int]) -> None:
        super().__init__(message)
        self.ranks = tuple(ranks)


@dataclass(frozen=True)
class Timing:
    """Median seconds over the repeats and their spread, ``(max - min) / median``."""

    median_s: float
    spread: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Timing:
        median = statistics.median(samples)
        return cls(
            median_s=median, spread=(max(samples) - min(samples)) / median if median > 0 else 0.0
        )


class RankMonitor:
    """Runs each communicating step with a timeout and names the ranks behind a failure."""

    #: Longest wait, past the operation timeout, for the other ranks to post a failure or a finish.
    #: Ranks blocked on the same step time out within about one timeout of each other; a few
    #: seconds more tell a stopped rank from a slow one without doubling the time to exit.
    DIAGNOSIS_LIMIT_S = 5.0

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        timeout_s: float,
        prefix: str,
        stop_silent_local_ranks: bool = True,
    ) -> None:
        self.rank, self.world_size, self.timeout_s, self.prefix = (
            rank,
            world_size,
            timeout_s,
            prefix,
        )
        self.stop_silent_local_ranks = stop_silent_local_ranks
        self._store = _default_store()
        if self._store is not None:
            self._store.set(
                f"{self.prefix}/process/{self.rank}", f"{socket.gethostname()}:{os.getpid()}"
            )

    @property
    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.timeout_s)

    def wait(self, work) -> None:
        """Wait for an async ``work`` at most ``timeout_s``."""
        work.wait(timeout=self.timeout)

    def run(self, label: str, step: Callable[[], object], *, peers: Sequence[int] | None = None):
        try:
            return step()
        except ProbeRankError:
            raise
        except Exception as error:  # any transport error becomes a diagnosis
            silent = self._diagnose(label)
            suspects = silent or [peer for peer in (peers or []) if peer != self.rank]
            cause = (
                f"{type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"
            )
            names = ", ".join(f"rank {peer}" for peer in suspects) or "an unidentified rank"
            if self.stop_silent_local_ranks and silent:
                self._stop_local(silent)
            raise ProbeRankError(
                f"probe step '{label}' failed on rank {self.rank}: {names} did not respond within "
                f"{self.timeout_s:g} s (dead, hung or unreachable). Cause seen: {cause}",
                ranks=suspects,
            ) from error

    def finished(self) -> None:
        if self._store is not None:
            self._store.set(f"{self.prefix}/finished/{self.rank}", "1")

    def _diagnose(self, label: str) -> list[int]:
        """Post this rank's failure, then wait (two timeouts, at most ``DIAGNOSIS_LIMIT_S``) for every other rank
        to post a failure or a finish; the ones that stay silent are the culprits."""
        if self._store is None:
            return []
        silent = None
        try:
            self._store.set(f"{self.prefix}/failed/{self.rank}", label)
            deadline = time.monotonic() + min(self.timeout_s * 2.0, self.DIAGNOSIS_LIMIT_S) + 0.5
            others = [peer for peer in range(self.world_size) if peer != self.rank]
            while True:
                silent = [peer for peer in others if not self._posted(peer)]
                if not silent or time.monotonic() > deadline:
                    return silent
                time.sleep(0.05)
        except Exception:  # the store is gone: its host (rank 0 under fork) exited
            # Keep what the last poll saw; with no poll at all, the store's host is the suspect.
            return silent if silent is not None else [0]

    def _stop_local(self, ranks: list[int]) -> None:
        """SIGKILL the silent ranks that run on this host: a stopped (SIGSTOP) or deadlocked rank
        never exits by itself, and a launcher such as torchrun waits for every rank, so the
        probe would never end. Its measurements are lost either way."""
        host = socket.gethostname()
        for peer in ranks:
            try:
                where = self._store.get(f"{self.prefix}/process/{peer}").decode()
            except Exception:  # the peer never registered, or the store is gone
                continue
            peer_host, _, pid = where.rpartition(":")
            if peer_host == host and pid.isdigit() and int(pid) != os.getpid():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid), signal.SIGKILL)

    def _posted(self, peer: int) -> bool:
        keys = [f"{self.prefix}/failed/{peer}", f"{self.prefix}/finished/{peer}"]
        return any(self._store.check([key]) for key in keys)


def _default_store():
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except Exception:  # no store: failures name the peer only
        return None


def time_pair(
    *,
    monitor: RankMonitor,
    sender: int,
    receiver: int,
    payload,
    token,
    repeats: int,
    warmup: int,
    device,
    before_send: Callable[[int, int], None] | None = None,
) -> list[float]:
    """Seconds per one-way transfer of ``payload`` from ``sender`` to ``receiver``, timed on
    the sender from the receiver's ready token to its acknowledgement (one small round trip more)."""
    import torch.distributed as dist

    samples = []
    me = monitor.rank
    for index in range(warmup + repeats):
        if me == receiver:
            monitor.wait(dist.isend(token, sender))
            monitor.wait(dist.irecv(payload, sender))
            synchronize(device)
            monitor.wait(dist.isend(token, sender))
            continue
        monitor.wait(dist.irecv(token, receiver))
        start = time.perf_counter()
        if before_send is not None:
            before_send(sender, receiver)
        monitor.wait(dist.isend(payload, receiver))
        monitor.wait(dist.irecv(token, receiver))
        synchronize(device)
        if index >= warmup:
            samples.append(time.perf_counter() - start)
    return samples


def time_ping(
    *, monitor: RankMonitor, sender: int, receiver: int, token, repeats: int, warmup: int, device
) -> list[float]:
    """Half round-trip seconds of a one-element message, timed on ``sender`` (the link's latency)."""
    import torch.distributed as dist

    samples = []
    for index in range(warmup + repeats):
        if monitor.rank == receiver:
            monitor.wait(dist.irecv(token, sender))
            monitor.wait(dist.isend(token, sender))
            continue
        start = time.perf_counter()
        monitor.wait(dist.isend(token, receiver))
        monitor.wait(dist.irecv(token, receiver))
        synchronize(device)
        if index >= warmup:
            samples.append((time.perf_counter() - start) / 2.0)
    return samples


def time_collective(
    *,
    monitor: RankMonitor,
    op: str,
    group,
    group_size: int,
    message_bytes: int,
    repeats: int,
    warmup: int,
    device,
) -> list[float]:
    """Seconds per ``op`` on ``group`` moving ``message_bytes`` (nccl-tests "size")."""
    import torch
    import torch.distributed as dist

    elements = max(group_size, message_bytes // 4 // group_size * group_size)
    full = torch.ones(elements, dtype=torch.float32, device=device)
    shard = torch.ones(elements // group_size, dtype=torch.float32, device=device)
    launch = {
        "all_reduce": lambda: dist.all_reduce(full, group=group, async_op=True),
        "all_gather": lambda: dist.all_gather_into_tensor(full, shard, group=group, async_op=True),
        "reduce_scatter": lambda: _reduce_scatter(shard, full, group),
        "all_to_all": lambda: dist.all_to_all_single(
            torch.empty_like(full), full, group=group, async_op=True
        ),
        "broadcast": lambda: dist.broadcast(
            full, src=dist.get_global_rank(group, 0), group=group, async_op=True
        ),
    }[op]
    samples = []
    for index in range(warmup + repeats):
        synchronize(device)
        start = time.perf_counter()
        monitor.wait(launch())
        synchronize(device)
        if index >= warmup:
            samples.append(time.perf_counter() - start)
    return samples


def _reduce_scatter(output, full, group):
    import torch.distributed as dist

    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return scatter(output, full, group=group, async_op=True)


def time_matmul(
    *, dtype_name: str, dim: int, repeats: int, warmup: int, device
) -> tuple[list[float], float]:
    """Seconds per ``dim``-cube matmul in ``dtype_name`` and its FLOPs (``2 dim^3``)."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    a = torch.randn(dim, dim, device=device).to(dtype)
    b = torch.randn(dim, dim, device=device).to(dtype)
    samples = []
    for index in range(warmup + repeats):
        synchronize(device)
        start = time.perf_counter()
        torch.matmul(a, b)
        synchronize(device)
        if index >= warmup:
            samples.append(time.perf_counter() - start)
    return samples, 2.0 * dim**3


def time_copy(*, num_bytes: int, repeats: int, warmup: int, device) -> tuple[list[float], float]:
    """Seconds per device-memory copy of ``num_bytes`` and the bytes moved (read + write)."""
    import torch

    source = torch.ones(max(1, num_bytes // 4), dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    samples = []
    for index in range(warmup + repeats):
        synchronize(device)
        start = time.perf_counter()
        target.copy_(source)
        synchronize(device)
        if index >= warmup:
            samples.append(time.perf_counter() - start)
    return samples, 2.0 * source.numel() * 4
