"""Version-1 plan documents -> version 2.

Version 1 kept the job and the search in untyped dicts (``provenance.workload``,
``provenance.search``, which also held devices per node and the deployment verdict), named the
model only by name and fingerprint, and listed disaggregated pools as ``disaggregation`` without
their serving settings. The upgrade moves each fact to its typed field: the model from the
catalog (its fingerprint must match), devices per node from the search record or the cluster
preset, pools as ``deployment.pools`` with the batch their price resolved.
"""

from __future__ import annotations

from typing import Any

from autoparallel.plan._validate import PlanError

__all__ = ["upgrade_v1"]

_SEARCH_FIELDS = (
    "method",
    "objective",
    "space_size",
    "num_meshes",
    "num_trials",
    "rows_evaluated",
    "infeasible_trials",
    "infeasible_layouts",
    "elapsed_s",
    "study_name",
    "storage",
    "seed",
    "batch_size",
    "polish_fraction",
)
_V1_KEYS = (
    "schema_version",
    "provenance",
    "world_size",
    "config",
    "mesh_axes",
    "moe_mesh_axes",
    "rank_to_device",
    "stages",
    "expert_placement",
    "module_rules",
    "predicted",
    "alternatives",
    "disaggregation",
    "serving",
)


def upgrade_v1(document: dict[str, Any]) -> dict[str, Any]:
    """The version-2 document of a version-1 ``document`` (validated by the caller)."""
    unknown = sorted(set(document) - set(_V1_KEYS))
    if unknown:
        raise PlanError(
            field=unknown[0],
            value="(version 1)",
            rule=f"unknown key in a version-1 plan; valid keys: {', '.join(_V1_KEYS)}",
        )
    provenance = _mapping(document, "provenance")
    search = dict(provenance.get("search") or {})
    model = _catalog_model(provenance)
    upgraded = {
        key: value
        for key, value in document.items()
        if key not in ("provenance", "disaggregation")
    }
    upgraded.update(
        schema_version=2,
        provenance=_provenance(provenance, search),
        model=model.model_dump(mode="json"),
        job=provenance.get("workload"),
        devices_per_node=_devices_per_node(provenance, search),
        deployment=_deployment(document, search),
    )
    return upgraded


def _mapping(document: dict[str, Any], key: str) -> dict[str, Any]:
    value = document.get(key)
    if not isinstance(value, dict):
        raise PlanError(
            field=key,
            value=type(value).__name__,
            rule="must be an object in a version-1 plan",
        )
    return value


def _provenance(provenance: dict[str, Any], search: dict[str, Any]) -> dict[str, Any]:
    kept = {k: v for k, v in provenance.items() if k not in ("workload", "search")}
    record = {k: search[k] for k in _SEARCH_FIELDS if k in search}
    kept["search"] = record if "method" in record else None
    return kept


def _catalog_model(provenance: dict[str, Any]):
    from autoparallel._catalog import get_model

    name = provenance.get("model_name")
    try:
        model = get_model(str(name))
    except ValueError:
        raise PlanError(
            field="provenance.model_name",
            value=name,
            rule="a version-1 plan names its model; it must be in the catalog to upgrade (re-plan otherwise)",
        ) from None
    if provenance.get("model_fingerprint") != model.fingerprint():
        raise PlanError(
            field="provenance.model_fingerprint",
            value=provenance.get("model_fingerprint"),
            rule=f"must equal the catalog's {name!r} ({model.fingerprint()}) to upgrade a version-1 plan",
        )
    return model


def _devices_per_node(provenance: dict[str, Any], search: dict[str, Any]) -> int:
    if "devices_per_node" in search:
        return int(search["devices_per_node"])
    from topology import get_preset

    name = str(provenance.get("cluster_name", "")).split("@")[0]
    try:
        return get_preset(name).devices_per_node
    except ValueError:
        raise PlanError(
            field="provenance.cluster_name",
            value=name,
            rule="a version-1 plan without search.devices_per_node must name a cluster preset",
        ) from None


def _deployment(document: dict[str, Any], search: dict[str, Any]) -> dict[str, Any]:
    pools = [_pool(pool, document) for pool in document.get("disaggregation") or ()]
    deployment: dict[str, Any] = {
        "kind": search.get("deployment", "colocated"),
        "pools": pools,
    }
    for key in (
        "colocated_output_tokens_per_s_per_device",
        "disaggregated_output_tokens_per_s_per_device",
    ):
        if key in search:
            deployment[key] = search[key]
    if "disaggregated_bottleneck" in search:
        deployment["bottleneck"] = search["disaggregated_bottleneck"]
    if isinstance(search.get("disaggregation"), str):
        deployment["note"] = search["disaggregation"]
    return deployment


def _pool(pool: dict[str, Any], document: dict[str, Any]) -> dict[str, Any]:
    """A v1 ``PhasePlan``: its unit is one copy of its config; the batch is its price's."""
    config = pool.get("config") or {}
    unit = 1
    for axis in ("dp", "tp", "pp", "cp"):
        unit *= int(config.get(axis, 1))
    devices = int(pool.get("num_devices", 0))
    if unit < 1 or devices % unit:
        raise PlanError(
            field="disaggregation.num_devices",
            value=devices,
            rule=f"must be a multiple of the pool's unit ({unit} devices)",
        )
    predicted = pool.get("predicted") or {}
    colocated = document.get("serving") or {}
    serving = {
        "batch_size": int(
            predicted.get("batch_size") or colocated.get("batch_size") or 1
        )
    }
    if (
        "kv_dtype" in colocated
    ):  # the same job's KV cache; the pool's other settings were not recorded
        serving["kv_dtype"] = colocated["kv_dtype"]
    return {
        "role": pool.get("phase"),
        "num_units": devices // unit,
        "devices_per_unit": unit,
        "config": config,
        "serving": serving,
        "predicted": pool.get("predicted"),
    }
