"""Model catalog: HuggingFace-style ``config.json`` files shipped in ``autoparallel/catalog/``.

Each file keeps a ``_source`` key citing where its numbers come from.
"""

from __future__ import annotations

import difflib
import json
from importlib import resources
from pathlib import Path

from cost_model import ModelSpec
from cost_model import checkpoint_dtype as parse_checkpoint_dtype
from cost_model import checkpoint_dtype_by_part as parse_checkpoint_dtype_by_part
from cost_model import checkpoint_fp8_scaling as parse_checkpoint_fp8_scaling

DEFAULT_MODEL = "ref-3t-moe"


def list_models() -> list[str]:
    """Names of the catalog models."""
    folder = resources.files("autoparallel") / "catalog"
    return sorted(
        entry.name[: -len(".json")] for entry in folder.iterdir() if entry.name.endswith(".json")
    )


def _suggestion(name: str, names: list[str]) -> str:
    """The "did you mean" clause naming the catalog names closest to ``name`` (spelling,
    separators and case aside), or an empty string where none is close."""

    def key(text: str) -> str:
        return "".join(ch for ch in text.lower() if ch.isalnum())

    keyed = {key(candidate): candidate for candidate in names}
    close = (
        [key(name)]
        if key(name) in keyed
        else difflib.get_close_matches(key(name), list(keyed), n=3, cutoff=0.75)
    )
    if not close:
        return ""
    return " did you mean " + " or ".join(repr(keyed[match]) for match in close) + "?"


def catalog_config(name: str) -> dict:
    """The raw config dict of catalog model ``name``."""
    names = list_models()
    if name not in names:
        raise ValueError(
            f"model ({name!r}) is not in the catalog;{_suggestion(name, names)} "
            f"valid names: {', '.join(names)}"
        )
    return json.loads((resources.files("autoparallel") / "catalog" / f"{name}.json").read_text())


def get_model(name_or_path: str | Path) -> ModelSpec:
    """A catalog name (``ref-3t-moe``) or a path to a HuggingFace ``config.json`` / its folder."""
    text = str(name_or_path)
    if text in list_models():
        return ModelSpec.from_hf_config(catalog_config(text), name=text)
    path = Path(text)
    if path.exists():
        return ModelSpec.from_hf_config(path)
    names = list_models()
    raise ValueError(
        f"model ({text!r}) is neither a catalog name nor an existing config.json path;"
        f"{_suggestion(text, names)} catalog names: {', '.join(names)}"
    )


def _config(name_or_path: str | Path) -> dict | None:
    """The config dict of a catalog name or a ``config.json`` path (or its folder); None else."""
    text = str(name_or_path)
    if text in list_models():
        return catalog_config(text)
    path = Path(text)
    if path.is_dir():
        path = path / "config.json"
    return json.loads(path.read_text()) if path.is_file() else None


def checkpoint_dtype_by_part(name_or_path: str | Path) -> dict[str, str]:
    """The parts model ``name_or_path``'s released checkpoint keeps in another dtype than
    ``checkpoint_dtype`` (``cost_model._serving_precision.checkpoint_dtype_by_part``); {} for a
    ``ModelSpec`` built elsewhere."""
    config = _config(name_or_path)
    return {} if config is None else parse_checkpoint_dtype_by_part(config, get_model(name_or_path))


def checkpoint_fp8_scaling(name_or_path: str | Path) -> str | None:
    """How model ``name_or_path``'s released FP8 checkpoint scales its weights (``"block"`` or
    ``"tensor"``: ``cost_model._serving_precision.checkpoint_fp8_scaling``); None where its
    config states neither or there is no config."""
    config = _config(name_or_path)
    return None if config is None else parse_checkpoint_fp8_scaling(config)


def checkpoint_dtype(name_or_path: str | Path) -> str:
    """The weight dtype model ``name_or_path``'s released checkpoint is in (the serving default):
    a catalog entry's ``quantization_config`` / ``_checkpoint_dtype`` (``cost_model._serving_precision``),
    or a ``config.json``'s own; ``bf16`` for a ``ModelSpec`` built elsewhere."""
    text = str(name_or_path)
    if text in list_models():
        return parse_checkpoint_dtype(catalog_config(text))
    path = Path(text)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return parse_checkpoint_dtype(json.loads(path.read_text()))
    return "bf16"
