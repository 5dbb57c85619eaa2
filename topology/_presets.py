"""Cluster presets shipped as JSON files in ``topology/presets/``, each value with its source."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from importlib import resources

from topology._cluster import Cluster


def list_presets() -> list[str]:
    """Names of the shipped presets."""
    folder = resources.files("topology") / "presets"
    return sorted(
        entry.name[: -len(".json")] for entry in folder.iterdir() if entry.name.endswith(".json")
    )


#: Scale-out bandwidth every ``get_preset`` call applies inside ``network_override`` (None: the preset's).
_INTER_NODE_OVERRIDE: ContextVar[float | None] = ContextVar("inter_node_bytes_per_s", default=None)


def get_preset(
    name: str, *, num_nodes: int | None = None, inter_node_bytes_per_s: float | None = None
) -> Cluster:
    """The preset ``name``, scaled to ``num_nodes`` nodes if given, with its scale-out bandwidth per
    device and direction replaced by ``inter_node_bytes_per_s`` (or by an enclosing
    ``network_override``) if given."""
    names = list_presets()
    if name not in names:
        raise ValueError(f"cluster preset ({name!r}) is unknown; valid presets: {', '.join(names)}")
    text = (resources.files("topology") / "presets" / f"{name}.json").read_text()
    cluster = Cluster.model_validate(json.loads(text))
    cluster = cluster if num_nodes is None else cluster.with_nodes(num_nodes)
    override = (
        inter_node_bytes_per_s if inter_node_bytes_per_s is not None else _INTER_NODE_OVERRIDE.get()
    )
    return cluster if override is None else cluster.with_inter_node_bandwidth(override)


@contextmanager
def network_override(*, inter_node_bytes_per_s: float | None) -> Iterator[None]:
    """Within the block every ``get_preset`` gets this scale-out bandwidth (None: no override); for
    re-running whole tables (``autoparallel validate --inter-node-gbps``) on a slower fabric."""
    if inter_node_bytes_per_s is not None and not inter_node_bytes_per_s > 0:
        raise ValueError(f"inter_node_bytes_per_s ({inter_node_bytes_per_s}) must be > 0")
    token = _INTER_NODE_OVERRIDE.set(inter_node_bytes_per_s)
    try:
        yield
    finally:
        _INTER_NODE_OVERRIDE.reset(token)


def value_status(cluster: Cluster) -> dict[str, tuple[str, str]]:
    """Each sourced value of ``cluster`` -> (``sourced`` | ``uncertain`` | ``missing``, its source).

    A device field is uncertain when the spec lists it in ``uncertain``; a link tier or the
    cluster provenance when its source text says UNCERTAIN (no source for that exact SKU).
    """
    device = cluster.device

    def label(source: str, *, listed: bool = False) -> str:
        return (
            "uncertain" if listed or "UNCERTAIN" in source else "sourced" if source else "missing"
        )

    fields = (
        "peak_flops",
        "matmul_efficiency",
        "memory_bytes",
        "memory_bandwidth_bytes_per_s",
        *device.sources,
    )
    status: dict[str, tuple[str, str]] = {}
    for field in dict.fromkeys(fields):
        source = device.sources.get(field, "")
        status[f"device.{field}"] = (label(source, listed=field in device.uncertain), source)
    for name, source in (
        ("intra_node", cluster.intra_node.source),
        ("inter_node", cluster.inter_node.source),
        ("cluster", cluster.provenance),
    ):
        status[name] = (label(source), source)
    return status
