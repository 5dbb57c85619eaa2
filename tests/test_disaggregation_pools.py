"""Disaggregation without a box: unit sizes, asymmetric pools and per-pool serving settings."""

from __future__ import annotations

from pathlib import Path

from autoparallel import get_model
from cost_model import Inference, Layout, ParallelConfig, ServingConfig, configs_to_table
from search._candidate import Candidate
from search._disaggregation import _pool, unit_sizes
from topology import get_preset

EXAMPLES = Path(__file__).resolve().parents[1] / "autoparallel" / "schema" / "examples"
REF = get_model("ref-3t-moe")
WORKLOAD = Inference(prompt_tokens=4096, output_tokens=1024, weight_dtype="fp8")


def test_nvl72_unit_sizes_are_not_limited_to_divisors_or_half_the_rack() -> None:
    sizes = unit_sizes(model=REF, cluster=get_preset("gb200-nvl72"), workload=WORKLOAD)
    smallest = -(-REF.weight_bytes("fp8") // get_preset("gb200-nvl72").memory_per_device_bytes)
    assert min(sizes) >= smallest
    assert {20, 24, 28, 32, 36, 40, 48} <= set(sizes)  # 48 + a 24-device unit: asymmetric pools
    assert max(sizes) + min(sizes) <= 72
    # whole 4-GPU trays (the rack's hosts): no 18- or 9-GPU unit straddles a tray
    assert all(size % 4 == 0 for size in sizes)


def test_a_unit_inside_a_rack_is_whole_hosts_or_part_of_one() -> None:
    from search._disaggregation import unit_cluster

    rack = get_preset("gb200-nvl72")
    unit = unit_cluster(rack, 32)
    assert (unit.num_devices, unit.devices_per_node, unit.devices_per_host) == (32, 32, 4)
    tiny = unit_cluster(rack, 2)  # half a tray: a host of its own
    assert (tiny.num_devices, tiny.host_devices) == (2, 2)
    assert unit_cluster(rack.with_nodes(2), 144).num_devices == 144


def test_eight_gpu_nodes_offer_whole_nodes_up_to_the_cluster_less_one_unit() -> None:
    model = get_model("deepseek-v3")
    sizes = unit_sizes(model=model, cluster=get_preset("dgx-h200", num_nodes=6), workload=WORKLOAD)
    assert sizes == [8, 16, 24, 32, 40]


def test_each_pool_keeps_its_own_serving_settings() -> None:
    serving = ServingConfig(
        batch_size=64,
        kv_dtype="fp8",
        num_redundant_experts=8,
        two_batch_overlap=True,
        phase="prefill",
    )
    candidate = Candidate(
        Layout(config=ParallelConfig(dp=8, ep=8), serving=serving),
        metrics={},
        violations={},
    )
    prefill, decode = _pool(candidate, "prefill"), _pool(candidate, "decode")
    assert prefill.serving.a2a_backend == "normal" and decode.serving.a2a_backend == "low_latency"
    assert prefill.serving.batch_size == 64 and prefill.serving.two_batch_overlap
    assert prefill.serving.num_redundant_experts == 8


def test_pool_exports_run_the_all_to_all_kernels_their_pool_was_priced_with() -> None:
    """Each pool's export runs the DeepEP kernels its serving settings name, even against the
    engine's per-phase default (here swapped: low-latency prefill, normal decode)."""
    from autoparallel.export import export_plan
    from autoparallel.plan import load_plan

    plan = load_plan(EXAMPLES / "deepseek-v3_disaggregated_512xh800.json")
    backend = {"prefill": "low_latency", "decode": "normal"}
    pools = tuple(
        pool.model_copy(
            update={
                "serving": pool.serving.model_copy(
                    update={"all_to_all_backend": backend[pool.role]}
                )
            }
        )
        for pool in plan.deployment.pools
    )
    plan = plan.model_copy(
        update={"deployment": plan.deployment.model_copy(update={"pools": pools})}
    )
    files = export_plan(plan, format="vllm", model_path="deepseek-ai/DeepSeek-V3").files
    prefill = next(text for name, text in files.items() if "prefill" in name)
    decode = next(text for name, text in files.items() if "decode" in name)
    assert "--all2all-backend deepep_low_latency" in prefill
    assert "--all2all-backend deepep_high_throughput" in decode


def test_pools_are_recorded_as_the_split_priced_them() -> None:
    """Each pool is recorded in its own phase at the batch its rate was priced at, so the pools'
    recorded rates carry the deployment's claimed output rate (the binding pool exactly) and the
    exported batch caps are the ones that rate needs."""
    import pytest

    import autoparallel as ap

    workload = Inference(prompt_tokens=2000, output_tokens=500, ttft_slo_s=5.0, tpot_slo_s=0.05)
    plan = ap.find_plan("llama-3.1-70b", get_preset("dgx-h100"), workload)
    deployment = plan.deployment
    assert deployment.kind == "disaggregated"
    pools = {pool.role: pool for pool in deployment.pools}
    used = sum(pool.num_devices for pool in deployment.pools)
    requests_per_s = (
        deployment.disaggregated_output_tokens_per_s_per_device * used / workload.output_tokens
    )
    rates = {}
    for role, tokens in (("prefill", workload.prompt_tokens), ("decode", workload.output_tokens)):
        pool = pools[role]
        assert pool.predicted is not None
        assert pool.serving.batch_size == pool.predicted.batch_size
        per_unit = pool.devices_per_unit * pool.predicted.tokens_per_s_per_device / tokens
        rates[role] = pool.num_units * per_unit
    assert min(rates.values()) == pytest.approx(requests_per_s, rel=1e-6)
    assert rates[deployment.bottleneck] == pytest.approx(requests_per_s, rel=1e-6)
    prefill, decode = pools["prefill"].predicted, pools["decode"].predicted
    assert prefill.tpot_s is None and decode.ttft_s is None  # each priced in its own phase
    assert decode.tpot_s <= workload.tpot_slo_s and prefill.ttft_s <= workload.ttft_slo_s
    assert all(v == 0 for k, v in decode.time_s.items() if k.startswith("prefill_"))
    # the deployment's first token (prefill queue, KV transfer, decode admission included)
    # meets the SLO at its p90, as the colocated plan's does
    assert deployment.ttft_s is not None and deployment.ttft_p90_s is not None
    assert prefill.ttft_s < deployment.ttft_s < deployment.ttft_p90_s <= workload.ttft_slo_s
    assert deployment.tpot_s == pytest.approx(decode.tpot_s)


def test_a_prefill_pool_leaves_room_in_its_ttft_slo_for_the_pass_it_waits_for() -> None:
    """A saturated prefill pool's p90 TTFT is its pass plus 0.9 of the pass running when the
    request arrives; the pool's batch is the largest whose p90 meets the SLO, so a tighter SLO
    takes a smaller batch and a pass under SLO / 1.9."""
    import autoparallel as ap
    from cost_model import estimate_inference_table

    model = ap.get_model("llama-3.1-70b")
    cluster = get_preset("dgx-h100")
    config = ParallelConfig(tp=2)
    batches = {}
    for slo in (1.0, 2.5):  # both under the batch memory holds (8 prompts)
        workload = Inference(prompt_tokens=2000, output_tokens=500, ttft_slo_s=slo)
        table = configs_to_table(
            [config], **ServingConfig(phase="prefill").columns(workload=workload)
        )
        columns = estimate_inference_table(
            model=model, cluster=cluster, workload=workload, table=table
        )
        assert bool(columns["feasible"][0])
        batches[slo] = int(columns["batch_size"][0])
        pass_s = float(columns["ttft_s"][0])
        assert 1.9 * pass_s <= slo < 1.9 * pass_s * (batches[slo] + 1) / batches[slo] + 0.05
    assert batches[1.0] < batches[2.5]
