"""Placement: which device runs which rank of a device mesh, heaviest traffic on the fastest links.

Ranks are numbered row-major over the mesh axes, outermost first (``torch``'s ``DeviceMesh``
and Megatron's rank order). A placement gives each axis a device *stride*: the axis with the most
traffic varies fastest over device ids, so its groups are consecutive devices and share a node
(tensor parallel inside the NVLink domain, as Megatron-LM places it: Narayanan et al., "Efficient
large-scale language model training on GPU clusters using Megatron-LM", SC 2021, sec. 3.3).
Among the orders of the axes, the one whose traffic-weighted share of off-node peers is lowest
is chosen (ties keep the mesh's own order). ``mesh_comm_time`` prices a placement with the
collective model, every group of an axis running at once.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np
from pydantic import Field

from topology._cluster import Cluster, CollectiveOp, _Strict


class AxisTraffic(_Strict):
    """What one mesh axis communicates per step: ``count`` collectives of ``message_bytes``."""

    op: CollectiveOp
    message_bytes: float = Field(ge=0)
    count: float = Field(default=1.0, ge=0)


def _check_axes(axes: Sequence[tuple[str, int]]) -> tuple[list[str], list[int]]:
    names = [str(name) for name, _ in axes]
    sizes = [int(size) for _, size in axes]
    if not names:
        raise ValueError("axes ([]) must name at least one mesh axis")
    if len(set(names)) != len(names):
        raise ValueError(f"axes ({names}) must have distinct names")
    for name, size in zip(names, sizes):
        if size < 1:
            raise ValueError(f"axes[{name!r}] size ({size}) must be >= 1")
    return names, sizes


def _check_traffic(names: list[str], traffic: Mapping[str, object]) -> None:
    unknown = sorted(set(traffic) - set(names))
    if unknown:
        raise ValueError(f"traffic names axes {unknown} that the mesh lacks; mesh axes: {names}")


def placement_for_order(*, sizes: Sequence[int], order: Sequence[int]) -> np.ndarray:
    """rank -> device when axis ``order[0]`` varies fastest over devices, then ``order[1]``, ..."""
    strides = np.zeros(len(sizes), dtype=np.int64)
    stride = 1
    for axis in order:
        strides[axis] = stride
        stride *= sizes[axis]
    coords = np.unravel_index(np.arange(int(np.prod(sizes))), sizes)
    return sum(coord * strides[axis] for axis, coord in enumerate(coords))


def _off_node_share(
    *, sizes: Sequence[int], order: Sequence[int], devices_per_node: int
) -> np.ndarray:
    """Per axis, the fraction of a rank's group peers on other nodes under ``order``."""
    share = np.zeros(len(sizes))
    stride = 1
    for axis in order:
        size = sizes[axis]
        local = min(size, max(1, devices_per_node // stride))
        share[axis] = 0.0 if size == 1 else (size - local) / (size - 1)
        stride *= size
    return share


def place_mesh(
    *, axes: Sequence[tuple[str, int]], traffic: Mapping[str, float], devices_per_node: int
) -> tuple[int, ...]:
    """rank -> device for a mesh of ``axes`` (``(name, size)``, outermost first).

    ``traffic`` weighs each axis (bytes per step, say; a missing axis weighs 0). Pure function
    of integers and weights: the result depends on nothing else, and is a permutation of
    ``range(prod(sizes))``.
    """
    names, sizes = _check_axes(axes)
    _check_traffic(names, traffic)
    if devices_per_node < 1:
        raise ValueError(f"devices_per_node ({devices_per_node}) must be >= 1")
    weights = np.array([float(traffic.get(name, 0.0)) for name in names])
    if np.any(weights < 0):
        raise ValueError(f"traffic ({dict(traffic)}) must be >= 0 for every axis")
    greedy = sorted(range(len(names)), key=lambda axis: (-weights[axis], -axis))
    best, best_cost = tuple(greedy), None
    for order in itertools.permutations(range(len(names))):
        cost = float(
            weights @ _off_node_share(sizes=sizes, order=order, devices_per_node=devices_per_node)
        )
        if (
            best_cost is None
            or cost < best_cost - 1e-12
            or (abs(cost - best_cost) <= 1e-12 and order == tuple(greedy))
        ):
            best, best_cost = order, cost
    return tuple(int(device) for device in placement_for_order(sizes=sizes, order=best))


def axis_groups(
    *, axes: Sequence[tuple[str, int]], placement: Sequence[int], axis: str
) -> np.ndarray:
    """Devices of every group of ``axis``: shape (number of groups, axis size)."""
    names, sizes = _check_axes(axes)
    if axis not in names:
        raise ValueError(f"axis ({axis!r}) is not a mesh axis; mesh axes: {names}")
    devices = np.asarray(placement, dtype=np.int64)
    if devices.shape != (int(np.prod(sizes)),) or len(np.unique(devices)) != devices.size:
        raise ValueError(
            f"placement must list {int(np.prod(sizes))} distinct devices, one per rank"
        )
    index = names.index(axis)
    grid = np.moveaxis(devices.reshape(sizes), index, -1)
    return grid.reshape(-1, sizes[index])


def _group_stats(cluster: Cluster, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group: most ranks on one node, nodes spanned, whether it leaves a leaf switch."""
    from topology._graph import leaf_of

    nodes = np.sort(groups // cluster.devices_per_node, axis=1)
    new = np.concatenate(
        [np.ones((nodes.shape[0], 1), bool), nodes[:, 1:] != nodes[:, :-1]], axis=1
    )
    num_nodes = new.sum(axis=1)
    run_starts = [np.flatnonzero(row) for row in new]
    local = np.array(
        [np.diff(np.append(starts, row.size)).max() for starts, row in zip(run_starts, new)]
    )
    leaves = np.vectorize(lambda node: leaf_of(cluster, int(node), 0))(nodes)
    crosses = leaves.min(axis=1) != leaves.max(axis=1)
    return local, num_nodes, crosses


def mesh_comm_time(
    cluster: Cluster,
    *,
    axes: Sequence[tuple[str, int]],
    placement: Sequence[int],
    traffic: Mapping[str, AxisTraffic],
) -> dict[str, float]:
    """Seconds per step each axis spends communicating under ``placement`` (all groups of an
    axis at once; the slowest group bounds the axis). Axes run one after another."""
    from topology import _collectives

    names, sizes = _check_axes(axes)
    _check_traffic(names, traffic)
    if len(placement) > cluster.num_devices or max(placement) >= cluster.num_devices:
        raise ValueError(
            f"placement needs {max(placement) + 1} devices; {cluster.name} has {cluster.num_devices}"
        )
    seconds = {}
    for axis, work in traffic.items():
        work = AxisTraffic.model_validate(work)
        groups = axis_groups(axes=axes, placement=placement, axis=axis)
        local, num_nodes, crosses = _group_stats(cluster, groups)
        path = _collectives.tier_path(
            cluster,
            group_size=groups.shape[1],
            ranks_per_node=local,
            num_nodes=num_nodes,
            crosses_spine=crosses,
        )
        times = _collectives.cheapest(
            _collectives.algorithm_times(work.op, path=path, message_bytes=work.message_bytes)
        )
        seconds[axis] = float(np.max(times)) * work.count
    return seconds
