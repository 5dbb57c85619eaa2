"""Measuring with torch: operator efficiency curves, collective curves, step/memory/expert-load
profiles of a running model. torch is imported by the submodules, not here: the profile
helpers (``cluster_from_profile``, ``fit_link``, ``load_profile``) stay torch-free.

The workflow on a machine at hand::

    autoparallel profile --nproc 2 -o profile.json          # launch_profile -> HardwareProfile
    autoparallel stage-check --profile profile.json          # run_stages: op, layer, device, plans

In Python: ``launch_profile(grid=ProfileGrid.preset("cpu"), num_processes=2)`` measures;
``cluster_from_profile(profile, num_devices=n)`` (or ``spec.with_profile(profile)`` on a preset)
makes ``cost_model.estimate`` interpolate the measured curves; ``StepProfiler`` times the steps
of a model under ``autoparallel.apply_plan`` (phases, communication wait, peak memory, expert
load); ``cost_model.calibrate`` fits global efficiencies to the measurements.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from profilers._cluster import cluster_from_profile, fit_link
from topology import HardwareProfile, MeasuredCurve
from topology import load_hardware_profile as load_profile

_LAZY = {
    "MasterWeightAdam": "profilers._training_run",
    "ProfileGrid": "profilers._ops",
    "StageResult": "profilers._stages",
    "StagedReport": "profilers._stages",
    "TrainingSetup": "profilers._training_run",
    "measure_training": "profilers._training_run",
    "run_stages": "profilers._stages",
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
    "MasterWeightAdam",
    "MeasuredCurve",
    "ProfileGrid",
    "StageResult",
    "StagedReport",
    "StepProfiler",
    "StepReport",
    "Timing",
    "TrainingSetup",
    "cluster_from_profile",
    "current_device",
    "fit_link",
    "launch_profile",
    "live_tensor_bytes",
    "load_profile",
    "measure",
    "measure_training",
    "profile_hardware",
    "run_stages",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'profilers' has no attribute {name!r}")
