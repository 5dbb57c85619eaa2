"""Engine exports: every format's content is checked against the plan, engine rules are kept,
and what a format cannot express is listed as dropped."""

from __future__ import annotations

import json
import shlex

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as the tomli package (test extras)
    import tomli as tomllib

import pytest

import autoparallel as ap
from autoparallel.export import FORMATS, Export, export_plan


def _with(plan: ap.ShardingPlan, **config) -> ap.ShardingPlan:
    """The plan with some config fields changed (stages re-derived), to exercise engine rules."""
    from autoparallel._planner import pipeline_stages

    new = plan.config.model_copy(update=config)
    stages = pipeline_stages(num_layers=plan.stages[-1].stop_layer, config=new)
    return plan.model_copy(update={"config": new, "stages": stages})


def _colocated(plan: ap.ShardingPlan) -> ap.ShardingPlan:
    """The plan served colocated (its pools dropped), so one launch file holds its layout."""
    from autoparallel.plan import Deployment

    return plan.model_copy(update={"deployment": Deployment()})


def _flags(command: str) -> dict[str, str | bool]:
    words = shlex.split(command.replace("\\\n", " "))
    flags: dict[str, str | bool] = {}
    for index, word in enumerate(words):
        if word.startswith("--"):
            following = words[index + 1] if index + 1 < len(words) else "--"
            flags[word] = True if following.startswith("--") else following
    return flags


# ---------------------------------------------------------------------------- contract for every format
@pytest.mark.parametrize("format", FORMATS)
@pytest.mark.parametrize("kind", ["training", "inference"])
def test_every_format_exports_every_plan(
    format: str, kind: str, training_plan, inference_plan
) -> None:
    plan = training_plan if kind == "training" else inference_plan
    result = export_plan(plan, format=format)
    assert isinstance(result, Export) and result.format == format and result.files
    assert all(content.strip() for content in result.files.values())
    text = result.render()
    assert all(f"# dropped: {item}" in text for item in result.dropped)


def test_unknown_format_lists_the_valid_ones(inference_plan) -> None:
    with pytest.raises(ValueError, match="must be one of .*'vllm'"):
        export_plan(inference_plan, format="ollama")


# ---------------------------------------------------------------------------- serving engines
def test_vllm_arguments_match_the_plan(inference_plan) -> None:
    c, serving = inference_plan.config, inference_plan.serving
    files = export_plan(_colocated(inference_plan), format="vllm", model_path="/ckpt/dsv3").files
    flags = _flags(
        next(text for name, text in files.items() if name.startswith("launch_vllm_colocated"))
    )
    assert "/ckpt/dsv3" in next(iter(files.values()))
    attention_tp = 1 if c.attention_data_parallel else c.tp
    instance = max(c.tp, c.ep * c.etp)
    assert flags["--tensor-parallel-size"] == str(attention_tp)
    assert flags["--pipeline-parallel-size"] == str(c.pp)
    assert flags["--data-parallel-size"] == str(instance // attention_tp)
    assert ("--enable-expert-parallel" in flags) == (c.ep > 1)
    assert flags["--max-num-seqs"] == str(serving.batch_size)
    assert flags["--kv-cache-dtype"] == {"bf16": "auto", "fp8": "fp8"}[serving.kv_dtype]
    assert ("--enable-dbo" in flags) == (serving.two_batch_overlap and c.ep > 1)


def test_sglang_attention_dp_needs_dp_equal_tp(inference_plan) -> None:
    plan = _with(
        inference_plan,
        attention_data_parallel=True,
        tp=8,
        ep=8,
        etp=1,
        dp=inference_plan.world_size // (8 * inference_plan.config.pp),
    )
    flags = _flags(
        export_plan(_colocated(plan), format="sglang").files["launch_sglang_colocated.sh"]
    )
    assert "--enable-dp-attention" not in flags  # deprecated in SGLang 0.5.23 for --attn-dp-size
    assert (
        flags["--attn-dp-size"] == flags["--tp-size"] == "8"
    )  # pure DP attention: attn-dp-size == tp-size
    assert flags["--ep-size"] == "8" and flags["--moe-a2a-backend"] == "deepep"
    tp_plan = _with(
        inference_plan, attention_data_parallel=False, tp=8, ep=8, etp=1, dp=plan.config.dp
    )
    flags = _flags(
        export_plan(_colocated(tp_plan), format="sglang").files["launch_sglang_colocated.sh"]
    )
    assert "--attn-dp-size" not in flags and flags["--tp-size"] == "8"


def test_sglang_and_trtllm_instance_sizes(inference_plan) -> None:
    c, serving = inference_plan.config, inference_plan.serving
    instance = max(c.tp, c.ep * c.etp)
    inference_plan = _colocated(inference_plan)
    sglang = _flags(
        export_plan(inference_plan, format="sglang").files["launch_sglang_colocated.sh"]
    )
    assert sglang["--tp-size"] == str(instance) and sglang["--pp-size"] == str(c.pp)
    assert sglang.get("--ep-size", "1") == str(c.ep)
    if serving.num_redundant_experts:
        assert sglang["--ep-num-redundant-experts"] == str(serving.num_redundant_experts)
    result = export_plan(inference_plan, format="trtllm")
    trt = _flags(result.files["launch_trtllm_colocated.sh"])
    assert (trt["--tp_size"], trt["--pp_size"], trt["--ep_size"]) == (
        str(instance),
        str(c.pp),
        str(c.ep),
    )
    attention_replicas = instance // (1 if c.attention_data_parallel else c.tp)
    assert trt["--max_batch_size"] == str(serving.batch_size * attention_replicas)
    yaml_text = result.files["extra_llm_api_options_colocated.yaml"]
    attention_dp = instance > 1 and (c.attention_data_parallel or c.tp < instance)
    assert f"enable_attention_dp: {'true' if attention_dp else 'false'}" in yaml_text


def test_trtllm_reports_attention_tp_it_cannot_express(inference_plan) -> None:
    plan = _with(
        inference_plan,
        attention_data_parallel=False,
        tp=2,
        ep=16,
        etp=1,
        dp=inference_plan.world_size // (2 * inference_plan.config.pp),
    )
    result = export_plan(_colocated(plan), format="trtllm")
    assert any(
        item.startswith("colocated: TensorRT-LLM runs attention either tp over the whole instance")
        for item in result.dropped
    )


# ---------------------------------------------------------------------------- training engines
def test_megatron_arguments_match_the_plan(training_plan) -> None:
    c = training_plan.config
    result = export_plan(training_plan, format="megatron")
    flags = _flags(result.files["megatron_args.sh"])
    assert flags["--tensor-model-parallel-size"] == str(c.tp)
    assert flags["--pipeline-model-parallel-size"] == str(c.pp)
    assert flags["--context-parallel-size"] == str(c.cp)
    assert flags["--expert-model-parallel-size"] == str(c.ep)
    assert flags["--expert-tensor-parallel-size"] == str(c.etp)
    assert flags["--micro-batch-size"] == str(c.micro_batch_size)
    assert flags["--global-batch-size"] == "256" and flags["--seq-length"] == "4096"
    assert ("--sequence-parallel" in flags) == c.sequence_parallel
    assert ("--use-distributed-optimizer" in flags) == (c.zero_stage in (1, 2))


def test_megatron_pipeline_rules(training_plan) -> None:
    interleaved = _with(
        training_plan,
        pp=2,
        dp=training_plan.world_size // (2 * training_plan.config.tp * training_plan.config.cp),
        pipeline_schedule="interleaved_1f1b",
        virtual_stages=2,
    )
    flags = _flags(export_plan(interleaved, format="megatron").files["megatron_args.sh"])
    layout = flags[
        "--pipeline-model-parallel-layout"
    ]  # pp x virtual chunks, each with its exact layers
    assert layout.count("|") + 1 == 2 * 2 and layout.startswith("E") and layout.endswith("L")
    uneven = _with(
        training_plan,
        pp=3,
        dp=2,
        tp=8,
        cp=1,
        ep=16,
        pipeline_schedule="zero_bubble",
        virtual_stages=1,
    )
    plan = uneven.model_copy(update={"world_size": 48})
    result = export_plan(plan, format="megatron")
    flags = _flags(result.files["megatron_args.sh"])
    sizes = [s.stop_layer - s.start_layer for s in plan.stages]
    layout = flags["--pipeline-model-parallel-layout"]
    assert [int(part.strip("EL").split("*")[1]) for part in layout.split("|")] == sizes
    assert any("GPipe or zero-bubble" in item for item in result.dropped)


def test_torchtitan_toml_matches_the_plan(training_plan) -> None:
    c = training_plan.config
    document = tomllib.loads(
        export_plan(training_plan, format="torchtitan", engine_version="0.2.2").files[
            "torchtitan.toml"
        ]
    )
    parallelism = document["parallelism"]
    assert parallelism["tensor_parallel_degree"] == c.tp
    assert parallelism["pipeline_parallel_degree"] == c.pp
    assert parallelism["context_parallel_degree"] == c.cp
    assert parallelism["expert_parallel_degree"] == c.ep
    assert parallelism["expert_tensor_parallel_degree"] == c.etp
    assert (
        parallelism["data_parallel_shard_degree"] * parallelism["data_parallel_replicate_degree"]
        == c.dp
    )
    assert parallelism["pipeline_parallel_microbatch_size"] == c.micro_batch_size
    assert document["activation_checkpoint"]["mode"] == c.recompute
    assert (
        document["training"]["global_batch_size"] == 256 and document["training"]["seq_len"] == 4096
    )
    assert (
        document["model"]["name"] and document["model"]["hf_assets_path"] == "Qwen/Qwen3-235B-A22B"
    )
    local = document["training"][
        "local_batch_size"
    ]  # micro-batch kept; the rest is accumulation or pipeline micro-batches
    assert local == (256 // c.dp if c.pp > 1 else c.micro_batch_size)


def test_torchtitan_model_parts_hold_every_layer_once(training_plan) -> None:
    plan = _with(training_plan, pp=3, dp=2, tp=8, cp=1, ep=16, pipeline_schedule="1f1b")
    parts = tomllib.loads(
        export_plan(plan, format="torchtitan", engine_version="0.2.2").files["torchtitan.toml"]
    )["parallelism"]["module_fqns_per_model_part"]
    from autoparallel.export._import import _titan_parts

    assert _titan_parts(export_plan(plan, format="torchtitan").files) == parts
    layers = [name for part in parts for name in part if name.startswith("layers.")]
    assert layers == [f"layers.{i}" for i in range(plan.stages[-1].stop_layer)]
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
    assert [len(p) for p in parts] != [
        len(parts[0])
    ] * 3  # 94 layers over 3 stages: uneven, expressed exactly


def test_deepspeed_config_matches_the_plan(training_plan) -> None:
    c = training_plan.config
    result = export_plan(training_plan, format="deepspeed")
    config = json.loads(result.files["ds_config.json"])
    assert config["train_batch_size"] == 256
    assert config["train_micro_batch_size_per_gpu"] == c.micro_batch_size
    assert config["gradient_accumulation_steps"] * c.dp * c.micro_batch_size == 256
    assert config["zero_optimization"]["stage"] == c.zero_stage
    assert config.get("tensor_parallel", {"autotp_size": 1})["autotp_size"] == c.tp
    if c.cp > 1:
        assert any("context parallel" in item for item in result.dropped)


def test_training_engines_drop_serving_settings(inference_plan) -> None:
    for format in ("megatron", "torchtitan", "deepspeed"):
        result = export_plan(inference_plan, format=format)
        assert any(item.startswith("serving settings") for item in result.dropped), format
