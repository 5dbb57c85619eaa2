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
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cost_model._units import dtype_bytes

_STRICT = ConfigDict(extra="forbid", frozen=True)

AttentionKind = Literal["mha", "gqa", "mla"]
AttentionVariant = Literal["full", "sliding_window", "chunked", "sparse_topk", "linear"]
#: Variants a model may interleave with full-attention layers of the same shape
#: (``AttentionSpec.full_layer_fraction``).
LOCAL_VARIANTS: tuple[str, ...] = ("sliding_window", "chunked", "linear")
#: Bytes of one DSA indexer key element in the cache: FP8 keys with one FP32 scale per 128
#: elements (DeepSeek-V3.2-Exp ``inference/model.py`` ``Indexer``: ``k_cache`` float8_e4m3fn and
#: ``k_scale_cache`` float32 of ``index_head_dim // block_size``, block_size 128).
INDEXER_KEY_BYTES_PER_ELEMENT = 1.0 + 4.0 / 128.0


class AttentionSpec(BaseModel):
    """Attention of every layer. ``head_dim`` is the per-head size for MHA/GQA; MLA uses its ranks.

    ``variant`` changes which keys a query attends to: all of them (``full``), the last
    ``window_tokens`` (``sliding_window``), those of its own block of ``window_tokens``
    (``chunked``: Llama 4's ``attention_chunk_size``), the ``topk_tokens`` chosen by an indexer
    (``sparse_topk``), or a fixed-size recurrent state (``linear``).

    ``full_layer_fraction``: the share of layers that attend in full with the same projections
    while the rest use ``variant`` (gpt-oss alternates sliding-window and full layers, Llama 4
    puts one full layer after three chunked ones); each layer-summed quantity (FLOPs, cache,
    KV bytes read) is that mix of the two per-layer rules.

    ``linear_*``: the shape of the linear-attention layers of variant ``linear`` where it is
    their own — Gated DeltaNet (Yang, Kautz and Hatamizadeh, "Gated Delta Networks", ICLR 2025;
    Qwen3-Next and Qwen3.5 ``Qwen3NextGatedDeltaNet``): ``linear_key_heads`` query/key heads of
    ``linear_key_head_dim``, ``linear_value_heads`` value heads of ``linear_value_head_dim``
    (each holding a key x value state), a depthwise causal convolution of
    ``linear_conv_kernel`` taps over q, k and v; the full layers then keep the GQA shape above.
    Per-layer work, weights and cache are the mean over the two kinds; training's activation
    memory keeps the full layers' per-layer rule for every layer.
    ``output_gate``: a sigmoid gate on the attention output, produced by the query projection
    (Qwen3-Next / Qwen3.5 ``attn_output_gate``: ``q_proj`` twice as wide).

    ``indexer_heads`` / ``indexer_head_dim``: DeepSeek Sparse Attention's lightning indexer
    (DeepSeek-V3.2-Exp tech report, arXiv:2512.02556, sec. 2.1; ``inference/model.py``
    ``Indexer``), which scores every preceding key with its own small FP8 keys to pick the
    ``topk_tokens``: its work and its cache grow with the whole context, not the top-k.
    """

    model_config = _STRICT

    kind: AttentionKind
    num_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    q_lora_rank: int = Field(default=0, ge=0)
    kv_lora_rank: int = Field(default=0, ge=0)
    qk_nope_head_dim: int = Field(default=0, ge=0)
    qk_rope_head_dim: int = Field(default=0, ge=0)
    v_head_dim: int = Field(default=0, ge=0)
    variant: AttentionVariant = "full"
    window_tokens: int | None = Field(default=None, gt=0)
    topk_tokens: int | None = Field(default=None, gt=0)
    full_layer_fraction: float = Field(default=0.0, ge=0.0, lt=1.0)
    indexer_heads: int = Field(default=0, ge=0)
    indexer_head_dim: int = Field(default=0, ge=0)
    output_gate: bool = False
    linear_key_heads: int = Field(default=0, ge=0)
    linear_value_heads: int = Field(default=0, ge=0)
    linear_key_head_dim: int = Field(default=0, ge=0)
    linear_value_head_dim: int = Field(default=0, ge=0)
    linear_conv_kernel: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> AttentionSpec:
        if self.kind == "mha" and self.num_kv_heads != self.num_heads:
            raise ValueError(
                f"attention.num_kv_heads ({self.num_kv_heads}) must equal "
                f"attention.num_heads ({self.num_heads}) for kind 'mha'"
            )
        if self.kind == "gqa" and self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"attention.num_heads ({self.num_heads}) must be divisible by "
                f"attention.num_kv_heads ({self.num_kv_heads}) for kind 'gqa'"
            )
        if self.kind == "mla":
            for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                if getattr(self, name) <= 0:
                    raise ValueError(
                        f"attention.{name} ({getattr(self, name)}) must be > 0 for kind 'mla'"
                    )
        if self.variant in ("sliding_window", "chunked") and self.window_tokens is None:
            raise ValueError(
                f"attention.window_tokens (None) must be set for variant {self.variant!r}"
            )
        if self.full_layer_fraction > 0 and self.variant not in LOCAL_VARIANTS:
            raise ValueError(
                f"attention.full_layer_fraction ({self.full_layer_fraction}) must be 0 for "
                f"variant {self.variant!r}; full layers mix with {', '.join(LOCAL_VARIANTS)}"
            )
        if bool(self.indexer_heads) != bool(self.indexer_head_dim):
            raise ValueError(
                f"attention.indexer_heads ({self.indexer_heads}) and attention.indexer_head_dim "
                f"({self.indexer_head_dim}) must both be set or both be 0"
            )
        linear = (
            self.linear_key_heads,
            self.linear_value_heads,
            self.linear_key_head_dim,
            self.linear_value_head_dim,
            self.linear_conv_kernel,
        )
        if any(linear) and not all(linear):
            raise ValueError(
                f"attention.linear_key_heads/value_heads/key_head_dim/value_head_dim/conv_kernel "
                f"({', '.join(map(str, linear))}) must all be set or all be 0"
            )
        if any(linear) and self.variant != "linear":
            raise ValueError(
                f"attention.linear_* (a linear-attention layer shape) needs variant 'linear', "
                f"not {self.variant!r}"
            )
        if self.indexer_heads and self.variant != "sparse_topk":
            raise ValueError(
                f"attention.indexer_heads ({self.indexer_heads}) needs variant 'sparse_topk' "
                f"(an indexer selects the top-k keys), not {self.variant!r}"
            )
        if self.variant == "sparse_topk" and self.topk_tokens is None:
            raise ValueError("attention.topk_tokens (None) must be set for variant 'sparse_topk'")
        return self

    @property
    def qk_head_dim(self) -> int:
        return (
            self.qk_nope_head_dim + self.qk_rope_head_dim if self.kind == "mla" else self.head_dim
        )

    @property
    def value_head_dim(self) -> int:
        return self.v_head_dim if self.kind == "mla" else self.head_dim

    def attended_tokens(self, context_tokens: float) -> float:
        """Keys one query attends to when ``context_tokens`` precede it (itself included), the
        mean over layers where full layers are interleaved (``full_layer_fraction``)."""
        f = self.full_layer_fraction
        return f * context_tokens + (1.0 - f) * self._local_attended_tokens(context_tokens)

    def full_layers_only(self) -> AttentionSpec:
        """The attention of this spec's full layers alone: variant ``full``, without the linear
        layers' shape."""
        return self.model_copy(
            update={
                "variant": "full",
                "full_layer_fraction": 0.0,
                **{field: 0 for field in _LINEAR_FIELDS},
            }
        )

    @property
    def has_linear_mixer(self) -> bool:
        """Whether the linear layers have their own shape (``linear_*``), priced apart."""
        return self.linear_value_heads > 0

    def _local_attended_tokens(self, context_tokens: float) -> float:
        if self.has_linear_mixer:
            return 0.0  # no keys: the recurrence is ``linear_flops_per_token``
        if self.variant == "chunked":
            assert self.window_tokens is not None  # required for the variant on validation
            return float((math.ceil(context_tokens) - 1) % self.window_tokens + 1)
        if self.variant == "sliding_window":
            assert self.window_tokens is not None  # required for the variant on validation
            return min(context_tokens, self.window_tokens)
        if self.variant == "sparse_topk":
            assert self.topk_tokens is not None  # required for the variant on validation
            return min(context_tokens, self.topk_tokens)
        if self.variant == "linear":
            # A linear-attention state of head_dim x head_dim is read and written once per token:
            # equivalent work to attending ``qk_head_dim`` keys.
            return float(self.qk_head_dim)
        return context_tokens

    def cached_tokens(self, context_tokens: float) -> float:
        """Tokens of cache one layer keeps for a sequence of ``context_tokens`` (the mean over
        layers): a window or a chunk keeps at most ``window_tokens`` (vLLM's sliding-window and
        chunked-local KV specs free the blocks that left it), full and sparse layers keep all;
        0 for linear attention, whose fixed state ``ModelSpec.kv_cache_bytes`` adds."""
        local = context_tokens
        if self.variant in ("sliding_window", "chunked"):
            assert self.window_tokens is not None  # required for the variants on validation
            local = min(context_tokens, float(self.window_tokens))
        elif self.variant == "linear":
            local = 0.0
        f = self.full_layer_fraction
        return f * context_tokens + (1.0 - f) * local

    def indexer_parameters(self, hidden_size: int) -> int:
        """Weights of the DSA indexer of one layer: ``wq_b`` from the query latent (or the hidden
        state without one), ``wk``, the key's LayerNorm and ``weights_proj`` (DeepSeek-V3.2-Exp
        ``inference/model.py`` ``Indexer``)."""
        if not self.indexer_heads:
            return 0
        q_in = self.q_lora_rank or hidden_size
        width = self.indexer_heads * self.indexer_head_dim
        return (
            q_in * width
            + hidden_size * self.indexer_head_dim
            + 2 * self.indexer_head_dim
            + hidden_size * self.indexer_heads
        )

    def linear_parameters(self, hidden_size: int) -> int:
        """Weights of one Gated DeltaNet layer (transformers ``Qwen3NextGatedDeltaNet``): the
        input projections of q, k (key heads), v, the output gate z (value heads) and the beta
        and alpha gates (one per value head), the depthwise convolution over q, k and v, the
        per-head decay (``A_log``) and step bias, the gated RMSNorm of a value head and the
        output projection."""
        if not self.has_linear_mixer:
            return 0
        keys = self.linear_key_heads * self.linear_key_head_dim
        values = self.linear_value_heads * self.linear_value_head_dim
        projections = hidden_size * (2 * keys + 2 * values + 2 * self.linear_value_heads)
        conv = (2 * keys + values) * self.linear_conv_kernel
        return (
            projections
            + conv
            + 2 * self.linear_value_heads
            + self.linear_value_head_dim
            + values * hidden_size
        )

    def linear_state_elements(self) -> int:
        """Elements one linear layer keeps per sequence: a key x value state per value head and
        the convolution's last ``kernel - 1`` inputs of q, k and v."""
        if not self.has_linear_mixer:
            return self.num_heads * self.qk_head_dim * self.value_head_dim
        keys = self.linear_key_heads * self.linear_key_head_dim
        values = self.linear_value_heads * self.linear_value_head_dim
        state = self.linear_value_heads * self.linear_key_head_dim * self.linear_value_head_dim
        return state + (self.linear_conv_kernel - 1) * (2 * keys + values)

    def linear_flops_per_token(self) -> float:
        """FLOPs of one linear layer's recurrence per token: three key x value products per
        value head (the delta rule's read of the state along the key, its rank-one update, the
        output read along the query; Yang et al. 2025 eq. 10), and the convolution."""
        if not self.has_linear_mixer:
            return 0.0
        keys = self.linear_key_heads * self.linear_key_head_dim
        values = self.linear_value_heads * self.linear_value_head_dim
        state = self.linear_value_heads * self.linear_key_head_dim * self.linear_value_head_dim
        return 6.0 * state + 2.0 * self.linear_conv_kernel * (2 * keys + values)

    def indexer_flops_per_key(self) -> float:
        """FLOPs of the indexer per (query, preceding key) pair: one product per indexer head and
        key element (its weighted ReLU sum over heads is a few FLOPs more per pair)."""
        return 2.0 * self.indexer_heads * self.indexer_head_dim

    @property
    def indexer_key_bytes(self) -> float:
        """Cache bytes of one token's indexer key in one layer (FP8 with its scales)."""
        return self.indexer_head_dim * INDEXER_KEY_BYTES_PER_ELEMENT


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


#: The AttentionSpec fields that give linear layers their own shape.
_LINEAR_FIELDS = (
    "linear_key_heads",
    "linear_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel",
)
#: AttentionSpec fields newer than the first plan files, with their defaults (``fingerprint``).
_LATER_ATTENTION_FIELDS: dict[str, Any] = {
    "full_layer_fraction": 0.0,
    "indexer_heads": 0,
    "indexer_head_dim": 0,
    "output_gate": False,
    "linear_key_heads": 0,
    "linear_value_heads": 0,
    "linear_key_head_dim": 0,
    "linear_value_head_dim": 0,
    "linear_conv_kernel": 0,
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
    ffn_activation: Literal["swiglu", "gelu"] = "swiglu"
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    linear_bias: bool = False
    qkv_bias: bool = False
    position_embedding: Literal["rope", "learned"] = "rope"
    max_context_tokens: int = Field(gt=0)

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
        """Stable short hash of the architecture (the name excluded). Attention fields added
        after plans were first written (``_LATER_ATTENTION_FIELDS``) are hashed only when set,
        so an earlier plan of an architecture without them still matches its model."""
        payload = self.model_dump(mode="json", exclude={"name"})
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
        f = a.full_layer_fraction
        return f * full + (1.0 - f) * a.linear_parameters(self.hidden_size)

    def full_attention_parameters(self) -> int:
        """Weights of one full-attention block (projections, MLA's inner norms, biases, an
        output gate's half of the query projection, a DSA indexer)."""
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
        return weights + bias + a.indexer_parameters(h)

    def ffn_parameters(self, ffn_hidden_size: int) -> int:
        """One FFN (dense MLP or one expert) of the given inner size."""
        h = self.hidden_size
        matrices = 3 if self.ffn_activation == "swiglu" else 2
        bias = (ffn_hidden_size + h) if self.linear_bias else 0
        return matrices * h * ffn_hidden_size + bias

    def router_parameters(self) -> int:
        if self.moe is None:
            return 0
        gate = self.hidden_size if self.moe.shared_expert_gate else 0
        return self.moe.num_routed_experts * self.hidden_size + gate

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
        linear = (1.0 - a.full_layer_fraction) * a.linear_flops_per_token()
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
            cached += (1.0 - a.full_layer_fraction) * self.num_layers * state * dtype_bytes(dtype)
        return cached
