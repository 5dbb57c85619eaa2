"""Quantities written with units in cluster files: ``"450 GB/s"``, ``"400 Gb/s"``, ``"5 us"``, ``"80 GB"``.

Inside the library everything is SI (bytes, seconds, FLOP/s). A cluster file may give a number
(already SI) or a string with an explicit unit; the unit is converted once, at parse time. A unit
of the wrong kind or a misspelled one is a ``ValueError`` that lists the accepted units.
Decimal prefixes follow vendor datasheets (1 GB = 1e9 B); ``Gb/s`` is bits per second
(network line rates: 400 Gb/s = 50e9 bytes/s); binary prefixes are spelled ``KiB``/``MiB``/``GiB``.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator

_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}

_BYTES = (
    {f"{p}B": s for p, s in _PREFIX.items()}
    | {f"{p}B": s for p, s in _BINARY.items()}
    | {"bytes": 1.0}
)
_BANDWIDTH = (
    {f"{unit}/s": scale for unit, scale in _BYTES.items()}
    | {f"{p}b/s": s / 8.0 for p, s in _PREFIX.items()}
    | {f"{p}bit/s": s / 8.0 for p, s in _PREFIX.items()}
)
_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_FLOPS = {f"{p}FLOP/s": s for p, s in _PREFIX.items()} | {
    f"{p}FLOPS": s for p, s in _PREFIX.items()
}

UNITS: dict[str, dict[str, float]] = {
    "bytes": _BYTES,
    "bytes_per_s": _BANDWIDTH,
    "seconds": _SECONDS,
    "flops": _FLOPS,
}

_QUANTITY = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([^\s\d].*?)?\s*$")


def parse_quantity(value: object, *, kind: str) -> float:
    """``value`` in SI units: numbers pass through, strings ``"<number> <unit>"`` are converted.

    Raises ``ValueError`` for a string without a unit, or with a unit that is not a ``kind``
    unit (the message lists the accepted ones).
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a number or a '<number> <unit>' string, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str):
        return value  # type: ignore[return-value]  # let pydantic report the type error
    match = _QUANTITY.match(value)
    if match is None:
        raise ValueError(f"{value!r} is not '<number> <unit>' (units: {', '.join(UNITS[kind])})")
    number, unit = float(match.group(1)), match.group(2)
    if unit is None:
        raise ValueError(
            f"{value!r} has no unit; write a plain number for SI {kind} or one of: {', '.join(UNITS[kind])}"
        )
    try:
        return number * UNITS[kind][unit]
    except KeyError:
        raise ValueError(
            f"unit {unit!r} in {value!r} is not a {kind} unit; accepted: {', '.join(UNITS[kind])}"
        ) from None


def _parser(kind: str):
    return BeforeValidator(lambda value: parse_quantity(value, kind=kind))


Bytes = Annotated[float, _parser("bytes")]
BytesPerSecond = Annotated[float, _parser("bytes_per_s")]
Seconds = Annotated[float, _parser("seconds")]
FlopsPerSecond = Annotated[float, _parser("flops")]
