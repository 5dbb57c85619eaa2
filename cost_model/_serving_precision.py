"""Serving precisions: which weight and KV-cache dtypes a device runs, and a checkpoint's own dtype.

A weight dtype is either *native* — the matmuls run in it (W8A8 FP8 on Hopper and Blackwell,
DeepSeek-V3 report arXiv:2412.19437 sec. 3.3; NVFP4 W4A4 on Blackwell's FP4 tensor cores,
NVIDIA "Introducing NVFP4", 2025) — or *weight-only*: stored narrow, widened to the activation
dtype inside the GEMM (int4 AWQ/GPTQ kernels, Marlin; FP8 weights on a device without FP8
tensor cores, vLLM's FP8 Marlin path). FP4 has no weight-only path priced here: a device
without an FP4 peak cannot serve an fp4 checkpoint as one, and an fp4 KV cache (TRT-LLM's NVFP4
KV cache) likewise needs FP4 hardware. Asking for it is an error, never a silent fallback.

A HuggingFace ``config.json`` names its checkpoint's precision in ``quantization_config``
(``quant_method`` ``fp8`` for DeepSeek-V3/R1 and Kimi-K2's block-scaled FP8 releases; ModelOpt
``quant_algo`` ``NVFP4``; ``compressed-tensors`` / AWQ / GPTQ with 4-bit weights); a catalog
entry without one may state ``_checkpoint_dtype`` with its reason; otherwise ``torch_dtype``.
"""

from __future__ import annotations

import json
from typing import Any

#: Dtypes whose matmuls (weights) or cache reads (KV) need the device's own tensor-core support.
NATIVE_ONLY_DTYPES: tuple[str, ...] = ("fp4",)
_TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def check_serving_precision(*, weight_dtype: str, kv_dtype: str, hardware) -> None:
    """Raise ``ValueError`` naming the field when ``hardware`` cannot run a requested dtype."""
    for field, dtype in (("weight_dtype", weight_dtype), ("kv_dtype", kv_dtype)):
        if dtype in NATIVE_ONLY_DTYPES and dtype not in hardware.peak_flops:
            raise ValueError(
                f"{field} ({dtype!r}) cannot run natively on {hardware.name}: its peak_flops lists "
                f"{', '.join(sorted(hardware.peak_flops))}; {dtype} needs {dtype} tensor cores (e.g. Blackwell B200/GB200)"
            )


def checkpoint_dtype(config: dict[str, Any]) -> str:
    """The weight dtype a HuggingFace ``config.json`` dict's checkpoint is released in."""
    if "_checkpoint_dtype" in config:
        return str(config["_checkpoint_dtype"])
    quantization = config.get("quantization_config") or {}
    method = str(quantization.get("quant_method", "")).lower()
    algorithm = str(quantization.get("quant_algo", "")).lower()
    if method == "fp8" or algorithm == "fp8":
        return "fp8"
    if "fp4" in algorithm or "nvfp4" in method:
        return "fp4"
    if method == "compressed-tensors":  # Kimi-K2-Thinking's int4 QAT release uses it
        return "int4" if '"num_bits": 4' in json.dumps(quantization) else "fp8"
    if method in ("awq", "gptq") or quantization.get("bits") == 4:
        return "int4"
    return _TORCH_DTYPES.get(str(config.get("torch_dtype", "bfloat16")), "bf16")
