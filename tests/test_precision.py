"""Serving precision: checkpoint dtypes from the catalog; fp4 weights native on FP4 tensor cores,
weight-only elsewhere; an fp4 cache only where the device runs it."""

from __future__ import annotations

import json

import pytest

from autoparallel import get_model
from autoparallel._catalog import checkpoint_dtype
from autoparallel.cli import main
from cost_model import Inference, ParallelConfig, estimate
from cost_model._serving_precision import checkpoint_dtype as parse_checkpoint_dtype
from cost_model._units import dtype_bytes
from topology import get_preset

DSV3 = get_model("deepseek-v3")
CONFIG = ParallelConfig(dp=16, tp=1, ep=16, attention_data_parallel=False)


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("deepseek-v3", "fp8"),
        ("kimi-k2", "fp8"),
        ("qwen3-235b-a22b", "bf16"),
        ("qwen3-235b-a22b-fp8", "fp8"),
        ("ref-3t-moe", "fp8"),
        ("gpt-oss-120b", "fp4"),
        ("deepseek-v3.2", "fp8"),
        ("glm-5", "bf16"),
        ("minimax-m2.5", "fp8"),
    ],
)
def test_catalog_records_the_released_checkpoint_dtype(name: str, dtype: str) -> None:
    assert checkpoint_dtype(name) == dtype


def test_quantization_configs_parse_to_their_dtype() -> None:
    assert parse_checkpoint_dtype({"quantization_config": {"quant_method": "fp8"}}) == "fp8"
    assert (
        parse_checkpoint_dtype(
            {"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}
        )
        == "fp4"
    )
    int4 = {
        "quant_method": "compressed-tensors",
        "config_groups": {"g": {"weights": {"num_bits": 4}}},
    }
    assert parse_checkpoint_dtype({"quantization_config": int4}) == "int4"
    assert parse_checkpoint_dtype({"torch_dtype": "float16"}) == "fp16"
    assert parse_checkpoint_dtype({}) == "bf16"


def _by_weight_dtype(cluster, config, dtypes, *, prompt_tokens: int) -> dict:
    """DSV3's estimate with each weight dtype of ``dtypes``, 8 sequences per replica."""
    return {
        dtype: estimate(
            DSV3,
            cluster,
            Inference(prompt_tokens=prompt_tokens, output_tokens=128, weight_dtype=dtype),
            config,
            batch_size=8,
        )
        for dtype in dtypes
    }


def test_fp4_weights_on_h100_are_weight_only_and_an_fp4_cache_is_an_error() -> None:
    cluster = get_preset("dgx-h100", num_nodes=8)  # room for the bf16 weights
    config = ParallelConfig(dp=64, tp=1, ep=64, attention_data_parallel=False)
    costs = _by_weight_dtype(cluster, config, ("bf16", "fp8", "fp4"), prompt_tokens=8192)
    # stored in 4 bits (Marlin / Triton W4A16): well under the FP8 weights (decode is priced
    # from the measured W4A16 MoE kernels, tests/test_cost_kernels.py) ...
    ratio = costs["fp4"].memory_bytes["weights"] / costs["fp8"].memory_bytes["weights"]
    assert ratio < 0.6
    # ... widened to bf16 in the GEMM: the compute-bound prefill runs at bf16's speed
    prefill = {dtype: cost.time_s["prefill_compute"] for dtype, cost in costs.items()}
    assert prefill["fp4"] >= 0.9 * prefill["bf16"]
    assert prefill["fp4"] > 1.2 * prefill["fp8"]
    kv = Inference(prompt_tokens=1024, output_tokens=128, weight_dtype="fp8", kv_dtype="fp4")
    with pytest.raises(ValueError, match=r"kv_dtype \('fp4'\) cannot run natively on NVIDIA H100"):
        estimate(DSV3, cluster, kv, config, batch_size=8)


def test_a_sparse_attention_indexer_needs_fp8_on_the_serving_device(capsys) -> None:
    """DeepSeek-V3.2's lightning indexer scores keys in fp8: on A100 (no fp8 peak) the estimate
    and the planner stop with the field, its value and the rule, not an internal lookup error;
    an fp8 device prices it."""
    model = get_model("deepseek-v3.2")
    config = CONFIG
    workload = Inference(prompt_tokens=1024, output_tokens=128, weight_dtype="bf16")
    rule = r"attention.indexer_heads \(64\) needs fp8 .* NVIDIA A100 SXM 80GB's peak_flops lists only bf16, fp16"
    with pytest.raises(ValueError, match=rule):
        estimate(model, get_preset("dgx-a100", num_nodes=2), workload, config, batch_size=8)
    assert (
        main(
            [
                "estimate",
                "--inference",
                "--model",
                "deepseek-v3.2",
                "--cluster",
                "dgx-a100",
                "--nodes",
                "2",
                "--tp",
                "8",
            ]
        )
        != 0
    )
    assert "indexer_heads (64) needs fp8" in capsys.readouterr().err
    fp8 = workload.model_copy(update={"weight_dtype": "fp8"})
    cost = estimate(model, get_preset("dgx-h100", num_nodes=2), fp8, config, batch_size=8)
    assert cost.ttft_s > 0 and cost.tpot_s > 0


def test_fp4_on_b200_halves_the_fp8_weights_and_runs_faster_matmuls() -> None:
    cluster = get_preset("dgx-b200", num_nodes=2)
    costs = _by_weight_dtype(cluster, CONFIG, ("fp8", "fp4"), prompt_tokens=1024)
    ratio = costs["fp4"].memory_bytes["weights"] / costs["fp8"].memory_bytes["weights"]
    assert ratio == pytest.approx(dtype_bytes("fp4") / dtype_bytes("fp8"))
    assert costs["fp4"].ttft_s < costs["fp8"].ttft_s


def _estimate_json(capsys, *flags: str) -> dict:
    argv = [
        "estimate",
        "--inference",
        "--model",
        "deepseek-v3",
        "--cluster",
        "dgx-h200",
        "--nodes",
        "2",
        "--tp",
        "1",
        "--pp",
        "1",
        "--ep",
        "16",
        "--batch-size",
        "8",
        "--json",
        *flags,
    ]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_estimate_inference_precision_is_applied_not_ignored(capsys) -> None:
    default = _estimate_json(capsys)  # the catalog's fp8 checkpoint
    bf16 = _estimate_json(capsys, "--weight-dtype", "bf16")
    fp8 = _estimate_json(capsys, "--precision", "fp8")
    assert fp8["memory_bytes"]["weights"] == pytest.approx(default["memory_bytes"]["weights"])
    # the released fp8 checkpoint keeps its embedding, LM head and router in bf16
    # (DeepSeek-V3 report sec. 3.3.1); quantizing those too halves every weight
    wider = ("embedding", "lm_head", "router")
    all_fp8 = _estimate_json(
        capsys, "--precision", "fp8", *(f"--weight-dtype-part={part}=fp8" for part in wider)
    )
    assert all_fp8["memory_bytes"]["weights"] < fp8["memory_bytes"]["weights"]
    assert bf16["memory_bytes"]["weights"] == pytest.approx(2 * all_fp8["memory_bytes"]["weights"])


def test_cli_rejects_an_fp4_cache_on_hopper_with_exit_code_2(capsys) -> None:
    argv = [
        "estimate",
        "--inference",
        "--model",
        "deepseek-v3",
        "--cluster",
        "dgx-h100",
        "--nodes",
        "2",
        "--tp",
        "1",
        "--pp",
        "1",
        "--ep",
        "16",
        "--kv-dtype",
        "fp4",
    ]
    assert main(argv) == 2
    assert "kv_dtype ('fp4')" in capsys.readouterr().err.replace("\n", " ")


def test_python_find_plan_serves_a_catalog_model_in_its_checkpoint_dtype() -> None:
    from autoparallel import find_plan

    workload = Inference(prompt_tokens=1024, output_tokens=128)
    plan = find_plan("deepseek-v3", "dgx-h200", workload, n_trials=4, disaggregate=False)
    assert plan.job.weight_dtype == "fp8"
    explicit = Inference(prompt_tokens=1024, output_tokens=128, weight_dtype="bf16")
    two_nodes = get_preset("dgx-h200", num_nodes=2)
    assert (
        find_plan(
            "deepseek-v3", two_nodes, explicit, n_trials=4, disaggregate=False
        ).job.weight_dtype
        == "bf16"
    )
