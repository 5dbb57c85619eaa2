"""A plan is checked whole when loaded: each of a table of named corruptions is refused by
``load_plan`` with an error naming the field, its value and the rule, and by the CLI's
``explain`` and ``export`` with exit code 2; random corruptions never yield an accepted plan that
breaks a rule (an independent check); the runtime refuses a plan whose world size disagrees."""

from __future__ import annotations

import copy
import itertools
import json
from collections import Counter
from collections.abc import Callable
from math import prod
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import autoparallel as ap
from autoparallel.cli import main
from autoparallel.plan import PlanError
from autoparallel.testing import plan_for_config
from cost_model import ParallelConfig

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "autoparallel" / "schema" / "examples"
INFERENCE = (
    EXAMPLES / "ref-3t-moe_inference_gb200-nvl72.json"
).read_text()  # 72 ranks: tp2 pp3 dp12 ep24
TRAINING = (
    EXAMPLES / "ref-3t-moe_training_1024xh200.json"
).read_text()  # 1024 ranks: cp2 dp512 ep256 zero3
DISAGGREGATED = (EXAMPLES / "deepseek-v3_disaggregated_512xh800.json").read_text()

Edit = Callable[[dict[str, Any]], None]


def _edited(base: str, edit: Edit) -> str:
    document = json.loads(base)
    edit(document)
    return json.dumps(document)


def _set(path: str, value: Any) -> Edit:
    """Set the value at a dotted path (list indices as numbers: ``stages.0.start_layer``)."""

    def edit(document: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = document
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return edit


def _many(*edits: Edit) -> Edit:
    def edit(document: dict[str, Any]) -> None:
        for one in edits:
            one(document)

    return edit


def _delete(path: str) -> Edit:
    def edit(document: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = document
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        del node[int(last) if isinstance(node, list) else last]

    return edit


def _apply(function: Callable[[dict[str, Any]], Any]) -> Edit:
    return lambda document: function(document) and None


def _layout(**degrees: int) -> Edit:
    """Config degrees and the mesh axes that go with them (only the rule under test breaks)."""

    def edit(document: dict[str, Any]) -> None:
        config = document["config"]
        config.update(degrees)
        document["mesh_axes"] = [{"name": n, "size": config[n]} for n in ("pp", "dp", "cp", "tp")]
        stage_ranks = config["dp"] * config["cp"] * config["tp"]
        edp = stage_ranks // (config["ep"] * config["etp"])
        document["moe_mesh_axes"] = [
            {"name": n, "size": s}
            for n, s in (
                ("pp", config["pp"]),
                ("edp", edp),
                ("ep", config["ep"]),
                ("etp", config["etp"]),
            )
        ]

    return edit


def _text(text: str) -> Callable[[str], str]:
    return lambda base: text


def _cut(fraction: float) -> Callable[[str], str]:
    return lambda base: base[: int(len(base) * fraction)]


# name -> (base document, corruption, regex the error must match)
CORRUPTIONS: dict[str, tuple[str, Callable[[str], str] | Edit, str]] = {
    "truncated_to_half": (
        INFERENCE,
        _cut(0.5),
        r"plan document \(.*\): is not valid JSON",
    ),
    "truncated_to_one_brace": (INFERENCE, _text("{"), r"is not valid JSON"),
    "truncated_last_character": (TRAINING, _cut(0.9999), r"is not valid JSON"),
    "not_an_object": (
        INFERENCE,
        _text("[1, 2, 3]"),
        r"plan document \(list\): a plan must be a JSON object",
    ),
    "schema_version_0": (
        INFERENCE,
        _set("schema_version", 0),
        r"plan schema_version \(0\): must be >= 1",
    ),
    "schema_version_minus_1": (
        INFERENCE,
        _set("schema_version", -1),
        r"plan schema_version \(-1\): must be >= 1",
    ),
    "schema_version_3": (
        INFERENCE,
        _set("schema_version", 3),
        r"schema_version \(3\): is newer than this library supports \(2\)",
    ),
    "schema_version_99": (
        TRAINING,
        _set("schema_version", 99),
        r"schema_version \(99\): is newer",
    ),
    "schema_version_text": (
        INFERENCE,
        _set("schema_version", "2"),
        r"schema_version \('2'\): must be an integer from 1 to 2",
    ),
    "schema_version_float": (
        INFERENCE,
        _set("schema_version", 1.5),
        r"schema_version \(1.5\): must be an integer",
    ),
    "schema_version_bool": (
        INFERENCE,
        _set("schema_version", True),
        r"schema_version \(True\): must be an integer",
    ),
    "schema_version_missing": (
        INFERENCE,
        _delete("schema_version"),
        r"plan schema_version \(missing\)",
    ),
    "unknown_top_level_key": (
        INFERENCE,
        _set("colour", "blue"),
        r"plan colour \(unknown key\): valid keys there: alternatives",
    ),
    "unknown_provenance_key": (
        TRAINING,
        _set("provenance.colour", 1),
        r"plan provenance.colour \(unknown key\)",
    ),
    "unknown_job_key": (
        TRAINING,
        _set("job.colour", 1),
        r"plan job.training.colour \(unknown key\): valid keys there: .*global_batch_sequences",
    ),
    "missing_config": (
        INFERENCE,
        _delete("config"),
        r"plan config \(missing\): is required",
    ),
    "world_size_zero": (
        INFERENCE,
        _set("world_size", 0),
        r"plan world_size \(0\): Input should be greater than 0",
    ),
    "world_size_doubled": (
        INFERENCE,
        _set("world_size", 144),
        r"plan config \(tp2.*\): dp\*cp\*tp\*pp \(12\*1\*2\*3 = 72\) must equal world_size \(144\)",
    ),
    "doubled_tp": (
        INFERENCE,
        _set("config.tp", 4),
        r"plan config \(tp4.*\): dp\*cp\*tp\*pp \(12\*1\*4\*3 = 144\) must equal world_size \(72\)",
    ),
    "doubled_tp_and_mesh": (INFERENCE, _layout(tp=4), r"must equal world_size \(72\)"),
    "halved_dp": (
        TRAINING,
        _set("config.dp", 256),
        r"dp\*cp\*tp\*pp \(256\*2\*1\*1 = 512\) must equal world_size \(1024\)",
    ),
    "tp_3_with_128_heads": (
        INFERENCE,
        _layout(tp=3, dp=8, ep=24),
        r"plan config \(tp3.*\): num_attention_heads \(128\) must be divisible by tp \(3\)",
    ),
    "ep_7_with_768_experts": (
        INFERENCE,
        _layout(tp=1, pp=1, dp=72, ep=7),
        r"num_routed_experts \(768\) must be divisible by ep \(7\)",
    ),
    "ep_times_etp_not_dividing_a_stage": (
        INFERENCE,
        _layout(ep=16),
        r"dp\*cp\*tp \(24\) must be divisible by ep\*etp \(16\)",
    ),
    "pp_above_num_layers": (
        TRAINING,
        _layout(pp=128, dp=4, ep=8),
        r"pp\*virtual_stages \(128\*1 = 128\) must be <= num_layers \(80\)",
    ),
    "tp_zero": (
        INFERENCE,
        _set("config.tp", 0),
        r"plan config.tp \(0\): Input should be greater than 0",
    ),
    "tp_negative": (
        INFERENCE,
        _set("config.tp", -2),
        r"plan config.tp \(-2\): Input should be greater than 0",
    ),
    "tp_not_a_number": (
        INFERENCE,
        _set("config.tp", "eight"),
        r"plan config.tp \('eight'\): Input should be a valid integer",
    ),
    "sequence_parallel_without_tp": (
        TRAINING,
        _set("config.sequence_parallel", True),
        r"sequence_parallel \(True\) requires tp > 1",
    ),
    "virtual_stages_without_interleaving": (
        TRAINING,
        _set("config.virtual_stages", 2),
        r"virtual_stages \(2\) must be 1 for pipeline_schedule '1f1b'",
    ),
    "mesh_axes_reordered": (
        INFERENCE,
        _apply(lambda d: d["mesh_axes"].reverse()),
        r"plan mesh_axes \(.*\): must be the config's dense mesh",
    ),
    "mesh_axes_wrong_size": (
        INFERENCE,
        _set("mesh_axes.1.size", 6),
        r"plan mesh_axes \(.*'dp': 6.*\): must be the config's dense mesh",
    ),
    "moe_mesh_axes_missing": (
        INFERENCE,
        _set("moe_mesh_axes", []),
        r"plan moe_mesh_axes \(\{\}\): must be the config's MoE view",
    ),
    "moe_mesh_axes_wrong_ep": (
        TRAINING,
        _set("moe_mesh_axes.2.size", 128),
        r"plan moe_mesh_axes .*: must be the config's MoE view",
    ),
    "rank_map_repeats_a_device": (
        INFERENCE,
        _set("rank_to_device.5", 0),
        (
            r"plan rank_to_device \(device 0 repeated\): "
            r"must be a permutation of range\(world_size = 72\)"
        ),
    ),
    "rank_map_device_9999": (
        TRAINING,
        _set("rank_to_device.17", 9999),
        r"plan rank_to_device \(device 9999 out of range\): must be a permutation",
    ),
    "rank_map_negative_device": (
        INFERENCE,
        _set("rank_to_device.0", -1),
        r"device -1 out of range",
    ),
    "rank_map_truncated": (
        INFERENCE,
        _apply(lambda d: d["rank_to_device"].pop()),
        r"plan rank_to_device \(71 entries\): must list one device per rank \(72\)",
    ),
    "rank_map_too_long": (
        INFERENCE,
        _apply(lambda d: d["rank_to_device"].append(72)),
        r"rank_to_device \(73 entries\)",
    ),
    "stages_truncated": (
        INFERENCE,
        _apply(lambda d: d["stages"].pop()),
        r"plan stages \(2 chunks\): must hold pp\*virtual_stages \(3\*1 = 3\) chunks",
    ),
    "stages_gap": (
        INFERENCE,
        _set("stages.1.start_layer", 28),
        r"plan stages\[1\].start_layer \(28\): must be 27: chunks cover the layers in order",
    ),
    "stages_overlap": (
        INFERENCE,
        _set("stages.1.start_layer", 20),
        r"plan stages\[1\].start_layer \(20\): must be 27",
    ),
    "stages_reversed": (
        INFERENCE,
        _apply(lambda d: d["stages"].reverse()),
        r"plan stages\[0\].chunk/stage \(2/2\): must be 0/0",
    ),
    "stage_empty": (
        INFERENCE,
        _set("stages.0.stop_layer", 0),
        r"plan stages\[0\]\.stop_layer \(0\): Input should be greater than 0",
    ),
    "stages_short_of_the_layers": (
        INFERENCE,
        _set("stages.2.stop_layer", 79),
        r"plan stages\[2\].stop_layer \(79\): must be num_layers \(80\)",
    ),
    "stages_beyond_the_layers": (
        INFERENCE,
        _set("stages.2.stop_layer", 81),
        r"stop_layer \(81\): must be num_layers \(80\)",
    ),
    "lm_head_on_the_first_stage": (
        INFERENCE,
        _set("stages.0.has_lm_head", True),
        r"plan stages\[0\].has_embedding/has_lm_head \(True/True\)",
    ),
    "expert_on_rank_9999": (
        INFERENCE,
        _set("expert_placement.expert_to_ranks.3", [9999]),
        (
            r"plan expert_placement.expert_to_ranks\[3\] \(\[9999\]\): "
            r"EP ranks must be in range\(ep = 24\)"
        ),
    ),
    "expert_map_truncated": (
        INFERENCE,
        _apply(lambda d: d["expert_placement"]["expert_to_ranks"].pop()),
        r"expert_to_ranks \(767 experts\): must list every expert \(768\)",
    ),
    "expert_without_a_rank": (
        TRAINING,
        _set("expert_placement.expert_to_ranks.0", []),
        r"expert_to_ranks\[0\] \(\[\]\): every expert must be held by at least one EP rank",
    ),
    "expert_twice_on_one_rank": (
        INFERENCE,
        _set("expert_placement.expert_to_ranks.0", [0, 0]),
        r"an expert's replicas must be on distinct EP ranks",
    ),
    "experts_unevenly_placed": (
        INFERENCE,
        _set("expert_placement.expert_to_ranks.0", [1]),
        r"EP rank 0 holds 31\): every EP rank must hold .* = 32 experts",
    ),
    "expert_count_wrong": (
        INFERENCE,
        _set("expert_placement.num_experts", 384),
        r"plan expert_placement.num_experts \(384\): must equal the model's routed experts \(768\)",
    ),
    "expert_ep_wrong": (
        INFERENCE,
        _set("expert_placement.ep", 12),
        r"plan expert_placement.ep \(12\): must equal config.ep \(24\)",
    ),
    "expert_placement_missing": (
        INFERENCE,
        _set("expert_placement", None),
        r"plan expert_placement \(None\): must place the 768 routed experts",
    ),
    "redundant_slots_not_dividing": (
        INFERENCE,
        _many(
            _set("expert_placement.num_redundant_experts", 5),
            _set("serving.num_redundant_experts", 5),
        ),
        r"num_routed_experts \+ num_redundant_experts \(773\) must be divisible by ep \(24\)",
    ),
    "redundant_slots_disagree_with_serving": (
        INFERENCE,
        _set("serving.num_redundant_experts", 24),
        r"must equal serving.num_redundant_experts \(24\)",
    ),
    "model_fingerprint_changed": (
        INFERENCE,
        _set("provenance.model_fingerprint", "0000"),
        r"plan provenance.model_fingerprint \(0000\): must equal the fingerprint",
    ),
    "model_renamed": (
        TRAINING,
        _set("provenance.model_name", "other"),
        r"plan provenance.model_name \(other\): must equal model.name",
    ),
    "model_layers_changed": (
        INFERENCE,
        _set("model.num_layers", 81),
        r"provenance.model_fingerprint .*: must equal the fingerprint of the plan's model",
    ),
    "training_job_with_serving": (
        INFERENCE,
        _set(
            "job",
            {
                "kind": "training",
                "sequence_length_tokens": 4096,
                "global_batch_sequences": 72,
            },
        ),
        r"plan serving \(22\): must be absent for a training job",
    ),
    "inference_job_without_serving": (
        INFERENCE,
        _set("serving", None),
        r"plan serving \(None\): an inference plan priced for serving must record",
    ),
    "batch_not_divisible": (
        TRAINING,
        _many(_set("job.global_batch_sequences", 1000), _delete("job.global_batch_tokens")),
        r"global_batch_sequences \(1000\) must be divisible by dp \* micro_batch_size",
    ),
    "sequence_not_divisible_by_2cp": (
        TRAINING,
        _many(_set("job.sequence_length_tokens", 4098), _delete("job.global_batch_tokens")),
        r"sequence_length_tokens \(4098\) must be divisible by 2\*cp \(4\)",
    ),
    "attention_data_parallel_in_training": (
        TRAINING,
        _set("config.attention_data_parallel", True),
        r"plan config.attention_data_parallel \(True\): is an inference layout",
    ),
    "devices_per_node_zero": (
        INFERENCE,
        _set("devices_per_node", 0),
        r"plan devices_per_node \(0\): Input should be greater than 0",
    ),
    "devices_per_node_missing": (
        INFERENCE,
        _delete("devices_per_node"),
        r"plan devices_per_node \(missing\): is required",
    ),
    "alternative_tp_3": (
        INFERENCE,
        _set("alternatives.0.config.tp", 3),
        r"plan alternatives\[0\].config \(tp3.*\): dp\*cp\*tp\*pp",
    ),
    "module_rule_unknown_axis": (
        INFERENCE,
        _set("module_rules.0.mesh_axis", "xp"),
        r"plan module_rules\[0\].mesh_axis \(xp\): must be one of",
    ),
    "pool_unit_size_wrong": (
        DISAGGREGATED,
        _set("deployment.pools.0.devices_per_unit", 7),
        (
            r"plan deployment.pools\[0\].config \(.*\): "
            r"dp\*cp\*tp\*pp \(.*\) must equal world_size \(7\)"
        ),
    ),
    "pools_beyond_the_world": (
        DISAGGREGATED,
        _set("deployment.pools.1.num_units", 1000),
        r"plan deployment.pools \(\d+ devices\): must fit in world_size \(512\)",
    ),
    "disaggregated_without_pools": (
        DISAGGREGATED,
        _set("deployment.pools", []),
        (
            r"plan deployment.pools \(\[\]\): "
            r"a disaggregated deployment has one prefill and one decode pool"
        ),
    ),
    "pool_role_unknown": (
        DISAGGREGATED,
        _set("deployment.pools.0.role", "encode"),
        r"plan deployment.pools\[0\].role \('encode'\)",
    ),
    "training_with_pools": (
        TRAINING,
        _set("deployment.kind", "disaggregated"),
        r"plan deployment.kind \(disaggregated\): a training job is colocated",
    ),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_corruption_is_refused_by_load_explain_and_export(
    name: str, tmp_path: Path, capsys
) -> None:
    base, corrupt, message = CORRUPTIONS[name]
    text = corrupt(base) if _is_text_corruption(corrupt) else _edited(base, corrupt)
    with pytest.raises(PlanError, match=message) as caught:
        ap.load_plan(text)
    assert "\n" not in str(caught.value)
    path = tmp_path / "plan.json"
    path.write_text(text)
    with pytest.raises(PlanError, match=message) as caught:
        ap.load_plan(path)
    for command in (
        ["explain", str(path)],
        ["export", str(path), "--format", "vllm"],
        ["export", str(path), "--format", "megatron"],
    ):
        assert main(command) == 2, command
        error = " ".join(capsys.readouterr().err.split())
        assert error == f"error: {' '.join(str(caught.value).split())}", command


def _is_text_corruption(corrupt: Callable) -> bool:
    return corrupt.__qualname__.startswith(("_text.", "_cut."))


def test_the_table_is_large_and_every_base_plan_is_valid() -> None:
    assert len(CORRUPTIONS) >= 48
    for base in (INFERENCE, TRAINING, DISAGGREGATED):
        assert ap.load_plan(base).schema_version == 2
    assert main(["explain", str(EXAMPLES / "ref-3t-moe_inference_gb200-nvl72.json")]) == 0


def test_missing_files_and_folders_are_named(tmp_path: Path, capsys) -> None:
    with pytest.raises(PlanError, match=r"plan path \(.*nothing.json\): no such file"):
        ap.load_plan(tmp_path / "nothing.json")
    with pytest.raises(PlanError, match=r"plan path \(.*\): is a folder, not a plan file"):
        ap.load_plan(tmp_path)
    assert main(["explain", str(tmp_path / "nothing.json")]) == 2
    assert "no such file" in " ".join(capsys.readouterr().err.split())


# ---------------------------------------------------------------------------- random corruptions
def _small_plan() -> dict[str, Any]:
    """A tiny-moe plan with every axis > 1 but cp: tp2 pp2 dp2 ep2 on 8 ranks."""
    plan = plan_for_config(ap.get_model("tiny-moe"), ParallelConfig(tp=2, pp=2, dp=2, ep=2))
    return json.loads(plan.to_json())


SMALL = _small_plan()


def _integer_paths(document: Any, prefix: tuple = ()) -> list[tuple]:
    """Paths of every integer leaf of the structure fields a corruption may hit."""
    if isinstance(document, bool):
        return []
    if isinstance(document, int):
        return [prefix]
    if isinstance(document, dict):
        return [p for key, value in document.items() for p in _integer_paths(value, (*prefix, key))]
    if isinstance(document, list):
        return [
            p
            for index, value in enumerate(document)
            for p in _integer_paths(value, (*prefix, index))
        ]
    return []


TARGETS = (
    "world_size",
    "config",
    "mesh_axes",
    "moe_mesh_axes",
    "rank_to_device",
    "stages",
    "expert_placement",
)
PATHS = sorted((p for p in _integer_paths(SMALL) if p[0] in TARGETS), key=str)


def _consistent(document: dict[str, Any]) -> bool:
    """An independent check of the rules a plan must keep (not the library's code)."""
    model, config, world = document["model"], document["config"], document["world_size"]
    dims = [config[a] for a in ("pp", "dp", "cp", "tp")]
    if min(dims + [config["ep"], config["etp"], world]) < 1 or prod(dims) != world:
        return False
    if (
        model["attention"]["num_heads"] % config["tp"]
        or model["moe"]["num_routed_experts"] % config["ep"]
    ):
        return False
    stage_ranks = config["dp"] * config["cp"] * config["tp"]
    if stage_ranks % (config["ep"] * config["etp"]):
        return False
    if [(a["name"], a["size"]) for a in document["mesh_axes"]] != list(
        zip(("pp", "dp", "cp", "tp"), dims)
    ):
        return False
    moe = [
        ("pp", config["pp"]),
        ("edp", stage_ranks // (config["ep"] * config["etp"])),
        ("ep", config["ep"]),
        ("etp", config["etp"]),
    ]
    if [(a["name"], a["size"]) for a in document["moe_mesh_axes"]] != moe:
        return False
    if sorted(document["rank_to_device"]) != list(range(world)):
        return False
    bounds = [(s["start_layer"], s["stop_layer"]) for s in document["stages"]]
    if (
        len(bounds) != config["pp"] * config["virtual_stages"]
        or bounds[0][0] != 0
        or bounds[-1][1] != model["num_layers"]
    ):
        return False
    if any(a[1] != b[0] for a, b in itertools.pairwise(bounds)) or any(
        start >= stop for start, stop in bounds
    ):
        return False
    if [(s["chunk"], s["stage"]) for s in document["stages"]] != [
        (i, i % config["pp"]) for i in range(len(bounds))
    ]:
        return False
    placement = document["expert_placement"]
    ep = placement["ep"]
    held = Counter(rank for ranks in placement["expert_to_ranks"] for rank in ranks)
    slots = placement["num_experts"] + placement["num_redundant_experts"]
    return (
        ep == config["ep"]
        and placement["num_experts"]
        == model["moe"]["num_routed_experts"]
        == len(placement["expert_to_ranks"])
        and all(ranks and len(set(ranks)) == len(ranks) for ranks in placement["expert_to_ranks"])
        and set(held) <= set(range(ep))
        and slots % ep == 0
        and all(held[r] == slots // ep for r in range(ep))
    )


def test_the_independent_check_accepts_the_valid_plan_and_the_library_agrees() -> None:
    assert _consistent(SMALL) and ap.load_plan(SMALL) is not None
    assert len(PATHS) >= 40


@settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    edits=st.lists(
        st.tuples(st.sampled_from(PATHS), st.integers(min_value=-2, max_value=20)),
        min_size=1,
        max_size=3,
    )
)
def test_random_corruptions_never_yield_an_accepted_inconsistent_plan(
    edits: list[tuple[tuple, int]],
) -> None:
    document = copy.deepcopy(SMALL)
    for path, value in edits:
        node: Any = document
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
    try:
        loaded = ap.load_plan(document)
    except PlanError:
        return  # refused, with a named error
    assert _consistent(document), f"accepted an inconsistent plan after {edits}"
    assert json.loads(loaded.to_json())["rank_to_device"] == document["rank_to_device"]


@pytest.mark.parametrize(
    "rule", ["_check_rank_map", "_check_stages", "check_expert_map", "_check_meshes"]
)
def test_the_random_search_finds_a_rule_switched_off(rule: str, monkeypatch) -> None:
    """Negative control: with one rule of the library switched off, the random corruptions do
    produce an accepted inconsistent plan, so the property above can fail."""
    from autoparallel.plan import _validate

    monkeypatch.setattr(_validate, rule, lambda *args, **kwargs: None)
    with pytest.raises(AssertionError, match="accepted an inconsistent plan"):
        test_random_corruptions_never_yield_an_accepted_inconsistent_plan()


# ------------------------------------------------------------------------ the runtime's own check
def test_the_runtime_refuses_a_plan_whose_world_size_disagrees() -> None:
    from autoparallel.runtime._mesh import mesh_rank_layout

    plan = plan_for_config(ap.get_model("tiny-moe"), ParallelConfig(tp=2, dp=2))
    assert mesh_rank_layout(plan).tolist() == [
        [[[0, 1]], [[2, 3]]]
    ]  # the valid plan passes: (pp, dp, cp, tp)
    grown = plan.model_copy(
        update={"world_size": 8, "rank_to_device": tuple(range(8))}
    )  # edited after validation
    with pytest.raises(
        ValueError,
        match=r"plan world_size \(8\) must equal dp\*cp\*tp\*pp of its config \(4\)",
    ):
        mesh_rank_layout(grown)
    shuffled = plan.model_copy(update={"rank_to_device": (0, 1, 3, 3)})
    with pytest.raises(
        ValueError,
        match=r"rank_to_device \(length 4\) must be a permutation of range\(world_size = 4\)",
    ):
        mesh_rank_layout(shuffled)


def test_a_corrupt_plan_exits_2_from_the_installed_command(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    path = tmp_path / "plan.json"
    path.write_text(_edited(INFERENCE, _layout(tp=3, dp=8, ep=24)))
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="200")
    done = subprocess.run(
        [sys.executable, "-m", "autoparallel.cli", "export", str(path), "--format", "sglang"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "num_attention_heads (128) must be divisible by tp (3)" in done.stderr
