"""What ``topology.probe`` measures and reports: its settings, test hooks and result records.

A ``ProbeReport`` is what one probe run measured (point-to-point links, collective times with
nccl-tests bus bandwidth, per-device matmul FLOP/s and copy bandwidth) plus the ``Cluster``
built from it; it saves as JSON and loads back with pydantic. Sizes are in bytes, times in
seconds, rates per second. Timing runs ``warmup`` untimed repeats, then reports the median of
``repeats`` >= 5 and the spread. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from topology._cluster import Cluster, DeviceLink

__all__ = [
    "PROBED_DTYPES",
    "PROBED_OPS",
    "CollectiveResult",
    "ComputeResult",
    "ProbeHooks",
    "ProbeReport",
    "ProbeSettings",
    "Progress",
]


_STRICT = ConfigDict(extra="forbid", frozen=True)
Progress = Callable[[str, int, int], None]
PROBED_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
PROBED_DTYPES = ("fp32", "bf16", "fp16")


class ProbeSettings(BaseModel):
    """What to measure and how long to wait. Sizes in bytes; ``None`` picks a size for the device."""

    model_config = _STRICT

    p2p_message_bytes: int | None = Field(default=None, gt=0)
    collective_message_bytes: tuple[int, ...] | None = None
    collective_ops: tuple[str, ...] = PROBED_OPS
    group_sizes: tuple[int, ...] | None = Field(
        default=None, description="default: powers of two up to the world"
    )
    matmul_dim: int | None = Field(default=None, gt=0)
    matmul_dtypes: tuple[str, ...] | None = None
    copy_bytes: int | None = Field(default=None, gt=0)
    warmup: int = Field(default=1, ge=0)
    repeats: int = Field(default=5, ge=5, description="median of at least 5 timed repeats")
    operation_timeout_s: float = Field(default=60.0, gt=0)
    max_all_pairs_ranks: int = Field(default=64, gt=1)
    sampled_peers_per_rank: int = Field(default=8, ge=0)
    run_name: str | None = None
    stop_silent_local_ranks: bool = Field(
        default=True,
        description="SIGKILL a rank on this host that stopped answering, so the launcher can exit",
    )

    @field_validator("collective_ops")
    @classmethod
    def _known_ops(cls, ops: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(ops) - set(PROBED_OPS))
        if unknown:
            raise ValueError(
                f"collective_ops ({unknown}) are not probed ops; valid: {', '.join(PROBED_OPS)}"
            )
        return ops

    @field_validator("matmul_dtypes")
    @classmethod
    def _known_dtypes(cls, dtypes: tuple[str, ...] | None) -> tuple[str, ...] | None:
        unknown = sorted(set(dtypes or ()) - set(PROBED_DTYPES))
        if unknown:
            raise ValueError(
                f"matmul_dtypes ({unknown}) are not probed dtypes; valid: {', '.join(PROBED_DTYPES)}"
            )
        return dtypes


@dataclass(frozen=True)
class ProbeHooks:
    """Test hooks: ``before_send(sender, receiver)`` runs inside the timed send of a pair;
    ``before_step(label)`` before every step (a test may kill or stall its rank there)."""

    before_send: Callable[[int, int], None] | None = None
    before_step: Callable[[str], None] | None = None


class CollectiveResult(BaseModel):
    model_config = _STRICT

    op: str
    group_size: int
    ranks_per_node: int
    message_bytes: int
    median_s: float
    spread: float
    bus_bandwidth_bytes_per_s: float


class ComputeResult(BaseModel):
    model_config = _STRICT

    rank: int
    kind: str = Field(description="matmul_<dtype> or memory_copy")
    rate_per_s: float = Field(description="FLOP/s for matmuls, bytes/s for copies")
    spread: float


class ProbeReport(BaseModel):
    """Everything one probe run measured, and the ``Cluster`` built from it."""

    model_config = _STRICT

    run_name: str
    backend: str
    device_type: str
    world_size: int
    devices_per_node: int
    p2p: tuple[DeviceLink, ...]
    collectives: tuple[CollectiveResult, ...]
    compute: tuple[ComputeResult, ...]
    cluster: Cluster

    def p2p_matrix(self) -> np.ndarray:
        """Rank x rank measured bandwidth (bytes/s); ``nan`` on the diagonal and unmeasured pairs."""
        matrix = np.full((self.world_size, self.world_size), np.nan)
        for link in self.p2p:
            matrix[link.from_device, link.to_device] = link.bandwidth_bytes_per_s
        return matrix

    def slowest_link(self) -> DeviceLink:
        if not self.p2p:
            raise ValueError(
                f"probe run {self.run_name} measured no links (world_size {self.world_size})"
            )
        return min(self.p2p, key=lambda link: link.bandwidth_bytes_per_s)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.model_dump_json(indent=2) + "\n")
        return path
