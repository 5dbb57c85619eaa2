"""The probe on real gloo ranks (forked, 127.0.0.1): a measured Cluster, a slowed link, a dead rank.

Loopback numbers are noisy (shared/TESTING.md): nothing here asserts an absolute bandwidth;
the slowed link is slowed by two orders of magnitude so that it stands out.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from autoparallel.testing import RankFailure, run_ranks
from topology import Cluster, ProbeHooks, ProbeReport, ProbeSettings, get_preset
from topology.probe_runner import probe_pairs, probe_rank

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 5.0  # generous for healthy runs on a loaded 2-core machine
DEAD_TIMEOUT_S = 1.0
SMALL = ProbeSettings(
    p2p_message_bytes=1 << 17,
    collective_message_bytes=(1 << 12, 1 << 16),
    matmul_dim=96,
    copy_bytes=1 << 20,
    operation_timeout_s=TIMEOUT_S,
    run_name="test",
)


def _rank(rank: int, world_size: int, mode: str, output: str) -> object:
    if mode == "cli":
        from autoparallel.cli import main

        return main(
            [
                "probe",
                "--output",
                output,
                "--p2p-bytes",
                str(1 << 16),
                "--sizes",
                "4096",
                "--timeout-s",
                "5",
                "--run-name",
                "cli",
            ]
        )
    hooks = ProbeHooks()
    if mode == "slow":  # rank 1's sends to rank 2 sleep inside the timed region
        hooks = ProbeHooks(
            before_send=lambda sender, receiver: (
                time.sleep(0.1) if (sender, receiver) == (1, 2) else None
            )
        )
    if mode == "dead":  # rank 2 dies when it reaches its pair with rank 1
        hooks = ProbeHooks(
            before_step=lambda label: os._exit(1) if rank == 2 and label == "p2p 1<->2" else None
        )
    if mode == "hung":  # rank 2 stalls there for longer than the others wait
        hooks = ProbeHooks(
            before_step=lambda label: (
                time.sleep(5 * DEAD_TIMEOUT_S) if rank == 2 and label == "p2p 1<->2" else None
            )
        )
    settings = (
        SMALL.model_copy(update={"operation_timeout_s": DEAD_TIMEOUT_S})
        if mode in ("dead", "hung")
        else SMALL
    )
    return probe_rank(rank, world_size, settings=settings, hooks=hooks, base=None)


@pytest.mark.distributed
def test_four_rank_probe_gives_a_cluster_that_loads_and_estimates(tmp_path: Path) -> None:
    report, *others = run_ranks(_rank, 4, args=("ok", ""), timeout_s=120)
    assert others == [None, None, None] and isinstance(report, ProbeReport)
    assert len(report.p2p) == 12  # every ordered pair of 4 ranks
    assert all(
        link.bandwidth_bytes_per_s > 0 and link.latency_s > 0 and link.spread >= 0
        for link in report.p2p
    )
    assert {(row.op, row.group_size) for row in report.collectives} >= {
        ("all_reduce", 2),
        ("all_to_all", 4),
        ("reduce_scatter", 4),
    }
    assert {row.kind for row in report.compute} == {"matmul_fp32", "matmul_bf16", "memory_copy"}
    assert all(row.rate_per_s > 0 for row in report.compute)
    path = report.cluster.save(tmp_path / "cluster.json")
    cluster = Cluster.load(path)
    assert cluster == report.cluster and cluster.num_devices == 4
    assert cluster.provenance.startswith("measured:") and cluster.intra_node.source.startswith(
        "measured:"
    )
    assert all(source.startswith("measured:") for source in cluster.device.sources.values())
    seconds = cluster.collective_time(
        "all_reduce", group_size=4, ranks_per_node=4, message_bytes=np.array([1e3, 1e6])
    )
    assert np.all(seconds > 0) and seconds[1] > seconds[0]
    assert (
        cluster.collective_time_for_group("all_to_all", devices=[0, 1, 2, 3], message_bytes=1e6) > 0
    )
    matrix = cluster.bandwidth_matrix()
    np.testing.assert_allclose(matrix[~np.isnan(matrix)], report.p2p_matrix()[~np.isnan(matrix)])
    _estimate_with(cluster)


def _estimate_with(cluster: Cluster) -> None:
    """The measured cluster feeds the cost model like a preset does."""
    from autoparallel import get_model
    from cost_model import ParallelConfig, Training, estimate

    breakdown = estimate(
        get_model("tiny-moe"),
        cluster,
        Training(sequence_length_tokens=64, global_batch_sequences=8),
        ParallelConfig(dp=2, tp=2),
    )
    assert breakdown.step_time_s > 0


@pytest.mark.distributed
def test_slowed_sends_show_up_as_the_slowest_link() -> None:
    report = run_ranks(_rank, 4, args=("slow", ""), timeout_s=120)[0]
    slowest = report.slowest_link()
    matrix = report.p2p_matrix()
    others = np.delete(matrix.ravel(), [1 * 4 + 2] + [i * 5 for i in range(4)])
    print(
        f"slowed 1->2: {slowest.bandwidth_bytes_per_s / 1e6:.1f} MB/s; next slowest {np.nanmin(others) / 1e6:.1f} MB/s"
    )
    assert (slowest.from_device, slowest.to_device) == (1, 2)
    assert report.cluster.bandwidth_matrix()[1, 2] == slowest.bandwidth_bytes_per_s


@pytest.mark.distributed
def test_a_dead_rank_is_named_within_the_timeout() -> None:
    from autoparallel.runtime._ranks import preload_torch

    preload_torch()  # time the probe, not the first import of torch's distributed stack
    start = time.monotonic()
    with pytest.raises(RankFailure) as failure:
        run_ranks(_rank, 4, args=("dead", ""), timeout_s=60)
    elapsed = time.monotonic() - start
    errors = failure.value.errors
    print(
        f"dead rank reported after {elapsed:.1f} s; rank 1 says: {errors[1].strip().splitlines()[-1][:160]}"
    )
    assert "exited without a result" in errors[2]
    for survivor in (0, 1, 3):
        last = errors[survivor].strip().splitlines()[-1]
        assert "ProbeRankError" in last and "rank 2 did not respond" in last, last
    assert elapsed < 3 * DEAD_TIMEOUT_S + 8  # diagnosis waits about two operation timeouts


@pytest.mark.distributed
def test_a_hung_rank_is_named_by_the_others() -> None:
    with pytest.raises(RankFailure) as failure:
        run_ranks(_rank, 4, args=("hung", ""), timeout_s=60)
    errors = failure.value.errors
    for survivor in (0, 1, 3):
        last = errors[survivor].strip().splitlines()[-1]
        assert "ProbeRankError" in last and "rank 2 did not respond" in last, last


@pytest.mark.distributed
def test_cli_probe_writes_a_cluster_json(tmp_path: Path) -> None:
    output = tmp_path / "cluster.json"
    codes = run_ranks(_rank, 2, args=("cli", str(output)), timeout_s=120)
    assert codes == [0, 0]
    cluster = Cluster.load(output)
    assert cluster.num_devices == 2 and cluster.name == "probe-cli" and len(cluster.links) == 2


def test_saved_cpu_probe_report_loads() -> None:
    """The report the notebook draws (a torchrun run of ``autoparallel probe`` on 4 CPU ranks)."""
    report = ProbeReport.model_validate_json(
        (REPO / "benchmarks" / "results" / "probe_cpu_loopback_4ranks.json").read_text()
    )
    assert report.world_size == 4 and report.cluster.provenance.startswith("measured:")
    assert (
        report.cluster.collective_time(
            "all_reduce", group_size=4, ranks_per_node=4, message_bytes=1e6
        )
        > 0
    )


def test_pairs_all_up_to_64_ranks_then_sampled() -> None:
    assert len(probe_pairs(64)) == 64 * 63 // 2
    sampled = probe_pairs(256)
    assert len(sampled) < 256 * 255 // 2 and {(r, r + 1) for r in range(255)} <= set(sampled)
    assert sampled == sorted(sampled) == probe_pairs(256)  # one deterministic global order


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"repeats": 3}, "repeats"),
        ({"operation_timeout_s": 0}, "operation_timeout_s"),
        ({"repeat": 5}, "repeat"),
        ({"collective_ops": ["allreduce"]}, "collective_ops"),
        ({"matmul_dtypes": ["fp64"]}, "matmul_dtypes"),
    ],
)
def test_bad_settings_name_the_field(changes: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ProbeSettings.model_validate(changes)


def test_probe_base_preset_keeps_the_scale_out_tier() -> None:
    from topology import DeviceLink
    from topology._probe_cluster import _Identity
    from topology.probe_runner import CollectiveResult, ComputeResult, build_cluster

    links = [
        DeviceLink(from_device=a, to_device=b, bandwidth_bytes_per_s=3e11)
        for a in range(2)
        for b in range(2)
        if a != b
    ]
    compute = [
        ComputeResult(rank=r, kind=kind, rate_per_s=rate, spread=0.1)
        for r in range(2)
        for kind, rate in (("matmul_bf16", 7.9e14), ("memory_copy", 2.9e12))
    ]
    collectives = [
        CollectiveResult(
            op="all_reduce",
            group_size=2,
            ranks_per_node=2,
            message_bytes=2**26,
            median_s=4e-4,
            spread=0.1,
            bus_bandwidth_bytes_per_s=1.7e11,
        )
    ]
    identity = _Identity("unit", "nccl", "cuda", "NVIDIA H100 80GB HBM3", 80e9, 2, 2)
    base = get_preset("dgx-h100")
    cluster = build_cluster(
        identity=identity, links=links, collectives=collectives, compute=compute, base=base
    )
    assert cluster.inter_node == base.inter_node and cluster.intra_node.kind == "nvlink_switch"
    assert cluster.device.matmul_efficiency == pytest.approx(7.9e14 / 989e12)
    assert (
        cluster.intra_node.bandwidth_bytes_per_s == 3e11
        and cluster.intra_node.source.startswith("measured:")
    )
