"""Presets (DGX-2, DGX A100 40GB, Blackwell), their sources, the network override and the
calibration a Blackwell preset carries over from H100."""

from __future__ import annotations

import numpy as np
import pytest

from autoparallel.cli import main
from cost_model import ParallelConfig, Training, estimate
from cost_model._options import calibration_for
from topology import get_preset, list_presets, network_override, value_status

BLACKWELL = ("dgx-b200", "gb200-nvl72", "gb300-nvl72")


def test_dgx2_is_sixteen_v100_on_nvswitch_with_one_nic_per_two_gpus() -> None:
    cluster = get_preset("dgx-2", num_nodes=2)
    assert cluster.devices_per_node == 16 and cluster.devices_per_nic == 2
    assert cluster.device.memory_bytes == 32e9
    assert cluster.device.peak_flops_for("fp16") == 125e12
    with pytest.raises(ValueError, match="bf16"):
        cluster.device.peak_flops_for("bf16")  # Volta has no bf16: train in fp16


def test_dgx_a100_40gb_differs_from_80gb_only_in_memory_and_shares_its_calibration() -> None:
    small, large = get_preset("dgx-a100-40gb"), get_preset("dgx-a100")
    assert (
        small.device.memory_bytes == 40e9 and small.device.memory_bandwidth_bytes_per_s == 1.555e12
    )
    assert small.device.peak_flops == large.device.peak_flops
    assert small.intra_node == large.intra_node and small.inter_node == large.inter_node
    assert calibration_for(small.device).device_pattern == "A100"


def test_inter_node_override_slows_cross_node_collectives_and_records_its_source() -> None:
    base = get_preset("dgx-h100", num_nodes=4)
    slow = get_preset("dgx-h100", num_nodes=4, inter_node_bytes_per_s=100e9 / 8)
    assert slow.inter_node.bandwidth_bytes_per_s == pytest.approx(12.5e9)
    assert slow.inter_node.source.startswith("override: 100 Gb/s")
    kwargs = {"group_size": 32, "ranks_per_node": 8, "message_bytes": 1e9}
    assert slow.collective_time("all_reduce", **kwargs) > 2.0 * base.collective_time(
        "all_reduce", **kwargs
    )
    inside = {"group_size": 8, "ranks_per_node": 8, "message_bytes": 1e9}
    assert slow.collective_time("all_reduce", **inside) == pytest.approx(
        base.collective_time("all_reduce", **inside)
    )
    with pytest.raises(ValueError, match="bandwidth_bytes_per_s"):
        base.with_inter_node_bandwidth(0.0)


def test_network_override_applies_inside_the_block_only() -> None:
    with network_override(inter_node_bytes_per_s=50e9 / 8):
        assert get_preset("dgx-b200").inter_node.bandwidth_bytes_per_s == pytest.approx(6.25e9)
    assert get_preset("dgx-b200").inter_node.bandwidth_bytes_per_s == pytest.approx(50e9)
    with (
        pytest.raises(ValueError, match="inter_node_bytes_per_s"),
        network_override(inter_node_bytes_per_s=-1.0),
    ):
        pass


def test_every_preset_value_has_a_source_and_blackwell_marks_its_estimates() -> None:
    for name in list_presets():
        statuses = value_status(get_preset(name))
        assert all(status != "missing" for status, _ in statuses.values()), name
    for name in BLACKWELL:
        statuses = value_status(get_preset(name))
        assert all(source for _, source in statuses.values())
        # each Blackwell device is priced with a fit on its own operator tables, not a carried one
        assert (
            calibration_for(get_preset(name).device).fit["fit_on"] == "operator measurements only"
        )
    gb200 = value_status(get_preset("gb200-nvl72"))
    assert gb200["device.peak_flops"][0] == "uncertain"  # vendor tables disagree (2.5 vs 2.25 PF)
    assert gb200["device.memory_bytes"][0] == "sourced"
    # the Grace host's time per eager operator, from the engines' own tables on both hosts
    for name in ("gb200-nvl72", "gb300-nvl72"):
        status, source = value_status(get_preset(name))["device.host_op_time_factor"]
        assert status == "sourced" and "aiconfigurator-core" in source
        assert get_preset(name).device.host_op_time_factor == 2.0
    assert get_preset("dgx-b200").device.host_op_time_factor == 1.0
    with pytest.raises(ValueError, match="host_op_time_factor"):
        get_preset("dgx-b200").device.model_copy(update={}).model_validate(
            {**get_preset("dgx-b200").device.model_dump(), "host_op_time_factor": 0.0}
        )


def test_blackwell_hbm_is_the_allocatable_capacity_not_vendor_gigabytes() -> None:
    assert get_preset("dgx-b200").device.memory_bytes == pytest.approx(178.35 * 2**30, rel=1e-4)
    assert get_preset("gb200-nvl72").device.memory_bytes == pytest.approx(184.31 * 2**30, rel=1e-4)
    # DGX B200 ships one ConnectX-7 400G NIC per GPU.
    assert get_preset("dgx-b200").inter_node.bandwidth_bytes_per_s == pytest.approx(50e9)


def test_a_device_without_tables_carries_its_reference_fit_relative_to_its_matmul_ceiling() -> None:
    h100 = get_preset("dgx-h100").device
    fitted = calibration_for(h100)
    for name in BLACKWELL:
        # the same silicon under a name no operator table matches, naming H100 as its reference
        device = get_preset(name).device.model_copy(
            update={"name": f"Custom {name} board", "calibration_reference": "dgx-h100"}
        )
        carried = calibration_for(device)
        ratio = device.matmul_efficiency / h100.matmul_efficiency
        assert carried.fit["transferred_from"] == fitted.device_pattern
        assert carried.matmul_efficiency == pytest.approx(fitted.matmul_efficiency * ratio)
        assert carried.attention_efficiency == pytest.approx(fitted.attention_efficiency * ratio)
        assert carried.kernel_overhead_s == fitted.kernel_overhead_s
    assert not calibration_for(get_preset("mi300x").device).fit  # no reference named: neutral


def test_cli_network_and_precision_options(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "estimate",
        "--model",
        "megatron-gpt-22b",
        "--cluster",
        "dgx-h100",
        "--nodes",
        "2",
        "--tp",
        "8",
        "--pp",
        "1",
        "--ep",
        "1",
        "--sequence-length",
        "2048",
        "--global-batch-tokens",
        str(2048 * 16),
        "--json",
    ]
    assert main(args) == 0
    base = capsys.readouterr().out
    assert (
        main(
            [
                *args,
                "--inter-node-gbps",
                "25",
                "--precision",
                "fp8",
                "--fp8-recipe",
                "delayed",
                "--gradient-dtype",
                "bf16",
            ]
        )
        == 0
    )
    changed = capsys.readouterr().out
    assert base != changed
    assert main([*args, "--inter-node-gbps", "0"]) == 2
    assert "--inter-node-gbps" in capsys.readouterr().err


def test_clusters_sources_prints_each_value_status(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["clusters", "gb200-nvl72", "dgx-2", "--sources"]) == 0
    out = capsys.readouterr().out
    assert "uncertain" in out and "sourced" in out and "dgx-2" in out


def test_slower_fabric_slows_a_data_parallel_step() -> None:
    from autoparallel._catalog import get_model

    model = get_model("megatron-gpt-22b")
    workload = Training(sequence_length_tokens=2048, global_batch_sequences=64, precision="bf16")
    config = ParallelConfig(
        dp=4, tp=8, micro_batch_size=1, recompute="selective", sequence_parallel=True, zero_stage=0
    )
    fast = estimate(model, get_preset("dgx-h100", num_nodes=4), workload, config)
    slow = estimate(
        model,
        get_preset("dgx-h100", num_nodes=4, inter_node_bytes_per_s=10e9 / 8),
        workload,
        config,
    )
    assert slow.time_s["dp_comm"] > fast.time_s["dp_comm"]


def test_the_default_memory_efficiency_sits_between_generic_and_streaming_kernels() -> None:
    """The cited measurements of ``DEFAULT_MEMORY_BANDWIDTH_EFFICIENCY``, read from their data:
    the first-party H200 profile's eager add and aiconfigurator's static FP8 quantization."""
    import importlib.util
    import json
    from pathlib import Path

    from pyarrow import parquet

    from topology._hardware import DEFAULT_MEMORY_BANDWIDTH_EFFICIENCY

    repo = Path(__file__).resolve().parents[1]
    profile = json.loads((repo / "benchmarks" / "results" / "profile_h200.json").read_text())
    h200 = get_preset("dgx-h200").device
    rates = [w / s for w, s in zip(profile["memory"]["work"], profile["memory"]["seconds"])]
    generic = rates[-1] / h200.memory_bandwidth_bytes_per_s  # 1.61 GB per call
    assert generic == pytest.approx(0.84, abs=0.005)
    assert rates[-2] / h200.memory_bandwidth_bytes_per_s == pytest.approx(0.73, abs=0.005)
    spec = importlib.util.find_spec("aiconfigurator_core")
    assert spec is not None and spec.submodule_search_locations, "pip install -e .[test]"
    data = Path(next(iter(spec.submodule_search_locations))) / "systems" / "data"
    streaming = {}
    for folder, preset in (
        ("h100_sxm", "dgx-h100"),
        ("h200_sxm", "dgx-h200"),
        ("b200_sxm", "dgx-b200"),
    ):
        best: dict[tuple[int, int], float] = {}
        for engine in ("trtllm", "vllm"):
            for path in (data / folder / "quantize" / engine).glob("*/scale_matrix_perf.parquet"):
                for row in parquet.read_table(path).to_pylist():
                    nbytes = 3.0 * row["m"] * row["k"]
                    if nbytes >= 1 << 30 and row["latency"] > 0:
                        key = (row["m"], row["k"])
                        best[key] = min(best.get(key, float("inf")), row["latency"] * 1e-3)
        peak = get_preset(preset).device.memory_bandwidth_bytes_per_s
        fractions = [3.0 * m * k / (s * peak) for (m, k), s in best.items()]
        streaming[folder] = float(np.exp(np.mean(np.log(fractions))))
    assert streaming["h100_sxm"] == pytest.approx(0.91, abs=0.005)
    assert streaming["h200_sxm"] == pytest.approx(0.91, abs=0.005)
    assert streaming["b200_sxm"] == pytest.approx(0.85, abs=0.005)
    assert DEFAULT_MEMORY_BANDWIDTH_EFFICIENCY <= generic < min(streaming.values())
