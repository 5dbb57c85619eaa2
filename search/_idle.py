"""Which device counts a search tries: the whole cluster, or fewer whole nodes left idle.

A world size is legal only if some mesh divides it and the global batch splits over its data
parallel degree; 125 nodes of 8 devices (1000 = 2^3·5^3) leave dp a factor 5 that a
power-of-two batch lacks. Leaving whole nodes idle is then the only plan, and a world size with
small factors can also be faster than an awkward larger one. ``SearchSettings.idle_devices``:

* ``never`` — the whole cluster or nothing (the error names the blocker);
* ``when_needed`` (default) — when the whole cluster has no legal layout, search the largest
  smaller node count that has one and the largest power-of-two node count, keep the better;
* ``compare`` — also do that when the whole cluster is legal, and keep the best of the three.
"""

from __future__ import annotations

from dataclasses import dataclass

from search._space import SearchBounds, SearchSpace, empty_space_reason
from topology import Cluster


@dataclass(frozen=True)
class DeviceChoice:
    """A cluster to search (``cluster.with_nodes``) and why it leaves devices idle ('' if none)."""

    cluster: Cluster
    idle_reason: str


def device_choices(
    *, model, cluster: Cluster, workload, bounds: SearchBounds, mode: str
) -> list[DeviceChoice]:
    """The clusters to search, whole cluster first. Raises ``ValueError`` naming the blocker when
    none has a legal layout (or the whole cluster has none and ``mode`` is ``never``)."""
    full = _space(model=model, cluster=cluster, workload=workload, bounds=bounds)
    if full.num_meshes and mode != "compare":
        return [DeviceChoice(cluster=cluster, idle_reason="")]
    blocker = "" if full.num_meshes else empty_space_reason(full)
    if mode == "never" and blocker:
        raise ValueError(blocker)
    smaller = _smaller_node_counts(model=model, cluster=cluster, workload=workload, bounds=bounds)
    if not smaller and blocker:
        raise ValueError(f"{blocker}; no smaller whole-node count has a legal layout either")
    choices = [DeviceChoice(cluster=cluster, idle_reason="")] if full.num_meshes else []
    for nodes in smaller:
        idle = cluster.num_devices - nodes * cluster.devices_per_node
        why = blocker or f"compared with all {cluster.num_devices} devices"
        reason = f"{idle} of {cluster.num_devices} devices idle ({nodes} of {cluster.num_nodes} nodes used): {why}"
        choices.append(DeviceChoice(cluster=cluster.with_nodes(nodes), idle_reason=reason))
    return choices


def _smaller_node_counts(*, model, cluster: Cluster, workload, bounds: SearchBounds) -> list[int]:
    """The largest node count below the cluster's with a legal layout, and the largest power of
    two below it with one (the same count once)."""
    found: list[int] = []
    for nodes in range(cluster.num_nodes - 1, 0, -1):
        power_of_two = nodes & (nodes - 1) == 0
        if found and not power_of_two:
            continue  # the largest is known: only a power of two is still wanted
        if _space(
            model=model, cluster=cluster.with_nodes(nodes), workload=workload, bounds=bounds
        ).num_meshes:
            found.append(nodes)
            if power_of_two:
                break
    return found


def _space(*, model, cluster: Cluster, workload, bounds: SearchBounds) -> SearchSpace:
    return SearchSpace(
        model=model,
        workload=workload,
        world_size=cluster.num_devices,
        devices_per_node=cluster.devices_per_node,
        bounds=bounds,
    )
