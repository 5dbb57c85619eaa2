"""Unit constants and dtype sizes. Everything inside the library is SI (bytes, seconds, FLOP)."""

from __future__ import annotations

from typing import Literal

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4
KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12

Dtype = Literal["fp32", "bf16", "fp16", "fp8", "fp4", "int8", "int4"]

DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    # NVFP4: 4-bit E2M1 values plus one E4M3 scale per 16-element block (NVIDIA, "Introducing
    # NVFP4 for efficient and accurate low-precision inference", developer blog, 2025).
    "fp4": 0.5 + 1.0 / 16.0,
    "int8": 1.0,
    "int4": 0.5,
}


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of ``dtype``; raises ``ValueError`` naming the valid dtypes."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"dtype ({dtype!r}) must be one of {sorted(DTYPE_BYTES)}") from None


def human_bytes(num_bytes: float) -> str:
    """Decimal units, as vendors quote memory: ``6.0 TB``."""
    for unit, scale in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(num_bytes) >= scale:
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{num_bytes:.0f} B"


def human_count(count: float) -> str:
    """``3.00 T``, ``56.3 B``, ``12.0 M``."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(count) >= scale:
            value = count / scale
            return f"{value:.2f} {unit}" if value < 10 else f"{value:.1f} {unit}"
    return f"{count:.0f}"


def human_seconds(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"
