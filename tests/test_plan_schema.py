"""Plan schema version 2: one constructor, version-1 documents upgraded, the published JSON
Schema, and the typed fields the exporters and the runtime read."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import autoparallel as ap
from autoparallel.plan import PlanError, build_plan
from autoparallel.schema import load_schema, validate_plan_document
from cost_model import Inference, Layout, ParallelConfig, ServingConfig, Training

REPO = Path(__file__).resolve().parents[1]
V1_PLANS = sorted((REPO / "tests" / "data" / "plans_v1").glob("*.json"))
EXAMPLES = sorted((REPO / "autoparallel" / "schema" / "examples").glob("*.json"))
SOURCE_FOLDERS = (
    "autoparallel",
    "cost_model",
    "search",
    "topology",
    "profilers",
    "examples",
    "benchmarks",
    "tests",
)


CONSTRUCTION = re.compile(r"\bShardingPlan(\.model_construct)?\s*\(")


def construction_sites(root: Path, folders: tuple[str, ...]) -> list[str]:
    """``file:line`` of every call of the plan class (or its ``model_construct``) under
    ``folders``."""
    sites = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                if CONSTRUCTION.search(line) and not line.lstrip().startswith(("class ", "#")):
                    sites.append(f"{path.relative_to(root)}:{number}")
    return sites


def test_exactly_one_place_constructs_a_sharding_plan() -> None:
    sites = construction_sites(REPO, SOURCE_FOLDERS)
    assert len(sites) == 1 and sites[0].startswith("autoparallel/plan/_build.py:"), sites


def test_the_search_for_construction_sites_is_not_blind(tmp_path: Path) -> None:
    (tmp_path / "package").mkdir()
    name = "Sharding" + "Plan"
    (tmp_path / "package" / "producer.py").write_text(
        f"plan = {name}(**fields)\nother = {name}.model_construct()\n"
    )
    assert construction_sites(tmp_path, ("package",)) == [
        "package/producer.py:1",
        "package/producer.py:2",
    ]


@pytest.mark.parametrize("path", V1_PLANS, ids=[p.stem for p in V1_PLANS])
def test_every_version_1_plan_loads_and_upgrades(path: Path) -> None:
    old = json.loads(path.read_text())
    assert old["schema_version"] == 1
    plan = ap.load_plan(path)
    assert plan.schema_version == ap.SCHEMA_VERSION == 2
    assert plan.job.model_dump(mode="json") == type(plan.job)(
        **old["provenance"]["workload"]
    ).model_dump(mode="json")
    assert (
        plan.model.name == old["provenance"]["model_name"]
        and plan.model.fingerprint() == old["provenance"]["model_fingerprint"]
    )
    search = old["provenance"].get("search", {})
    expected_per_node = (
        search.get("devices_per_node")
        or ap.get_preset(old["provenance"]["cluster_name"].split("@")[0]).devices_per_node
    )
    assert plan.devices_per_node == expected_per_node
    assert (
        plan.config.model_dump() == old["config"]
        and list(plan.rank_to_device) == old["rank_to_device"]
    )
    assert plan.deployment.kind == search.get("deployment", "colocated")
    assert [(p.role, p.num_devices) for p in plan.deployment.pools] == [
        (p["phase"], p["num_devices"]) for p in old["disaggregation"]
    ]
    for pool, old_pool in zip(plan.deployment.pools, old["disaggregation"]):
        assert (
            pool.serving.batch_size == old_pool["predicted"]["batch_size"]
        )  # the pool's own batch
    if search.get("method"):
        assert plan.provenance.search.num_trials == search["num_trials"]
    validate_plan_document(json.loads(plan.to_json()))
    assert ap.load_plan(plan.to_json()) == plan


def test_examples_are_version_2_upgrades_of_the_version_1_plans() -> None:
    assert [p.name for p in EXAMPLES] == [p.name for p in V1_PLANS] and len(EXAMPLES) >= 4
    for example, old in zip(EXAMPLES, V1_PLANS):
        document = json.loads(example.read_text())
        assert document["schema_version"] == 2
        validate_plan_document(document)
        assert ap.load_plan(example) == ap.load_plan(old)


def test_the_schema_is_published_by_the_module_command() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-m", "autoparallel.schema", "--stdout"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    published = json.loads(done.stdout)
    assert published == load_schema()
    assert published["properties"]["schema_version"]["maximum"] == 2
    assert {"job", "model", "devices_per_node", "deployment", "serving"} <= set(
        published["required"]
    ) | set(published["properties"])


def test_a_version_1_document_is_not_a_version_2_one() -> None:
    document = json.loads(V1_PLANS[0].read_text())
    with pytest.raises(ValueError, match="plan does not match the schema"):
        validate_plan_document(document)
    upgraded = json.loads(ap.load_plan(document).to_json())
    validate_plan_document(upgraded)
    with pytest.raises(ValueError, match="schema_version: 1 is less than the minimum of 2"):
        validate_plan_document({**upgraded, "schema_version": 1})


def test_typed_fields_replace_the_string_keys() -> None:
    model = ap.get_model("tiny-moe")
    cluster = ap.get_preset("cpu-loopback")
    job = Inference(prompt_tokens=64, output_tokens=16, kv_dtype="fp8")
    layout = Layout(
        config=ParallelConfig(tp=2, ep=2, dp=2),
        serving=ServingConfig(batch_size=0, two_batch_overlap=True),
    )
    plan = build_plan(model=model, cluster=cluster, job=job, layout=layout)
    assert plan.devices_per_node == cluster.devices_per_node and isinstance(plan.job, Inference)
    assert plan.serving.kv_dtype == "fp8" and plan.serving.two_batch_overlap
    assert (
        plan.serving.batch_size == plan.predicted.batch_size >= 1
    )  # 0 = the batch the price resolved
    assert plan.rank_to_device == tuple(
        range(4)
    )  # Megatron's order: the placement the cost model prices
    priced = ap.estimate(
        model,
        cluster,
        job,
        layout.config,
        **plan.serving.serving_config().model_dump(exclude_none=True),
    )
    assert plan.predicted.step_time_s == pytest.approx(priced.step_time_s, rel=1e-12)


def test_a_request_rate_plan_caps_the_engine_at_what_it_admits_not_the_mean_in_flight() -> None:
    """Mixtral-8x22B on one H200 node at 2 requests/s, four TP2 replicas: about 25 requests are
    in flight per replica on average while the engine admits what its KV pool holds. The plan
    recorded the mean as the batch, which its re-pricing, its simulator check and its engine
    exports (``--max-running-requests``) take as the cap: at 97% of that cap's capacity the
    queue grew (simulated p90 TTFT 13 s against 0.8 s predicted)."""
    import numpy as np

    from cost_model import simulate_layout

    model, cluster = ap.get_model("mixtral-8x22b"), ap.get_preset("dgx-h200", num_nodes=1)
    job = Inference(
        prompt_tokens=4096, output_tokens=1024, serving_engine="sglang", request_rate_per_s=2.0
    )
    layout = Layout(config=ParallelConfig(dp=4, tp=2, etp=4), serving=ServingConfig())
    plan = build_plan(model=model, cluster=cluster, job=job, layout=layout)
    predicted = plan.predicted
    assert predicted.batch_size is not None and predicted.running_cap is not None
    assert plan.serving.batch_size == predicted.running_cap > 2 * predicted.batch_size
    run = simulate_layout(
        model=model,
        cluster=cluster,
        workload=job,
        config=plan.config,
        serving=plan.serving.serving_config(),
        duration_s=1800.0,
    )
    assert float(np.mean(run.result.ttft_s)) < 2.0 * (predicted.ttft_s or 0.0)


def test_build_plan_refuses_a_layout_the_model_does_not_allow() -> None:
    model = ap.get_model("tiny-moe")
    job = Training(sequence_length_tokens=64, global_batch_sequences=8)
    with pytest.raises(
        PlanError,
        match=r"plan config \(ep3·dp3\): num_routed_experts \(\d+\) must be divisible by ep \(3\)",
    ):
        build_plan(
            model=model,
            cluster=ap.get_preset("cpu-loopback"),
            job=job,
            layout=Layout(config=ParallelConfig(dp=3, ep=3)),
            predicted=None,
        )


def _as_version_1(plan: ap.ShardingPlan, *, dense_moe_view: bool = False) -> dict:
    """The version-1 document the producers of that version wrote for ``plan``."""
    document = json.loads(plan.to_json())
    provenance = document["provenance"]
    provenance["workload"] = document.pop("job")
    provenance["search"] = provenance["search"] or {}
    for key in ("model", "devices_per_node", "devices_per_host", "deployment", "estimate_options"):
        document.pop(key)
    document.update(schema_version=1, disaggregation=[])
    if dense_moe_view:  # the profilers' staged checks wrote the MoE view even for dense models
        config = plan.config
        document["moe_mesh_axes"] = [
            {"name": "pp", "size": config.pp},
            {"name": "edp", "size": config.dp * config.cp * config.tp},
            {"name": "ep", "size": 1},
            {"name": "etp", "size": 1},
        ]
    if document["serving"] is not None:
        document["serving"].pop("all_to_all_backend")
    return document


@pytest.mark.parametrize(
    ("model", "config", "dense_moe_view"),
    [
        ("tiny-moe", ParallelConfig(tp=2, pp=2, ep=2), False),
        ("megatron-gpt-1.7b", ParallelConfig(tp=2, pp=2), True),
        ("megatron-gpt-1.7b", ParallelConfig(dp=4), False),
    ],
)
def test_version_1_plans_of_the_old_producers_upgrade(model, config, dense_moe_view) -> None:
    from autoparallel.testing import plan_for_config

    plan = plan_for_config(ap.get_model(model), config)
    old = _as_version_1(plan, dense_moe_view=dense_moe_view)
    assert "devices_per_node" not in old["provenance"]["search"]  # taken from the cluster preset
    assert ap.load_plan(old) == plan


def test_a_version_1_plan_of_a_model_outside_the_catalog_is_named() -> None:
    from autoparallel.testing import plan_for_config

    old = _as_version_1(plan_for_config(ap.get_model("tiny-moe"), ParallelConfig(dp=2)))
    old["provenance"]["model_name"] = "my-model"
    with pytest.raises(
        PlanError, match=r"plan provenance.model_name \(my-model\): .* in the catalog"
    ):
        ap.load_plan(old)
    old["provenance"]["model_name"] = "tiny-moe"
    old["provenance"]["model_fingerprint"] = "beef"
    with pytest.raises(PlanError, match=r"plan provenance.model_fingerprint \(beef\): must equal"):
        ap.load_plan(old)
