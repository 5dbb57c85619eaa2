"""Module rules of a plan: which modules are split how, as ``fnmatch`` patterns over module FQNs.

Torch-free: the planner writes these rules into ``ShardingPlan.module_rules`` and
``autoparallel.runtime.apply_plan`` interprets them. Patterns are written as name *suffixes*
(``*.self_attn.o_proj``) so that one rule set covers the module names of the reference model
(HuggingFace DeepSeek-V3 names) and of HuggingFace llama, mixtral, qwen2_moe/qwen3_moe and
deepseek_v3/kimi_k2 checkpoints. Rules are emitted only for modules the architecture has (a
rule that matches no module is an error when the plan is applied).

Styles (the placements follow Megatron-LM's tensor and sequence parallelism, Shoeybi et al. 2019
arXiv:1909.08053 and Korthikanti et al. 2022 arXiv:2205.05198, as torchtitan's ``parallelize``
writes them):

* ``colwise``: the weight's output features are split over ``mesh_axis`` (an embedding or a
  ``q_proj``); ``rowwise``: its input features are split and the partial outputs are reduced
  (``o_proj``, ``down_proj``; on an embedding: the vocabulary is split).
* ``sequence``: on a norm, the norm runs on a sequence shard; on a block (``self_attn``,
  ``mlp``), the block gathers the sequence at its input and scatters it at its output.
* ``replicate``: every rank of ``mesh_axis`` holds the whole module (MLA's low-rank
  down-projections, routers, attention under attention-data-parallel).
* ``expert``: a routed-expert container; its experts are placed over ``mesh_axis`` (``ep``) by
  the plan's expert placement.
"""

from __future__ import annotations

from typing import Literal

from autoparallel.plan import ModuleRule, ModuleStyle
from cost_model import ModelSpec, ParallelConfig

__all__ = ["ExpertNaming", "module_rules_for"]

ExpertNaming = Literal["hf", "mixtral"]

# Projections inside one routed expert, per naming convention (gate, up, down):
# HuggingFace DeepSeek-V3 / Qwen3-MoE ``experts.E.gate_proj`` vs Mixtral ``experts.E.w1/w3/w2``.
_EXPERT_PROJECTIONS: dict[str, tuple[str, str, str]] = {
    "hf": ("gate_proj", "up_proj", "down_proj"),
    "mixtral": ("w1", "w3", "w2"),
}


def _rule(pattern: str, style: ModuleStyle, mesh_axis: str = "tp") -> ModuleRule:
    return ModuleRule(pattern=pattern, style=style, mesh_axis=mesh_axis)


def _attention_rules(model: ModelSpec, config: ParallelConfig) -> list[ModuleRule]:
    """Heads split over tp: q/k/v (or MLA's up-projections) colwise, ``o_proj`` rowwise.

    MLA's down-projections (``q_a_proj``, ``kv_a_proj_with_mqa``) and their norms produce the
    shared low-rank latent, so every tp rank holds them whole (DeepSeek-V2 sec. 2.1.2).
    """
    if config.attention_data_parallel:
        return [_rule("*.self_attn", "replicate")]
    if config.tp == 1:
        return []
    attention = model.attention
    rules: list[ModuleRule] = []
    if attention.kind == "mla":
        if attention.q_lora_rank:
            rules += [
                _rule("*.self_attn.q_a_proj", "replicate"),
                _rule("*.self_attn.q_a_layernorm", "replicate"),
                _rule("*.self_attn.q_b_proj", "colwise"),
            ]
        else:
            rules.append(_rule("*.self_attn.q_proj", "colwise"))
        rules += [
            _rule("*.self_attn.kv_a_proj_with_mqa", "replicate"),
            _rule("*.self_attn.kv_a_layernorm", "replicate"),
            _rule("*.self_attn.kv_b_proj", "colwise"),
        ]
    else:
        # Grouped-query attention with tp a multiple of the KV heads keeps K/V whole on each rank.
        kv_style: ModuleStyle = (
            "colwise" if attention.num_kv_heads % config.tp == 0 else "replicate"
        )
        rules += [
            _rule("*.self_attn.q_proj", "colwise"),
            _rule("*.self_attn.k_proj", kv_style),
            _rule("*.self_attn.v_proj", kv_style),
        ]
    rules.append(_rule("*.self_attn.o_proj", "rowwise"))
    return rules


def _ffn_rules(
    prefix: str,
    style_in: ModuleStyle,
    style_out: ModuleStyle,
    names: tuple[str, str, str],
    axis: str,
    *,
    gated: bool = True,
) -> list[ModuleRule]:
    """The FFN's projections: gate (where the activation is gated) and up split as ``style_in``,
    down as ``style_out``."""
    gate, up, down = names
    gates = [_rule(f"{prefix}.{gate}", style_in, axis)] if gated else []
    return gates + [
        _rule(f"{prefix}.{up}", style_in, axis),
        _rule(f"{prefix}.{down}", style_out, axis),
    ]


#: The router's module name where it is not ``gate`` (transformers: ``GptOssMLP.router``,
#: ``Llama4TextMoe.router``), by the checkpoint's model class.
_ROUTERS = {
    "GptOssForCausalLM": "router",
    "Llama4ForCausalLM": "router",
    "Llama4ForConditionalGeneration": "router",
}


#: A decoder layer's FFN (dense MLP or MoE block) where it is not ``mlp``: transformers'
#: ``Llama4TextDecoderLayer.feed_forward``, by the checkpoint's model class.
_FFNS = {"Llama4ForCausalLM": "feed_forward", "Llama4ForConditionalGeneration": "feed_forward"}


def _ffn_name(model: ModelSpec) -> str:
    return _FFNS.get(model.architecture or "", "mlp")


def _ffn_and_moe_rules(
    model: ModelSpec, config: ParallelConfig, naming: ExpertNaming
) -> list[ModuleRule]:
    """Dense FFN and shared experts follow attention's tp split (replicated under attention-DP);
    routers are replicated; routed experts go to ``ep`` and, with etp > 1, split over ``etp``."""
    sharded = config.tp > 1 and not config.attention_data_parallel
    style_in: ModuleStyle
    style_out: ModuleStyle
    if config.attention_data_parallel:
        style_in = style_out = "replicate"
    else:
        style_in, style_out = "colwise", "rowwise"
    hf_names = _EXPERT_PROJECTIONS["hf"]
    rules: list[ModuleRule] = []
    if model.num_dense_ffn_layers and (sharded or config.attention_data_parallel):
        # a squared-ReLU or GELU MLP (Nemotron-4) has no gate projection
        gated = model.ffn_activation == "swiglu"
        rules += _ffn_rules(
            f"*.{_ffn_name(model)}", style_in, style_out, hf_names, "tp", gated=gated
        )
    moe = model.moe
    if moe is None:
        return rules
    if sharded or config.attention_data_parallel:
        rules.append(_rule(f"*.{_ROUTERS.get(model.architecture or '', 'gate')}", "replicate"))
        if moe.shared_expert_gate:
            rules.append(_rule("*.shared_expert_gate", "replicate"))
        if moe.num_shared_experts:
            # ``shared_experts`` (DeepSeek) and ``shared_expert`` (Qwen2-MoE) both match.
            rules += _ffn_rules("*.shared_expert*", style_in, style_out, hf_names, "tp")
    if config.ep > 1:
        rules.append(_rule("*.experts", "expert", "ep"))
    elif sharded or config.attention_data_parallel:
        # ep == 1: every rank of the stage holds every expert (expert-data-parallel over tp).
        rules.append(_rule("*.experts", "replicate"))
    if config.etp > 1:
        rules += _ffn_rules("*.experts.*", "colwise", "rowwise", _EXPERT_PROJECTIONS[naming], "etp")
    return rules


def _embedding_and_norm_rules(model: ModelSpec, config: ParallelConfig) -> list[ModuleRule]:
    """Vocabulary-parallel embedding (rowwise) and LM head (colwise), unless tied (then both are
    replicated: one weight cannot carry both splits). With sequence parallel, norms run on
    sequence shards and each block gathers/scatters the sequence."""
    if config.tp == 1 or config.attention_data_parallel:
        return []
    if model.tie_word_embeddings:
        rules = [_rule("model.embed_tokens", "replicate"), _rule("lm_head", "replicate")]
    else:
        rules = [_rule("model.embed_tokens", "rowwise"), _rule("lm_head", "colwise")]
    if config.sequence_parallel:
        rules += [
            _rule("*.input_layernorm", "sequence"),
            _rule("*.post_attention_layernorm", "sequence"),
            _rule("model.norm", "sequence"),
            _rule("*.self_attn", "sequence"),
            _rule(f"*.{_ffn_name(model)}", "sequence"),
        ]
    return rules


def module_rules_for(
    *,
    model: ModelSpec,
    config: ParallelConfig,
    naming: ExpertNaming = "hf",
    num_redundant_experts: int = 0,
) -> tuple[ModuleRule, ...]:
    """The module rules of ``config`` for ``model`` (HuggingFace / DeepSeek-V3 module names).

    ``naming`` picks the names of the projections inside one routed expert (only used when
    etp > 1): ``"hf"`` (``gate_proj/up_proj/down_proj``: DeepSeek-V3, Qwen-MoE, the reference
    model) or ``"mixtral"`` (``w1/w3/w2``). Every other pattern matches all these families.
    tp == 1 yields no colwise/rowwise rules; sequence rules appear only with sequence parallel;
    attention-data-parallel replicates attention. Raises ``ValueError`` if ``config`` is not
    legal for ``model`` (``ParallelConfig.validate_for``).
    """
    if naming not in _EXPERT_PROJECTIONS:
        raise ValueError(f"naming ({naming!r}) must be one of {sorted(_EXPERT_PROJECTIONS)}")
    config.validate_for(model, num_redundant_experts=num_redundant_experts)
    rules = (
        _embedding_and_norm_rules(model, config)
        + _attention_rules(model, config)
        + _ffn_and_moe_rules(model, config, naming)
    )
    return tuple(rules)
