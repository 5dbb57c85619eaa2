"""Serving precisions: which weight and KV-cache dtypes a device runs, and a checkpoint's own dtype.

A weight dtype is either *native* — the matmuls run in it (W8A8 FP8 on Hopper and Blackwell,
DeepSeek-V3 report arXiv:2412.19437 sec. 3.3; NVFP4 W4A4 on Blackwell's FP4 tensor cores,
NVIDIA "Introducing NVFP4", 2025) — or *weight-only*: stored narrow, widened to the activation
dtype inside the GEMM (int4 AWQ/GPTQ kernels, Marlin; FP8 weights on a device without FP8
tensor cores, vLLM's FP8 Marlin path; FP4 weights on a device without FP4 tensor cores:
vLLM's FP4 Marlin kernels for NVFP4 and MXFP4 checkpoints, ``quantization/utils/
marlin_utils_fp4.py``, and the Triton ``matmul_ogs`` MXFP4 MoE kernels gpt-oss runs on Hopper,
vLLM's gpt-oss recipe; TensorRT-LLM's W4A16 MXFP4 on Hopper). An fp4 KV cache (TRT-LLM's NVFP4
KV cache) has no such path: it needs FP4 hardware, and asking for it elsewhere is an error,
never a silent fallback.

A HuggingFace ``config.json`` names its checkpoint's precision in ``quantization_config``
(``quant_method`` ``fp8`` for DeepSeek-V3/R1 and Kimi-K2's block-scaled FP8 releases; ModelOpt
``quant_algo`` ``NVFP4``; ``compressed-tensors`` / AWQ / GPTQ with 4-bit weights); a catalog
entry without one may state ``_checkpoint_dtype`` with its reason; otherwise ``torch_dtype``.

A quantized checkpoint keeps some parts unquantized (``checkpoint_dtype_by_part``). Its config
lists them: ModelOpt's ``exclude_modules`` (fnmatch globs, e.g. ``model.layers.3.self_attn*``:
nvidia/DeepSeek-R1-0528-NVFP4's ``hf_quant_config.json`` excludes ``lm_head`` and every layer's
``self_attn``), compressed-tensors' ``ignore`` (module names, or regexes after ``re:``), vLLM's
``ignored_layers`` and transformers' ``modules_to_not_convert``. The router and the embedding are
never quantized: neither is a quantizable linear layer in the engines (vLLM and SGLang build the
MoE gate without a quantization method) and no export converts them; DeepSeek-V3's FP8 release,
whose ``quantization_config`` (``fmt: e4m3``, ``weight_block_size: [128, 128]``) lists nothing,
keeps "the embedding module, the output head, MoE gating modules" in BF16 (DeepSeek-V3 report,
arXiv:2412.19437, sec. 3.3.1), so without a list the LM head stays unquantized too.
"""

from __future__ import annotations

import fnmatch
import json
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cost_model._model_spec import ModelSpec

#: Dtypes whose matmuls (weights) or cache reads (KV) need the device's own tensor-core support.
NATIVE_ONLY_WEIGHT_DTYPES: tuple[str, ...] = ()
NATIVE_ONLY_KV_DTYPES: tuple[str, ...] = ("fp4",)
_TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def check_serving_precision(*, weight_dtype: str, kv_dtype: str, hardware) -> None:
    """Raise ``ValueError`` naming the field when ``hardware`` cannot run a requested dtype."""
    for field, dtype, native_only in (
        ("weight_dtype", weight_dtype, NATIVE_ONLY_WEIGHT_DTYPES),
        ("kv_dtype", kv_dtype, NATIVE_ONLY_KV_DTYPES),
    ):
        if dtype in native_only and dtype not in hardware.peak_flops:
            raise ValueError(
                f"{field} ({dtype!r}) cannot run natively on {hardware.name}: its peak_flops lists "
                f"{', '.join(sorted(hardware.peak_flops))}; {dtype} needs {dtype} tensor cores (e.g. Blackwell B200/GB200)"
            )


def check_sparse_attention_indexer(*, model: ModelSpec, hardware) -> None:
    """Raise ``ValueError`` where ``model``'s DeepSeek Sparse Attention indexer cannot run on
    ``hardware``: its lightning indexer scores keys in FP8 (the FP8 indexer-key cache and
    DeepGEMM's ``fp8_mqa_logits``; vLLM's DeepSeek-V3.2 recipe: DeepGEMM "is necessary for MQA
    logits computation", "Only Hopper and Blackwell data center GPUs are supported",
    https://github.com/vllm-project/recipes/blob/main/DeepSeek/DeepSeek-V3_2-Exp.md), so a device
    without FP8 tensor cores serves the model in no engine."""
    heads = model.attention.indexer_heads
    if heads and "fp8" not in hardware.peak_flops:
        raise ValueError(
            f"model attention.indexer_heads ({heads}) needs fp8 on the serving device: "
            f"DeepSeek Sparse Attention's indexer scores keys in fp8, and {hardware.name}'s "
            f"peak_flops lists only {', '.join(sorted(hardware.peak_flops))}; serve this model "
            "on a device with fp8 tensor cores (Hopper, Blackwell, MI300X)"
        )


def _plain_dtype(config: dict[str, Any]) -> str:
    """The dtype of a config's unquantized weights: ``torch_dtype``, or ``dtype`` as transformers
    5 writes it (``PretrainedConfig.to_dict``), bf16 where it names neither."""
    value = config.get("torch_dtype", config.get("dtype")) or "bfloat16"
    return _TORCH_DTYPES.get(str(value), "bf16")


def checkpoint_dtype(config: dict[str, Any]) -> str:
    """The weight dtype a HuggingFace ``config.json`` dict's checkpoint is released in."""
    if "_checkpoint_dtype" in config:
        return str(config["_checkpoint_dtype"])
    quantization = config.get("quantization_config") or {}
    method = str(quantization.get("quant_method", "")).lower()
    algorithm = str(quantization.get("quant_algo", "")).lower()
    if method == "fp8" or algorithm == "fp8":
        return "fp8"
    if "fp4" in algorithm or "nvfp4" in method or method == "mxfp4":  # gpt-oss: MXFP4 experts
        return "fp4"
    if method == "compressed-tensors":  # Kimi-K2-Thinking's int4 QAT release uses it
        return "int4" if '"num_bits": 4' in json.dumps(quantization) else "fp8"
    if method in ("awq", "gptq") or quantization.get("bits") == 4:
        return "int4"
    return _plain_dtype(config)


def checkpoint_fp8_scaling(config: dict[str, Any]) -> str | None:
    """How a ``config.json`` dict's FP8 checkpoint scales its weights (``Inference.fp8_scaling``):
    ``"block"`` where its ``quantization_config`` names a ``weight_block_size`` (DeepSeek-V3's
    128 x 128 tiles), ``"tensor"`` for a ModelOpt FP8 export (``quant_algo`` ``FP8``: one scale
    per weight tensor, a calibrated static one per activation tensor; TensorRT-LLM
    ``QuantAlgo.FP8``); None where it states neither."""
    quantization = _quantization(config)
    if quantization.get("weight_block_size"):
        return "block"
    if str(quantization.get("quant_algo", "")).upper() == "FP8":
        return "tensor"
    return None


#: A checkpoint's declared KV-cache format -> the cache dtype it selects.
_KV_ALGORITHMS = {"fp8": "fp8"}


def checkpoint_kv_dtype(config: dict[str, Any]) -> str | None:
    """The KV-cache dtype a ``config.json`` dict's checkpoint declares, which the engines serve
    when the launch leaves the KV-cache dtype at its default (``auto``); None when it declares
    none (the cache then stays in the model's compute dtype).

    A ModelOpt export declares it as ``kv_cache_quant_algo`` (in ``quantization_config``, or in
    the ``quantization`` of ``hf_quant_config.json``), a compressed-tensors one as
    ``kv_cache_scheme`` (8-bit float: FP8). The engines honour an FP8 declaration under ``auto``:
    vLLM from v0.14.0 (``EngineArgs.create_engine_config`` calls
    ``vllm/utils/torch_utils.py::resolve_kv_cache_dtype_string``, which maps ModelOpt's ``FP8``
    to ``fp8_e4m3``; vllm-project/vllm PR #30785; v0.13.0 has no such resolution), SGLang
    (``mem_cache/kv_cache_dtype.py::configure_kv_cache_dtype``: ``auto`` with the model's
    ``quant_config.kv_cache_quant_algo == "FP8"`` -> ``float8_e4m3fn``; sgl-project/sglang PR
    #18440 fixed Kimi-K2.5's wrapper, whose missing ``quant_config`` had left
    nvidia/Kimi-K2.5-NVFP4 on a BF16 cache) and TensorRT-LLM (``quant_mode.has_fp8_kv_cache()``
    -> an FP8 ``KVCacheManager``). Other declared formats are not modelled: asking for one is an
    error, never a silent fallback."""
    outer = _quantization(config)
    inner = outer.get("quantization", outer)  # hf_quant_config.json nests it under "quantization"
    declared = next(
        (
            q.get(key)
            for key in ("kv_cache_scheme", "kv_cache_quant_algo")
            for q in (inner, outer)
            if q.get(key) is not None
        ),
        None,
    )
    if declared is None:
        return None
    if isinstance(declared, dict):
        if declared.get("type") == "float" and declared.get("num_bits") == 8:
            return "fp8"
        raise ValueError(f"kv_cache_scheme {declared!r}: only an 8-bit float cache is modelled")
    dtype = _KV_ALGORITHMS.get(str(declared).lower())
    if dtype is None:
        raise ValueError(f"kv_cache_quant_algo {declared!r}: only FP8 is modelled")
    return dtype


#: Config keys that list a checkpoint's unquantized modules (ModelOpt, compressed-tensors,
#: vLLM, transformers).
_EXCLUDE_KEYS = ("exclude_modules", "ignore", "ignored_layers", "modules_to_not_convert")
#: Prefixes a multimodal wrapper puts before the language model's modules (Kimi-K2.5).
_PREFIXES = ("", "language_model.")


def _quantization(config: dict[str, Any]) -> dict[str, Any]:
    """The ``quantization_config`` of a ``config.json``, or the ``quantization`` of a ModelOpt
    ``hf_quant_config.json``; {} when neither."""
    quantization = config.get("quantization_config") or config.get("quantization") or {}
    if not isinstance(quantization, dict):
        raise ValueError(f"quantization_config ({quantization!r}) must be a JSON object")
    return quantization


def _excluded_matcher(patterns: list[str]) -> re.Pattern[str]:
    """One regex matching a module name excluded by any of ``patterns``: ``re:`` regexes (matched
    from the start, as compressed-tensors does), else fnmatch globs (ModelOpt) or exact names."""
    parts = [
        f"(?:{p[3:]})" if p.startswith("re:") else f"(?:{fnmatch.translate(p)})" for p in patterns
    ]
    return re.compile("|".join(parts) if parts else r"(?!)")


def _parents(name: str) -> list[str]:
    """``name`` and each module holding it (``a.b.c``: ``a.b.c``, ``a.b``, ``a``): an excluded
    module keeps its submodules unquantized (transformers' quantizers skip every module under a
    ``modules_to_not_convert`` entry; gpt-oss lists ``model.layers.*.self_attn``)."""
    pieces = name.split(".")
    return [".".join(pieces[:end]) for end in range(len(pieces), 0, -1)]


def _part_modules(model: ModelSpec, model_type: str) -> dict[str, list[str]]:
    """The HuggingFace module names of each quantizable part, every layer that holds it."""
    a = model.attention
    if a.kind == "mla":
        attention = ["q_a_proj", "q_b_proj"] if a.q_lora_rank else ["q_proj"]
        attention += ["kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]
    else:
        attention = ["q_proj", "k_proj", "v_proj", "o_proj"]
    ffn = ("gate_proj", "up_proj", "down_proj")
    shared = "shared_expert" if model_type == "qwen2_moe" else "shared_experts"
    dense_layers = [i for i in range(model.num_layers) if not model.is_moe_layer(i)]
    moe_layers = [i for i in range(model.num_layers) if model.is_moe_layer(i)]
    modules: dict[str, list[str]] = {
        "attention": [f"{i}.self_attn.{m}" for i in range(model.num_layers) for m in attention],
        "dense_ffn": [f"{i}.mlp.{m}" for i in dense_layers for m in ffn],
        "lm_head": ["lm_head"],
    }
    if model.moe is not None:
        modules["routed_experts"] = [f"{i}.mlp.experts.0.{m}" for i in moe_layers for m in ffn]
        if model.moe.num_shared_experts:
            modules["shared_experts"] = [f"{i}.mlp.{shared}.{m}" for i in moe_layers for m in ffn]
    return {
        part: [n if n == "lm_head" else f"model.layers.{n}" for n in names]
        for part, names in modules.items()
    }


def checkpoint_dtype_by_part(
    config: dict[str, Any], model: ModelSpec | None = None
) -> dict[str, str]:
    """The weight dtype of each part (``_workload.WEIGHT_PARTS``) of a ``config.json``'s released
    checkpoint where it differs from ``checkpoint_dtype``; {} for an unquantized checkpoint.

    A part is unquantized (``torch_dtype``) when the config's exclusion list matches every one
    of its modules in every layer that holds it; a part excluded in some layers or projections
    only (nvidia/DeepSeek-R1-0528-FP4-v2 quantizes attention's ``o_proj``) keeps the checkpoint
    dtype. The router and the embedding are always unquantized; so is the LM head of a config
    without a list (see the module docstring). ``model`` is the config's architecture (parsed
    from ``config`` when not given)."""
    if "_checkpoint_dtype_by_part" in config:
        return {str(k): str(v) for k, v in config["_checkpoint_dtype_by_part"].items()}
    quantized = checkpoint_dtype(config)
    plain = _plain_dtype(config)
    quantization = _quantization(config)
    if quantized == plain or not quantization:
        return {}
    if model is None:
        from cost_model._hf_config import parse_hf_config

        model = parse_hf_config(config)
    patterns = [p for key in _EXCLUDE_KEYS for p in (quantization.get(key) or [])]
    if not all(isinstance(p, str) for p in patterns):
        raise ValueError(
            f"quantization_config exclusion lists ({', '.join(_EXCLUDE_KEYS)}) must hold strings"
        )
    matcher = _excluded_matcher(patterns)
    parts = {"router": plain, "embedding": plain}
    if model.moe is None:
        parts.pop("router")
    for part, names in _part_modules(model, str(config.get("model_type", ""))).items():
        excluded = bool(names) and all(
            any(matcher.match(prefix + head) for prefix in _PREFIXES for head in _parents(name))
            for name in names
        )
        if excluded or (part == "lm_head" and not patterns):
            parts[part] = plain
    return {part: dtype for part, dtype in parts.items() if dtype != quantized}
