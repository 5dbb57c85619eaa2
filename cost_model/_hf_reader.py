"""Typed reading of a HuggingFace ``config.json`` dict and the pieces every family's parser
shares (``cost_model._hf_config``): attention of the common kinds, the dense/MoE layer pattern, a
``ModelSpec`` of the usual fields. Every error names the config field."""

from __future__ import annotations

import ast
import builtins
from typing import Any

from cost_model._model_spec import AttentionSpec, ModelSpec, MoESpec

_MISSING = object()

#: Fields transformers saves under another name than the checkpoints' own config.json: its
#: configs' ``attribute_map`` (transformers 5: ``Qwen3MoeConfig`` and ``MiniMaxM2Config`` write
#: ``num_experts`` as ``num_local_experts``), so a config saved by ``save_pretrained`` reads too.
_ALIASES: dict[str, tuple[str, ...]] = {"num_experts": ("num_local_experts",)}


class _Reader:
    """Typed access to a config dict; every error names the key."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def get(self, key: str, default: Any = None) -> Any:
        """``data[key]``, else the first of its ``_ALIASES`` present, else ``default``."""
        for name in (key, *_ALIASES.get(key, ())):
            if name in self.data:
                return self.data[name]
        return default

    def int(self, key: str, default: Any = _MISSING, *, minimum: int = 1) -> int:
        value = self.get(key, default)
        if value is _MISSING:
            also = "".join(f" (or {alias!r})" for alias in _ALIASES.get(key, ()))
            raise ValueError(f"config.json is missing required field {key!r}{also}")
        if value is None and default is not _MISSING:
            value = default
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"config field {key!r} ({value!r}) must be an integer")
        if value < minimum:
            raise ValueError(f"config field {key!r} ({value}) must be >= {minimum}")
        return value

    def optional_int(self, key: str, *, minimum: builtins.int = 1) -> builtins.int | None:
        if self.get(key) is None:
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


def _qwen_experts(r: _Reader, num_layers: int, *, shared: bool = True) -> MoESpec:
    """The MoE of the Qwen MoE families (``num_experts``, top ``num_experts_per_tok``, experts of
    ``moe_intermediate_size``, a gated shared expert of ``shared_expert_intermediate_size`` where
    ``shared``), dense layers as ``_dense_moe_layers`` reads them."""
    shared_size = r.optional_int("shared_expert_intermediate_size") if shared else None
    leading, step = _dense_moe_layers(r, num_layers)
    return MoESpec(
        num_routed_experts=r.int("num_experts"),
        top_k=r.int("num_experts_per_tok"),
        expert_ffn_hidden_size=r.int("moe_intermediate_size"),
        num_shared_experts=1 if shared_size else 0,
        shared_expert_ffn_hidden_size=shared_size,
        shared_expert_gate=bool(shared_size),
        num_dense_layers=leading,
        moe_layer_step=step,
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
