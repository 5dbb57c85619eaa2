"""Clusters of accelerators: hardware specs, interconnect graph, presets with cited sources,
collective-time model, placement, and live probes (``topology.probe``, torch imported lazily)."""

from topology._cluster import COLLECTIVE_OPS, Cluster, LinkTier
from topology._hardware import HardwareSpec
from topology._presets import get_preset, list_presets

__all__ = ["COLLECTIVE_OPS", "Cluster", "HardwareSpec", "LinkTier", "get_preset", "list_presets"]
