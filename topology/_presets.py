"""Cluster presets shipped as JSON files in ``topology/presets/``, each value with its source."""

from __future__ import annotations

import json
from importlib import resources

from topology._cluster import Cluster


def list_presets() -> list[str]:
    """Names of the shipped presets."""
    folder = resources.files("topology") / "presets"
    return sorted(entry.name[: -len(".json")] for entry in folder.iterdir() if entry.name.endswith(".json"))


def get_preset(name: str, *, num_nodes: int | None = None) -> Cluster:
    """The preset ``name``, scaled to ``num_nodes`` nodes if given."""
    names = list_presets()
    if name not in names:
        raise ValueError(f"cluster preset ({name!r}) is unknown; valid presets: {', '.join(names)}")
    text = (resources.files("topology") / "presets" / f"{name}.json").read_text()
    cluster = Cluster.model_validate(json.loads(text))
    return cluster if num_nodes is None else cluster.with_nodes(num_nodes)
