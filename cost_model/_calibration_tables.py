"""The operator tables a calibration is fitted on: which files are read and which rows are kept.

Sources: NVIDIA's ``aiconfigurator-core`` 0.12.0 wheel (PyPI, Apache-2.0), per-operator tables
``systems/data/<device>/{gemm,attention,comm/nccl}/<engine>/<version>/*.parquet``; where several
engines measured a shape, the fastest (the kernel a tuned run uses). Its end-to-end tables
(``silicon_sample.csv``) are never opened: ``_read`` refuses them (fit on parts, validate on
wholes). Rows are kept in the range of shapes a training micro-batch runs (``TRAINING_RANGE``),
collectives of at least ``MIN_COLLECTIVE_BYTES`` within one node (nccl-tests "size" convention,
the table's ``message_size`` in elements of its dtype), and all-to-alls of at least
``ALL_TO_ALL_MIN_GPUS`` ranks for their own fit. ``_calibration_fits`` prices and fits them;
``_calibration_operators.calibrate_hardware`` records the result.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PACKAGE = "aiconfigurator-core 0.12.0 (PyPI, Apache-2.0)"
FORBIDDEN_FILE = "silicon_sample"


@dataclass(frozen=True)
class OperatorHardware:
    """One calibrated hardware type: its aiconfigurator folder, the preset that prices it and the
    regex of the device names the calibration applies to (first match wins: GB200 before B200)."""

    key: str
    folder: str
    preset: str
    device_pattern: str


HARDWARE: tuple[OperatorHardware, ...] = (
    OperatorHardware("A100", "a100_sxm", "dgx-a100", "A100"),
    # The H800 is the H100 SXM's export variant: same SMs, clocks and HBM3 (NVIDIA H800 datasheet).
    OperatorHardware("H100", "h100_sxm", "dgx-h100", "H100|H800"),
    OperatorHardware("H200", "h200_sxm", "dgx-h200", "H200"),
    OperatorHardware("GB300", "gb300", "gb300-nvl72", "GB300"),
    OperatorHardware("GB200", "gb200", "gb200-nvl72", "GB200"),
    OperatorHardware("B200", "b200_sxm", "dgx-b200", "NVIDIA B200"),
)
ENGINES = ("trtllm", "sglang", "vllm")
#: Shapes a training micro-batch runs: at least 1024 tokens (rows) and widths of at least 1024
#: (every published run's tokens per micro-batch and hidden / tp); attention over sequences of
#: at least 1024 tokens with 64-128-wide heads.
TRAINING_RANGE = {"gemm_min_rows": 1024, "gemm_min_width": 1024, "attention_min_sequence": 1024}
#: Collectives of at least this many bytes (the bandwidth regime that training traffic is in).
MIN_COLLECTIVE_BYTES = 1 << 20
#: All-to-alls of groups of at least this many ranks fit the all-to-all's own parameters.
ALL_TO_ALL_MIN_GPUS = 4
NCCL_OPS = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "alltoall": "all_to_all",
}
NCCL_DTYPE_BYTES = {"half": 2.0, "int8": 1.0}


def _read(path: Path) -> list[dict]:
    if FORBIDDEN_FILE in path.name:
        raise ValueError(
            f"file ({path.name}) holds end-to-end runs: validation data, never fit input"
        )
    from pyarrow import parquet  # type: ignore[import-untyped]

    return parquet.read_table(path).to_pylist()


def _version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else -1 for p in re.split(r"[.a-z]+", version) if p)


def _newest(folder: Path, name: str) -> Path | None:
    versions = sorted(
        (p for p in folder.glob("*") if (p / name).exists()), key=lambda p: _version_key(p.name)
    )
    return versions[-1] / name if versions else None


def _tables(root: Path, hardware: OperatorHardware, op: str, name: str) -> list[Path]:
    """The newest table of each engine for ``op`` (``comm/nccl``: the newest NCCL version)."""
    base = root / "systems" / "data" / hardware.folder
    if op == "nccl":
        found = _newest(base / "comm" / "nccl", name)
        return [found] if found else []
    return [p for p in (_newest(base / op / engine, name) for engine in ENGINES) if p]


def _relative(path: Path, root: Path) -> str:
    return str(path.relative_to(root))


@dataclass(frozen=True)
class OperatorRows:
    """Measured points of one operator class and the tables they came from."""

    kind: str  # gemm, attention, nccl
    columns: dict[str, np.ndarray]
    seconds: np.ndarray
    tables: tuple[str, ...]

    @property
    def count(self) -> int:
        return int(self.seconds.size)


def gemm_rows(root: Path, hardware: OperatorHardware, dtype: str = "bfloat16") -> OperatorRows:
    """GEMMs of the table's ``dtype`` (``bfloat16``, ``fp8``, ``fp8_block``) in
    ``TRAINING_RANGE``: the fastest engine's latency per (m, n, k)."""
    paths = _tables(root, hardware, "gemm", "gemm_perf.parquet")
    best: dict[tuple[int, int, int], float] = {}
    for path in paths:
        for row in _read(path):
            m, n, k = int(row["m"]), int(row["n"]), int(row["k"])
            if (
                row["gemm_dtype"] != dtype
                or m < TRAINING_RANGE["gemm_min_rows"]
                or min(n, k) < TRAINING_RANGE["gemm_min_width"]
            ):
                continue
            best[(m, n, k)] = min(best.get((m, n, k), math.inf), float(row["latency"]) * 1e-3)
    keys = sorted(best)
    shape = np.array(keys, dtype=np.float64).reshape(-1, 3)
    return OperatorRows(
        "gemm" if dtype == "bfloat16" else f"gemm_{dtype}",
        {"m": shape[:, 0], "n": shape[:, 1], "k": shape[:, 2]},
        np.array([best[key] for key in keys]),
        tuple(_relative(p, root) for p in paths),
    )


def attention_rows(root: Path, hardware: OperatorHardware) -> OperatorRows:
    """Causal bf16 prefill attention (no window) over sequences in ``TRAINING_RANGE``."""
    paths = _tables(root, hardware, "attention", "context_attention_perf.parquet")
    best: dict[tuple[int, ...], float] = {}
    for path in paths:
        for row in _read(path):
            if (
                row["attn_dtype"] != "bfloat16"
                or row["kv_cache_dtype"] != "bfloat16"
                or int(row.get("window_size", 0) or 0) != 0
                or int(row["isl"]) < TRAINING_RANGE["attention_min_sequence"]
                or int(row["head_dim"]) not in (64, 128)
            ):
                continue
            key = (
                int(row["batch_size"]),
                int(row["isl"]),
                int(row["num_heads"]),
                int(row["num_key_value_heads"]),
                int(row["head_dim"]),
            )
            best[key] = min(best.get(key, math.inf), float(row["latency"]) * 1e-3)
    keys = sorted(best)
    values = np.array(keys, dtype=np.float64).reshape(-1, 5)
    names = ("batch", "sequence", "heads", "kv_heads", "head_dim")
    return OperatorRows(
        "attention",
        {name: values[:, i] for i, name in enumerate(names)},
        np.array([best[key] for key in keys]),
        tuple(_relative(p, root) for p in paths),
    )


def nccl_rows(root: Path, hardware: OperatorHardware) -> OperatorRows:
    """NCCL collectives within one node, messages of at least ``MIN_COLLECTIVE_BYTES``."""
    paths = _tables(root, hardware, "nccl", "nccl_perf.parquet")
    ops, gpus, sizes, seconds = [], [], [], []
    for path in paths:
        for row in _read(path):
            nbytes = float(row["message_size"]) * NCCL_DTYPE_BYTES.get(row["nccl_dtype"], 0.0)
            if row["op_name"] not in NCCL_OPS or nbytes < MIN_COLLECTIVE_BYTES:
                continue
            ops.append(NCCL_OPS[row["op_name"]])
            gpus.append(float(row["num_gpus"]))
            sizes.append(nbytes)
            seconds.append(float(row["latency"]) * 1e-3)
    return OperatorRows(
        "nccl",
        {"op": np.array(ops), "gpus": np.array(gpus), "bytes": np.array(sizes)},
        np.array(seconds),
        tuple(_relative(p, root) for p in paths),
    )


def _subset(rows: OperatorRows, where: np.ndarray) -> OperatorRows:
    return OperatorRows(
        rows.kind,
        {name: values[where] for name, values in rows.columns.items()},
        rows.seconds[where],
        rows.tables,
    )


def collective_rows(nccl: OperatorRows) -> OperatorRows:
    """The all-reduce, all-gather and reduce-scatter rows (the all-to-all has its own fit)."""
    return _subset(nccl, nccl.columns["op"] != "all_to_all")


def all_to_all_rows(nccl: OperatorRows) -> OperatorRows:
    """The all-to-all rows of groups of at least ``ALL_TO_ALL_MIN_GPUS`` ranks."""
    c = nccl.columns
    return _subset(nccl, (c["op"] == "all_to_all") & (c["gpus"] >= ALL_TO_ALL_MIN_GPUS))
