"""Vectorized primitives shared by the training and inference cost models.

Every function takes arrays (or a config table, see ``cost_model._table``) and returns arrays;
nothing here loops over configs. The pieces:

* **Shared vocabulary.** ``MEMORY_PARTS`` (the ``memory.<part>`` columns), ``REASON_CODES``
  (the ``reason`` column of the training table path), ``COMM_KINDS`` with ``DEFAULT_OVERLAP``,
  ``EstimateOptions`` (how the modelled software runs) and ``Calibration`` (a few fitted
  efficiencies per hardware type, ``calibration_for`` picks the shipped one from
  ``data/calibration.json``).
* **Pipeline stages.** Layers held by the *first*, a *middle* and the *last* pipeline rank
  (``STAGES``), from the split rule of ``cost_model.split_layers`` (the middle chunks take the
  remainder), so uneven splits cost what they cost. Arrays of shape ``(3, n)``. With ``pp == 1``
  the three rows are the single rank; with ``pp == 2`` the middle row repeats the first.
* **Parameters per device** by part, under TP, EP/ETP (Megatron-core parallel folding) and
  attention data parallel, with the embedding on the first and the LM head on the last stage.
* **Roofline and collectives.** ``op_time_s``: max(FLOPs / achievable FLOP/s, bytes /
  achievable bandwidth) (Williams et al., "Roofline", CACM 2009). ``ranks_per_node``: how many
  ranks of each axis group share a node, for Megatron's rank order (tp innermost, then cp, dp,
  pp; MoE layers re-view dp*cp*tp as edp x ep x etp with etp innermost).
  ``collective_time_s`` prices a collective with ``Cluster.collective_time``.
* **Alike rows.** A large table repeats the same inputs on many rows (a search's configs differ
  in knobs a given operator does not read). ``RowPartition`` remembers, per table, which rows
  were alike in earlier calls, so element-wise pricing (collectives, kernel curves, rooflines)
  runs once per group of alike rows and is scattered back; every input is checked against its
  group's representative, so the result is the row-by-row one.
* **Attention extent.** ``mean_attended_tokens``: keys per query of a causal sequence for the
  full, sliding-window, sparse top-k and linear variants.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property, lru_cache
from importlib import resources
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from cost_model._calibration_transfer import transferred_calibration
from cost_model._model_spec import AttentionSpec, ModelSpec
from cost_model._rows import _DISTINCT_MIN_SIZE, RowPartition, distinct_rows
from cost_model._rules import split_layers

STAGES: tuple[str, ...] = ("first", "middle", "last")

#: Communication kinds of a step; each has an overlap fraction (see ``Calibration``).
COMM_KINDS: tuple[str, ...] = ("tp_comm", "ep_comm", "cp_comm", "pp_comm", "dp_comm")

#: Fraction of each communication kind that may hide behind independent compute, before any
#: fit. TP and EP collectives sit on the critical path of the layer that needs their result
#: (Megatron-LM's default; Narayanan et al. SC'21 sec. 3.4); the CP ring exchange of block
#: k+1 runs under attention of block k (Liu et al., Ring Attention, arXiv:2310.01889);
#: pipeline send/recv is blocking in 1F1B; bucketed gradient reduction (and ZeRO-3 parameter
#: gathers) overlap backward compute (PyTorch DDP, Li et al. VLDB 2020; Megatron
#: ``--overlap-grad-reduce``).
DEFAULT_OVERLAP: dict[str, float] = {
    "tp_comm": 0.0,
    "ep_comm": 0.0,
    "cp_comm": 1.0,
    "pp_comm": 0.0,
    "dp_comm": 1.0,
}


#: Parts of ``memory.<part>`` columns and of ``CostBreakdown.memory_bytes``, both halves.
MEMORY_PARTS: tuple[str, ...] = (
    "weights",
    "gradients",
    "optimizer_states",
    "activations",
    "kv_cache",
    "comm_buffers",
    "fragmentation",
)
#: ``reason`` column codes: 0 feasible; 1..7 the memory part that is largest when memory does
#: not fit (``MEMORY_PARTS[code - 1]``); further codes for other reasons a row is infeasible.
REASON_CODES: dict[str, int] = {
    "feasible": 0,
    **{part: index + 1 for index, part in enumerate(MEMORY_PARTS)},
    "batch_not_divisible": 8,
    "ttft_slo": 9,
    "tpot_slo": 10,
    "no_batch_fits": 11,
}
REASON_LABELS: dict[int, str] = {code: label for label, code in REASON_CODES.items()}


def memory_reason(*, memory: Mapping[str, np.ndarray], capacity_bytes: float) -> np.ndarray:
    """Reason code per row: 0 if the parts fit in ``capacity_bytes``, else 1 + index of the
    largest ``MEMORY_PARTS`` part (the one to blame in ``InfeasiblePlanError``)."""
    parts = [np.asarray(memory.get(part, 0.0), dtype=np.float64) for part in MEMORY_PARTS]
    shape = np.broadcast_shapes(*(part.shape for part in parts))
    stacked = np.stack([np.broadcast_to(part, shape) for part in parts])
    total = stacked.sum(axis=0)
    return np.where(total <= capacity_bytes, 0, 1 + np.argmax(stacked, axis=0))


class EstimateOptions(BaseModel):
    """How the modelled software runs; one per estimate (not per config).

    ``flash_attention``: fused attention that never stores the s x s scores and skips the
    masked half (Dao et al., FlashAttention, arXiv:2205.14135); off, the scores are
    materialized, softmax/dropout are memory-bound passes over them and the full square is
    multiplied (Megatron-LM 2021-22). ``hidden_dropout`` / ``attention_dropout``: GPT-style
    dropout layers (their masks are stored: Korthikanti et al. 2022 sec. 4.1).
    ``routing_imbalance``: tokens of the busiest expert rank over the mean (>= 1).
    ``fragmentation_fraction``: allocator reserve as a fraction of the other memory parts.
    ``fused_gradient_accumulation``: with fp32 main gradients, the weight-gradient GEMM adds
    into them (Megatron-LM ``--gradient-accumulation-fusion``, on by default); off, every
    micro-batch adds each low-precision gradient into its main gradient in a separate
    memory-bound pass (Megatron-LM's unfused ``main_grad.add_(grad)`` hook).
    Training MoE traffic: ``expert_dispatcher`` ``all_to_all`` (NCCL all-to-all, Megatron-core's
    alltoall dispatcher) or ``deepep`` (DeepEP kernels: node de-duplication, NVLink and RDMA at
    once; ``expert_dispatch_time_s``); ``expert_dispatch_fp8``: dispatch in fp8 with its
    per-128 scales, combine in bf16 (DeepSeek-V3 report sec. 3.3); ``max_routed_nodes``:
    node-limited routing. ``bidirectional_pipeline``: a DualPipe-style schedule (DeepSeek-V3
    report sec. 3.2.1) that runs a forward and a backward chunk together so each one's EP
    all-to-all hides behind the other's compute, with the bubble (pp/2 - 1)(F&B + B - 3W)
    instead of 1F1B's (pp - 1)(F + B). ``context_parallel``: ``ring`` (K/V blocks passed
    around the ring under attention; Liu et al.) or ``all_gather`` (K/V all-gathered before
    attention and their gradients reduce-scattered after, exposed; Llama 3 report sec. 3.3.2).

    The framework's recompute and offload settings, priced in activation memory
    (``_memory``) and in step time (``_training``: each recomputed module or layer costs its
    forward once more; offloaded layers' host copies are exposed where they outlast the
    compute they run beside, ``time.offload``): ``recompute_modules``: what
    selective recompute (``recompute="selective"``) recomputes, Megatron-core's
    ``--recompute-modules`` (``core_attn``, the default: the attention scores; ``mla_up_proj``:
    the MLA up-projection outputs; ``layernorm``: the norm outputs; ``mlp``: a dense MLP's
    intermediates; ``moe_act``: the experts' activation outputs; ``moe``: the whole MoE layer but
    its input; ``shared_experts``: the shared experts' intermediates; Megatron-Bridge
    docs/training/activation-recomputation.md). ``recompute_layers``: under ``recompute="full"``,
    the layers of each model chunk recomputed (Megatron-core ``--recompute-method block
    --recompute-num-layers``); None: every layer. ``activation_offload_layers``: layers whose
    saved activations are copied to host memory after their forward and reloaded for their
    backward (Megatron-core ``--cpu-offloading-num-layers``; one offloaded layer is in transit
    on the device at a time without double buffering: Megatron-Bridge docs/training/
    cpu-offloading.md; the copies cross ``HardwareSpec.host_link_bandwidth_bytes_per_s``,
    which the device must state). ``optimizer_instances``: replicas of the sharded model states across the
    data-parallel ranks (Megatron-core ``--num-distributed-optimizer-instances``: ZeRO shards
    over dp / instances, HSDP-style; memory only). ``pipeline_keeps_outputs``: the last
    pipeline stage keeps every micro-batch's output (the logits) until the step ends, to return
    them from the schedule's ``step`` (torch.distributed.pipelining ``forward_one_chunk`` appends
    them to ``output_chunks``; before torch PR #165822 always, since then unless ``step`` is
    called with ``return_outputs=False``, as torchtitan does from e5ef99a, 2025-10-22; memory
    only).
    ``pipeline_p2p_overlap``: the pipeline's activation and gradient sends and receives are
    asynchronous, posted ahead and waited on only where the data is needed (the Llama 3 report,
    arXiv:2407.21783 sec. 3.3.2: "we adopt asynchronous point-to-point communication in PP"),
    so a rank's steady-state transfers run beside its compute and only the fill and drain's
    boundary crossings stay on the critical path; off, every transfer is exposed.
    ``expert_parallel_comm_overlap``: Megatron-core ``--overlap-moe-expert-parallel-comm``
    (Megatron-Bridge ``moe_a2a_overlap``, which also sets ``delay_wgrad_compute``): the EP
    all-to-alls of one micro-batch run beside the compute of another (a forward merged with a
    backward, layer by layer, in the 1F1B steady state), priced per merged layer pair with
    the unpaired warm-up and cool-down micro-batches exposed (``_training_ep_overlap``); inert
    where Megatron-core refuses it (ep = 1, pp > 1 without virtual stages, full recompute).
    ``cuda_graphs``: what the run captures in CUDA
    graphs: ``none``; ``partial``, Transformer Engine per-layer graphs of the static-shape
    parts (Megatron-core ``--cuda-graph-impl transformer_engine``, scopes ``attn``,
    ``moe_router``, ``moe_preprocess``: the dropless dispatch, the experts and the combine
    stay eager); ``full_iteration``, the whole forward and backward (sync-free dispatch
    only). ``cuda_graph_scope``: the scopes a ``partial`` capture covers (Megatron-core
    ``--cuda-graph-scope``; the run's recipe records them). What is captured costs the host
    one graph launch instead of issuing each operator (``_training_host``: a stretch takes
    max(host issue time, GPU time)).
    ``measured_attention``: training prices fused causal attention at the efficiency measured
    for its sequence and heads (``_training_ops.measured_core_attention_time``) instead of the
    calibration's single attention efficiency; off by default: on, the whole runs it speeds up
    come out too fast elsewhere (its docstring).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    calibration: Calibration | None = None
    fused_gradient_accumulation: bool = True
    flash_attention: bool = True
    hidden_dropout: bool = False
    attention_dropout: bool = False
    routing_imbalance: float = Field(default=1.0, ge=1.0)
    fragmentation_fraction: float = Field(default=0.05, ge=0.0, lt=1.0)
    expert_dispatcher: Literal["all_to_all", "deepep"] = "all_to_all"
    expert_dispatch_fp8: bool = False
    max_routed_nodes: int | None = Field(default=None, gt=0)
    bidirectional_pipeline: bool = False
    context_parallel: Literal["ring", "all_gather"] = "ring"
    recompute_modules: tuple[
        Literal["core_attn", "mla_up_proj", "layernorm", "mlp", "moe_act", "moe", "shared_experts"],
        ...,
    ] = ("core_attn",)
    recompute_layers: int | None = Field(default=None, gt=0)
    activation_offload_layers: int = Field(default=0, ge=0)
    optimizer_instances: int = Field(default=1, ge=1)
    expert_parallel_comm_overlap: bool = False
    pipeline_keeps_outputs: bool = False
    pipeline_p2p_overlap: bool = False
    cuda_graphs: Literal["none", "partial", "full_iteration"] = "none"
    cuda_graph_scope: tuple[Literal["attn", "moe_router", "moe_preprocess"], ...] = (
        "attn",
        "moe_router",
        "moe_preprocess",
    )
    measured_attention: bool = False

    def calibration_for(self, hardware) -> Calibration:
        return self.calibration if self.calibration is not None else calibration_for(hardware)


class Calibration(BaseModel):
    """A few global efficiency parameters of one hardware type (never per run).

    ``matmul_efficiency`` / ``memory_bandwidth_efficiency`` are end-to-end achievable fractions
    of peak that replace the hardware's own (a measured efficiency curve is rescaled by the
    same ratio); ``attention_efficiency`` is the fraction core-attention kernels reach (default:
    as matmuls); ``kernel_overhead_s`` is a fixed cost per kernel (launch, wave tail) that the
    roofline misses on small layers; ``collective_efficiency`` divides every collective time
    but the all-to-all where ``all_to_all_efficiency`` is set, and ``collective_overhead_s`` is
    added to each such call on a group of two or more ranks (the Hockney alpha-beta model:
    a fixed cost per call beside the bandwidth term, NCCL's launch and protocol set-up that
    the topology's link latency does not cover); the all-to-all (training's expert dispatch
    and combine) has its own operator table and its own fit, an efficiency and a fixed cost per
    call (``all_to_all_overhead_s``); ``overlap`` overrides ``DEFAULT_OVERLAP``. ``fit``
    documents how the values were fitted (rows, residuals).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    device_pattern: str = Field(default=".*", description="regex matched against HardwareSpec.name")
    matmul_efficiency: float | None = Field(default=None, gt=0, le=1)
    memory_bandwidth_efficiency: float | None = Field(default=None, gt=0, le=1)
    attention_efficiency: float | None = Field(default=None, gt=0, le=1)
    kernel_overhead_s: float = Field(default=0.0, ge=0, le=1e-3)
    collective_efficiency: float = Field(default=1.0, gt=0, le=2)
    collective_overhead_s: float = Field(default=0.0, ge=0, le=1e-3)
    all_to_all_efficiency: float | None = Field(default=None, gt=0, le=2)
    all_to_all_overhead_s: float = Field(default=0.0, ge=0, le=1e-3)
    overlap: dict[str, float] = Field(default_factory=dict)
    fit: dict[str, Any] = Field(default_factory=dict)

    def __hash__(self) -> int:
        return hash(self.model_dump_json())

    def matmul_scale(self, hardware) -> float:
        return (
            1.0
            if self.matmul_efficiency is None
            else self.matmul_efficiency / hardware.matmul_efficiency
        )

    def attention_scale(self, hardware) -> float:
        if self.attention_efficiency is None:
            return self.matmul_scale(hardware)
        return self.attention_efficiency / hardware.matmul_efficiency

    def memory_scale(self, hardware) -> float:
        if self.memory_bandwidth_efficiency is None:
            return 1.0
        return self.memory_bandwidth_efficiency / hardware.memory_bandwidth_efficiency

    def overlap_fraction(self, kind: str) -> float:
        if kind not in DEFAULT_OVERLAP:
            raise ValueError(
                f"communication kind ({kind!r}) must be one of {list(DEFAULT_OVERLAP)}"
            )
        return float(self.overlap.get(kind, DEFAULT_OVERLAP[kind]))


@lru_cache(maxsize=1)
def _shipped_calibrations() -> tuple[Calibration, ...]:
    text = (resources.files("cost_model") / "data" / "calibration.json").read_text()
    return tuple(Calibration.model_validate(entry) for entry in json.loads(text)["calibrations"])


def calibration_for(hardware) -> Calibration:
    """The shipped calibration whose ``device_pattern`` matches ``hardware.name``, else neutral."""
    for calibration in _shipped_calibrations():
        if re.search(calibration.device_pattern, hardware.name):
            return calibration
    # A generation without fitted runs: its preset's reference calibration carried over.
    return transferred_calibration(hardware, _shipped_calibrations()) or Calibration()


@dataclass(frozen=True)
class StageLayout:
    """Per pipeline rank (rows ``STAGES``) and config (columns): the layers it holds."""

    layers: np.ndarray  # (3, n) transformer layers on the rank
    moe_layers: np.ndarray  # (3, n) of which MoE layers
    has_embedding: np.ndarray  # (3, n) bool
    has_lm_head: np.ndarray  # (3, n) bool

    @cached_property
    def dense_layers(self) -> np.ndarray:
        return self.layers - self.moe_layers


def _int(table: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    return np.asarray(table[name], dtype=np.int64)


def stage_layout(
    *,
    model: ModelSpec,
    pp: np.ndarray,
    virtual_stages: np.ndarray,
    layer_weights: tuple | None = None,
) -> StageLayout:
    """Layers per pipeline rank: the first, the fullest middle and the last rank of each config.

    Chunks follow ``split_layers`` over ``pp * virtual_stages`` chunks; rank r of an interleaved
    schedule holds chunks r, r + pp, ... (Megatron-LM's virtual pipeline order); the leading
    dense layers of an MoE model are the first layers, so they fill rank 0 and spill into the
    next ranks. The middle row is the middle rank that holds the most: the one with the largest
    ``dense_weight * dense_layers + moe_weight * moe_layers`` (``layer_weights``, parameters of
    one dense and one MoE layer per device, shape (n,) or scalars; default: whole layers), so a
    rank whose dense layers spilled over is not taken for the rank full of MoE layers. With
    ``pp`` <= 2 the middle row repeats the first.
    """
    pp = np.asarray(pp, dtype=np.int64)
    v = np.broadcast_to(np.asarray(virtual_stages, dtype=np.int64), pp.shape)
    key = pp * 4096 + v
    distinct, inverse = np.unique(key, return_inverse=True)
    rows = [
        _rank_rows(model.num_layers, model.num_dense_ffn_layers, int(k) // 4096, int(k) % 4096)
        for k in distinct
    ]
    width = max(len(row[1]) for row in rows)
    ends = np.array([[row[0][0], row[0][1], row[2][0], row[2][1]] for row in rows], dtype=np.int64)[
        inverse.reshape(-1)
    ]
    padded = [list(row[1]) + [row[1][-1]] * (width - len(row[1])) for row in rows]
    middle = np.array(padded, dtype=np.int64)[
        inverse.reshape(-1)
    ]  # (n, width, 2) of (layers, dense)
    dense_weight, moe_weight = (
        layer_weights if layer_weights is not None else _whole_layer_weights(model)
    )
    dense_weight = np.broadcast_to(np.asarray(dense_weight, dtype=np.float64), pp.shape).reshape(
        -1, 1
    )
    moe_weight = np.broadcast_to(np.asarray(moe_weight, dtype=np.float64), pp.shape).reshape(-1, 1)
    load = (
        middle[..., 1] * dense_weight
        + (middle[..., 0] - middle[..., 1]) * moe_weight
        + middle[..., 0] * 1e-9
    )
    pick = np.take_along_axis(middle, np.argmax(load, axis=1)[:, None, None], axis=1)[:, 0]
    shape = pp.shape
    layers = np.stack([ends[:, 0], pick[:, 0], ends[:, 2]]).reshape((3, *shape))
    dense = np.stack([ends[:, 1], pick[:, 1], ends[:, 3]]).reshape((3, *shape))
    has_embedding = np.stack([np.ones(shape, dtype=bool), pp <= 2, pp == 1])
    has_lm_head = np.stack([pp == 1, pp == 1, np.ones(shape, dtype=bool)])
    return StageLayout(
        layers=layers,
        moe_layers=layers - dense,
        has_embedding=has_embedding,
        has_lm_head=has_lm_head,
    )


def _whole_layer_weights(model: ModelSpec) -> tuple[float, float]:
    """Parameters of one dense and one MoE layer, unsharded."""
    common = model.attention_parameters() + model.layer_norm_parameters()
    dense = common + model.ffn_parameters(model.ffn_hidden_size)
    moe = model.moe
    if moe is None:
        return float(dense), float(dense)
    experts = moe.num_routed_experts * model.ffn_parameters(moe.expert_ffn_hidden_size)
    shared = moe.num_shared_experts * model.ffn_parameters(moe.shared_ffn_size)
    return float(dense), float(common + experts + shared + model.router_parameters())


def _chunk_sizes(num_layers: int, num_chunks: int) -> list[int]:
    """``split_layers`` chunk sizes; more chunks than layers leaves empty chunks (an illegal
    config the caller reports, priced rather than raised here)."""
    if 1 <= num_chunks <= num_layers:
        return [stop - start for start, stop in split_layers(num_layers, num_chunks)]
    base, extra = divmod(num_layers, num_chunks)
    sizes = [base] * num_chunks
    order = sorted(
        range(num_chunks), key=lambda i: (i in (0, num_chunks - 1), abs(i - (num_chunks - 1) / 2))
    )
    for index in order[:extra]:
        sizes[index] += 1
    return sizes


@lru_cache(maxsize=4096)
def _rank_rows(num_layers: int, num_dense: int, pp: int, v: int) -> tuple:
    """((layers, dense) of rank 0, the distinct (layers, dense) of the middle ranks, of the
    last rank) for one (pp, virtual_stages)."""
    pp, v = max(pp, 1), max(v, 1)
    sizes = _chunk_sizes(num_layers, pp * v)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    dense = np.clip(num_dense - starts, 0, sizes)
    per_rank = [(int(sum(sizes[r::pp])), int(dense[r::pp].sum())) for r in range(pp)]
    middle = sorted(set(per_rank[1:-1])) if pp >= 3 else [per_rank[0]]
    return per_rank[0], tuple(middle), per_rank[-1]


def attention_replicated_parameters(model: ModelSpec) -> int:
    """Attention weights tensor parallel keeps whole on every rank: MLA's down-projections
    (``q_a_proj``, ``kv_a_proj_with_mqa``) and their norms produce the latent all heads read
    (Megatron-core MLA, vLLM's ``ReplicatedLinear``, torchtitan's ``NoParallel``); 0 for MHA/GQA."""
    a = model.attention
    if a.kind != "mla":
        return 0
    h = model.hidden_size
    q = h * a.q_lora_rank + model._norm_parameters(a.q_lora_rank) if a.q_lora_rank else 0
    return q + h * (a.kv_lora_rank + a.qk_rope_head_dim) + model._norm_parameters(a.kv_lora_rank)


def attention_parameters_per_device(
    *, model: ModelSpec, table: Mapping[str, np.ndarray]
) -> np.ndarray:
    """Attention weights of one layer on one device: sharded by tp (less the replicated MLA
    down-projections), whole under attention-DP."""
    shard = np.where(np.asarray(table["attention_data_parallel"], dtype=bool), 1, _int(table, "tp"))
    replicated = attention_replicated_parameters(model)
    return replicated + (model.attention_parameters() - replicated) / shard


def layer_weights_per_device(
    *, model: ModelSpec, table: Mapping[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Parameters of one dense and one MoE layer on one device (shape (n,)), the weights
    ``stage_layout`` uses to find the fullest middle rank."""
    tp, ep, etp = _int(table, "tp"), _int(table, "ep"), _int(table, "etp")
    common = (
        attention_parameters_per_device(model=model, table=table) + model.layer_norm_parameters()
    )
    dense = common + model.ffn_parameters(model.ffn_hidden_size) / tp
    moe = model.moe
    if moe is None:
        return dense, dense
    redundant = np.asarray(table.get("num_redundant_experts", 0), dtype=np.float64)
    experts = (
        (moe.num_routed_experts + redundant)
        / ep
        * model.ffn_parameters(moe.expert_ffn_hidden_size)
        / etp
    )
    dense_shard = np.where(np.asarray(table["attention_data_parallel"], dtype=bool), 1, tp)
    shared = moe.num_shared_experts * model.ffn_parameters(moe.shared_ffn_size) / dense_shard
    return dense, common + experts + shared + model.router_parameters()


def parameters_per_device(
    *, model: ModelSpec, table: Mapping[str, np.ndarray], layout: StageLayout | None = None
) -> dict[str, np.ndarray]:
    """Parameters held by one device of each stage (rows ``STAGES``), by part.

    Parts: ``attention`` (/tp, or whole under attention-DP), ``dense_ffn`` (/tp), ``routed_experts``
    (num_routed_experts/ep experts of size ffn/etp, plus the rank's share of the
    ``num_redundant_experts`` extra column, DeepSeek EPLB replicas), ``shared_experts`` (as
    attention: /tp or whole under attention-DP), ``router`` and ``norms`` (replicated),
    ``embedding`` and ``lm_head`` (vocab-parallel over tp, first/last stage; a tied head is
    counted once per stage that holds it).
    """
    tp, ep, etp = _int(table, "tp"), _int(table, "ep"), _int(table, "etp")
    if layout is None:
        layout = stage_layout(
            model=model,
            pp=_int(table, "pp"),
            virtual_stages=_int(table, "virtual_stages"),
            layer_weights=layer_weights_per_device(model=model, table=table),
        )
    attention_dp = np.asarray(table["attention_data_parallel"], dtype=bool)
    dense_shard = np.where(attention_dp, 1, tp)
    parts = {
        "attention": layout.layers * attention_parameters_per_device(model=model, table=table),
        "dense_ffn": layout.dense_layers * (model.ffn_parameters(model.ffn_hidden_size) / tp),
        "routed_experts": np.zeros(layout.layers.shape),
        "shared_experts": np.zeros(layout.layers.shape),
        "router": layout.moe_layers * float(model.router_parameters()),
        "norms": layout.layers * float(model.layer_norm_parameters())
        + layout.has_lm_head * model.final_norm_parameters(),
    }
    moe = model.moe
    if moe is not None:
        redundant = np.asarray(table.get("num_redundant_experts", 0), dtype=np.float64)
        experts_per_rank = (moe.num_routed_experts + redundant) / ep
        expert = model.ffn_parameters(moe.expert_ffn_hidden_size)
        parts["routed_experts"] = layout.moe_layers * experts_per_rank * expert / etp
        shared = moe.num_shared_experts * model.ffn_parameters(moe.shared_ffn_size)
        parts["shared_experts"] = layout.moe_layers * (shared / dense_shard)
    embedding = model.vocab_size * model.hidden_size / tp
    positions = model.embedding_parameters() - model.vocab_size * model.hidden_size
    parts["embedding"] = layout.has_embedding * (embedding + positions)
    parts["lm_head"] = (
        layout.has_lm_head
        * (model.vocab_size * model.hidden_size / tp)
        * ((~layout.has_embedding) | (not model.tie_word_embeddings))
    )
    return parts


def op_time_s(
    *,
    flops,
    bytes_moved,
    hardware,
    dtype: str,
    calibration: Calibration,
    calls=1.0,
    kind: str = "matmul",
) -> np.ndarray:
    """Roofline time of ``calls`` equal kernels moving ``flops`` and ``bytes_moved`` in total:
    max of compute and memory time (Williams et al., CACM 2009).

    Achievable FLOP/s = peak(dtype) x ``hardware.gemm_efficiency(flops / calls)`` x the
    calibration's scale for ``kind`` (``matmul``, or ``attention`` for core-attention kernels);
    achievable bandwidth = peak x ``hardware.memory_efficiency(bytes / calls)`` (for ``kind``
    ``norm``: ``hardware.norm_efficiency``, a measured norm curve where there is one) x the
    calibration's memory scale.
    """
    flops = np.asarray(flops, dtype=np.float64)
    bytes_moved = np.asarray(bytes_moved, dtype=np.float64)
    calls = np.maximum(np.asarray(calls, dtype=np.float64), 1.0)
    peak = hardware.peak_flops_for(dtype)
    scale = (
        calibration.attention_scale(hardware)
        if kind == "attention"
        else calibration.matmul_scale(hardware)
    )
    matmul = hardware.gemm_efficiency(flops / calls, dtype) * scale
    bandwidth = hardware.memory_efficiency
    if kind == "norm" and hasattr(hardware, "norm_efficiency"):  # norm layers: their measured curve
        bandwidth = hardware.norm_efficiency
    memory = bandwidth(bytes_moved / calls) * calibration.memory_scale(hardware)
    compute_s = flops / (peak * matmul)
    memory_s = bytes_moved / (hardware.memory_bandwidth_bytes_per_s * memory)
    return np.maximum(compute_s, memory_s)


def ranks_per_node(
    *, table: Mapping[str, np.ndarray], devices_per_node: int
) -> dict[str, np.ndarray]:
    """Ranks of one group of each axis that share a node, for Megatron's rank order.

    Global rank = tp_index + tp*(cp_index + cp*(dp_index + dp*pp_index)): the group of an axis
    has stride = product of the inner sizes, so ``min(size, max(1, devices_per_node // stride))``
    of its members sit on one node. MoE layers view the dp*cp*tp ranks of a stage as
    edp x ep x etp, etp innermost (Megatron-core parallel folding). ``dp_cp`` is the
    gradient-reduction group of dense parameters (dp and cp are adjacent, stride tp).
    """
    tp, cp, dp = _int(table, "tp"), _int(table, "cp"), _int(table, "dp")
    pp, ep, etp = _int(table, "pp"), _int(table, "ep"), _int(table, "etp")
    edp = (dp * cp * tp) // (ep * etp)

    def local(size: np.ndarray, stride: np.ndarray | int) -> np.ndarray:
        return np.minimum(size, np.maximum(1, devices_per_node // stride))

    return {
        "tp": local(tp, 1),
        "cp": local(cp, tp),
        "dp": local(dp, tp * cp),
        "dp_cp": local(dp * cp, tp),
        "pp": local(pp, tp * cp * dp),
        "etp": local(etp, 1),
        "ep": local(ep, etp),
        "edp": local(edp, etp * ep),
    }


def collective_time_s(
    *,
    cluster,
    op: str,
    group_size,
    ranks_per_node,
    message_bytes,
    calibration: Calibration,
    rows: RowPartition | None = None,
) -> np.ndarray:
    """``cluster.collective_time`` divided by the calibration's collective efficiency (an
    all-to-all by its own efficiency, plus its fixed cost per call, where the calibration has
    them: ``_calibrated``).

    Large tables repeat the same (group size, ranks per node, message) many times, so the
    topology model is evaluated once per distinct triple and scattered back. ``rows`` (one per
    table, shared by every call on it) remembers which rows were alike in earlier calls, so a
    call whose triples are alike on the same rows skips the search for distinct triples.
    """
    group, local, message = np.broadcast_arrays(
        *(
            np.asarray(value, dtype=np.float64)
            for value in (group_size, ranks_per_node, message_bytes)
        )
    )
    if group.size < _DISTINCT_MIN_SIZE:
        seconds = cluster.collective_time(
            op, group_size=group, ranks_per_node=local, message_bytes=message
        )
        return _calibrated(op, seconds, group, calibration)
    shape = group.shape
    varying = [  # a scalar argument is alike on every row
        value.ravel()
        for value, given in zip(
            (group, local, message), (group_size, ranks_per_node, message_bytes), strict=True
        )
        if np.ndim(given) > 0
    ]
    if rows is None:
        first, inverse = distinct_rows(varying, size=group.size)
    else:
        found = rows.grouping(varying, size=group.size, site=f"collective {op}")
        if found is None:  # rows hardly repeat: price them all
            seconds = cluster.collective_time(
                op, group_size=group, ranks_per_node=local, message_bytes=message
            )
            return _calibrated(op, seconds, group, calibration)
        first, inverse = found
    whole_group = group
    group, local, message = (value.reshape(-1)[first] for value in (group, local, message))
    seconds = cluster.collective_time(
        op, group_size=group, ranks_per_node=local, message_bytes=message
    )
    seconds = np.asarray(seconds, dtype=np.float64).reshape(-1)[inverse].reshape(shape)
    return _calibrated(op, seconds, whole_group, calibration)


def _calibrated(op: str, seconds, group: np.ndarray, calibration: Calibration) -> np.ndarray:
    """Topology seconds of ``op`` over the calibration's efficiency plus its fixed cost per call
    (``collective_overhead_s``); an all-to-all, where the calibration fitted its own
    (``all_to_all_efficiency``), over that plus its own fixed cost (``all_to_all_overhead_s``).
    The fixed cost applies on groups of two or more ranks (a group of one issues no
    collective)."""
    seconds = np.asarray(seconds, dtype=np.float64)
    if op != "all_to_all" or calibration.all_to_all_efficiency is None:
        fixed = np.where(group > 1.0, calibration.collective_overhead_s, 0.0)
        return seconds / calibration.collective_efficiency + fixed
    fixed = np.where(group > 1.0, calibration.all_to_all_overhead_s, 0.0)
    return seconds / calibration.all_to_all_efficiency + fixed


def expert_dispatch_time_s(
    *,
    cluster,
    calibration: Calibration,
    hidden_size: int,
    top_k: int,
    ep,
    etp,
    ep_per_node,
    rank_tokens,
    element_bytes: float,
    node_dedup: bool,
    max_routed_nodes: int | None = None,
) -> np.ndarray:
    """One MoE dispatch (or combine) as DeepEP runs it: every rank writes straight to its peers,
    NVLink and RDMA at once, so the time is the slower tier's bytes over its bandwidth plus one
    latency (DeepEP README; not the n-1 rounds of a pairwise all-to-all). Each tier is priced by
    the topology as a point-to-point transfer. Each token goes to ``top_k`` experts, each held by
    ``etp`` ranks. With ``node_dedup`` (DeepEP "normal" kernels) a token is sent once per
    remote node and forwarded over NVLink there; without, every copy crosses RDMA. Destinations
    are uniform over the group's ``ep`` ranks on ``ep / L`` nodes (``L`` = ``ep_per_node``);
    node-limited routing (DeepSeek-V3 report sec. 2.1.2: each token to at most M nodes) caps the
    distinct remote nodes at ``max_routed_nodes``. Shared by training and inference.
    """
    ep, etp = np.asarray(ep, dtype=np.float64), np.asarray(etp, dtype=np.float64)
    local = np.minimum(np.asarray(ep_per_node, dtype=np.float64), ep)
    nodes = ep / local
    copies = top_k * etp
    token_bytes = np.asarray(rank_tokens, dtype=np.float64) * hidden_size * element_bytes
    intra_bytes = token_bytes * copies * (local - 1.0) / ep
    remote_copies = copies * (ep - local) / ep
    if node_dedup:  # distinct remote nodes among the copies' destinations
        remote_copies = np.minimum(
            remote_copies, (nodes - 1.0) * (1.0 - np.power(1.0 - 1.0 / nodes, copies))
        )
    if max_routed_nodes is not None:
        remote_copies = np.minimum(
            remote_copies, np.where(node_dedup, float(max_routed_nodes), copies)
        )
    inter_bytes = token_bytes * remote_copies

    def point_to_point(ranks_per_node, message) -> np.ndarray:
        return collective_time_s(
            cluster=cluster,
            op="send_recv",
            group_size=2.0,
            ranks_per_node=ranks_per_node,
            message_bytes=message,
            calibration=calibration,
        )

    seconds = np.maximum(
        point_to_point(2.0, intra_bytes), np.where(nodes > 1, point_to_point(1.0, inter_bytes), 0.0)
    )
    return np.where(ep > 1, seconds, 0.0)


def mean_attended_tokens(*, attention: AttentionSpec, sequence_tokens) -> np.ndarray:
    """Mean keys a query attends to over a causal sequence of ``sequence_tokens`` tokens.

    Query i (1-based) attends ``attention.attended_tokens(i)`` keys: i for full attention (mean
    (S+1)/2), min(i, w) for a window or top-k budget w, a constant for linear attention.
    Closed form of the mean of min(i, w): (w(w+1)/2 + (S-w)w)/S for S > w.
    """
    s = np.asarray(sequence_tokens, dtype=np.float64)
    if attention.variant == "linear":
        return np.full_like(s, attention.attended_tokens(1.0))
    if attention.variant == "full":
        return (s + 1.0) / 2.0
    tokens = (
        attention.window_tokens if attention.variant == "sliding_window" else attention.topk_tokens
    )
    assert tokens is not None  # AttentionSpec requires it for these variants
    w = float(tokens)
    capped = (w * (w + 1.0) / 2.0 + (s - w) * w) / np.maximum(s, 1.0)
    return np.where(s > w, capped, (s + 1.0) / 2.0)
