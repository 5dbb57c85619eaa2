"""``AttentionSpec``: the attention of a decoder layer — its kind (MHA, GQA, MLA), which keys a
query attends to (full, a window, a chunk, an indexer's top-k, a linear recurrence), and the
shape of linear layers interleaved with full ones. ``ModelSpec`` (``_model_spec``) holds one.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

_STRICT = ConfigDict(extra="forbid", frozen=True)

#: The AttentionSpec fields that give linear layers their own shape.
LINEAR_FIELD_DEFAULTS = {
    "linear_key_heads": 0,
    "linear_value_heads": 0,
    "linear_key_head_dim": 0,
    "linear_value_head_dim": 0,
    "linear_conv_kernel": 0,
    "linear_kind": "gated_deltanet",
    "linear_in_every_layer": False,
}
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
    ``linear_kind`` ``mamba2``: the linear layers are Mamba-2 mixers (Dao and Gu, "Transformers
    are SSMs", ICML 2024; Nemotron-H): value heads are the SSM heads of ``linear_value_head_dim``
    channels, key heads the B/C groups of ``linear_key_head_dim`` (the state size).
    ``linear_in_every_layer``: every layer has a linear mixer and the full attention of
    ``full_layer_fraction`` of the layers comes in addition (Nemotron-H: a Mamba-2 block before
    every FFN block, an attention block beside it in some), not instead.
    ``output_gate``: a sigmoid gate on the attention output, produced by the query projection
    (Qwen3-Next / Qwen3.5 ``attn_output_gate``: ``q_proj`` twice as wide).
    ``qk_norm``: an RMSNorm of each query head and one of each key head (``head_dim`` weights
    each) before RoPE, each its own kernel: Qwen3, Qwen3-MoE, Qwen3-Next and Qwen3.5 (transformers
    ``Qwen3Attention`` / ``Qwen3NextAttention`` ``q_norm`` / ``k_norm``; SGLang
    ``Qwen3MoeAttention._apply_qk_norm``; Megatron-core ``--qk-layernorm``). Llama 4's weightless
    L2 norm and MiniMax-M2's norm over all heads (``use_qk_norm``) are other shapes, not read.

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
    qk_norm: bool = False
    linear_key_heads: int = Field(default=0, ge=0)
    linear_value_heads: int = Field(default=0, ge=0)
    linear_key_head_dim: int = Field(default=0, ge=0)
    linear_value_head_dim: int = Field(default=0, ge=0)
    linear_conv_kernel: int = Field(default=0, ge=0)
    linear_kind: Literal["gated_deltanet", "mamba2"] = "gated_deltanet"
    linear_in_every_layer: bool = False

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
        if (self.linear_in_every_layer or self.linear_kind != "gated_deltanet") and not any(linear):
            raise ValueError(
                "attention.linear_in_every_layer / linear_kind describe linear layers of their "
                "own shape: set attention.linear_* too"
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
                **LINEAR_FIELD_DEFAULTS,
            }
        )

    @property
    def has_linear_mixer(self) -> bool:
        """Whether the linear layers have their own shape (``linear_*``), priced apart."""
        return self.linear_value_heads > 0

    @property
    def linear_share(self) -> float:
        """Linear mixers per layer (the mean): one in every layer where they come beside the
        full attention (``linear_in_every_layer``), else the layers that are not full."""
        return 1.0 if self.linear_in_every_layer else 1.0 - self.full_layer_fraction

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
        heads = self.linear_value_heads
        if self.linear_kind == "mamba2":
            # transformers NemotronHMamba2Mixer: in_proj to z, x, B, C and one dt per head; the
            # convolution over x, B, C with its bias; A_log, D and dt_bias per head; the gated
            # RMSNorm over all channels; out_proj
            conv_channels = 2 * keys + values
            return (
                hidden_size * (2 * values + 2 * keys + heads)
                + conv_channels * (self.linear_conv_kernel + 1)
                + 3 * heads
                + values
                + values * hidden_size
            )
        projections = hidden_size * (2 * keys + 2 * values + 2 * heads)
        conv = (2 * keys + values) * self.linear_conv_kernel
        return projections + conv + 2 * heads + self.linear_value_head_dim + values * hidden_size

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
        # Mamba-2: the state's decayed rank-one update and its read-out along C (Dao and Gu
        # 2024, eq. 2): two products
        products = 4.0 if self.linear_kind == "mamba2" else 6.0
        return products * state + 2.0 * self.linear_conv_kernel * (2 * keys + values)

    def indexer_flops_per_key(self) -> float:
        """FLOPs of the indexer per (query, preceding key) pair: one product per indexer head and
        key element (its weighted ReLU sum over heads is a few FLOPs more per pair)."""
        return 2.0 * self.indexer_heads * self.indexer_head_dim

    @property
    def indexer_key_bytes(self) -> float:
        """Cache bytes of one token's indexer key in one layer (FP8 with its scales)."""
        return self.indexer_head_dim * INDEXER_KEY_BYTES_PER_ELEMENT
