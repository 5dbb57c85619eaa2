"""The planner names the real blocker of an empty space (the global batch's factors) and plans on
fewer whole nodes when the whole cluster has no legal layout, or when fewer are faster."""

from __future__ import annotations

import numpy as np
import optuna
import pytest

import autoparallel as ap
from autoparallel.cli import main
from cost_model import Training
from search import SearchSettings, SearchSpace, find_plan
from search._space import empty_space_reason, factorization

optuna.logging.set_verbosity(optuna.logging.WARNING)

# 125 nodes of 8 H200 = 1000 = 2^3·5^3 devices; a 16M-token batch of 4096-token sequences = 2^12.
WORKLOAD = Training(sequence_length_tokens=4096, global_batch_tokens=16 * 2**20)


@pytest.fixture(scope="module")
def model():
    return ap.get_model("ref-3t-moe")


def _space(model, nodes: int, workload=WORKLOAD) -> SearchSpace:
    return SearchSpace(model=model, workload=workload, world_size=8 * nodes, devices_per_node=8)


def test_factorization() -> None:
    assert factorization(1000) == "2^3·5^3"
    assert factorization(4096) == "2^12"
    assert factorization(992) == "2^5·31"
    assert factorization(1) == "1"


def test_empty_space_names_the_global_batch_factor(model) -> None:
    space = _space(model, 125)
    assert (
        space.num_meshes == 0 and space.rule_legal_dp
    )  # meshes pass the model's rules; the batch blocks
    reason = empty_space_reason(space)
    assert "1000 devices (2^3·5^3)" in reason and "4096 sequences (2^12)" in reason
    assert "factor 5 " in reason and "multiple of 20480 sequences" in reason
    # The suggestion is right: a batch of 20480 sequences opens the same 1000 devices.
    suggested = Training(sequence_length_tokens=4096, global_batch_sequences=20480)
    assert _space(model, 125, suggested).num_meshes > 0
    # ...and every mesh the rules allow leaves dp with a factor 5 (what the reason claims).
    assert all(dp % 5 == 0 for dp in space.rule_legal_dp)


def test_idle_devices_never_raises_the_blocker(model) -> None:
    cluster = ap.get_preset("dgx-h200", num_nodes=125)
    with pytest.raises(ValueError, match=r"global batch of 4096 sequences .* leaves dp a factor 5"):
        find_plan(
            model, cluster, WORKLOAD, n_trials=16, settings=SearchSettings(idle_devices="never")
        )


def test_when_needed_plans_on_the_largest_legal_node_count(model) -> None:
    cluster = ap.get_preset("dgx-h200", num_nodes=125)
    result = find_plan(
        model, cluster, WORKLOAD, n_trials=32, settings=SearchSettings(batch_size=16)
    )
    assert _space(model, 124).num_meshes  # 992 = 2^5·31 devices: pp 31 absorbs the odd factor
    assert _space(model, 64).num_meshes  # the largest power of two below
    used = result.settings["num_nodes_used"]
    assert used in (124, 64)
    config = result.best.config
    assert config.dp * config.tp * config.pp * config.cp == 8 * used
    assert result.settings["idle_reason"].startswith(
        f"{1000 - 8 * used} of 1000 devices idle ({used} of 125 nodes used)"
    )
    assert "factor 5" in result.settings["idle_reason"]


def test_the_faster_of_the_smaller_node_counts_is_kept(model) -> None:
    cluster = ap.get_preset("dgx-h200", num_nodes=125)
    settings = SearchSettings(batch_size=16)
    chosen = find_plan(model, cluster, WORKLOAD, n_trials=32, settings=settings)
    alone = {
        nodes: find_plan(
            model,
            cluster.with_nodes(nodes),
            WORKLOAD,
            n_trials=32,
            settings=settings.model_copy(update={"idle_devices": "never"}),
        )
        for nodes in (124, 64)
    }
    times = {nodes: r.best.metrics["step_time_s"] for nodes, r in alone.items() if r.feasible}
    assert times, "neither smaller node count fits"
    fastest = min(times, key=times.get)
    assert chosen.settings["num_nodes_used"] == fastest
    assert np.isclose(chosen.best.metrics["step_time_s"], times[fastest])


def test_compare_never_loses_to_the_whole_cluster() -> None:
    model, cluster = ap.get_model("qwen3-235b-a22b"), ap.get_preset("dgx-h100", num_nodes=6)
    workload = Training(sequence_length_tokens=4096, global_batch_sequences=256)
    settings = SearchSettings(batch_size=8)
    whole = find_plan(model, cluster, workload, n_trials=24, settings=settings)
    compared = find_plan(
        model,
        cluster,
        workload,
        n_trials=24,
        settings=settings.model_copy(update={"idle_devices": "compare"}),
    )
    assert whole.settings["num_nodes_used"] == 6 and whole.settings["idle_reason"] == ""
    assert compared.best.score(compared.objective) <= whole.best.score(whole.objective) + 1e-12
    if compared.settings["num_nodes_used"] != 6:
        assert "compared with all 48 devices" in compared.settings["idle_reason"]


def test_planner_writes_the_plan_on_the_devices_it_uses(model, tmp_path) -> None:
    output = tmp_path / "plan.json"
    code = main(
        [
            "plan",
            "--training",
            "--model",
            "ref-3t-moe",
            "--cluster",
            "dgx-h200",
            "--nodes",
            "125",
            "--trials",
            "32",
            "--output",
            str(output),
        ]
    )
    assert code == 0
    plan = ap.load_plan(output)
    used = plan.config.dp * plan.config.tp * plan.config.pp * plan.config.cp
    assert plan.world_size == used < 1000 and used % 8 == 0
    assert "devices idle" in plan.provenance.search.idle_reason


@pytest.mark.parametrize("workers", ["0", "-2"])
def test_workers_below_one_is_a_one_line_error(workers: str, capsys) -> None:
    assert main(["plan", "--workers", workers, "--output", "/nonexistent/plan.json"]) == 2
    err = capsys.readouterr()
    text = (err.err + err.out).strip()
    assert f"--workers: {workers} must be > 0" in text and len(text.splitlines()) == 1
