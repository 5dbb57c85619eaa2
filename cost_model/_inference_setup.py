"""Shared setup of one inference evaluation: the table columns it reads, the two passes it prices
and the dtype of each part's GEMMs.

``_inference_load.estimate_inference_table`` evaluates every row of a config table
(``cost_model._table``) at once; ``_setup`` converts once what every pass of that evaluation
shares (``_Setup``). Extra columns it reads (``_serving_columns.INFERENCE_COLUMNS``; absent =
default):

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
                              engine's default (``_inference_comm._comm_times``): DeepEP by
                              phase, vLLM's all-gather / reduce-scatter
===================== ======= ===============================================================

Time model (``_passes``): a decode step is one pass of one token per sequence at the mean decode context
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
the load's. Inference has no backward pass, optimizer or gradients: none of those parts exist
here.

Each part (attention, dense FFN, routed and shared experts, router, LM head) has its own weight
dtype (``Inference.part_weight_dtype``: a released checkpoint keeps some parts wider than its
experts); its GEMMs run in the dtype ``_matmul_dtype`` derives from it.

One pass is priced by ``_inference_compute`` (matmuls, core attention, MoE layers),
``_inference_comm`` (TP, EP, CP and PP traffic) and ``_inference_kernels`` (per-kernel floors
and eager launches); ``_inference_passes`` assembles its time parts and ``_inference_memory``
the memory of a batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np

from cost_model import _inference_ops as ops
from cost_model._engine_paths import sglang_uses_deepep
from cost_model._model_spec import ModelSpec
from cost_model._options import Calibration, EstimateOptions
from cost_model._pricing import op_time_s, ranks_per_node
from cost_model._routing_skew import max_load_factor
from cost_model._rows import RowPartition
from cost_model._serving_columns import KV_DTYPE_CODES, PHASE_CODES, checked_columns
from cost_model._serving_precision import (
    check_serving_precision,
    check_sparse_attention_indexer,
)
from cost_model._serving_profile import ServingProfile, serving_profile
from cost_model._stages import StageLayout, parameters_per_device, stage_layout
from cost_model._table import table_length
from cost_model._training_ops import kernels_per_layer
from cost_model._units import dtype_bytes
from cost_model._workload import Inference

if TYPE_CHECKING:
    from topology import Cluster, HardwareSpec

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
    two_batch_stages: bool  # two-batch overlap paired by stage (``_inference_overlap``)
    phase: np.ndarray
    fragmentation_fraction: float
    routing_imbalance: (
        float  # measured busiest-rank / mean expert load, at least the uniform excess
    )
    routing_skew: float  # real traffic's expert-load spread beyond sampling (``_routing_skew``)
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
    def token_budget(self) -> float:
        """Tokens per iteration of one replica: the workload's ``max_batched_tokens``, else the
        engine's default on this device (``ServingProfile.token_budget``)."""
        if self.workload.max_batched_tokens:
            return float(self.workload.max_batched_tokens)
        return self.profile.token_budget(self.cluster.memory_per_device_bytes, self.hardware.name)

    @cached_property
    def graph_tokens(self) -> np.ndarray:
        """The largest iteration (tokens per forward) the engine replays as a CUDA graph, per
        row (``ServingProfile.graph_tokens``: by the device's memory and the row's tp)."""
        return self.profile.graph_tokens(
            self.cluster.memory_per_device_bytes, self.column("tp"), self.hardware.name
        )

    @cached_property
    def prefill_graph_tokens(self) -> np.ndarray:
        """The largest prompt-carrying iteration (tokens per forward) the engine replays as a
        CUDA graph, per row: 0 where it runs every such iteration eagerly (no prefill graphs, or
        a layout its ``prefill_graphs_off_with`` names), else its decode graphs' size or its
        token budget (``ServingProfile.prefill_graph_tokens``), at most
        ``prefill_graph_mla_max_tokens`` for an MLA model."""
        profile = self.profile
        if not profile.prefill_graphs:
            return np.zeros(self.phase.shape[0])
        if profile.prefill_graph_tokens == "token_budget":
            limit = np.full(self.phase.shape[0], self.token_budget)
        else:
            limit = np.array(self.graph_tokens, dtype=np.float64)
        if profile.prefill_graph_mla_max_tokens and self.model.attention.kind == "mla":
            limit = np.minimum(limit, float(profile.prefill_graph_mla_max_tokens))
        off = np.zeros(limit.shape, dtype=bool)
        conditions = set(profile.prefill_graphs_off_with)
        if "attention_dp" in conditions:
            off |= self.attention_dp
        if "pipeline" in conditions:
            off |= self.column("pp") > 1
        if "expert_all_to_all" in conditions:
            off |= sglang_uses_deepep(
                tp=self.column("tp"), ep=self.column("ep"), etp=self.column("etp")
            )
        if "amd" in conditions and "amd" in self.hardware.name.lower():
            off |= True
        if "disaggregated" in conditions:
            off |= self.phase != PHASE_CODES["both"]
        return np.where(off, 0.0, limit)

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
    check_sparse_attention_indexer(model=model, hardware=cluster.device)
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
        two_batch_stages=options.two_batch_stages,
        phase=np.asarray(table["phase"], dtype=np.int64),
        fragmentation_fraction=options.fragmentation_fraction,
        routing_imbalance=options.routing_imbalance,
        routing_skew=options.routing_skew,
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
    FP8 and FP4 weights on a device without FP8 / FP4 tensor cores (``_serving_precision``:
    Marlin and Triton W4A16 kernels). A dtype with no such path raises
    (``_serving_precision.check_serving_precision``)."""
    weight = weight or _part_dtype(s, part)
    check_serving_precision(
        weight_dtype=weight, kv_dtype=s.workload.kv_dtype, hardware=s.cluster.device
    )
    chains = {
        "fp8": ("fp8",),
        "fp4": ("fp4", s.workload.activation_dtype),
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


def _tokens(s: _Setup, p: ops.Pass) -> tuple[np.ndarray, np.ndarray]:
    """Tokens per device on the attention side, and per rank entering the MoE dispatch."""
    per_replica = p.batch * p.new_tokens
    return per_replica / s.column("cp"), per_replica * s.replicas / s.stage_ranks


def busiest_rank_load_factor(
    s: _Setup, rank_tokens: np.ndarray, *, real_traffic: bool = True
) -> np.ndarray:
    """Routed assignments of the busiest EP rank over the mean, (n,): the balls-into-bins excess
    of its mean load widened by real traffic's expert-load skew (``_routing_skew``), or the
    measured imbalance if larger; ``real_traffic`` False: uniform routing's excess alone."""
    moe = s.model.moe
    assert moe is not None
    mean_assignments = rank_tokens * s.column("etp") * moe.top_k
    # a few element-wise operations: cheaper on every row than grouping alike rows first
    factor = max_load_factor(
        mean_assignments, s.column("ep"), s.routing_skew if real_traffic else 0.0
    )
    return np.maximum(factor, s.routing_imbalance) if real_traffic else factor


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
