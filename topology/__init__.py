"""Clusters of accelerators: hardware specs, interconnect graph, presets with cited sources,
collective-time model, placement, and live probes (``topology.probe``, torch imported lazily)."""

from topology._cluster import COLLECTIVE_OPS, Cluster, LinkTier
from topology._hardware import HardwareSpec
from topology._hardware_profile import HardwareProfile, MeasuredCurve, load_hardware_profile
from topology._presets import get_preset, list_presets

__all__ = ["COLLECTIVE_OPS", "Cluster", "HardwareProfile", "HardwareSpec", "LinkTier", "MeasuredCurve", "get_preset", "list_presets", "load_hardware_profile"]
