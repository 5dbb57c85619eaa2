"""Calibration of a device that has no operator tables of its own.

Every shipped calibration is fitted on one device's operator tables
(``cost_model._calibration_operators``): its efficiencies are what that device's kernels reach
relative to its peaks. A device without tables (a custom cluster file, a new generation) may name
a calibrated ``calibration_reference`` preset with the same software stack; each efficiency then
becomes ``fitted_reference / ceiling_reference x ceiling_here`` (the ceilings are the presets'
``matmul_efficiency``, MAMF over peak), and the fixed costs (kernel overhead, collective
efficiency, overlap) carry over unchanged. This is an assumption: a device's own operator tables
always take precedence (a shipped entry matching the device name wins over the transfer).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from topology import get_preset

__all__ = ["transferred_calibration"]


def transferred_calibration(hardware, calibrations: Sequence[Any]):
    """The reference calibration carried over to ``hardware`` (see the module docstring), or None
    when the device names no ``calibration_reference`` preset or no shipped calibration matches
    that preset's device."""
    reference = getattr(hardware, "calibration_reference", None)
    if not reference:
        return None
    source = get_preset(reference).device
    matched = next((c for c in calibrations if re.search(c.device_pattern, source.name)), None)
    if matched is None:
        return None
    matmul_ratio = hardware.matmul_efficiency / source.matmul_efficiency
    memory_ratio = hardware.memory_bandwidth_efficiency / source.memory_bandwidth_efficiency

    def carried(value: float | None, ratio: float) -> float | None:
        return None if value is None else min(1.0, value * ratio)

    fit = {
        "transferred_from": matched.device_pattern,
        "preset": reference,
        "matmul_ceiling_ratio": round(matmul_ratio, 4),
    }
    return matched.model_copy(
        update={
            "device_pattern": re.escape(hardware.name),
            "matmul_efficiency": carried(matched.matmul_efficiency, matmul_ratio),
            "attention_efficiency": carried(matched.attention_efficiency, matmul_ratio),
            "memory_bandwidth_efficiency": carried(
                matched.memory_bandwidth_efficiency, memory_ratio
            ),
            "fit": fit,
        }
    )
