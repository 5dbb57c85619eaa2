"""Inference cost over a config table: TTFT, TPOT, memory, the largest batch and tokens/s.

``estimate_inference_table`` evaluates every row of a config table (``cost_model._table``) at
once. Extra columns it reads (``_serving_columns.INFERENCE_COLUMNS``; absent = default):

===================== ======= ===============================================================
``batch_size``        int     sequences per attention replica (a DP replica, or each tp rank
                              under attention-DP) per pipeline micro-batch; 0 = the largest
                              that memory (and the workload's SLOs) allow, or what the
                              workload's ``concurrency`` needs
``num_redundant_experts`` int extra routed-expert slots over the ep ranks (DeepSeek EPLB)
``kv_dtype``          int     code in ``KV_DTYPE_CODES``; absent = the workload's ``kv_dtype``
``phase``             int     code in ``PHASE_CODES``: ``prefill`` or ``decode`` pool of a
                              disaggregated deployment, or ``both`` colocated
``two_batch_overlap`` bool    split each pass in two micro-batches whose TP/EP/CP traffic
                              hides behind the other's compute (DeepSeek's dual micro-batch
                              overlap, SGLang ``--enable-two-batch-overlap``); each
                              micro-batch reads the weights again
``a2a_backend``       int     code in ``A2A_BACKEND_CODES``: DeepEP ``normal`` (per-node
                              de-duplicated) or ``low_latency`` kernels; ``auto`` = the
                              engine's default (``_comm_times``): DeepEP by phase, vLLM's
                              all-gather / reduce-scatter
===================== ======= ===============================================================

Time model: a decode step is one pass of one token per sequence at the mean decode context
``prompt + (output * (1 + output_tokens_cv^2) + 1) / 2`` (the mean over output tokens: a request
of ``O`` outputs contributes ``O`` tokens at contexts ``P + 1 .. P + O``); prefill is one pass over the ``prompt * (1 - prefix_cache_hit_rate)``
uncached tokens, attending the whole prompt; its attention is priced at the token-weighted mean
prompt ``prompt * (1 + prompt_tokens_cv^2)`` (a token's causal context grows with its request's
length, so a mix of lengths averages ``E[P^2] / E[P]`` keys per token). A pipeline of ``pp`` ranks keeps ``pp``
micro-batches in flight, so TPOT and TTFT are ``pp`` times the slowest rank's pass time, and
every rank holds the KV cache of ``pp`` micro-batches. Decoding sequences hold the cache of the
mean decode context (continuous batching keeps sequences at every point of their output),
rounded up to whole ``kv_block_tokens`` pages; a prefill pool holds its prompts' cache.
Colocated (``both``) rows are served under a load (``_inference_load``: continuous batching with
chunked prefill, closed loop or Poisson, priced in closed form on the iteration cost these passes
give); their ``step_time_s`` and time parts amortize the prefill of a batch over its
``output_tokens`` decode steps (Agrawal et al., Sarathi-Serve, OSDI'24), their TTFT and TPOT are
the load's.
Routing is uniform at random: the busiest EP rank carries the balls-into-bins excess, or the
measured ``EstimateOptions.routing_imbalance`` if larger; redundant experts cost their memory,
and the skew they fix in real routing is not modelled. Inference has
no backward pass, optimizer or gradients: none of those parts exist here.

Matmuls are rooflines of their FLOPs and weight bytes, each part (attention, dense FFN, routed
and shared experts, router, LM head) in its own weight dtype (``Inference.part_weight_dtype``: a
released checkpoint keeps some parts wider than its experts); the memory passes between them (norms,
casts to the GEMM dtype, RoPE and MLA's re-expanded keys and values, the MoE permute, activation
and combine reduction, residual adds: ``_inference_ops.*_side_bytes``) are separate memory-bound
kernels whose time adds. In a prefill pass, hidden communication holds
``COMMUNICATION_SM_FRACTION`` of the SMs while it runs, so compute takes that fraction of the
hidden time longer; decode's low-latency all-to-all holds none.

Efficiencies come from the device's shipped calibration (``_common.Calibration``, shared with
training): matmuls at ``matmul_efficiency``, core attention at ``attention_efficiency``. Every
pass, prefill and decode alike, pays the serving engine's per-kernel floor for each kernel it
runs (``_kernels_per_pass``; ``data/serving_profiles.json``): CUDA graphs remove the CPU launch,
not the GPU's launch-to-launch gap and wave tail; two overlapped micro-batches pay it once.
A pass the engine runs without a CUDA graph by default (``ServingProfile.prefill_graphs``,
``graph_max_tokens``: SGLang's extend batches, TensorRT-LLM's context phase, vLLM batches above
its largest captured size) launches each kernel from the host, so it takes at least its kernels
times the host seconds per eager kernel (``eager_pass_host_s``; the host runs ahead of the GPU
asynchronously, so the larger of the two is the pass; the wait is charged to compute).
Where imported operator tables cover the device (``_kernel_curves``), a pass's dense GEMMs
(attention projections, dense FFN, shared experts: ``_inference_ops.*_projections``), prefill
and decode alike, run at the serving engine's measured latency for their shape (M = tokens per
rank, N x K = the rank's slice of each projection; the W8A8 activation quantization included),
a prefill pass's MHA/GQA core attention at the measured causal
FlashAttention-class efficiency by prompt length and (sequence, head) pairs per call
(``_kernel_curves.context_attention_time_s``), a decode step's MHA/GQA core attention at the
serving engine's measured decode-kernel efficiency by context, (sequence, KV head) pairs and
query heads per KV head (``_kernel_curves.decode_attention_time_s``), a decode step's routed
experts (and a prefill pass's without expert parallelism: the engine's fused MoE op,
``_moe_time``) as grouped GEMMs at
their measured efficiency for M = tokens per expert, MLA decode attention at its measured efficiency
by context length, batch and heads per rank and its ``kv_b_proj`` as the two measured batched
GEMMs of the absorbed form, and DeepEP's low-latency all-to-all at its measured latency and bandwidths;
kernels timed by a table pay no per-kernel floor on top (``_measured_kernels_per_pass``).
A TP all-reduce (prefill and decode) over NVLink-connected ranks of one node takes the serving
engine's measured latency for its message size and GPU count (``_kernel_curves.all_reduce_time_s``:
its custom all-reduce kernel, NCCL above its size limit, timed in a CUDA graph) where a table
covers the device, BF16 activations and that GPU count; elsewhere the topology's collective model.
An all-reduce the engine fuses with the residual add and RMSNorm after it (vLLM's -O2
AllReduceFusionPass, ``ServingProfile.fused_allreduce_norm_max_bytes``) takes the table of the
fused kernel's family and launches no norm kernel (``_fused_allreduce_norm``). Expert-parallel
traffic follows the engine's default path (``_expert_comm``): DeepEP's all-to-all, or vLLM's
all-gather / reduce-scatter across attention replicas and none inside one; SGLang runs DeepEP
only where its export launches it (``_engine_paths.sglang_uses_deepep``: ep = the instance) and
otherwise moves no tokens inside an attention replica, gathering over the instance under
attention data parallel (``_sglang_dp_gather_scatter``, TP traffic).

Output columns: ``time.<phase>_<part>`` for parts ``INFERENCE_TIME_PARTS`` (exposed seconds;
they sum to ``step_time_s``) and ``hidden.<phase>_<kind>`` for the communication kinds (seconds
that overlap compute, not in the sum); ``memory.<part>`` for ``INFERENCE_MEMORY_PARTS`` (they sum
to ``memory_per_device_bytes``); ``step_time_s`` (the
decode step, or the prefill pass for a prefill pool), ``ttft_s`` / ``tpot_s`` (NaN where the
phase has none; percentiles and the load in ``_inference_load``'s columns), ``tokens_per_s_per_device`` (output tokens, or input tokens including cache
hits for a prefill pool), ``prefill_tokens_per_s_per_device``, ``decode_tokens_per_s_per_device``,
``batch_size``, ``memory_capacity_bytes``, ``feasible`` and ``reason`` (``_common.REASON_CODES``:
the largest memory part when memory does not fit, else the missed SLO).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property, partial
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

import numpy as np

from cost_model import _inference_ops as ops
from cost_model._common import (
    Calibration,
    EstimateOptions,
    StageLayout,
    collective_time_s,
    op_time_s,
    parameters_per_device,
    ranks_per_node,
    stage_layout,
)
from cost_model._engine_paths import attention_replicas, instance_size, sglang_uses_deepep
from cost_model._kernel_curves import (
    DECODE_ATTENTION_KV_DTYPES,
    DEVICE_ALIASES,
    all_reduce_time_s,
    context_attention_time_s,
    decode_attention_time_s,
    deepep_low_latency_s,
    expert_all_to_all_bytes,
    gemm_curve_dtype,
    gemm_efficiency,
    grouped_experts_time_s,
    grouped_gemm_efficiency,
    kernel_curves,
    mla_bmm_time_s,
    mla_efficiency,
    mla_time_s,
    projections_time_s,
)
from cost_model._model_spec import ModelSpec
from cost_model._rows import RowPartition
from cost_model._serving_columns import (
    A2A_BACKEND_CODES,
    KV_DTYPE_CODES,
    PHASE_CODES,
    checked_columns,
)
from cost_model._serving_load import ServingProfile, serving_profile
from cost_model._serving_precision import check_serving_precision
from cost_model._table import table_length
from cost_model._training_ops import kernels_per_layer
from cost_model._units import dtype_bytes
from cost_model._workload import Inference

if TYPE_CHECKING:
    from topology import Cluster, HardwareSpec

INFERENCE_TIME_PARTS: tuple[str, ...] = (
    "compute",
    "attention",
    "tp_comm",
    "ep_comm",
    "cp_comm",
    "pp_comm",
)
INFERENCE_MEMORY_PARTS: tuple[str, ...] = (
    "weights",
    "kv_cache",
    "activations",
    "comm_buffers",
    "fragmentation",
)
_COMM_PARTS = ("tp_comm", "ep_comm", "cp_comm", "pp_comm")
#: MoE combine runs in bf16 even when the dispatch is fp8 (DeepSeek-V3 report sec. 3.3; DeepEP).
COMBINE_BYTES = 2.0


@dataclass(frozen=True)
class _Setup:
    """What every pass of one evaluation shares (arrays of shape (n,) unless said)."""

    model: ModelSpec
    cluster: Cluster
    workload: Inference
    calibration: Calibration
    table: Mapping[str, np.ndarray]
    layout: StageLayout
    group_local: dict[str, np.ndarray]
    parameters: dict[str, np.ndarray]  # (3, n) per part
    kv_element_bytes: np.ndarray
    two_batch: np.ndarray
    phase: np.ndarray
    fragmentation_fraction: float
    routing_imbalance: (
        float  # measured busiest-rank / mean expert load, at least the uniform excess
    )
    kernels_per_layer: tuple[float, float]  # (dense, MoE) layer, forward
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    profile: ServingProfile

    def column(self, name: str) -> np.ndarray:
        """A table column as float64, converted once."""
        cache = self.__dict__.setdefault("_columns", {})
        if name not in cache:
            cache[name] = np.asarray(self.table[name], dtype=np.float64)
        return cache[name]

    @property
    def hardware(self) -> HardwareSpec:
        return self.cluster.device

    @cached_property
    def attention_dp(self) -> np.ndarray:
        return np.asarray(self.table["attention_data_parallel"], dtype=bool)

    @cached_property
    def shard(self) -> np.ndarray:
        return np.where(self.attention_dp, 1.0, self.column("tp"))

    @cached_property
    def stage_ranks(self) -> np.ndarray:
        return self.column("dp") * self.column("cp") * self.column("tp")

    @cached_property
    def replicas(self) -> np.ndarray:
        return self.stage_ranks / (self.column("cp") * self.shard)

    @cached_property
    def rows(self) -> RowPartition:
        """Rows alike in every collective priced so far (``_rows.RowPartition``)."""
        return RowPartition(self.phase.shape[0])


def _setup(
    *,
    model: ModelSpec,
    cluster,
    workload: Inference,
    table: Mapping[str, np.ndarray],
    options: EstimateOptions,
    prompt_tokens=None,
) -> _Setup:
    """Shared arrays of one evaluation. ``prompt_tokens`` (per row) overrides the workload's."""
    if workload.kind != "inference":
        raise ValueError(
            f"workload.kind ({workload.kind!r}) must be 'inference' for estimate_inference_table"
        )
    table = checked_columns(table, workload)
    n = table_length(table)
    layout = stage_layout(model=model, pp=table["pp"], virtual_stages=table["virtual_stages"])
    local = ranks_per_node(table=table, devices_per_node=cluster.devices_per_node)
    element_bytes = np.array([dtype_bytes(name) for name in KV_DTYPE_CODES])
    prompt = workload.prompt_tokens if prompt_tokens is None else prompt_tokens
    return _Setup(
        model=model,
        cluster=cluster,
        workload=workload,
        calibration=options.calibration_for(cluster.device),
        table=table,
        layout=layout,
        group_local={axis: ranks.astype(np.float64) for axis, ranks in local.items()},
        parameters=parameters_per_device(model=model, table=table, layout=layout),
        kv_element_bytes=element_bytes[np.asarray(table["kv_dtype"], dtype=np.int64)],
        two_batch=np.asarray(table["two_batch_overlap"], dtype=bool),
        phase=np.asarray(table["phase"], dtype=np.int64),
        fragmentation_fraction=options.fragmentation_fraction,
        routing_imbalance=options.routing_imbalance,
        kernels_per_layer=kernels_per_layer(SimpleNamespace(model=model, options=options)),
        prompt_tokens=np.broadcast_to(np.asarray(prompt, dtype=np.float64), (n,)),
        output_tokens=np.full(n, float(workload.output_tokens)),
        profile=serving_profile(workload.serving_engine, workload.serving_engine_version),
    )


# ------------------------------------------------------------------------------ dtypes
def _first_available(hardware, names: tuple[str, ...]) -> str:
    """The first of ``names`` the hardware lists a peak for, else bf16, else its first dtype."""
    for name in (*names, "bf16"):
        if name in hardware.peak_flops:
            return name
    return next(iter(hardware.peak_flops))


def _part_dtype(s: _Setup, part: str) -> str:
    """The weight dtype of ``part`` (``Inference.part_weight_dtype``): a checkpoint may keep
    attention, dense MLPs, shared experts or the LM head in a wider dtype than its experts."""
    return s.workload.part_weight_dtype(part)


def _matmul_dtype(s: _Setup, part: str = "routed_experts", *, weight: str | None = None) -> str:
    """The GEMM dtype of ``part``'s weights. FP8 weights run FP8 GEMMs (W8A8, DeepSeek-V3 sec.
    3.3), NVFP4 weights FP4 GEMMs (W4A4 on Blackwell); int4 weights are weight-only, and so are
    FP8 weights on a device without FP8 tensor cores. A dtype with no such path raises
    (``_serving_precision.check_serving_precision``)."""
    weight = weight or _part_dtype(s, part)
    check_serving_precision(
        weight_dtype=weight, kv_dtype=s.workload.kv_dtype, hardware=s.cluster.device
    )
    chains = {
        "fp8": ("fp8",),
        "fp4": ("fp4",),
        "int8": ("int8", "fp8"),
        "int4": (s.workload.activation_dtype,),
    }
    return _first_available(s.cluster.device, chains.get(weight, (weight,)))


def _attention_dtype(s: _Setup) -> str:
    return _first_available(s.cluster.device, (s.workload.activation_dtype,))


def _cast_bytes(s: _Setup, part: str = "routed_experts") -> float:
    """Bytes of a GEMM input element of ``part``: activations are cast to FP8/INT8 for W8A8
    matmuls."""
    return min(dtype_bytes(_matmul_dtype(s, part)), dtype_bytes(s.workload.activation_dtype))


def _memory_pass(s: _Setup, bytes_moved) -> np.ndarray:
    """Time of memory-bound element-wise kernels moving ``bytes_moved``."""
    return s.rows.evaluate(
        op_time_s,
        flops=0.0,
        bytes_moved=bytes_moved,
        hardware=s.cluster.device,
        dtype=_attention_dtype(s),
        calibration=s.calibration,
    )


def _dispatch_bytes(s: _Setup) -> float:
    """Tokens travel to FP8 experts already quantized (DeepEP FP8 dispatch)."""
    fp8 = _part_dtype(s, "routed_experts") == "fp8" or s.workload.activation_dtype == "fp8"
    return 1.0 if fp8 else dtype_bytes(s.workload.activation_dtype)


# ------------------------------------------------------------------------------ one pass
def _tokens(s: _Setup, p: ops.Pass) -> tuple[np.ndarray, np.ndarray]:
    """Tokens per device on the attention side, and per rank entering the MoE dispatch."""
    per_replica = p.batch * p.new_tokens
    return per_replica / s.column("cp"), per_replica * s.replicas / s.stage_ranks


def _mm(
    s: _Setup, flops, bytes_moved, part: str = "routed_experts", *, dtype: str | None = None
) -> np.ndarray:
    """A roofline matmul of ``part``'s weights (or of weights in ``dtype`` when given)."""
    return s.rows.evaluate(
        op_time_s,
        flops=flops,
        bytes_moved=bytes_moved,
        hardware=s.cluster.device,
        dtype=_matmul_dtype(s, part, weight=dtype),
        calibration=s.calibration,
    )


def _gemms(
    s: _Setup, tokens, projections, shard, *, part: str | None = None, dtype: str | None = None
) -> np.ndarray:
    """The GEMMs of one block of ``part`` over ``tokens`` per device, each projection's split
    width divided by ``shard``, with weights in ``dtype`` (default: the part's weight dtype,
    ``_part_dtype``; the workload's ``weight_dtype`` without a part). Prefill and
    decode alike, every GEMM runs at the serving engine's measured latency for its shape
    (``_kernel_curves.projections_time_s``: M = tokens, N x K = one rank's slice) where its
    operator tables cover the device and dtype; the tables time the activation quantization a
    W8A8 GEMM launches before it (aiconfigurator's SGLang collector times
    ``sglang_per_token_group_quant_fp8`` + DeepGEMM per block-FP8 call, in a CUDA graph), which
    the roofline misses. Devices without tables keep the calibrated roofline."""
    dtype = dtype or (s.workload.weight_dtype if part is None else _part_dtype(s, part))
    measured = s.rows.evaluate(
        partial(projections_time_s, projections=projections),
        hardware=s.cluster.device,
        dtype=_gemm_table_dtype(s, dtype),
        m=np.asarray(tokens, dtype=np.float64),
        shard=np.asarray(shard, dtype=np.float64),
        engine=s.profile.engine,
    )
    if measured is not None:
        return measured
    wb = dtype_bytes(dtype)
    total = np.zeros_like(np.asarray(tokens, dtype=np.float64))
    for n, k, split in projections:
        n_rank = n / shard if split == "n" else np.full_like(shard, float(n))
        k_rank = k / shard if split == "k" else np.full_like(shard, float(k))
        flops, weight_bytes = 2.0 * tokens * n_rank * k_rank, n_rank * k_rank * wb
        total = total + _mm(s, flops, weight_bytes, part or "routed_experts", dtype=dtype)
    return np.asarray(total)


def _gemm_table_dtype(s: _Setup, dtype: str) -> str:
    """The dense GEMM table that prices ``dtype`` weights under the workload's FP8 scaling
    (``_kernel_curves.gemm_curve_dtype``): per-tensor FP8 on its own table where the device has
    one, else on the block-scaled table (the nearer kernel) rather than on no table at all."""
    table = gemm_curve_dtype(dtype, s.workload.fp8_scaling)
    if table != dtype and (
        gemm_efficiency(device_name=s.hardware.name, dtype=table, m=1.0, n=1.0, k=1.0) is None
    ):
        return dtype
    return table


def _attention_gemms(s: _Setup, tokens, *, decode: bool) -> np.ndarray:
    """The GEMMs of one attention block over ``tokens`` per device (``_gemms``). Absorbed MLA
    decode runs ``kv_b_proj`` as its two batched GEMMs over the rank's heads, at their measured
    latency where a table covers the device (``_kernel_curves.mla_bmm_time_s``)."""
    model = s.model
    projections = ops.attention_projections(model)
    bmm = None
    if decode and model.attention.kind == "mla":
        bmm = s.rows.evaluate(
            mla_bmm_time_s,
            device_name=s.hardware.name,
            tokens=np.asarray(tokens, dtype=np.float64),
            heads=model.attention.num_heads / s.shard,
            engine=s.profile.engine,
        )
    if bmm is None:
        return _gemms(s, tokens, projections, s.shard, part="attention")
    kv_up = ops.kv_up_projection(model)
    rest = tuple(projection for projection in projections if projection != kv_up)
    return _gemms(s, tokens, rest, s.shard, part="attention") + bmm


def _compute_time(s: _Setup, p: ops.Pass) -> np.ndarray:
    """Matmuls and element-wise kernels of one pass on each pipeline rank, (3, n) seconds."""
    model, lay, head_bytes = s.model, s.layout, dtype_bytes(_part_dtype(s, "lm_head"))
    act = dtype_bytes(s.workload.activation_dtype)
    attention_tokens, rank_tokens = _tokens(s, p)
    tp = s.column("tp")
    total = lay.layers * _attention_gemms(s, attention_tokens, decode=p.decode)
    dense_tokens = np.where(s.attention_dp, attention_tokens * tp, attention_tokens)
    total = total + lay.dense_layers * _gemms(
        s, dense_tokens, ops.ffn_projections(model, model.ffn_hidden_size), tp, part="dense_ffn"
    )
    total = total + lay.moe_layers * _moe_time(s, attention_tokens, rank_tokens, decode=p.decode)
    head_tokens = p.batch * p.head_tokens / s.column("cp") * np.where(s.attention_dp, tp, 1.0)
    w_head = model.vocab_size * model.hidden_size / tp
    head = _mm(
        s,
        2 * w_head * head_tokens,
        w_head * head_bytes + head_tokens * model.vocab_size / tp * ops.LOGIT_BYTES,
        "lm_head",
    )
    cast = _cast_bytes(s, "attention")
    attention_side = (
        ops.attention_side_bytes(model, decode=p.decode, act=act, cast=cast, shard=s.shard)
        * attention_tokens
    )
    if not p.decode:  # cached prefix tokens re-expanded for explicit-form MLA
        prefix_tokens = p.batch * p.cached_tokens / s.column("cp")
        attention_side = (
            attention_side
            + ops.prefix_expansion_bytes(model, act=act, shard=s.shard) * prefix_tokens
        )
    dense_cast = _cast_bytes(s, "dense_ffn")
    dense_side = ops.dense_ffn_side_bytes(
        model, model.ffn_hidden_size / tp, act=act, cast=dense_cast
    )
    total = total + lay.has_lm_head * head + lay.layers * _memory_pass(s, attention_side)
    total = total + lay.dense_layers * _memory_pass(s, dense_side * dense_tokens)
    # Two overlapped micro-batches run on two streams: one's launch gaps fill with the other's
    # kernels, so a pass pays the floor once, not once per micro-batch.
    kernels = (
        _kernels_per_pass(s)
        - _measured_kernels_per_pass(s, decode=p.decode)
        - _fused_norm_kernels(s, p)
    )
    return total + kernels * s.profile.kernel_floor_s / np.where(s.two_batch, 2.0, 1.0)


#: Kernels of an MoE block inside the fused MoE layer the operator tables time (top-k, permute,
#: the grouped GEMMs, activation, un-permute: ``_training.kernels_per_layer``'s 8 less the router
#: GEMM, which the tables take as input and ``_router_time`` prices as a GEMM).
_FUSED_MOE_KERNELS = 7.0


def _measured_kernels_per_pass(s: _Setup, *, decode: bool) -> np.ndarray | float:
    """Kernels of a pass whose time is a measured operator latency, where ``_kernel_curves``
    covers the device: the dense GEMMs (``_gemms``: attention projections, dense FFN, shared
    experts), in decode also the fused MoE layer and MLA attention. The table's latency already
    holds their launch-to-launch gaps, ramps and tails, so they pay no floor on top."""
    key = f"_measured_kernels_per_pass_{decode}"  # the same for every pass of one setup
    if key not in s.__dict__:
        s.__dict__[key] = _count_measured_kernels(s, decode=decode)
    return s.__dict__[key]


def _count_measured_kernels(s: _Setup, *, decode: bool) -> np.ndarray | float:
    lay, model, device = s.layout, s.model, s.hardware
    kernels: np.ndarray | float = 0.0

    def curves(part: str) -> bool:  # whether ``_gemms`` times the part's GEMMs from a table
        dtype = _gemm_table_dtype(s, _part_dtype(s, part))
        return (
            gemm_efficiency(device_name=device.name, dtype=dtype, m=1.0, n=1.0, k=1.0) is not None
        )

    gemm_curves = curves("attention")
    if gemm_curves:
        kernels = lay.layers * float(len(ops.attention_projections(model)))
    if curves("dense_ffn"):
        kernels = kernels + lay.dense_layers * float(len(ops.ffn_projections(model, 1)))
    if model.moe is not None and model.moe.num_shared_experts and curves("shared_experts"):
        kernels = kernels + lay.moe_layers * float(len(ops.ffn_projections(model, 1)))
    if (
        model.moe is not None
        and gemm_efficiency(
            device_name=device.name, dtype=s.workload.activation_dtype, m=1.0, n=1.0, k=1.0
        )
        is not None
    ):
        kernels = kernels + lay.moe_layers * float(len(ops.router_projections(model)))
    if (
        decode
        and model.moe is not None
        and grouped_gemm_efficiency(
            device_name=device.name,
            dtype=_part_dtype(s, "routed_experts"),
            tokens_per_expert=1.0,
            experts_per_device=1.0,
        )
        is not None
    ):
        kernels = kernels + lay.moe_layers * _FUSED_MOE_KERNELS
    if not decode and model.moe is not None:  # the prefill rows that run the fused MoE op
        kernels = kernels + lay.moe_layers * _FUSED_MOE_KERNELS * _fused_prefill_moe(
            s, decode=False
        )
    if (
        decode
        and model.attention.kind == "mla"
        and not gemm_curves
        and mla_bmm_time_s(device_name=device.name, tokens=1.0, heads=1.0) is not None
    ):
        kernels = kernels + lay.layers * 1.0  # kv_b_proj, run as the measured batched GEMMs
    if (
        decode
        and model.attention.kind == "mla"
        and mla_efficiency(kind="mla_decode", device_name=device.name, tokens=1.0) is not None
    ):
        kernels = kernels + lay.layers * 1.0  # the one fused attention kernel
    if _context_attention_measured(s, decode=decode):
        kernels = kernels + lay.layers * 1.0
    if decode:  # the one decode attention kernel, where its KV dtype is measured
        kernels = kernels + lay.layers * _decode_attention_measured(s).astype(np.float64)
    # the two TP all-reduces per layer, where measured (``_tp_all_reduce``); the scatter and
    # gather of a sequence-parallel MoE layer, or SGLang's gather and return in place of a MoE
    # layer's FFN all-reduce, are modelled collectives (``_comm_times``)
    all_reduces = 2.0 * (lay.layers - lay.moe_layers * _sequence_parallel_moe(s))
    all_reduces = all_reduces - lay.moe_layers * _sglang_dp_gathers(s)
    return kernels + all_reduces * (_all_reduce_measured(s) & ~s.attention_dp)


def _context_attention_measured(s: _Setup, *, decode: bool) -> bool:
    """Whether a pass's MHA/GQA attention is priced from the context-attention curves: prefill,
    full causal attention, a device the tables cover (``_kernel_curves.context_attention_time_s``)."""
    a = s.model.attention
    return (
        not decode
        and a.kind != "mla"
        and a.variant == "full"
        and a.head_dim == 128  # the head size the curves measure
        and s.workload.activation_dtype == "bf16"
        and any(
            c["device"] == DEVICE_ALIASES.get(s.hardware.name, s.hardware.name)
            for c in kernel_curves().get("context_attention", ())
        )
    )


def _decode_attention_measured(s: _Setup) -> np.ndarray:
    """Rows whose decode MHA/GQA attention is priced from the decode-attention curves: full
    attention of head size 128 (the curves' shapes), a device and KV-cache dtype the tables
    cover (``_kernel_curves.decode_attention_time_s``)."""
    if "_decode_attention_measured" not in s.__dict__:  # the same for every pass of one setup
        a = s.model.attention
        device = DEVICE_ALIASES.get(s.hardware.name, s.hardware.name)
        dtypes = {
            c["dtype"]
            for c in kernel_curves().get("decode_attention", ())
            if c["device"] == device
            and a.kind != "mla"
            and a.variant == "full"
            and a.head_dim == 128
        }
        covered = [b for b, dtype in DECODE_ATTENTION_KV_DTYPES.items() if dtype in dtypes]
        s.__dict__["_decode_attention_measured"] = np.isin(s.kv_element_bytes, covered)
    return s.__dict__["_decode_attention_measured"]


def _kernels_per_pass(s: _Setup) -> np.ndarray:
    """Kernels one pass runs on each pipeline rank, (3, n): each layer's compute kernels
    (``_training.kernels_per_layer``) and its collectives (TP all-reduces after attention and
    FFN, or the attention-DP gather/scatter of a dense FFN; EP dispatch and combine). Each pays
    the engine's per-kernel floor, in prefill and decode alike: a CUDA graph removes the CPU
    launch, not the GPU's launch-to-launch gap and wave tail (``data/serving_profiles.json``).
    Run eagerly, each is one host launch (``eager_pass_host_s``). The count matches an engine's
    eager forward for a dense GQA layer (SGLang ``models/llama.py``, read in 0.5.23: fused
    add-norm, QKV GEMM, RoPE, attention with its KV-cache store, output GEMM, all-reduce, fused
    add-norm, gate-up GEMM, SiLU-and-mul, down GEMM, all-reduce: 12 kernels against 12 here) and
    is a lower bound for MLA + MoE layers, where the engine also launches per-GEMM fp8
    activation quantization and MoE alignment kernels and dispatches view and split ops that
    launch none (``models/deepseek_common/attention_forward_methods/forward_mha.py``)."""
    if "_kernels_per_pass" in s.__dict__:  # the same for every pass of one setup
        return s.__dict__["_kernels_per_pass"]
    lay, tp = s.layout, s.column("tp")
    kernels = lay.dense_layers * s.kernels_per_layer[0] + lay.moe_layers * s.kernels_per_layer[1]
    tp_calls = np.where(s.attention_dp, 2.0 * lay.dense_layers, 2.0 * lay.layers) * (tp > 1)
    # SGLang's MoE gather and return, in place of an FFN all-reduce (``_comm_times``)
    replaced = np.where(s.attention_dp | (tp == 1), 0.0, 1.0)
    tp_calls = tp_calls + lay.moe_layers * _sglang_dp_gathers(s) * (2.0 - replaced)
    ep_calls = 2.0 * lay.moe_layers * _expert_collectives(s)
    s.__dict__["_kernels_per_pass"] = kernels + tp_calls + ep_calls
    return s.__dict__["_kernels_per_pass"]


def eager_kernel_host_s(s: _Setup) -> float:
    """Host seconds to launch one kernel of a pass run without a CUDA graph: the device profile's
    measured eager dispatch time (``autoparallel profile``) where it has one, else the serving
    engine's default (``ServingProfile.eager_kernel_host_s``, cited in its data)."""
    measured = getattr(s.hardware, "eager_op_host_s", None)
    return s.profile.eager_kernel_host_s if measured is None else float(measured)


def eager_pass_host_s(s: _Setup) -> np.ndarray:
    """Host seconds to launch one pass's kernels eagerly, (n,): the kernels of the rank that
    launches the most (``_kernels_per_pass``; two overlapped micro-batches launch theirs each)
    times ``eager_kernel_host_s``, on each of the ``pp`` micro-batches in flight. The host runs
    ahead of the GPU, so an eager pass takes the larger of this and its GPU time
    (``_serving_load.IterationCost``)."""
    kernels = np.max(_kernels_per_pass(s), axis=0) * np.where(s.two_batch, 2.0, 1.0)
    return s.column("pp") * kernels * eager_kernel_host_s(s)


def _host_bound(s: _Setup, exposed: dict[str, np.ndarray], eager) -> dict[str, np.ndarray]:
    """``exposed`` parts of a pass with the launch time an eager pass waits beyond its GPU time
    (``eager_pass_host_s``) added to its compute part, where ``eager``."""
    shortfall = np.maximum(eager_pass_host_s(s) - sum(exposed.values()), 0.0)
    return {**exposed, "compute": exposed["compute"] + np.where(eager, shortfall, 0.0)}


def pass_runs_eagerly(s: _Setup, p: ops.Pass) -> np.ndarray:
    """Whether the engine runs pass ``p`` without a CUDA graph by default, (n,): a prefill pass
    where it graphs decode only, or a pass of more tokens per forward than its largest graph."""
    tokens = p.batch * p.new_tokens  # per attention replica, the batch one forward holds
    prompts = (not p.decode) and not s.profile.prefill_graphs
    return (tokens > s.profile.graph_max_tokens) | prompts


def _moe_time(
    s: _Setup, attention_tokens: np.ndarray, rank_tokens: np.ndarray, *, decode: bool = True
) -> np.ndarray:
    """Router, shared experts and routed experts of one MoE layer, (n,) seconds.

    Decode steps price the routed experts as the grouped GEMMs that run (``_grouped_experts_time``:
    M = tokens per expert, measured curves). So does a prefill pass without expert parallelism
    (``_fused_prefill_moe``): its tokens never leave the rank, and the engine runs the fused MoE
    op the tables time (SGLang on Blackwell: FlashInfer's TRT-LLM MoE, routing through the
    weighted combine in one call, ``layers/moe/moe_runner/flashinfer_trtllm.py``; the Triton
    ``fused_moe`` elsewhere), so the combine passes of ``moe_token_bytes`` are in the measured
    op. A prefill pass with ep > 1 keeps the calibrated roofline: its experts run DeepGEMM's
    contiguous-layout grouped GEMM behind DeepEP's normal kernels, which reaches about 0.75 of FP8
    peak at large M (DeepGEMM README, H800), while the imported tables' large-M kernels (TRT-LLM
    CUTLASS, Triton) measure 0.3-0.5; until DeepGEMM's own tables are imported the imported
    curves would misprice it."""
    model, moe = s.model, s.model.moe
    if moe is None:
        return np.zeros_like(attention_tokens)
    wb = dtype_bytes(_part_dtype(s, "routed_experts"))
    act = dtype_bytes(s.workload.activation_dtype)
    ep, etp = s.column("ep"), s.column("etp")
    # the gate runs replicated on the hidden states a rank holds after attention: every token
    # of its replica under tensor parallelism (SGLang ``Qwen3MoeSparseMoeBlock.gate``, a
    # ``ReplicatedLinear``), its own under attention data parallelism
    router = _gemms(
        s,
        attention_tokens,
        ops.router_projections(model),
        np.ones_like(attention_tokens),
        part="router",
        dtype=s.workload.weight_dtype_by_part.get("router", s.workload.activation_dtype),
    )
    shared = _gemms(
        s,
        attention_tokens,
        ops.ffn_projections(model, moe.num_shared_experts * moe.shared_ffn_size),
        s.shard,
        part="shared_experts",
    )
    group_tokens = rank_tokens * ep * etp
    mean_assignments = group_tokens * moe.top_k / ep
    assignments = mean_assignments * np.maximum(
        s.rows.evaluate(ops.max_load_factor, mean_load=mean_assignments, num_bins=ep),
        s.routing_imbalance,
    )
    w_expert = model.ffn_parameters(moe.expert_ffn_hidden_size) / etp
    slots = (moe.num_routed_experts + s.column("num_redundant_experts")) / ep
    touched = s.rows.evaluate(
        ops.experts_touched_fraction,
        tokens=group_tokens,
        top_k=moe.top_k,
        num_experts=moe.num_routed_experts,
    )
    cast = _cast_bytes(s)
    side = ops.routed_bytes_per_assignment(model, act=act, cast=cast, etp=etp)
    token_passes = _memory_pass(
        s, ops.moe_token_bytes(model, act=act, cast=cast, shard=s.shard) * attention_tokens
    )
    measured = None
    fused = _fused_prefill_moe(s, decode=decode)
    # M = tokens per expert slot on the busiest rank; the expert width split over etp. The best
    # kernel over engines, not the serving engine's: the operator tables time one MoE backend per
    # engine version (SGLang's reaches 2% of peak at 256 tokens per expert on 2 experts per
    # device), not the DeepGEMM / CUTLASS kernels a deployment selects for its shape.
    if decode or np.any(fused):
        measured = s.rows.evaluate(
            grouped_experts_time_s,
            hardware=s.cluster.device,
            dtype=_part_dtype(s, "routed_experts"),
            tokens_per_expert=assignments / slots,
            experts_per_device=slots,
            touched_fraction=touched,
            side_bytes_per_assignment=side,
            hidden_size=model.hidden_size,
            expert_ffn_size=moe.expert_ffn_hidden_size / etp,
        )
    if measured is not None and decode:
        return router + shared + measured + token_passes
    routed = _mm(s, 2 * w_expert * assignments, slots * touched * w_expert * wb)
    roofline = router + shared + routed + _memory_pass(s, side * assignments) + token_passes
    if measured is None:
        return roofline
    outside_op = _memory_pass(  # the fused op writes the combined output itself
        s,
        (
            ops.moe_token_bytes(model, act=act, cast=cast, shard=s.shard)
            - ops.moe_combine_bytes(model, act=act)
        )
        * attention_tokens,
    )
    return np.where(fused, router + shared + measured + outside_op, roofline)


def _fused_prefill_moe(s: _Setup, *, decode: bool) -> np.ndarray:
    """Rows whose prefill pass runs its routed experts as the engine's fused MoE op at its
    measured latency (``_moe_time``), (n,) bool: prefill, no expert parallelism (each rank runs
    every expert's etp slice over all its tokens: no all-to-all, no DeepEP), and grouped-GEMM
    curves for the device and weight dtype."""
    ep = s.column("ep")
    if decode or s.model.moe is None or not np.any(ep == 1):
        return np.zeros(ep.shape, dtype=bool)
    covered = (
        grouped_gemm_efficiency(
            device_name=s.hardware.name,
            dtype=s.workload.weight_dtype,
            tokens_per_expert=1.0,
            experts_per_device=1.0,
        )
        is not None
    )
    return (ep == 1) & covered


def _attention_time(s: _Setup, p: ops.Pass) -> np.ndarray:
    """Core attention (scores and values) of one layer, (n,) seconds."""
    model = s.model
    queries = p.batch * p.new_tokens / (s.column("cp") * s.shard)
    spread = (
        1.0 if p.decode else 1.0 + s.workload.prompt_tokens_cv**2
    )  # E[P^2]/E[P]^2 of the prompt mix
    keys = ops.mean_attended_between(
        model, p.cached_tokens * spread + 1.0, (p.cached_tokens + p.new_tokens) * spread
    )
    flops = queries * keys * ops.attention_flops_per_key(model, decode=p.decode)
    if not p.decode:
        prefix = p.batch * p.cached_tokens / (s.column("cp") * s.shard)
        flops = flops + prefix * ops.prefix_upprojection_flops_per_token(model)
    kv_fraction = 1.0 / (ops.kv_head_split(model, s.shard) * s.column("cp"))
    read_tokens = ops.kv_read_tokens(model, p.cached_tokens + p.new_tokens)
    kv_read = p.batch * ops.kv_bytes_per_sequence_layer(
        model, read_tokens, s.kv_element_bytes, block_tokens=1
    )
    if (
        p.decode and model.attention.kind == "mla"
    ):  # FlashMLA-class kernels at their measured efficiency (prefill: see _kernel_curves)
        # one call per rank: all its sequences, over its share of the heads and of each context
        # (cp); every head reads the sequence's whole latent, so the bytes are all sequences'
        measured = s.rows.evaluate(
            mla_time_s,
            kind="mla_decode",
            hardware=s.cluster.device,
            dtype=_attention_dtype(s),
            flops=flops,
            bytes_moved=kv_read * kv_fraction,
            tokens=read_tokens / s.column("cp"),
            batch=p.batch,
            heads=model.attention.num_heads / s.shard,
            # the workload's named kernel, else the serving engine's own where measured
            engine=s.workload.mla_decode_kernel or s.profile.engine,
        )
        if measured is not None:  # (prefill keeps the calibrated efficiency: see _kernel_curves)
            return measured
    measured_decode = _decode_attention_measured(s) if p.decode else None
    if measured_decode is not None and measured_decode.any():
        # one call per rank: its sequences times its KV heads (a KV head replicated over the
        # ranks past the KV-head count is one per rank), each with its group of query heads
        kv_heads = model.attention.num_kv_heads / ops.kv_head_split(model, s.shard)
        decode_measured = s.rows.evaluate(
            decode_attention_time_s,
            hardware=s.cluster.device,
            flops=flops,
            bytes_moved=kv_read * kv_fraction,
            tokens=read_tokens / s.column("cp"),
            units=p.batch * kv_heads,
            group=model.attention.num_heads / s.shard / kv_heads,
            kv_element_bytes=s.kv_element_bytes,
            engine=s.profile.engine,
        )
        if measured_decode.all():
            return decode_measured
    if _context_attention_measured(s, decode=p.decode):
        # one call per rank: its sequences times its query heads; the prompt's full length
        # (the cached prefix too) is the length the kernel attends over
        measured = s.rows.evaluate(
            context_attention_time_s,
            hardware=s.cluster.device,
            flops=flops,
            bytes_moved=kv_read * kv_fraction,
            tokens=read_tokens / s.column("cp"),
            units=p.batch * model.attention.num_heads / s.shard,
            engine=s.profile.engine,
            kv_element_bytes=s.kv_element_bytes,
        )
        if measured is not None:
            return measured
    roofline = s.rows.evaluate(
        op_time_s,
        flops=flops,
        bytes_moved=kv_read * kv_fraction,
        hardware=s.cluster.device,
        dtype=_attention_dtype(s),
        calibration=s.calibration,
        kind="attention",
    )
    if measured_decode is not None and measured_decode.any():
        return np.where(measured_decode, decode_measured, roofline)
    return roofline


def _collective(s: _Setup, op: str, axis: str, group, message) -> np.ndarray:
    local = np.minimum(s.group_local[axis], group)
    return collective_time_s(
        cluster=s.cluster,
        op=op,
        group_size=group,
        ranks_per_node=local,
        message_bytes=message,
        calibration=s.calibration,
        rows=s.rows,
    )


def _all_reduce_measured(s: _Setup) -> np.ndarray:
    """Rows whose TP all-reduce takes a measured latency (``_tp_all_reduce``), (n,) bool: tp > 1
    within one node, BF16-sized activations, and a table for the device at that GPU count."""
    if "_all_reduce_measured" not in s.__dict__:
        tp = s.column("tp")
        covered = (tp > 1) & (s.group_local["tp"] >= tp)
        measured = None
        if dtype_bytes(s.workload.activation_dtype) == 2.0 and np.any(covered):
            measured = all_reduce_time_s(
                device_name=s.hardware.name, group=tp, message_bytes=1.0, engine=s.profile.engine
            )
        s.__dict__["_all_reduce_measured"] = (
            np.zeros(tp.shape, dtype=bool) if measured is None else covered & ~np.isnan(measured)
        )
    return s.__dict__["_all_reduce_measured"]


#: The imported all-reduce table of the kernel family behind FlashInfer's ``allreduce_fusion``,
#: which vLLM's AllReduceFusionPass calls: TensorRT-LLM's all-reduce(-fusion) kernels, which
#: FlashInfer ported (aiconfigurator times TensorRT-LLM's ``AllReduce``, AUTO strategy, in a CUDA
#: graph; ``collector/collect_all_reduce.py``). vLLM's own table times its unfused custom
#: all-reduce (aiconfigurator ``sdk/models/deepseek.py``: "collect_all_reduce.py benchmarks
#: vLLM's native allreduce").
FUSED_ALLREDUCE_TABLE = "trtllm"


def _fused_allreduce_norm(s: _Setup, message) -> np.ndarray:
    """Rows whose TP all-reduce of ``message`` bytes per rank runs fused with the residual add
    and RMSNorm after it, (n,) bool: the engine fuses all-reduces of that size at that tp
    (``ServingProfile.fused_allreduce_norm_max_bytes``: vLLM's -O2 AllReduceFusionPass) and the
    all-reduce is a measured one (``_all_reduce_measured``)."""
    tp = s.column("tp")
    limit = np.zeros_like(tp)
    for size, max_bytes in s.profile.fused_allreduce_norm_max_bytes.items():
        limit = np.where(tp == size, max_bytes, limit)
    return _all_reduce_measured(s) & ~s.attention_dp & (np.asarray(message) <= limit)


def _fused_norm_kernels(s: _Setup, p: ops.Pass) -> np.ndarray:
    """Kernels a pass does not launch because its all-reduces absorb them, (3, n): the residual
    add + RMSNorm after each of a layer's two TP all-reduces (``_fused_allreduce_norm``)."""
    attention_tokens, _ = _tokens(s, p)
    message = attention_tokens * s.model.hidden_size * dtype_bytes(s.workload.activation_dtype)
    lay = s.layout  # sequence-parallel MoE layers have no all-reduce (``_sequence_parallel_moe``)
    all_reducing = lay.layers - lay.moe_layers * _sequence_parallel_moe(s)
    return 2.0 * all_reducing * _fused_allreduce_norm(s, message)


def _tp_all_reduce(s: _Setup, message) -> np.ndarray:
    """One TP all-reduce of ``message`` bytes per rank, (n,) seconds: the serving engine's
    measured latency where ``_all_reduce_measured``, which holds the kernel (it pays no
    per-kernel floor on top: ``_measured_kernels_per_pass``); else the collective model. An
    all-reduce the engine fuses with the norm after it (``_fused_allreduce_norm``) takes the
    latency of the fused kernel's family (``FUSED_ALLREDUCE_TABLE``) where that table measured
    the group size."""
    tp, measured_rows = s.column("tp"), _all_reduce_measured(s)
    modelled = None
    if not np.all(measured_rows):
        modelled = _collective(s, "all_reduce", "tp", tp, message)
    if not np.any(measured_rows):
        assert modelled is not None
        return modelled
    message = np.broadcast_to(np.asarray(message, dtype=np.float64), tp.shape)

    def table(engine: str) -> np.ndarray:
        return s.rows.evaluate(
            all_reduce_time_s,
            device_name=s.hardware.name,
            group=tp,
            message_bytes=message,
            engine=engine,
        )

    measured = table(s.profile.engine)
    fused = _fused_allreduce_norm(s, message)
    if np.any(fused):
        kernel = table(FUSED_ALLREDUCE_TABLE)
        measured = np.where(fused & ~np.isnan(kernel), kernel, measured)
    return measured if modelled is None else np.where(measured_rows, measured, modelled)


def _expert_all_to_all(
    s: _Setup, rank_tokens: np.ndarray, element_bytes: float, *, node_dedup, direction: str
) -> np.ndarray:
    """One MoE dispatch (or combine) as DeepEP runs it: every rank writes straight to its peers,
    NVLink and RDMA at once, so the time is the slower tier's bytes over its bandwidth plus one
    latency (DeepEP README; not the n-1 rounds of a pairwise all-to-all); the bytes per tier are
    ``_kernel_curves.expert_all_to_all_bytes``. Low-latency kernels (``node_dedup`` False) take
    the latency and tier efficiencies fitted on DeepEP's measured low-latency kernels
    (``_kernel_curves.deepep_low_latency_s``); normal kernels are priced by the topology as
    point-to-point transfers on each tier."""
    assert s.model.moe is not None
    ep = s.column("ep")
    local = np.minimum(s.group_local["ep"], ep)
    intra_bytes, inter_bytes = s.rows.evaluate(
        expert_all_to_all_bytes,
        rank_tokens=rank_tokens,
        hidden_size=s.model.hidden_size,
        element_bytes=element_bytes,
        copies=s.model.moe.top_k * s.column("etp"),
        ep=ep,
        local=local,
        node_dedup=node_dedup,
    )
    remote = ep > local

    def point_to_point(ranks_per_node, message) -> np.ndarray:
        return collective_time_s(
            cluster=s.cluster,
            op="send_recv",
            group_size=2.0,
            ranks_per_node=ranks_per_node,
            message_bytes=message,
            calibration=s.calibration,
            rows=s.rows,
        )

    seconds = np.maximum(
        point_to_point(2.0, intra_bytes), np.where(remote, point_to_point(1.0, inter_bytes), 0.0)
    )
    measured = deepep_low_latency_s(
        direction=direction,
        intra_bytes=intra_bytes,
        inter_bytes=np.where(remote, inter_bytes, 0.0),
        cluster=s.cluster,
    )
    if measured is not None:
        seconds = np.where(node_dedup, seconds, measured)
    return np.where(ep > 1, seconds, 0.0)


def _deepep_expert_comm(s: _Setup, rank_tokens: np.ndarray, *, decode: bool) -> np.ndarray:
    """DeepEP's dispatch and combine of one MoE layer, (n,) seconds: ``normal`` kernels for a
    prefill pass and ``low_latency`` ones for a decode step unless the ``a2a_backend`` column
    names one."""
    backend = np.asarray(s.table["a2a_backend"], dtype=np.int64)
    normal = np.where(
        backend == A2A_BACKEND_CODES["auto"], not decode, backend == A2A_BACKEND_CODES["normal"]
    )
    # NVFP4 experts take an FP8 dispatch as well (DeepEP dispatches FP8 or BF16 tokens).
    fp4 = _part_dtype(s, "routed_experts") == "fp4"
    dispatch_bytes = 1.0 if fp4 else _dispatch_bytes(s)
    dispatch = _expert_all_to_all(
        s, rank_tokens, dispatch_bytes, node_dedup=normal, direction="dispatch"
    )
    combine = _expert_all_to_all(
        s, rank_tokens, COMBINE_BYTES, node_dedup=normal, direction="combine"
    )
    return dispatch + combine


def _gathered_token_bytes(s: _Setup) -> float:
    """Bytes per token that vLLM's all-gather dispatch moves: the hidden state quantized for the
    experts before the collective (``prepare_finalize/naive_dp_ep.py``
    ``_quantize_and_setup_dispatch``; NVFP4: 4-bit elements plus one FP8 scale per 16-element
    block, gathered unswizzled; FP8 experts: one byte per element, their per-block scales left
    out) and the router's top-k ids and weights (int32 and float32, gathered alongside)."""
    assert s.model.moe is not None
    fp4 = _part_dtype(s, "routed_experts") == "fp4"
    element = 0.5 + 1.0 / 16.0 if fp4 else _dispatch_bytes(s)
    return s.model.hidden_size * element + s.model.moe.top_k * (4.0 + 4.0)


def _experts_span_replicas(s: _Setup) -> np.ndarray:
    """Rows whose expert group (ep x etp ranks) reaches past one attention replica (cp x the
    attention shard), (n,) bool: in vLLM, data parallelism under expert parallelism."""
    return s.column("ep") * s.column("etp") > s.column("cp") * s.shard


def _sequence_parallel_moe(s: _Setup) -> np.ndarray:
    """Rows whose MoE layers vLLM runs sequence-parallel, (n,) bool: expert parallelism across
    attention replicas (data parallel > 1) with tp > 1 and no pipeline
    (``ParallelConfig.use_sequence_parallel_moe``; DeepSeek's decoder layer also requires
    pipeline size 1, ``models/deepseek_v2.py``; read in vLLM 0.33.0). Each tp rank sends its
    1/tp of the replica's tokens to the experts: attention's output is reduce-scattered over the
    tp group instead of all-reduced, and the MoE output all-gathered back
    (``DeepseekV2DecoderLayer.forward``), two collectives in place of the layer's two
    all-reduces."""
    if s.profile.engine != "vllm" or s.model.moe is None:
        return np.zeros(s.shard.shape, dtype=bool)
    return (
        _experts_span_replicas(s)
        & (s.column("ep") > 1)
        & (s.column("tp") > 1)
        & ~s.attention_dp
        & (s.column("pp") == 1)
    )


def _gather_scatter_expert_comm(s: _Setup, rank_tokens: np.ndarray) -> np.ndarray:
    """vLLM's default expert-parallel traffic of one MoE layer, (n,) seconds: an all-gather of
    every EP rank's tokens over the EP group before the experts and a reduce-scatter of their
    BF16 outputs after (``--all2all-backend allgather_reducescatter``, the default of
    ``vllm/config/parallel.py`` ``ParallelConfig.all2all_backend``; ``AgRsAll2AllManager.dispatch``
    / ``.combine`` in ``vllm/distributed/device_communicators/all2all.py``; read in vLLM 0.33.0;
    already the default when vLLM PR #33728 of 2026-02 removed the broadcast-based ``naive``
    backend). vLLM only takes this path when the EP group spans several attention replicas
    (``FusedMoEParallelConfig.use_all2all_kernels``: data parallel > 1): with the experts split
    over the ranks of one tensor-parallel replica every rank already holds all its tokens, runs
    its local experts on them and the layer's TP all-reduce sums the outputs
    (``runner/moe_runner.py`` ``_maybe_reduce_final_output``), which ``tp_comm`` prices."""
    ep = s.column("ep")
    gathered = rank_tokens * ep  # the EP group's tokens, which every rank receives
    gather = _collective(s, "all_gather", "ep", ep, gathered * _gathered_token_bytes(s))
    scatter = _collective(
        s, "reduce_scatter", "ep", ep, gathered * s.model.hidden_size * COMBINE_BYTES
    )
    return np.where(_experts_span_replicas(s) & (ep > 1), gather + scatter, 0.0)


#: The largest gathered decode buffer SGLang gathers and combines with two all-reduces: its
#: custom all-reduce's workspace cap, ``SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB`` = 16 MiB by
#: default (``srt/environ.py``; ``CustomAllReduceV2.max_size`` in
#: ``srt/distributed/device_communicators/custom_all_reduce_v2.py``, which the tuned per-world-size
#: workspaces of Hopper and Blackwell do not lower; read in SGLang 0.5.23).
SGLANG_DP_ALL_REDUCE_MAX_BYTES = 16.0 * 2**20


def _sglang_deepep(s: _Setup) -> np.ndarray:
    """Rows SGLang runs through DeepEP, (n,) bool: the predicate its export launches
    ``--moe-a2a-backend deepep`` by (``_engine_paths.sglang_uses_deepep``)."""
    return sglang_uses_deepep(tp=s.column("tp"), ep=s.column("ep"), etp=s.column("etp"))


def _sglang_dp_gathers(s: _Setup) -> np.ndarray:
    """Rows whose MoE layers SGLang runs on the tokens of every attention replica of the
    instance, (n,) bool: attention data parallel (``--attn-dp-size`` > 1) without DeepEP. The
    default ``--moe-a2a-backend none`` (``StandardDispatcher``) moves no tokens, so the layer's
    input is gathered over the TP group before the experts (``dp_gather_partial`` in
    ``srt/layers/dp_attention.py``) and brought back after (``layer_boundary/exit.py``)."""
    if "_sglang_dp_gathers" in s.__dict__:  # the same for every pass of one setup
        return s.__dict__["_sglang_dp_gathers"]
    gathers = np.zeros(s.shard.shape, dtype=bool)
    if s.profile.engine == "sglang" and s.model.moe is not None:
        replicas = attention_replicas(
            tp=s.column("tp"),
            ep=s.column("ep"),
            etp=s.column("etp"),
            attention_data_parallel=s.attention_dp,
        )
        gathers = (replicas > 1) & ~_sglang_deepep(s)
    s.__dict__["_sglang_dp_gathers"] = gathers
    return gathers


def _sglang_dp_gather_return(s: _Setup, gathered: np.ndarray, group, *, decode: bool) -> np.ndarray:
    """SGLang's gather of one layer's FFN input over ``group`` ranks under attention data
    parallel and the return of its summed output, (n,) seconds, for a ``gathered`` buffer of
    bytes. Every layer of a forward follows the batch's padding mode
    (``DpPaddingMode.get_dp_padding_mode``, ``srt/layers/dp_attention.py``, read in SGLang
    0.5.23): an extend (prefill) batch over several replicas is ``SUM_LEN``, and so is a decode
    batch whose gathered buffer fits the custom all-reduce without an a2a MoE backend
    (``_decode_sum_len_fits_custom_all_reduce``: ``--moe-a2a-backend none``, one NVLink node,
    ``SGLANG_DP_ALL_REDUCE_MAX_BYTES``): the gather is an all-reduce of the zero-padded buffer
    (``_dp_gather_via_all_reduce``) and the return an all-reduce and a local slice
    (``all_reduce_to_dp_local``, as ``_select_dp_reduce_scatter`` in
    ``srt/layers/layer_boundary/exit.py`` picks no reduce-scatter outside ``MAX_LEN``). Any
    other even decode batch is ``MAX_LEN`` (the cost-based choice, ``sum_len * 2 >= max_len *
    width``): an all-gather (``_dp_gather_via_all_gather``) and a reduce-scatter
    (``dp_reduce_scatter_tensor``). Both move hidden states in the activation dtype (the FP8
    gather is opt-in: ``SGLANG_ENABLE_DP_GATHER_FP8``, off by default)."""
    one_node = group <= s.cluster.devices_per_node

    def collective(op: str) -> np.ndarray:
        return collective_time_s(
            cluster=s.cluster,
            op=op,
            group_size=group,
            ranks_per_node=np.minimum(group, s.cluster.devices_per_node),
            message_bytes=gathered,
            calibration=s.calibration,
            rows=s.rows,
        )

    all_reduces = 2.0 * collective("all_reduce")
    fits = one_node & (gathered <= SGLANG_DP_ALL_REDUCE_MAX_BYTES) & ~_sglang_deepep(s)
    sum_len = (not decode) | fits
    if np.all(sum_len):
        return all_reduces
    return np.where(sum_len, all_reduces, collective("all_gather") + collective("reduce_scatter"))


def _sglang_dp_gather_scatter(s: _Setup, rank_tokens: np.ndarray, *, decode: bool) -> np.ndarray:
    """SGLang's gather of one MoE layer's input over the instance (its TP group) and the
    return of the summed expert outputs, (n,) seconds, on ``_sglang_dp_gathers`` rows; the sum
    over the EP and MoE-tp ranks rides on the return. The collectives follow SGLang's padding
    mode (``_sglang_dp_gather_return``)."""
    instance = instance_size(tp=s.column("tp"), ep=s.column("ep"), etp=s.column("etp"))
    gathered = (
        rank_tokens * instance * s.model.hidden_size * dtype_bytes(s.workload.activation_dtype)
    )
    return _sglang_dp_gather_return(s, gathered, instance, decode=decode)


def _sglang_expert_comm(s: _Setup, rank_tokens: np.ndarray, *, decode: bool) -> np.ndarray:
    """SGLang's EP traffic of one MoE layer, (n,) seconds, on the path its export launches:
    DeepEP where ``_sglang_deepep``; else none. Under ``--moe-a2a-backend none`` each rank of
    an attention replica holds all its tokens and maps their top-k ids to its local experts
    (``StandardDispatcher.dispatch``, ``srt/layers/moe/token_dispatcher/standard.py``), and one
    all-reduce over the TP group sums the EP and MoE-tp partial outputs
    (``post_experts_all_reduce``, ``srt/layers/moe/utils.py``: one TP all-reduce when the MoE
    data-parallel size is 1): the layer's FFN all-reduce, or under attention data parallel the
    gather and return of ``_sglang_dp_gather_scatter``, both TP-group traffic (``_comm_times``)."""
    deepep = _sglang_deepep(s)
    if not np.any(deepep):
        return np.zeros(deepep.shape)
    return np.where(deepep, _deepep_expert_comm(s, rank_tokens, decode=decode), 0.0)


def _expert_collectives(s: _Setup) -> np.ndarray:
    """Rows whose MoE layers launch an EP dispatch and combine, (n,) bool, the rows
    ``_expert_comm`` prices traffic on: SGLang's DeepEP rows (``_sglang_expert_comm``); vLLM's
    expert-parallel rows whose experts span attention replicas, as vLLM launches its all2all
    kernels only with data parallel > 1 (``FusedMoEParallelConfig.use_all2all_kernels``,
    ``model_executor/layers/fused_moe/config.py``; read in vLLM 0.33.0) and inside one replica
    launches none (``_gather_scatter_expert_comm``); every expert-parallel row of the other
    engines."""
    if s.profile.engine == "sglang":
        return _sglang_deepep(s)
    if s.profile.engine == "vllm":
        return _experts_span_replicas(s) & (s.column("ep") > 1)
    return s.column("ep") > 1


def _expert_comm(s: _Setup, rank_tokens: np.ndarray, *, decode: bool) -> np.ndarray:
    """EP traffic of one MoE layer, (n,) seconds, on the serving engine's default path:
    vLLM's all-gather / reduce-scatter (``_gather_scatter_expert_comm``) unless the
    ``a2a_backend`` column names DeepEP kernels (vLLM's ``deepep_high_throughput`` /
    ``deepep_low_latency`` backends, which it too uses only across attention replicas);
    SGLang's DeepEP or gather / return (``_sglang_expert_comm``); DeepEP for the other engines
    (``_deepep_expert_comm``)."""
    if s.profile.engine == "sglang":
        return _sglang_expert_comm(s, rank_tokens, decode=decode)
    deepep = _deepep_expert_comm(s, rank_tokens, decode=decode)
    if s.profile.engine != "vllm":
        return deepep
    auto = np.asarray(s.table["a2a_backend"], dtype=np.int64) == A2A_BACKEND_CODES["auto"]
    priced = np.where(auto, _gather_scatter_expert_comm(s, rank_tokens), deepep)
    return np.where(_expert_collectives(s), priced, 0.0)


def _comm_times(s: _Setup, p: ops.Pass) -> dict[str, np.ndarray]:
    """TP, EP, CP and PP traffic of one pass on each pipeline rank, (3, n) seconds.

    TP attention all-reduces after attention and after the FFN of every layer (Megatron); under
    attention-DP only the tp-sharded dense FFN gathers its tokens and scatters them back (in
    SGLang by the batch's padding mode, ``_sglang_dp_gather_return``). SGLang's MoE layers
    without DeepEP gather and return over the instance under attention data parallel
    (``_sglang_dp_gather_scatter``), in place of their FFN all-reduce.
    """
    model, lay = s.model, s.layout
    act, h = dtype_bytes(s.workload.activation_dtype), model.hidden_size
    tp, cp = s.column("tp"), s.column("cp")
    attention_tokens, rank_tokens = _tokens(s, p)
    zero = np.zeros(lay.layers.shape)
    tp_time = all_reduce = zero
    if np.any((tp > 1) & ~s.attention_dp):
        all_reduce = _tp_all_reduce(s, attention_tokens * h * act)
        tp_time = np.where(s.attention_dp, 0.0, 2 * lay.layers * all_reduce)
        sequence_parallel = _sequence_parallel_moe(s)
        if np.any(sequence_parallel):  # MoE layers scatter and gather instead of all-reducing
            message = attention_tokens * h * act
            scatter_gather = _collective(s, "reduce_scatter", "tp", tp, message) + _collective(
                s, "all_gather", "tp", tp, message
            )
            split = 2 * lay.dense_layers * all_reduce + lay.moe_layers * scatter_gather
            tp_time = np.where(sequence_parallel, split, tp_time)
    if np.any((tp > 1) & s.attention_dp) and model.num_dense_ffn_layers:
        gathered = attention_tokens * tp * h * act
        if s.profile.engine == "sglang":  # the batch's padding mode, as in its MoE layers
            # (the dense FFN is tp-sharded unless ``--moe-dense-tp-size 1``:
            # ``is_dense_ffn_fully_dp``, ``srt/layers/layer_boundary/layout.py``)
            gather_scatter = _sglang_dp_gather_return(s, gathered, tp, decode=p.decode)
        else:
            gather = _collective(s, "all_gather", "tp", tp, gathered)
            gather_scatter = gather + _collective(s, "reduce_scatter", "tp", tp, gathered)
        tp_time = np.where(s.attention_dp, lay.dense_layers * gather_scatter, tp_time)
    gathers = _sglang_dp_gathers(s)
    if np.any(gathers):  # SGLang's MoE layers gather and return over the instance instead of
        # all-reducing their FFN output; attention's own all-reduce stays
        moe = _sglang_dp_gather_scatter(s, rank_tokens, decode=p.decode)
        moe = moe - np.where(s.attention_dp | (tp == 1), 0.0, all_reduce)
        tp_time = np.where(gathers, tp_time + lay.moe_layers * moe, tp_time)
    ep_time = zero
    if model.moe is not None and np.any(_expert_collectives(s)):
        ep_time = lay.moe_layers * _expert_comm(s, rank_tokens, decode=p.decode)
    cp_time = zero
    if (
        np.any(cp > 1) and p.decode
    ):  # merge the partial softmax results of each sequence's cp shards
        cp_time = lay.layers * _collective(s, "all_gather", "cp", cp, p.batch * h * act)
    elif np.any(cp > 1):  # ring attention: each cp rank's new-token KV visits the others
        kv_chunk = (
            p.batch
            * p.new_tokens
            / cp
            * model.kv_cache_elements_per_token_per_layer()
            * s.kv_element_bytes
        )
        cp_time = (
            lay.layers * (cp - 1) * _collective(s, "send_recv", "cp", np.minimum(cp, 2.0), kv_chunk)
        )
    pp_time = zero
    if np.any(s.column("pp") > 1):
        pp_time = zero + _collective(
            s, "send_recv", "pp", np.minimum(s.column("pp"), 2.0), rank_tokens * h * act
        )
    return {"tp_comm": tp_time, "ep_comm": ep_time, "cp_comm": cp_time, "pp_comm": pp_time}


def _pass_parts(s: _Setup, p: ops.Pass) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Exposed and hidden seconds of one pass on the slowest pipeline rank, by part, (n,) each.

    With two-batch overlap the pass runs as two half micro-batches (every part costs twice a
    half pass) and TP/EP/CP traffic may hide entirely behind compute; otherwise each kind hides
    up to its calibrated overlap fraction. Hidden traffic never exceeds the compute it hides behind.
    """
    micro_batches = np.where(s.two_batch, 2.0, 1.0)
    micro = p.scaled(1.0 / micro_batches)  # type: ignore[arg-type]  # (n,) factors broadcast
    shape = s.layout.layers.shape
    raw = {
        "compute": micro_batches * _compute_time(s, micro),
        "attention": micro_batches * s.layout.layers * _attention_time(s, micro),
    }
    raw.update(
        {
            kind: micro_batches * np.broadcast_to(t, shape)
            for kind, t in _comm_times(s, micro).items()
        }
    )
    busy = raw["compute"] + raw["attention"]
    fractions = {
        kind: np.where(s.two_batch & (kind != "pp_comm"), 1.0, s.calibration.overlap_fraction(kind))
        for kind in _COMM_PARTS
    }
    hideable = sum(raw[kind] * fractions[kind] for kind in _COMM_PARTS)
    scale = np.minimum(hideable, busy) / np.where(hideable > 0, hideable, 1.0)
    hidden = {kind: raw[kind] * fractions[kind] * scale for kind in _COMM_PARTS}
    exposed = {part: raw[part] - hidden.get(part, 0.0) for part in INFERENCE_TIME_PARTS}
    if not p.decode:  # the hidden traffic's kernels hold SMs: compute runs slower meanwhile
        exposed["compute"] = exposed["compute"] + ops.COMMUNICATION_SM_FRACTION * sum(
            hidden.values()
        )
    slowest = np.argmax(sum(exposed.values()), axis=0) * shape[1] + np.arange(shape[1])
    pp = s.column("pp")

    def pick(values: np.ndarray) -> np.ndarray:
        return pp * np.take(np.broadcast_to(values, shape), slowest)

    return {k: pick(v) for k, v in exposed.items()}, {k: pick(v) for k, v in hidden.items()}


# ------------------------------------------------------------------------------ passes and memory
def _passes(s: _Setup, batch: np.ndarray) -> tuple[ops.Pass, ops.Pass]:
    """The prefill pass (uncached prompt tokens) and a decode step at the mean decode context."""
    ones = np.ones_like(batch, dtype=np.float64)
    cached = np.floor(s.prompt_tokens * s.workload.prefix_cache_hit_rate)
    prefill = ops.Pass(batch, s.prompt_tokens - cached, cached, ones, decode=False)
    outputs = s.output_tokens * (
        1.0 + s.workload.output_tokens_cv**2
    )  # E[O^2]/E[O], token-weighted
    decode_context = s.prompt_tokens + (outputs + 1.0) / 2.0
    decode = ops.Pass(batch, ones, decode_context - 1.0, ones, decode=True)
    return prefill, decode


def _pass_memory(
    s: _Setup, p: ops.Pass, *, moe_chunk_tokens: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Activations and communication buffers of one pass, bytes per device, (n,) each. With
    ``moe_chunk_tokens`` the MoE layer's intermediate buffers hold at most that many of the
    tokens a rank's experts run (an engine that loops its fused MoE over chunks of tokens)."""
    model, act, h = s.model, dtype_bytes(s.workload.activation_dtype), s.model.hidden_size
    tp, etp = s.column("tp"), s.column("etp")
    attention_tokens, rank_tokens = _tokens(s, p)
    head_tokens = p.batch * p.head_tokens / s.column("cp") * np.where(s.attention_dp, tp, 1.0)
    activations = ops.live_activation_elements_per_token(model, s.shard) * attention_tokens * act
    activations = activations + head_tokens * model.vocab_size / tp * ops.LOGIT_BYTES
    buffers = (
        np.where(s.attention_dp, 2 * attention_tokens * tp, 2 * attention_tokens)
        * h
        * act
        * (tp > 1)
    )
    if model.moe is not None:
        copies = rank_tokens * model.moe.top_k * etp
        held = copies
        if moe_chunk_tokens is not None:
            held = np.minimum(rank_tokens * etp, moe_chunk_tokens) * model.moe.top_k
        activations = activations + held * (h + 3.0 * model.moe.expert_ffn_hidden_size / etp) * act
        buffers = buffers + copies * h * (_dispatch_bytes(s) + COMBINE_BYTES) * (s.column("ep") > 1)
    return activations, buffers


def _memory_parts(s: _Setup, batch: np.ndarray) -> dict[str, np.ndarray]:
    """Memory of the fullest pipeline rank by part (``INFERENCE_MEMORY_PARTS``), (n,) each."""
    prefill, decode = _passes(s, batch)
    is_prefill, is_both = s.phase == PHASE_CODES["prefill"], s.phase == PHASE_CODES["both"]
    pre_act, pre_buf = _pass_memory(s, prefill)
    dec_act, dec_buf = _pass_memory(s, decode)
    chunk_act, chunk_buf = _pass_memory(s, prefill.scaled(1.0))
    chunk = 1.0 / s.output_tokens  # colocated: the prompts joining each decode step
    activations = np.where(is_prefill, pre_act, dec_act + is_both * chunk * chunk_act)
    buffers = np.where(is_prefill, pre_buf, np.maximum(dec_buf, is_both * chunk * chunk_buf))
    context = np.where(is_prefill, s.prompt_tokens, decode.cached_tokens + 1.0)
    per_sequence_layer = ops.kv_bytes_per_sequence_layer(
        s.model, context, s.kv_element_bytes, block_tokens=s.workload.kv_block_tokens
    )
    kv_fraction = 1.0 / (ops.kv_head_split(s.model, s.shard) * s.column("cp"))
    kv = s.layout.layers * (batch * s.column("pp") * per_sequence_layer * kv_fraction)
    weights = sum(count * dtype_bytes(_part_dtype(s, part)) for part, count in s.parameters.items())
    stages = {
        "weights": weights,
        "kv_cache": kv,
        "activations": np.broadcast_to(activations, kv.shape),
        "comm_buffers": np.broadcast_to(buffers, kv.shape),
    }
    subtotal = sum(stages.values())
    fullest = np.argmax(subtotal, axis=0)[None, :]
    parts = {k: np.take_along_axis(np.asarray(v), fullest, axis=0)[0] for k, v in stages.items()}
    parts["fragmentation"] = s.fragmentation_fraction * sum(parts.values())
    return parts


@dataclass(frozen=True)
class _Timing:
    """Time columns of one batch choice: parts, prefill pass, decode step and step (n,)."""

    time: dict[str, np.ndarray]
    hidden: dict[str, np.ndarray]
    prefill_s: np.ndarray
    decode_s: np.ndarray
    step_s: np.ndarray


def _timing(s: _Setup, batch: np.ndarray) -> _Timing:
    """Both passes at ``batch``, weighted by phase into the step (see the module docstring).
    A colocated row's TTFT and TPOT come from its load (``_inference_load``), not from here."""
    prefill, decode = _passes(s, batch)
    pre_exposed, pre_hidden = _pass_parts(s, prefill)
    dec_exposed, dec_hidden = _pass_parts(s, decode)
    pre_exposed = _host_bound(s, pre_exposed, pass_runs_eagerly(s, prefill))
    dec_exposed = _host_bound(s, dec_exposed, pass_runs_eagerly(s, decode))
    is_prefill, is_both = s.phase == PHASE_CODES["prefill"], s.phase == PHASE_CODES["both"]
    prefill_weight = np.where(is_prefill, 1.0, np.where(is_both, 1.0 / s.output_tokens, 0.0))
    decode_weight = np.where(is_prefill, 0.0, 1.0)
    time, hidden = {}, {}
    for part in INFERENCE_TIME_PARTS:
        time[f"prefill_{part}"] = prefill_weight * pre_exposed[part]
        time[f"decode_{part}"] = decode_weight * dec_exposed[part]
    for kind in _COMM_PARTS:
        hidden[f"prefill_{kind}"] = prefill_weight * pre_hidden[kind]
        hidden[f"decode_{kind}"] = decode_weight * dec_hidden[kind]
    return _Timing(
        time,
        hidden,
        cast(np.ndarray, sum(pre_exposed.values())),
        cast(np.ndarray, sum(dec_exposed.values())),
        cast(np.ndarray, sum(time.values())),
    )


# The table entry point (``_inference_load.estimate_inference_table``) prices the load on top of
# these passes; it imports the helpers above.
