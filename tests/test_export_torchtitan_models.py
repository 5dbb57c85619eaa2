"""torchtitan exports name the model torchtitan builds: the catalog model's own ``--config``
(0.3.0) or ``[model]`` flavor (0.2.x) where the engine has one of its shape, else its family's
with the mismatch reported (``Export.dropped``). The engines tier checks the shape the engine's
own parser builds (tests/test_export_engine_parsers.py)."""

from __future__ import annotations

import functools
import re

import pytest

import autoparallel as ap
from autoparallel.export import export_plan
from cost_model import Training
from search import engine_data


@functools.cache
def _plan(model: str, nodes: int) -> ap.ShardingPlan:
    cluster = ap.get_preset("dgx-h100", num_nodes=nodes)
    workload = Training(sequence_length_tokens=4096, global_batch_sequences=256)
    return ap.find_plan(model, cluster, workload, n_trials=12, seed=0)


def _config(files: dict[str, str]) -> str:
    return re.search(r"--config (\S+)", files["launch_torchtitan.sh"]).group(1)


def _toml_model(files: dict[str, str]) -> tuple[str, str]:
    toml = files["torchtitan.toml"]
    return (
        re.search(r'^name = "(.+)"$', toml, re.M).group(1),
        re.search(r'^flavor = "(.+)"$', toml, re.M).group(1),
    )


def _shape_drops(result) -> list[str]:
    return [line for line in result.dropped if line.startswith("model shape")]


def test_every_mapped_model_is_in_the_catalog() -> None:
    for table in ("torchtitan_configs", "torchtitan_toml_models"):
        names = [name for name in engine_data()[table] if not name.startswith("_")]
        names += [n for n in engine_data()[table].get("_flavors", {}) if not n.startswith("_")]
        assert names
        for name in names:
            assert ap.get_model(name).name == name


@pytest.mark.parametrize(
    "model,nodes,config,flavor",
    [
        ("qwen3-30b-a3b", 1, "qwen3_30b_a3b", ("qwen3", "30B-A3B")),
        ("llama-3.1-8b", 1, "llama3_8b", ("llama3", "8B")),
    ],
)
def test_a_model_torchtitan_has_is_exported_as_itself(model, nodes, config, flavor) -> None:
    plan = _plan(model, nodes)
    current = export_plan(plan, format="torchtitan")
    assert _config(current.files) == config
    assert not _shape_drops(current)
    toml = export_plan(plan, format="torchtitan", engine_version="0.2.2")
    assert _toml_model(toml.files) == flavor
    assert not _shape_drops(toml)


def test_a_flavor_without_a_config_names_the_flavor_to_register(training_plan) -> None:
    # Qwen3-235B-A22B: torchtitan 0.3.0 has its flavor, but no config_registry function
    current = export_plan(training_plan, format="torchtitan")
    assert _config(current.files) == "qwen3_30b_a3b"
    (drop,) = _shape_drops(current)
    assert "model_registry('235B-A22B')" in drop
    toml = export_plan(training_plan, format="torchtitan", engine_version="0.2.2")
    assert _toml_model(toml.files) == ("qwen3", "235B-A22B")
    assert not _shape_drops(toml)


def test_a_model_torchtitan_lacks_is_exported_with_its_family_and_reported() -> None:
    plan = _plan("mixtral-8x7b", 2)
    for version in ("0.3.0", "0.2.2"):
        result = export_plan(plan, format="torchtitan", engine_version=version)
        (drop,) = _shape_drops(result)
        assert "mixtral-8x7b" in drop
