"""``HardwareSpec``: one accelerator's peaks, each with its provenance."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from topology._hardware_profile import HardwareProfile, check_device_type, measured_curve

#: Achievable fraction of the peak memory bandwidth of the memory-bound kernels the cost model
#: prices (elementwise, norms, casts, the optimizer) on a device without a measured profile.
#: Measured: ``autoparallel profile`` on one NVIDIA H200 (benchmarks/results/profile_h200.json,
#: ``memory``: an eager torch add, 3 tensors of 134M fp32 elements, 1.61 GB in 399 us) reaches
#: 0.84 of the 4.8 TB/s peak, and 0.73 at 201 MB where its fixed launch cost (the cost model's
#: per-kernel overhead, charged apart) weighs in. A single-pass streaming kernel reaches more:
#: the static per-tensor FP8 quantization of NVIDIA's aiconfigurator-core 0.12.0 operator tables
#: (``systems/data/<device>/quantize/{trtllm,vllm}/*/scale_matrix_perf.parquet``: 2 bytes read
#: and 1 written per element, calls of at least 1 GiB, the faster engine per shape) 0.91 on H100
#: and H200, 0.85 on B200, 0.88-0.89 on GB200 and GB300: an upper bound for the framework kernels
#: (norms with their reductions, eager elementwise ops) this default stands for.
DEFAULT_MEMORY_BANDWIDTH_EFFICIENCY = 0.8


class HardwareSpec(BaseModel):
    """Peak dense FLOP/s per dtype, achievable matmul fraction, memory size and bandwidth.

    ``sources`` maps a field name to its provenance: ``"preset: <citation>"`` or
    ``"measured: <probe run>"``. ``uncertain`` lists fields whose value is an estimate.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    peak_flops: dict[str, float] = Field(
        description="dense FLOP/s by dtype (bf16, fp16, fp8, fp32, ...)"
    )
    matmul_efficiency: float = Field(
        gt=0, le=1, description="achievable fraction of peak for large GEMMs"
    )
    memory_bytes: float = Field(gt=0)
    memory_bandwidth_bytes_per_s: float = Field(gt=0)
    memory_bandwidth_efficiency: float = Field(
        default=DEFAULT_MEMORY_BANDWIDTH_EFFICIENCY,
        gt=0,
        le=1,
        description="achievable fraction of peak memory bandwidth for memory-bound kernels "
        "(default: DEFAULT_MEMORY_BANDWIDTH_EFFICIENCY, measured on an H200; a profile's curve "
        "or a calibration replaces it)",
    )
    host_link_bandwidth_bytes_per_s: float | None = Field(
        default=None,
        gt=0,
        description="device-host link, one direction (PCIe, NVLink-C2C): the bandwidth of CPU "
        "activation offloading's copies; None: unknown",
    )
    host_op_time_factor: float = Field(
        default=1.0,
        gt=0,
        description="host seconds to issue one eager operator relative to the x86 hosts of DGX "
        "systems (1.0), on which the frameworks' and serving engines' default host times per "
        "operator were measured: a Grace host takes about twice as long",
    )
    sources: dict[str, str] = Field(default_factory=dict)
    uncertain: tuple[str, ...] = ()
    device_type: str | None = Field(
        default=None, description="torch device type (cpu, cuda, ...); None: from name"
    )
    profile: HardwareProfile | None = Field(
        default=None, description="measured curves (``profilers``)"
    )
    calibration_reference: str | None = Field(
        default=None,
        description="preset of a calibrated device whose fitted efficiencies carry over (relative to the "
        "matmul ceilings) when no run of this device was fitted (cost_model._calibration_transfer)",
    )

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

        Without a measured profile this is the constant ``matmul_efficiency``; with one it is the
        measured rate at that size (log-interpolated) over ``peak_flops_for(dtype)``. A dtype the
        profile did not measure takes fp32's curve only where it is a wider float the device may
        lack kernels for (bf16/fp16 on a CPU); a narrower one (fp8, fp4, int8) keeps the constant,
        as without a profile: an fp32 rate over an fp8 peak would price it tens of times too
        slow.
        """
        import numpy as np

        curve = None if self.profile is None else measured_curve(self.profile.gemm, dtype)
        if curve is None:
            return np.broadcast_to(np.float64(self.matmul_efficiency), np.shape(flops_per_call))
        return curve.rate_per_s(flops_per_call) / self.peak_flops_for(dtype)

    def attention_efficiency(self, flops_per_call, dtype: str = "bf16"):
        """Like ``gemm_efficiency`` for fused attention (SDPA) calls; the GEMM curve when unmeasured."""
        return self._curve_efficiency(
            self.profile and self.profile.attention, flops_per_call, dtype
        )

    def grouped_gemm_efficiency(self, flops_per_call, dtype: str = "bf16"):
        """Like ``gemm_efficiency`` for one grouped expert GEMM (all local experts of a layer)."""
        return self._curve_efficiency(
            self.profile and self.profile.grouped_gemm, flops_per_call, dtype
        )

    def _curve_efficiency(self, curves, flops_per_call, dtype: str):
        curve = measured_curve(curves or {}, dtype)
        if curve is None:
            return self.gemm_efficiency(flops_per_call, dtype)
        return curve.rate_per_s(flops_per_call) / self.peak_flops_for(dtype)

    def memory_efficiency(self, bytes_per_call):
        """Achievable fraction of memory bandwidth for kernels moving ``bytes_per_call`` (vectorized)."""
        import numpy as np

        if self.profile is None:
            return np.broadcast_to(
                np.float64(self.memory_bandwidth_efficiency), np.shape(bytes_per_call)
            )
        return self.profile.memory.rate_per_s(bytes_per_call) / self.memory_bandwidth_bytes_per_s

    def norm_efficiency(self, bytes_per_call):
        """Like ``memory_efficiency`` for norm layers: the profile's measured ``norm`` curve where
        there is one (the runtime's RMSNorm), else ``memory_efficiency`` (vectorized)."""
        curve = None if self.profile is None else self.profile.norm
        if curve is None:
            return self.memory_efficiency(bytes_per_call)
        return curve.rate_per_s(bytes_per_call) / self.memory_bandwidth_bytes_per_s

    @property
    def kernel_overhead_s(self) -> float:
        """Fixed host seconds per operator launch, from the profile (0 without one)."""
        return 0.0 if self.profile is None else self.profile.kernel_overhead_s

    @property
    def eager_op_host_s(self) -> float | None:
        """Measured host seconds per eagerly launched inference operator (None without one)."""
        return None if self.profile is None else self.profile.eager_op_host_s

    @property
    def graph_kernel_floor_s(self) -> float | None:
        """Measured GPU seconds per graph-replayed kernel (None without one)."""
        return None if self.profile is None else self.profile.graph_kernel_floor_s

    @property
    def sharded_module_overhead_s(self) -> float:
        """Extra host seconds per tensor-parallel linear, forward + backward (0 without a profile)."""
        return 0.0 if self.profile is None else self.profile.sharded_module_overhead_s

    def sharded_module_time_s(self, activation_bytes):
        """``sharded_module_overhead_s`` at ``activation_bytes`` entering the linear (vectorized):
        the profile's measured curve where there is one, else the constant."""
        import numpy as np

        curve = None if self.profile is None else self.profile.sharded_linear
        if curve is None:
            return np.broadcast_to(
                np.float64(self.sharded_module_overhead_s), np.shape(activation_bytes)
            )
        return curve.time_s(activation_bytes)

    def optimizer_time_s(self, update_bytes):
        """Measured seconds of one optimizer step moving ``update_bytes`` (vectorized; the
        profile's ``optimizer`` curve), or ``None`` without one (the cost model then prices a
        memory-bound roofline)."""
        curve = None if self.profile is None else self.profile.optimizer
        return None if curve is None else curve.time_s(update_bytes)

    def gradient_accumulation_time_s(self, moved_bytes):
        """Measured seconds of adding gradients into fp32 main gradients, ``moved_bytes`` read and
        written (vectorized), or ``None`` without the profile's ``gradient_accumulation`` curve."""
        curve = None if self.profile is None else self.profile.gradient_accumulation
        return None if curve is None else curve.time_s(moved_bytes)

    def layer_host_time_s(self, routed_experts_per_rank):
        """Host seconds of one (dense, MoE) decoder layer, forward + backward, beyond its kernels'
        work (``HostOverhead``; the MoE layer adds each routed expert a rank holds); zeros
        without a measured profile (vectorized over ``routed_experts_per_rank``)."""
        import numpy as np

        experts = np.asarray(routed_experts_per_rank, dtype=np.float64)
        host = None if self.profile is None else self.profile.host
        if host is None:
            return np.zeros_like(experts), np.zeros_like(experts)
        return np.full_like(
            experts, host.dense_layer_s
        ), host.moe_layer_s + experts * host.routed_expert_s

    @property
    def sharded_parameter_update_s(self) -> float:
        """Extra host seconds per tensor-parallel weight per step (0 without a measured profile)."""
        host = None if self.profile is None else self.profile.host
        return 0.0 if host is None else host.sharded_parameter_update_s

    @property
    def pipeline_micro_batch_s(self) -> float:
        """Extra host seconds per micro-batch per pipeline stage (0 without a measured profile)."""
        host = None if self.profile is None else self.profile.host
        return 0.0 if host is None else host.pipeline_micro_batch_s

    @property
    def collective_sync_s(self) -> float:
        """Extra seconds of a blocking collective between compute segments (0 without a profile)."""
        host = None if self.profile is None else self.profile.host
        return 0.0 if host is None else host.collective_sync_s

    @property
    def resolved_device_type(self) -> str:
        """``device_type``, else guessed from the vendor in ``name`` (NVIDIA/AMD -> cuda)."""
        if self.device_type:
            return self.device_type
        lowered = self.name.lower()
        if any(
            vendor in lowered
            for vendor in ("nvidia", "amd", "instinct", "h100", "h200", "a100", "b200")
        ):
            return "cuda"
        if "gaudi" in lowered:
            return "hpu"
        return "cpu" if "cpu" in lowered or "xeon" in lowered or "epyc" in lowered else lowered

    def with_profile(self, profile: HardwareProfile, *, force: bool = False) -> HardwareSpec:
        """This spec with measured curves attached; refuses another device type unless ``force``."""
        check_device_type(profile, self.resolved_device_type, force=force)
        sources = dict(self.sources, profile=profile.provenance)
        return self.model_copy(update={"profile": profile, "sources": sources})

    @classmethod
    def from_profile(cls, profile: HardwareProfile, *, name: str | None = None) -> HardwareSpec:
        """A spec whose peaks are the best measured rates (a CPU, or a device without a preset).

        Peak FLOP/s per dtype is the fastest measured GEMM; bandwidth the fastest element-wise
        kernel; efficiencies are then the measured curves relative to those bests.
        """
        peaks = {dtype: curve.best_rate_per_s for dtype, curve in profile.gemm.items()}
        where = f"measured: best rate in profile ({profile.provenance})"
        return cls(
            name=name or profile.device_name,
            peak_flops=peaks,
            matmul_efficiency=1.0,
            memory_bytes=profile.memory_bytes,
            memory_bandwidth_bytes_per_s=profile.memory.best_rate_per_s,
            memory_bandwidth_efficiency=1.0,
            sources={
                "peak_flops": where,
                "memory_bandwidth_bytes_per_s": where,
                "memory_bytes": where,
            },
            device_type=profile.device_type,
            profile=profile,
        )

    @property
    def achievable_memory_bandwidth_bytes_per_s(self) -> float:
        return self.memory_bandwidth_bytes_per_s * self.memory_bandwidth_efficiency
