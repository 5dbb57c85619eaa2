"""Placement: heaviest traffic on the fastest links, as a pure function of the mesh and weights."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topology import AxisTraffic, axis_groups, get_preset, mesh_comm_time, place_mesh

MIB = 2**20
# One training step of a MoE layer stack, per rank (illustrative sizes; the weights are the bytes).
TRAFFIC = {
    "tp": AxisTraffic(op="all_reduce", message_bytes=32 * MIB, count=64),
    "ep": AxisTraffic(op="all_to_all", message_bytes=64 * MIB, count=16),
    "dp": AxisTraffic(op="all_reduce", message_bytes=512 * MIB, count=1),
    "pp": AxisTraffic(op="send_recv", message_bytes=16 * MIB, count=8),
}
WEIGHTS = {axis: work.message_bytes * work.count for axis, work in TRAFFIC.items()}


def _nodes_of(groups: np.ndarray, devices_per_node: int) -> np.ndarray:
    return np.array([len(set(group // devices_per_node)) for group in groups])


@pytest.mark.parametrize(
    "axes",
    [
        [("pp", 4), ("dp", 2), ("tp", 8), ("ep", 4)],  # 32 nodes, EP written innermost
        [("tp", 8), ("ep", 8), ("dp", 4), ("pp", 4)],  # 128 nodes, TP written outermost
    ],
    ids=["32-nodes", "128-nodes"],
)
def test_placement_beats_naive_rank_order_and_keeps_tp_in_a_node(axes) -> None:
    num_devices = int(np.prod([size for _, size in axes]))
    cluster = get_preset("dgx-h100", num_nodes=num_devices // 8)
    chosen = place_mesh(axes=axes, traffic=WEIGHTS, devices_per_node=8)
    naive = tuple(range(num_devices))
    assert sorted(chosen) == list(naive)
    tp_groups = axis_groups(axes=axes, placement=chosen, axis="tp")
    assert np.all(_nodes_of(tp_groups, 8) == 1)
    ep_groups = axis_groups(axes=axes, placement=chosen, axis="ep")
    assert np.all(
        _nodes_of(ep_groups, 8) == [size for name, size in axes if name == "ep"][0]
    )  # one EP rank per node: rail-aligned
    chosen_s = mesh_comm_time(cluster, axes=axes, placement=chosen, traffic=TRAFFIC)
    naive_s = mesh_comm_time(cluster, axes=axes, placement=naive, traffic=TRAFFIC)
    print(
        f"{len(axes)}-axis mesh on {cluster.num_nodes} nodes: chosen {sum(chosen_s.values()) * 1e3:.1f} ms, "
        f"naive {sum(naive_s.values()) * 1e3:.1f} ms per step ({sum(naive_s.values()) / sum(chosen_s.values()):.2f}x); "
        + ", ".join(
            f"{axis} {chosen_s[axis] * 1e3:.1f}/{naive_s[axis] * 1e3:.1f} ms" for axis in chosen_s
        )
    )
    assert sum(chosen_s.values()) < sum(naive_s.values())


def test_canonical_order_is_kept() -> None:
    axes = [("pp", 4), ("dp", 4), ("ep", 2), ("tp", 8)]
    assert place_mesh(axes=axes, traffic=WEIGHTS, devices_per_node=8) == tuple(range(256))


def test_pure_and_deterministic() -> None:
    axes = [("dp", 4), ("tp", 4), ("ep", 4)]
    first = place_mesh(axes=axes, traffic={"tp": 3.0, "ep": 2.0, "dp": 1.0}, devices_per_node=8)
    assert first == place_mesh(
        axes=axes, traffic={"tp": 3.0, "ep": 2.0, "dp": 1.0}, devices_per_node=8
    )
    groups = axis_groups(axes=axes, placement=first, axis="tp")
    assert np.all(np.diff(groups, axis=1) == 1)  # TP varies fastest over devices


def _off_node_cost(axes, placement, traffic, devices_per_node) -> float:
    """Traffic-weighted share of each rank's group peers that sit on other nodes."""
    cost = 0.0
    for name, size in axes:
        if size == 1:
            continue
        nodes = axis_groups(axes=axes, placement=placement, axis=name) // devices_per_node
        off = (nodes[:, :, None] != nodes[:, None, :]).sum(axis=2) / (size - 1)
        cost += traffic[name] * off.mean()
    return cost


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=4),
    weights=st.lists(st.floats(min_value=0, max_value=1e9), min_size=4, max_size=4),
    devices_per_node=st.sampled_from([1, 2, 4, 8]),
)
def test_always_a_permutation_and_no_worse_than_simple_orders(
    sizes, weights, devices_per_node
) -> None:
    names = ["a", "b", "c", "d"][: len(sizes)]
    axes = list(zip(names, sizes))
    traffic = dict(zip(names, weights))
    placement = place_mesh(axes=axes, traffic=traffic, devices_per_node=devices_per_node)
    count = int(np.prod(sizes))
    assert sorted(placement) == list(range(count))
    cost = _off_node_cost(axes, placement, traffic, devices_per_node)
    naive = _off_node_cost(axes, tuple(range(count)), traffic, devices_per_node)
    # Greedy: the heaviest axis varies fastest over devices, then the next heaviest, ...
    order = sorted(range(len(names)), key=lambda i: traffic[names[i]])
    coords = np.unravel_index(np.arange(count), sizes)
    greedy = np.ravel_multi_index(tuple(coords[i] for i in order), [sizes[i] for i in order])
    assert cost <= naive + 1e-6 * (1 + naive)
    assert cost <= _off_node_cost(axes, tuple(greedy), traffic, devices_per_node) + 1e-6 * (
        1 + cost
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"axes": [("tp", 8), ("tp", 2)], "traffic": {}}, "distinct"),
        ({"axes": [("tp", 0)], "traffic": {}}, "size"),
        ({"axes": [("tp", 8)], "traffic": {"ep": 1.0}}, "traffic names axes"),
        ({"axes": [("tp", 8)], "traffic": {"tp": -1.0}}, "traffic"),
        ({"axes": [], "traffic": {}}, "axes"),
    ],
)
def test_bad_mesh_raises_value_error(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        place_mesh(devices_per_node=8, **kwargs)


def test_mesh_comm_time_checks_the_cluster_size() -> None:
    with pytest.raises(ValueError, match="devices"):
        mesh_comm_time(
            get_preset("dgx-h100"),
            axes=[("tp", 16)],
            placement=tuple(range(16)),
            traffic={"tp": TRAFFIC["tp"]},
        )
