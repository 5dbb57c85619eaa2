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

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cost_model._hf_hybrid import (
    _gemma2,
    _gemma3_text,
    _gpt_oss,
    _llama4_text,
    _minimax_m2,
    _nemotron_h,
    _qwen3_next,
    _step3p7,
)
from cost_model._hf_reader import (
    _attention_gqa,
    _attention_mla,
    _common,
    _qwen_experts,
    _Reader,
)
from cost_model._model_spec import AttentionSpec, ModelSpec, MoESpec


def _llama(r: _Reader, name: str) -> ModelSpec:
    return _common(r, name, _attention_gqa(r))


def _mistral(r: _Reader, name: str) -> ModelSpec:
    return _common(r, name, _attention_gqa(r, sliding=True))


def _smollm3(r: _Reader, name: str) -> ModelSpec:
    """SmolLM3 (``SmolLM3Config``): Llama's weights (the layers without RoPE, ``no_rope_layers``,
    change no weight), embeddings tied unless the config says otherwise."""
    return _common(r, name, _attention_gqa(r), tie_default=True)


def _olmo2(r: _Reader, name: str) -> ModelSpec:
    """OLMo 2 (``Olmo2Config``): Llama's projections with the norms after the attention and the
    MLP instead of before them (as many norms); its query and key norms run over all heads'
    features at once (``Olmo2Attention.q_norm`` of ``num_attention_heads x head_dim``), a shape
    ``AttentionSpec.qk_norm`` (one norm per head) does not hold: not read, as MiniMax-M2's."""
    return _common(r, name, _attention_gqa(r))


def _glm4(r: _Reader, name: str) -> ModelSpec:
    """GLM-4 dense (``Glm4Config``: GLM-4-9B/32B-0414): GQA with Q/K/V biases
    (``attention_bias``), a SwiGLU MLP with its gate and up projections fused (the same
    weights), RoPE on part of each head; its norms after the attention and after the MLP
    (``post_self_attn_layernorm``, ``post_mlp_layernorm``: four a layer where ``ModelSpec``
    counts two) add two norms of the hidden size a layer that are not counted."""
    return _common(r, name, _attention_gqa(r), qkv_bias=r.bool("attention_bias", True))


def _phi3(r: _Reader, name: str) -> ModelSpec:
    """Phi-3, Phi-3.5 and Phi-4 (transformers ``Phi3Config``): Llama's weights with the Q/K/V
    projections fused into one ``qkv_proj`` and the gate and up projections into one
    ``gate_up_proj`` (the same parameters), sliding-window attention where ``sliding_window`` is
    set; RoPE on ``partial_rotary_factor`` of each head and long-context RoPE scaling change no
    weight."""
    return _common(r, name, _attention_gqa(r, sliding=True))


def _qwen2(r: _Reader, name: str) -> ModelSpec:
    sliding = r.bool("use_sliding_window", False)
    return _common(r, name, _attention_gqa(r, sliding=sliding), qkv_bias=True)


def _qk_normed(attention: AttentionSpec) -> AttentionSpec:
    """Qwen3's attention: an RMSNorm of every query and key head before RoPE (transformers
    ``Qwen3Attention`` ``q_norm`` / ``k_norm``; no config field switches it off)."""
    return attention.model_copy(update={"qk_norm": True})


def _qwen3(r: _Reader, name: str) -> ModelSpec:
    return _common(r, name, _qk_normed(_attention_gqa(r)), qkv_bias=r.bool("attention_bias", False))


def _mixtral(r: _Reader, name: str) -> ModelSpec:
    moe = MoESpec(
        num_routed_experts=r.int("num_local_experts"),
        top_k=r.int("num_experts_per_tok"),
        expert_ffn_hidden_size=r.int("intermediate_size"),
    )
    return _common(r, name, _attention_gqa(r, sliding=True), moe=moe)


def _qwen_moe(r: _Reader, name: str, *, shared: bool) -> ModelSpec:
    """Qwen2-MoE (``shared``: a shared expert, q/k/v biases) or Qwen3-MoE (query and key norms)."""
    moe = _qwen_experts(r, r.int("num_hidden_layers"), shared=shared)
    qkv_bias = True if shared else r.bool("attention_bias", False)
    attention = _attention_gqa(r) if shared else _qk_normed(_attention_gqa(r))
    return _common(r, name, attention, moe=moe, qkv_bias=qkv_bias)


def _deepseek(r: _Reader, name: str) -> ModelSpec:
    if r.int("moe_layer_freq", 1) != 1:
        raise ValueError(
            f"config field 'moe_layer_freq' ({r.data.get('moe_layer_freq')}) must be 1"
        )
    return _common(r, name, _attention_mla(r), moe=_deepseek_experts(r))


def _deepseek_experts(r: _Reader) -> MoESpec:
    """DeepSeek-V3's MoE layout: ``first_k_dense_replace`` dense layers, then
    ``n_routed_experts`` of ``moe_intermediate_size`` (top ``num_experts_per_tok``) beside
    ``n_shared_experts`` shared ones."""
    return MoESpec(
        num_routed_experts=r.int("n_routed_experts"),
        top_k=r.int("num_experts_per_tok"),
        expert_ffn_hidden_size=r.int("moe_intermediate_size"),
        num_shared_experts=r.int("n_shared_experts", 0, minimum=0),
        num_dense_layers=r.int("first_k_dense_replace", 0, minimum=0),
    )


def _glm4_moe(r: _Reader, name: str) -> ModelSpec:
    """GLM-4.5 / 4.6 / 4.7 (transformers ``Glm4MoeConfig``): GQA attention with q/k/v biases
    (``attention_bias``) and, where ``use_qk_norm``, query and key norms (RoPE on
    ``partial_rotary_factor`` of each head changes no weight); DeepSeek-V3's MoE layout, the
    first ``first_k_dense_replace`` layers dense (``intermediate_size``), then ``n_routed_experts``
    routed experts of ``moe_intermediate_size`` (top ``num_experts_per_tok``) beside
    ``n_shared_experts`` shared ones. The multi-token-prediction layers
    (``num_nextn_predict_layers``) are left out, as DeepSeek-V3's are."""
    attention = _attention_gqa(r)
    if r.bool("use_qk_norm", False):
        attention = _qk_normed(attention)
    qkv_bias = r.bool("attention_bias", False)
    return _common(r, name, attention, moe=_deepseek_experts(r), qkv_bias=qkv_bias)


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


def _nemotron(r: _Reader, name: str) -> ModelSpec:
    """Nemotron-4 and Minitron (transformers ``NemotronConfig``): GQA attention (``head_dim``
    where given; RoPE on ``partial_rotary_factor`` of each head changes no weight), a
    non-gated MLP of ``intermediate_size`` with ``hidden_act`` squared ReLU, LayerNorm with a
    bias (``NemotronLayerNorm1P``), optional attention and MLP biases (``attention_bias``,
    ``mlp_bias``), untied embeddings by default."""
    activation = r.data.get("hidden_act", "relu2")
    if activation != "relu2":
        raise ValueError(
            f"config field 'hidden_act' ({activation!r}) is not supported for model_type "
            "'nemotron': the parser knows its squared-ReLU MLP ('relu2')"
        )
    bias = r.bool("attention_bias", False) or r.bool("mlp_bias", False)
    return _common(
        r,
        name,
        _attention_gqa(r),
        ffn_activation="relu2",
        norm="layernorm",
        linear_bias=bias,
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
    "phi3": _phi3,
    "granite": _llama,
    "smollm3": _smollm3,
    "olmo2": _olmo2,
    "gemma2": _gemma2,
    "glm4": _glm4,
    "gemma3_text": _gemma3_text,
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
    "glm4_moe": _glm4_moe,
    "minimax_m2": _minimax_m2,
    "gpt_oss": _gpt_oss,
    "step3p7": _step3p7,
    "llama4_text": _llama4_text,
    "qwen3_next": lambda r, n: _qwen3_next(r, n, moe=True),
    "qwen3_5_text": lambda r, n: _qwen3_next(r, n, moe=False),
    "qwen3_5_moe_text": lambda r, n: _qwen3_next(r, n, moe=True),
    "nemotron_h": _nemotron_h,
    "nemotron": _nemotron,
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
    "gemma3": "gemma3_text",
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
    architecture = _architecture(data)
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
    spec = _PARSERS[model_type](_Reader(data), name or default_name)
    return spec if architecture is None else spec.model_copy(update={"architecture": architecture})


def _architecture(data: dict[str, Any]) -> str | None:
    """The checkpoint's model class: the first of the config's ``architectures`` (the class
    transformers and the serving engines load; a multimodal checkpoint's outer class), None
    where the config names none."""
    classes = data.get("architectures")
    if classes is None or classes == []:
        return None
    if not isinstance(classes, list) or not all(isinstance(c, str) and c for c in classes):
        raise ValueError(
            f"config field 'architectures' ({classes!r}) must be a list of class names"
        )
    return classes[0]
