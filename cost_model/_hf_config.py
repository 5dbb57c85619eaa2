"""HuggingFace ``config.json`` -> ``ModelSpec``.

Field names and defaults follow the ``transformers`` configuration classes of each model type
(``LlamaConfig``, ``MistralConfig``, ``MixtralConfig``, ``Qwen2Config``, ``Qwen2MoeConfig``,
``Qwen3Config``, ``Qwen3MoeConfig``, ``DeepseekV2Config``, ``DeepseekV3Config``, Kimi-K2's
``DeepseekV3Config`` with model_type ``kimi_k2``, ``GPT2Config``). Unknown HuggingFace keys are
ignored (config files carry many unrelated ones); a missing or mistyped key this parser needs is
a ``ValueError`` naming it.
"""

from __future__ import annotations

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


def _dense_moe_layers(r: _Reader, num_layers: int) -> int:
    """Qwen MoE: layers listed in ``mlp_only_layers`` or off the ``decoder_sparse_step`` grid are
    dense. Only a leading block of dense layers is representable."""
    step = r.int("decoder_sparse_step", 1)
    dense = set(r.int_list("mlp_only_layers")) | {i for i in range(num_layers) if (i + 1) % step}
    leading = 0
    while leading in dense:
        leading += 1
    if dense - set(range(leading)):
        raise ValueError(
            f"config fields 'mlp_only_layers'/'decoder_sparse_step' place dense layers "
            f"{sorted(dense - set(range(leading)))[:5]} after MoE layers; only leading dense layers are supported"
        )
    return leading


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
    moe = MoESpec(
        num_routed_experts=r.int("num_experts"),
        top_k=r.int("num_experts_per_tok"),
        expert_ffn_hidden_size=r.int("moe_intermediate_size"),
        num_shared_experts=1 if shared_size else 0,
        shared_expert_ffn_hidden_size=shared_size,
        shared_expert_gate=bool(shared_size),
        num_dense_layers=_dense_moe_layers(r, num_layers),
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
    "qwen2_moe": lambda r, n: _qwen_moe(r, n, shared=True),
    "qwen3": _qwen3,
    "qwen3_moe": lambda r, n: _qwen_moe(r, n, shared=False),
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "kimi_k2": _deepseek,
    "gpt2": _gpt2,
}

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_PARSERS))


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
    if not isinstance(model_type, str) or model_type not in _PARSERS:
        raise ValueError(
            f"model_type ({model_type!r}) is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return _PARSERS[model_type](_Reader(data), name or default_name)
