"""``HardwareSpec``: one accelerator's peaks, each with its provenance."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class HardwareSpec(BaseModel):
    """Peak dense FLOP/s per dtype, achievable matmul fraction, memory size and bandwidth.

    ``sources`` maps a field name to its provenance: ``"preset: <citation>"`` or
    ``"measured: <probe run>"``. ``uncertain`` lists fields whose value is an estimate.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    peak_flops: dict[str, float] = Field(description="dense FLOP/s by dtype (bf16, fp16, fp8, fp32, ...)")
    matmul_efficiency: float = Field(gt=0, le=1, description="achievable fraction of peak for large GEMMs")
    memory_bytes: float = Field(gt=0)
    memory_bandwidth_bytes_per_s: float = Field(gt=0)
    memory_bandwidth_efficiency: float = Field(default=0.8, gt=0, le=1)
    sources: dict[str, str] = Field(default_factory=dict)
    uncertain: tuple[str, ...] = ()

    @field_validator("peak_flops")
    @classmethod
    def _positive_peaks(cls, value: dict[str, float]) -> dict[str, float]:
        for dtype, flops in value.items():
            if flops <= 0:
                raise ValueError(f"peak_flops[{dtype!r}] ({flops}) must be > 0")
        return value

    def __hash__(self) -> int:
        return hash(self.model_dump_json())

    def peak_flops_for(self, dtype: str) -> float:
        """Peak for ``dtype``; int8/fp8 fall back to bf16 x 2 only when listed, else an error."""
        try:
            return self.peak_flops[dtype]
        except KeyError:
            raise ValueError(
                f"peak_flops has no entry for dtype {dtype!r} on {self.name}; known: {sorted(self.peak_flops)}"
            ) from None

    def achievable_flops(self, dtype: str) -> float:
        return self.peak_flops_for(dtype) * self.matmul_efficiency

    def gemm_efficiency(self, flops_per_call, dtype: str = "bf16"):
        """Achievable fraction of peak for GEMMs of ``flops_per_call`` FLOPs (vectorized).

        Without a measured profile this is the constant ``matmul_efficiency``; a measured hardware
        profile (``profilers``) replaces it by an interpolated efficiency curve.
        """
        import numpy as np

        return np.broadcast_to(np.float64(self.matmul_efficiency), np.shape(flops_per_call))

    def memory_efficiency(self, bytes_per_call):
        """Achievable fraction of memory bandwidth for kernels moving ``bytes_per_call`` (vectorized)."""
        import numpy as np

        return np.broadcast_to(np.float64(self.memory_bandwidth_efficiency), np.shape(bytes_per_call))

    @property
    def achievable_memory_bandwidth_bytes_per_s(self) -> float:
        return self.memory_bandwidth_bytes_per_s * self.memory_bandwidth_efficiency
