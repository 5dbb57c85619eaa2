"""Every catalog model reads the same from its config.json as transformers saves it.

A model's own folder holds the config.json its release shipped, or one transformers wrote
(``save_pretrained`` of a fine-tune): transformers 5 renames fields on saving (its configs'
``attribute_map``: Qwen3-MoE's ``num_experts`` as ``num_local_experts``; Nemotron-H's
``hybrid_override_pattern`` as a ``layers_block_type`` list of its own kind names; ``dtype`` for
``torch_dtype``). Each catalog config transformers knows is loaded into its config class,
saved, and read back: the model and its checkpoint dtype must come out unchanged.
"""

from __future__ import annotations

import json
import warnings

import pytest
import transformers
from transformers import CONFIG_MAPPING

import autoparallel as ap
from autoparallel._catalog import catalog_config
from cost_model import checkpoint_dtype

KNOWN = [
    name for name in ap.list_models() if catalog_config(name).get("model_type") in CONFIG_MAPPING
]


def test_most_of_the_catalog_is_known_to_transformers() -> None:
    assert len(KNOWN) >= 30 and "nemotron-3-nano-30b-a3b" in KNOWN and "qwen3-30b-a3b" in KNOWN


@pytest.mark.parametrize("name", KNOWN)
def test_a_config_transformers_saved_reads_as_the_released_one(name: str, tmp_path) -> None:
    released = catalog_config(name)
    fields = {k: v for k, v in released.items() if not k.startswith("_") and k != "model_type"}
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        CONFIG_MAPPING[released["model_type"]](**fields).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    expected = ap.get_model(name).model_dump(exclude={"name"})
    assert ap.get_model(tmp_path).model_dump(exclude={"name"}) == expected
    assert checkpoint_dtype(saved) == checkpoint_dtype(released)
