"""Measuring with torch: operator efficiency curves, collective curves, step/memory/expert-load
profiles of a running model. torch is imported by the submodules, not here: the profile
helpers (``cluster_from_profile``, ``fit_link``, ``load_profile``) stay torch-free."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from profilers._cluster import cluster_from_profile, fit_link
from topology import HardwareProfile, MeasuredCurve
from topology import load_hardware_profile as load_profile

_LAZY = {
    "ProfileGrid": "profilers._ops",
    "StepProfiler": "profilers._step",
    "StepReport": "profilers._step",
    "Timing": "profilers._timing",
    "current_device": "profilers._timing",
    "launch_profile": "profilers._launch",
    "live_tensor_bytes": "profilers._step",
    "measure": "profilers._timing",
    "profile_hardware": "profilers._hardware",
}

__all__ = [
    "HardwareProfile",
    "MeasuredCurve",
    "ProfileGrid",
    "StepProfiler",
    "StepReport",
    "Timing",
    "cluster_from_profile",
    "current_device",
    "fit_link",
    "launch_profile",
    "live_tensor_bytes",
    "load_profile",
    "measure",
    "profile_hardware",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'profilers' has no attribute {name!r}")
