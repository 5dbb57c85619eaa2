"""Collective-time model: published measurements, algorithm choice, contention, vectorization.

Reference figures are in ``tests/data/topology_reference.json`` (copied from the shared
reference file with their sources). Each check prints its ratio (run pytest with ``-s``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from topology import COLLECTIVE_OPS, Cluster, get_preset

RECORDS = json.loads((Path(__file__).parent / "data" / "topology_reference.json").read_text())[
    "records"
]
PRESET_OF_DEVICE = {
    "NVIDIA A100-SXM4-80GB": "dgx-a100",
    "NVIDIA H100 80GB HBM3": "dgx-h100",
    "NVIDIA H200": "dgx-h200",
}


def _aic_all_reduce(device: str) -> dict:
    (record,) = [r for r in RECORDS if r["table"] == "aic_nccl" and r["device"] == device]
    return record


@pytest.mark.parametrize("device", sorted(PRESET_OF_DEVICE))
def test_all_reduce_bus_bandwidth_at_512_mib_within_15_percent(device: str) -> None:
    record = _aic_all_reduce(device)
    cluster = get_preset(PRESET_OF_DEVICE[device])
    predicted = cluster.bus_bandwidth(
        "all_reduce", group_size=8, ranks_per_node=8, message_bytes=record["bytes"]
    )
    ratio = predicted / (record["busbw_GBps"] * 1e9)
    print(
        f"all_reduce 8x {device} 512 MiB: predicted {predicted / 1e9:.1f} GB/s, measured {record['busbw_GBps']} GB/s, ratio {ratio:.3f}"
    )
    assert abs(ratio - 1.0) <= 0.15


def _deepep_message_bytes(record: dict, *, combine: bool) -> float:
    """Per-rank all-to-all buffer: tokens x hidden x top-k x (FP8 dispatch, BF16 combine)."""
    hidden = int(re.search(r"hidden (\d+)", record["setting"]).group(1))
    top_k = int(re.search(r"top-(\d+) experts", record["setting"]).group(1))
    return record["tokens_per_batch"] * hidden * top_k * (2.0 if combine else 1.0)


DEEPEP = [r for r in RECORDS if r["table"] == "deepep_bw"]


@pytest.mark.parametrize("record", DEEPEP, ids=[f"ep{r['ep']}" for r in DEEPEP])
@pytest.mark.parametrize("phase", ["dispatch", "combine"])
def test_h800_all_to_all_within_20_percent_of_deepep(record: dict, phase: str) -> None:
    """DeepEP reports the bandwidth of the bottleneck link type: NVLink bytes per rank over the
    time inside a node (EP 8), RDMA bytes per rank over the time across nodes (EP 16-64)."""
    ep = record["ep"]
    cluster = get_preset("hgx-h800", num_nodes=max(1, ep // 8))
    size = _deepep_message_bytes(record, combine=phase == "combine")
    seconds = cluster.collective_time(
        "all_to_all", group_size=ep, ranks_per_node=min(ep, 8), message_bytes=size
    )
    traffic = cluster.traffic_per_rank(
        "all_to_all", group_size=ep, ranks_per_node=min(ep, 8), message_bytes=size
    )
    link = "intra_node" if record["link"] == "NVLink" else "inter_node"
    predicted = traffic[link] / seconds
    measured = record[f"{phase}_bw_GBps"] * 1e9
    ratio = predicted / measured
    print(
        f"H800 EP {ep} {phase} ({record['link']}): predicted {predicted / 1e9:.1f} GB/s, DeepEP {measured / 1e9:.0f} GB/s, ratio {ratio:.3f}"
    )
    assert abs(ratio - 1.0) <= 0.20


def test_h800_all_reduce_matches_the_reported_node_figure() -> None:
    (record,) = [r for r in RECORDS if r["table"] == "issue_collectives"]
    measured = float(re.search(r"(\d+) GB/s", record["value"]).group(1)) * 1e9
    predicted = get_preset("hgx-h800").bus_bandwidth(
        "all_reduce", group_size=8, ranks_per_node=8, message_bytes=2**30
    )
    print(
        f"all_reduce 8x H800: predicted {predicted / 1e9:.0f} GB/s, {record['source_thread']} {measured / 1e9:.0f} GB/s, ratio {predicted / measured:.3f}"
    )
    assert abs(predicted / measured - 1.0) <= 0.15


@pytest.mark.parametrize(
    ("prefix", "preset"), [("4 nodes x 8 H200", "dgx-h200"), ("P6-B200", "dgx-b200")]
)
def test_multi_node_all_reduce_within_15_percent(prefix: str, preset: str) -> None:
    """32 GPUs over 4 nodes with 400 Gb/s of scale-out per GPU (EFA): the NICs bound the ring."""
    (record,) = [
        r for r in RECORDS if r["table"] == "mle_collectives" and r["setup"].startswith(prefix)
    ]
    size = {"4GiB": 4 * 2**30, "16GiB": 16 * 2**30}[record["payload"]]
    data = json.loads(get_preset(preset, num_nodes=4).model_dump_json())
    data["inter_node"] |= {"bandwidth_bytes_per_s": "400 Gb/s", "kind": "efa"}
    cluster = Cluster.model_validate(data)
    predicted = cluster.bus_bandwidth(
        "all_reduce", group_size=32, ranks_per_node=8, message_bytes=size
    )
    ratio = predicted / (record["busbw_GBps"] * 1e9)
    print(
        f"all_reduce 4x8 {prefix}: predicted {predicted / 1e9:.0f} GB/s, measured {record['busbw_GBps']} GB/s, ratio {ratio:.3f}"
    )
    assert abs(ratio - 1.0) <= 0.15


@pytest.mark.parametrize("op", COLLECTIVE_OPS)
def test_every_op_is_positive_monotone_and_free_for_one_rank(op: str) -> None:
    cluster = get_preset("dgx-h100", num_nodes=8)
    sizes = np.logspace(3, 10, 15)
    group = 2 if op == "send_recv" else 16
    times = cluster.collective_time(
        op, group_size=group, ranks_per_node=min(group, 8), message_bytes=sizes
    )
    assert times.shape == sizes.shape and np.all(times > 0) and np.all(np.diff(times) > 0)
    assert cluster.collective_time(op, group_size=1, ranks_per_node=1, message_bytes=1e9) == 0.0


def test_algorithm_choice_follows_cost() -> None:
    cluster = get_preset("dgx-h100", num_nodes=32)
    algorithms = cluster.collective_algorithm_times(
        "all_reduce", group_size=256, ranks_per_node=8, message_bytes=np.array([1e4, 1e10])
    )
    assert set(algorithms) == {
        "ring",
        "tree",
        "hierarchical",
    }  # no in-switch reduction across nodes
    small, large = (
        np.array([algorithms[name][i] for name in ("ring", "tree", "hierarchical")]) for i in (0, 1)
    )
    assert small[0] > 3 * small.min()  # latency-bound: the ring's 510 steps lose
    assert large[0] == pytest.approx(
        large[1], rel=0.05
    )  # bandwidth-bound: ring and tree move the same bytes
    assert (
        large[2] > 1.5 * large.min()
    )  # hierarchical runs its intra- and inter-node phases one after another
    chosen = cluster.collective_time(
        "all_reduce", group_size=256, ranks_per_node=8, message_bytes=np.array([1e4, 1e10])
    )
    np.testing.assert_allclose(chosen, [small.min(), large.min()])
    names = cluster.collective_algorithm(
        "all_reduce", group_size=256, ranks_per_node=8, message_bytes=np.array([1e4, 1e10])
    )
    assert list(names) == [
        ["ring", "tree", "hierarchical"][int(small.argmin())],
        ["ring", "tree", "hierarchical"][int(large.argmin())],
    ]
    inside = get_preset("dgx-h100").collective_algorithm_times(
        "all_reduce", group_size=8, ranks_per_node=8, message_bytes=2**29
    )
    assert min(inside, key=inside.get) == "in_network"  # NVLink SHARP on H100
    a100 = get_preset("dgx-a100").collective_algorithm_times(
        "all_reduce", group_size=8, ranks_per_node=8, message_bytes=2**29
    )
    assert "in_network" not in a100


def test_nic_contention_when_devices_share_nics() -> None:
    data = json.loads(get_preset("dgx-h100", num_nodes=4).model_dump_json()) | {
        "devices_per_nic": 2
    }
    shared = Cluster.model_validate(data)
    alone = shared.collective_time(
        "all_reduce", group_size=4, ranks_per_node=1, message_bytes=2**30, concurrent_groups=1
    )
    crowded = shared.collective_time(
        "all_reduce", group_size=4, ranks_per_node=1, message_bytes=2**30, concurrent_groups=8
    )
    print(
        f"4-node all_reduce, 2 GPUs per NIC: 8 concurrent groups take {crowded / alone:.2f}x one group alone"
    )
    assert crowded / alone == pytest.approx(2.0, rel=0.05)
    dedicated = get_preset("dgx-h100", num_nodes=4)
    one = dedicated.collective_time(
        "all_reduce", group_size=4, ranks_per_node=1, message_bytes=2**30, concurrent_groups=1
    )
    eight = dedicated.collective_time(
        "all_reduce", group_size=4, ranks_per_node=1, message_bytes=2**30, concurrent_groups=8
    )
    assert eight == pytest.approx(one)  # one NIC per GPU: the rails do not contend


def test_oversubscription_slows_groups_that_leave_a_leaf() -> None:
    data = json.loads(get_preset("dgx-h100", num_nodes=64).model_dump_json()) | {
        "oversubscription": 4.0
    }
    cluster = Cluster.model_validate(data)
    inside_leaf = cluster.bus_bandwidth(
        "all_reduce", group_size=256, ranks_per_node=8, message_bytes=2**32
    )
    across = cluster.bus_bandwidth(
        "all_reduce", group_size=512, ranks_per_node=8, message_bytes=2**32
    )
    assert across < inside_leaf / 2


def test_vectorized_over_many_layouts_and_fast() -> None:
    import time

    cluster = get_preset("dgx-h100", num_nodes=128)
    rng = np.random.default_rng(0)
    groups = rng.choice([1, 2, 4, 8, 16, 64, 256], size=200_000)
    local = np.minimum(groups, rng.choice([1, 2, 4, 8], size=groups.size))
    sizes = rng.uniform(1e3, 1e9, size=groups.size)
    start = time.perf_counter()
    times = cluster.collective_time(
        "all_to_all", group_size=groups, ranks_per_node=local, message_bytes=sizes
    )
    elapsed = time.perf_counter() - start
    scalar = [
        cluster.collective_time("all_to_all", group_size=g, ranks_per_node=r, message_bytes=s)
        for g, r, s in zip(groups[:200], local[:200], sizes[:200])
    ]
    np.testing.assert_allclose(times[:200], scalar)
    print(f"200k all_to_all layouts priced in {elapsed * 1e3:.0f} ms")
    assert elapsed < 2.0


def test_explicit_group_uses_the_same_formula() -> None:
    cluster = get_preset("dgx-h100", num_nodes=4)
    sizes = np.array([1e4, 1e7, 1e9])
    for op in COLLECTIVE_OPS:
        devices = [0, 8] if op == "send_recv" else list(range(32))
        by_tiers = cluster.collective_time(
            op,
            group_size=len(devices),
            ranks_per_node=1 if op == "send_recv" else 8,
            message_bytes=sizes,
        )
        by_graph = cluster.collective_time_for_group(op, devices=devices, message_bytes=sizes)
        np.testing.assert_allclose(by_graph, by_tiers, rtol=1e-12)
    # two ranks per node on four nodes: as the tier model with ranks_per_node=2
    devices = [0, 1, 8, 9, 16, 17, 24, 25]
    np.testing.assert_allclose(
        cluster.collective_time_for_group("all_gather", devices=devices, message_bytes=sizes),
        cluster.collective_time("all_gather", group_size=8, ranks_per_node=2, message_bytes=sizes),
    )


def test_explicit_group_sees_a_slow_measured_link_and_a_mesh_subset() -> None:
    base = get_preset("dgx-h100")
    slow = base.model_copy(update={"links": ()}).model_dump() | {
        "links": [
            {
                "from_device": 2,
                "to_device": 3,
                "bandwidth_bytes_per_s": 20e9,
                "source": "measured: test",
            }
        ]
    }
    degraded = Cluster.model_validate(slow)
    fast = base.collective_time_for_group("all_reduce", devices=range(8), message_bytes=2**28)
    slowed = degraded.collective_time_for_group("all_reduce", devices=range(8), message_bytes=2**28)
    untouched = degraded.collective_time_for_group(
        "all_reduce", devices=[0, 1, 4, 5], message_bytes=2**28
    )
    assert slowed > 5 * fast and untouched == pytest.approx(
        base.collective_time_for_group("all_reduce", devices=[0, 1, 4, 5], message_bytes=2**28)
    )
    mesh = get_preset("mi300x")
    pair = mesh.bus_bandwidth("all_reduce", group_size=2, ranks_per_node=2, message_bytes=2**32)
    full = mesh.bus_bandwidth("all_reduce", group_size=8, ranks_per_node=8, message_bytes=2**32)
    print(
        f"MI300X all_reduce busBw: 2 GPUs {pair / 1e9:.0f} GB/s (measured 47.7), 8 GPUs {full / 1e9:.0f} GB/s (measured 312.9)"
    )
    assert full > 5 * pair  # a pair uses one XGMI link, eight GPUs all seven


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"group_size": 0, "ranks_per_node": 1}, "group_size"),
        ({"group_size": 8, "ranks_per_node": 9}, "ranks_per_node"),
        ({"group_size": 8, "ranks_per_node": 8, "concurrent_groups": 0}, "concurrent_groups"),
    ],
)
def test_bad_arguments_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        get_preset("dgx-h100").collective_time("all_reduce", message_bytes=1e6, **kwargs)


def test_bad_op_and_devices() -> None:
    cluster = get_preset("dgx-h100")
    with pytest.raises(ValueError, match="op"):
        cluster.collective_time("allreduce", group_size=8, ranks_per_node=8, message_bytes=1e6)
    with pytest.raises(ValueError, match="devices"):
        cluster.collective_time_for_group("all_reduce", devices=[0, 9], message_bytes=1e6)
    with pytest.raises(ValueError, match="devices"):
        cluster.collective_time_for_group("all_reduce", devices=[1, 1], message_bytes=1e6)


def test_explicit_group_crossing_scalable_units_pays_the_oversubscription() -> None:
    data = json.loads(get_preset("dgx-h100", num_nodes=64).model_dump_json()) | {
        "oversubscription": 4.0
    }
    cluster = Cluster.model_validate(data)
    same_unit = cluster.collective_time_for_group("all_reduce", devices=[0, 8], message_bytes=2**30)
    across_units = cluster.collective_time_for_group(
        "all_reduce", devices=[0, 8 * 40], message_bytes=2**30
    )
    assert across_units == pytest.approx(4.0 * same_unit, rel=0.01)
