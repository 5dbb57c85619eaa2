"""Torch-free helpers that turn a measured ``HardwareProfile`` into a ``Cluster``.

The link tier is an alpha-beta fit of the measured all-reduce (ring: 2(n-1) steps of latency,
2(n-1)/n of the buffer over the bus bandwidth; Patarasuk & Yuan, JPDC 2009; nccl-tests
``doc/PERFORMANCE.md``), by least squares on relative error so that small and large messages
weigh alike. Collectives measured in the profile are priced from their curves directly where
the topology supports it; the fitted tier covers the rest.
"""

from __future__ import annotations

import numpy as np

from topology import Cluster, HardwareProfile, HardwareSpec, LinkTier

_STEPS = {
    "all_reduce": lambda n: 2.0 * (n - 1.0),
    "all_gather": lambda n: n - 1.0,
    "reduce_scatter": lambda n: n - 1.0,
    "all_to_all": lambda n: n - 1.0,
    "broadcast": lambda n: np.log2(max(n, 2.0)),
    "send_recv": lambda n: 1.0,
}
_BUS = {
    "all_reduce": lambda n: 2.0 * (n - 1.0) / n,
    "all_gather": lambda n: (n - 1.0) / n,
    "reduce_scatter": lambda n: (n - 1.0) / n,
    "all_to_all": lambda n: (n - 1.0) / n,
    "broadcast": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}


def fit_link(
    profile: HardwareProfile, *, ops: tuple[str, ...] = ("all_reduce",)
) -> tuple[float, float, float]:
    """(latency_s, bandwidth_bytes_per_s, rms relative error) of the alpha-beta model that best
    fits the measured ``ops`` of ``profile``. Raises ``ValueError`` if none was measured."""
    rows, targets = [], []
    for op in ops:
        for size, curve in profile.collectives.get(op, {}).items():
            for nbytes, seconds in zip(curve.work, curve.seconds):
                rows.append(
                    [_STEPS[op](float(size)) / seconds, _BUS[op](float(size)) * nbytes / seconds]
                )
                targets.append(1.0)
    if not rows:
        raise ValueError(
            f"collectives has no measured op among {list(ops)}; measured: {sorted(profile.collectives)}"
        )
    matrix, target = np.asarray(rows), np.asarray(targets)
    solution, *_ = np.linalg.lstsq(matrix, target, rcond=None)
    latency, inverse_bandwidth = (float(v) for v in solution)
    if (
        latency < 0 or inverse_bandwidth <= 0
    ):  # a degenerate fit: keep the physically meaningful term
        latency = max(latency, 0.0)
        column = matrix[:, 1]
        inverse_bandwidth = float(column @ (target - matrix[:, 0] * latency) / (column @ column))
        inverse_bandwidth = max(inverse_bandwidth, 1e-15)
    predicted = matrix @ np.asarray([latency, inverse_bandwidth])
    error = float(np.sqrt(np.mean((predicted - target) ** 2)))
    return latency, 1.0 / inverse_bandwidth, error


def cluster_from_profile(
    profile: HardwareProfile,
    *,
    num_devices: int,
    name: str | None = None,
    device: HardwareSpec | None = None,
) -> Cluster:
    """A one-node cluster of ``num_devices`` profiled devices linked as measured.

    ``device`` defaults to ``HardwareSpec.from_profile(profile)`` (peaks = best measured rates);
    pass a preset's spec ``with_profile`` to keep the datasheet peaks.
    """
    if num_devices < 1:
        raise ValueError(f"num_devices ({num_devices}) must be >= 1")
    spec = device or HardwareSpec.from_profile(profile)
    if profile.collectives:
        latency, bandwidth, error = fit_link(profile)
        source = f"measured: alpha-beta fit of all_reduce (rms relative error {error:.0%}), {profile.provenance}"
    else:
        latency, bandwidth, source = (
            0.0,
            spec.memory_bandwidth_bytes_per_s,
            "measured: no collectives; memory bandwidth",
        )
    link = LinkTier(
        kind="loopback" if profile.device_type == "cpu" else "measured",
        bandwidth_bytes_per_s=bandwidth,
        latency_s=latency,
        efficiency=1.0,
        source=source,
    )
    return Cluster(
        name=name or f"profiled-{profile.device_type}x{num_devices}",
        device=spec,
        num_nodes=1,
        devices_per_node=num_devices,
        intra_node=link,
        inter_node=link,
        network_topology="single_node",
        provenance=profile.provenance,
    )
