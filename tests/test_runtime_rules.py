"""Module rules (torch-free): patterns cover the reference model and HuggingFace module names."""

from __future__ import annotations

from fnmatch import fnmatchcase

import pytest

import autoparallel as ap
from autoparallel._module_rules import module_rules_for
from cost_model import ParallelConfig


def _layer_names(prefix: str, attention: list[str], ffn: list[str]) -> list[str]:
    return (
        [
            f"{prefix}.{name}"
            for name in ["input_layernorm", "post_attention_layernorm", "self_attn", "mlp"]
        ]
        + [f"{prefix}.self_attn.{name}" for name in attention]
        + [f"{prefix}.{name}" for name in ffn]
    )


_MLA = [
    "q_a_proj",
    "q_a_layernorm",
    "q_b_proj",
    "kv_a_proj_with_mqa",
    "kv_a_layernorm",
    "kv_b_proj",
    "o_proj",
]
_GQA = ["q_proj", "k_proj", "v_proj", "o_proj"]
_QWEN3 = _GQA + ["q_norm", "k_norm"]


def _experts(container: str, names: tuple[str, ...], count: int = 4) -> list[str]:
    out = [container]
    for expert in range(count):
        out += [f"{container}.{expert}"] + [f"{container}.{expert}.{name}" for name in names]
    return out


def _deepseek_names() -> list[str]:
    dense = _layer_names("model.layers.0", _MLA, ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"])
    moe = _layer_names(
        "model.layers.1",
        _MLA,
        [
            "mlp.gate",
            "mlp.shared_experts",
            "mlp.shared_experts.gate_proj",
            "mlp.shared_experts.up_proj",
            "mlp.shared_experts.down_proj",
        ]
        + _experts("mlp.experts", ("gate_proj", "up_proj", "down_proj")),
    )
    return ["model", "model.embed_tokens", "model.layers", "model.norm", "lm_head"] + dense + moe


def _mixtral_names() -> list[str]:
    layer = _layer_names(
        "model.layers.0",
        _GQA,
        ["block_sparse_moe", "block_sparse_moe.gate"]
        + _experts("block_sparse_moe.experts", ("w1", "w2", "w3")),
    )
    return ["model", "model.embed_tokens", "model.norm", "lm_head"] + layer


def _qwen3_moe_names() -> list[str]:
    layer = _layer_names(
        "model.layers.0",
        _QWEN3,
        ["mlp.gate"] + _experts("mlp.experts", ("gate_proj", "up_proj", "down_proj")),
    )
    return ["model", "model.embed_tokens", "model.norm", "lm_head"] + layer


def _llama_names() -> list[str]:
    layer = _layer_names("model.layers.0", _GQA, ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"])
    return ["model", "model.embed_tokens", "model.norm", "lm_head"] + layer


def _matches(rules, names):
    return {
        rule.pattern: [name for name in names if fnmatchcase(name, rule.pattern)] for rule in rules
    }


def _style_of(rules, name):
    styles = {rule.style for rule in rules if fnmatchcase(name, rule.pattern)}
    assert len(styles) <= 1, (name, styles)
    return styles.pop() if styles else None


@pytest.mark.parametrize(
    ("model_name", "names", "config", "naming"),
    [
        ("deepseek-v3", _deepseek_names(), ParallelConfig(tp=8, ep=8, etp=1, dp=1), "hf"),
        (
            "ref-3t-moe",
            _deepseek_names(),
            ParallelConfig(tp=4, ep=2, etp=2, sequence_parallel=True),
            "hf",
        ),
        (
            "mixtral-8x22b",
            _mixtral_names(),
            ParallelConfig(tp=4, ep=2, etp=2, sequence_parallel=True),
            "mixtral",
        ),
        ("qwen3-235b-a22b", _qwen3_moe_names(), ParallelConfig(tp=4, ep=4), "hf"),
        ("llama-3.1-405b", _llama_names(), ParallelConfig(tp=8, sequence_parallel=True), "hf"),
    ],
)
def test_every_rule_matches_a_module_of_each_family(model_name, names, config, naming):
    model = ap.get_model(model_name)
    rules = module_rules_for(model=model, config=config, naming=naming)
    assert rules
    unmatched = [pattern for pattern, hits in _matches(rules, names).items() if not hits]
    assert unmatched == []
    assert _style_of(rules, "model.layers.0.self_attn.o_proj") == "rowwise"
    assert _style_of(rules, "lm_head") == "colwise"
    assert _style_of(rules, "model.embed_tokens") == "rowwise"


def test_deepseek_styles():
    rules = module_rules_for(
        model=ap.get_model("ref-3t-moe"), config=ParallelConfig(tp=8, ep=8, etp=1)
    )
    assert _style_of(rules, "model.layers.1.self_attn.q_a_proj") == "replicate"
    assert _style_of(rules, "model.layers.1.self_attn.kv_a_proj_with_mqa") == "replicate"
    assert _style_of(rules, "model.layers.1.self_attn.q_b_proj") == "colwise"
    assert _style_of(rules, "model.layers.1.self_attn.kv_b_proj") == "colwise"
    assert _style_of(rules, "model.layers.0.mlp.gate_proj") == "colwise"
    assert _style_of(rules, "model.layers.0.mlp.down_proj") == "rowwise"
    assert _style_of(rules, "model.layers.1.mlp.shared_experts.down_proj") == "rowwise"
    assert _style_of(rules, "model.layers.1.mlp.gate") == "replicate"
    assert _style_of(rules, "model.layers.1.mlp.experts") == "expert"
    # no etp: the projections inside an expert have no rule
    assert _style_of(rules, "model.layers.1.mlp.experts.3.gate_proj") is None
    assert all(rule.mesh_axis == "ep" for rule in rules if rule.style == "expert")


def test_tp1_has_no_tensor_rules_and_sequence_needs_sp():
    model = ap.get_model("ref-3t-moe")
    rules = module_rules_for(model=model, config=ParallelConfig(dp=8, ep=8))
    assert {rule.style for rule in rules} == {"expert"}
    assert module_rules_for(model=model, config=ParallelConfig(dp=4)) == ()
    no_sp = module_rules_for(model=model, config=ParallelConfig(tp=8))
    assert not any(rule.style == "sequence" for rule in no_sp)
    with_sp = module_rules_for(model=model, config=ParallelConfig(tp=8, sequence_parallel=True))
    assert _style_of(with_sp, "model.layers.4.input_layernorm") == "sequence"
    assert _style_of(with_sp, "model.norm") == "sequence"


def test_attention_data_parallel_replicates_attention():
    model = ap.get_model("ref-3t-moe")
    rules = module_rules_for(
        model=model, config=ParallelConfig(tp=8, ep=8, attention_data_parallel=True)
    )
    assert not any(rule.style in ("colwise", "rowwise") for rule in rules)
    assert _style_of(rules, "model.layers.5.self_attn") == "replicate"
    assert _style_of(rules, "model.layers.5.mlp.experts") == "expert"


def test_gqa_with_tp_beyond_kv_heads_replicates_kv():
    model = ap.get_model("llama-3.1-405b")  # 8 KV heads
    rules = module_rules_for(model=model, config=ParallelConfig(tp=16))
    assert _style_of(rules, "model.layers.0.self_attn.k_proj") == "replicate"
    assert _style_of(rules, "model.layers.0.self_attn.q_proj") == "colwise"


def test_illegal_config_and_naming_raise():
    model = ap.get_model("ref-3t-moe")
    with pytest.raises(ValueError, match="num_routed_experts"):
        module_rules_for(model=model, config=ParallelConfig(dp=7, ep=7))
    with pytest.raises(ValueError, match="naming"):
        module_rules_for(model=model, config=ParallelConfig(), naming="gpt")  # type: ignore[arg-type]
