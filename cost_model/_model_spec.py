"""``ModelSpec``: the architecture of a decoder-only transformer, dense or Mixture-of-Experts.

Parameter counts follow the module shapes of the reference implementations:
  * GQA/MHA attention and SwiGLU FFN: HuggingFace ``modeling_llama.py`` / ``modeling_mixtral.py``.
  * MLA attention: DeepSeek-V2 paper (arXiv:2405.04434) sec. 2.1.2 and HuggingFace
    ``modeling_deepseek.py`` (q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa,
    kv_a_layernorm, kv_b_proj, o_proj).
  * GPT (GELU MLP, biases, learned positions): Narayanan et al. SC'21 (arXiv:2104.04473) eq. (2).
FLOPs per token: 2 FLOPs per multiply-accumulate of every matmul weight the token touches
(Kaplan et al. 2020, arXiv:2001.08361, Table 1; PaLM, arXiv:2204.02311, Appendix B) plus the
attention score and value products, 2·heads·(qk_dim + v_dim) per attended key.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cost_model._attention_spec import (
    INDEXER_KEY_BYTES_PER_ELEMENT,
    LINEAR_FIELD_DEFAULTS,
    LOCAL_VARIANTS,
    AttentionKind,
    AttentionSpec,
    AttentionVariant,
)
from cost_model._units import dtype_bytes

__all__ = [
    "INDEXER_KEY_BYTES_PER_ELEMENT",
    "LOCAL_VARIANTS",
    "AttentionKind",
    "AttentionSpec",
    "AttentionVariant",
    "ModelSpec",
    "MoESpec",
]

_STRICT = ConfigDict(extra="forbid", frozen=True)


class MoESpec(BaseModel):
    """Mixture-of-Experts FFN. The first ``num_dense_layers`` layers use the dense FFN instead;
    after them every ``moe_layer_step``-th layer is an MoE layer and the others are dense
    (Llama 4 Maverick's ``interleave_moe_layer_step`` 2, Qwen MoE's ``decoder_sparse_step``)."""

    model_config = _STRICT

    num_routed_experts: int = Field(gt=0)
    top_k: int = Field(gt=0)
    expert_ffn_hidden_size: int = Field(gt=0)
    num_shared_experts: int = Field(default=0, ge=0)
    shared_expert_ffn_hidden_size: int | None = Field(default=None, gt=0)
    num_dense_layers: int = Field(default=0, ge=0)
    shared_expert_gate: bool = False
    moe_layer_step: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _check(self) -> MoESpec:
        if self.top_k > self.num_routed_experts:
            raise ValueError(
                f"moe.top_k ({self.top_k}) must be <= moe.num_routed_experts ({self.num_routed_experts})"
            )
        return self

    @property
    def shared_ffn_size(self) -> int:
        return self.shared_expert_ffn_hidden_size or self.expert_ffn_hidden_size


#: AttentionSpec fields newer than the first plan files, with their defaults (``fingerprint``).
_LATER_ATTENTION_FIELDS: dict[str, Any] = {
    "full_layer_fraction": 0.0,
    "indexer_heads": 0,
    "indexer_head_dim": 0,
    "output_gate": False,
    "qk_norm": False,
    **LINEAR_FIELD_DEFAULTS,
}


class ModelSpec(BaseModel):
    """A decoder-only transformer, dense or MoE. Frozen, hashable, JSON round-trips exactly."""

    model_config = _STRICT

    name: str
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    ffn_hidden_size: int = Field(
        gt=0, description="dense FFN size (the leading dense layers of an MoE)"
    )
    attention: AttentionSpec
    moe: MoESpec | None = None
    tie_word_embeddings: bool = False
    ffn_activation: Literal["swiglu", "gelu", "relu2"] = "swiglu"
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    linear_bias: bool = False
    qkv_bias: bool = False
    position_embedding: Literal["rope", "learned"] = "rope"
    max_context_tokens: int = Field(gt=0)
    architecture: str | None = Field(
        default=None,
        description="the checkpoint's model class (HuggingFace config 'architectures'), which "
        "serving engines dispatch their per-model defaults on; not part of the layer shape",
    )

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.moe is not None and self.moe.num_dense_layers > self.num_layers:
            raise ValueError(
                f"moe.num_dense_layers ({self.moe.num_dense_layers}) must be <= num_layers ({self.num_layers})"
            )
        return self

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_hf_config(
        cls, path_or_dict: str | Path | dict[str, Any], *, name: str | None = None
    ) -> ModelSpec:
        """Parse a HuggingFace ``config.json`` (path or dict); see ``cost_model._hf_config``."""
        from cost_model._hf_config import parse_hf_config

        return parse_hf_config(path_or_dict, name=name)

    def fingerprint(self) -> str:
        """Stable short hash of the architecture (the name and the model class excluded: the
        class names the checkpoint's code, not its shape). Attention fields added
        after plans were first written (``_LATER_ATTENTION_FIELDS``) are hashed only when set,
        so an earlier plan of an architecture without them still matches its model."""
        payload = self.model_dump(mode="json", exclude={"name", "architecture"})
        for key, default in _LATER_ATTENTION_FIELDS.items():
            if payload["attention"].get(key) == default:
                del payload["attention"][key]
        if payload.get("moe") and payload["moe"].get("moe_layer_step") == 1:
            del payload["moe"]["moe_layer_step"]  # newer than the first plans, like the above
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    # ---------------------------------------------------------------- layer structure
    @property
    def num_moe_layers(self) -> int:
        if self.moe is None:
            return 0
        return (self.num_layers - self.moe.num_dense_layers) // self.moe.moe_layer_step

    @property
    def num_dense_ffn_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    def is_moe_layer(self, layer_index: int) -> bool:
        if self.moe is None or layer_index < self.moe.num_dense_layers:
            return False
        return (layer_index - self.moe.num_dense_layers + 1) % self.moe.moe_layer_step == 0

    def dense_ffn_layer_mask(self) -> tuple[bool, ...]:
        """Per layer, whether its FFN is dense (``MoESpec``'s leading and interleaved ones)."""
        return tuple(not self.is_moe_layer(i) for i in range(self.num_layers))

    # ---------------------------------------------------------------- parameters per module
    def _norm_parameters(self, width: int) -> int:
        return 2 * width if self.norm == "layernorm" else width

    def attention_parameters(self) -> float:
        """Weights of one attention block (projections, MLA's inner norms, biases), the mean over
        layers where linear-attention layers of their own shape (``AttentionSpec.linear_*``)
        alternate with full ones."""
        a = self.attention
        full = self.full_attention_parameters()
        if not a.has_linear_mixer:
            return full
        return a.full_layer_fraction * full + a.linear_share * a.linear_parameters(self.hidden_size)

    def full_attention_parameters(self) -> int:
        """Weights of one full-attention block (projections, MLA's inner norms, biases, an
        output gate's half of the query projection, the query and key norms, a DSA indexer)."""
        a, h = self.attention, self.hidden_size
        if a.kind == "mla":
            q_width = a.num_heads * a.qk_head_dim
            if a.q_lora_rank:
                q = (
                    h * a.q_lora_rank
                    + self._norm_parameters(a.q_lora_rank)
                    + a.q_lora_rank * q_width
                )
            else:
                q = h * q_width
            kv = (
                h * (a.kv_lora_rank + a.qk_rope_head_dim)
                + self._norm_parameters(a.kv_lora_rank)
                + a.kv_lora_rank * a.num_heads * (a.qk_nope_head_dim + a.v_head_dim)
            )
            out = a.num_heads * a.v_head_dim * h
            return q + kv + out + (h if self.linear_bias else 0) + a.indexer_parameters(h)
        q_width = a.num_heads * a.head_dim
        kv_width = a.num_kv_heads * a.head_dim
        gate = h * q_width if a.output_gate else 0
        weights = h * q_width + gate + 2 * h * kv_width + q_width * h
        bias = 0
        if self.linear_bias or self.qkv_bias:
            bias += q_width + 2 * kv_width
        if self.linear_bias:
            bias += h
        qk_norms = 2 * self._norm_parameters(a.head_dim) if a.qk_norm else 0
        return weights + bias + qk_norms + a.indexer_parameters(h)

    def ffn_parameters(self, ffn_hidden_size: int) -> int:
        """One FFN (dense MLP or one expert) of the given inner size; with ``linear_bias`` a bias
        per output of each projection (a gated FFN's gate and up projections both)."""
        h = self.hidden_size
        matrices = 3 if self.ffn_activation == "swiglu" else 2
        bias = ((matrices - 1) * ffn_hidden_size + h) if self.linear_bias else 0
        return matrices * h * ffn_hidden_size + bias

    def router_parameters(self) -> int:
        """One layer's router (a bias per expert with ``linear_bias``: gpt-oss) and shared-expert
        gate."""
        if self.moe is None:
            return 0
        gate = self.hidden_size if self.moe.shared_expert_gate else 0
        bias = self.moe.num_routed_experts if self.linear_bias else 0
        return self.moe.num_routed_experts * self.hidden_size + gate + bias

    def layer_norm_parameters(self) -> int:
        """The two pre-norms of one layer."""
        return 2 * self._norm_parameters(self.hidden_size)

    def embedding_parameters(self) -> int:
        positions = (
            self.max_context_tokens * self.hidden_size
            if self.position_embedding == "learned"
            else 0
        )
        return self.vocab_size * self.hidden_size + positions

    def lm_head_parameters(self) -> int:
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    def final_norm_parameters(self) -> int:
        return self._norm_parameters(self.hidden_size)

    # ---------------------------------------------------------------- totals
    def parameter_breakdown(self) -> dict[str, int]:
        """Total parameters by component; the values sum to ``num_parameters``."""
        moe = self.moe
        routed = shared = 0
        if moe is not None:
            routed = (
                self.num_moe_layers
                * moe.num_routed_experts
                * self.ffn_parameters(moe.expert_ffn_hidden_size)
            )
            shared = (
                self.num_moe_layers
                * moe.num_shared_experts
                * self.ffn_parameters(moe.shared_ffn_size)
            )
        return {
            "embedding": self.embedding_parameters(),
            "attention": round(self.num_layers * self.attention_parameters()),
            "dense_ffn": self.num_dense_ffn_layers * self.ffn_parameters(self.ffn_hidden_size),
            "routed_experts": routed,
            "shared_experts": shared,
            "router": self.num_moe_layers * self.router_parameters(),
            "norms": self.num_layers * self.layer_norm_parameters() + self.final_norm_parameters(),
            "lm_head": self.lm_head_parameters(),
        }

    def active_parameter_breakdown(self) -> dict[str, int]:
        """Parameters one token uses (top-k routed experts only); same keys as ``parameter_breakdown``."""
        parts = dict(self.parameter_breakdown())
        if self.moe is not None:
            parts["routed_experts"] = (
                self.num_moe_layers
                * self.moe.top_k
                * self.ffn_parameters(self.moe.expert_ffn_hidden_size)
            )
        return parts

    @property
    def num_parameters(self) -> int:
        return sum(self.parameter_breakdown().values())

    @property
    def num_active_parameters(self) -> int:
        return sum(self.active_parameter_breakdown().values())

    def weight_bytes(
        self, dtype: str = "bf16", dtype_by_part: Mapping[Any, str] | None = None
    ) -> float:
        """Bytes of every weight in ``dtype``, the parts of ``dtype_by_part`` in theirs (a
        checkpoint that keeps attention or the LM head wider than its experts)."""
        by_part = dtype_by_part or {}
        return sum(
            count * dtype_bytes(by_part.get(part, dtype))
            for part, count in self.parameter_breakdown().items()
        )

    # ---------------------------------------------------------------- FLOPs
    def matmul_parameters_per_token(self) -> int:
        """Weights a token multiplies through: active parameters less embedding lookup and norms.

        A tied embedding is still used as the LM head matmul.
        """
        parts = self.active_parameter_breakdown()
        head = self.vocab_size * self.hidden_size
        return sum(parts.values()) - parts["embedding"] - parts["norms"] - parts["lm_head"] + head

    def attention_flops_per_token(self, context_tokens: float) -> float:
        """Score (QK^T) and value (PV) products of one token over all layers, forward only."""
        a = self.attention
        per_key = 2 * a.num_heads * (a.qk_head_dim + a.value_head_dim)
        keys = per_key * a.attended_tokens(context_tokens)
        return self.num_layers * keys + self.side_attention_flops_per_token(context_tokens)

    def side_attention_flops_per_token(self, full_keys: float) -> float:
        """Attention FLOPs of one token over all layers beyond the heads' score and value
        products: a DSA indexer scoring the ``full_keys`` keys before it, and the recurrence of
        linear layers of their own shape (``AttentionSpec.linear_flops_per_token``)."""
        a = self.attention
        indexer = a.indexer_flops_per_key() * full_keys
        linear = a.linear_share * a.linear_flops_per_token()
        return self.num_layers * (indexer + linear)

    def forward_flops_per_token(self, context_tokens: float) -> float:
        """Forward FLOPs of one token that attends ``context_tokens`` keys (itself included).

        For a causal training sequence of S tokens the mean context is (S + 1) / 2.
        """
        return 2.0 * self.matmul_parameters_per_token() + self.attention_flops_per_token(
            context_tokens
        )

    # ---------------------------------------------------------------- KV cache
    def kv_cache_elements_per_token_per_layer(self) -> int:
        """MLA caches the compressed latent and the shared RoPE key (DeepSeek-V2 sec. 2.1.2);
        MHA/GQA cache K and V of every KV head."""
        a = self.attention
        if a.kind == "mla":
            return a.kv_lora_rank + a.qk_rope_head_dim
        return 2 * a.num_kv_heads * a.head_dim

    def kv_cache_bytes_per_token(self, dtype: str = "bf16") -> float:
        """Cache bytes one more token of a long context adds (the DSA indexer's FP8 keys
        included): every layer's for full and sparse attention, the full layers' only where
        window, chunk or linear layers keep a bounded cache (``AttentionSpec.cached_tokens``)."""
        a = self.attention
        share = 1.0 if a.variant in ("full", "sparse_topk") else a.full_layer_fraction
        return share * self._token_bytes_every_layer(dtype)

    def _token_bytes_every_layer(self, dtype: str) -> float:
        """Cache bytes of one token were every layer to keep it."""
        per_layer = self.kv_cache_elements_per_token_per_layer() * dtype_bytes(dtype)
        return self.num_layers * (per_layer + self.attention.indexer_key_bytes)

    def kv_cache_bytes(self, context_tokens: int, dtype: str = "bf16") -> float:
        """Cache of one sequence of ``context_tokens`` tokens: a sliding window or a chunk keeps
        only the window; linear attention keeps a fixed state of heads x head_dim x head_dim;
        interleaved full layers keep everything (``AttentionSpec.cached_tokens``)."""
        a = self.attention
        cached = a.cached_tokens(context_tokens) * self._token_bytes_every_layer(dtype)
        if a.variant == "linear":
            state = a.linear_state_elements()
            cached += a.linear_share * self.num_layers * state * dtype_bytes(dtype)
        return cached
