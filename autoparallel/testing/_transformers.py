"""Tiny configs of transformers' model classes, for checks that build the real modules.

Each entry is (config class, model class, fields beside ``TINY_SHAPE``): a few layers, hidden 64,
four heads, a 128-token vocabulary, four experts where the architecture has them, so that the
model builds in milliseconds with random weights and exercises every module kind of its family
(MLA, query/key norms, shared experts, sinks, interleaved dense and MoE layers). transformers is
imported by the caller.
"""

from __future__ import annotations

__all__ = ["TINY_SHAPE", "TINY_TRANSFORMERS", "tiny_transformers_model"]

TINY_SHAPE = dict(vocab_size=128, hidden_size=64, num_attention_heads=4, max_position_embeddings=64)
_MLA = dict(kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
_EXPERTS = dict(moe_intermediate_size=32, num_experts_per_tok=2)
#: DeepSeek's MoE layout at the tiny shape: one dense layer, then four routed experts and a shared one
_DEEPSEEK_MOE = dict(
    **_EXPERTS,
    intermediate_size=128,
    n_routed_experts=4,
    n_shared_experts=1,
    first_k_dense_replace=1,
)


def _dense(family: str, **fields) -> tuple[str, str, dict]:
    """A dense model of transformers' ``<family>Config`` / ``<family>ForCausalLM``: an FFN of 128,
    two KV heads, and ``fields``."""
    return (
        f"{family}Config",
        f"{family}ForCausalLM",
        dict(intermediate_size=128, num_key_value_heads=2, **fields),
    )


#: Gemma's sliding-window layers at the tiny shape
_GEMMA = dict(head_dim=16, sliding_window=16)

TINY_TRANSFORMERS: dict[str, tuple[str, str, dict]] = {
    "llama": _dense("Llama"),
    "mistral": _dense("Mistral"),
    "nemotron": _dense("Nemotron"),
    "phi3": _dense("Phi3", pad_token_id=0),
    "granite": _dense("Granite"),
    "smollm3": _dense("SmolLM3", pad_token_id=0),
    "olmo2": _dense("Olmo2"),
    "gemma2": _dense("Gemma2", **_GEMMA),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", _dense("Gemma3", **_GEMMA)[2]),
    "glm4": _dense("Glm4", head_dim=16, pad_token_id=0),
    "qwen2": _dense("Qwen2"),
    "qwen3": _dense("Qwen3", head_dim=16),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(
            intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, num_key_value_heads=2
        ),
    ),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(
            **_EXPERTS,
            intermediate_size=128,
            shared_expert_intermediate_size=48,
            num_experts=4,
            num_key_value_heads=2,
        ),
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(**_EXPERTS, intermediate_size=128, num_experts=4, num_key_value_heads=2, head_dim=16),
    ),
    "deepseek_v2": (
        "DeepseekV2Config",
        "DeepseekV2ForCausalLM",
        dict(
            **_MLA,
            **_DEEPSEEK_MOE,
            num_key_value_heads=4,
            q_lora_rank=None,
            topk_method="greedy",
            n_group=1,
            topk_group=1,
        ),
    ),
    "deepseek_v3": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        dict(
            **_MLA,
            **_DEEPSEEK_MOE,
            n_group=2,
            topk_group=1,
            num_key_value_heads=4,
            q_lora_rank=32,
        ),
    ),
    "glm4_moe": (
        "Glm4MoeConfig",
        "Glm4MoeForCausalLM",
        dict(
            **_DEEPSEEK_MOE,
            num_key_value_heads=2,
            head_dim=16,
            n_group=1,
            topk_group=1,
            attention_bias=True,
            use_qk_norm=True,
        ),
    ),
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        dict(
            intermediate_size=32,
            num_local_experts=4,
            num_experts_per_tok=2,
            num_key_value_heads=2,
            head_dim=16,
            sliding_window=4,
        ),
    ),
    "qwen3_next": (
        "Qwen3NextConfig",
        "Qwen3NextForCausalLM",
        dict(
            **_EXPERTS,
            intermediate_size=128,
            shared_expert_intermediate_size=32,
            num_experts=4,
            num_key_value_heads=2,
            head_dim=16,
            full_attention_interval=2,
            linear_num_value_heads=4,
            linear_num_key_heads=2,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_conv_kernel_dim=4,
        ),
    ),
    "minimax_m2": (
        "MiniMaxM2Config",
        "MiniMaxM2ForCausalLM",
        dict(
            intermediate_size=32,
            num_local_experts=4,
            num_experts_per_tok=2,
            num_key_value_heads=2,
            head_dim=16,
            eos_token_id=None,
        ),
    ),
    "llama4_text": (
        "Llama4TextConfig",
        "Llama4ForCausalLM",
        dict(
            intermediate_size=32,
            intermediate_size_mlp=128,
            num_local_experts=4,
            num_experts_per_tok=1,
            num_key_value_heads=2,
            head_dim=16,
            interleave_moe_layer_step=2,
        ),
    ),
}


def tiny_transformers_model(model_type: str, *, layers: int, seed: int = 0, **overrides):
    """(model, config): transformers' tiny model of ``model_type`` (``TINY_TRANSFORMERS``) with
    ``layers`` decoder layers (gpt-oss's alternate sliding-window and full attention), weights
    from ``seed``."""
    import torch
    import transformers

    config_class, model_class, fields = TINY_TRANSFORMERS[model_type]
    fields = {**fields, **overrides}
    if model_type == "gpt_oss":
        kinds = ("sliding_attention", "full_attention")
        fields.setdefault("layer_types", [kinds[i % 2] for i in range(layers)])
    transformers.logging.set_verbosity_error()
    config = getattr(transformers, config_class)(**TINY_SHAPE, **fields, num_hidden_layers=layers)
    torch.manual_seed(seed)
    return getattr(transformers, model_class)(config), config
