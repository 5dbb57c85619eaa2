"""Model catalog: HuggingFace-style ``config.json`` files shipped in ``autoparallel/catalog/``.

Each file keeps a ``_source`` key citing where its numbers come from.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from cost_model import ModelSpec

DEFAULT_MODEL = "ref-3t-moe"


def list_models() -> list[str]:
    """Names of the catalog models."""
    folder = resources.files("autoparallel") / "catalog"
    return sorted(entry.name[: -len(".json")] for entry in folder.iterdir() if entry.name.endswith(".json"))


def catalog_config(name: str) -> dict:
    """The raw config dict of catalog model ``name``."""
    names = list_models()
    if name not in names:
        raise ValueError(f"model ({name!r}) is not in the catalog; valid names: {', '.join(names)}")
    return json.loads((resources.files("autoparallel") / "catalog" / f"{name}.json").read_text())


def get_model(name_or_path: str | Path) -> ModelSpec:
    """A catalog name (``ref-3t-moe``) or a path to a HuggingFace ``config.json`` / its folder."""
    text = str(name_or_path)
    if text in list_models():
        return ModelSpec.from_hf_config(catalog_config(text), name=text)
    path = Path(text)
    if path.exists():
        return ModelSpec.from_hf_config(path)
    raise ValueError(
        f"model ({text!r}) is neither a catalog name nor an existing config.json path; "
        f"catalog names: {', '.join(list_models())}"
    )
