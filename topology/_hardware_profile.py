"""``HardwareProfile``: measured efficiency curves of one device type, as written by ``profilers``.

A curve is raw measurement — the work per call (FLOPs, or bytes for memory-bound kernels and
collectives), the median seconds and the relative spread of repeats — so every derived figure
(achieved rate, efficiency against a spec's peak) is recomputed from data and never drifts.
Interpolation is linear in log(work) on the achieved rate, clamped above the largest point;
below the smallest point the time is held at the smallest point's time (a fixed per-call
floor: launch and dispatch overhead dominate tiny kernels). Torch-free: the cost model reads
profiles on machines without torch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

PROFILE_SCHEMA_VERSION: Literal[1] = 1
_STRICT = ConfigDict(extra="forbid", frozen=True)


class MeasuredCurve(BaseModel):
    """Median seconds of one operator at increasing work per call, with provenance."""

    model_config = _STRICT

    work: tuple[float, ...] = Field(
        description="FLOPs (compute curves) or bytes (memory, collectives) per call"
    )
    seconds: tuple[float, ...] = Field(description="median wall seconds per call")
    spread: tuple[float, ...] = Field(description="(p90 - p10) / median of the repeats")
    labels: tuple[str, ...] = Field(
        default=(), description="shape of each point, e.g. 'm=256 n=256 k=256'"
    )
    source: str = Field(description="'measured: <how, where, when>'")

    @model_validator(mode="after")
    def _check(self) -> MeasuredCurve:
        if not self.work:
            raise ValueError("work (()) must hold at least one point")
        for name in ("seconds", "spread") + (("labels",) if self.labels else ()):
            if len(getattr(self, name)) != len(self.work):
                raise ValueError(
                    f"{name} has {len(getattr(self, name))} points, must match work ({len(self.work)})"
                )
        for name, low in (("work", 0.0), ("seconds", 0.0)):
            for index, value in enumerate(getattr(self, name)):
                if not math.isfinite(value) or value <= low:
                    raise ValueError(f"{name}[{index}] ({value}) must be finite and > 0")
        for index, value in enumerate(self.spread):
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"spread[{index}] ({value}) must be finite and >= 0")
        if any(b <= a for a, b in zip(self.work, self.work[1:])):
            raise ValueError(f"work ({list(self.work)}) must be strictly increasing")
        if not self.source.startswith("measured"):
            raise ValueError(f"source ({self.source!r}) must start with 'measured'")
        return self

    @property
    def rates_per_s(self) -> np.ndarray:
        return np.asarray(self.work) / np.asarray(self.seconds)

    @property
    def best_rate_per_s(self) -> float:
        return float(self.rates_per_s.max())

    def rate_per_s(self, work):
        """Achieved work/s at ``work`` per call (vectorized; see the module docstring)."""
        work = np.asarray(work, dtype=np.float64)
        grid = np.log(np.asarray(self.work))
        inside = np.interp(np.log(np.maximum(work, 1e-300)), grid, self.rates_per_s)
        floor = work / self.seconds[0]  # constant time below the smallest measured call
        floor = np.where(work > 0, floor, self.rates_per_s[0])  # no work: any finite rate gives 0 s
        return np.where(work < self.work[0], np.minimum(floor, self.rates_per_s[0]), inside)

    def time_s(self, work):
        """Predicted seconds per call at ``work`` (vectorized)."""
        work = np.asarray(work, dtype=np.float64)
        return np.where(work > 0, work / np.maximum(self.rate_per_s(work), 1e-300), 0.0)


class HostOverhead(BaseModel):
    """Host seconds a roofline of single kernels misses (dispatch, autograd bookkeeping, Python),
    measured with the runtime's own modules at a vanishing size, where the time is all overhead
    (the intercept of time versus work; Williams et al.'s roofline has no such term).

    ``dense_layer_s`` / ``moe_layer_s``: forward + backward of one decoder layer (the MoE layer
    without its routed experts); ``routed_expert_s``: each routed expert a rank holds adds this
    (the runtime dispatches experts one by one). ``sharded_parameter_update_s``: each
    tensor-parallel (DTensor) weight adds this to a step (main-gradient accumulation and
    optimizer update) over a plain tensor of its local shape. ``pipeline_micro_batch_s``: each
    micro-batch adds this per pipeline stage (the schedule's forward and backward actions, less
    the send/recv time already priced by the link). ``collective_sync_s``: a blocking collective
    right after a compute segment takes this longer than the collective alone (the ranks, and
    the transport's threads, wake up after the compute).
    """

    model_config = _STRICT

    dense_layer_s: float = Field(ge=0)
    moe_layer_s: float = Field(ge=0)
    routed_expert_s: float = Field(ge=0)
    sharded_parameter_update_s: float = Field(default=0.0, ge=0)
    pipeline_micro_batch_s: float = Field(default=0.0, ge=0)
    collective_sync_s: float = Field(default=0.0, ge=0)
    source: str = Field(description="'measured: <how, where, when>'")

    @model_validator(mode="after")
    def _check(self) -> HostOverhead:
        if not self.source.startswith("measured"):
            raise ValueError(f"source ({self.source!r}) must start with 'measured'")
        return self


class HardwareProfile(BaseModel):
    """Measured curves of one device type; ``topology.HardwareSpec.with_profile`` attaches it.

    Keys: ``gemm`` and ``attention`` and ``grouped_gemm`` by dtype (work = FLOPs per call),
    ``memory`` (element-wise and norm kernels, work = bytes read + written per call),
    ``collectives[op][group_size]`` (work = message bytes per rank, nccl-tests "size").
    ``kernel_overhead_s`` is the fixed host cost of one operator launch (dispatch, autograd
    bookkeeping), fitted as the intercept of time versus work of the smallest kernels.
    Optional (absent in older profiles): ``optimizer`` and ``gradient_accumulation`` curves
    (work = bytes) and ``host`` overheads of whole layers, sharded weights and pipeline
    micro-batches (``HostOverhead``).
    """

    model_config = _STRICT

    schema_version: Literal[1] = PROFILE_SCHEMA_VERSION
    device_type: str = Field(
        min_length=1, description="torch device type: cpu, cuda, xpu, mps, ..."
    )
    device_name: str = Field(min_length=1)
    num_threads: int = Field(gt=0, description="intra-op threads per rank while measuring")
    torch_version: str
    created_utc: str
    provenance: str
    memory_bytes: float = Field(gt=0, description="memory of one device (host RAM per rank on cpu)")
    kernel_overhead_s: float = Field(ge=0)
    eager_op_host_s: float | None = Field(
        default=None,
        ge=0,
        description="host seconds per operator of a module run eagerly for inference (no autograd, "
        "no synchronization: Python module code, dispatch and kernel launch), per op of a tiny "
        "decoder block; absent in older profiles",
    )
    graph_kernel_floor_s: float | None = Field(
        default=None,
        ge=0,
        description="GPU seconds per tiny kernel replayed from a CUDA graph (the per-kernel floor "
        "of a graph-captured serving step); absent without CUDA graphs and in older profiles",
    )
    sharded_module_overhead_s: float = Field(
        default=0.0,
        ge=0,
        description="extra host seconds per tensor-parallel linear, forward + backward",
    )
    sharded_linear: MeasuredCurve | None = Field(
        default=None,
        description="the same overhead by activation bytes entering the linear (work = bytes)",
    )
    operator_clock: Literal["wall", "thread"] = Field(
        default="wall",
        description="wall seconds, or the rank thread's CPU seconds (single-threaded CPU kernels)",
    )
    gemm: dict[str, MeasuredCurve]
    attention: dict[str, MeasuredCurve] = Field(default_factory=dict)
    grouped_gemm: dict[str, MeasuredCurve] = Field(default_factory=dict)
    memory: MeasuredCurve
    norm: MeasuredCurve | None = Field(default=None, description="RMS norm, work = bytes per call")
    collectives: dict[str, dict[int, MeasuredCurve]] = Field(default_factory=dict)
    optimizer: MeasuredCurve | None = Field(
        default=None,
        description="one optimizer step (AdamW, fp32 master weights), work = update bytes as the "
        "cost model counts them (parameters x bytes read and written per parameter)",
    )
    gradient_accumulation: MeasuredCurve | None = Field(
        default=None,
        description="adding low-precision gradients into fp32 main gradients, work = bytes moved",
    )
    host: HostOverhead | None = Field(
        default=None, description="per-layer, per-weight and per-micro-batch host costs"
    )

    @model_validator(mode="after")
    def _check(self) -> HardwareProfile:
        if not self.gemm:
            raise ValueError("gemm ({}) must hold at least one dtype")
        if not self.provenance.startswith("measured"):
            raise ValueError(f"provenance ({self.provenance!r}) must start with 'measured'")
        for op, by_size in self.collectives.items():
            for size in by_size:
                if size < 2:
                    raise ValueError(f"collectives[{op!r}] group size ({size}) must be >= 2")
        return self

    def device_level(self) -> HardwareProfile:
        """This profile without its measurements of the autoparallel runtime's own modules: the
        per-layer, per-weight and per-micro-batch host costs (``host``), the DTensor linear
        overheads, the runtime's RMS norm, optimizer and main-gradient accumulation. What stays
        (GEMM, attention, grouped GEMM and memory curves, collectives, the per-kernel cost and the
        eager per-op host time) is the device's, whatever software drives it; a job run by
        another framework (``Training.framework``) prices its own modules from that
        framework's profile (fused norms, fused optimizers, its host path)."""
        return self.model_copy(
            update={
                "host": None,
                "sharded_module_overhead_s": 0.0,
                "sharded_linear": None,
                "norm": None,
                "optimizer": None,
                "gradient_accumulation": None,
            }
        )

    def gemm_curve(self, dtype: str) -> MeasuredCurve:
        """The GEMM curve of ``dtype``, else fp32's for bf16/fp16 (a CPU without their kernels,
        ``measured_curve``), else an error."""
        curve = measured_curve(self.gemm, dtype)
        if curve is None:
            raise ValueError(
                f"gemm has no curve for dtype {dtype!r}; measured: {sorted(self.gemm)}"
            )
        return curve

    def collective_time_s(self, op: str, group_size, message_bytes):
        """Measured seconds of ``op`` (vectorized); NaN where that op or group size was not measured."""
        sizes, nbytes = np.broadcast_arrays(
            np.asarray(group_size, dtype=np.float64), np.asarray(message_bytes, dtype=np.float64)
        )
        result = np.full(sizes.shape, np.nan)
        for size, curve in self.collectives.get(op, {}).items():
            rows = sizes == size  # each curve interpolates only the messages of its group size
            if np.any(rows):
                result[rows] = curve.time_s(nbytes[rows])
        return result

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.model_dump_json(indent=1) + "\n")
        return path


def _error_lines(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "(document)"
        lines.append(f"field '{where}': {item['msg']}")
    return "; ".join(lines)


def parse_hardware_profile(document: dict, *, origin: str = "profile") -> HardwareProfile:
    """Validate a decoded profile; raise ``ValueError`` naming each bad or missing field."""
    if not isinstance(document, dict):
        raise ValueError(f"{origin}: must be a JSON object, got {type(document).__name__}")
    try:
        return HardwareProfile.model_validate(document)
    except ValidationError as error:
        raise ValueError(f"hardware profile {origin} is invalid: {_error_lines(error)}") from None


def load_hardware_profile(
    path: str | Path, *, expected_device_type: str | None = None, force: bool = False
) -> HardwareProfile:
    """Read and validate a profile JSON file.

    Raises ``ValueError`` naming the file and the missing or corrupted field, and — unless
    ``force`` — when ``expected_device_type`` is given and differs from the profile's.
    """
    path = Path(path)
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"hardware profile ({path}) does not exist") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"hardware profile {path} is not valid JSON: {error}") from None
    profile = parse_hardware_profile(document, origin=str(path))
    check_device_type(profile, expected_device_type, force=force)
    return profile


def check_device_type(
    profile: HardwareProfile, expected: str | None, *, force: bool = False
) -> None:
    """Refuse a profile measured on another device type unless ``force``."""
    if expected is None or force or profile.device_type == expected:
        return
    raise ValueError(
        f"device_type ({profile.device_type!r}, measured on {profile.device_name}) must match the "
        f"target device type ({expected!r}); pass force=True (--force) to use it anyway"
    )


#: Floats whose unmeasured curve falls back to fp32's: a device (a CPU) may run them through
#: the fp32 kernels. Narrower types run on their own tensor-core paths, which fp32 says nothing of.
FP32_FALLBACK_DTYPES = frozenset({"fp32", "bf16", "fp16"})


def measured_curve(curves, dtype: str):
    """``curves[dtype]``, else fp32's for a wider float (``FP32_FALLBACK_DTYPES``), else None."""
    if dtype in curves:
        return curves[dtype]
    if dtype in FP32_FALLBACK_DTYPES:
        return curves.get("fp32")
    return None
