"""Training step time of a config table (one implementation; a single config is a table of one).

Per pipeline rank (rows ``STAGES``) and micro-batch, each operator is a roofline
(``_common.op_time_s``) of its FLOPs and bytes on one device:

* projections, dense FFN, router, routed and shared experts, LM head: matmuls, 2 FLOPs per
  multiply-accumulate (Kaplan et al. 2020 Table 1); backward = 2 x forward (Narayanan et al.
  SC'21 sec. 5.1: "the backward pass is twice the forward");
* core attention: 2*heads*(qk_dim + v_dim) FLOPs per attended key; causal masking and the
  long-context variants via ``mean_attended_tokens``; with FlashAttention the backward is 2.5 x
  the forward (FlashAttention-2, Dao 2023, sec. 3.1: 5 matmuls vs 2); unfused attention
  multiplies the full s x s square and adds memory-bound softmax/dropout passes over it;
* norms, residual adds, dropout, activation functions: memory-bound passes; an MoE layer's
  router, token dispatcher and grouped expert GEMMs as Megatron-core runs them
  (``_training_moe``: routed experts at their measured grouped-GEMM shape where curves exist);
* recompute: ``full`` repeats the forward of every layer, or of the first
  ``EstimateOptions.recompute_layers`` of each model chunk (Megatron-core ``--recompute-method
  block``); ``selective`` repeats the forward of the modules ``EstimateOptions.recompute_modules``
  names (Megatron-core ``--recompute-modules``; the default, core attention, is Korthikanti et
  al. 2022, arXiv:2205.05198, sec. 5) — each recomputed module costs its forward time once more;
* CPU activation offloading (``EstimateOptions.activation_offload_layers``): each offloaded
  layer's activations cross the device-host link (``HardwareSpec.host_link_bandwidth_bytes_per_s``)
  once in forward and once in backward, beside the next layer's compute; only what outlasts that
  compute is exposed (``time.offload``; ``_exposed_offload``).

Communication is priced with ``Cluster.collective_time`` for the placed groups
(``_common.ranks_per_node``): TP all-reduce, or reduce-scatter + all-gather with SP, twice per
layer per pass (Shoeybi et al. 2019, Megatron-LM sec. 3; Korthikanti sec. 4.2.2); EP all-to-all
dispatch + combine of tokens x top-k x hidden x routing imbalance (DeepSeek-V3 report,
arXiv:2412.19437, sec. 3.2.2); CP ring send/recv of K/V blocks (cp - 1 per layer); PP
send/recv of the boundary activation; DP gradient all-reduce, or reduce-scatter + parameter
all-gather under ZeRO-1/2, and per-micro-batch gathers under ZeRO-3/FSDP (Rajbhandari et al.,
ZeRO, SC'20; a pipeline stage's gradients are reduced once per step, ``_training_dp``). Each
kind hides up to its overlap fraction behind independent compute, per link: kinds on NVLink
and on the NIC overlap the same compute concurrently, kinds on one link share it, and the
asynchronous pipeline and data-parallel streams also run while the compute stream waits on the
other link's exposed collectives (``_training_links``); the compute it hides behind runs slower while the collective occupies SMs and memory bandwidth
(``time.contention``: the measured mean compute slowdown under overlap, arXiv:2507.03114,
``data/overlap_contention.json``). Megatron-core's EP communication overlap merges one
micro-batch's forward with another's backward layer by layer; what of the EP all-to-all it hides
and the host wait it adds are priced per merged layer pair (``_training_ep_overlap``).

Pipeline: m micro-batches on the slowest rank plus a bubble of (p - 1) micro-batch times for
GPipe and 1F1B, divided by v for interleaved 1F1B (Narayanan et al. SC'21 eq. 1 and sec. 2.2.2),
and (p - 1) forward times for the zero-bubble schedule ZB-H1 (Qi et al., arXiv:2401.10241).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from types import SimpleNamespace
from typing import TYPE_CHECKING, Literal

import numpy as np

from cost_model import _training_moe as training_moe
from cost_model._calibration_operators import training_attention_efficiency
from cost_model._common import (
    Calibration,
    EstimateOptions,
    StageLayout,
    attention_parameters_per_device,
    collective_time_s,
    layer_weights_per_device,
    mean_attended_tokens,
    parameters_per_device,
    ranks_per_node,
    stage_layout,
)
from cost_model._frameworks import FrameworkProfile, framework_profile
from cost_model._kernel_curves import context_attention_time_s
from cost_model._memory import offloaded_layer_bytes
from cost_model._model_spec import ModelSpec
from cost_model._precision import quantization_time_s, training_op_time_s
from cost_model._table import (
    CONFIG_COLUMNS,
    RECOMPUTE_CODES,
    SCHEDULE_CODES,
    select_rows,
    table_length,
)
from cost_model._training_comm import (
    ACTIVATION_BYTES,
    CollectiveTimes,
    mla_backward_widths,
    table_collective_times,
)
from cost_model._training_dp import contention_seconds, dp_and_optimizer, hidden_seconds
from cost_model._training_ep_overlap import MergedPairs, ep_overlap_applies, merged_pairs
from cost_model._training_host import LayerGpuParts, exposed_host_s
from cost_model._training_links import LinkWindows, crosses_nodes
from cost_model._workload import Training

if TYPE_CHECKING:
    from topology import Cluster

#: ``time.<part>`` columns of a training estimate; they sum to ``step_time_s``.
TRAINING_TIME_PARTS: tuple[str, ...] = (
    "compute",
    "recompute",
    "tp_comm",
    "ep_comm",
    "cp_comm",
    "pp_comm",
    "dp_comm",
    "contention",
    "offload",
    "bubble",
    "optimizer",
)


@dataclass(frozen=True)
class TrainingContext:
    """Per-table quantities every training formula needs (arrays of shape (n,) or (3, n))."""

    model: ModelSpec
    cluster: Cluster
    workload: Training
    options: EstimateOptions
    calibration: Calibration
    table: Mapping[str, np.ndarray]
    layout: StageLayout
    local: dict[str, np.ndarray]
    num_micro_batches: np.ndarray
    batch_divides: np.ndarray
    columns: dict[str, np.ndarray]

    def column(self, name: str) -> np.ndarray:
        """A config column as float64 (converted once)."""
        return self.columns[name]

    @cached_property
    def parameters(self) -> dict[str, np.ndarray]:
        """``parameters_per_device`` of each pipeline rank (rows ``STAGES``)."""
        return parameters_per_device(model=self.model, table=self.table, layout=self.layout)

    def restricted(self, rows: np.ndarray) -> TrainingContext:
        """The same estimate over a subset of the rows."""
        return training_context(
            model=self.model,
            cluster=self.cluster,
            workload=self.workload,
            options=self.options,
            table=select_rows(self.table, rows),
        )

    @property
    def sequence_parallel(self) -> np.ndarray:
        return np.asarray(self.table["sequence_parallel"], dtype=bool)

    @cached_property
    def tokens(self) -> np.ndarray:
        """Tokens of one micro-batch on one rank of the attention/dense part: b * s / cp."""
        return (
            self.column("micro_batch_size")
            * self.workload.sequence_length_tokens
            / self.column("cp")
        )

    @cached_property
    def moe_tokens(self) -> np.ndarray:
        """Tokens one rank routes: the attention tokens split over tp (Megatron-core folding).

        Without sequence parallel the tp ranks hold the same tokens; the runtime splits them
        among the tp ranks only on the expert-parallel path (ep or etp > 1). With ep = etp = 1
        every tp rank routes every token through its replicated experts, so nothing is split.
        """
        split = self.sequence_parallel | (self.column("ep") > 1) | (self.column("etp") > 1)
        return np.where(split, self.tokens / self.column("tp"), self.tokens)

    @cached_property
    def fully_recomputed_layers(self) -> np.ndarray:
        """Layers of each pipeline rank (rows ``STAGES``) whose forward full recompute repeats in
        backward: every layer, or the first ``EstimateOptions.recompute_layers`` of each of the
        rank's v model chunks (Megatron-core ``--recompute-granularity full --recompute-method
        block --recompute-num-layers``); zero unless ``recompute`` is ``full``."""
        layers = self.layout.layers
        if self.options.recompute_layers is not None:
            chunks = self.column("virtual_stages")
            layers = np.minimum(self.options.recompute_layers * chunks, layers)
        full = np.asarray(self.table["recompute"]) == RECOMPUTE_CODES["full"]
        return np.where(full, layers, 0.0)

    @cached_property
    def full_recompute_share(self) -> np.ndarray:
        """``fully_recomputed_layers`` over the rank's layers (3, n): 1 for full recompute of every
        layer, 0 without full recompute."""
        return self.fully_recomputed_layers / np.maximum(self.layout.layers, 1.0)

    @property
    def grad_bytes(self) -> float:
        """fp32 main gradients with fp32 master weights (Megatron-LM's ``main_grad``), else 2."""
        return (
            4.0
            if self.workload.master_weights_fp32 and self.workload.gradient_dtype == "fp32"
            else 2.0
        )

    @cached_property
    def framework(self) -> FrameworkProfile | None:
        name = self.workload.framework
        return None if name is None else framework_profile(name)

    @property
    def reduce_bytes(self) -> float:
        """Bytes per gradient element the data-parallel reduction moves: the framework's
        reduction dtype where it has its own, else the main gradients' (``grad_bytes``)."""
        if self.framework is None or self.framework.gradient_reduce_bytes is None:
            return self.grad_bytes
        return float(self.framework.gradient_reduce_bytes)

    @property
    def dp_overlap(self) -> float:
        """Fraction of data-parallel traffic that may hide behind compute: the framework's
        overlap features, else the calibration's."""
        if self.framework is None:
            return self.calibration.overlap_fraction("dp_comm")
        return self.framework.dp_comm_overlap

    def overlap_fraction(self, kind: str):
        """Fraction of a TP/EP/CP communication kind that may hide behind compute. With a
        framework, tensor-parallel overlap is its feature (Megatron-core ``--tp-comm-overlap``
        pipelines the sequence-parallel all-gather / reduce-scatter with the GEMMs, only with
        sequence parallel); a bidirectional (DualPipe-style) schedule hides the EP all-to-all
        behind the paired chunk's compute (Megatron-core's EP communication overlap,
        ``EstimateOptions.expert_parallel_comm_overlap``, is priced per merged layer pair by
        ``_training_ep_overlap``); an all-gather context parallel is exposed; the rest, and
        everything without a framework, the calibration's."""
        if kind == "ep_comm" and self.options.bidirectional_pipeline:
            return 1.0
        if kind == "cp_comm" and self.options.context_parallel == "all_gather":
            return 0.0
        if kind == "tp_comm" and self.framework is not None:
            return np.where(self.sequence_parallel, self.framework.tp_comm_overlap, 0.0)
        return self.calibration.overlap_fraction(kind)

    @property
    def fused_elementwise(self) -> bool:
        """Fused norm, activation and rotary kernels (every framework profile says; True
        without one, the Megatron-core default the calibrations were fitted with)."""
        return True if self.framework is None else self.framework.fused_elementwise

    @property
    def zero2_reduce_every_micro_batch(self) -> bool:
        return True if self.framework is None else self.framework.zero2_reduce_every_micro_batch

    @property
    def pipeline_reshard_after_forward(self) -> bool:
        """``FrameworkProfile.pipeline_reshard_after_forward``; True without a framework (the
        plan as ``autoparallel.apply_plan`` runs it: ZeRO-3 is ``reshard_after_forward=True``)."""
        return True if self.framework is None else self.framework.pipeline_reshard_after_forward

    def op(
        self, flops, bytes_moved, calls=1.0, kind: str = "matmul", role: str = "linear"
    ) -> np.ndarray:
        """Roofline time under the workload's precision; in fp8 training only the GEMMs whose
        ``role`` runs in fp8 (``_precision.FP8_ROLES``) take the measured fp8 speed-up."""
        return training_op_time_s(
            self, flops=flops, bytes_moved=bytes_moved, calls=calls, kind=kind, role=role
        )

    def collective(self, op: str, *, axis: str, group_size, message_bytes) -> np.ndarray:
        return collective_time_s(
            cluster=self.cluster,
            op=op,
            group_size=group_size,
            ranks_per_node=self.local[axis],
            message_bytes=message_bytes,
            calibration=self.calibration,
        )


def training_context(
    *, model, cluster, workload: Training, table, options: EstimateOptions
) -> TrainingContext:
    """Derive the shared per-table quantities (stage layout, placement, micro-batch count)."""
    table_length(table)
    if workload.framework is not None:  # the framework's kernels replace the option defaults
        profile = framework_profile(workload.framework)
        options = options.model_copy(
            update={
                "flash_attention": profile.flash_attention,
                "fused_gradient_accumulation": profile.fused_gradient_accumulation,
            }
        )
    per_replica = np.asarray(table["dp"], dtype=np.int64) * np.asarray(
        table["micro_batch_size"], dtype=np.int64
    )
    batch = workload.sequences_per_step
    return TrainingContext(
        model=model,
        cluster=cluster,
        workload=workload,
        options=options,
        calibration=options.calibration_for(cluster.device),
        table=table,
        layout=stage_layout(
            model=model,
            pp=table["pp"],
            virtual_stages=table["virtual_stages"],
            layer_weights=layer_weights_per_device(model=model, table=table),
        ),
        local=ranks_per_node(table=table, devices_per_node=cluster.devices_per_node),
        num_micro_batches=np.maximum(batch // per_replica, 1).astype(np.float64),
        batch_divides=(batch % per_replica) == 0,
        columns={name: np.asarray(table[name], dtype=np.float64) for name in CONFIG_COLUMNS},
    )


# ---------------------------------------------------------------------------- operators (forward)
def _heads_per_rank(ctx: TrainingContext) -> np.ndarray:
    return ctx.model.attention.num_heads / ctx.column("tp")


def attention_projection_time(ctx: TrainingContext) -> np.ndarray:
    """Q/K/V/O projections (MLA: its low-rank down/up projections) of one layer."""
    params = attention_parameters_per_device(
        model=ctx.model, table=ctx.table
    )  # MLA down-projections whole
    h = ctx.model.hidden_size
    return ctx.op(
        2.0 * ctx.tokens * params, params * 2.0 + ctx.tokens * 4.0 * h * ACTIVATION_BYTES, calls=4.0
    )


def core_attention_time(ctx: TrainingContext) -> np.ndarray:
    """Scores and weighted values of one layer (forward). Unfused: full square + softmax passes."""
    attention, s = ctx.model.attention, ctx.workload.sequence_length_tokens
    heads = _heads_per_rank(ctx)
    per_key = 2.0 * heads * (attention.qk_head_dim + attention.value_head_dim)
    io_bytes = (
        ctx.tokens
        * heads
        * 2.0
        * (attention.qk_head_dim + attention.value_head_dim)
        * ACTIVATION_BYTES
    )
    calls = ctx.column("micro_batch_size") * heads
    if ctx.options.flash_attention:
        attended = mean_attended_tokens(attention=attention, sequence_tokens=s)
        flops = ctx.tokens * per_key * attended
        measured = measured_core_attention_time(ctx, flops=flops, io_bytes=io_bytes)
        if measured is not None:
            return measured
        return ctx.op(flops, io_bytes, calls=calls, kind="attention")
    matmul = ctx.op(ctx.tokens * per_key * s, io_bytes, calls=calls, kind="attention")
    # Scores written by QK^T, softmax read+write, (dropout read+write+mask), read by PV.
    passes = 4.0 * ACTIVATION_BYTES + (
        2.0 * ACTIVATION_BYTES + 1.0 if ctx.options.attention_dropout else 0.0
    )
    scores = ctx.tokens * heads * s
    return matmul + ctx.op(0.0, scores * passes, calls=calls)


def measured_core_attention_time(ctx: TrainingContext, *, flops, io_bytes) -> np.ndarray | None:
    """Fused causal attention of one layer (forward) at the efficiency measured for its shape,
    or None where nothing is measured.

    A FlashAttention-class kernel's efficiency grows with the sequence it attends over and with
    the (sequence, query head) pairs of one call: on H100 the imported context-attention tables
    run causal bf16 attention of 128-wide heads at 0.47-0.55 of peak over 4K tokens and
    0.56-0.66 over 8K (B200: 0.47-0.52 and 0.55-0.60), where the single efficiency fitted over
    every measured shape (``data/calibration.json``) is 0.41 (B200: 0.29). The curve
    (``_kernel_curves.context_attention_time_s``: best over the serving engines' kernels, by
    sequence ``s / cp`` — a ring step attends one block of keys — and by pairs ``b * heads /
    tp``) prices the forward; the backward keeps the calibration's relation to it
    (``_calibration_operators.training_attention_efficiency``: FlashAttention-2's backward
    runs at 0.63/0.73 of its forward's peak fraction), so the forward is charged at the single
    forward + backward efficiency of its measured forward efficiency, and ``micro_batch_times``
    adds 2.5x it for the backward. The FlashAttention-3 paper (Shah et al. 2024,
    arXiv:2407.08608, H100 SXM5 charts of head dim 128) measures TransformerEngine's kernel,
    cuDNN, at 609 and 600 TFLOP/s forward, 499 and 518 backward over 4K and 8K tokens: 0.53-0.55
    of peak for forward + backward, the level of the curve, not the fitted 0.37, and a
    backward/forward ratio (0.82-0.86) that matches FlashAttention-2's. Only full causal MHA/GQA attention with 128-wide heads in
    bf16 (the tables' shapes), on a device they cover, without a measured profile of its own
    (``HardwareSpec.profile``, which ``op_time_s`` uses), and with
    ``EstimateOptions.measured_attention`` on. Off by default: with it on, the Megatron-Bridge
    Llama 3 8B runs at 8K tokens (attention a third of their forward) go from -13.7% to +2.6%
    (B200), -11.0% to +6.8% (GB200) and -18.1% to -9.4% (H100), but runs the model already
    prices fast get faster: the Llama 3 70B GB200 runs by 10-13 points to +10%, the README's
    1.7B H100 run from +40% to +47%, the Llama 3 paper's 131K-context run from +5% to +31%
    (all training runs: 14.4% -> 15.8% mean error), time the rest of the model misses."""
    attention, device = ctx.model.attention, ctx.cluster.device
    if (
        not ctx.options.measured_attention
        or attention.kind == "mla"
        or attention.variant != "full"
        or attention.qk_head_dim != 128
        or attention.value_head_dim != 128
        or ctx.workload.precision not in ("bf16", "fp8")
        or getattr(device, "profile", None) is not None
    ):
        return None
    forward = context_attention_time_s(
        hardware=device,
        flops=flops,
        bytes_moved=io_bytes,
        tokens=ctx.workload.sequence_length_tokens / ctx.column("cp"),
        units=ctx.column("micro_batch_size") * _heads_per_rank(ctx),
    )
    if forward is None:
        return None
    return forward / training_attention_efficiency(1.0)


def _activation_passes(ctx: TrainingContext) -> float:
    """Reads + writes of the activation function per element of its output: fused GELU 2,
    fused SwiGLU 3 (read gate and up, write); eager PyTorch runs SwiGLU as ``silu(gate)``
    (read, write) then ``* up`` (two reads, a write): 5 (``fused_elementwise`` off)."""
    if ctx.model.ffn_activation != "swiglu":
        return 2.0
    return 3.0 if ctx.fused_elementwise else 5.0


def dense_ffn_time(ctx: TrainingContext) -> np.ndarray:
    model = ctx.model
    params = model.ffn_parameters(model.ffn_hidden_size) / ctx.column("tp")
    width = model.ffn_hidden_size / ctx.column("tp")
    matmul = ctx.op(
        2.0 * ctx.tokens * params,
        params * 2.0 + ctx.tokens * 2.0 * (model.hidden_size + width) * ACTIVATION_BYTES,
    )
    return matmul + ctx.op(0.0, ctx.tokens * width * _activation_passes(ctx) * ACTIVATION_BYTES)


def moe_ffn_time(ctx: TrainingContext) -> np.ndarray:
    """Router, dispatcher passes, routed experts (busiest rank) and shared experts
    (``_training_moe``)."""
    return training_moe.moe_ffn_time(ctx, activation_passes=_activation_passes(ctx))


def layer_elementwise_time(ctx: TrainingContext) -> np.ndarray:
    """Two norms (read+write), two residual adds (2 reads + write), hidden dropout (read, write,
    1-byte mask) on the hidden-size activation; split over tp with sequence parallel. The norms
    are priced as norm kernels (``op_time_s`` kind ``norm``: a measured norm curve if any).
    Eager RMSNorm (``fused_elementwise`` off: ``x.float()``, ``pow(2).mean()``, ``x * rsqrt``,
    ``type_as``, ``* weight`` as separate kernels) moves 36 bytes per element against the
    fused kernel's 4: 9x. Rotary embeddings of the query and key heads (``rotary_time``)."""
    passes = 6.0 + (5.0 if ctx.options.hidden_dropout else 0.0)
    return ctx.op(0.0, _hidden_bytes(ctx) * passes) + norm_time(ctx) + rotary_time(ctx)


def _hidden_bytes(ctx: TrainingContext) -> np.ndarray:
    """Bytes of one hidden-size activation of a micro-batch on one rank (split over tp with SP)."""
    tokens = np.where(ctx.sequence_parallel, ctx.tokens / ctx.column("tp"), ctx.tokens)
    return tokens * ctx.model.hidden_size * ACTIVATION_BYTES


def norm_time(ctx: TrainingContext) -> np.ndarray:
    """The two norms of one layer (read + write each), forward (``layer_elementwise_time``)."""
    norm_factor = 1.0 if ctx.fused_elementwise else 9.0
    return ctx.op(0.0, 2.0 * 2.0 * _hidden_bytes(ctx) * norm_factor, calls=2.0, kind="norm")


def mla_up_projection_time(ctx: TrainingContext) -> np.ndarray:
    """MLA's up-projections of one layer, forward: the query up-projection (q rank to heads x
    qk_head_dim; the query projection itself without a q rank is not an up-projection) and the
    key/value up-projection (kv rank to heads x (qk_nope + v)), column-parallel over tp, with
    rotary embedding of the query and key heads that follows them (Megatron-core
    ``MultiLatentAttention``: the region ``--recompute-modules mla_up_proj`` recomputes). Zero
    for other attention kinds."""
    attention = ctx.model.attention
    if attention.kind != "mla":
        return np.zeros_like(ctx.tokens)
    heads = _heads_per_rank(ctx)
    q_in = float(attention.q_lora_rank or 0)
    q_out = heads * attention.qk_head_dim if attention.q_lora_rank else 0.0
    kv_out = heads * (attention.qk_nope_head_dim + attention.value_head_dim)
    params = q_in * q_out + attention.kv_lora_rank * kv_out
    widths = q_in + q_out + attention.kv_lora_rank + kv_out  # inputs and outputs
    moved = params * 2.0 + ctx.tokens * widths * ACTIVATION_BYTES
    gemms = ctx.op(2.0 * ctx.tokens * params, moved, calls=2.0)
    return gemms + rotary_time(ctx)


def rotary_time(ctx: TrainingContext) -> np.ndarray:
    """Rotary position embedding of one layer's query and key heads (Su et al., RoFormer,
    arXiv:2104.09864): a fused kernel reads and writes each bf16 element (4 bytes; Megatron-core
    / TransformerEngine fused RoPE); eager complex multiplication (``view_as_complex`` of the
    fp32 copy, multiply by the fp32 frequencies, ``view_as_real``, ``type_as``) moves 28.
    Zero for learned positions."""
    if ctx.model.position_embedding != "rope":
        return np.zeros_like(ctx.tokens)
    attention = ctx.model.attention
    if attention.kind == "mla":
        width = (attention.num_heads / ctx.column("tp") + 1.0) * attention.qk_rope_head_dim
    else:
        kv_heads = np.maximum(attention.num_kv_heads / ctx.column("tp"), 1.0)
        width = (attention.num_heads / ctx.column("tp") + kv_heads) * attention.head_dim
    per_element = 4.0 if ctx.fused_elementwise else 28.0
    return ctx.op(0.0, ctx.tokens * width * per_element)


def lm_head_time(ctx: TrainingContext) -> np.ndarray:
    """Vocabulary-parallel output projection and cross-entropy (fp32 logits read/written 3 times)."""
    model = ctx.model
    vocab = model.vocab_size / ctx.column("tp")
    matmul = ctx.op(
        2.0 * ctx.tokens * model.hidden_size * vocab,
        model.hidden_size * vocab * 2.0,
        role="lm_head",
    )
    return matmul + ctx.op(0.0, ctx.tokens * vocab * 4.0 * 3.0)


def embedding_time(ctx: TrainingContext) -> np.ndarray:
    return ctx.op(0.0, ctx.tokens * ctx.model.hidden_size * 2.0 * ACTIVATION_BYTES)


def kernels_per_layer(ctx: TrainingContext | SimpleNamespace) -> tuple[float, float]:
    """Kernels one layer launches in its forward pass (dense, MoE): projections (fused QKV +
    output; MLA adds its down/up projections and two norms), core attention (one fused kernel,
    or two batched GEMMs + softmax + dropout unfused), FFN (two GEMMs + activation), two norms
    and two residual/dropout adds; an MoE layer adds router, top-k, permute/unpermute, grouped
    GEMMs and the shared expert. Each pays the calibration's fixed per-kernel cost (launch and
    wave tail), which matters for small layers."""
    projections = 7.0 if ctx.model.attention.kind == "mla" else 2.0
    core = 1.0 if ctx.options.flash_attention else 4.0
    common = projections + core + 4.0
    shared = 3.0 if ctx.model.moe is not None and ctx.model.moe.num_shared_experts else 0.0
    return common + 3.0, common + 8.0 + shared


def tensor_parallel_host_time(ctx: TrainingContext) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Host seconds the tensor-parallel linears add to a forward pass: (dense layer, MoE layer,
    one linear). A measured hardware profile gives the seconds per column/row-parallel linear,
    forward + backward, by the activation bytes entering it (DTensor dispatch and the wait for
    the slower rank at each split; ``HardwareSpec.sharded_module_time_s``); a third is charged
    here, as the backward is 2 x the forward. Linears: attention (MLA q_b/q, kv_b, o; else q, k,
    v, o), dense FFN or shared experts (3 each); the embedding and LM head use ``one linear``.
    Zero with tp = 1 or without a profile."""
    device = ctx.cluster.device
    activation_bytes = ctx.tokens * ctx.model.hidden_size * ACTIVATION_BYTES
    if hasattr(device, "sharded_module_time_s"):  # measured, by the activation entering the linear
        per_linear = device.sharded_module_time_s(activation_bytes) / 3.0
    else:
        per_linear = getattr(device, "sharded_module_overhead_s", 0.0) / 3.0
    per_linear = np.where(ctx.column("tp") > 1, per_linear, 0.0)
    attention = 3.0 if ctx.model.attention.kind == "mla" else 4.0
    moe = ctx.model.moe
    shared = 3.0 if moe is not None and moe.num_shared_experts else 0.0
    return (attention + 3.0) * per_linear, (attention + shared) * per_linear, per_linear


def layer_host_time(ctx: TrainingContext) -> tuple[np.ndarray, np.ndarray]:
    """Measured host seconds of one (dense, MoE) layer, forward + backward, beyond its kernels'
    work (``HardwareSpec.layer_host_time_s``: dispatch and autograd bookkeeping of every
    operator, the intercept of layer time versus work); zeros without a measured profile."""
    device = ctx.cluster.device
    if not hasattr(device, "layer_host_time_s"):
        return np.zeros_like(ctx.tokens), np.zeros_like(ctx.tokens)
    moe = ctx.model.moe
    experts = 0.0 if moe is None else moe.num_routed_experts / ctx.column("ep")
    dense, moe_layer = device.layer_host_time_s(np.broadcast_to(experts, ctx.tokens.shape))
    return dense, moe_layer


def _host_gpu_parts(
    ctx: TrainingContext,
    *,
    moe_layer: np.ndarray,
    moe_ffn: np.ndarray,
    rest_forward: np.ndarray,
    backward: np.ndarray,
    times: CollectiveTimes,
) -> LayerGpuParts:
    """GPU seconds of the parts the host issue time is compared with (``_training_host``): an
    MoE layer's dispatch-to-combine segment is its MoE block less the router plus the forward
    all-to-alls, of which the routed and shared experts; the rest of the layer comes before the
    dispatch's host sync."""
    if ctx.model.moe is None:
        zeros = np.zeros_like(ctx.tokens)
        return LayerGpuParts(zeros, zeros, zeros, rest_forward, backward)
    segment = moe_ffn - training_moe.router_time(ctx)
    passes = _activation_passes(ctx)
    experts = training_moe.routed_experts_time(
        ctx, activation_passes=passes
    ) + training_moe.shared_experts_time(ctx, activation_passes=passes)
    return LayerGpuParts(
        moe_before_sync=moe_layer - segment,
        moe_after_sync=segment + times.ep_exchange,
        moe_experts=experts,
        rest_forward=rest_forward,
        backward=backward,
    )


def gradient_accumulation_time(ctx: TrainingContext) -> np.ndarray:
    """Unfused main-gradient accumulation of one micro-batch on each pipeline rank (rows
    ``STAGES``; ``EstimateOptions.fused_gradient_accumulation``): per parameter, read the 2-byte
    gradient and read + write the fp32 main gradient. The profile's measured curve prices it
    where there is one, else the memory roofline; zero when fused or without fp32 main grads."""
    if ctx.options.fused_gradient_accumulation or not ctx.workload.master_weights_fp32:
        return np.zeros(ctx.layout.layers.shape)
    moved = sum(ctx.parameters.values()) * (ACTIVATION_BYTES + 2.0 * ctx.grad_bytes)
    device = ctx.cluster.device
    measured = (
        device.gradient_accumulation_time_s(moved)
        if hasattr(device, "gradient_accumulation_time_s")
        else None
    )
    if measured is None:
        return ctx.op(0.0, moved)
    return np.asarray(measured) / ctx.calibration.memory_scale(device)


# ---------------------------------------------------------------------------- per micro-batch
@dataclass(frozen=True)
class MicroBatchTimes:
    """Seconds of one micro-batch on each pipeline rank (rows ``STAGES``)."""

    forward: np.ndarray
    backward: np.ndarray
    recompute: np.ndarray
    core_attention: (
        np.ndarray
    )  # forward + backward + recompute of core attention (CP overlap window)
    comm: dict[str, np.ndarray]  # tp_comm, ep_comm, cp_comm: total per micro-batch
    dense_layer_forward: (
        np.ndarray
    )  # (n,) one dense layer's forward (ZeRO-3 per-layer overlap window)
    moe_layer_forward: np.ndarray  # (n,) one MoE layer's forward
    host_wait: np.ndarray  # seconds of forward + backward spent waiting on the host (in both)


def micro_batch_times(ctx: TrainingContext, times: CollectiveTimes) -> MicroBatchTimes:
    layout = ctx.layout
    core = core_attention_time(ctx)
    dense_launches, moe_launches = kernels_per_layer(ctx)
    overhead = ctx.calibration.kernel_overhead_s
    dense_sharded, moe_sharded, per_sharded = tensor_parallel_host_time(ctx)
    dense_host, moe_host = layer_host_time(
        ctx
    )  # forward + backward: a third here, as backward = 2 x forward
    common = attention_projection_time(ctx) + layer_elementwise_time(ctx)
    dense_ffn = dense_ffn_time(ctx)
    dense_layer = (
        common + core + dense_ffn + dense_launches * overhead + dense_sharded + dense_host / 3.0
    )
    moe_ffn = moe_ffn_time(ctx)
    moe_layer = common + core + moe_ffn + moe_launches * overhead + moe_sharded + moe_host / 3.0
    # fp8 quantization kernels, forward + backward: a third here, as backward = 2 x forward.
    dense_layer = dense_layer + quantization_time_s(ctx, moe=False) / 3.0
    moe_layer = moe_layer + quantization_time_s(ctx, moe=True) / 3.0
    layers_forward = layout.dense_layers * dense_layer + layout.moe_layers * moe_layer
    ends = layout.has_embedding * (embedding_time(ctx) + per_sharded) + layout.has_lm_head * (
        lm_head_time(ctx) + per_sharded
    )
    core_backward_factor = 2.5 if ctx.options.flash_attention else 2.0
    backward = 2.0 * (layers_forward + ends) + (core_backward_factor - 2.0) * layout.layers * core
    backward = backward + gradient_accumulation_time(ctx)
    # A stretch of work takes at least the host's time to issue it (``_training_host``).
    host_forward, host_backward = exposed_host_s(
        ctx,
        gpu=_host_gpu_parts(
            ctx,
            moe_layer=moe_layer,
            moe_ffn=moe_ffn,
            rest_forward=layout.dense_layers * dense_layer + ends,
            backward=backward,
            times=times,
        ),
    )
    backward = backward + host_backward
    selective = np.asarray(ctx.table["recompute"]) == RECOMPUTE_CODES["selective"]
    modules = RecomputeWork(core=core, dense_ffn=dense_ffn, moe_ffn=moe_ffn)
    recompute = ctx.full_recompute_share * layers_forward + np.where(
        selective, _selective_recompute(ctx, layers_forward=layers_forward, work=modules), 0.0
    )
    core_recomputed = ctx.fully_recomputed_layers + np.where(
        selective & _recomputes_core_attention(ctx), layout.layers, 0.0
    )
    core_total = layout.layers * core * (1.0 + core_backward_factor) + core_recomputed * core
    return MicroBatchTimes(
        forward=layers_forward + ends + host_forward,
        backward=backward,
        recompute=recompute,
        core_attention=core_total,
        comm=_micro_batch_comm(ctx, times),
        dense_layer_forward=np.broadcast_to(dense_layer, ctx.tokens.shape),
        moe_layer_forward=np.broadcast_to(moe_layer, ctx.tokens.shape),
        host_wait=host_forward + host_backward,
    )


@dataclass(frozen=True)
class RecomputeWork:
    """Forward seconds of one layer's parts that selective recompute may repeat, already priced
    for the layer (shape (n,)): core attention, a dense FFN, an MoE block."""

    core: np.ndarray
    dense_ffn: np.ndarray
    moe_ffn: np.ndarray


def _op_level_selective(ctx: TrainingContext) -> bool:
    return ctx.framework is not None and ctx.framework.selective_recompute == "every_second_matmul"


def _recomputes_core_attention(ctx: TrainingContext) -> bool:
    return not _op_level_selective(ctx) and "core_attn" in ctx.options.recompute_modules


def _selective_recompute(
    ctx: TrainingContext, *, layers_forward: np.ndarray, work: RecomputeWork
) -> np.ndarray:
    """Forward seconds selective recompute repeats in backward on each rank (3, n).

    Megatron-core recomputes the modules ``EstimateOptions.recompute_modules`` names, each once
    more in backward (``--recompute-modules``; Megatron-Bridge docs/training/activation-
    recomputation.md; ``recompute_module_times``); its default, core attention, is Korthikanti
    et al. 2022 sec. 5. torchtitan's op-level selective checkpointing saves every second matmul
    output, the attention output and the collectives, and recomputes the rest: half the matmul
    and elementwise forward, not core attention (torchtitan ``_apply_op_sac``, ``_save_list``).
    The framework profile says which."""
    layout = ctx.layout
    if _op_level_selective(ctx):
        return 0.5 * (layers_forward - layout.layers * work.core)
    dense, moe = recompute_module_times(ctx, work=work)
    return layout.dense_layers * dense + layout.moe_layers * moe


def recompute_module_times(
    ctx: TrainingContext, *, work: RecomputeWork
) -> tuple[np.ndarray, np.ndarray]:
    """Forward seconds of one (dense, MoE) layer's selective-recompute modules (shape (n,)),
    Megatron-core's ``--recompute-modules``: ``core_attn`` the attention scores, softmax and
    weighted values; ``mla_up_proj`` MLA's up-projection GEMMs and rotary embedding
    (``mla_up_projection_time``); ``layernorm`` the two norms; ``mlp`` a dense layer's FFN;
    ``moe`` the whole MoE block (router, dispatcher passes, experts, shared experts; its
    all-to-alls repeat in ``_micro_batch_comm``), which contains ``moe_act`` (the routed experts'
    activation function) and ``shared_experts``."""
    modules = frozenset(ctx.options.recompute_modules)
    zeros = np.zeros_like(ctx.tokens)
    common = work.core if "core_attn" in modules else zeros
    if "mla_up_proj" in modules:
        common = common + mla_up_projection_time(ctx)
    if "layernorm" in modules:
        common = common + norm_time(ctx)
    dense = common + work.dense_ffn if "mlp" in modules else common
    if ctx.model.moe is None:
        return dense, dense
    passes = _activation_passes(ctx)
    if "moe" in modules:
        return dense, common + work.moe_ffn
    moe = common
    if "moe_act" in modules:
        moe = moe + training_moe.expert_activation_time(ctx, activation_passes=passes)
    if "shared_experts" in modules:
        moe = moe + training_moe.shared_experts_time(ctx, activation_passes=passes)
    return dense, moe


def _micro_batch_comm(ctx: TrainingContext, times: CollectiveTimes) -> dict[str, np.ndarray]:
    """TP, EP and CP seconds of one micro-batch per rank: forward, backward, full recompute."""
    layout = ctx.layout
    # Forward, backward, and the forward full recompute repeats on its share of the layers.
    passes = 2.0 + ctx.full_recompute_share
    # Selective recompute of the ``moe`` module repeats the MoE block's dispatch and combine.
    moe_repeat = np.asarray(ctx.table["recompute"]) == RECOMPUTE_CODES["selective"]
    moe_repeat = (
        moe_repeat & ("moe" in ctx.options.recompute_modules) & (not _op_level_selective(ctx))
    )
    ep_passes = passes + moe_repeat
    tp_layer = np.where(ctx.sequence_parallel, times.tp_split, times.tp_all_reduce)
    # A blocking collective between compute segments waits for the ranks' wake-up beyond its
    # own time (measured, ``HardwareSpec.collective_sync_s``; 0 without a profile).
    sync = getattr(ctx.cluster.device, "collective_sync_s", 0.0)
    mla_extra = max(len(mla_backward_widths(ctx.model)) - 1.0, 0.0)
    mla_backward = np.where(ctx.sequence_parallel, 0.0, layout.layers * times.tp_mla_backward)
    tp_count = (
        passes * layout.layers * 2.0
        + layout.has_embedding
        + np.where(ctx.sequence_parallel, 0.0, layout.layers * mla_extra)
    )
    return {
        # Two collectives per layer and pass (MLA: more in backward without SP; the all-gathers
        # may move fp8, ``_training_comm._tp``); the vocab-parallel embedding all-reduces once.
        "tp_comm": passes * layout.layers * 2.0 * tp_layer
        + layout.has_embedding * times.tp_all_reduce
        + mla_backward
        + np.where(ctx.column("tp") > 1, tp_count * sync, 0.0),
        # Dispatch and combine: two all-to-alls per MoE layer and pass (forward and recompute
        # forward may dispatch in fp8; backward exchanges bf16 gradients).
        "ep_comm": layout.moe_layers
        * ((ep_passes - 1.0) * times.ep_exchange + times.ep_exchange_backward)
        + np.where(ctx.column("ep") > 1, ep_passes * layout.moe_layers * 2.0 * sync, 0.0),
        # The backward ring carries K/V and their gradients: twice the forward traffic.
        "cp_comm": (passes + 1.0) * layout.layers * times.cp_ring,
    }


# ---------------------------------------------------------------------------- the step
def training_time_columns(ctx: TrainingContext) -> dict[str, np.ndarray]:
    """``time.<part>``, ``hidden.<kind>``, ``step_time_s`` and helpers for every row."""
    times = table_collective_times(ctx)
    mb = micro_batch_times(ctx, times)
    compute = mb.forward + mb.backward + mb.recompute
    # Each link's traffic hides behind the compute once: a kind takes what the kinds before it
    # on the same link left (they share its bandwidth), CP only behind core attention; kinds on
    # NVLink and on the NIC overlap the same compute concurrently (``_training_links``). What
    # each link leaves is the window of the pipeline and data-parallel traffic on it.
    exposed, hidden, windows = {}, {}, LinkWindows(compute)
    fractions = {kind: ctx.overlap_fraction(kind) for kind in ("cp_comm", "tp_comm", "ep_comm")}
    merged, pairs = _ep_overlap(ctx, mb, times)
    fractions["ep_comm"] = np.where(merged, pairs.hidden_fraction, fractions["ep_comm"])
    for kind in ("cp_comm", "tp_comm", "ep_comm"):
        comm, on_nic = mb.comm[kind], crosses_nodes(ctx, kind)
        free = windows.free(on_nic)
        window = np.minimum(mb.core_attention, free) if kind == "cp_comm" else free
        hidden[kind] = hidden_seconds(comm, fraction=fractions[kind], window=window)
        exposed[kind] = comm - hidden[kind]
        windows.take(hidden[kind], exposed=exposed[kind], on_nic=on_nic)
    # Hidden traffic is not free: the compute it runs beside slows down (``contention_seconds``).
    contention = contention_seconds(sum(hidden.values()))
    offload = _exposed_offload(ctx, mb)
    per_micro_batch = compute + sum(exposed.values()) + contention + offload + pairs.host_wait
    # The pipeline's fill and drain run micro-batches with nothing to merge with: the bubble is
    # counted in micro-batches as they run unmerged (EP all-to-alls exposed, no merged host wait).
    merged_hidden = np.where(merged, hidden["ep_comm"], 0.0)
    unmerged = per_micro_batch - pairs.host_wait + merged_hidden - contention_seconds(merged_hidden)
    slowest = np.argmax(per_micro_batch, axis=0)[None, :]

    def pick(rows: np.ndarray) -> np.ndarray:
        return np.take_along_axis(np.broadcast_to(rows, per_micro_batch.shape), slowest, axis=0)[0]

    m = ctx.num_micro_batches
    columns = {
        "time.compute": m * pick(mb.forward + mb.backward + pairs.host_wait),
        "time.recompute": m * pick(mb.recompute),
        "time.offload": m * pick(offload),
        **{f"time.{kind}": m * pick(exposed[kind]) for kind in exposed},
        **{f"hidden.{kind}": m * pick(hidden[kind]) for kind in hidden},
        "time.bubble": _bubble(
            ctx, micro_batch=pick(unmerged), forward_share=pick(mb.forward / compute)
        ),
        "bottleneck_stage": slowest[0],
    }
    mb_contention = m * pick(contention)
    # Forward activation and backward gradient send/recv per micro-batch and model chunk, plus
    # the pipeline fill and flush: the first micro-batch's activation crosses pp*v - 1 chunk
    # boundaries before the last stage starts, its gradient as many on the way back (the
    # latency the bubble's compute-only count leaves out; Narayanan et al. SC'21 sec. 2.2).
    v = ctx.column("virtual_stages")
    hops = np.where(ctx.column("pp") > 1, ctx.column("pp") * v - 1.0, 0.0)
    pp_free = windows.stream_window(crosses_nodes(ctx, "pp_comm"))
    steady, pp_hidden = _pipeline_p2p(ctx, m=m, v=v, p2p=times.pp_p2p, free=m * pick(pp_free))
    pp_comm = steady - pp_hidden + 2.0 * hops * times.pp_p2p
    mb_contention = mb_contention + contention_seconds(pp_hidden)
    # Each micro-batch's schedule actions on a stage cost host time beyond the send/recv.
    schedule_s = getattr(ctx.cluster.device, "pipeline_micro_batch_s", 0.0)
    pp_comm = pp_comm + np.where(
        ctx.column("pp") > 1, m * ctx.column("virtual_stages") * schedule_s, 0.0
    )
    columns["time.pp_comm"], columns["hidden.pp_comm"] = pp_comm, pp_hidden
    dp_free = windows.stream_window(crosses_nodes(ctx, "dp_comm"))
    dp_exposed, dp_hidden, optimizer = dp_and_optimizer(
        ctx, free_compute=dp_free, times=times, mb=mb
    )
    columns["time.dp_comm"], columns["hidden.dp_comm"], columns["time.optimizer"] = (
        dp_exposed,
        dp_hidden,
        optimizer,
    )
    columns["time.contention"] = mb_contention + contention_seconds(dp_hidden)
    columns["step_time_s"] = sum(columns[f"time.{part}"] for part in TRAINING_TIME_PARTS)
    return columns


def _pipeline_p2p(
    ctx: TrainingContext, *, m: np.ndarray, v: np.ndarray, p2p: np.ndarray, free: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(steady-state, hidden) pipeline send/recv seconds per step: one activation forward and
    one gradient backward per micro-batch and model chunk. Asynchronous sends and receives
    (``EstimateOptions.pipeline_p2p_overlap``) hide them behind the step's time their link's
    other traffic left (``free``, ``LinkWindows.stream_window``); blocking ones hide nothing."""
    steady = np.where(ctx.column("pp") > 1, 2.0 * m * v * p2p, 0.0)
    if not ctx.options.pipeline_p2p_overlap:
        return steady, np.zeros_like(steady)
    return steady, hidden_seconds(steady, fraction=1.0, window=free)


def _ep_overlap(
    ctx: TrainingContext, mb: MicroBatchTimes, times: CollectiveTimes
) -> tuple[np.ndarray, MergedPairs]:
    """(rows (n,) where Megatron-core's EP communication overlap runs, what it hides and the
    host wait it adds on each rank; ``_training_ep_overlap``). It runs nowhere with the option
    off, on layouts Megatron-core refuses, or under a bidirectional schedule (which hides it
    all). The host wait of the merged pairs is GPU idle time, counted in ``time.compute`` as
    the unmerged host wait is."""
    applies = ep_overlap_applies(ctx) & (not ctx.options.bidirectional_pipeline)
    if not applies.any():
        zeros = np.zeros(ctx.layout.layers.shape)
        return applies, MergedPairs(hidden_fraction=zeros, host_wait=zeros)
    pairs = merged_pairs(
        ctx,
        moe_layer_forward=mb.moe_layer_forward,
        activation_passes=_activation_passes(ctx),
        times=times,
        unmerged_host_wait=mb.host_wait,
    )
    return applies, pairs


def _exposed_offload(ctx: TrainingContext, mb: MicroBatchTimes) -> np.ndarray:
    """Seconds CPU activation offloading adds to one micro-batch on each rank (3, n).

    Megatron-core offloads the activations of the first ``EstimateOptions.activation_offload_layers``
    layers of a rank (``--cpu-offloading-num-layers``; Megatron-Bridge docs/training/
    cpu-offloading.md: "Overlaps computation with data transfers (Host2Device and Device2Host)").
    Its offload context (Megatron-core ``TransformerBlock`` with Transformer Engine's
    ``get_cpu_offload_context``, ``transformer_engine/pytorch/cpu_offload.py``) copies a layer's
    saved tensors to the host on a side stream while the next layer's forward runs, and waits
    for the copy before the layer after; in backward it reloads a layer while the layer above
    runs its backward. Each offloaded layer therefore exposes max(0, copy - one layer's forward)
    and max(0, copy - one layer's backward), the copy being the layer's stored activations
    (``_memory.offloaded_layer_bytes``) over the device-host link, one direction
    (``HardwareSpec.host_link_bandwidth_bytes_per_s``). A layer's forward is the rank's mean
    layer; its backward window scales it by the rank's backward (with recompute) over forward.
    Not modelled: the HBM bandwidth the copies take from the kernels they run beside."""
    count = ctx.options.activation_offload_layers
    if count == 0:
        return np.zeros_like(mb.forward)
    bandwidth = getattr(ctx.cluster.device, "host_link_bandwidth_bytes_per_s", None)
    if bandwidth is None:
        raise ValueError(
            f"activation_offload_layers ({count}) needs the device-host link bandwidth; "
            f"{ctx.cluster.device.name} has no host_link_bandwidth_bytes_per_s"
        )
    layout = ctx.layout
    copy = offloaded_layer_bytes(ctx) / bandwidth
    layer_forward = (
        layout.dense_layers * mb.dense_layer_forward + layout.moe_layers * mb.moe_layer_forward
    ) / np.maximum(layout.layers, 1.0)
    backward_ratio = (mb.backward + mb.recompute) / np.maximum(mb.forward, 1e-30)
    layer_backward = layer_forward * backward_ratio
    per_layer = np.maximum(copy - layer_forward, 0.0) + np.maximum(copy - layer_backward, 0.0)
    return np.minimum(float(count), layout.layers) * per_layer


def _bubble(
    ctx: TrainingContext, *, micro_batch: np.ndarray, forward_share: np.ndarray
) -> np.ndarray:
    """(pp - 1) micro-batches of idle time, scaled by the schedule: 1/v interleaved (Narayanan
    et al. SC'21), the forward share for ZB-H1 (Qi et al.), and for a bidirectional schedule
    DualPipe's (pp/2 - 1)(F&B + B - 3W) with the weight-gradient half of B deferred (W = B/2,
    F&B = F + B): (pp/2 - 1)(F + B/2) (DeepSeek-V3 report Table 2)."""
    pp, v = ctx.column("pp"), ctx.column("virtual_stages")
    schedule = np.asarray(ctx.table["pipeline_schedule"])
    factor = np.where(
        schedule == SCHEDULE_CODES["interleaved_1f1b"],
        1.0 / v,
        np.where(schedule == SCHEDULE_CODES["zero_bubble"], forward_share, 1.0),
    )
    if ctx.options.bidirectional_pipeline:
        half = np.maximum(pp / 2.0 - 1.0, 0.0) / np.maximum(pp - 1.0, 1.0)
        factor = half * (0.5 + 0.5 * forward_share)
    return (pp - 1.0) * micro_batch * factor


def model_flops_per_step(
    *, model: ModelSpec, workload: Training, attention: Literal["causal", "full_square"] = "causal"
) -> float:
    """Model FLOPs of one step: 3 x forward (forward + 2 x backward), no recompute.

    ``attention="causal"`` counts the keys a causal query attends (mean (S+1)/2 for full
    attention), as FlashAttention-2 (Dao 2023, sec. 4.1) counts causal FLOPs: half the square; the
    MFU this library reports uses it, so that it never exceeds 100% at S >> hidden.
    ``attention="full_square"`` counts every query against all S keys: the convention of PaLM
    (Chowdhery et al. 2022, App. B), Megatron-LM's ``num_floating_point_operations`` and
    torchtitan's ``get_num_flop_per_token``, in which published MFU figures are stated; a
    published MFU is compared in its own convention.
    """
    spec = model.attention
    per_key = 2.0 * spec.num_heads * (spec.qk_head_dim + spec.value_head_dim)
    sequence = workload.sequence_length_tokens
    if attention == "full_square":
        attended = float(sequence)
    elif attention == "causal":
        attended = float(mean_attended_tokens(attention=spec, sequence_tokens=sequence))
    else:
        raise ValueError(f"attention ({attention!r}) must be 'causal' or 'full_square'")
    forward = 2.0 * model.matmul_parameters_per_token() + model.num_layers * per_key * attended
    return 3.0 * forward * workload.tokens_per_step


__all__ = [
    "TRAINING_TIME_PARTS",
    "model_flops_per_step",
    "training_context",
    "training_time_columns",
]
