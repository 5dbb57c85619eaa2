"""``autoparallel clusters``: every preset in a table, ``--nodes`` scales, bad names exit 2."""

from __future__ import annotations

import pytest

from autoparallel.cli import main
from topology import list_presets


def test_clusters_lists_every_preset(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["clusters"]) == 0
    out = capsys.readouterr().out
    for name in list_presets():
        assert name[:6] in out
    assert "Cluster presets" in out


def test_clusters_nodes_scales_and_sources_are_shown(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["clusters", "hgx-h800", "--nodes", "16", "--sources"]) == 0
    out = capsys.readouterr().out
    assert "16x8" in out and "DeepEP" in out and "UNCERTAIN" in out


def test_unknown_preset_is_a_user_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["clusters", "dgx-h1000"]) == 2
    assert "dgx-h1000" in capsys.readouterr().err


def test_one_rank_probe_needs_a_base_preset() -> None:
    from topology._probe_cluster import _Identity
    from topology.probe_runner import ComputeResult, build_cluster

    compute = [
        ComputeResult(rank=0, kind=kind, rate_per_s=1e12, spread=0.0)
        for kind in ("matmul_bf16", "memory_copy")
    ]
    identity = _Identity("one", "nccl", "cuda", "NVIDIA H200", 141e9, 1, 1)
    with pytest.raises(ValueError, match="base"):
        build_cluster(identity=identity, links=[], collectives=[], compute=compute)
    from topology import get_preset

    cluster = build_cluster(
        identity=identity, links=[], collectives=[], compute=compute, base=get_preset("dgx-h200")
    )
    assert cluster.num_devices == 1 and cluster.device.matmul_efficiency == pytest.approx(
        1e12 / 989e12
    )
    assert cluster.provenance.startswith("measured:")
