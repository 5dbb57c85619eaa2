"""Parsers of the model families whose layers mix kinds (``cost_model._hf_config``): local and
full attention interleaved (gpt-oss, Step-3.7, Llama 4), Gated DeltaNet layers (Qwen3-Next,
Qwen3.5), Mamba-2 layers with attention beside some (Nemotron-H), and MiniMax-M2."""

from __future__ import annotations

from typing import Any

from cost_model._hf_reader import (
    _MISSING,
    _attention_gqa,
    _common,
    _layer_types,
    _leading_and_step,
    _moe_model,
    _qwen_experts,
    _Reader,
    _string_list,
)
from cost_model._model_spec import AttentionSpec, ModelSpec, MoESpec


def _interleaved_attention(r: _Reader, *, local: str, window_key: str) -> AttentionSpec:
    """GQA attention whose ``layer_types`` mix ``full_attention`` with ``local`` layers (a window
    of ``window_key`` tokens); the same projections in both."""
    num_layers = r.int("num_hidden_layers")
    kinds = _layer_types(r, num_layers)
    unknown = sorted(set(kinds) - {"full_attention", local})
    if unknown:
        raise ValueError(
            f"config field 'layer_types' has kinds {unknown}; supported: 'full_attention', "
            f"{local!r}"
        )
    full = kinds.count("full_attention")
    base = _attention_gqa(r)
    if full == num_layers:
        return base
    return base.model_copy(
        update={
            "variant": "sliding_window",
            "window_tokens": r.int(window_key),
            "full_layer_fraction": full / num_layers,
        }
    )


def _gpt_oss(r: _Reader, name: str) -> ModelSpec:
    """gpt-oss (``GptOssConfig``): every layer MoE (``num_local_experts``, top
    ``num_experts_per_tok``, experts of ``intermediate_size``), biased projections
    (``attention_bias``; the experts' and router's biases are counted as ``linear_bias`` does,
    one per output: ``gate_up_proj_bias`` ``[E, 2I]``, ``down_proj_bias`` ``[E, H]``, the
    router's ``[E]``), alternating sliding-window (``sliding_window``) and full layers; the
    attention sinks (one scalar per head and layer) are not counted."""
    moe = MoESpec(
        num_routed_experts=r.int("num_local_experts"),
        top_k=r.int("num_experts_per_tok", r.data.get("experts_per_token", _MISSING)),
        expert_ffn_hidden_size=r.int("intermediate_size"),
    )
    attention = _interleaved_attention(r, local="sliding_attention", window_key="sliding_window")
    return _common(
        r,
        name,
        AttentionSpec(**attention.model_dump()),
        moe=moe,
        linear_bias=r.bool("attention_bias", True),
    )


#: Gemma's gated MLP activations: a GELU gate (GeGLU), the weights and FLOPs of a SwiGLU.
_GEMMA_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu", "gelu_new")


def _gemma(r: _Reader, name: str, *, period: int, qk_norm: bool) -> ModelSpec:
    """Gemma 2 (``Gemma2Config``, ``period`` 2, no query/key norms) and Gemma 3's language model
    (``Gemma3TextConfig``, ``period`` ``sliding_window_pattern``, default 6; per-head query and
    key norms): GQA of ``head_dim``; sliding-window layers (``sliding_window``) with every
    ``period``-th layer full, as ``layer_types`` lists them where the config has it (transformers
    derives the same list); a gated GELU MLP (gate, up, down: SwiGLU's weights and FLOPs);
    embeddings tied by default. The norms after the attention and before and after the MLP
    (four a layer where ``ModelSpec`` counts two: ``post_attention_layernorm``,
    ``pre_feedforward_layernorm``, ``post_feedforward_layernorm``) add two norms of the hidden
    size a layer that are not counted; logit soft-capping changes no weight."""
    activation = r.data.get("hidden_activation") or r.data.get("hidden_act", "gelu_pytorch_tanh")
    if activation not in _GEMMA_ACTIVATIONS:
        raise ValueError(
            f"config field 'hidden_activation' ({activation!r}) is not supported; supported: "
            f"{', '.join(_GEMMA_ACTIVATIONS)} (Gemma's gated GELU)"
        )
    if r.data.get("layer_types") is None:
        layers = r.int("num_hidden_layers")
        kinds = [
            "sliding_attention" if (i + 1) % period else "full_attention" for i in range(layers)
        ]
        r = _Reader({**r.data, "layer_types": kinds})
    attention = _interleaved_attention(r, local="sliding_attention", window_key="sliding_window")
    if qk_norm:
        attention = attention.model_copy(update={"qk_norm": True})
    return _common(r, name, AttentionSpec(**attention.model_dump()), tie_default=True)


def _gemma3_text(r: _Reader, name: str) -> ModelSpec:
    return _gemma(r, name, period=r.int("sliding_window_pattern", 6), qk_norm=True)


def _gemma2(r: _Reader, name: str) -> ModelSpec:
    return _gemma(r, name, period=2, qk_norm=False)


def _step3p7(r: _Reader, name: str) -> ModelSpec:
    """Step-3.7 (``step3p7``, the checkpoint's ``configuration_step3p7.py``): leading dense
    layers (``first_k_dense_replace``, ``intermediate_size``), then MoE layers (``num_experts``,
    top ``num_experts_per_tok``, ``moe_intermediate_size``, ``n_shared_experts`` of
    ``share_expert_dim``); ``layer_types`` mixes full and sliding-window layers."""
    shared = r.int("n_shared_experts", 0, minimum=0)
    moe = MoESpec(
        num_routed_experts=r.int("num_experts"),
        top_k=r.int("num_experts_per_tok"),
        expert_ffn_hidden_size=r.int("moe_intermediate_size"),
        num_shared_experts=shared,
        shared_expert_ffn_hidden_size=r.optional_int("share_expert_dim") if shared else None,
        num_dense_layers=r.int("first_k_dense_replace", 0, minimum=0),
    )
    attention = _interleaved_attention(r, local="sliding_attention", window_key="sliding_window")
    return _common(r, name, AttentionSpec(**attention.model_dump()), moe=moe)


def _qwen3_next(r: _Reader, name: str, *, moe: bool) -> ModelSpec:
    """Qwen3-Next and Qwen3.5 (``Qwen3NextConfig``, ``Qwen3_5TextConfig``,
        ``Qwen3_5MoeTextConfig``): Gated DeltaNet layers (``linear_num_key_heads`` /
        ``linear_num_value_heads`` heads of ``linear_key_head_dim`` / ``linear_value_head_dim``, a
        convolution of ``linear_conv_kernel_dim`` taps) with a full gated-attention layer every
        ``full_attention_interval`` (or as ``layer_types`` lists them); MoE layers of ``num_experts``
        (top ``num_experts_per_tok``, ``moe_intermediate_size``) with a gated shared expert of
        ``shared_expert_intermediate_size``. The full layers norm their query and key heads
    (``q_norm`` / ``k_norm``). The multi-token-prediction layer is not modelled."""
    num_layers = r.int("num_hidden_layers")
    if r.data.get("layer_types") is not None:
        kinds = _layer_types(r, num_layers)
    else:
        interval = r.int("full_attention_interval", 4)
        kinds = [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(num_layers)
        ]
    unknown = sorted(set(kinds) - {"full_attention", "linear_attention"})
    if unknown:
        raise ValueError(
            f"config field 'layer_types' has kinds {unknown}; supported: 'full_attention', "
            "'linear_attention'"
        )
    full = kinds.count("full_attention")
    attention = _attention_gqa(r).model_copy(  # query and key norms: Qwen3NextAttention's
        update={"output_gate": r.bool("attn_output_gate", True), "qk_norm": True}
    )
    if full < num_layers:
        attention = attention.model_copy(
            update={
                "variant": "linear",
                "full_layer_fraction": full / num_layers,
                "linear_key_heads": r.int("linear_num_key_heads"),
                "linear_value_heads": r.int("linear_num_value_heads"),
                "linear_key_head_dim": r.int("linear_key_head_dim"),
                "linear_value_head_dim": r.int("linear_value_head_dim"),
                "linear_conv_kernel": r.int("linear_conv_kernel_dim"),
            }
        )
    attention = AttentionSpec(**attention.model_dump())
    if not moe:
        return _common(r, name, attention, qkv_bias=r.bool("attention_bias", False))
    experts = _qwen_experts(r, num_layers)
    return _moe_model(
        r,
        name,
        attention,
        experts,
        ffn_hidden_size=r.int("intermediate_size", experts.expert_ffn_hidden_size),
        qkv_bias=r.bool("attention_bias", False),
    )


#: Nemotron-H block kinds (``hybrid_override_pattern`` letters, ``layers_block_type`` names:
#: the checkpoints' ``configuration_nemotron_h.py`` names, then transformers 5's
#: ``NemotronHConfig``, which saves Mamba-2 blocks as ``linear_attention`` and attention blocks
#: as ``full_attention`` in place of the pattern).
_NEMOTRON_BLOCKS = {
    "mamba": "M",
    "attention": "*",
    "moe": "E",
    "mlp": "-",
    "linear_attention": "M",
    "full_attention": "*",
}


def _nemotron_layers(r: _Reader) -> list[str]:
    """Nemotron-H's blocks grouped into layers, each its mixers then one FFN block (``M-``,
    ``M*E``, ...): a layer is one ``ModelSpec`` layer. Each must hold one Mamba-2 block and at
    most one attention block."""
    pattern = r.data.get("hybrid_override_pattern")
    if pattern is None and r.data.get("layers_block_type") is not None:
        kinds = _string_list(r, "layers_block_type")
        unknown = sorted(set(kinds) - set(_NEMOTRON_BLOCKS))
        if unknown:
            raise ValueError(
                f"config field 'layers_block_type' has kinds {unknown}; supported: "
                f"{sorted(_NEMOTRON_BLOCKS)}"
            )
        pattern = "".join(_NEMOTRON_BLOCKS[k] for k in kinds)
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(
            f"config field 'hybrid_override_pattern' ({pattern!r}) must be a string of M, *, E, -"
        )
    layers, current = [], ""
    for block in pattern:
        current += block
        if block in "E-":
            layers.append(current)
            current = ""
    if current or any(
        layer.count("M") != 1 or layer.count("*") > 1 or set(layer) - set("M*E-")
        for layer in layers
    ):
        raise ValueError(
            f"config field 'hybrid_override_pattern' ({pattern[:40]!r}...) must group into layers "
            "of one Mamba-2 block, at most one attention block, then one MLP or MoE block"
        )
    return layers


def _nemotron_h(r: _Reader, name: str) -> ModelSpec:
    """Nemotron-H (``NemotronHConfig``): layers of a Mamba-2 block (``mamba_num_heads`` heads of
    ``mamba_head_dim``, ``n_groups`` B/C groups of ``ssm_state_size``, a ``conv_kernel``-tap
    convolution), in some of them an attention block beside it, then an MLP or MoE block of
    squared-ReLU experts (``n_routed_experts``, top ``num_experts_per_tok``,
    ``moe_intermediate_size``, a shared expert of ``moe_shared_expert_intermediate_size``).
    LatentMoE (``moe_latent_size``: experts on a narrower latent width) is refused."""
    if r.data.get("moe_latent_size"):
        raise ValueError(
            f"config field 'moe_latent_size' ({r.data['moe_latent_size']}) is not supported: "
            "experts on a latent width narrower than hidden_size (LatentMoE)"
        )
    layers = _nemotron_layers(r)
    num_layers = len(layers)
    full = sum("*" in layer for layer in layers)
    attention = _attention_gqa(r).model_copy(
        update={
            "variant": "linear",
            "full_layer_fraction": full / num_layers,
            "linear_kind": "mamba2",
            "linear_in_every_layer": True,
            "linear_key_heads": r.int("n_groups"),
            "linear_key_head_dim": r.int("ssm_state_size"),
            "linear_value_heads": r.int("mamba_num_heads"),
            "linear_value_head_dim": r.int("mamba_head_dim"),
            "linear_conv_kernel": r.int("conv_kernel"),
        }
    )
    activation = "relu2" if r.data.get("mlp_hidden_act", "relu2") == "relu2" else "swiglu"
    attention = AttentionSpec(**attention.model_dump())
    fields: dict[str, Any] = {
        "num_layers": num_layers,
        "ffn_hidden_size": r.int("intermediate_size"),
        "ffn_activation": activation,
    }
    moe_layers = [i for i, layer in enumerate(layers) if layer.endswith("E")]
    if not moe_layers:
        return _moe_model(r, name, attention, None, **fields)
    dense = [i for i in range(num_layers) if i not in moe_layers]
    leading, step = _leading_and_step(dense, num_layers, fields="'hybrid_override_pattern'")
    shared = r.optional_int("moe_shared_expert_intermediate_size")
    moe = MoESpec(
        num_routed_experts=r.int("n_routed_experts"),
        top_k=r.int("num_experts_per_tok"),
        expert_ffn_hidden_size=r.int("moe_intermediate_size"),
        num_shared_experts=r.int("n_shared_experts", 1 if shared else 0, minimum=0),
        shared_expert_ffn_hidden_size=shared,
        num_dense_layers=leading,
        moe_layer_step=step,
    )
    return _moe_model(r, name, attention, moe, **fields)


def _minimax_m2(r: _Reader, name: str) -> ModelSpec:
    """MiniMax-M2 (``minimax_m2``, the checkpoint's ``configuration_minimax_m2.py``): full GQA
    attention and an MoE in every layer (``num_local_experts``, top ``num_experts_per_tok``,
    experts of ``intermediate_size``; ``shared_intermediate_size`` 0: no shared expert). The
    multi-token-prediction modules are not modelled."""
    shared_size = r.optional_int("shared_intermediate_size", minimum=0) or None
    moe = MoESpec(
        num_routed_experts=r.int("num_local_experts"),
        top_k=r.int("num_experts_per_tok"),
        expert_ffn_hidden_size=r.int("intermediate_size"),
        num_shared_experts=1 if shared_size else 0,
        shared_expert_ffn_hidden_size=shared_size,
    )
    return _common(r, name, _attention_gqa(r), moe=moe)


def _llama4_text(r: _Reader, name: str) -> ModelSpec:
    """Llama 4's language model (``Llama4TextConfig``): layers without RoPE
    (``no_rope_layers`` entry 0; by default every fourth) attend in full, the others within
    chunks of ``attention_chunk_size``; MoE layers every ``interleave_moe_layer_step`` (or
    ``moe_layers``) with a shared expert of the experts' ``intermediate_size``, dense layers of
    ``intermediate_size_mlp``."""
    num_layers = r.int("num_hidden_layers")
    rope = r.int_list("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(num_layers)]
    if len(rope) != num_layers:
        raise ValueError(
            f"config field 'no_rope_layers' has {len(rope)} entries; 'num_hidden_layers' is "
            f"{num_layers}"
        )
    full = rope.count(0)
    attention = _attention_gqa(r)
    chunk = r.optional_int("attention_chunk_size")
    if chunk and full < num_layers:
        attention = AttentionSpec(
            **attention.model_copy(
                update={
                    "variant": "chunked",
                    "window_tokens": chunk,
                    "full_layer_fraction": full / num_layers,
                }
            ).model_dump()
        )
    interleave = r.int("interleave_moe_layer_step", 1)
    moe_layers = set(r.int_list("moe_layers") or range(interleave - 1, num_layers, interleave))
    dense = sorted(set(range(num_layers)) - moe_layers)
    leading, step = _leading_and_step(
        dense, num_layers, fields="'interleave_moe_layer_step'/'moe_layers'"
    )
    expert_size = r.int("intermediate_size")
    moe = MoESpec(
        num_routed_experts=r.int("num_local_experts"),
        top_k=r.int("num_experts_per_tok"),
        expert_ffn_hidden_size=expert_size,
        num_shared_experts=1,
        shared_expert_ffn_hidden_size=expert_size,
        num_dense_layers=leading,
        moe_layer_step=step,
    )
    return _moe_model(
        r, name, attention, moe, ffn_hidden_size=r.int("intermediate_size_mlp", expert_size)
    )
