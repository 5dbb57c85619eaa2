"""Operator measurement points: GEMM, fused attention (SDPA), grouped expert GEMM, element-wise
and norm kernels, each a ``Point`` whose ``build`` allocates inputs and returns the timed call.

Work per call (the x axis of every curve):
  * GEMM ``m x k @ k x n``: 2·m·n·k FLOPs (one multiply-add = 2 FLOPs; Kaplan et al. 2020); a
    point times the forward and both backward layouts of a linear layer (3 GEMMs per call) and
    records their mean: the work and seconds of one GEMM (``Point.kernels``), the size the cost
    model looks a GEMM's efficiency up at.
    GEMM and grouped GEMM points are timed with cold caches (``Point.cold``): a training step
    reads each weight once per pass, from memory, and small GEMMs are then measurably slower.
  * causal attention over S tokens, H heads, head dim D, forward: the score and value products,
    2·H·(D + D) FLOPs per attended key with (S + 1) / 2 keys per query on average — the same
    count as ``cost_model.ModelSpec.attention_flops_per_token``.
  * grouped expert GEMM, E experts x T tokens each, hidden h, expert FFN f: 2·E·T·h·f FLOPs.
  * element-wise ``a + b`` over N elements: 3·N·bytes (two reads, one write); RMS norm (the
    runtime's module, forward + backward, training precision): 3 x 2·N·bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class ProfileGrid(BaseModel):
    """What to measure. ``tiny`` keeps a test under a few seconds; ``cpu`` and ``gpu`` are the
    defaults of ``autoparallel profile`` on those devices."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dtypes: tuple[str, ...] = ("fp32", "bf16")
    fp8_gemm: bool = Field(
        default=False,
        description="also time float8 GEMMs with one scale per tensor (torch._scaled_mm) on "
        "devices that run them: the gemm curve 'fp8'",
    )
    gemm_sizes: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024)
    gemm_max_flops_low_precision: float = Field(
        default=float("inf"), gt=0, description="skip bigger bf16/fp16 GEMMs"
    )
    attention_sequence_tokens: tuple[int, ...] = (64, 128, 256, 512)
    attention_num_heads: int = Field(default=4, gt=0)
    attention_head_dim: int = Field(default=32, gt=0)
    expert_tokens: tuple[int, ...] = (4, 16, 64, 256)
    num_experts: int = Field(default=8, gt=0)
    expert_hidden_size: int = Field(default=128, gt=0)
    expert_ffn_hidden_size: int = Field(default=256, gt=0)
    memory_elements: tuple[int, ...] = (1024, 16384, 262144, 1048576, 4194304)
    collective_bytes: tuple[int, ...] = (4096, 65536, 1048576, 8388608)
    #: Model widths of the tensor-parallel linear pair whose host overhead is measured
    #: (``profilers._sharded``: a (2, 64, width) activation).
    sharded_linear_widths: tuple[int, ...] = (64, 256, 512, 1024)
    collective_ops: tuple[str, ...] = (
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "send_recv",
        "broadcast",
    )
    optimizer_parameters: tuple[int, ...] = Field(
        default=(2**12, 2**15, 2**18, 2**21, 2**24),
        description="parameters per optimizer-update point",
    )
    cache_flush_bytes: int = Field(
        default=256 * 2**20, gt=0, description="written before each cold-cache call"
    )
    warmup: int = Field(default=2, ge=0)
    repeats: int = Field(default=7, ge=1)

    @field_validator("dtypes")
    @classmethod
    def _known_dtypes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for dtype in value:
            if dtype not in TORCH_DTYPES:
                raise ValueError(f"dtypes entry ({dtype!r}) must be one of {sorted(TORCH_DTYPES)}")
        if "fp32" not in value:
            raise ValueError(f"dtypes ({list(value)}) must include 'fp32' (the fallback curve)")
        return value

    @field_validator(
        "gemm_sizes",
        "attention_sequence_tokens",
        "expert_tokens",
        "memory_elements",
        "collective_bytes",
        "sharded_linear_widths",
        "optimizer_parameters",
    )
    @classmethod
    def _positive_sizes(cls, value: tuple[int, ...], info) -> tuple[int, ...]:
        if not value:
            raise ValueError(f"{info.field_name} must list at least one size")
        for size in value:
            if size <= 0:
                raise ValueError(f"{info.field_name} entry ({size}) must be > 0")
        return value

    @classmethod
    def preset(cls, name: str) -> ProfileGrid:
        """``tiny`` (tests, seconds), ``cpu`` (a minute or two), ``gpu`` (a few minutes)."""
        presets = {"tiny": _TINY, "cpu": _CPU, "gpu": _GPU}
        if name not in presets:
            raise ValueError(f"grid ({name!r}) must be one of {sorted(presets)}")
        return cls(**presets[name])


_TINY = dict(
    dtypes=("fp32", "bf16"),
    fp8_gemm=True,
    gemm_sizes=(16, 64, 128),
    attention_sequence_tokens=(32, 64),
    expert_tokens=(4, 16),
    num_experts=4,
    expert_hidden_size=32,
    expert_ffn_hidden_size=64,
    memory_elements=(1024, 65536),
    collective_bytes=(4096, 65536),
    collective_ops=("all_reduce", "send_recv"),
    sharded_linear_widths=(32, 64, 128, 256),
    optimizer_parameters=(2**10, 2**14),
    cache_flush_bytes=64 * 2**20,
    warmup=1,
    repeats=3,
)
_CPU = dict(gemm_max_flops_low_precision=2 * 256**3)
_GPU = dict(
    dtypes=("fp32", "bf16", "fp16"),
    fp8_gemm=True,
    gemm_sizes=(256, 512, 1024, 2048, 4096, 8192, 16384),
    attention_sequence_tokens=(512, 1024, 2048, 4096, 8192, 16384),
    attention_num_heads=16,
    attention_head_dim=128,
    expert_tokens=(16, 64, 256, 1024, 4096),
    num_experts=16,
    expert_hidden_size=4096,
    expert_ffn_hidden_size=2048,
    memory_elements=(2**16, 2**20, 2**24, 2**27),
    collective_bytes=(2**16, 2**20, 2**24, 2**27),
    optimizer_parameters=(2**18, 2**22, 2**26, 2**28),
    warmup=5,
    repeats=15,
)


@dataclass(frozen=True)
class Point:
    """One measurement: ``family`` (gemm, attention, grouped_gemm, memory, norm), curve ``key``
    (a dtype, or "" for memory curves), its work per call, and a builder of the timed call."""

    family: str
    key: str
    label: str
    work: float
    build: Callable[[torch.device], Callable[[], object]]
    cold: bool = False  # timed with caches flushed before each call (weights read from memory)
    kernels: int = 1  # equal kernels per call: work is one kernel's, the time is divided by it
    optional: bool = False  # skipped where the device lacks the kernel (its build raises)


def _gemm_point(size: int, dtype: str) -> Point:
    """The three layouts of a training GEMM, one call each: forward ``x @ W^T`` (``F.linear``),
    input gradient ``dY @ W`` and weight gradient ``dY^T @ x``; the point is their mean."""

    def build(device: torch.device) -> Callable[[], object]:
        x, weight, grad = (
            torch.randn(size, size, device=device, dtype=TORCH_DTYPES[dtype]) for _ in range(3)
        )
        linear = torch.nn.functional.linear

        def call() -> None:
            linear(x, weight)
            torch.mm(grad, weight)
            torch.mm(grad.t(), x)

        return call

    return Point(
        "gemm",
        dtype,
        f"m=n=k={size} (x W^T, dY W, dY^T x, mean), cold cache",
        2.0 * size**3,
        build,
        cold=True,
        kernels=3,
    )


#: Largest finite float8_e4m3fn (OCP 8-bit floating point specification, E4M3).
FP8_E4M3_MAX = 448.0


def _fp8_gemm_point(size: int) -> Point:
    """A forward GEMM ``x @ W^T`` in float8_e4m3fn with one fp32 scale per tensor and a bf16
    output (``torch._scaled_mm``: cuBLASLt on CUDA, the per-tensor scaling of Transformer
    Engine's and torchao's tensorwise recipes), operands quantized once before timing. The
    build runs it once, so a device without the kernel raises there (``Point.optional``)."""

    def build(device: torch.device) -> Callable[[], object]:
        def quantized(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
            x = torch.randn(rows, size, device=device, dtype=torch.bfloat16)
            scale = x.abs().amax().float().clamp(min=1e-12) / FP8_E4M3_MAX
            return (x / scale).to(torch.float8_e4m3fn), scale

        (x, x_scale), (weight, w_scale) = quantized(size), quantized(size)

        def call() -> object:
            return torch._scaled_mm(  # mat2 column-major, as cuBLASLt's fp8 GEMM takes it
                x, weight.t(), x_scale, w_scale, out_dtype=torch.bfloat16
            )

        call()
        return call

    return Point(
        "gemm",
        "fp8",
        f"m=n=k={size} (x W^T, float8_e4m3fn, per-tensor scales), cold cache",
        2.0 * size**3,
        build,
        cold=True,
        optional=True,
    )


def attention_flops(sequence_tokens: int, num_heads: int, head_dim: int) -> float:
    """Causal forward FLOPs of one sequence (module docstring)."""
    return sequence_tokens * 2.0 * num_heads * (2 * head_dim) * (sequence_tokens + 1) / 2.0


def _attention_point(tokens: int, dtype: str, grid: ProfileGrid) -> Point:
    heads, dim = grid.attention_num_heads, grid.attention_head_dim

    def build(device: torch.device) -> Callable[[], object]:
        shape = (1, heads, tokens, dim)
        q, k, v = (torch.randn(shape, device=device, dtype=TORCH_DTYPES[dtype]) for _ in range(3))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        return lambda: sdpa(q, k, v, is_causal=True)

    return Point(
        "attention",
        dtype,
        f"S={tokens} H={heads} D={dim}",
        attention_flops(tokens, heads, dim),
        build,
    )


def _grouped_point(tokens: int, dtype: str, grid: ProfileGrid) -> Point:
    experts, hidden, ffn = grid.num_experts, grid.expert_hidden_size, grid.expert_ffn_hidden_size

    def build(device: torch.device) -> Callable[[], object]:
        x = torch.randn(experts, tokens, hidden, device=device, dtype=TORCH_DTYPES[dtype])
        w = torch.randn(experts, hidden, ffn, device=device, dtype=TORCH_DTYPES[dtype])
        return lambda: torch.bmm(x, w)

    label = f"E={experts} T={tokens} h={hidden} f={ffn}, cold cache"
    return Point(
        "grouped_gemm", dtype, label, 2.0 * experts * tokens * hidden * ffn, build, cold=True
    )


def _memory_points(elements: int, norm_dtype: str = "fp32") -> list[Point]:
    def build_add(device: torch.device) -> Callable[[], object]:
        a, b = torch.randn(elements, device=device), torch.randn(elements, device=device)
        return lambda: torch.add(a, b)

    width = min(elements, 1024)
    dtype = TORCH_DTYPES[norm_dtype]

    def build_norm(device: torch.device) -> Callable[[], object]:
        from autoparallel.runtime import RMSNorm

        norm = RMSNorm(width, device=device, dtype=dtype)
        x = torch.randn(elements // width, width, device=device, dtype=dtype, requires_grad=True)
        grad = torch.randn(elements // width, width, device=device, dtype=dtype)

        def call() -> None:
            norm(x).backward(grad)
            norm.weight.grad = x.grad = None

        return call

    normed = (elements // width) * width
    element = torch.empty((), dtype=dtype).element_size()
    return [
        Point("memory", "", f"add N={elements}", 3.0 * 4 * elements, build_add),
        # Work: the forward's read + write, x 3 for forward + backward (backward = 2 x forward,
        # as the cost model prices every layer operator).
        Point(
            "norm",
            "",
            f"runtime RMSNorm fwd+bwd N={elements} {norm_dtype}",
            3.0 * 2.0 * element * normed,
            build_norm,
        ),
    ]


def operator_points(grid: ProfileGrid) -> list[Point]:
    """Every operator point of ``grid``, in measurement order."""
    points: list[Point] = []
    for dtype in grid.dtypes:
        for size in grid.gemm_sizes:
            if dtype == "fp32" or 2.0 * size**3 <= grid.gemm_max_flops_low_precision:  # per GEMM
                points.append(_gemm_point(size, dtype))
        points += [
            _attention_point(tokens, dtype, grid) for tokens in grid.attention_sequence_tokens
        ]
        points += [_grouped_point(tokens, dtype, grid) for tokens in grid.expert_tokens]
    if grid.fp8_gemm:
        points += [
            _fp8_gemm_point(size)
            for size in grid.gemm_sizes
            if 2.0 * size**3 <= grid.gemm_max_flops_low_precision
        ]
    norm_dtype = "bf16" if "bf16" in grid.dtypes else "fp32"  # the training precision when measured
    for elements in grid.memory_elements:
        points += _memory_points(elements, norm_dtype)
    return points


def tiny_op_call(device: torch.device) -> Callable[[], object]:
    """A kernel doing almost no work: its time is the fixed per-operator launch cost."""
    a, b = torch.ones(1, device=device), torch.ones(1, device=device)
    return lambda: torch.add(a, b)
