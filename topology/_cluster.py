"""``Cluster``: homogeneous nodes of accelerators, an intra-node fabric and a scale-out network.

The collective-time entry point the cost model uses is ``Cluster.collective_time``; it is
vectorized over numpy arrays (a scalar is an array of one), so the search can price thousands
of layouts at once. A group is described by its size and by how many of its ranks share a node
(``ranks_per_node``), which the placement decides. ``Cluster.graph()`` is the same cluster as a
networkx graph (devices, switches, NICs, leaves, spine), and
``Cluster.collective_time_for_group`` prices an explicit device list by reducing it to its
bottleneck links and calling the same vectorized formula.
"""

from __future__ import annotations

import difflib
import hashlib
import math
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from topology._hardware import HardwareSpec
from topology._units import BytesPerSecond, Seconds

CollectiveOp = Literal[
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast"
]
COLLECTIVE_OPS: tuple[str, ...] = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "send_recv",
    "broadcast",
)

#: Intra-node fabrics where every device has its own link to every other one (the tier's
#: bandwidth is the device's aggregate over its ``devices_per_node - 1`` peer links).
MESH_FABRICS = ("xgmi_mesh", "hccs_mesh", "mtlink_mesh")
#: Intra-node fabrics through one switch (NVSwitch, PCIe switch, host loopback).
SWITCHED_FABRICS = ("nvlink_switch", "pcie", "loopback", "ethernet")
#: Link kinds a tier may name: the fabrics above, scale-out networks, and probe measurements.
LINK_KINDS = MESH_FABRICS + SWITCHED_FABRICS + ("infiniband", "roce", "efa", "measured")

_STRICT = ConfigDict(extra="forbid", frozen=True)


class _Strict(BaseModel):
    """Frozen, no unknown keys; an unknown key's error names it and suggests the closest field."""

    model_config = _STRICT

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            fields = sorted(cls.model_fields)
            for key in data:
                if key not in cls.model_fields:
                    close = difflib.get_close_matches(str(key), fields, n=1)
                    hint = (
                        f" (did you mean {close[0]!r}? values are SI unless given as '<number> <unit>')"
                        if close
                        else ""
                    )
                    raise ValueError(
                        f"{cls.__name__} has no field {key!r}{hint}; valid fields: {', '.join(fields)}"
                    )
        return data


class LinkTier(_Strict):
    """One tier of links as seen by one device: bandwidth per direction, latency, efficiency.

    ``bandwidth_bytes_per_s`` is per device and per direction; on a mesh fabric it is the
    device's aggregate over its peer links. ``efficiency`` is the fraction of it a ring collective
    reaches as nccl-tests bus bandwidth (``busBw``, nccl-tests ``doc/PERFORMANCE.md``).
    ``in_network_reduction_efficiency`` is set where the switch itself reduces (NVLink SHARP,
    NCCL's NVLS algorithm): an all-reduce inside the tier then reaches this fraction of the link
    bandwidth as *algorithm* bandwidth (``algBw``), each device sending and receiving its buffer once.
    """

    kind: str = Field(
        description="one of LINK_KINDS: the intra-node fabric or the scale-out network"
    )
    bandwidth_bytes_per_s: BytesPerSecond = Field(gt=0, description="per device, per direction")
    latency_s: Seconds = Field(ge=0)
    efficiency: float = Field(
        default=1.0, gt=0, le=1, description="achievable fraction for bulk collectives"
    )
    in_network_reduction_efficiency: float | None = Field(default=None, gt=0, le=1)
    source: str = ""

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, kind: str) -> str:
        if kind not in LINK_KINDS:
            close = difflib.get_close_matches(kind, LINK_KINDS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"kind ({kind!r}) is not a link kind{hint}; valid kinds: {', '.join(LINK_KINDS)}"
            )
        return kind


class DeviceLink(_Strict):
    """A point-to-point measurement (or override) from one device to another, one direction."""

    from_device: int = Field(ge=0)
    to_device: int = Field(ge=0)
    bandwidth_bytes_per_s: BytesPerSecond = Field(gt=0)
    latency_s: Seconds = Field(default=0.0, ge=0)
    spread: float = Field(default=0.0, ge=0, description="(max - min) / median over the repeats")
    source: str = ""


class Cluster(_Strict):
    """``num_nodes`` x ``devices_per_node`` identical devices. JSON round-trips exactly.

    Devices are numbered ``node * devices_per_node + local_index``. The scale-out network gives
    each device ``inter_node.bandwidth_bytes_per_s``; ``devices_per_nic`` devices share one NIC.
    Leaf switches have ``leaf_downlinks`` NIC-facing ports; traffic that leaves a leaf crosses the
    spine, whose capacity is the leaves' downlink capacity divided by ``oversubscription``. On a
    ``rail_optimized`` network NIC *r* of every node in a scalable unit shares leaf *r*.
    ``links`` holds measured (or explicitly given) device-to-device links that override the
    tiers for those pairs.
    """

    name: str
    device: HardwareSpec
    num_nodes: int = Field(gt=0)
    devices_per_node: int = Field(gt=0)
    intra_node: LinkTier
    inter_node: LinkTier
    oversubscription: float = Field(
        default=1.0, ge=1.0, description="scale-out core oversubscription ratio"
    )
    network_topology: Literal["rail_optimized", "fat_tree", "single_node"] = "rail_optimized"
    provenance: str = ""
    devices_per_nic: int = Field(default=1, gt=0)
    devices_per_host: int | None = Field(
        default=None,
        gt=0,
        description="devices one host drives (one OS image, one torchrun node) where a node's "
        "fabric spans several hosts (a rack-scale NVLink domain: 4 per GB200 compute tray); "
        "None: the whole node is one host",
    )
    leaf_downlinks: int = Field(default=32, gt=0, description="NIC-facing ports per leaf switch")
    links: tuple[DeviceLink, ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> Cluster:
        if self.devices_per_node % self.devices_per_nic:
            raise ValueError(
                f"devices_per_nic ({self.devices_per_nic}) must divide devices_per_node ({self.devices_per_node})"
            )
        if self.devices_per_node % self.host_devices:
            raise ValueError(
                f"devices_per_host ({self.devices_per_host}) must divide devices_per_node "
                f"({self.devices_per_node}): a node is a whole number of hosts"
            )
        seen = set()
        for index, link in enumerate(self.links):
            for end in ("from_device", "to_device"):
                device = getattr(link, end)
                if device >= self.num_devices:
                    raise ValueError(
                        f"links[{index}].{end} ({device}) is not a device: the cluster has devices 0..{self.num_devices - 1}"
                    )
            if link.from_device == link.to_device:
                raise ValueError(f"links[{index}] connects device {link.from_device} to itself")
            pair = (link.from_device, link.to_device)
            if pair in seen:
                raise ValueError(f"links[{index}] repeats the link {pair[0]} -> {pair[1]}")
            seen.add(pair)
        return self

    def __hash__(self) -> int:
        return hash(self.model_dump_json())

    @property
    def num_devices(self) -> int:
        return self.num_nodes * self.devices_per_node

    @property
    def host_devices(self) -> int:
        """Devices of one host: ``devices_per_host``, else the whole node."""
        return self.devices_per_host or self.devices_per_node

    @property
    def memory_per_device_bytes(self) -> float:
        return self.device.memory_bytes

    @property
    def nodes_per_leaf(self) -> int:
        """Nodes whose rail-aligned traffic stays inside one leaf switch (no spine, no oversubscription)."""
        if self.network_topology == "rail_optimized":
            return self.leaf_downlinks
        nics_per_node = self.devices_per_node // self.devices_per_nic
        return max(1, self.leaf_downlinks // nics_per_node)

    def fingerprint(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]

    def node_of(self, device: int) -> int:
        return device // self.devices_per_node

    # -- collective model -------------------------------------------------------------------
    def collective_time(
        self, op: str, *, group_size, ranks_per_node, message_bytes, concurrent_groups=None
    ):
        """Seconds for one ``op`` over groups of ``group_size`` ranks, ``ranks_per_node`` of which
        share a node, moving ``message_bytes`` (nccl-tests "size": the full buffer per rank).

        ``concurrent_groups`` is how many groups per node run a collective at the same time and
        share the node's NICs; by default every device of the node is busy with a group of this
        kind (``devices_per_node / ranks_per_node``), as when all TP or all EP groups run at once.
        The cheapest of ring, tree, hierarchical and in-switch reduction is taken.
        Vectorized: arguments broadcast as numpy arrays; returns an array (or a float for scalars).
        """
        from topology import _collectives

        return _collectives.collective_time(
            self,
            op,
            group_size=group_size,
            ranks_per_node=ranks_per_node,
            message_bytes=message_bytes,
            concurrent_groups=concurrent_groups,
        )

    def collective_algorithm_times(
        self, op: str, *, group_size, ranks_per_node, message_bytes, concurrent_groups=None
    ):
        """Seconds per algorithm (``ring``, ``tree``, ``hierarchical``, ``in_network``) where it applies."""
        from topology import _collectives

        return _collectives.applicable(
            self._every_algorithm_time(
                op, group_size, ranks_per_node, message_bytes, concurrent_groups
            )
        )

    def collective_algorithm(
        self, op: str, *, group_size, ranks_per_node, message_bytes, concurrent_groups=None
    ):
        """Name of the algorithm ``collective_time`` takes, element-wise (a numpy array of str)."""
        from topology import _collectives

        return _collectives.chosen_algorithm(
            self._every_algorithm_time(
                op, group_size, ranks_per_node, message_bytes, concurrent_groups
            )
        )

    def _every_algorithm_time(
        self, op: str, group_size, ranks_per_node, message_bytes, concurrent_groups
    ):
        """Each algorithm's seconds on this group's tier path (``_collectives.algorithm_times``)."""
        from topology import _collectives

        path = _collectives.tier_path(
            self,
            group_size=group_size,
            ranks_per_node=ranks_per_node,
            concurrent_groups=concurrent_groups,
        )
        return _collectives.algorithm_times(op, path=path, message_bytes=message_bytes)

    def bus_bandwidth(
        self, op: str, *, group_size, ranks_per_node, message_bytes, concurrent_groups=None
    ):
        """Predicted nccl-tests bus bandwidth (bytes/s): ``size / time * bus_factor(op, n)``."""
        from topology._collectives import bus_factor

        seconds = self.collective_time(
            op,
            group_size=group_size,
            ranks_per_node=ranks_per_node,
            message_bytes=message_bytes,
            concurrent_groups=concurrent_groups,
        )
        return (
            np.asarray(message_bytes, dtype=np.float64)
            * bus_factor(op, np.asarray(group_size, dtype=np.float64))
            / seconds
        )

    def traffic_per_rank(
        self, op: str, *, group_size, ranks_per_node, message_bytes
    ) -> dict[str, np.ndarray]:
        """Bytes each rank sends over the intra-node fabric and over the scale-out network."""
        from topology._collectives import traffic_per_rank

        return traffic_per_rank(
            op, group_size=group_size, ranks_per_node=ranks_per_node, message_bytes=message_bytes
        )

    def collective_time_for_group(self, op: str, *, devices, message_bytes, concurrent_groups=None):
        """Seconds for ``op`` over the explicit ``devices`` (global ids) of this cluster.

        The group is reduced to its bottleneck links on ``graph()`` (the busiest node's rank
        count, the slowest intra-node and scale-out paths among its members, measured ``links``
        included) and priced by the same vectorized formula as ``collective_time``.
        """
        from topology import _collectives
        from topology._graph import group_path

        path = group_path(self, devices=devices, concurrent_groups=concurrent_groups)
        return _collectives.cheapest(
            _collectives.algorithm_times(op, path=path, message_bytes=message_bytes)
        )

    # -- graph and files --------------------------------------------------------------------
    def graph(self):
        """The cluster as a ``networkx.DiGraph`` (cached): devices, switches, NICs, leaves, spine.

        Every edge has ``bandwidth_bytes_per_s`` (that direction), ``latency_s``, ``kind`` and
        ``source``; nodes have ``kind`` (device, switch, nic, leaf, spine) and devices ``device_id``
        and ``node``.
        """
        from topology._graph import build_graph

        return build_graph(self)

    def bandwidth_matrix(self) -> np.ndarray:
        """Device x device bandwidth (bytes/s): measured ``links`` where given, else the path bottleneck."""
        from topology._graph import bandwidth_matrix

        return bandwidth_matrix(self)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.model_dump_json(indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Cluster:
        """A cluster JSON file (a preset, a saved cluster, or a probe's output)."""
        return cls.model_validate_json(Path(path).read_text())

    def with_nodes(self, num_nodes: int) -> Cluster:
        """The same cluster scaled to ``num_nodes`` nodes (measured links beyond it are dropped)."""
        if num_nodes <= 0:
            raise ValueError(f"num_nodes ({num_nodes}) must be > 0")
        limit = num_nodes * self.devices_per_node
        links = tuple(
            link for link in self.links if link.from_device < limit and link.to_device < limit
        )
        data = self.model_dump() | {
            "num_nodes": num_nodes,
            "name": f"{self.name.split('@')[0]}@{num_nodes}n",
            "links": links,
        }
        return Cluster.model_validate(data)

    def with_devices_per_node(self, count: int) -> Cluster:
        """The same cluster using ``count`` devices of each node, the rest left idle: whole hosts
        of a node whose fabric spans several (64 of a GB200 NVL72 rack's 72 GPUs, as its
        published 64-GPU runs use), or any number of a single-host node's devices (the
        survivors of a partly lost node). Devices are renumbered node by node; measured links
        among the devices kept keep their ends, the rest are dropped; NICs shared by more
        devices than a node keeps are shared by those it keeps."""
        if not 0 < count <= self.devices_per_node:
            raise ValueError(
                f"devices per node ({count}) must be in 1..{self.devices_per_node} "
                f"(the devices of one node of {self.name})"
            )
        if count == self.devices_per_node:
            return self
        if self.devices_per_host is not None and count % self.devices_per_host:
            raise ValueError(
                f"devices per node ({count}) must be a whole number of hosts of "
                f"{self.devices_per_host} devices ({self.name}: devices_per_host)"
            )

        def kept(device: int) -> int | None:
            node, local = divmod(device, self.devices_per_node)
            return node * count + local if local < count else None

        links = []
        for link in self.links:
            ends = kept(link.from_device), kept(link.to_device)
            if None not in ends:
                links.append(link.model_copy(update={"from_device": ends[0], "to_device": ends[1]}))
        nic = (
            self.devices_per_nic
            if count % self.devices_per_nic == 0
            else math.gcd(count, self.devices_per_nic)
        )
        data = self.model_dump() | {
            "devices_per_node": count,
            "devices_per_nic": nic,
            "name": f"{self.name.split('@')[0]}@{self.num_nodes}n{count}d",
            "links": tuple(links),
        }
        return Cluster.model_validate(data)

    def with_memory_fraction(self, fraction: float, *, source: str = "") -> Cluster:
        """The same cluster as if each device had ``fraction`` (0 < f <= 1) of its memory: a
        planning margin (the allocator's reserve, the memory error bar) that every use of
        device memory sees; the device's source records the override."""
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"memory fraction ({fraction}) must be in (0, 1]")
        device = self.device
        note = f"override: {fraction:g} of {device.memory_bytes / 2**30:.1f} GiB{f' ({source})' if source else ''}"
        sources = dict(device.sources)
        sources["memory_bytes"] = f"{note}; was {sources.get('memory_bytes', 'preset')}"
        device = device.model_copy(
            update={"memory_bytes": device.memory_bytes * fraction, "sources": sources}
        )
        return self.model_copy(update={"device": device})

    def with_inter_node_bandwidth(
        self, bandwidth_bytes_per_s: float, *, source: str = ""
    ) -> Cluster:
        """The same cluster with a different scale-out bandwidth per device and direction (a slower
        or faster inter-node fabric than the preset's); the tier's efficiency and latency are kept
        and its source records the override."""
        if not bandwidth_bytes_per_s > 0:
            raise ValueError(
                f"inter-node bandwidth_bytes_per_s ({bandwidth_bytes_per_s}) must be > 0"
            )
        note = f"override: {bandwidth_bytes_per_s * 8 / 1e9:g} Gb/s per device{f' ({source})' if source else ''}"
        inter = self.inter_node.model_copy(
            update={
                "bandwidth_bytes_per_s": float(bandwidth_bytes_per_s),
                "source": f"{note}; was {self.inter_node.source}",
            }
        )
        return self.model_copy(update={"inter_node": inter, "links": self.links})
