"""Clusters of accelerators: hardware specs, interconnect graph, presets with cited sources,
collective-time model, placement, and live probes (``topology.probe``, torch imported lazily)."""

from topology._cluster import COLLECTIVE_OPS, Cluster, DeviceLink, LinkTier
from topology._hardware import HardwareSpec
from topology._hardware_profile import (
    HardwareProfile,
    HostOverhead,
    MeasuredCurve,
    load_hardware_profile,
)
from topology._placement import AxisTraffic, axis_groups, mesh_comm_time, place_mesh
from topology._presets import get_preset, list_presets, network_override, value_status
from topology.probe_measure import ProbeRankError
from topology.probe_runner import ProbeHooks, ProbeReport, ProbeSettings, probe

__all__ = [
    "axis_groups",
    "AxisTraffic",
    "Cluster",
    "COLLECTIVE_OPS",
    "DeviceLink",
    "get_preset",
    "HardwareProfile",
    "HardwareSpec",
    "HostOverhead",
    "LinkTier",
    "list_presets",
    "load_hardware_profile",
    "MeasuredCurve",
    "mesh_comm_time",
    "network_override",
    "place_mesh",
    "probe",
    "ProbeHooks",
    "ProbeRankError",
    "ProbeReport",
    "ProbeSettings",
    "value_status",
]
