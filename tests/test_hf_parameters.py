"""The reader's parameter count of a config equals that of transformers' own model of it.

Each supported architecture transformers implements is built tiny from its config class
(random weights, no download), and ``ModelSpec.from_hf_config`` of the same config must count
exactly its parameters: the weights the cost model prices are the weights the model has.
"""

from __future__ import annotations

import warnings

import pytest
import transformers

from cost_model import ModelSpec

SMALL = dict(vocab_size=128, hidden_size=64, num_attention_heads=4, max_position_embeddings=64)
MLA = dict(kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
CASES = {
    "llama": ("Llama", dict(intermediate_size=128, num_key_value_heads=2)),
    "mistral": ("Mistral", dict(intermediate_size=128, num_key_value_heads=2)),
    "qwen2": ("Qwen2", dict(intermediate_size=128, num_key_value_heads=2)),
    "qwen3": ("Qwen3", dict(intermediate_size=128, num_key_value_heads=2, head_dim=16)),
    "mixtral": (
        "Mixtral",
        dict(
            intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, num_key_value_heads=2
        ),
    ),
    "qwen2_moe": (
        "Qwen2Moe",
        dict(
            intermediate_size=128,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            num_experts=4,
            num_experts_per_tok=2,
            num_key_value_heads=2,
        ),
    ),
    "qwen3_moe": (
        "Qwen3Moe",
        dict(
            intermediate_size=128,
            moe_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            num_key_value_heads=2,
            head_dim=16,
        ),
    ),
    "deepseek_v2": (
        "DeepseekV2",
        dict(
            **MLA,
            intermediate_size=128,
            moe_intermediate_size=32,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_shared_experts=1,
            first_k_dense_replace=1,
            num_key_value_heads=4,
            q_lora_rank=None,
            topk_method="greedy",
            n_group=1,
            topk_group=1,
        ),
    ),
    "deepseek_v3": (
        "DeepseekV3",
        dict(
            **MLA,
            intermediate_size=128,
            moe_intermediate_size=32,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_shared_experts=1,
            n_group=2,
            topk_group=1,
            first_k_dense_replace=1,
            num_key_value_heads=4,
            q_lora_rank=32,
        ),
    ),
    "glm4_moe": (
        "Glm4Moe",
        dict(
            intermediate_size=128,
            moe_intermediate_size=32,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_shared_experts=1,
            first_k_dense_replace=1,
            num_key_value_heads=2,
            head_dim=16,
            n_group=1,
            topk_group=1,
            attention_bias=True,
            use_qk_norm=True,
        ),
    ),
    "gpt_oss": (
        "GptOss",
        dict(
            intermediate_size=32,
            num_local_experts=4,
            num_experts_per_tok=2,
            num_key_value_heads=2,
            head_dim=16,
            sliding_window=16,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        ),
    ),
    "llama4_text": (
        "Llama4Text",
        dict(
            intermediate_size=32,
            intermediate_size_mlp=128,
            num_local_experts=4,
            num_experts_per_tok=1,
            num_key_value_heads=2,
            head_dim=16,
            interleave_moe_layer_step=1,
        ),
    ),
}
#: What the reader leaves out, by design (parameters per model of the tiny configs): gpt-oss's
#: attention sinks, one scalar per head and layer (``_hf_hybrid._gpt_oss``).
UNCOUNTED = {"gpt_oss": lambda config: config.num_attention_heads * config.num_hidden_layers}


@pytest.mark.parametrize("model_type", sorted(CASES))
def test_the_reader_counts_the_models_own_parameters(model_type: str) -> None:
    prefix, fields = CASES[model_type]
    transformers.logging.set_verbosity_error()
    config = getattr(transformers, f"{prefix}Config")(**SMALL, **fields, num_hidden_layers=3)
    model_class = "Llama4ForCausalLM" if prefix == "Llama4Text" else f"{prefix}ForCausalLM"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = getattr(transformers, model_class)(config)
    actual = sum(parameter.numel() for parameter in model.parameters())
    spec = ModelSpec.from_hf_config({**config.to_dict(), "architectures": [model_class]})
    uncounted = UNCOUNTED.get(model_type, lambda _: 0)(config)
    assert spec.num_parameters == actual - uncounted
