"""``ShardingPlan`` built from a search: every field filled and consistent, JSON round trip,
the shipped JSON Schema, and clear rejection of unknown keys and newer schema versions."""

from __future__ import annotations

import json
from math import prod
from pathlib import Path

import numpy as np
import pytest

import autoparallel as ap
from autoparallel._module_rules import module_rules_for
from autoparallel.plan._build import pipeline_stages
from autoparallel.schema import load_schema, plan_json_schema, validate_plan_document
from cost_model import Inference, Training, configs_to_table, estimate_table
from search import SearchSettings

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(params=["training", "inference"])
def plan(request, training_plan, inference_plan) -> ap.ShardingPlan:
    return training_plan if request.param == "training" else inference_plan


def test_mesh_axes_and_placement(plan: ap.ShardingPlan) -> None:
    c = plan.config
    assert [a.name for a in plan.mesh_axes] == ["pp", "dp", "cp", "tp"]
    assert prod(a.size for a in plan.mesh_axes) == plan.world_size == c.world_size
    assert [a.name for a in plan.moe_mesh_axes] == ["pp", "edp", "ep", "etp"]
    assert prod(a.size for a in plan.moe_mesh_axes) == plan.world_size
    assert sorted(plan.rank_to_device) == list(range(plan.world_size))


def test_stages_cover_every_layer_once(plan: ap.ShardingPlan) -> None:
    model = ap.get_model(plan.provenance.model_name)
    assert len(plan.stages) == plan.config.pp * plan.config.virtual_stages
    assert plan.stages[0].start_layer == 0 and plan.stages[-1].stop_layer == model.num_layers
    assert all(a.stop_layer == b.start_layer for a, b in zip(plan.stages, plan.stages[1:]))
    assert plan.stages[0].has_embedding and plan.stages[-1].has_lm_head


def test_uneven_interleaved_stages() -> None:
    stages = pipeline_stages(
        num_layers=80,
        config=ap.ParallelConfig(
            dp=2, pp=3, pipeline_schedule="interleaved_1f1b", virtual_stages=2
        ),
    )
    sizes = [s.stop_layer - s.start_layer for s in stages]
    assert sum(sizes) == 80 and max(sizes) - min(sizes) == 1  # uneven, as even as possible
    assert [s.stage for s in stages] == [0, 1, 2, 0, 1, 2]
    assert [s.has_embedding for s in stages] == [True] + [False] * 5
    assert [s.has_lm_head for s in stages] == [False] * 5 + [True]


def test_experts_rules_and_prediction(plan: ap.ShardingPlan) -> None:
    model = ap.get_model(plan.provenance.model_name)
    placement = plan.expert_placement
    assert placement.num_experts == model.moe.num_routed_experts and placement.ep == plan.config.ep
    held = [rank for ranks in placement.expert_to_ranks for rank in ranks]
    assert len(held) == placement.num_experts + placement.num_redundant_experts
    assert set(held) <= set(range(placement.ep))
    assert np.all(np.bincount(held, minlength=placement.ep) == placement.slots_per_rank)
    assert plan.module_rules == module_rules_for(model=model, config=plan.config)
    cluster = ap.get_preset("dgx-h100", num_nodes=plan.world_size // 8)
    workload = ap.load_plan(plan.to_json()).job
    assert isinstance(workload, Training if plan.serving is None else Inference)
    extras = {}
    if plan.serving is not None:
        extras = plan.serving.serving_config().columns(workload=workload)
    columns = estimate_table(model, cluster, workload, configs_to_table([plan.config], **extras))
    assert plan.predicted.step_time_s == pytest.approx(float(columns["step_time_s"][0]), rel=1e-9)
    assert plan.predicted.memory_per_device_bytes <= plan.predicted.memory_capacity_bytes


def test_alternatives_lost_for_a_reason(plan: ap.ShardingPlan) -> None:
    assert plan.alternatives
    for alternative in plan.alternatives:
        assert alternative.reason_lost and alternative.config != plan.config
    if plan.serving is None:
        assert all(a.predicted.step_time_s >= plan.predicted.step_time_s for a in plan.alternatives)
    else:
        best = plan.predicted.tokens_per_s_per_device
        assert all(
            a.predicted.tokens_per_s_per_device <= best * (1 + 1e-9) for a in plan.alternatives
        )


def test_provenance(plan: ap.ShardingPlan) -> None:
    provenance = plan.provenance
    model = ap.get_model(provenance.model_name)
    assert provenance.model_fingerprint == model.fingerprint()
    assert provenance.library_version == ap.__version__
    search = provenance.search
    assert search.space_size > search.num_meshes > 0 and provenance.created_at
    if (
        search.space_size <= 20_000
    ):  # a small space is priced whole (brute force), one trial per mesh
        assert search.method == "brute_force" and search.num_trials == search.num_meshes
    else:
        assert search.method == "tpe" and search.num_trials == 40
    assert plan.devices_per_node == 8 and plan.model == model


def test_json_round_trip_and_schema(plan: ap.ShardingPlan, tmp_path: Path) -> None:
    path = plan.save(tmp_path / "plan.json")
    loaded = ap.load_plan(path)
    assert loaded == plan and hash(loaded) == hash(plan)
    validate_plan_document(json.loads(path.read_text()))


def test_shipped_schema_matches_the_model() -> None:
    assert load_schema() == json.loads(
        json.dumps(plan_json_schema())
    )  # regenerate: python -m autoparallel.schema
    assert load_schema()["additionalProperties"] is False


def test_unknown_keys_and_newer_versions_are_rejected(inference_plan: ap.ShardingPlan) -> None:
    document = json.loads(inference_plan.to_json())
    document["provenance"]["colour"] = "blue"
    with pytest.raises(
        ValueError,
        match="plan provenance.colour \\(unknown key\\): valid keys there: cluster_fingerprint",
    ):
        ap.load_plan(document)
    with pytest.raises(ValueError, match="provenance: Additional properties are not allowed"):
        validate_plan_document(document)
    document = json.loads(inference_plan.to_json())
    document["schema_version"] = ap.SCHEMA_VERSION + 1
    with pytest.raises(ValueError, match="newer than this library supports"):
        ap.load_plan(document)
    with pytest.raises(ValueError, match="schema_version"):
        validate_plan_document(document)


def test_every_example_plan_validates() -> None:
    documents = [p for p in REPO.glob("examples/**/*.json") if '"schema_version"' in p.read_text()]
    documents += sorted((REPO / "autoparallel" / "schema" / "examples").glob("*.json"))
    assert len(documents) >= 4
    for path in documents:
        validate_plan_document(json.loads(path.read_text()))
        ap.load_plan(path)


def test_prefill_decode_disaggregation_when_it_serves_more() -> None:
    from autoparallel.export import export_plan

    workload = Inference(prompt_tokens=4096, output_tokens=1024, ttft_slo_s=1.0, tpot_slo_s=0.03)
    small = SearchSettings(brute_force_layouts=0)  # a short study is enough here
    plan = ap.find_plan(
        "deepseek-v3",
        ap.get_preset("hgx-h800", num_nodes=16),
        workload,
        n_trials=24,
        settings=small,
    )
    deployment = plan.deployment
    assert [pool.role for pool in deployment.pools] == ["prefill", "decode"]
    assert deployment.kind == "disaggregated" and plan.disaggregated
    assert (
        deployment.disaggregated_output_tokens_per_s_per_device
        > deployment.colocated_output_tokens_per_s_per_device
    )
    for pool in deployment.pools:
        assert pool.devices_per_unit == pool.config.world_size and pool.predicted is not None
        assert (
            pool.serving.batch_size == pool.predicted.batch_size
        )  # each pool records its own batch
    assert sum(pool.num_devices for pool in deployment.pools) <= plan.world_size
    assert ap.load_plan(plan.to_json()) == plan
    sglang = export_plan(plan, format="sglang")
    assert "--disaggregation-mode prefill" in sglang.files["launch_sglang_prefill.sh"]
    assert "--disaggregation-mode decode" in sglang.files["launch_sglang_decode.sh"]
    vllm = export_plan(plan, format="vllm").files  # per-pool launches with a KV connector
    assert any(
        name.startswith("launch_vllm_prefill") and "--kv-transfer-config" in text
        for name, text in vllm.items()
    )
    no_split = ap.find_plan(
        "deepseek-v3",
        ap.get_preset("hgx-h800", num_nodes=16),
        workload,
        n_trials=8,
        disaggregate=False,
        settings=small,
    )
    assert not no_split.deployment.pools and no_split.deployment.kind == "colocated"


def test_disaggregation_on_a_node_smaller_than_its_nic_share() -> None:
    """cpu-loopback shares one NIC among 4 devices: a 2-device unit must stay a valid Cluster."""
    from search._disaggregation import unit_cluster

    cluster = ap.get_preset("cpu-loopback")
    unit = unit_cluster(cluster, 2)
    assert unit.num_devices == 2 and unit.devices_per_node % unit.devices_per_nic == 0
    assert unit.nodes_per_leaf >= 1
    plan = ap.find_plan(
        ap.get_model("tiny-moe"),
        cluster,
        ap.Inference(prompt_tokens=64, output_tokens=16),
        n_trials=50,
        disaggregate=True,
    )
    assert plan.world_size == cluster.num_devices
