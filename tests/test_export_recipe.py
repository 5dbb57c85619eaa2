"""The Megatron-LM export writes the software settings a plan was priced with
(``ShardingPlan.estimate_options``) as Megatron-core arguments, and names in ``dropped`` the
ones it has no argument for or that Megatron-core would refuse on the plan's layout. (The
engines tier hands such an export to Megatron-LM's own parser: test_export_engine_parsers.)"""

from __future__ import annotations

import shlex

import pytest

import autoparallel as ap
from autoparallel.export import export_plan
from autoparallel.plan import build_plan
from cost_model import Layout, ParallelConfig, Training

CLUSTER = ap.get_preset("dgx-h100", num_nodes=32)
JOB = Training(sequence_length_tokens=4096, global_batch_sequences=2048)
INTERLEAVED = dict(dp=16, tp=2, pp=8, ep=32, virtual_stages=4, pipeline_schedule="interleaved_1f1b")


def _megatron(config: ParallelConfig, options: dict | None) -> tuple[list[str], tuple[str, ...]]:
    plan = build_plan(
        model=ap.get_model("qwen3-235b-a22b"),
        cluster=CLUSTER,
        job=JOB,
        layout=Layout(config=config),
        predicted=None,
        estimate_options=options,
    )
    result = export_plan(plan, format="megatron")
    text = result.files["megatron_args.sh"].replace("\\\n", " ")
    return shlex.split(text.split("pretrain_gpt.py", 1)[1]), result.dropped


def _after(words: list[str], flag: str, count: int = 1) -> list[str]:
    index = words.index(flag)
    return words[index + 1 : index + 1 + count]


def test_a_recipe_of_ep_overlap_graphs_deepep_and_recompute_modules_is_written():
    config = ParallelConfig(**INTERLEAVED, recompute="selective")
    words, dropped = _megatron(
        config,
        dict(
            expert_parallel_comm_overlap=True,
            cuda_graphs="partial",
            cuda_graph_scope=("moe_router", "moe_preprocess"),
            recompute_modules=("moe_act", "layernorm"),
            optimizer_instances=2,
            expert_dispatcher="deepep",
        ),
    )
    assert "--overlap-moe-expert-parallel-comm" in words and "--delay-wgrad-compute" in words
    assert _after(words, "--cuda-graph-impl") == ["transformer_engine"]
    scope = _after(words, "--cuda-graph-scope", 3)
    assert scope[:2] == ["moe_router", "moe_preprocess"] and scope[2].startswith("--")
    assert _after(words, "--recompute-granularity") == ["selective"]
    assert _after(words, "--recompute-modules", 2) == ["moe_act", "layernorm"]
    assert _after(words, "--num-distributed-optimizer-instances") == ["2"]
    assert _after(words, "--moe-token-dispatcher-type") == ["flex"]
    assert _after(words, "--moe-flex-dispatcher-backend") == ["deepep"]
    assert dropped == ()


def test_a_hybridep_dispatch_is_written_as_the_flex_dispatcher_s_hybridep_backend():
    words, dropped = _megatron(ParallelConfig(**INTERLEAVED), dict(expert_dispatcher="hybridep"))
    assert _after(words, "--moe-token-dispatcher-type") == ["flex"]
    assert _after(words, "--moe-flex-dispatcher-backend") == ["hybridep"]
    assert dropped == ()


def test_block_recompute_offloading_and_gathered_context_parallel_are_written():
    config = ParallelConfig(**INTERLEAVED, recompute="full")
    words, _ = _megatron(
        config,
        dict(recompute_layers=2, activation_offload_layers=3, context_parallel="all_gather"),
    )
    assert _after(words, "--recompute-method") == ["block"]
    assert _after(words, "--recompute-num-layers") == ["2"]
    assert _after(words, "--cpu-offloading-num-layers") == ["3"]
    assert _after(words, "--cp-comm-type") == ["all_gather"]


def test_a_plan_priced_with_the_defaults_keeps_uniform_full_recompute():
    words, dropped = _megatron(ParallelConfig(**INTERLEAVED, recompute="full"), None)
    assert _after(words, "--recompute-method") == ["uniform"]
    assert _after(words, "--recompute-num-layers") == ["1"]
    for flag in ("--recompute-modules", "--cuda-graph-impl", "--overlap-moe-expert-parallel-comm"):
        assert flag not in words


@pytest.mark.parametrize(
    "config",
    [
        dict(INTERLEAVED, virtual_stages=1, pipeline_schedule="1f1b", recompute="none"),
        dict(INTERLEAVED, recompute="full"),
    ],
)
def test_ep_overlap_megatron_would_refuse_on_the_layout_is_dropped_not_written(config):
    words, dropped = _megatron(ParallelConfig(**config), dict(expert_parallel_comm_overlap=True))
    assert "--overlap-moe-expert-parallel-comm" not in words
    assert any("expert_parallel_comm_overlap" in item for item in dropped)


def test_settings_without_a_megatron_argument_are_named_in_dropped():
    _, dropped = _megatron(
        ParallelConfig(**INTERLEAVED, recompute="none"),
        dict(expert_dispatch_fp8=True, bidirectional_pipeline=True, pipeline_keeps_outputs=True),
    )
    text = " ".join(dropped)
    for field in ("expert_dispatch_fp8", "bidirectional_pipeline", "pipeline_keeps_outputs"):
        assert f"({field}) has no Megatron-LM argument" in text


def test_tp_comm_overlap_is_written_with_sequence_parallel_and_dropped_without():
    parallel = ParallelConfig(**INTERLEAVED, recompute="none", sequence_parallel=True)
    words, dropped = _megatron(parallel, dict(tp_comm_overlap=True))
    assert "--tp-comm-overlap" in words and "--sequence-parallel" in words
    assert not any("tp_comm_overlap" in item for item in dropped)
    words, dropped = _megatron(
        ParallelConfig(**INTERLEAVED, recompute="none", sequence_parallel=False),
        dict(tp_comm_overlap=True),
    )
    assert "--tp-comm-overlap" not in words
    assert any("(tp_comm_overlap) is not written" in item for item in dropped)
    words, _ = _megatron(parallel, dict(tp_comm_overlap=False))
    assert "--tp-comm-overlap" not in words


def test_training_precision_is_written_for_megatron_and_named_in_dropped_elsewhere():
    job = Training(
        sequence_length_tokens=4096,
        global_batch_sequences=256,
        precision="fp8",
        fp8_recipe="blockwise",
        fp8_bf16_layers_at_start=2,
        fp8_bf16_layers_at_end=1,
        gradient_dtype="bf16",
        optimizer_state_dtype="bf16",
    )
    plan = build_plan(
        model=ap.get_model("llama-3.1-70b"),
        cluster=ap.get_preset("dgx-h100", num_nodes=8),
        job=job,
        layout=Layout(config=ParallelConfig(tp=8, pp=2, dp=4, sequence_parallel=True)),
        predicted=None,
    )
    megatron = export_plan(plan, format="megatron")
    words = shlex.split(megatron.files["megatron_args.sh"].replace("\\\n", " "))
    assert _after(words, "--fp8-format") == ["hybrid"] and _after(words, "--fp8-recipe") == [
        "blockwise"
    ]
    assert "--first-last-layers-bf16" in words
    assert _after(words, "--num-layers-at-start-in-bf16") == ["2"]
    assert _after(words, "--num-layers-at-end-in-bf16") == ["1"]
    assert "--grad-reduce-in-bf16" in words and "--use-precision-aware-optimizer" in words
    assert _after(words, "--exp-avg-dtype") == ["bf16"]
    assert not any("precision" in item for item in megatron.dropped)
    titan = export_plan(plan, format="torchtitan")
    assert any("fp8 training (precision, recipe 'blockwise')" in item for item in titan.dropped)
    rowwise = build_plan(
        model=ap.get_model("llama-3.1-70b"),
        cluster=ap.get_preset("dgx-h100", num_nodes=8),
        job=job.model_copy(update={"fp8_recipe": "rowwise"}),
        layout=Layout(config=ParallelConfig(tp=8, pp=2, dp=4, sequence_parallel=True)),
        predicted=None,
    )
    dropped = export_plan(rowwise, format="megatron").dropped
    assert any("('rowwise') has no Megatron-core --fp8-recipe" in item for item in dropped)
