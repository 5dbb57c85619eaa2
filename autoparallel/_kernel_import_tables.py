"""The aiconfigurator-core operator tables the kernel import reads, and where they lie.

Source: NVIDIA's ``aiconfigurator-core`` package (PyPI, Apache-2.0), whose wheel ships
per-operator latency tables measured per device, engine and engine version under
``aiconfigurator_core/systems/data/<device>/<op>/<engine>/<version>/*.parquet``. Only operator
tables are read (``_read``): end-to-end tables of whole serving runs in the same package
(``silicon_sample.csv``) are refused, as validation data, not fit input (DESIGN.md, "Fidelity").
``_latest_tables`` lists one table's versions, newest first; each reader
(``autoparallel._kernel_import``) takes the newest that covers its grid. Reading needs
``pyarrow`` (``pip install pyarrow``).
"""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = "aiconfigurator-core"
#: aiconfigurator device folder -> the preset whose peaks price the ideal time.
DEVICES = {
    "h100_sxm": "dgx-h100",
    "h200_sxm": "dgx-h200",
    "b200_sxm": "dgx-b200",
    "gb200": "gb200-nvl72",
}
#: aiconfigurator dtype names -> the project's weight dtypes (block-scaled FP8 is DeepSeek's).
#: FP4 weights are NVFP4 (W4A4 on Blackwell) or MXFP4 (gpt-oss's experts): MXFP4 with bf16
#: activations (``w4a16_mxfp4``, the Hopper and Blackwell W4A16 kernels) or MXFP8 ones
#: (``w4a8_mxfp4_mxfp8``, Blackwell); of several fp4 kernels for one shape the fastest is kept.
DTYPES = {
    "bfloat16": "bf16",
    "fp8_block": "fp8",
    "nvfp4": "fp4",
    "w4a16_mxfp4": "fp4",
    "w4a8_mxfp4_mxfp8": "fp4",
    "int4_wo": "int4",
}
ENGINES = ("trtllm", "sglang", "vllm")
FORBIDDEN_FILE = "silicon_sample"


def _read(path: Path) -> list[dict]:
    if FORBIDDEN_FILE in path.name:
        raise ValueError(
            f"file ({path.name}) holds end-to-end runs: validation data, never a fit input"
        )
    try:
        from pyarrow import parquet
    except ImportError:
        raise ImportError(
            "importing aiconfigurator tables needs pyarrow: pip install pyarrow"
        ) from None
    return parquet.read_table(path).to_pylist()


def _version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else -1 for p in re.split(r"[.a-z]+", version) if p)


def _latest_tables(root: Path, device: str, op: str, engine: str, name: str) -> list[Path]:
    folder = root / "systems" / "data" / device / op / engine
    versions = sorted(
        (p for p in folder.glob("*") if (p / name).exists()),
        key=lambda p: _version_key(p.name),
    )
    return [v / name for v in reversed(versions)]


def measured_by(device_name: str, engine: str, path: Path) -> dict[str, str]:
    """The first fields of a curve: the device, and the engine and version whose table (at
    ``path``, ``<engine>/<version>/<name>``) measured it."""
    return {"device": device_name, "engine": engine, "engine_version": path.parent.name}
