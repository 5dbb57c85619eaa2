"""Forward seconds of one layer's operators on one device, for every row of a config table.

Each operator is a roofline (``_pricing.op_time_s``, through ``TrainingContext.op``) of its FLOPs
and bytes on one device:

* projections, dense FFN, router, routed and shared experts, LM head: matmuls, 2 FLOPs per
  multiply-accumulate (Kaplan et al. 2020 Table 1);
* core attention: 2*heads*(qk_dim + v_dim) FLOPs per attended key; causal masking and the
  long-context variants via ``mean_attended_tokens``; a FlashAttention-class kernel at the
  efficiency measured for its shape where ``EstimateOptions.measured_attention`` asks
  (``measured_core_attention_time``: FlashAttention-2, Dao 2023; FlashAttention-3, Shah et al.
  2024, arXiv:2407.08608), and torch SDPA's FlashAttention-2 kernels on Hopper at that curve
  times their measured time ratio to the cuDNN-class kernels (``flash2_core_attention_time``,
  ``data/attention_kernels.json``); unfused attention multiplies the full s x s square and adds
  memory-bound softmax/dropout passes over it;
* norms, residual adds, dropout, activation functions and rotary embeddings (Su et al.,
  RoFormer, arXiv:2104.09864): memory-bound passes, fused or eager (``fused_elementwise``); an
  MoE layer's router, token dispatcher and grouped expert GEMMs as Megatron-core runs them
  (``_training_moe``);
* per-kernel fixed costs (``kernels_per_layer``), the measured host time of tensor-parallel
  linears and of a layer (``HardwareSpec.sharded_module_time_s``, ``layer_host_time_s``), and
  unfused main-gradient accumulation.

``_training_micro_batch`` adds them into a micro-batch (backward, recompute, communication).
Split from ``_training``.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from types import SimpleNamespace

import numpy as np

from cost_model import _training_moe as training_moe
from cost_model._calibration_fits import training_attention_efficiency
from cost_model._kernel_curves import DEVICE_ALIASES
from cost_model._kernel_curves_attention import context_attention_time_s
from cost_model._pricing import mean_attended_tokens
from cost_model._stages import attention_parameters_per_device
from cost_model._training_comm import ACTIVATION_BYTES
from cost_model._training_context import TrainingContext

__all__ = [
    "activation_passes",
    "attention_kernel",
    "attention_projection_time",
    "core_attention_time",
    "dense_ffn_time",
    "embedding_time",
    "flash2_core_attention_time",
    "flash2_time_ratio",
    "gradient_accumulation_time",
    "cross_entropy_bytes_per_logit",
    "cross_entropy_time",
    "kernels_per_layer",
    "layer_elementwise_time",
    "layer_host_time",
    "lm_head_time",
    "measured_core_attention_time",
    "mla_up_projection_time",
    "moe_ffn_time",
    "norm_time",
    "rotary_time",
    "tensor_parallel_host_time",
]


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
        # a DSA indexer over every earlier key and linear layers' recurrence (the mean layer),
        # their heads split over the tensor-parallel ranks like the attention heads
        side = ctx.model.side_attention_flops_per_token((s + 1.0) / 2.0) / ctx.model.num_layers
        flops = ctx.tokens * (per_key * attended + side / ctx.column("tp"))
        flash2 = flash2_core_attention_time(ctx, flops=flops, io_bytes=io_bytes)
        if flash2 is not None:
            return flash2
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
    (``_kernel_curves_attention.context_attention_time_s``: best over the serving engines'
    kernels, by sequence ``s / cp`` — a ring step attends one block of keys — and by pairs ``b *
    heads /
    tp``) prices the forward; the backward keeps the calibration's relation to it
    (``_calibration_fits.training_attention_efficiency``: FlashAttention-2's backward
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
    if not ctx.options.measured_attention:
        return None
    return _curve_core_attention_time(ctx, flops=flops, io_bytes=io_bytes)


def _curve_core_attention_time(ctx: TrainingContext, *, flops, io_bytes) -> np.ndarray | None:
    """``measured_core_attention_time`` whatever ``EstimateOptions.measured_attention`` says."""
    attention, device = ctx.model.attention, ctx.cluster.device
    if (
        attention.kind == "mla"
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


def attention_kernel(ctx: TrainingContext) -> str:
    """The fused attention kernel of the run: its own (``EstimateOptions.attention_kernel``),
    else its framework's (``FrameworkProfile.attention_kernel``), else ``cudnn``."""
    if ctx.options.attention_kernel is not None:
        return ctx.options.attention_kernel
    return ctx.framework.attention_kernel if ctx.framework is not None else "cudnn"


@cache
def _flash2_over_cudnn() -> dict:
    text = (resources.files("cost_model") / "data" / "attention_kernels.json").read_text()
    return json.loads(text)["flash2_over_cudnn"]


def flash2_time_ratio(device_name: str) -> float | None:
    """Time of torch SDPA's FlashAttention-2 kernels over a cuDNN-class kernel's on the device
    (``data/attention_kernels.json``), None where it is not measured."""
    data = _flash2_over_cudnn()
    name = DEVICE_ALIASES.get(device_name, device_name)
    return float(data["time_ratio"]) if name in data["devices"] else None


def flash2_core_attention_time(ctx: TrainingContext, *, flops, io_bytes) -> np.ndarray | None:
    """Fused causal attention of one layer (forward, charged like
    ``measured_core_attention_time``) where the run's kernel is torch SDPA's FlashAttention-2
    backend (``attention_kernel`` ``flash2``) on a device where its speed against the tables'
    cuDNN-class kernels is measured: that curve at the run's shape times the measured time ratio
    (about 2 on Hopper: ``data/attention_kernels.json``); None elsewhere (the calibration's
    efficiency prices it, as on Ampere, where FlashAttention-2 is the kernel class the tables
    measure)."""
    if attention_kernel(ctx) != "flash2":
        return None
    ratio = flash2_time_ratio(ctx.cluster.device.name)
    if ratio is None:
        return None
    curve = _curve_core_attention_time(ctx, flops=flops, io_bytes=io_bytes)
    return None if curve is None else ratio * curve


def activation_passes(ctx: TrainingContext) -> float:
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
    return matmul + ctx.op(0.0, ctx.tokens * width * activation_passes(ctx) * ACTIVATION_BYTES)


def moe_ffn_time(ctx: TrainingContext) -> np.ndarray:
    """Router, dispatcher passes, routed experts (busiest rank) and shared experts
    (``_training_moe``)."""
    return training_moe.moe_ffn_time(ctx, activation_passes=activation_passes(ctx))


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
    """Vocabulary-parallel output projection and the cross entropy's forward passes."""
    model = ctx.model
    vocab = model.vocab_size / ctx.column("tp")
    matmul = ctx.op(
        2.0 * ctx.tokens * model.hidden_size * vocab,
        model.hidden_size * vocab * 2.0,
        role="lm_head",
    )
    return matmul + cross_entropy_time(ctx, backward=False)


def cross_entropy_bytes_per_logit(ctx: TrainingContext) -> tuple[float, float]:
    """Bytes moved per logit of a rank's vocabulary slice by the loss (forward, backward).

    Eager vocab-parallel cross entropy (``unfused_cross_entropy``; Megatron-LM
    core/tensor_parallel/cross_entropy.py at 937571cfd4), fp32 = 4, bf16 = 2 bytes: forward
    ``logits.float()`` (2 + 4), ``max`` (4), in-place ``-= max`` (8), ``exp(out=)`` (8),
    ``sum`` (4), in-place ``div_`` to the saved softmax (8): 38; backward ``mul_`` by the
    incoming gradient (8) and the cast back to bf16 (4 + 2): 14. Otherwise three fp32 passes
    forward (12), twice that backward like the rest of the pass (24)."""
    if ctx.options.unfused_cross_entropy:
        return 38.0, 14.0
    return 12.0, 24.0


def cross_entropy_time(ctx: TrainingContext, *, backward: bool) -> np.ndarray:
    """Memory-bound cross-entropy passes over one micro-batch's logits on a rank."""
    logits = ctx.tokens * ctx.model.vocab_size / ctx.column("tp")
    forward_bytes, backward_bytes = cross_entropy_bytes_per_logit(ctx)
    return ctx.op(0.0, logits * (backward_bytes if backward else forward_bytes))


def embedding_time(ctx: TrainingContext) -> np.ndarray:
    return ctx.op(0.0, ctx.tokens * ctx.model.hidden_size * 2.0 * ACTIVATION_BYTES)


def kernels_per_layer(ctx: TrainingContext | SimpleNamespace) -> tuple[float, float]:
    """Kernels one layer launches in its forward pass (dense, MoE): projections (fused QKV +
    output; MLA adds its down/up projections and two norms; query and key norms add two), core
    attention (one fused kernel, or two batched GEMMs + softmax + dropout unfused), FFN (two
    GEMMs + activation), two norms and two residual/dropout adds; an MoE layer adds router, top-k, permute/unpermute, grouped
    GEMMs and the shared expert. Each pays the calibration's fixed per-kernel cost (launch and
    wave tail), which matters for small layers."""
    attention = ctx.model.attention
    projections = 7.0 if attention.kind == "mla" else 2.0
    if attention.qk_norm:  # a query and a key norm kernel in each full-attention layer
        projections += 2.0 * (attention.full_layer_fraction if attention.has_linear_mixer else 1.0)
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
