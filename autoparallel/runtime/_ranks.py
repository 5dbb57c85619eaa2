"""Fork ``world_size`` ranks, run a function in each under a gloo process group, collect results.

Habits from measuring torch.distributed on small CPU machines: fork (0.05-0.25 s per launch,
versus seconds for spawn/torchrun) with the heavy torch modules imported in the parent first;
one thread per rank; a barrier before ``destroy_process_group``; each rank's traceback written
to a file so the first real error is reported instead of gloo's "Connection closed by peer";
a deadline that kills every rank by PID. Rank 0 binds the rendezvous store to a port the OS
assigns at that moment and hands it to the other ranks (``rendezvous_store``): a port chosen
beforehand and released (``free_port``) can be taken by another process in between, and then
rank 0 fails with EADDRINUSE while the others wait out their connect timeout.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

_PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.distributed.tensor",
    "torch.distributed.tensor.parallel",
    "torch.distributed.pipelining",
    "torch.distributed.fsdp",
    "torch.distributed.checkpoint",
    "torch._dynamo",
)


class RankFailure(RuntimeError):
    """One or more ranks failed or timed out. ``errors`` maps rank -> traceback text."""

    def __init__(self, errors: dict[int, str], timed_out: bool = False) -> None:
        self.errors = errors
        self.timed_out = timed_out
        first = _first_real_error(errors)
        head = "ranks timed out" if timed_out else "rank failed"
        super().__init__(f"{head}: {sorted(errors)}\n{first}")


def _first_real_error(errors: dict[int, str]) -> str:
    for rank in sorted(errors):
        if (
            "Connection closed by peer" not in errors[rank]
            and "Connection reset" not in errors[rank]
        ):
            return f"[rank {rank}] {errors[rank]}"
    return "" if not errors else f"[rank {min(errors)}] {errors[min(errors)]}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rendezvous_store(
    rank: int,
    world_size: int,
    *,
    timeout_s: float,
    publish: Callable[[int], None],
    lookup: Callable[[], int | None],
    host: str = "127.0.0.1",
):
    """The ``TCPStore`` of a process group's rendezvous: rank 0 serves it on a port the OS picks
    when it binds (no window in which another process can take it) and ``publish``es that port;
    the other ranks poll ``lookup`` until it returns the port (or ``timeout_s`` passes) and
    connect to it."""
    import datetime

    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    if rank == 0:
        store = dist.TCPStore(host, 0, world_size, True, timeout=timeout, wait_for_workers=False)
        publish(store.port)
        return store
    deadline = time.monotonic() + timeout_s
    port = lookup()
    while port is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: rank 0 published no rendezvous port in {timeout_s} s")
        time.sleep(0.005)
        port = lookup()
    return dist.TCPStore(host, port, world_size, False, timeout=timeout)


def _publish_port(folder: Path, port: int) -> None:
    """Write ``port`` to ``folder/port`` atomically (a reader never sees a partial number)."""
    partial = folder / "port.partial"
    partial.write_text(str(port))
    partial.rename(folder / "port")


def _read_port(folder: Path) -> int | None:
    path = folder / "port"
    return int(path.read_text()) if path.exists() else None


def preload_torch() -> None:
    """Import torch's distributed stack once in the parent so forked ranks start warm."""
    import importlib

    for name in _PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # an older torch without one of the optional modules
            pass


def _child(
    rank: int,
    world_size: int,
    folder: Path,
    fn: Callable,
    args: tuple,
    backend: str,
    collective_timeout_s: float,
) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    torch.set_num_threads(1)
    code = 0
    try:
        store = rendezvous_store(
            rank,
            world_size,
            timeout_s=collective_timeout_s,
            publish=lambda port: _publish_port(folder, port),
            lookup=lambda: _read_port(folder),
        )
        os.environ["MASTER_PORT"] = str(store.port)
        dist.init_process_group(
            backend,
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=collective_timeout_s),
        )
        result = fn(rank, world_size, *args)
        (folder / f"{rank}.pkl").write_bytes(pickle.dumps(result))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:  # every failure must reach the parent
        (folder / f"{rank}.err").write_text(traceback.format_exc())
        code = 1
    os._exit(code)


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *,
    args: tuple = (),
    timeout_s: float = 120.0,
    collective_timeout_s: float = 60.0,
    backend: str = "gloo",
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` forked ranks; return each rank's result.

    ``fn`` and its results must be picklable only on the way back (results). Raises
    ``RankFailure`` with every rank's traceback if any rank fails or the deadline passes.
    """
    preload_torch()
    with tempfile.TemporaryDirectory(prefix="autoparallel-ranks-") as tmp:
        folder = Path(tmp)
        pids = []
        for rank in range(world_size):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - child
                _child(rank, world_size, folder, fn, args, backend, collective_timeout_s)
            pids.append(pid)
        timed_out = _wait_all(pids, timeout_s)
        errors = {
            rank: (folder / f"{rank}.err").read_text()
            for rank in range(world_size)
            if (folder / f"{rank}.err").exists()
        }
        missing = [
            rank
            for rank in range(world_size)
            if not (folder / f"{rank}.pkl").exists() and rank not in errors
        ]
        for rank in missing:
            errors[rank] = "rank exited without a result (killed or crashed)"
        if errors or timed_out:
            raise RankFailure(errors, timed_out=timed_out)
        return [pickle.loads((folder / f"{rank}.pkl").read_bytes()) for rank in range(world_size)]


def _wait_all(pids: list[int], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    pending = set(pids)
    while pending and time.monotonic() < deadline:
        for pid in list(pending):
            done, _status = os.waitpid(pid, os.WNOHANG)
            if done:
                pending.discard(pid)
        if pending:
            time.sleep(0.01)
    for pid in pending:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    return bool(pending)
