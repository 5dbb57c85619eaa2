"""The serving columns of an inference config table (``INFERENCE_COLUMNS``) and their scalar
face, ``ServingConfig``; ``checked_columns`` fills absent columns and checks their rules."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from cost_model._table import table_length
from cost_model._units import Dtype
from cost_model._workload import Inference

PHASE_CODES: dict[str, int] = {"both": 0, "prefill": 1, "decode": 2}
KV_DTYPE_CODES: dict[str, int] = {
    "bf16": 0,
    "fp8": 1,
    "int8": 2,
    "int4": 3,
    "fp16": 4,
    "fp32": 5,
    "fp4": 6,
}
#: Expert all-to-all kernels (DeepEP README): ``normal`` (high throughput, sends a token once per
#: remote node and forwards it over NVLink there), ``low_latency`` (pure RDMA, one copy per
#: expert, no SMs held); ``auto`` = normal for prefill passes, low-latency for decode steps.
A2A_BACKEND_CODES: dict[str, int] = {"auto": 0, "normal": 1, "low_latency": 2}
INFERENCE_COLUMNS: tuple[str, ...] = (
    "batch_size",
    "num_redundant_experts",
    "kv_dtype",
    "phase",
    "two_batch_overlap",
    "a2a_backend",
)


class ServingConfig(BaseModel):
    """Serving knobs of one config (the scalar face of ``INFERENCE_COLUMNS``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_size: int = Field(
        default=0, ge=0, description="sequences per attention replica; 0 = largest that fits"
    )
    num_redundant_experts: int = Field(default=0, ge=0)
    kv_dtype: Dtype | None = Field(default=None, description="None = the workload's kv_dtype")
    phase: Literal["both", "prefill", "decode"] = "both"
    two_batch_overlap: bool = False
    a2a_backend: Literal["auto", "normal", "low_latency"] = "auto"

    def columns(self, *, workload: Inference, length: int = 1) -> dict[str, np.ndarray]:
        """The extra table columns of this serving config, ``length`` rows."""
        kv_dtype = self.kv_dtype or workload.kv_dtype
        values = {
            "batch_size": self.batch_size,
            "num_redundant_experts": self.num_redundant_experts,
            "kv_dtype": KV_DTYPE_CODES[kv_dtype],
            "phase": PHASE_CODES[self.phase],
            "two_batch_overlap": self.two_batch_overlap,
            "a2a_backend": A2A_BACKEND_CODES[self.a2a_backend],
        }
        return {name: np.full(length, value) for name, value in values.items()}


def checked_columns(table: Mapping[str, np.ndarray], workload: Inference) -> dict[str, np.ndarray]:
    """The table with defaults for absent ``INFERENCE_COLUMNS``; raises ``ValueError`` naming a
    column whose values break its rule."""
    n = table_length(table)
    defaults = {
        "batch_size": 0,
        "num_redundant_experts": 0,
        "kv_dtype": KV_DTYPE_CODES[workload.kv_dtype],
        "phase": PHASE_CODES["both"],
        "two_batch_overlap": False,
        "a2a_backend": A2A_BACKEND_CODES["auto"],
    }
    table = {**{name: np.full(n, value) for name, value in defaults.items()}, **table}
    for name in ("batch_size", "num_redundant_experts"):
        if np.any(np.asarray(table[name]) < 0):
            raise ValueError(f"{name} ({int(np.min(table[name]))}) must be >= 0")
    for name, codes in (
        ("kv_dtype", KV_DTYPE_CODES),
        ("phase", PHASE_CODES),
        ("a2a_backend", A2A_BACKEND_CODES),
    ):
        values = np.asarray(table[name], dtype=np.int64)
        if values.min(initial=0) < 0 or values.max(initial=0) >= len(codes):
            raise ValueError(f"{name} codes ({sorted(set(values.tolist()))}) must be in {codes}")
    return table
