"""Calibration of a device generation that no published run has calibrated (B200, GB200, GB300).

A shipped calibration is fitted on end-to-end runs of one generation; its efficiencies are that
generation's measured operator ceilings (``HardwareSpec.matmul_efficiency``: MAMF over peak)
times what the end-to-end runs lose beyond the kernels' best shapes (shapes, launch gaps,
framework overheads). Without runs of a new generation the second factor is carried over: the
preset names a calibrated ``calibration_reference`` device (Blackwell -> H100: same software
stack — Megatron-core, Transformer Engine, FlashAttention), and each efficiency becomes
``fitted_reference / ceiling_reference x ceiling_here``; the fixed costs (kernel overhead,
collective efficiency, overlap) carry over unchanged. This is an assumption, flagged in the
presets' sources, and checked on published Blackwell runs that nothing was fitted on
(``cost_model._blackwell_validation``).
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
