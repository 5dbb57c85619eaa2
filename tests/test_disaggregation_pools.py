"""Disaggregation without a box: unit sizes, asymmetric pools and per-pool serving settings."""

from __future__ import annotations

from pathlib import Path

from autoparallel import get_model
from cost_model import Inference, Layout, ParallelConfig, ServingConfig
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
