"""Cluster model: presets with sources, JSON round trip, the graph, and bad input naming its field."""

from __future__ import annotations

import json

import networkx as nx
import numpy as np
import pytest

from topology import Cluster, DeviceLink, LinkTier, get_preset, list_presets
from topology._units import parse_quantity

REQUIRED = {
    "dgx-a100",
    "dgx-h100",
    "hgx-h800",
    "dgx-h200",
    "dgx-b200",
    "gb200-nvl72",
    "mi300x",
    "ascend-910b",
    "cpu-loopback",
}


def test_at_least_nine_presets_including_the_required_ones() -> None:
    names = set(list_presets())
    assert REQUIRED <= names
    assert any(name.startswith("mthreads-s") for name in names)
    assert len(names) >= 10


@pytest.mark.parametrize("name", list_presets())
def test_every_preset_value_has_a_source_and_round_trips(name: str, tmp_path) -> None:
    cluster = get_preset(name)
    for field in (
        "peak_flops",
        "matmul_efficiency",
        "memory_bytes",
        "memory_bandwidth_bytes_per_s",
    ):
        assert cluster.device.sources[field].startswith("preset:"), field
    assert cluster.intra_node.source.startswith("preset:") and cluster.inter_node.source.startswith(
        "preset:"
    )
    assert cluster.provenance.startswith("preset:")
    for field in cluster.device.uncertain:  # uncertain fields exist and their source says why
        assert field in type(cluster.device).model_fields
    loaded = Cluster.load(cluster.save(tmp_path / f"{name}.json"))
    assert loaded == cluster and loaded.fingerprint() == cluster.fingerprint()


def test_uncertain_hardware_is_marked() -> None:
    assert "peak_flops" in get_preset("ascend-910b").device.uncertain
    assert "peak_flops" in get_preset("hgx-h800").device.uncertain
    assert get_preset("mthreads-s4000").device.uncertain
    assert "UNCERTAIN" in get_preset("mthreads-s4000").intra_node.source


def test_h800_numbers_follow_the_issue() -> None:
    h800 = get_preset("hgx-h800")
    assert h800.intra_node.bandwidth_bytes_per_s == 200e9  # nominal per direction
    assert h800.intra_node.bandwidth_bytes_per_s * h800.intra_node.efficiency == pytest.approx(
        160e9
    )  # measured
    assert h800.inter_node.bandwidth_bytes_per_s == 50e9  # 400 Gb/s IB per GPU


def test_cpu_loopback_cites_the_loopback_measurements() -> None:
    cpu = get_preset("cpu-loopback")
    assert cpu.devices_per_node == 4 and cpu.num_devices == 4
    assert "TESTING.md" in cpu.intra_node.source and cpu.device.device_type == "cpu"


def test_with_nodes_scales_and_keeps_the_hardware() -> None:
    base = get_preset("dgx-h100")
    scaled = get_preset("dgx-h100", num_nodes=16)
    assert (
        scaled.num_devices == 128 and scaled.device == base.device and scaled.name == "dgx-h100@16n"
    )
    assert scaled.with_nodes(2).name == "dgx-h100@2n"


def test_graph_has_devices_fabric_nics_leaves_and_spine() -> None:
    cluster = get_preset("dgx-h100", num_nodes=64)
    graph = cluster.graph()
    kinds = nx.get_node_attributes(graph, "kind")
    assert sum(kind == "device" for kind in kinds.values()) == 512
    assert sum(kind == "nic" for kind in kinds.values()) == 512
    assert sum(kind == "switch" for kind in kinds.values()) == 64
    assert (
        sum(kind == "leaf" for kind in kinds.values()) == 16
    )  # 8 rails x 2 scalable units of 32 nodes
    assert kinds["spine"] == "spine"
    for _, _, data in graph.edges(data=True):
        assert data["bandwidth_bytes_per_s"] > 0 and data["latency_s"] >= 0 and data["source"]
    # rail-optimized: NIC 3 of nodes 0 and 31 share a leaf; node 32 is in the next scalable unit
    leaf = {
        name: next(n for n in graph[name] if kinds[n] == "leaf")
        for name in ("node0.nic3", "node31.nic3", "node32.nic3", "node0.nic4")
    }
    assert leaf["node0.nic3"] == leaf["node31.nic3"] != leaf["node32.nic3"]
    assert leaf["node0.nic3"] != leaf["node0.nic4"]  # one leaf per rail


def test_mesh_fabric_links_devices_pairwise() -> None:
    graph = get_preset("mi300x").graph()
    assert graph["dev0"]["dev5"]["bandwidth_bytes_per_s"] == pytest.approx(
        64e9
    )  # 448 / 7 per peer link
    assert graph["dev0"]["dev5"]["kind"] == "xgmi_mesh"


def test_fat_tree_oversubscription_reaches_the_spine_uplinks() -> None:
    data = json.loads(get_preset("dgx-h100").model_dump_json()) | {
        "network_topology": "fat_tree",
        "oversubscription": 2.0,
        "num_nodes": 8,
    }
    cluster = Cluster.model_validate(data)
    assert cluster.nodes_per_leaf == 4
    uplink = cluster.graph()["leaf0"]["spine"]["bandwidth_bytes_per_s"]
    assert uplink == pytest.approx(32 * 50e9 / 2.0)


def test_bandwidth_matrix_uses_measured_links_and_path_bottlenecks() -> None:
    base = get_preset("dgx-h100", num_nodes=2)
    slow = DeviceLink(
        from_device=1, to_device=2, bandwidth_bytes_per_s=10e9, source="measured: test"
    )
    cluster = base.model_copy(update={"links": (slow,)})
    cluster = Cluster.model_validate(cluster.model_dump())
    matrix = cluster.bandwidth_matrix()
    assert matrix[1, 2] == 10e9 and matrix[2, 1] == 450e9
    assert matrix[0, 8] == 50e9  # across nodes: the NIC
    assert np.isnan(matrix[3, 3])


def test_quantities_with_units_parse_once() -> None:
    assert parse_quantity("400 Gb/s", kind="bytes_per_s") == 50e9
    assert parse_quantity("450 GB/s", kind="bytes_per_s") == 450e9
    assert parse_quantity("1 GiB/s", kind="bytes_per_s") == 2**30
    assert parse_quantity("5 us", kind="seconds") == pytest.approx(5e-6)
    assert parse_quantity(3.0, kind="seconds") == 3.0


def _tier(**changes) -> dict:
    return {
        "kind": "nvlink_switch",
        "bandwidth_bytes_per_s": "450 GB/s",
        "latency_s": "3 us",
    } | changes


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"bandwidth_bytes_per_s": -1.0}, "bandwidth_bytes_per_s"),
        ({"bandwidth_bytes_per_s": "450 GB/z"}, "bandwidth_bytes_per_s"),
        ({"bandwidth_bytes_per_s": "450 GB"}, "bandwidth_bytes_per_s"),  # a size, not a bandwidth
        ({"latency_s": "3 usec"}, "latency_s"),
        ({"bandwidth_gbps": 450}, "bandwidth_gbps"),  # a unit typo in the key
        ({"efficiency": 1.5}, "efficiency"),
        ({"kind": "nvlink_swich"}, "kind"),
    ],
)
def test_bad_link_tier_raises_value_error_naming_the_field(changes: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        LinkTier.model_validate(_tier(**changes))


def test_unknown_key_suggests_the_field() -> None:
    with pytest.raises(ValueError, match="did you mean 'intra_node'"):
        Cluster.model_validate(
            json.loads(get_preset("dgx-h100").model_dump_json()) | {"intra_nodes": {}}
        )


def test_link_to_a_missing_device_names_the_field() -> None:
    data = json.loads(get_preset("dgx-h100").model_dump_json())
    data["links"] = [{"from_device": 0, "to_device": 8, "bandwidth_bytes_per_s": 1e9}]
    with pytest.raises(ValueError, match=r"links\[0\]\.to_device \(8\) is not a device"):
        Cluster.model_validate(data)
    data["links"] = [{"from_device": 0, "to_device": 1, "bandwidth_bytes_per_s": -5.0}]
    with pytest.raises(ValueError, match="bandwidth_bytes_per_s"):
        Cluster.model_validate(data)


def test_unknown_preset_and_bad_node_count() -> None:
    with pytest.raises(ValueError, match="cluster preset .*'dgx-h1000'.* unknown"):
        get_preset("dgx-h1000")
    with pytest.raises(ValueError, match="num_nodes"):
        get_preset("dgx-h100", num_nodes=0)


def test_devices_per_nic_must_divide_the_node() -> None:
    data = json.loads(get_preset("dgx-h100").model_dump_json()) | {"devices_per_nic": 3}
    with pytest.raises(ValueError, match="devices_per_nic"):
        Cluster.model_validate(data)
