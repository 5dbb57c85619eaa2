"""Which device counts a search tries: the whole cluster, or fewer whole nodes (or hosts) idle.

A world size is legal only if some mesh divides it and the global batch splits over its data
parallel degree; 125 nodes of 8 devices (1000 = 2^3·5^3) leave dp a factor 5 that a
power-of-two batch lacks. Leaving whole nodes idle is then the only plan, and a world size with
small factors can also be faster than an awkward larger one. ``SearchSettings.idle_devices``:

* ``never`` — the whole cluster or nothing (the error names the blocker);
* ``when_needed`` (default) — when the whole cluster has no legal layout, search the largest
  smaller node count that has one and the largest power-of-two node count, keep the better;
* ``compare`` — also do that when the whole cluster is legal, and keep the best of the three.

Where a node spans several hosts (a rack-scale NVLink domain, ``Cluster.devices_per_host``),
whole hosts of each node may idle too: a GB200 NVL72 rack's 72 GPUs give dp a factor 9 that a
power-of-two batch lacks, and its published training runs use 64 of them.
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
    smaller = _smaller_clusters(model=model, cluster=cluster, workload=workload, bounds=bounds)
    if not smaller and blocker:
        raise ValueError(f"{blocker}; no smaller whole-node count has a legal layout either")
    choices = [DeviceChoice(cluster=cluster, idle_reason="")] if full.num_meshes else []
    for sized in smaller:
        idle = cluster.num_devices - sized.num_devices
        why = blocker or f"compared with all {cluster.num_devices} devices"
        reason = f"{idle} of {cluster.num_devices} devices idle ({_used(cluster, sized)}): {why}"
        choices.append(DeviceChoice(cluster=sized, idle_reason=reason))
    return choices


def _used(cluster: Cluster, sized: Cluster) -> str:
    """What of ``cluster`` a smaller ``sized`` one uses, in words."""
    used = f"{sized.num_nodes} of {cluster.num_nodes} nodes used"
    if sized.devices_per_node == cluster.devices_per_node:
        return used
    hosts = cluster.devices_per_node // cluster.host_devices
    return (
        f"{used}, {sized.devices_per_node // cluster.host_devices} of the {hosts} hosts "
        f"of {cluster.host_devices} devices in each"
    )


def _smaller_clusters(*, model, cluster: Cluster, workload, bounds: SearchBounds) -> list[Cluster]:
    """The largest device count below the cluster's with a legal layout, and the largest with a
    power-of-two number of hosts below it with one (the same count once): whole nodes, or,
    where a node spans several hosts (``Cluster.devices_per_host``: a rack-scale NVLink domain),
    as many nodes using the same number of whole hosts each (64 of a GB200 NVL72 rack's 72
    GPUs). Of equal device counts, the one on fewer nodes."""
    host = cluster.host_devices
    shapes = sorted(
        (
            (nodes * per_node, -nodes, nodes, per_node)
            for nodes in range(1, cluster.num_nodes + 1)
            for per_node in range(host, cluster.devices_per_node + 1, host)
            if nodes * per_node < cluster.num_devices
        ),
        reverse=True,
    )
    found: list[Cluster] = []
    for devices, _, nodes, per_node in shapes:
        hosts = devices // host
        power_of_two = hosts & (hosts - 1) == 0
        if found and (not power_of_two or devices == found[-1].num_devices):
            continue  # the largest is known: only a power of two is still wanted
        sized = cluster.with_nodes(nodes).with_devices_per_node(per_node)
        if _space(model=model, cluster=sized, workload=workload, bounds=bounds).num_meshes:
            found.append(sized)
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
