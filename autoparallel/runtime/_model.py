"""The reference MoE transformer in torch, built from a ``ModelSpec`` of the ``ref-3t-moe`` family.

Module names follow HuggingFace's DeepSeek-V3 implementation (``modeling_deepseek_v3.py``) so
that plan rules written for HuggingFace checkpoints apply unchanged::

    model.embed_tokens
    model.layers.N.input_layernorm / post_attention_layernorm
    model.layers.N.self_attn.{q_a_proj, q_a_layernorm, q_b_proj | q_proj,
                              kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj}   (MLA)
    model.layers.N.self_attn.{q_proj, k_proj, v_proj, o_proj}                          (GQA)
    model.layers.N.mlp.{gate_proj, up_proj, down_proj}                         (leading dense layers)
    model.layers.N.mlp.gate                                                    (router)
    model.layers.N.mlp.experts.E.{gate_proj, up_proj, down_proj}               (E = global expert id)
    model.layers.N.mlp.shared_experts.{gate_proj, up_proj, down_proj}
    model.norm, lm_head

``model.layers`` and ``mlp.experts`` are ``ModuleDict``s keyed by the global layer / expert id, so
pipeline stages can drop layers and expert parallelism can drop experts without renaming any
parameter. Every module reads local head counts from its weights' shapes, so a tensor-parallel
split needs no change here. Stages without an embedding, final norm or LM head set them to
``None`` (the forward then takes and returns hidden states).

Formulas: MLA, DeepSeek-V2 (arXiv:2405.04434) sec. 2.1.2-2.1.3 (low-rank query and key/value
compression, decoupled RoPE key shared by all heads, cache = latent + RoPE key); RoPE, Su et al.
(arXiv:2104.09864) in the rotate-half form of HuggingFace ``modeling_llama.py``; RMSNorm, Zhang &
Sennrich (arXiv:1910.07467); SwiGLU, Shazeer (arXiv:2002.05202); top-k routing with softmax
(DeepSeek-V2) or sigmoid scores (DeepSeek-V3, arXiv:2412.19437 sec. 2.1.2). Attention and the KV
cache live in ``_attention``; linear, norm, feed-forward and MoE layers in ``_layers``.
"""

from __future__ import annotations

import contextlib
import gc
import zlib
from collections.abc import Iterable, Iterator
from typing import Literal

import torch
from torch import nn

from autoparallel.runtime._attention import Attention, KVCache
from autoparallel.runtime._layers import (
    FeedForward,
    MoEBlock,
    RMSNorm,
    RouterScoring,
    _held_ids,
    _linear,
)
from cost_model import AttentionSpec, ModelSpec, MoESpec

__all__ = [
    "DecoderLayer",
    "ReferenceMoETransformer",
    "tiny_reference_spec",
]


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Build without the cyclic garbage collector, then restore its state. Every module made
    here is kept, so its passes find nothing; but on a whole 3T model (~240k modules, millions of
    tracked objects) its full passes rescan everything built so far, three quarters of the build
    time (9.7 s vs 2.4 s on the meta device)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class DecoderLayer(nn.Module):
    """Pre-norm block: ``h + attn(norm(h))`` then ``h + mlp(norm(h))``."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        layer_index: int,
        scoring: RouterScoring,
        rope_theta: float,
        experts: Iterable[int] | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.input_layernorm = RMSNorm(spec.hidden_size, **kw)
        self.self_attn = Attention(spec, layer_index=layer_index, rope_theta=rope_theta, **kw)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, **kw)
        if spec.is_moe_layer(layer_index):
            self.mlp: nn.Module = MoEBlock(spec, scoring=scoring, experts=experts, **kw)
        else:
            self.mlp = FeedForward(spec.hidden_size, spec.ffn_hidden_size, **kw)

    def forward(self, h: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class _Backbone(nn.Module):
    def __init__(
        self,
        spec: ModelSpec,
        *,
        scoring: RouterScoring,
        rope_theta: float,
        layers: tuple[int, ...],
        experts: tuple[int, ...] | None,
        embedding: bool,
        norm: bool,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.embed_tokens: nn.Embedding | None = None
        if embedding:
            self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size, **kw)
        self.layers = nn.ModuleDict(
            {
                str(i): DecoderLayer(
                    spec,
                    layer_index=i,
                    scoring=scoring,
                    rope_theta=rope_theta,
                    experts=experts,
                    **kw,
                )
                for i in layers
            }
        )
        self.norm: RMSNorm | None = RMSNorm(spec.hidden_size, **kw) if norm else None


def _check_family(spec: ModelSpec) -> None:
    unsupported = {
        "ffn_activation": (spec.ffn_activation, "swiglu"),
        "norm": (spec.norm, "rmsnorm"),
        "position_embedding": (spec.position_embedding, "rope"),
        "linear_bias": (spec.linear_bias, False),
        "attention.variant": (spec.attention.variant, "full"),
        "attention.output_gate": (spec.attention.output_gate, False),
    }
    for field, (value, required) in unsupported.items():
        if value != required:
            raise ValueError(
                f"{field} ({value!r}) must be {required!r} for the reference MoE transformer"
            )
    if spec.attention.kind == "mla" and spec.attention.qk_norm:
        raise ValueError(
            "attention.qk_norm (True) must be False for MLA attention in the reference MoE "
            "transformer (query/key norms are a grouped-query attention feature, Qwen3's)"
        )
    if spec.attention.kind == "mla" and spec.qkv_bias:
        raise ValueError(
            "qkv_bias (True) must be False for MLA attention in the reference MoE transformer"
        )


def _parameter_seed(seed: int, name: str) -> int:
    """A generator seed per (seed, FQN), stable across processes (unlike ``hash``)."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


class ReferenceMoETransformer(nn.Module):
    """Decoder-only MoE transformer of the ``ref-3t-moe`` family, built from ``spec``.

    Weights are left uninitialized at construction (build on ``device="meta"`` for a shape-only
    model of any size); call ``init_weights(seed=...)`` for a deterministic initialization that
    is identical on every process. ``forward(input_ids)`` returns logits (batch, seq, vocab);
    with ``cache`` it attends to and extends the cached prefix.

    A part of the model, as one rank of a plan holds it (``build_for_rank`` picks the parts):
    ``layers`` (global layer ids, kept in FQNs: ``model.layers.17...``), ``experts`` (global
    expert ids of every MoE layer), ``embedding`` and ``lm_head`` (the final norm goes with the
    head). Without the embedding the forward takes hidden states; without the head it returns
    them. ``spec`` stays the whole model's, so ``apply_plan`` recognizes a part by what it lacks.
    """

    def __init__(
        self,
        spec: ModelSpec,
        *,
        router_scoring: RouterScoring = "softmax",
        rope_theta: float = 10000.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        layers: Iterable[int] | None = None,
        experts: Iterable[int] | None = None,
        embedding: bool = True,
        lm_head: bool = True,
    ) -> None:
        super().__init__()
        _check_family(spec)
        if spec.tie_word_embeddings and embedding != lm_head:
            raise ValueError(
                f"embedding ({embedding}) and lm_head ({lm_head}) must be built together: the spec ties word embeddings"
            )
        if experts is not None and spec.moe is None:
            raise ValueError(
                f"experts ({sorted(experts)}) must be None for a dense model ({spec.name!r})"
            )
        held_experts = (
            None
            if experts is None
            else _held_ids(experts, spec.moe.num_routed_experts, field="experts")
        )
        self.spec = spec
        kw = dict(device=device, dtype=dtype)
        held_layers = _held_ids(layers, spec.num_layers, field="layers")
        with _cyclic_gc_paused():
            self.model = _Backbone(
                spec,
                scoring=router_scoring,
                rope_theta=rope_theta,
                layers=held_layers,
                experts=held_experts,
                embedding=embedding,
                norm=lm_head,
                **kw,
            )
        self.lm_head: nn.Linear | None = (
            _linear(spec.hidden_size, spec.vocab_size, **kw) if lm_head else None
        )
        if spec.tie_word_embeddings and lm_head:
            self.lm_head.weight = self.model.embed_tokens.weight

    @torch.no_grad()
    def init_weights(self, *, seed: int = 0, std: float = 0.02) -> None:
        """Normal(0, std) projections and embeddings, ones for norms.

        Each weight's values depend only on ``seed`` and its FQN, so they are the same on every
        process and whether the model is whole or already parallelized by ``apply_plan`` (a
        DTensor weight receives its shard of the whole weight; a pipeline stage or an
        expert-parallel rank initializes only the weights it holds). To build a large model
        without materializing it whole: build on ``device="meta"``, ``apply_plan``,
        ``to_empty(device=...)``, then ``init_weights``. Weights sliced outside DTensor (expert
        tensor parallel) get values of their own shape instead.
        """
        from torch.distributed.tensor import DTensor, distribute_tensor

        for name, parameter in self.named_parameters():
            if parameter.is_meta:
                raise ValueError(
                    f"parameter {name!r} is on the meta device; call to_empty(...) first"
                )
            if name.endswith("norm.weight"):
                values = torch.ones(parameter.shape)
            else:
                generator = torch.Generator().manual_seed(_parameter_seed(seed, name))
                values = torch.randn(parameter.shape, generator=generator) * std
            if isinstance(parameter, DTensor):
                local = distribute_tensor(
                    values, parameter.device_mesh, parameter.placements, src_data_rank=None
                )
                parameter.to_local().copy_(local.to_local())
            else:
                parameter.copy_(values)

    def forward(self, input_ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        backbone = self.model
        h = backbone.embed_tokens(input_ids) if backbone.embed_tokens is not None else input_ids
        for layer in backbone.layers.values():
            h = layer(h, cache)
        if cache is not None:
            cache.advance(input_ids.shape[1])
        if backbone.norm is not None:
            h = backbone.norm(h)
        return self.lm_head(h) if self.lm_head is not None else h


def tiny_reference_spec(
    *,
    attention: Literal["mla", "gqa"] = "mla",
    num_layers: int = 4,
    hidden_size: int = 64,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    num_experts: int = 8,
    top_k: int = 2,
    num_dense_layers: int = 1,
    num_shared_experts: int = 1,
    vocab_size: int = 256,
    tie_word_embeddings: bool = False,
    qk_norm: bool = False,
) -> ModelSpec:
    """A small member of the ``ref-3t-moe`` family for tests and examples (hidden 64, 8 experts);
    ``qk_norm`` (grouped-query attention only) adds Qwen3's per-head query and key norms."""
    if attention == "mla":
        head = max(hidden_size // num_heads, 8)
        attention_spec = AttentionSpec(
            kind="mla",
            num_heads=num_heads,
            num_kv_heads=num_heads,
            head_dim=head + head // 2,
            q_lora_rank=hidden_size // 2,
            kv_lora_rank=hidden_size // 4,
            qk_nope_head_dim=head,
            qk_rope_head_dim=head // 2,
            v_head_dim=head,
        )
    else:
        attention_spec = AttentionSpec(
            kind="gqa",
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=hidden_size // num_heads,
            qk_norm=qk_norm,
        )
    moe = MoESpec(
        num_routed_experts=num_experts,
        top_k=top_k,
        expert_ffn_hidden_size=hidden_size // 2,
        num_shared_experts=num_shared_experts,
        num_dense_layers=num_dense_layers,
    )
    return ModelSpec(
        name=f"tiny-reference-{attention}",
        num_layers=num_layers,
        hidden_size=hidden_size,
        vocab_size=vocab_size,
        ffn_hidden_size=2 * hidden_size,
        attention=attention_spec,
        moe=moe,
        tie_word_embeddings=tie_word_embeddings,
        max_context_tokens=4096,
    )
