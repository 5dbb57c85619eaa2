"""Engine rules as a search constraint: with ``engine=X`` the space holds no layout a rule of X
rejects (one check per rule, each with a control showing the unrestricted space has such layouts),
recipes are complete and exact, and export -> import returns the plan's layout."""

from __future__ import annotations

import json

import numpy as np
import pytest

from autoparallel._catalog import get_model
from autoparallel.export import FORMATS, export_plan, import_config
from autoparallel.export._import import flags, layout_key
from cost_model import Inference, Training
from search import SearchBounds
from search._engines import (
    LayoutContext,
    engine_data,
    engine_search_settings,
    rules_for,
    violated_rules,
)
from search._space import SearchSpace

TRAINING = Training(sequence_length_tokens=4096, global_batch_sequences=256)
INFERENCE = Inference(prompt_tokens=2048, output_tokens=512, tpot_slo_s=0.05)
ROLE_RULES = {
    rule["id"] for rule in engine_data()["rules"] if rule["when"] in ("training", "not training")
}


def _space(engine: str | None, *, training: bool, version: str | None = None) -> SearchSpace:
    model = get_model("mixtral-8x22b" if training else "deepseek-v3")
    bounds = SearchBounds(
        engine=engine,
        engine_version=version,
        virtual_stage_choices=(2,),
        max_micro_batch_size=2,
        max_cp_degree=4,
    )
    return SearchSpace(
        model=model,
        workload=TRAINING if training else INFERENCE,
        world_size=32,
        devices_per_node=8,
        bounds=bounds,
    )


@pytest.fixture(scope="module")
def spaces() -> dict:
    cache: dict = {}

    def get(engine: str | None, training: bool, version: str | None = None):
        key = (engine, training, version)
        if key not in cache:
            space = _space(engine, training=training, version=version)
            cache[key] = (space, space.expand(np.arange(space.num_meshes)))
        return cache[key]

    return get


def _rule_cases() -> list[tuple[str, str, str | None]]:
    """Every rule but the role ones, at the first version it applies to when it has an end."""
    rules = [rule for rule in engine_data()["rules"] if rule["id"] not in ROLE_RULES]
    return [
        (rule["engine"], rule["id"], rule["since"] if rule.get("until") else None) for rule in rules
    ]


@pytest.mark.parametrize("engine,rule_id,version", _rule_cases())
def test_engine_search_never_returns_a_layout_the_rule_rejects(
    engine: str, rule_id: str, version: str | None, spaces
) -> None:
    training = engine_data()["engines"][engine]["role"] == "training"
    free_space, free = spaces(None, training)
    context = LayoutContext(num_layers=free_space.model.num_layers, moe=True, training=training)
    before = violated_rules(free, context=context, engine=engine, version=version)[rule_id]
    assert before.any(), f"control: the unrestricted space has layouts {rule_id} rejects"
    space, table = spaces(engine, training, version)
    assert space.size > 0
    assert not violated_rules(table, context=context, engine=engine, version=version)[rule_id].any()


def test_role_rules_reject_the_wrong_workload() -> None:
    with pytest.raises(
        ValueError,
        match=r"\('megatron'\) is a training engine; the workload is inference",
    ):
        engine_search_settings(None, engine="megatron", version=None, workload=INFERENCE)
    with pytest.raises(
        ValueError, match=r"\('vllm'\) is a serving engine; the workload is training"
    ):
        engine_search_settings(None, engine="vllm", version=None, workload=TRAINING)
    with pytest.raises(ValueError, match="engine_version .* must be one of"):
        engine_search_settings(None, engine="vllm", version="0.1.0", workload=INFERENCE)


def test_every_rule_names_its_version_and_source() -> None:
    for rule in engine_data()["rules"]:
        assert rule["source"] and rule["since"] and rule["kind"] in ("refused", "inexpressible"), (
            rule["id"]
        )
    assert {r.id for r in rules_for("torchtitan", "0.2.2")} != {
        r.id for r in rules_for("torchtitan", "0.3.0")
    }


# ---------------------------------------------------------------------------- recipes
def test_node_counts_round_up_and_model_is_named(inference_plan) -> None:
    plan = inference_plan.model_copy(update={"devices_per_node": 7})
    result = export_plan(plan, format="megatron" if plan.serving is None else "sglang")
    text = result.render()
    assert "deepseek-ai/DeepSeek-V3" in text and "--model-path deepseek-v3 " not in text
    for name, content in result.files.items():
        found = flags(content) if name.endswith(".sh") else {}
        if "--nnodes" in found:
            tp, pp = int(found["--tp-size"]), int(found["--pp-size"])
            assert int(found["--nnodes"]) * 7 >= tp * pp


def test_megatron_recipe_is_complete(training_plan) -> None:
    found = flags(export_plan(training_plan, format="megatron").files["megatron_args.sh"])
    model = get_model(training_plan.provenance.model_name)
    assert found["--hidden-size"] == str(model.hidden_size) and found["--num-experts"] == str(
        model.moe.num_routed_experts
    )
    assert found["--bf16"] is True and found["--nnodes"] == "8" and found["--nproc-per-node"] == "8"
    assert found["--tokenizer-model"] == "Qwen/Qwen3-235B-A22B"
    assert model.attention.qk_norm and found["--qk-layernorm"] is True  # Qwen3's q/k norms


def test_uneven_pipeline_goes_to_megatron_layout(training_plan) -> None:
    from tests.test_export import _with

    plan = _with(training_plan, pp=3, dp=2, tp=8, cp=1, ep=16, pipeline_schedule="1f1b").model_copy(
        update={"world_size": 48}
    )
    layout = flags(export_plan(plan, format="megatron").files["megatron_args.sh"])[
        "--pipeline-model-parallel-layout"
    ]
    sizes = [s.stop_layer - s.start_layer for s in plan.stages]
    assert layout.startswith("E") and layout.endswith("L") and layout.count("|") == 2
    assert [int(part.strip("EL").split("*")[1]) for part in layout.split("|")] == sizes


def test_deepspeed_batch_identity_excludes_tp_pp_cp(training_plan) -> None:
    c = training_plan.config
    config = json.loads(export_plan(training_plan, format="deepspeed").files["ds_config.json"])
    dp_world = training_plan.world_size // (c.tp * c.pp * c.cp)
    assert (
        config["train_batch_size"]
        == config["train_micro_batch_size_per_gpu"]
        * config["gradient_accumulation_steps"]
        * dp_world
    )


def test_torchtitan_current_release_is_a_command_line_and_old_one_toml(
    training_plan,
) -> None:
    current = export_plan(training_plan, format="torchtitan")
    assert current.engine_version == "0.3.0" and not any(
        name.endswith(".toml") for name in current.files
    )
    found = flags(current.files["launch_torchtitan.sh"])
    assert found["--module"] == "qwen3" and found["--parallelism.tensor_parallel_degree"] == str(
        training_plan.config.tp
    )
    old = export_plan(training_plan, format="torchtitan", engine_version="0.2.2")
    assert "torchtitan.toml" in old.files and "[parallelism]" in old.files["torchtitan.toml"]


def test_every_export_has_a_readme_note(training_plan, inference_plan) -> None:
    for plan in (training_plan, inference_plan):
        for format in FORMATS:
            files = export_plan(plan, format=format).files
            assert f"README_{format}.md" in files and "## Launch" in files[f"README_{format}.md"]


# ---------------------------------------------------------------------------- round trip
@pytest.mark.parametrize("format", FORMATS)
def test_export_then_import_returns_the_layout(format: str) -> None:
    import autoparallel as ap
    from autoparallel.export._common import engine_role, rule_violations
    from autoparallel.export._serving import _pools

    training = engine_role(format) == "training"
    plan = ap.find_plan(
        "mixtral-8x22b" if training else "deepseek-v3",
        ap.get_preset("dgx-h100", num_nodes=8 if training else 4),
        TRAINING if training else INFERENCE,
        n_trials=20,
        engine=format,
    )
    pools = (
        _pools(plan)
        if engine_role(format) == "serving"
        else [("", plan.config, plan.world_size, None)]
    )
    files = export_plan(plan, format=format).files
    checked = 0
    for name, config, _, settings in pools:
        if rule_violations(plan, config, engine=format, serving=settings):
            continue  # the engine cannot express this pool's layout (listed as dropped)
        pool_files = {k: v for k, v in files.items() if f"_{name}" in k or not name}
        back = import_config(format, pool_files, pp=config.pp, ep=config.ep)
        moe = plan.model.moe is not None
        assert layout_key(back, engine=format, moe=moe) == layout_key(
            config, engine=format, moe=moe
        )
        checked += 1
    assert checked == len(pools), "a plan searched for the engine is expressed whole"


def test_sglang_reads_the_plans_expert_placement(inference_plan) -> None:
    from autoparallel.plan import Deployment

    plan = inference_plan.model_copy(update={"deployment": Deployment()})
    placement = plan.expert_placement
    if placement is None or placement.ep != plan.config.ep or plan.config.ep == 1:
        pytest.skip("the fixture plan has no expert-parallel placement")
    files = export_plan(plan, format="sglang").files
    assert (
        flags(files["launch_sglang_colocated.sh"])["--init-expert-location"]
        == "sglang_expert_location.json"
    )
    rows = json.loads(files["sglang_expert_location.json"])["physical_to_logical_map"]
    assert len(rows) == plan.model.num_layers
    slots = placement.slots_per_rank
    for expert, ranks in enumerate(
        placement.expert_to_ranks
    ):  # every replica sits in a slot of its rank
        for rank in ranks:
            assert expert in rows[0][rank * slots : (rank + 1) * slots]
    assert sorted(set(rows[0])) == list(range(placement.num_experts))


def test_export_text_is_a_valid_shell_script_at_any_width(
    inference_plan, tmp_path, monkeypatch
) -> None:
    import subprocess

    from autoparallel.cli import main

    path = tmp_path / "plan.json"
    inference_plan.save(path)
    from autoparallel.cli import _render

    monkeypatch.setattr(_render.console, "_width", 40)  # a narrow terminal, for the rich console
    out = tmp_path / "out"
    assert main(["export", str(path), "--format", "sglang", "--output-dir", str(out)]) == 0
    assert (out / "README_sglang.md").exists()
    for script in out.glob("*.sh"):
        assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0, (
            script.read_text()
        )


def test_each_pool_gets_its_own_settings_and_a_prefill_pool_no_overlap_without_a2a(
    inference_plan,
) -> None:
    from autoparallel.plan import Deployment, Pool, ServingSettings
    from cost_model import ParallelConfig

    prefill = ParallelConfig(tp=8, dp=1, ep=1, etp=8)  # experts over tp: no all-to-all backend
    decode = ParallelConfig(tp=8, dp=2, ep=16, etp=1, attention_data_parallel=True)
    pools = (
        Pool(
            role="prefill",
            num_units=2,
            devices_per_unit=8,
            config=prefill,
            serving=ServingSettings(batch_size=4, two_batch_overlap=True),
        ),
        Pool(
            role="decode",
            num_units=1,
            devices_per_unit=16,
            config=decode,
            serving=ServingSettings(batch_size=64, kv_dtype="fp8", two_batch_overlap=True),
        ),
    )
    plan = inference_plan.model_copy(
        update={"deployment": Deployment(kind="disaggregated", pools=pools)}
    )
    result = export_plan(plan, format="sglang")
    prefill_flags = flags(result.files["launch_sglang_prefill.sh"])
    decode_flags = flags(result.files["launch_sglang_decode.sh"])
    assert "--enable-two-batch-overlap" not in prefill_flags and prefill_flags["--tp-size"] == "8"
    assert any(
        item.startswith("prefill: two-batch overlap needs an all-to-all backend")
        for item in result.dropped
    )
    assert (
        decode_flags["--enable-two-batch-overlap"] is True
        and decode_flags["--moe-a2a-backend"] == "deepep"
    )
    assert (
        decode_flags["--max-running-requests"] == str(64 * 16)
        and decode_flags["--kv-cache-dtype"] == "fp8_e4m3"
    )
    assert (
        prefill_flags["--max-running-requests"] == "4"
        and decode_flags["--disaggregation-mode"] == "decode"
    )


def test_stdout_export_is_the_plain_render(inference_plan, tmp_path, capsys, monkeypatch) -> None:
    from autoparallel.cli import main

    path = tmp_path / "plan.json"
    inference_plan.save(path)
    from autoparallel.cli import _render

    monkeypatch.setattr(_render.console, "_width", 30)  # a narrow terminal, for the rich console
    assert main(["export", str(path), "--format", "vllm"]) == 0
    assert capsys.readouterr().out == export_plan(inference_plan, format="vllm").render()


def test_plan_lists_the_engines_that_run_it(training_plan) -> None:
    from autoparallel.cli._engines import engines_line
    from autoparallel.export import runnable_engines

    line = engines_line(training_plan)
    verdicts = runnable_engines(training_plan)
    assert line.startswith("training engines that run this layout:") and "vllm" not in line
    for engine in ("megatron", "torchtitan", "deepspeed"):
        assert (f"{engine} yes" in line) == (not verdicts[engine])


def test_a_world_of_part_nodes_is_named_not_rounded_down(training_plan) -> None:
    plan = training_plan.model_copy(update={"devices_per_node": 48})  # 64 devices: 1 1/3 nodes
    for format in ("megatron", "torchtitan", "deepspeed"):
        result = export_plan(plan, format=format)
        script = next(text for name, text in result.files.items() if name.endswith(".sh"))
        assert flags(script)["--nnodes"] == "2"
        assert any(
            item.startswith("world 64 is not a whole number of 48-device nodes")
            for item in result.dropped
        )
