"""FP8 training priced per operator: which GEMMs run in fp8 under each recipe, their measured
speed-up over bf16, and the extra quantization kernels.

What runs in fp8 (every recipe):

* the linear layers of attention (Q/K/V/O; MLA's down and up projections), the dense FFN, the
  routed and the shared experts — forward (``fprop``), input gradient (``dgrad``) and weight
  gradient (``wgrad``) GEMMs (Micikevicius et al., "FP8 Formats for Deep Learning",
  arXiv:2209.05433, sec. 4; Transformer Engine ``te.Linear`` under ``fp8_autocast``);
* *not* core attention (FlashAttention in bf16; Transformer Engine's fp8 attention is off by
  default), norms, activations, the MoE router/gating and the output head with its softmax, nor
  the embedding — DeepSeek-V3 report (arXiv:2412.19437) sec. 3.3.1: "the embedding module, the
  output head, MoE gating modules, normalization operators, and attention operators" keep their
  original precision; torchtitan's float8 converter skips the ``output`` layer by default
  (``filter_fqns``); the optimizer and master weights stay fp32.

Recipes (``Training.fp8_recipe``) and the bytes their quantization kernels move per element of
each fp8 GEMM's input activation (forward) and output gradient (backward); each kernel is a
memory-bound pass priced at the device's bandwidth:

* ``delayed`` — per-tensor scale from an amax history (Transformer Engine ``DelayedScaling``):
  one fused cast + transpose + amax kernel, read 2 bytes, write the fp8 copy and its transpose
  (Hopper fp8 GEMMs take only the TN layout): 4 bytes;
* ``current`` — per-tensor scale of the current tensor (Transformer Engine
  ``Float8CurrentScaling``, NeMo's "FP8-CS"): an amax pass first, then the cast + transpose:
  6 bytes;
* ``tensorwise`` — the same scaling in torchao (``Float8Linear`` ``tensorwise``): 6 bytes;
* ``rowwise`` — torchao ``rowwise``: a scale per row of the tensor and another per column of its
  transpose, each an amax and a cast pass: 10 bytes;
* ``blockwise`` — DeepSeek-V3 fine-grained 1x128 activation / 128x128 weight tiles (sec. 3.3.2):
  scales are local to a tile, one fused read, both orientations written: 4 bytes;
* ``mxfp8`` — Blackwell block-scaled MXFP8 (1x32 blocks, E8M0 scales; OCP MX spec v1.0): row-
  and column-wise copies from one read, 4 bytes plus 2/32 of scales (Transformer Engine);
  torchao reads the bf16 operand once per layout, 6 bytes plus 2/32
  (``TORCHAO_QUANTIZATION_BYTES``, chosen by the framework profile's ``fp8_library``).

Saved activations: Transformer Engine keeps the fp8 copy of each fp8 GEMM's input for its
backward (``delayed``, ``current``, ``blockwise``, ``mxfp8``; DeepSeek-V3 sec. 3.3.3 likewise
caches the linear layers' inputs in fp8), halving those tensors; torchao's ``Float8Linear``
(``tensorwise``, ``rowwise``) and ``mx_mm`` (``mxfp8``) save the bf16 input and cast it again in
backward (``caches_fp8_input``, used by ``cost_model._memory``).

Weights are quantized once per micro-batch (read 2, write the fp8 copy and its transpose: 4 bytes
per parameter). With ``tensorwise`` scaling under FSDP/ZeRO-3 the weights are cast to fp8 before
their all-gather (torchao ``Float8LinearConfig.enable_fsdp_float8_all_gather``, torchtitan
``float8.enable_fsdp_float8_all_gather``; only per-tensor scales can be agreed across shards
before the gather, so rowwise and the block-scaled recipes gather bf16): the per-layer gather
moves 1 byte per parameter instead of 2 (``FSDP_FP8_GATHER_RECIPES``, used by
``cost_model._training_comm``).

The fp8 GEMM is priced from its own operator fit (``data/calibration.json``, fitted by
``cost_model._calibration_operators`` on the aiconfigurator-core fp8 GEMM tables and, on Hopper,
the project's own fp8/bf16 speed-ups of torch's cuBLASLt kernel measured on an H200,
``data/fp8_gemm_first_party.json``, each source with equal weight): a fraction of
the fp8 peak and a fixed cost per kernel, per hardware type, for the epilogue-scaled kernels
(per-tensor or per-row/column scales: ``delayed``, ``current``, ``tensorwise``, ``rowwise``) and
for the block-scaled ones (``blockwise``). ``mxfp8`` takes the per-tensor table: its GEMMs are
vendor-library scaled GEMMs, cuBLASLt's (Transformer Engine 2.12
``common/gemm/cublaslt_gemm.cu`` runs the MXFP8 scaling mode through cuBLASLt; torchao: "On
NVIDIA B200 machines, we use the cuBLAS mxfp8 gemm exposed via the ``torch._scaled_mm`` op",
docs/source/workflows/training.md), at the same tensor-core rate on Blackwell as the per-tensor
kernels (TensorRT-LLM's PyTorch flow, SGLang's and vLLM's CUTLASS ``scaled_mm``), while the
block-scaled table on Blackwell is DeepGEMM's, whose fit reaches 5-10% more of the peak there.
No MXFP8 GEMM table is published. A device whose calibration has no fp8 fit
falls back to the measured fp8/bf16 ratio of ``data/fp8_gemm_curves.json`` where its name
matches one, else to the H100 MAMF ratio scaled by its fp8/bf16 peak ratio: no operator curve
(``fp8_operator_source`` says which, the validation marks such rows).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from importlib import resources

import numpy as np

from cost_model._pricing import op_time_s

__all__ = [
    "FP8_CACHED_INPUT_RECIPES",
    "FP8_RECIPES",
    "FP8_ROLES",
    "bf16_layer_fraction",
    "caches_fp8_input",
    "FSDP_FP8_GATHER_RECIPES",
    "TP_FP8_GATHER_RECIPES",
    "fp8_gemm_speedup",
    "fp8_gemm_time_s",
    "fp8_operator_source",
    "quantization_bytes",
    "quantization_time_s",
    "rowwise_post_scale_bytes",
    "training_op_time_s",
]

#: Bytes moved per element of a GEMM input (activation or output gradient) by each recipe's
#: quantization kernels (see the module docstring).
FP8_RECIPES: dict[str, float] = {
    "delayed": 4.0,
    "current": 6.0,
    "tensorwise": 6.0,
    "rowwise": 10.0,
    "blockwise": 4.0,
    "mxfp8": 4.0625,
}
#: Recipes whose framework saves the fp8 copy of a GEMM input for the backward pass (under
#: Transformer Engine; torchao keeps the bf16 input whatever the recipe: ``caches_fp8_input``).
FP8_CACHED_INPUT_RECIPES: frozenset[str] = frozenset({"delayed", "current", "blockwise", "mxfp8"})
#: Recipes torchao quantizes with other traffic than ``FP8_RECIPES`` /
#: ``WEIGHT_QUANTIZATION_BYTES`` (a framework whose ``fp8_library`` is ``torchao``): (bytes per
#: activation or gradient element, bytes per weight parameter). ``mxfp8``: torchao's ``mx_mm``
#: (torchao/prototype/moe_training/mxfp8_linear.py, 2026-05) casts each operand from bf16 twice,
#: a dim0 kernel (Triton) and a dim1 kernel (CUDA), each reading 2 bytes and writing 1 plus one
#: E8M0 scale per 32 elements: 2 x (3 + 1/32) bytes; a weight the same (dim0 in forward, dim1 in
#: backward). torchao's roofline model counts the same two kernels
#: (torchao/testing/training/roofline_utils.py ``get_tensor_memory_traffic_ovhd_s``,
#: ``mxfp8_cublas``: "assume that we can't profitably fuse kernel 1 and kernel 2").
TORCHAO_QUANTIZATION_BYTES: dict[str, tuple[float, float]] = {"mxfp8": (6.0625, 6.0625)}
#: torchao ``rowwise``: its backward GEMMs (output gradient x weight, and the weight gradient)
#: run without fast accumulation, which torchao routes to the tensorwise cuBLAS kernel with unit
#: scales, multiplying the bf16 output by the row and column scales afterwards in a separate
#: element-wise op (pytorch/ao torchao/float8/float8_ops.py ``addmm_float8_unwrapped``: "The
#: rowwise CUTLASS-based kernel is so slow without fast-accum that we'd rather use the
#: tensorwise cuBLAS-based kernel and do the scaling manually afterwards (hoping Inductor will
#: be able to fuse it)", pull request #1325, 2024-11; ``Float8LinearConfig``: only
#: ``gemm_config_output`` takes fast accumulation). The multiply reads and writes the bf16
#: output: 4 bytes per element. The weight gradient's ends the compiled backward graph (its
#: consumer, the gradient reduction, runs outside it), so it is a pass of its own; the input
#: gradient's fuses into the next backward op under torch.compile (``fused_elementwise``) and
#: is a pass of its own in eager mode (``rowwise_post_scale_bytes``). torchao's MoE experts run
#: a scaled grouped GEMM with the scales in the kernel: only the dense linears pay it.
ROWWISE_POST_SCALE_BYTES = 4.0
#: The measured GEMM curve each recipe runs on.
RECIPE_CURVE: dict[str, str] = {
    "delayed": "tensorwise",
    "current": "tensorwise",
    "tensorwise": "tensorwise",
    "rowwise": "blockwise",
    "blockwise": "blockwise",
    "mxfp8": "tensorwise",
}
#: The fp8 GEMM table (``_calibration_operators.FP8_GEMM_DTYPES``) whose fit prices each recipe.
RECIPE_TABLE: dict[str, str] = {
    "delayed": "fp8",
    "current": "fp8",
    "tensorwise": "fp8",
    "rowwise": "fp8",
    "blockwise": "fp8_block",
    "mxfp8": "fp8",
}
#: Recipes whose GEMMs run with one scale per tensor, as ``autoparallel profile`` times its fp8
#: GEMM curve (``profilers._ops._fp8_gemm_point``): a hardware profile's measured ``fp8`` curve
#: prices them; the other recipes keep the operator fit.
MEASURED_FP8_RECIPES: frozenset[str] = frozenset({"delayed", "current", "tensorwise"})
#: Recipes whose FSDP all-gather moves fp8 weights (torchao ``enable_fsdp_float8_all_gather``:
#: tensorwise scaling only).
FSDP_FP8_GATHER_RECIPES: frozenset[str] = frozenset({"tensorwise"})
#: Recipes whose sequence-parallel all-gathers move fp8: the input of the column-parallel GEMMs
#: in forward, the output gradient of the row-parallel GEMMs in backward (torchao
#: ``Float8ColwiseParallel`` / ``Float8RowwiseParallel`` / ``PrepareFloat8ModuleInput``, the
#: tensor-parallel plan torchtitan applies with tensorwise float8; ``_training_comm._tp``).
TP_FP8_GATHER_RECIPES: frozenset[str] = frozenset({"tensorwise"})
#: GEMM roles that run in fp8; ``router`` and ``lm_head`` keep bf16/fp32 (DeepSeek-V3 sec. 3.3.1).
FP8_ROLES: tuple[str, ...] = ("linear", "expert")
#: Bytes per parameter of quantizing a weight (read bf16, write the fp8 copy and its transpose).
WEIGHT_QUANTIZATION_BYTES = 4.0
#: Bytes per element of the transposed fp8 copy: written by the cast within ``FP8_RECIPES``.
TRANSPOSED_COPY_BYTES = 1.0


@lru_cache(maxsize=1)
def _curves() -> dict:
    text = (resources.files("cost_model") / "data" / "fp8_gemm_curves.json").read_text()
    return json.loads(text)


@lru_cache(maxsize=64)
def _curve_points(device_name: str, curve: str) -> tuple[np.ndarray, np.ndarray] | None:
    data = _curves()
    for key, pattern in data["device_patterns"].items():
        if re.search(pattern, device_name):
            points = data["curves"][key]
            return (
                np.log([p["flops_per_call"] for p in points]),
                np.array([p[f"{curve}_speedup"] for p in points]),
            )
    return None


def fp8_gemm_speedup(*, hardware, recipe: str, flops_per_call) -> np.ndarray:
    """Measured fp8/bf16 rate of one GEMM of ``flops_per_call`` (log-interpolated, clamped at the
    ends of the measured range); a device without a curve takes the H100 MAMF ratio scaled by its
    own fp8/bf16 peak ratio (vectorized)."""
    if recipe not in FP8_RECIPES:
        raise ValueError(f"fp8_recipe ({recipe!r}) must be one of {sorted(FP8_RECIPES)}")
    points = _curve_points(hardware.name, RECIPE_CURVE[recipe])
    flops = np.maximum(np.asarray(flops_per_call, dtype=np.float64), 1.0)
    if points is None:
        fallback = _curves()["fallback"]["speedup"]
        ratio = hardware.peak_flops_for("fp8") / hardware.peak_flops_for("bf16") / 2.0
        return np.broadcast_to(fallback * ratio, flops.shape)
    log_flops, speedup = points
    return np.interp(np.log(flops), log_flops, speedup)


def fp8_gemm_fit(calibration, recipe: str) -> tuple[float, float] | None:
    """(fraction of the fp8 peak, seconds per kernel) of the recipe's fp8 GEMMs from the
    calibration's operator fit; None where the calibration has none."""
    parameters = calibration.fit.get("parameters", {}) if calibration.fit else {}
    table = RECIPE_TABLE[recipe]
    efficiency = parameters.get(f"{table}_matmul_efficiency")
    overhead = parameters.get(f"{table}_kernel_overhead_s")
    if efficiency is None or overhead is None:
        return None
    return float(efficiency), float(overhead)


def fp8_operator_source(*, hardware, calibration, recipe: str) -> str | None:
    """What prices the fp8 GEMMs of ``recipe`` on ``hardware``: ``"operator fit"`` (the
    calibration's fp8 GEMM fit), ``"operator curve"`` (the measured fp8/bf16 ratio curve), or
    None: no fp8 operator measurement for this device (the MAMF fallback)."""
    if fp8_gemm_fit(calibration, recipe) is not None:
        return "operator fit"
    if _curve_points(hardware.name, RECIPE_CURVE[recipe]) is not None:
        return "operator curve"
    return None


def fp8_gemm_time_s(
    *, hardware, calibration, recipe: str, flops, bytes_moved, calls=1, kind: str = "matmul"
) -> np.ndarray:
    """Time of fp8 GEMMs of ``flops`` over ``calls`` kernels under ``recipe``: on a device whose
    hardware profile measured per-tensor fp8 GEMMs, an fp8 roofline on that curve (per-tensor
    recipes, ``MEASURED_FP8_RECIPES``); else an fp8 roofline at
    the calibration's fitted fp8 efficiency plus the fp8 kernels' fixed cost over the bf16 one
    per call (``op_time_s`` with ``calibration`` counts the bf16 cost; a memory-only pass,
    ``flops`` 0, adds none); without an fp8 fit, the bf16 compute time over the measured fp8
    speed-up at its size (``fp8_gemm_speedup``). The memory side keeps the bf16 operand bytes
    (an upper bound: training GEMMs are compute-bound). Vectorized."""

    def roofline(flops_part, bytes_part, dtype: str = "bf16", cal=calibration) -> np.ndarray:
        return op_time_s(
            flops=flops_part,
            bytes_moved=bytes_part,
            hardware=hardware,
            dtype=dtype,
            calibration=cal,
            calls=calls,
            kind=kind,
        )

    profile = getattr(hardware, "profile", None)
    if profile is not None and "fp8" in profile.gemm:
        if recipe in MEASURED_FP8_RECIPES:
            return roofline(flops, bytes_moved, "fp8")  # the device's own per-tensor fp8 curve
        # another recipe keeps the operator fit: the per-tensor curve does not time its GEMMs
        gemm = {dtype: curve for dtype, curve in profile.gemm.items() if dtype != "fp8"}
        hardware = hardware.model_copy(
            update={"profile": profile.model_copy(update={"gemm": gemm})}
        )
    fit = fp8_gemm_fit(calibration, recipe)
    if fit is not None:
        efficiency, overhead = fit
        fitted = calibration.model_copy(update={"matmul_efficiency": efficiency})
        return roofline(flops, bytes_moved, "fp8", fitted) + np.where(
            np.asarray(flops) > 0.0,
            np.maximum(np.asarray(calls, dtype=np.float64), 1.0)
            * (overhead - calibration.kernel_overhead_s),
            0.0,
        )
    per_call = np.asarray(flops, dtype=np.float64) / np.maximum(
        np.asarray(calls, dtype=np.float64), 1.0
    )
    speedup = fp8_gemm_speedup(hardware=hardware, recipe=recipe, flops_per_call=per_call)
    return np.maximum(roofline(flops, 0.0) / speedup, roofline(0.0, bytes_moved))


def training_op_time_s(ctx, *, flops, bytes_moved, calls, kind: str, role: str) -> np.ndarray:
    """Roofline time of one training operator under the workload's precision.

    bf16/fp16 training: one roofline in that dtype. fp8 training: a GEMM whose ``role`` is in
    ``FP8_ROLES`` takes ``fp8_gemm_time_s`` under the workload's recipe. Every other operator
    (core attention, router, output head, memory-bound passes) runs in bf16."""
    workload, hardware = ctx.workload, ctx.cluster.device
    high = "bf16" if workload.precision == "fp8" else workload.precision

    def roofline(flops_part, bytes_part) -> np.ndarray:
        return op_time_s(
            flops=flops_part,
            bytes_moved=bytes_part,
            hardware=hardware,
            dtype=high,
            calibration=ctx.calibration,
            calls=calls,
            kind=kind,
        )

    if workload.precision != "fp8" or kind != "matmul" or role not in FP8_ROLES:
        return roofline(flops, bytes_moved)
    fp8 = fp8_gemm_time_s(
        hardware=hardware,
        calibration=ctx.calibration,
        recipe=workload.fp8_recipe,
        flops=flops,
        bytes_moved=bytes_moved,
        calls=calls,
        kind=kind,
    )
    kept = bf16_layer_fraction(ctx)
    if not np.any(kept):
        return fp8
    return fp8 * (1.0 - kept) + roofline(flops, bytes_moved) * kept


def bf16_layer_fraction(ctx):  # -> float or (3, n) array over the rows STAGES
    """Share of each pipeline rank's layers whose GEMMs stay in bf16 in fp8 training: the first
    ``fp8_bf16_layers_at_start`` and last ``fp8_bf16_layers_at_end`` layers of the model
    (Megatron-LM ``--first-last-layers-bf16 --num-layers-at-start-in-bf16 N
    --num-layers-at-end-in-bf16 M``), held by the first and the last pipeline rank (with
    ``pp == 1`` one rank holds both ends; with ``pp == 2`` the middle row repeats the first).
    Within a rank the kept layers are priced as an average over its layers; 0.0 when none."""
    workload = ctx.workload
    start, end = workload.fp8_bf16_layers_at_start, workload.fp8_bf16_layers_at_end
    if workload.precision != "fp8" or not (start or end):
        return 0.0
    layers = np.asarray(ctx.layout.layers, dtype=np.float64)
    pp = ctx.column("pp")
    single = np.minimum(start + end, layers[0])
    first = np.where(pp == 1, single, np.minimum(start, layers[0]))
    last = np.where(pp == 1, single, np.minimum(end, layers[2]))
    middle = np.where(pp <= 2, first, 0.0)
    return np.stack([first, middle, last]) / np.maximum(layers, 1.0)


def _attention_widths(model, tp) -> tuple[np.ndarray, np.ndarray]:
    """(input, output) elements per token of one layer's attention projections on one rank:
    column-parallel GEMMs read the whole hidden vector and write a 1/tp share, row-parallel ones
    the reverse; MLA's down-projections are replicated."""
    attention, hidden = model.attention, model.hidden_size
    heads = attention.num_heads / tp
    out_proj = (heads * attention.value_head_dim, hidden)
    if attention.kind == "mla":
        q_rank, kv_rank = attention.q_lora_rank, attention.kv_lora_rank
        query = (
            (hidden + q_rank, q_rank + heads * attention.qk_head_dim)
            if q_rank
            else (hidden, heads * attention.qk_head_dim)
        )
        key_value = (
            hidden + kv_rank,
            kv_rank
            + attention.qk_rope_head_dim
            + heads * (attention.qk_nope_head_dim + attention.value_head_dim),
        )
        return query[0] + key_value[0] + out_proj[0], query[1] + key_value[1] + out_proj[1]
    qkv_out = (
        attention.num_heads * attention.qk_head_dim
        + 2.0 * attention.num_kv_heads * attention.head_dim
    ) / tp
    return hidden + out_proj[0], qkv_out + out_proj[1]


def _ffn_widths(model, width) -> tuple[np.ndarray, np.ndarray]:
    """(input, output) elements per token of an FFN of ``width`` per rank (FC1 then FC2)."""
    fc1 = 2.0 if model.ffn_activation == "swiglu" else 1.0
    return model.hidden_size + width, fc1 * width + model.hidden_size


def _dense_linears(ctx, *, moe: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input elements, output elements, weight parameters) per micro-batch of one layer's
    linears other than the routed experts: the attention projections and the dense FFN, or an
    MoE layer's shared experts."""
    model, tp = ctx.model, ctx.column("tp")
    attention_in, attention_out = _attention_widths(model, tp)
    inputs, outputs = ctx.tokens * attention_in, ctx.tokens * attention_out
    weights = model.attention_parameters() / tp
    if not moe or model.moe is None:
        width, count, size = model.ffn_hidden_size / tp, 1, model.ffn_hidden_size
    elif model.moe.num_shared_experts:
        spec = model.moe
        count, size = spec.num_shared_experts, spec.shared_ffn_size
        width = count * size / tp
    else:
        return inputs, outputs, weights
    ffn_in, ffn_out = _ffn_widths(model, width)
    weights = weights + count * model.ffn_parameters(size) / tp
    return inputs + ctx.tokens * ffn_in, outputs + ctx.tokens * ffn_out, weights


def _layer_quantized_elements(ctx, *, moe: bool) -> tuple[np.ndarray, np.ndarray]:
    """(activation and gradient elements, weight parameters) one layer quantizes per micro-batch."""
    inputs, outputs, weights = _dense_linears(ctx, moe=moe)
    elements = inputs + outputs
    model = ctx.model
    if not moe or model.moe is None:
        return elements, weights
    spec = model.moe
    expert_in, expert_out = _ffn_widths(model, spec.expert_ffn_hidden_size / ctx.column("etp"))
    routed = ctx.moe_tokens * spec.top_k * ctx.options.expert_load_factor
    elements = elements + routed * (expert_in + expert_out)
    experts_per_rank = spec.num_routed_experts / ctx.column("ep")
    weights = weights + experts_per_rank * model.ffn_parameters(
        spec.expert_ffn_hidden_size
    ) / ctx.column("etp")
    return elements, weights


def _cast_before_gather_elements(ctx, *, moe: bool) -> np.ndarray:
    """Elements per layer and micro-batch of the hidden-size tensors a tensorwise recipe casts
    to fp8 on their sequence-parallel shard, before the tp all-gather (``TP_FP8_GATHER_RECIPES``
    under sequence parallelism, else 0): the input of the attention and of the dense FFN in
    forward (torchao ``PrepareFloat8ModuleInput`` casts "before the all-gather (i.e. Shard ->
    Replicate)"), the output gradient of the attention output and FFN down projections in
    backward (``Float8RowwiseParallel`` casts it before the backward all-gather, see
    ``_training_comm._tp``); torchao/float8/float8_tensor_parallel.py. The MoE block's input is
    not one of them (its experts take the dispatched tokens)."""
    workload = ctx.workload
    if workload.fp8_recipe not in TP_FP8_GATHER_RECIPES:
        return np.zeros_like(ctx.tokens)
    tensors = 2.0 if moe and ctx.model.moe is not None else 4.0
    split = ctx.sequence_parallel & (ctx.column("tp") > 1)
    return np.where(split, tensors * ctx.tokens * ctx.model.hidden_size, 0.0)


def _uses_torchao(ctx) -> bool:
    framework = ctx.framework
    return framework is not None and framework.fp8_library == "torchao"


def quantization_bytes(ctx) -> tuple[float, float]:
    """(bytes per quantized activation or gradient element, bytes per quantized weight
    parameter) of the workload's fp8 recipe under its framework's quantization library
    (``FP8_RECIPES`` and ``WEIGHT_QUANTIZATION_BYTES``, or ``TORCHAO_QUANTIZATION_BYTES``)."""
    recipe = ctx.workload.fp8_recipe
    if _uses_torchao(ctx) and recipe in TORCHAO_QUANTIZATION_BYTES:
        return TORCHAO_QUANTIZATION_BYTES[recipe]
    return FP8_RECIPES[recipe], WEIGHT_QUANTIZATION_BYTES


def caches_fp8_input(ctx) -> bool:
    """Whether the fp8 GEMMs keep their input in fp8 for the backward pass: Transformer
    Engine's recipes in ``FP8_CACHED_INPUT_RECIPES``; never under torchao, whose
    ``Float8Linear`` and ``mx_mm`` save the bf16 input (``ctx.save_for_backward(input_hp,
    weight_hp)``) and cast it again in backward."""
    workload = ctx.workload
    return (
        workload.precision == "fp8"
        and workload.fp8_recipe in FP8_CACHED_INPUT_RECIPES
        and not _uses_torchao(ctx)
    )


def rowwise_post_scale_bytes(ctx, *, moe: bool) -> np.ndarray:
    """Bytes one layer's backward moves per micro-batch to scale torchao ``rowwise`` GEMM
    outputs after the kernel (``ROWWISE_POST_SCALE_BYTES``): the dense linears' weight
    gradients, and their input gradients when nothing fuses them (``fused_elementwise`` off);
    0 for every other recipe and library."""
    workload = ctx.workload
    if not (
        workload.precision == "fp8" and workload.fp8_recipe == "rowwise" and _uses_torchao(ctx)
    ):
        return np.zeros_like(ctx.tokens)
    inputs, _, weights = _dense_linears(ctx, moe=moe)
    unfused = 0.0 if ctx.fused_elementwise else 1.0
    return ROWWISE_POST_SCALE_BYTES * (weights + unfused * inputs)


def quantization_time_s(ctx, *, moe: bool) -> np.ndarray:
    """Seconds of the fp8 quantization kernels of one layer and micro-batch, forward + backward
    (casts, amax reductions, transposed copies of every fp8 GEMM's input activation and output
    gradient, and of its weight): ``quantization_bytes`` per element and per parameter, a
    memory-bound pass; 0 unless training in fp8.
    A tensor cast before its sequence-parallel all-gather (``_cast_before_gather_elements``) runs
    its amax and cast on the 1/tp shard (``FP8_RECIPES[recipe] - TRANSPOSED_COPY_BYTES`` per
    shard element: the cast writes one layout); the transposed fp8 copy the other GEMM operand
    needs is then a pass of its own over the gathered tensor, reading and writing 1 byte
    (torchao ``float8_ops.preprocess_addmm``: ``b_data.t().contiguous().t()``), where the
    unsharded cast writes both layouts in one kernel (torchao ``roofline_utils``,
    ``get_tensor_memory_traffic_ovhd_s``, tensorwise). torchao's ``rowwise`` recipe adds the
    scaling of its backward GEMMs' outputs (``rowwise_post_scale_bytes``)."""
    if ctx.workload.precision != "fp8":
        return np.zeros_like(ctx.tokens)
    elements, weights = _layer_quantized_elements(ctx, moe=moe)
    fp8_share = 1.0 - bf16_layer_fraction(ctx)
    per_element, per_weight = quantization_bytes(ctx)
    gathered = _cast_before_gather_elements(ctx, moe=moe)
    gathered_bytes = (per_element - TRANSPOSED_COPY_BYTES) / ctx.column(
        "tp"
    ) + 2.0 * TRANSPOSED_COPY_BYTES
    moved = per_element * (elements - gathered) + gathered_bytes * gathered + per_weight * weights
    moved = moved + rowwise_post_scale_bytes(ctx, moe=moe)
    return (
        op_time_s(
            flops=0.0,
            bytes_moved=moved,
            hardware=ctx.cluster.device,
            dtype="bf16",
            calibration=ctx.calibration,
            calls=8.0,
        )
        * fp8_share
    )
