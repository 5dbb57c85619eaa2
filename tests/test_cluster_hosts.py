"""Rack-scale NVLink domains span several hosts: a GB200 NVL72 rack is one 72-GPU node of 18
4-GPU compute trays. Plans may leave whole trays idle (its published training runs use 64 of
the 72 GPUs), and every launcher counts hosts, not NVLink domains."""

from __future__ import annotations

import json

import pytest

import autoparallel as ap
from autoparallel.cli import main
from autoparallel.export import export_plan
from autoparallel.plan._load import load_plan
from cost_model import Training
from search import SearchSettings, find_plan
from topology import DeviceLink, get_preset

RACK = get_preset("gb200-nvl72")
# 1024 sequences: dp takes no factor 9 of the rack's 72 = 2^3·3^2 GPUs
WORKLOAD = Training(sequence_length_tokens=4096, global_batch_sequences=1024)


def test_the_rack_presets_name_their_trays() -> None:
    for name in ("gb200-nvl72", "gb300-nvl72"):
        rack = get_preset(name)
        assert (rack.devices_per_node, rack.devices_per_host, rack.host_devices) == (72, 4, 4)
        assert "compute trays of 4 GPUs" in rack.provenance
    assert get_preset("dgx-h100").host_devices == 8  # a DGX node is one host


def test_whole_hosts_of_a_node_are_kept_and_the_rest_renumbered() -> None:
    links = (
        DeviceLink(from_device=3, to_device=60, bandwidth_bytes_per_s=1e11),
        DeviceLink(from_device=70, to_device=1, bandwidth_bytes_per_s=1e11),
        DeviceLink(from_device=75, to_device=130, bandwidth_bytes_per_s=1e11),
    )
    racks = RACK.with_nodes(2).model_copy(update={"links": links})
    used = racks.with_devices_per_node(64)
    assert (used.num_nodes, used.devices_per_node, used.num_devices) == (2, 64, 128)
    assert used.name == "gb200-nvl72@2n64d"
    # device 75 is node 1's device 3 -> 64 + 3; device 130 is node 1's 58 -> 122; 70 is idle
    assert [(link.from_device, link.to_device) for link in used.links] == [(3, 60), (67, 122)]
    with pytest.raises(
        ValueError, match=r"devices per node \(66\) must be a whole number of hosts of 4"
    ):
        RACK.with_devices_per_node(66)
    with pytest.raises(ValueError, match=r"devices per node \(80\) must be in 1\.\.72"):
        RACK.with_devices_per_node(80)
    with pytest.raises(
        ValueError, match=r"devices_per_host \(5\) must divide devices_per_node \(72\)"
    ):
        RACK.model_validate(RACK.model_dump() | {"devices_per_host": 5})


def test_a_rack_plan_may_leave_trays_idle() -> None:
    whole = find_plan(ap.get_model("llama-3.1-8b"), RACK, WORKLOAD, n_trials=100)
    compared = find_plan(
        ap.get_model("llama-3.1-8b"),
        RACK,
        WORKLOAD,
        n_trials=100,
        settings=SearchSettings(idle_devices="compare"),
    )
    assert whole.settings["num_devices_used"] == 72 and whole.settings["idle_reason"] == ""
    assert 72 % whole.best.config.pp == 0 and whole.best.config.pp % 3 == 0  # dp takes no 3
    used = compared.settings
    assert (used["num_nodes_used"], used["devices_per_node_used"]) == (1, 64)
    assert "16 of the 18 hosts of 4 devices" in used["idle_reason"]
    # it is kept because its step (the same global batch) is shorter, not per device only
    assert compared.best.metrics["step_time_s"] < whole.best.metrics["step_time_s"]


def test_a_rack_plan_launches_on_its_hosts(tmp_path) -> None:
    out = tmp_path / "plan.json"
    main(
        [
            "plan",
            "--training",
            "--model",
            "llama-3.1-8b",
            "--cluster",
            "gb200-nvl72",
            "--global-batch-tokens",
            str(1024 * 8192),
            "--idle-devices",
            "compare",
            "--output",
            str(out),
        ]
    )
    plan = load_plan(out)
    assert (plan.world_size, plan.devices_per_node, plan.devices_per_host) == (64, 64, 4)
    assert json.loads(out.read_text())["devices_per_host"] == 4
    for engine in ("megatron", "torchtitan"):
        launch = "\n".join(export_plan(plan, format=engine).files.values())
        assert "--nnodes 16" in launch and "--nproc-per-node 4" in launch, engine


def test_a_rack_serving_plan_counts_trays(tmp_path) -> None:
    out = tmp_path / "plan.json"
    main(["plan", "--output", str(out)])  # ref-3t-moe on gb200-nvl72, disaggregated pools
    plan = load_plan(out)
    assert plan.devices_per_host == 4
    sglang = export_plan(plan, format="sglang").files
    assert plan.disaggregated
    for pool in plan.deployment.pools:
        launch = " ".join(sglang[f"launch_sglang_{pool.role}.sh"].split())
        if pool.devices_per_unit > 4:
            assert f"--nnodes {pool.devices_per_unit // 4}" in launch
    readme = sglang["README_sglang.md"]
    assert "bash sglang_expert_location.json" not in readme
    trtllm = "\n".join(export_plan(plan, format="trtllm").files.values())
    assert "--gpus_per_node\n" not in trtllm and "--gpus_per_node 4" in " ".join(trtllm.split())


def _probe_links(world: int, host: int, rate) -> list:
    """Every directed pair of ``world`` ranks at ``rate(host_a, host_b)`` bytes/s."""
    return [
        DeviceLink(from_device=a, to_device=b, bandwidth_bytes_per_s=rate(a // host, b // host))
        for a in range(world)
        for b in range(world)
        if a != b
    ]


def _probe(links, *, world: int, host: int):
    from topology._probe_cluster import _Identity
    from topology.probe_runner import ComputeResult, build_cluster

    compute = [
        ComputeResult(rank=r, kind=kind, rate_per_s=rate, spread=0.1)
        for r in range(world)
        for kind, rate in (("matmul_bf16", 2.2e15), ("memory_copy", 7e12))
    ]
    identity = _Identity("rack", "nccl", "cuda", "NVIDIA GB200", 186e9, world, host)
    return build_cluster(identity=identity, links=links, collectives=[], compute=compute)


def test_a_probe_joins_hosts_that_share_a_scale_up_fabric() -> None:
    # two "racks" of 2 hosts x 4 ranks: NVLink (800 GB/s) within a rack, 45 GB/s NICs across
    def rack_rate(a: int, b: int) -> float:
        return 8e11 if a // 2 == b // 2 else 4.5e10

    rack = _probe(_probe_links(16, 4, rack_rate), world=16, host=4)
    assert (rack.num_nodes, rack.devices_per_node, rack.devices_per_host) == (2, 8, 4)
    assert rack.intra_node.bandwidth_bytes_per_s == 8e11
    assert rack.inter_node.bandwidth_bytes_per_s == 4.5e10
    assert "2 hosts of 4 ranks per scale-up domain" in rack.provenance
    # DGX-like hosts: the scale-out link is far below NVLink, each host stays a node
    dgx = _probe(_probe_links(16, 4, lambda a, b: 8e11 if a == b else 4.5e10), world=16, host=4)
    assert (dgx.num_nodes, dgx.devices_per_node, dgx.devices_per_host) == (4, 4, None)
    # fast pairs that are not runs of consecutive hosts are not read as domains
    odd = _probe(
        _probe_links(16, 4, lambda a, b: 8e11 if a % 2 == b % 2 else 4.5e10), world=16, host=4
    )
    assert (odd.devices_per_node, odd.devices_per_host) == (4, None)


def test_a_one_rank_probe_on_a_rack_preset_is_one_device() -> None:
    from topology._probe_cluster import _Identity
    from topology.probe_runner import ComputeResult, build_cluster

    compute = [
        ComputeResult(rank=0, kind=kind, rate_per_s=rate, spread=0.1)
        for kind, rate in (("matmul_bf16", 2.2e15), ("memory_copy", 7e12))
    ]
    identity = _Identity("one", "nccl", "cuda", "NVIDIA GB200", 186e9, 1, 1)
    one = build_cluster(identity=identity, links=[], collectives=[], compute=compute, base=RACK)
    assert (one.num_devices, one.host_devices, one.inter_node) == (1, 1, RACK.inter_node)
