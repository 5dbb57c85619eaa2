"""Weight precision per part: a checkpoint's ``quantization_config`` keeps some parts wider than
its experts (NVIDIA's NVFP4 exports keep attention and the LM head in BF16), and the serving
model prices each part's GEMMs and bytes in its own dtype."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autoparallel import get_model
from autoparallel._catalog import catalog_config
from cost_model import Inference, checkpoint_dtype_by_part, table_from_columns
from cost_model._inference_compute import _attention_gemms, _moe_time
from cost_model._inference_memory import _memory_parts
from cost_model._inference_setup import _setup
from cost_model._options import EstimateOptions
from cost_model._serving_columns import PHASE_CODES
from cost_model._stages import parameters_per_device
from cost_model._units import dtype_bytes
from topology import get_preset

KIMI = get_model("kimi-k2")


def _nvfp4_config(exclude: list[str]) -> dict:
    """Kimi-K2's config.json as a ModelOpt NVFP4 export with ``exclude`` as its list."""
    config = {key: value for key, value in catalog_config("kimi-k2").items()}
    config["quantization_config"] = {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "group_size": 16,
        "exclude_modules": exclude,
    }
    return config


def test_modelopt_exclude_list_keeps_attention_and_head_bf16_and_experts_fp4() -> None:
    # ModelOpt lists every layer's attention (nvidia/DeepSeek-R1-0528-NVFP4 hf_quant_config.json)
    exclude = ["lm_head", *(f"model.layers.{i}.self_attn*" for i in range(KIMI.num_layers))]
    by_part = checkpoint_dtype_by_part(_nvfp4_config(exclude), KIMI)
    assert by_part == {
        "attention": "bf16",
        "lm_head": "bf16",
        "router": "bf16",
        "embedding": "bf16",
    }
    # one layer missing from the list: that attention is fp4, so the part stays at the checkpoint's
    partial = checkpoint_dtype_by_part(_nvfp4_config(exclude[:-1]), KIMI)
    assert "attention" not in partial and partial["lm_head"] == "bf16"
    # globs over shared experts and the dense layer; compressed-tensors regexes under a wrapper
    wide = checkpoint_dtype_by_part(
        _nvfp4_config(["re:.*lm_head", "re:.*self_attn.*", "*shared_experts*", "*layers.0.mlp*"]),
        KIMI,
    )
    assert {"attention", "shared_experts", "dense_ffn", "lm_head"} <= set(wide)
    assert "routed_experts" not in wide


def test_block_fp8_release_without_a_list_keeps_embedding_head_and_router_bf16() -> None:
    # DeepSeek-V3 report sec. 3.3.1: embedding, output head and MoE gating stay BF16
    assert checkpoint_dtype_by_part(catalog_config("deepseek-v3")) == {
        "router": "bf16",
        "embedding": "bf16",
        "lm_head": "bf16",
    }
    assert checkpoint_dtype_by_part(catalog_config("qwen3-235b-a22b")) == {}


def test_unknown_part_or_dtype_is_an_error_naming_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="routed_experts"):
        Inference(prompt_tokens=8, output_tokens=8, weight_dtype_by_part={"attn": "bf16"})
    with pytest.raises(ValueError, match="'fp4'"):
        Inference(prompt_tokens=8, output_tokens=8, weight_dtype_by_part={"attention": "fp5"})
    with pytest.raises(ValueError, match="dense_ffn"):
        Inference(prompt_tokens=8, output_tokens=8).part_weight_dtype("experts")


def _setup_for(workload: Inference):
    table = table_from_columns(tp=4, ep=4, etp=1, batch_size=8, phase=PHASE_CODES["decode"])
    return _setup(
        model=KIMI,
        cluster=get_preset("dgx-b200"),
        workload=workload,
        table=table,
        options=EstimateOptions(),
    )


def test_attention_gemms_run_in_bf16_and_experts_in_fp4_with_weights_per_part() -> None:
    def workload(dtype: str, by_part: dict[str, str]) -> Inference:
        return Inference(
            prompt_tokens=1000,
            output_tokens=200,
            weight_dtype=dtype,  # type: ignore[arg-type]
            weight_dtype_by_part=by_part,  # type: ignore[arg-type]
            serving_engine="vllm",
        )

    mixed = _setup_for(workload("fp4", {"attention": "bf16", "lm_head": "bf16"}))
    all_fp4 = _setup_for(workload("fp4", {}))
    all_bf16 = _setup_for(workload("bf16", {}))
    tokens = np.array([8.0])
    attention = {
        name: _attention_gemms(s, tokens, decode=True)[0]
        for name, s in (("mixed", mixed), ("fp4", all_fp4), ("bf16", all_bf16))
    }
    assert attention["mixed"] == pytest.approx(attention["bf16"], rel=1e-12)
    assert attention["mixed"] != pytest.approx(attention["fp4"], rel=1e-3)
    experts = {
        name: _moe_time(s, tokens, tokens, decode=True)[0]
        for name, s in (("mixed", mixed), ("fp4", all_fp4))
    }
    assert experts["mixed"] == pytest.approx(experts["fp4"], rel=1e-12)

    # weight bytes per device: each part's parameters on the device in its own dtype
    parameters = parameters_per_device(model=KIMI, table=mixed.table, layout=mixed.layout)
    wider = {"attention", "lm_head"}
    expected = sum(
        count[0] * dtype_bytes("bf16" if part in wider else "fp4")
        for part, count in parameters.items()
    )
    weights = {
        name: _memory_parts(s, np.array([8.0]))["weights"][0]
        for name, s in (("mixed", mixed), ("fp4", all_fp4))
    }
    assert weights["mixed"] == pytest.approx(expected, rel=1e-12)
    extra = sum(parameters[part][0] for part in wider) * (dtype_bytes("bf16") - dtype_bytes("fp4"))
    assert weights["mixed"] - weights["fp4"] == pytest.approx(extra, rel=1e-9)
    assert KIMI.weight_bytes("fp4", {"attention": "bf16"}) - KIMI.weight_bytes(
        "fp4"
    ) == pytest.approx(
        KIMI.parameter_breakdown()["attention"] * (dtype_bytes("bf16") - dtype_bytes("fp4"))
    )


def test_kimi_validation_rows_serve_the_recorded_checkpoint_split() -> None:
    from cost_model._serving_validation import row_weight_dtype_by_part, serving_validation_data

    rows = serving_validation_data()["rows"]
    kimi = next(r for r in rows if r["source"] == "vllm-recipes-kimi-k2.5-inferencex")
    by_part = row_weight_dtype_by_part(kimi)
    assert kimi["weight_dtype"] == "fp4" and "routed_experts" not in by_part
    assert by_part["attention"] == by_part["lm_head"] == "bf16"
    # a row in another dtype than its model's recorded checkpoint takes no split
    assert row_weight_dtype_by_part({**kimi, "weight_dtype": "fp8"}) == {}


def test_a_served_fp8_checkpoint_keeps_its_weight_scaling(tmp_path: Path) -> None:
    """A ModelOpt FP8 export (per-tensor scales) served as released takes the per-tensor GEMM
    tables; DeepSeek-V3's block-scaled release the block-scaled ones; re-quantized to another
    dtype, neither applies."""
    from autoparallel._planner import _with_checkpoint_dtype

    config = dict(catalog_config("deepseek-v3"))
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "FP8"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    served = _with_checkpoint_dtype(str(tmp_path), Inference(prompt_tokens=8, output_tokens=8))
    assert (served.weight_dtype, served.fp8_scaling) == ("fp8", "tensor")
    deepseek = _with_checkpoint_dtype("deepseek-v3", Inference(prompt_tokens=8, output_tokens=8))
    assert (deepseek.weight_dtype, deepseek.fp8_scaling) == ("fp8", "block")
    bf16 = Inference(prompt_tokens=8, output_tokens=8, weight_dtype="bf16")
    assert _with_checkpoint_dtype(str(tmp_path), bf16).fp8_scaling == "block"


def test_a_checkpoints_declared_kv_cache_format_is_read_from_either_export() -> None:
    from cost_model._serving_precision import checkpoint_kv_dtype

    assert checkpoint_kv_dtype(_nvfp4_config(["lm_head"])) is None  # none declared
    flat = _nvfp4_config(["lm_head"])
    flat["quantization_config"]["kv_cache_quant_algo"] = "FP8"
    assert checkpoint_kv_dtype(flat) == "fp8"
    nested = {"producer": {"name": "modelopt"}, "quantization": {"kv_cache_quant_algo": "FP8"}}
    assert checkpoint_kv_dtype({"quantization_config": nested}) == "fp8"
    scheme = {
        "quant_method": "compressed-tensors",
        "kv_cache_scheme": {"num_bits": 8, "type": "float"},
    }
    assert checkpoint_kv_dtype({"quantization_config": scheme}) == "fp8"
    flat["quantization_config"]["kv_cache_quant_algo"] = "NVFP4"
    with pytest.raises(ValueError, match="only FP8"):
        checkpoint_kv_dtype(flat)


def test_kimi_rows_launched_without_a_kv_dtype_run_the_checkpoints_fp8_cache() -> None:
    """The InferenceX launch sets no ``--kv-cache-dtype``: vLLM (v0.14.0 on) resolves ``auto`` to
    the FP8 cache nvidia/Kimi-K2.5-NVFP4 declares. The 8k-prompt rows at 64 clients then fit
    in the TP4 pool (the published TTFT of 1.28 s shows them all admitted), which a BF16
    cache would not hold."""
    from cost_model._inference_load import serving_inputs
    from cost_model._parallel import ParallelConfig
    from cost_model._serving_columns import ServingConfig
    from cost_model._serving_validation import (
        _benchmark_workload,
        row_kv_dtype,
        row_model,
        serving_validation_data,
    )
    from cost_model._table import configs_to_table

    rows = serving_validation_data()["rows"]
    kimi = [r for r in rows if r["source"] == "vllm-recipes-kimi-k2.5-inferencex"]
    assert {r["kv_dtype"] for r in kimi} == {"auto"}
    assert {row_kv_dtype(r) for r in kimi} == {"fp8"}
    assert row_kv_dtype({**kimi[0], "model": "deepseek-v3"}) == "bf16"  # declares none
    long = next(r for r in kimi if r["concurrency"] == 64 and r["prompt_tokens"] > 7000)
    admitted = {}
    for kv_dtype in ("auto", "bf16"):
        row = {**long, "kv_dtype": kv_dtype}
        workload = _benchmark_workload(row)
        table = configs_to_table(
            [ParallelConfig(**row["config"])], **ServingConfig().columns(workload=workload)
        )
        _, policy, _ = serving_inputs(
            model=row_model(row),
            cluster=get_preset(row["preset"], num_nodes=1),
            workload=workload,
            table=table,
        )
        admitted[kv_dtype] = float(np.asarray(policy.max_running)[0])
    assert admitted["auto"] >= long["concurrency"] > admitted["bf16"]
    assert admitted["auto"] == pytest.approx(2 * admitted["bf16"], abs=1)
