"""A probe launched by torchrun whose rank is stopped (SIGSTOP) mid-measurement ends by itself,
non-zero, within its operation timeout plus a few seconds, naming the rank."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Short: the test waits out this timeout and the diagnosis after it (two timeouts, capped). The
# healthy steps before the stop are ping-pongs of two ranks, each well under it even when loaded.
TIMEOUT_S = 1.0


def _children(parent: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            pids.append(int(entry.name))
    return pids


def _rank_of(pid: int) -> int | None:
    try:
        environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in environment:
        if item.startswith(b"RANK="):
            return int(item[len(b"RANK=") :])
    return None


@pytest.mark.distributed
@pytest.mark.skipif(
    not Path("/proc/self/environ").exists(), reason="finds torchrun's workers through /proc (Linux)"
)
def test_a_stopped_rank_ends_the_probe_within_the_timeout(tmp_path: Path) -> None:
    environment = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "autoparallel.cli",
        "probe",
        "--timeout-s",
        str(TIMEOUT_S),
        "--repeats",
        "400",
        "--output",
        str(tmp_path / "cluster.json"),
    ]
    launcher = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=environment,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        output = []
        for line in launcher.stdout:  # rank 0 logs a line per finished step when not on a terminal
            output.append(line)
            if line.startswith("probe: "):
                break
        assert any(line.startswith("probe: ") for line in output), "".join(output)
        workers = {_rank_of(pid): pid for pid in _children(launcher.pid)}
        os.kill(workers[1], signal.SIGSTOP)
        stopped = time.monotonic()
        rest, _ = launcher.communicate(timeout=TIMEOUT_S + 60)
        elapsed = time.monotonic() - stopped
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    text = "".join(output) + rest
    assert launcher.returncode != 0, text
    assert elapsed <= TIMEOUT_S + 10.0, f"exited {elapsed:.1f} s after the stop\n{text}"
    assert "rank 1 did not respond" in text, text
    assert "Traceback" not in text.split("error: probe step")[0]
