"""``Cluster``: homogeneous nodes of accelerators, an intra-node fabric and a scale-out network.

The collective-time entry point the cost model uses is ``Cluster.collective_time``; it is
vectorized over numpy arrays (a scalar is an array of one), so the search can price thousands
of layouts at once. A group is described by its size and by how many of its ranks share a node
(``ranks_per_node``), which the placement decides.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from topology._hardware import HardwareSpec

CollectiveOp = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast"]
COLLECTIVE_OPS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast")

_STRICT = ConfigDict(extra="forbid", frozen=True)


class LinkTier(BaseModel):
    """One tier of links as seen by one device: bandwidth per direction, latency, efficiency."""

    model_config = _STRICT

    kind: str = Field(description="nvlink_switch, xgmi_mesh, pcie, hccs, mtlink, infiniband, roce, ethernet, loopback")
    bandwidth_bytes_per_s: float = Field(gt=0, description="per device, per direction")
    latency_s: float = Field(ge=0)
    efficiency: float = Field(default=1.0, gt=0, le=1, description="achievable fraction for bulk collectives")
    source: str = ""


class Cluster(BaseModel):
    """``num_nodes`` x ``devices_per_node`` identical devices. JSON round-trips exactly."""

    model_config = _STRICT

    name: str
    device: HardwareSpec
    num_nodes: int = Field(gt=0)
    devices_per_node: int = Field(gt=0)
    intra_node: LinkTier
    inter_node: LinkTier
    oversubscription: float = Field(default=1.0, ge=1.0, description="scale-out core oversubscription ratio")
    network_topology: Literal["rail_optimized", "fat_tree", "single_node"] = "rail_optimized"
    provenance: str = ""

    def __hash__(self) -> int:
        return hash(self.model_dump_json())

    @property
    def num_devices(self) -> int:
        return self.num_nodes * self.devices_per_node

    @property
    def memory_per_device_bytes(self) -> float:
        return self.device.memory_bytes

    def fingerprint(self) -> str:
        import hashlib

        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]

    def collective_time(
        self,
        op: str,
        *,
        group_size,
        ranks_per_node,
        message_bytes,
    ):
        """Seconds for one ``op`` over groups of ``group_size`` ranks, ``ranks_per_node`` of which
        share a node, moving ``message_bytes`` (nccl-tests "size": the full buffer per rank).

        Vectorized: arguments broadcast as numpy arrays; returns an array (or a float for scalars).
        """
        from topology._collectives import collective_time

        return collective_time(
            self, op, group_size=group_size, ranks_per_node=ranks_per_node, message_bytes=message_bytes
        )

    def with_nodes(self, num_nodes: int) -> "Cluster":
        """The same cluster scaled to ``num_nodes`` nodes."""
        if num_nodes <= 0:
            raise ValueError(f"num_nodes ({num_nodes}) must be > 0")
        return self.model_copy(update={"num_nodes": num_nodes, "name": f"{self.name.split('@')[0]}@{num_nodes}n"})


def _as_array(value) -> np.ndarray:
    return np.asarray(value, dtype=np.float64)
