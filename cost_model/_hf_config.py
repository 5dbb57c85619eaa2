"""HuggingFace ``config.json`` -> ``ModelSpec``.

Field names and defaults follow the ``transformers`` configuration classes of each model type
(``LlamaConfig``, ``MistralConfig``, ``MixtralConfig``, ``Qwen2Config``, ``Qwen2MoeConfig``,
``Qwen3Config``, ``Qwen3MoeConfig``, ``DeepseekV2Config``, ``DeepseekV3Config``, Kimi-K2's
``DeepseekV3Config`` with model_type ``kimi_k2``, ``GPT2Config``, ``GptOssConfig``,
``Llama4TextConfig``) or, for model types ``transformers`` does not ship, the configuration
class of the model's own repository (``trust_remote_code``): DeepSeek-V3.2's ``deepseek_v32``
and GLM-5's ``glm_moe_dsa`` (DeepSeek-V3 fields plus the DSA indexer's ``index_n_heads``,
``index_head_dim``, ``index_topk``), MiniMax-M2's ``minimax_m2``, MiMo's ``mimo`` (Qwen2
fields), Step-3.7's ``step3p7``. A multimodal checkpoint (Kimi-K2.5 ``kimi_k25``, Qwen3-VL
``qwen3_vl`` / ``qwen3_vl_moe``, Llama 4 ``llama4``) is parsed as its language model, its
``text_config``: the vision encoder's weights and work are not modelled.

Models that interleave layers of two kinds with the same projections (gpt-oss's and Step-3.7's
sliding-window and full layers, ``layer_types``; Llama 4's chunked and full (NoPE) layers,
``no_rope_layers``) keep the share of full layers (``AttentionSpec.full_layer_fraction``).
Qwen3-Next and Qwen3.5 (``qwen3_next``, ``qwen3_5`` / ``qwen3_5_moe``) interleave Gated DeltaNet
layers of their own shape with gated full attention (``AttentionSpec.linear_*``); Nemotron-H
(``nemotron_h``) has a Mamba-2 block in every layer and an attention block beside it in some.
Layers whose kinds differ in other ways (Gemma 4's global heads, MiMo-V2's window heads,
DeepSeek-V4's compressed attention, Nemotron-H's LatentMoE) cannot be one ``ModelSpec``: they
are refused by name. Unknown HuggingFace keys are
ignored (config files carry many unrelated ones); a missing or mistyped key this parser needs is
a ``ValueError`` naming it.
"""

from __future__ import annotations

import ast
import builtins
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cost_model._model_spec import AttentionSpec, ModelSpec, MoESpec

_MISSING = object()


class _Reader:
    """Typed access to a config dict; every error names the key."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def int(self, key: str, default: Any = _MISSING, *, minimum: int = 1) -> int:
        value = self.data.get(key, default)
        if value is _MISSING:
            raise ValueError(f"config.json is missing required field {key!r}")
        if value is None and default is not _MISSING:
            value = default
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"config field {key!r} ({value!r}) must be an integer")
        if value < minimum:
            raise ValueError(f"config field {key!r} ({value}) must be >= {minimum}")
        return value

    def optional_int(self, key: str, *, minimum: builtins.int = 1) -> builtins.int | None:
        if self.data.get(key) is None:
            return None
        return self.int(key, minimum=minimum)

    def bool(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ValueError(f"config field {key!r} ({value!r}) must be true or false")
        return value

    def int_list(self, key: str) -> list[builtins.int]:
        value = self.data.get(key) or []
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise ValueError(f"config field {key!r} ({value!r}) must be a list of integers")
        return value


def _attention_gqa(r: _Reader, *, sliding: bool = False) -> AttentionSpec:
    heads = r.int("num_attention_heads")
    kv_heads = r.int("num_key_value_heads", heads)
    hidden = r.int("hidden_size")
    if r.data.get("head_dim") is None and hidden < heads:
        raise ValueError(
            f"config field 'hidden_size' ({hidden}) must be >= 'num_attention_heads' ({heads}) "
            "when 'head_dim' is not given (head_dim = hidden_size / num_attention_heads)"
        )
    head_dim = r.int("head_dim", hidden // heads)
    window = r.optional_int("sliding_window") if sliding else None
    return AttentionSpec(
        kind="mha" if kv_heads == heads else "gqa",
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        variant="sliding_window" if window else "full",
        window_tokens=window,
    )


def _attention_mla(r: _Reader) -> AttentionSpec:
    heads = r.int("num_attention_heads")
    nope, rope, v = r.int("qk_nope_head_dim"), r.int("qk_rope_head_dim"), r.int("v_head_dim")
    return AttentionSpec(
        kind="mla",
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=nope + rope,
        q_lora_rank=r.optional_int("q_lora_rank") or 0,
        kv_lora_rank=r.int("kv_lora_rank"),
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope,
        v_head_dim=v,
    )


def _common(
    r: _Reader, name: str, attention: AttentionSpec, *, tie_default: bool = False, **extra: Any
) -> ModelSpec:
    return ModelSpec(
        name=name,
        num_layers=r.int("num_hidden_layers"),
        hidden_size=r.int("hidden_size"),
        vocab_size=r.int("vocab_size"),
        ffn_hidden_size=r.int("intermediate_size"),
        attention=attention,
        tie_word_embeddings=r.bool("tie_word_embeddings", tie_default),
        max_context_tokens=r.int("max_position_embeddings"),
        **extra,
    )


def _dense_moe_layers(r: _Reader, num_layers: int) -> tuple[int, int]:
    """Qwen MoE: layers listed in ``mlp_only_layers`` or off the ``decoder_sparse_step`` grid are
    dense: (leading dense layers, MoE layer step). Representable: a leading block of dense
    layers, then every step-th layer MoE."""
    step = r.int("decoder_sparse_step", 1)
    dense = set(r.int_list("mlp_only_layers")) | {i for i in range(num_layers) if (i + 1) % step}
    return _leading_and_step(
        sorted(dense), num_layers, fields="'mlp_only_layers'/'decoder_sparse_step'"
    )


def _leading_and_step(dense: list[int], num_layers: int, *, fields: str) -> tuple[int, int]:
    """(leading dense layers, MoE layer step) whose pattern is exactly ``dense``: a leading block
    of dense layers, after it every step-th layer MoE (``MoESpec.moe_layer_step``)."""
    dense_set = set(dense) & set(range(num_layers))
    moe = [i for i in range(num_layers) if i not in dense_set]
    if not moe:
        return num_layers, 1  # every layer dense: an MoE spec without MoE layers
    step = moe[1] - moe[0] if len(moe) > 1 else 1
    leading = moe[0] - (step - 1)
    if leading >= 0:
        pattern = {i for i in range(leading, num_layers) if (i - leading + 1) % step == 0}
        if pattern == set(moe):
            return leading, step
    raise ValueError(
        f"config fields {fields} place dense layers {sorted(dense_set)[:8]} in a pattern other "
        "than a leading block followed by every n-th layer MoE"
    )


def _llama(r: _Reader, name: str) -> ModelSpec:
    return _common(r, name, _attention_gqa(r))


def _mistral(r: _Reader, name: str) -> ModelSpec:
    return _common(r, name, _attention_gqa(r, sliding=True))


def _qwen2(r: _Reader, name: str) -> ModelSpec:
    sliding = r.bool("use_sliding_window", False)
    return _common(r, name, _attention_gqa(r, sliding=sliding), qkv_bias=True)


def _qwen3(r: _Reader, name: str) -> ModelSpec:
    return _common(r, name, _attention_gqa(r), qkv_bias=r.bool("attention_bias", False))


def _mixtral(r: _Reader, name: str) -> ModelSpec:
    moe = MoESpec(
        num_routed_experts=r.int("num_local_experts"),
        top_k=r.int("num_experts_per_tok"),
        expert_ffn_hidden_size=r.int("intermediate_size"),
    )
    return _common(r, name, _attention_gqa(r, sliding=True), moe=moe)


def _qwen_moe(r: _Reader, name: str, *, shared: bool) -> ModelSpec:
    num_layers = r.int("num_hidden_layers")
    shared_size = r.optional_int("shared_expert_intermediate_size") if shared else None
    leading, step = _dense_moe_layers(r, num_layers)
    moe = MoESpec(
        num_routed_experts=r.int("num_experts"),
        top_k=r.int("num_experts_per_tok"),
        expert_ffn_hidden_size=r.int("moe_intermediate_size"),
        num_shared_experts=1 if shared_size else 0,
        shared_expert_ffn_hidden_size=shared_size,
        shared_expert_gate=bool(shared_size),
        num_dense_layers=leading,
        moe_layer_step=step,
    )
    qkv_bias = True if shared else r.bool("attention_bias", False)
    return _common(r, name, _attention_gqa(r), moe=moe, qkv_bias=qkv_bias)


def _deepseek(r: _Reader, name: str) -> ModelSpec:
    if r.int("moe_layer_freq", 1) != 1:
        raise ValueError(
            f"config field 'moe_layer_freq' ({r.data.get('moe_layer_freq')}) must be 1"
        )
    moe = MoESpec(
        num_routed_experts=r.int("n_routed_experts"),
        top_k=r.int("num_experts_per_tok"),
        expert_ffn_hidden_size=r.int("moe_intermediate_size"),
        num_shared_experts=r.int("n_shared_experts", 0, minimum=0),
        num_dense_layers=r.int("first_k_dense_replace", 0, minimum=0),
    )
    return _common(r, name, _attention_mla(r), moe=moe)


def _deepseek_dsa(r: _Reader, name: str) -> ModelSpec:
    """DeepSeek-V3.2 / GLM-5: DeepSeek-V3's MLA and MoE with DeepSeek Sparse Attention in every
    layer: an indexer of ``index_n_heads`` x ``index_head_dim`` picks ``index_topk`` keys per
    query (DeepSeek-V3.2-Exp ``inference/model.py``; arXiv:2512.02556 sec. 2.1)."""
    spec = _deepseek(r, name)
    attention = spec.attention.model_copy(
        update={
            "variant": "sparse_topk",
            "topk_tokens": r.int("index_topk"),
            "indexer_heads": r.int("index_n_heads"),
            "indexer_head_dim": r.int("index_head_dim"),
        }
    )
    return spec.model_copy(update={"attention": AttentionSpec(**attention.model_dump())})


def _string_list(r: _Reader, key: str) -> list[str]:
    """A list of strings (or the text of a Python list, as some exported configs carry it)."""
    value = r.data.get(key)
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise ValueError(
                f"config field {key!r} ({value[:60]!r}) must be a list of layer kinds"
            ) from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"config field {key!r} ({value!r}) must be a list of strings")
    return value


def _layer_types(r: _Reader, num_layers: int) -> list[str]:
    """``layer_types``, one entry per layer."""
    value = _string_list(r, "layer_types")
    if len(value) != num_layers:
        raise ValueError(
            f"config field 'layer_types' has {len(value)} entries; 'num_hidden_layers' is "
            f"{num_layers}"
        )
    return value


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
    one per output), alternating sliding-window (``sliding_window``) and full layers; the
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
    ``shared_expert_intermediate_size``. The multi-token-prediction layer is not modelled."""
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
    attention = _attention_gqa(r).model_copy(
        update={"output_gate": r.bool("attn_output_gate", True)}
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
    expert_size = r.int("moe_intermediate_size")
    shared_size = r.optional_int("shared_expert_intermediate_size")
    leading, step = _dense_moe_layers(r, num_layers)
    experts = MoESpec(
        num_routed_experts=r.int("num_experts"),
        top_k=r.int("num_experts_per_tok"),
        expert_ffn_hidden_size=expert_size,
        num_shared_experts=1 if shared_size else 0,
        shared_expert_ffn_hidden_size=shared_size,
        shared_expert_gate=bool(shared_size),
        num_dense_layers=leading,
        moe_layer_step=step,
    )
    return _moe_model(
        r,
        name,
        attention,
        experts,
        ffn_hidden_size=r.int("intermediate_size", expert_size),
        qkv_bias=r.bool("attention_bias", False),
    )


def _moe_model(
    r: _Reader, name: str, attention: AttentionSpec, moe: MoESpec | None, **fields: Any
) -> ModelSpec:
    """A ``ModelSpec`` of ``attention`` and ``moe`` whose dense FFN width (``ffn_hidden_size``)
    is given (a config may name it otherwise or not at all), untied embeddings by default;
    ``num_layers`` where the config's layers are not its ``num_hidden_layers``."""
    num_layers = fields.pop("num_layers", None) or r.int("num_hidden_layers")
    return ModelSpec(
        name=name,
        num_layers=num_layers,
        hidden_size=r.int("hidden_size"),
        vocab_size=r.int("vocab_size"),
        attention=attention,
        tie_word_embeddings=r.bool("tie_word_embeddings", False),
        max_context_tokens=r.int("max_position_embeddings"),
        moe=moe,
        **fields,
    )


#: Nemotron-H block kinds (``hybrid_override_pattern`` letters, ``layers_block_type`` names).
_NEMOTRON_BLOCKS = {"mamba": "M", "attention": "*", "moe": "E", "mlp": "-"}


def _nemotron_layers(r: _Reader) -> list[str]:
    """Nemotron-H's blocks grouped into layers, each its mixers then one FFN block (``M-``,
    ``M*E``, ...): a layer is one ``ModelSpec`` layer. Each must hold one Mamba-2 block and at
    most one attention block."""
    pattern = r.data.get("hybrid_override_pattern")
    if pattern is None and r.data.get("layers_block_type") is not None:
        kinds = _string_list(r, "layers_block_type")
        pattern = "".join(_NEMOTRON_BLOCKS.get(k, "?") for k in kinds)
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


def _gpt2(r: _Reader, name: str) -> ModelSpec:
    hidden, heads = r.int("n_embd"), r.int("n_head")
    attention = AttentionSpec(
        kind="mha", num_heads=heads, num_kv_heads=heads, head_dim=max(hidden // heads, 1)
    )
    return ModelSpec(
        name=name,
        num_layers=r.int("n_layer"),
        hidden_size=hidden,
        vocab_size=r.int("vocab_size"),
        ffn_hidden_size=r.int("n_inner", 4 * hidden),
        attention=attention,
        tie_word_embeddings=r.bool("tie_word_embeddings", True),
        ffn_activation="gelu",
        norm="layernorm",
        linear_bias=True,
        position_embedding="learned",
        max_context_tokens=r.int("n_positions"),
    )


_PARSERS: dict[str, Callable[[_Reader, str], ModelSpec]] = {
    "llama": _llama,
    "mistral": _mistral,
    "mixtral": _mixtral,
    "qwen2": _qwen2,
    "mimo": _qwen2,
    "qwen2_moe": lambda r, n: _qwen_moe(r, n, shared=True),
    "qwen3": _qwen3,
    "qwen3_vl_text": _qwen3,
    "qwen3_moe": lambda r, n: _qwen_moe(r, n, shared=False),
    "qwen3_vl_moe_text": lambda r, n: _qwen_moe(r, n, shared=False),
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "kimi_k2": _deepseek,
    "deepseek_v32": _deepseek_dsa,
    "glm_moe_dsa": _deepseek_dsa,
    "minimax_m2": _minimax_m2,
    "gpt_oss": _gpt_oss,
    "step3p7": _step3p7,
    "llama4_text": _llama4_text,
    "qwen3_next": lambda r, n: _qwen3_next(r, n, moe=True),
    "qwen3_5_text": lambda r, n: _qwen3_next(r, n, moe=False),
    "qwen3_5_moe_text": lambda r, n: _qwen3_next(r, n, moe=True),
    "nemotron_h": _nemotron_h,
    "gpt2": _gpt2,
}

#: Multimodal checkpoints parsed as their language model (``text_config``): model type -> the
#: text model type when the ``text_config`` does not name one.
_MULTIMODAL: dict[str, str] = {
    "kimi_k25": "kimi_k2",
    "qwen3_vl": "qwen3_vl_text",
    "qwen3_vl_moe": "qwen3_vl_moe_text",
    "llama4": "llama4_text",
    "qwen3_5": "qwen3_5_text",
    "qwen3_5_moe": "qwen3_5_moe_text",
}

#: Model types whose layers differ in shape, which one ``ModelSpec`` cannot hold: the reason.
_UNREPRESENTABLE: dict[str, str] = {
    "nemotron-nas": "per-layer block_configs (layers without attention, per-layer FFN widths)",
    "gemma4": "global layers with other head sizes and KV heads than the sliding-window layers",
    "mimo_v2_flash": "sliding-window layers with other KV heads than the full layers",
    "deepseek_v4": "compressed attention and hyper-connections per layer (compress_ratios, hc_mult)",
    "minimax_m3": "block-sparse attention on some layers only, dense FFN layers of another width",
    "minimax_m3_vl": "block-sparse attention on some layers only, dense FFN layers of another width",
    "deepseek_ref": "compressed attention and hyper-connections per layer (compress_ratios, hc_mult)",
    "kimi_linear": "Kimi Delta Attention layers beside MLA ones and experts on a narrower latent width",
    "kimi_k3": "Kimi Delta Attention layers beside MLA ones and experts on a narrower latent width",
}

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted({*_PARSERS, *_MULTIMODAL}))


def parse_hf_config(
    path_or_dict: str | Path | dict[str, Any], *, name: str | None = None
) -> ModelSpec:
    """Build a ``ModelSpec`` from a HuggingFace config (a path to ``config.json`` or its dict)."""
    if isinstance(path_or_dict, dict):
        data = path_or_dict
        default_name = str(data.get("_name_or_path") or data.get("model_type") or "model")
    else:
        path = Path(path_or_dict)
        if path.is_dir():
            path = path / "config.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"config path ({str(path)!r}) does not exist") from None
        except json.JSONDecodeError as error:
            raise ValueError(f"config path ({str(path)!r}) is not valid JSON: {error}") from None
        default_name = path.parent.name or path.stem
    if not isinstance(data, dict):
        raise ValueError(f"config ({type(data).__name__}) must be a JSON object")
    model_type = data.get("model_type")
    if isinstance(model_type, str) and model_type in _MULTIMODAL:
        text = data.get("text_config")
        if not isinstance(text, dict):
            raise ValueError(
                f"config field 'text_config' ({text!r}) must be an object for model_type "
                f"{model_type!r} (a multimodal checkpoint is parsed as its language model)"
            )
        text = dict(text)
        text.setdefault("model_type", _MULTIMODAL[model_type])
        if "tie_word_embeddings" in data:
            text.setdefault("tie_word_embeddings", data["tie_word_embeddings"])
        data, model_type = text, text.get("model_type")
    if isinstance(model_type, str) and model_type in _UNREPRESENTABLE:
        raise ValueError(
            f"model_type ({model_type!r}) is not supported: {_UNREPRESENTABLE[model_type]}, "
            "which one layer shape per model cannot describe"
        )
    if not isinstance(model_type, str) or model_type not in _PARSERS:
        raise ValueError(
            f"model_type ({model_type!r}) is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return _PARSERS[model_type](_Reader(data), name or default_name)
