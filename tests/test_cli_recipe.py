"""The training recipe flags of ``autoparallel estimate`` and ``autoparallel plan``: each one
reaches the estimate and moves the figure the cost model says it moves; contradictory or
out-of-range values are refused in one line naming the flag, the value and the rule."""

from __future__ import annotations

import json

import pytest

import autoparallel as ap
from autoparallel.cli import main

#: Qwen3-235B-A22B on 32 DGX H100 nodes, EP 32 across nodes, an interleaved pipeline: the
#: layout of a Megatron-Bridge Qwen3 recipe, where the EP all-to-all is the largest part.
QWEN3 = [
    "estimate",
    "--model",
    "qwen3-235b-a22b",
    "--cluster",
    "dgx-h100",
    "--nodes",
    "32",
    "--tp",
    "2",
    "--pp",
    "8",
    "--virtual-stages",
    "4",
    "--schedule",
    "interleaved_1f1b",
    "--ep",
    "32",
    "--sequence-length",
    "4096",
    "--global-batch-tokens",
    "8388608",
    "--framework",
    "megatron-core",
    "--json",
]
#: A tiny MoE on one H100 node: every kernel is short, so the host's issue time binds.
TINY = [
    "estimate",
    "--model",
    "tiny-moe",
    "--cluster",
    "dgx-h100",
    "--nodes",
    "1",
    "--tp",
    "1",
    "--pp",
    "2",
    "--ep",
    "2",
    "--sequence-length",
    "256",
    "--global-batch-tokens",
    "8192",
    "--framework",
    "megatron-core",
    "--recompute",
    "none",
    "--json",
]


def test_expert_parallel_comm_overlap_hides_all_to_all_behind_the_other_micro_batch(cli_json):
    base = cli_json([*QWEN3, "--recompute", "selective"])
    overlap = cli_json([*QWEN3, "--recompute", "selective", "--expert-parallel-comm-overlap"])
    assert base["hidden_time_s"]["ep_comm"] == 0.0
    assert overlap["hidden_time_s"]["ep_comm"] > 0.0
    assert overlap["time_s"]["ep_comm"] < base["time_s"]["ep_comm"]
    assert overlap["step_time_s"] < base["step_time_s"]
    assert overlap["time_s"]["compute"] == pytest.approx(base["time_s"]["compute"])
    assert overlap.keys() == base.keys()  # the JSON keeps its shape


def test_expert_dispatcher_routed_nodes_and_fp8_dispatch_change_the_all_to_all(cli_json):
    common = [*QWEN3, "--recompute", "none"]
    nccl = cli_json(common)["time_s"]["ep_comm"]
    deepep = cli_json([*common, "--expert-dispatcher", "deepep"])["time_s"]["ep_comm"]
    limited = cli_json([*common, "--expert-dispatcher", "deepep", "--max-routed-nodes", "2"])[
        "time_s"
    ]["ep_comm"]
    fp8 = cli_json([*common, "--expert-dispatch-fp8"])["time_s"]["ep_comm"]
    hybridep = cli_json([*common, "--expert-dispatcher", "hybridep", "--max-routed-nodes", "2"])[
        "time_s"
    ]["ep_comm"]
    assert hybridep == pytest.approx(limited)  # priced as DeepEP's kernels
    assert deepep < nccl  # node de-duplication sends each token once per remote node
    assert limited < deepep  # at most two remote nodes per token
    assert fp8 < nccl  # the dispatch half travels in one byte per element


def test_bidirectional_pipeline_hides_the_all_to_all(cli_json):
    # full recompute: DualPipe's two stages and pp + 1 micro-batches per rank fit the H100s
    base = cli_json([*QWEN3, "--recompute", "full"])
    dualpipe = cli_json([*QWEN3, "--recompute", "full", "--bidirectional-pipeline"])
    assert dualpipe["hidden_time_s"]["ep_comm"] > 0.0 == base["hidden_time_s"]["ep_comm"]
    assert dualpipe["step_time_s"] < base["step_time_s"]
    assert dualpipe["memory_bytes"]["weights"] == 2.0 * base["memory_bytes"]["weights"]


def test_recompute_modules_trade_activation_memory_for_recompute_time(cli_json):
    default = cli_json([*QWEN3, "--recompute", "selective"])
    more = cli_json(
        [*QWEN3, "--recompute", "selective", "--recompute-modules", "core_attn", "moe_act"],
    )
    assert more["memory_bytes"]["activations"] < default["memory_bytes"]["activations"]
    assert more["time_s"]["recompute"] > default["time_s"]["recompute"]


def test_recompute_layers_recompute_only_the_first_layers_of_each_chunk(cli_json):
    every = cli_json([*QWEN3, "--recompute", "full"])
    first = cli_json([*QWEN3, "--recompute", "full", "--recompute-layers", "1"])
    assert first["time_s"]["recompute"] < every["time_s"]["recompute"]
    assert first["memory_bytes"]["activations"] > every["memory_bytes"]["activations"]


def test_activation_offload_moves_activations_to_the_host_at_a_copy_cost(cli_json):
    base = cli_json([*QWEN3, "--recompute", "none"])
    offload = cli_json([*QWEN3, "--recompute", "none", "--activation-offload-layers", "4"])
    assert offload["memory_bytes"]["activations"] < base["memory_bytes"]["activations"]
    assert offload["time_s"]["offload"] > base["time_s"]["offload"] == 0.0


def test_optimizer_instances_replicate_the_sharded_states(cli_json):
    base = cli_json([*QWEN3, "--recompute", "none"])
    two = cli_json([*QWEN3, "--recompute", "none", "--optimizer-instances", "2"])
    assert two["memory_bytes"]["optimizer_states"] > base["memory_bytes"]["optimizer_states"]
    assert two["step_time_s"] == pytest.approx(base["step_time_s"], rel=1e-3)


def test_all_gather_context_parallel_exposes_its_traffic(cli_json):
    ring = cli_json([*QWEN3, "--recompute", "none", "--cp", "2"])
    gather = cli_json(
        [*QWEN3, "--recompute", "none", "--cp", "2", "--context-parallel-comm", "all_gather"],
    )
    assert ring["time_s"]["cp_comm"] == 0.0 < ring["hidden_time_s"]["cp_comm"]
    assert gather["time_s"]["cp_comm"] > 0.0 == gather["hidden_time_s"]["cp_comm"]


def test_cuda_graphs_save_host_issue_time_on_a_host_bound_model(cli_json):
    eager = cli_json(TINY)["time_s"]["compute"]
    partial = cli_json([*TINY, "--cuda-graphs", "partial"])["time_s"]["compute"]
    attention_only = cli_json([*TINY, "--cuda-graphs", "partial", "--cuda-graph-scope", "attn"])[
        "time_s"
    ]["compute"]
    padded = ["--moe-capacity-factor", "1", "--moe-pad-to-capacity"]
    whole = cli_json([*TINY, *padded, "--cuda-graphs", "full_iteration"])["time_s"]["compute"]
    assert whole < partial < attention_only < eager


def test_pipeline_keeps_outputs_holds_the_logits_on_the_last_stage(cli_json):
    base = cli_json(TINY)
    kept = cli_json([*TINY, "--pipeline-keeps-outputs"])
    assert kept["memory_per_device_bytes"] > base["memory_per_device_bytes"]
    assert kept["step_time_s"] == base["step_time_s"]


def test_an_eager_loss_beside_a_compiled_model_holds_twelve_bytes_per_logit(cli_json):
    """torchtitan compiles its loss with the model (4 bytes per logit); --eager-loss prices the
    eager one of earlier releases (12): 8 more bytes for each logit of a micro-batch."""
    job = ["estimate", "--model", "megatron-gpt-1.7b", "--cluster", "dgx-h100", "--nodes", "1"]
    job += ["--tp", "1", "--pp", "1", "--framework", "torchtitan-compile", "--json"]
    job += ["--sequence-length", "4096", "--micro-batch-size", "1"]
    compiled = cli_json(job)["memory_bytes"]["activations"]
    eager = cli_json([*job, "--eager-loss"])["memory_bytes"]["activations"]
    vocab = ap.get_model("megatron-gpt-1.7b").vocab_size
    assert eager - compiled == pytest.approx(8.0 * 4096 * vocab)


@pytest.mark.parametrize(
    "extra, expected",
    [
        (
            ["--recompute", "full", "--expert-parallel-comm-overlap"],
            "--expert-parallel-comm-overlap does not run with full recompute",
        ),
        (
            ["--recompute", "none", "--virtual-stages", "1", "--schedule", "1f1b"]
            + ["--expert-parallel-comm-overlap"],
            "--expert-parallel-comm-overlap with --pp 8 needs an interleaved pipeline, "
            "--virtual-stages > 1; --virtual-stages is 1",
        ),
        (
            ["--recompute", "none", "--ep", "1", "--expert-parallel-comm-overlap"],
            "needs expert parallelism, --ep > 1; --ep is 1",
        ),
        (
            ["--recompute", "full", "--recompute-modules", "mlp"],
            "--recompute-modules (mlp) needs --recompute selective",
        ),
        (
            ["--recompute", "selective", "--recompute-layers", "2"],
            "--recompute-layers (2) needs --recompute full",
        ),
        (
            ["--cuda-graph-scope", "attn"],
            "--cuda-graph-scope (attn) needs --cuda-graphs partial",
        ),
        (
            ["--cuda-graphs", "partial", "--cuda-graph-scope", "moe_preprocess"],
            "must include moe_router with moe_preprocess",
        ),
        (
            ["--max-routed-nodes", "4"],
            "--max-routed-nodes (4) needs --expert-dispatcher deepep or hybridep",
        ),
        (
            ["--expert-parallel-comm-overlap", "--bidirectional-pipeline"],
            "--expert-parallel-comm-overlap and --bidirectional-pipeline",
        ),
        (["--optimizer-instances", "3"], "--optimizer-instances (3) must divide dp*cp (16)"),
        (
            ["--zero-stage", "0", "--optimizer-instances", "2"],
            "--optimizer-instances (2) needs the distributed optimizer",
        ),
        (
            ["--recompute", "selective", "--recompute-modules", "mla_up_proj"],
            "mla_up_proj needs a model with multi-latent attention; qwen3-235b-a22b has none",
        ),
        (
            ["--recompute", "full", "--recompute-layers", "4"],
            "--recompute-layers (4) must be at most the layers of one model chunk (3: 94 layers "
            "over pp*virtual_stages = 32 chunks)",
        ),
        (
            ["--precision", "fp8", "--fp8-recipe", "delayed", "--recompute", "selective"]
            + ["--recompute-modules", "core_attn", "moe_act"],
            "--recompute-modules (moe_act) cannot run with --fp8-recipe delayed",
        ),
        (["--recompute-modules", "attention"], "invalid choice: 'attention'"),
        (["--cuda-graphs", "layer"], "--cuda-graphs: invalid choice: 'layer'"),
        (["--activation-offload-layers", "0"], "0 must be > 0"),
        (["--recompute-layers", "two"], "'two' is not an integer"),
    ],
)
def test_contradictory_or_bad_recipe_values_arecli_refused(extra, expected, cli_refused):
    assert expected in cli_refused([*QWEN3, *extra])


def test_recipe_flags_are_refused_for_inference(cli_refused):
    message = cli_refused(
        ["estimate", "--model", "tiny-moe", "--cluster", "cpu-loopback", "--inference"]
        + ["--tp", "1", "--pp", "1", "--ep", "1", "--expert-dispatch-fp8"],
    )
    assert "--expert-dispatch-fp8 describe a training run; drop them for --inference" in message


SMALL_TRAINING_PLAN = [
    "plan",
    "--model",
    "tiny-moe",
    "--cluster",
    "cpu-loopback",
    "--training",
    "--sequence-length",
    "16",
    "--global-batch-tokens",
    "128",
    "--trials",
    "10",
    "--json",
]


def test_plan_prices_every_layout_with_the_recipe_and_records_it(tmp_path, capsys):
    from cost_model import estimate

    recipe = ["--recompute-modules", "core_attn", "moe_act", "--expert-dispatch-fp8"]
    output = tmp_path / "plan.json"
    assert main([*SMALL_TRAINING_PLAN, *recipe, "--output", str(output)]) == 0
    capsys.readouterr()
    import autoparallel as ap

    plan = ap.load_plan(output)
    assert plan.estimate_options is not None
    assert plan.estimate_options.recompute_modules == ("core_attn", "moe_act")
    assert plan.estimate_options.expert_dispatch_fp8
    cluster = ap.get_preset("cpu-loopback").with_nodes(plan.world_size // plan.devices_per_node)
    with_recipe = estimate(
        plan.model, cluster, plan.job, plan.config, **plan.estimate_options.model_dump()
    )
    assert plan.predicted == with_recipe
    assert main(["explain", str(output), "--json"]) == 0
    explained = json.loads(capsys.readouterr().out)
    assert explained["estimate_options"] == {
        "recompute_modules": ["core_attn", "moe_act"],
        "expert_dispatch_fp8": True,
    }


def test_plan_refuses_recipe_rules_and_a_recipe_with_from_study(tmp_path, cli_refused):
    message = cli_refused([*SMALL_TRAINING_PLAN, "--cuda-graph-scope", "attn"])
    assert "--cuda-graph-scope (attn) needs --cuda-graphs partial" in message
    storage = f"sqlite:///{tmp_path}/study.db"
    message = cli_refused(["plan", "--from-study", "--storage", storage, "--expert-dispatch-fp8"])
    assert "--from-study ranks the trials the study already priced; drop --expert-dispatch-fp8" in (
        message
    )


def test_plan_with_a_framework_prices_cuda_graphs_against_its_host_costs(tmp_path, cli_json):
    job = ["plan", "--model", "tiny-moe", "--cluster", "dgx-h100", "--nodes", "1", "--training"]
    job += ["--sequence-length", "256", "--global-batch-tokens", "8192", "--trials", "10"]
    job += ["--framework", "megatron-core", "--json"]
    eager = cli_json([*job, "--output", str(tmp_path / "eager.json")])["plan"]
    graphs = cli_json(
        [*job, "--cuda-graphs", "full_iteration", "--moe-capacity-factor", "1"]
        + ["--moe-pad-to-capacity", "--output", str(tmp_path / "graphs.json")],
    )["plan"]
    assert eager["job"]["framework"] == graphs["job"]["framework"] == "megatron-core"
    assert graphs["estimate_options"]["cuda_graphs"] == "full_iteration"
    assert graphs["predicted"]["step_time_s"] < eager["predicted"]["step_time_s"]


def test_moe_settings_are_refused_for_a_dense_model(cli_refused):
    dense = ["estimate", "--model", "megatron-gpt-1.7b", "--cluster", "dgx-h100", "--nodes", "1"]
    dense += ["--tp", "1", "--pp", "1", "--ep", "1", "--recompute", "selective"]
    message = cli_refused([*dense, "--expert-parallel-comm-overlap"])
    assert "--expert-parallel-comm-overlap needs a MoE model" in message
    message = cli_refused([*dense, "--recompute-modules", "shared_experts"])
    assert "shared_experts needs a model with shared experts; megatron-gpt-1.7b has none" in message


def test_the_estimate_table_names_the_recipe_it_priced(capsys):
    argv = [word for word in QWEN3 if word != "--json"]
    assert main([*argv, "--recompute", "selective", "--expert-parallel-comm-overlap"]) == 0
    assert "recipe: expert_parallel_comm_overlap=True" in capsys.readouterr().out


def test_tp_comm_overlap_off_leaves_the_tensor_parallel_traffic_exposed(cli_json):
    dense = [
        "estimate", "--model", "llama-3.1-70b", "--cluster", "dgx-h100", "--nodes", "8",
        "--tp", "8", "--pp", "2", "--sequence-length", "4096", "--global-batch-tokens",
        str(128 * 4096), "--sequence-parallel", "--framework", "megatron-core", "--json",
    ]  # fmt: skip
    profile = cli_json(dense)  # megatron-core's profile overlaps it
    off = cli_json([*dense, "--no-tp-comm-overlap"])
    on = cli_json([*dense, "--tp-comm-overlap"])
    assert off["hidden_time_s"]["tp_comm"] == 0.0 < profile["hidden_time_s"]["tp_comm"]
    assert on["hidden_time_s"]["tp_comm"] == profile["hidden_time_s"]["tp_comm"]
    assert off["step_time_s"] > profile["step_time_s"]
