"""HuggingFace config.json import: every supported type, clear errors, and a property test."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoparallel._catalog import catalog_config
from cost_model import AttentionSpec, ModelSpec, MoESpec
from cost_model._hf_config import SUPPORTED_MODEL_TYPES

LLAMA = {
    "model_type": "llama",
    "num_hidden_layers": 4,
    "hidden_size": 256,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
}
EXAMPLES = {
    "llama": LLAMA,
    "mistral": {**LLAMA, "model_type": "mistral", "sliding_window": 1024},
    "qwen2": {**LLAMA, "model_type": "qwen2", "tie_word_embeddings": True},
    "qwen3": {**LLAMA, "model_type": "qwen3", "head_dim": 64},
    "mixtral": {**LLAMA, "model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2},
    "qwen2_moe": {
        **LLAMA,
        "model_type": "qwen2_moe",
        "num_experts": 16,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 128,
        "shared_expert_intermediate_size": 512,
    },
    "qwen3_moe": {
        **LLAMA,
        "model_type": "qwen3_moe",
        "num_experts": 16,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 128,
        "mlp_only_layers": [0],
        "decoder_sparse_step": 1,
    },
    "deepseek_v2": {
        **catalog_config("deepseek-v3"),
        "model_type": "deepseek_v2",
        "q_lora_rank": None,
    },
    "deepseek_v3": catalog_config("deepseek-v3"),
    "kimi_k2": catalog_config("kimi-k2"),
    "deepseek_v32": catalog_config("deepseek-v3.2"),
    "glm_moe_dsa": catalog_config("glm-5"),
    # GLM-4.5-Air's shape (zai-org/GLM-4.5-Air config.json, as modelscope/ms-swift's model
    # listing prints it: 46 layers, the first dense, 128 experts of 1408 + 1 shared, top 8)
    "glm4_moe": {
        "model_type": "glm4_moe",
        "architectures": ["Glm4MoeForCausalLM"],
        "attention_bias": True,
        "first_k_dense_replace": 1,
        "head_dim": 128,
        "hidden_size": 4096,
        "intermediate_size": 10944,
        "max_position_embeddings": 131072,
        "moe_intermediate_size": 1408,
        "n_group": 1,
        "n_routed_experts": 128,
        "n_shared_experts": 1,
        "norm_topk_prob": True,
        "num_attention_heads": 96,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 46,
        "num_key_value_heads": 8,
        "num_nextn_predict_layers": 1,
        "partial_rotary_factor": 0.5,
        "tie_word_embeddings": False,
        "topk_group": 1,
        "use_qk_norm": False,
        "vocab_size": 151552,
    },
    "mimo": {**LLAMA, "model_type": "mimo", "attention_bias": True},
    "qwen3_vl_text": {**LLAMA, "model_type": "qwen3_vl_text", "head_dim": 64},
    "qwen3_vl_moe_text": {
        **LLAMA,
        "model_type": "qwen3_vl_moe_text",
        "num_experts": 16,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 128,
    },
    "minimax_m2": {
        **LLAMA,
        "model_type": "minimax_m2",
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "shared_intermediate_size": 0,
    },
    "gpt_oss": {
        **LLAMA,
        "model_type": "gpt_oss",
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "sliding_window": 128,
        "attention_bias": True,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
    },
    "step3p7": {
        **LLAMA,
        "model_type": "step3p7",
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 128,
        "n_shared_experts": 1,
        "share_expert_dim": 128,
        "first_k_dense_replace": 1,
        "sliding_window": 512,
        "layer_types": ["full_attention"] + ["sliding_attention"] * 3,
    },
    "llama4_text": {
        **LLAMA,
        "model_type": "llama4_text",
        "num_local_experts": 4,
        "num_experts_per_tok": 1,
        "intermediate_size_mlp": 1024,
        "attention_chunk_size": 1024,
        "interleave_moe_layer_step": 1,
        "no_rope_layers": [1, 1, 1, 0],
    },
    "kimi_k25": {"model_type": "kimi_k25", "text_config": catalog_config("kimi-k2")},
    "qwen3_vl": {"model_type": "qwen3_vl", "text_config": {**LLAMA, "model_type": "qwen3_vl_text"}},
    "qwen3_vl_moe": {
        "model_type": "qwen3_vl_moe",
        "text_config": {  # no model_type: the wrapper's text type applies
            **{key: value for key, value in LLAMA.items() if key != "model_type"},
            "num_experts": 16,
            "num_experts_per_tok": 4,
            "moe_intermediate_size": 128,
        },
    },
    "llama4": catalog_config("llama-4-scout"),
    "qwen3_5_moe": catalog_config("qwen3.5-397b-a17b"),
    "nemotron_h": catalog_config("nemotron-3-nano-30b-a3b"),
    "nemotron": catalog_config("nemotron-4-340b"),
    # small Llama-shaped configs with the fields of their own type (granite's multipliers,
    # SmolLM3's layers without RoPE)
    "granite": {
        **LLAMA,
        "model_type": "granite",
        "embedding_multiplier": 12.0,
        "residual_multiplier": 0.22,
        "tie_word_embeddings": True,
    },
    "smollm3": {
        **{key: value for key, value in LLAMA.items() if key != "tie_word_embeddings"},
        "model_type": "smollm3",
        "no_rope_layers": [1, 1, 1, 0],
    },
    "olmo2": {**LLAMA, "model_type": "olmo2"},
    "glm4": {**LLAMA, "model_type": "glm4", "head_dim": 32, "partial_rotary_factor": 0.5},
    "gemma3_text": {
        **LLAMA,
        "model_type": "gemma3_text",
        "head_dim": 64,
        "sliding_window": 512,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
    },
    # the text fields of google/gemma-2-9b's and google/gemma-3-27b-it's config.json
    "gemma2": {
        "model_type": "gemma2",
        "hidden_size": 3584,
        "intermediate_size": 14336,
        "num_hidden_layers": 42,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 256,
        "vocab_size": 256000,
        "sliding_window": 4096,
        "max_position_embeddings": 8192,
        "hidden_activation": "gelu_pytorch_tanh",
    },
    "gemma3": {
        "model_type": "gemma3",
        "architectures": ["Gemma3ForConditionalGeneration"],
        "text_config": {
            "hidden_size": 5376,
            "intermediate_size": 21504,
            "num_hidden_layers": 62,
            "num_attention_heads": 32,
            "num_key_value_heads": 16,
            "head_dim": 128,
            "vocab_size": 262208,
            "sliding_window": 1024,
            "sliding_window_pattern": 6,
            "max_position_embeddings": 131072,
            "hidden_activation": "gelu_pytorch_tanh",
        },
    },
    # microsoft/Phi-3-mini-4k-instruct config.json (the fields the reader uses)
    "phi3": {
        "model_type": "phi3",
        "architectures": ["Phi3ForCausalLM"],
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 32064,
        "max_position_embeddings": 4096,
        "sliding_window": 2047,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
    },
    "qwen3_5_moe_text": catalog_config("qwen3.5-397b-a17b")["text_config"],
    "qwen3_5": {
        "model_type": "qwen3_5",
        "text_config": {
            **{key: value for key, value in LLAMA.items() if key != "model_type"},
            "num_hidden_layers": 8,
            "linear_num_key_heads": 4,
            "linear_num_value_heads": 8,
            "linear_key_head_dim": 32,
            "linear_value_head_dim": 32,
            "linear_conv_kernel_dim": 4,
            "full_attention_interval": 4,
        },
    },
    "qwen3_5_text": {
        **LLAMA,
        "model_type": "qwen3_5_text",
        "linear_num_key_heads": 4,
        "linear_num_value_heads": 8,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 32,
        "linear_conv_kernel_dim": 4,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    },
    "qwen3_next": {
        **LLAMA,
        "model_type": "qwen3_next",
        "linear_num_key_heads": 4,
        "linear_num_value_heads": 8,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 32,
        "linear_conv_kernel_dim": 4,
        "num_experts": 16,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 128,
        "shared_expert_intermediate_size": 256,
    },
    "gpt2": {
        "model_type": "gpt2",
        "n_layer": 2,
        "n_embd": 128,
        "n_head": 4,
        "n_positions": 1024,
        "vocab_size": 500,
    },
}


def test_every_supported_type_has_an_example() -> None:
    assert set(EXAMPLES) == set(SUPPORTED_MODEL_TYPES)


@pytest.mark.parametrize("model_type", sorted(EXAMPLES))
def test_supported_types_parse(model_type: str) -> None:
    model = ModelSpec.from_hf_config(EXAMPLES[model_type], name=model_type)
    assert model.num_parameters > 0
    assert (model.moe is not None) == (
        model_type
        not in {
            "llama",
            "mistral",
            "qwen2",
            "qwen3",
            "gpt2",
            "nemotron",
            "phi3",
            "granite",
            "smollm3",
            "olmo2",
            "gemma2",
            "gemma3",
            "gemma3_text",
            "glm4",
            "mimo",
            "qwen3_vl_text",
            "qwen3_vl",
            "qwen3_5",
            "qwen3_5_text",
        }
    )


def test_specific_semantics() -> None:
    mistral = ModelSpec.from_hf_config(EXAMPLES["mistral"])
    assert mistral.attention.variant == "sliding_window" and mistral.attention.window_tokens == 1024
    qwen3_moe = ModelSpec.from_hf_config(EXAMPLES["qwen3_moe"])
    assert qwen3_moe.moe.num_dense_layers == 1
    v2 = ModelSpec.from_hf_config(EXAMPLES["deepseek_v2"])
    v3 = ModelSpec.from_hf_config(EXAMPLES["deepseek_v3"])
    assert (
        v2.attention.q_lora_rank == 0 and v2.num_parameters > v3.num_parameters
    )  # full-rank q is larger
    gpt = ModelSpec.from_hf_config(EXAMPLES["gpt2"])
    assert (
        gpt.tie_word_embeddings
        and gpt.position_embedding == "learned"
        and gpt.ffn_hidden_size == 512
    )


def test_nemotron_is_a_squared_relu_layernorm_model_and_refuses_other_activations() -> None:
    nemotron = ModelSpec.from_hf_config(EXAMPLES["nemotron"])
    assert nemotron.ffn_activation == "relu2" and nemotron.norm == "layernorm"
    assert nemotron.attention.head_dim == 192 and nemotron.attention.num_kv_heads == 8
    assert 340e9 < nemotron.num_parameters < 342e9  # Nemotron-4 340B
    with pytest.raises(ValueError, match=r"'hidden_act' \('silu'\).*'nemotron'"):
        ModelSpec.from_hf_config({**EXAMPLES["nemotron"], "hidden_act": "silu"})


def test_gemma_interleaves_sliding_and_full_layers_as_transformers_derives_them() -> None:
    gemma3 = ModelSpec.from_hf_config(EXAMPLES["gemma3"])  # the language model of the checkpoint
    assert gemma3.attention.variant == "sliding_window" and gemma3.attention.window_tokens == 1024
    assert gemma3.attention.full_layer_fraction == pytest.approx(10 / 62)  # every sixth layer
    assert gemma3.attention.qk_norm and gemma3.tie_word_embeddings
    assert 26.9e9 < gemma3.num_parameters < 27.1e9  # Gemma 3 27B's language model
    gemma2 = ModelSpec.from_hf_config(EXAMPLES["gemma2"])
    assert gemma2.attention.full_layer_fraction == 0.5 and not gemma2.attention.qk_norm
    assert 9.2e9 < gemma2.num_parameters < 9.3e9  # Gemma 2 9B
    listed = ModelSpec.from_hf_config(EXAMPLES["gemma3_text"])
    assert listed.attention.full_layer_fraction == 0.25
    with pytest.raises(ValueError, match=r"'hidden_activation' \('silu'\)"):
        ModelSpec.from_hf_config({**EXAMPLES["gemma2"], "hidden_activation": "silu"})


def test_smollm3_ties_its_embeddings_unless_told_otherwise() -> None:
    assert ModelSpec.from_hf_config(EXAMPLES["smollm3"]).tie_word_embeddings
    untied = {**EXAMPLES["smollm3"], "tie_word_embeddings": False}
    assert not ModelSpec.from_hf_config(untied).tie_word_embeddings
    assert not ModelSpec.from_hf_config(EXAMPLES["olmo2"]).tie_word_embeddings


def test_phi3_is_llama_shaped_with_its_sliding_window() -> None:
    phi3 = ModelSpec.from_hf_config(EXAMPLES["phi3"])
    assert phi3.attention.variant == "sliding_window" and phi3.attention.window_tokens == 2047
    assert 3.7e9 < phi3.num_parameters < 3.9e9  # Phi-3-mini: 3.8B
    phi4 = ModelSpec.from_hf_config({**EXAMPLES["phi3"], "sliding_window": None})
    assert phi4.attention.variant == "full"


def test_reads_a_config_file_and_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    assert ModelSpec.from_hf_config(tmp_path).name == tmp_path.name
    assert ModelSpec.from_hf_config(tmp_path / "config.json").num_layers == 4
    with pytest.raises(ValueError, match="does not exist"):
        ModelSpec.from_hf_config(tmp_path / "missing.json")


def test_unknown_type_lists_supported_ones() -> None:
    with pytest.raises(ValueError, match="llama.*qwen3_moe"):
        ModelSpec.from_hf_config({**LLAMA, "model_type": "bert"})


def test_missing_field_is_named() -> None:
    config = dict(LLAMA)
    del config["num_hidden_layers"]
    with pytest.raises(ValueError, match="num_hidden_layers"):
        ModelSpec.from_hf_config(config)


KNOWN_FIELDS = (
    {key for example in EXAMPLES.values() for key in example}
    | {
        "model_type",
        "head_dim",
        "num_key_value_heads",
        "n_inner",
        "moe_layer_freq",
        "attention.window_tokens",
        "config",
    }
    | (set(ModelSpec.model_fields) | set(AttentionSpec.model_fields) | set(MoESpec.model_fields))
    - {"name", "kind", "norm"}
)

FIELD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-5, max_value=10**6),
    st.floats(allow_nan=True),
    st.text(max_size=5),
    st.lists(st.integers(min_value=-2, max_value=200), max_size=4),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model_type=st.sampled_from(sorted(EXAMPLES)),
    mutations=st.lists(
        st.tuples(st.integers(min_value=0, max_value=40), FIELD_VALUES, st.booleans()), max_size=4
    ),
)
def test_corrupted_configs_build_or_raise_a_named_error(model_type: str, mutations: list) -> None:
    config = copy.deepcopy(EXAMPLES[model_type])
    keys = sorted(config)
    touched = []
    for index, value, delete in mutations:
        key = keys[index % len(keys)]
        touched.append(key)
        if delete:
            config.pop(key, None)
        else:
            config[key] = value
    try:
        model = ModelSpec.from_hf_config(config)
    except ValueError as error:  # pydantic's ValidationError is a ValueError
        message = str(error)
        assert any(field in message for field in KNOWN_FIELDS), message
    else:
        assert model.num_parameters > 0


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.text(max_size=8), FIELD_VALUES, max_size=8))
def test_random_dicts_raise_value_errors_only(data: dict) -> None:
    with pytest.raises(ValueError):
        ModelSpec.from_hf_config(data)
    with pytest.raises(ValueError):
        ModelSpec.model_validate(data)
