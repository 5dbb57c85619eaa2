"""Memory of one inference evaluation per device: weights, KV cache, activations, communication
buffers and fragmentation, in bytes.

Every pipeline rank holds the KV cache of ``pp`` micro-batches. Decoding sequences hold the cache
of the mean decode context (continuous batching keeps sequences at every point of their output),
rounded up to whole ``kv_block_tokens`` pages; a prefill pool holds its prompts' cache. Each
part's weights count in their own dtype (``Inference.part_weight_dtype``). Columns
``_inference_load.estimate_inference_table`` writes from here: ``memory.<part>`` for
``INFERENCE_MEMORY_PARTS`` (they sum to ``memory_per_device_bytes``) and
``memory_capacity_bytes``.
"""

from __future__ import annotations

import numpy as np

from cost_model import _inference_ops as ops
from cost_model._inference_setup import (
    COMBINE_BYTES,
    _dispatch_bytes,
    _part_dtype,
    _passes,
    _Setup,
    _tokens,
)
from cost_model._serving_columns import PHASE_CODES
from cost_model._units import dtype_bytes

INFERENCE_MEMORY_PARTS: tuple[str, ...] = (
    "weights",
    "kv_cache",
    "activations",
    "comm_buffers",
    "fragmentation",
)


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
        s.model,
        context,
        s.kv_element_bytes,
        block_tokens=s.workload.kv_block_tokens,
        window_ratio=s.profile.window_kv_ratio(s.model.architecture),
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
