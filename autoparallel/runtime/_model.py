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
(DeepSeek-V2) or sigmoid scores (DeepSeek-V3, arXiv:2412.19437 sec. 2.1.2).
"""

from __future__ import annotations

import contextlib
import gc
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Literal, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from cost_model import AttentionSpec, ModelSpec, MoESpec

__all__ = [
    "Attention",
    "DecoderLayer",
    "FeedForward",
    "KVCache",
    "LocalDispatcher",
    "MoEBlock",
    "ReferenceMoETransformer",
    "RMSNorm",
    "Router",
    "TokenDispatcher",
    "tiny_reference_spec",
]

RouterScoring = Literal["softmax", "sigmoid"]


class _Linear(nn.Linear):
    """``nn.Linear`` without the init at construction (a 3T model on the meta device builds in
    seconds); ``ReferenceMoETransformer.init_weights`` initializes every weight.

    Sets the attributes ``nn.Linear.__init__`` sets, registering the parameters directly rather
    than through ``Module.__setattr__``: a 3T model has ~180k of these, a rank's part ~500.
    """

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None
    ) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        kw = dict(device=device, dtype=dtype)
        self._parameters["weight"] = nn.Parameter(torch.empty((out_features, in_features), **kw))
        self._parameters["bias"] = nn.Parameter(torch.empty(out_features, **kw)) if bias else None

    def reset_parameters(self) -> None:
        return None


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


def _linear(
    in_features: int, out_features: int, *, bias: bool = False, device=None, dtype=None
) -> nn.Linear:
    return _Linear(in_features, out_features, bias=bias, device=device, dtype=dtype)


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight``, computed in fp32 (Zhang & Sennrich 2019)."""

    def __init__(self, width: int, *, eps: float = 1e-6, device=None, dtype=None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def _rope(x: torch.Tensor, positions: torch.Tensor, *, theta: float) -> torch.Tensor:
    """Rotate ``x`` (batch, seq, heads, dim) by its positions, rotate-half form."""
    dim = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim)
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)[None, :, None, :]
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)[None, :, None, :]
    first, second = x.float().chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return (x.float() * cos + rotated * sin).type_as(x)


class KVCache:
    """Per-layer caches of a batch, allocated on first write with ``capacity_tokens`` slots.

    MLA layers cache their compressed latent (after ``kv_a_layernorm``) and the RoPE key;
    GQA layers cache K and V of their (local) KV heads. ``length`` is the number of tokens
    already cached; the model advances it after each forward.
    """

    def __init__(self, *, capacity_tokens: int) -> None:
        if capacity_tokens <= 0:
            raise ValueError(f"capacity_tokens ({capacity_tokens}) must be > 0")
        self.capacity_tokens = capacity_tokens
        self.length = 0
        self.layers: dict[int, tuple[torch.Tensor, ...]] = {}

    def update(self, layer_index: int, *new: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Write ``new`` (batch, tokens, ...) at the current length; return the cached prefixes."""
        stop = self.length + new[0].shape[1]
        if stop > self.capacity_tokens:
            raise ValueError(
                f"cache length ({stop}) must be <= capacity_tokens ({self.capacity_tokens})"
            )
        if layer_index not in self.layers:
            self.layers[layer_index] = tuple(
                torch.zeros(
                    (t.shape[0], self.capacity_tokens, *t.shape[2:]), dtype=t.dtype, device=t.device
                )
                for t in new
            )
        stored = self.layers[layer_index]
        for buffer, tensor in zip(stored, new):
            buffer[:, self.length : stop] = tensor.detach()
        return tuple(buffer[:, :stop] for buffer in stored)

    def advance(self, num_tokens: int) -> None:
        self.length += num_tokens

    def num_bytes(self) -> int:
        """Bytes held by the allocated buffers (all layers, full capacity)."""
        return sum(
            t.numel() * t.element_size() for tensors in self.layers.values() for t in tensors
        )


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    offset: int,
    scale: float,
    query_positions: torch.Tensor | None = None,
    key_positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of queries at positions ``offset + i`` over keys ``0..offset+S-1``, or at
    the given global ``query_positions`` over keys at ``key_positions`` (context parallel).

    Inputs are (batch, seq, heads, dim); returns (batch, seq, heads * v_dim).
    """
    query_len, key_len = q.shape[1], k.shape[1]
    if key_positions is None:
        key_positions = torch.arange(key_len, device=q.device)
    if query_positions is None:
        query_positions = torch.arange(query_len, device=q.device) + offset
    mask = key_positions[None, :] <= query_positions[:, None]
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=scale
    )
    return out.transpose(1, 2).reshape(q.shape[0], query_len, -1)


def _identity(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _identity_pair(first: torch.Tensor, second: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return first, second


class Attention(nn.Module):
    """MLA (``kind == "mla"``) or grouped-query attention with RoPE; heads may be tp-split.

    ``shared_key_hook`` sees MLA's RoPE key, which every (local) head shares: tensor parallelism
    sets it to an identity whose backward sums the key's gradient over the tp ranks (Megatron's
    "copy to tensor-parallel region"); on one rank it is the identity. ``kv_heads_hook`` sees
    GQA's keys and values (batch, seq, kv heads, dim) before RoPE and the cache: with more tp
    ranks than KV heads, K/V projections stay whole and the hook keeps the head this rank's
    query heads read.
    """

    def __init__(
        self, spec: ModelSpec, *, layer_index: int, rope_theta: float, device=None, dtype=None
    ) -> None:
        super().__init__()
        self.attention: AttentionSpec = spec.attention
        self.layer_index = layer_index
        self.rope_theta = rope_theta
        self.shared_key_hook: Callable[[torch.Tensor], torch.Tensor] = _identity
        self.kv_heads_hook: Callable[
            [torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]
        ] = _identity_pair
        a, h, kw = spec.attention, spec.hidden_size, dict(device=device, dtype=dtype)
        if a.kind == "mla":
            q_width = a.num_heads * a.qk_head_dim
            if a.q_lora_rank:
                self.q_a_proj = _linear(h, a.q_lora_rank, **kw)
                self.q_a_layernorm = RMSNorm(a.q_lora_rank, **kw)
                self.q_b_proj = _linear(a.q_lora_rank, q_width, **kw)
            else:
                self.q_proj = _linear(h, q_width, **kw)
            self.kv_a_proj_with_mqa = _linear(h, a.kv_lora_rank + a.qk_rope_head_dim, **kw)
            self.kv_a_layernorm = RMSNorm(a.kv_lora_rank, **kw)
            self.kv_b_proj = _linear(
                a.kv_lora_rank, a.num_heads * (a.qk_nope_head_dim + a.v_head_dim), **kw
            )
            self.o_proj = _linear(a.num_heads * a.v_head_dim, h, **kw)
        else:
            bias = spec.qkv_bias
            self.q_proj = _linear(h, a.num_heads * a.head_dim, bias=bias, **kw)
            self.k_proj = _linear(h, a.num_kv_heads * a.head_dim, bias=bias, **kw)
            self.v_proj = _linear(h, a.num_kv_heads * a.head_dim, bias=bias, **kw)
            self.o_proj = _linear(a.num_heads * a.head_dim, h, **kw)

    # Context parallel (``_context_parallel.ContextParallel``) sets this on an instance: it gives
    # the global positions of the local tokens and all-gathers keys/values over the cp group.
    sequence_context = None

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        offset = 0 if cache is None else cache.length
        if cache is not None and self.sequence_context is not None:
            raise ValueError(
                "generation with a KV cache is not supported under context parallel (cp > 1); "
                "use an inference plan with cp = 1"
            )
        if self.attention.kind == "mla":
            return self.o_proj(self._mla(x, offset, cache))
        return self.o_proj(self._gqa(x, offset, cache))

    def _positions(self, x: torch.Tensor, offset: int) -> torch.Tensor:
        context, seq = self.sequence_context, x.shape[1]
        if context is None:
            return torch.arange(offset, offset + seq, device=x.device)
        return context.positions(seq, device=x.device)

    def _gather_keys(
        self, x: torch.Tensor, *keys: torch.Tensor
    ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None]:
        """Keys/values of every cp rank and their global positions (unchanged, ``None``, without cp)."""
        context = self.sequence_context
        if context is None:
            return keys, None
        return context.gather(*keys), context.key_positions(x.shape[1], device=x.device)

    def _mla(self, x: torch.Tensor, offset: int, cache: KVCache | None) -> torch.Tensor:
        a, (batch, seq) = self.attention, x.shape[:2]
        positions = self._positions(x, offset)
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if a.q_lora_rank else self.q_proj(x)
        q = q.view(batch, seq, -1, a.qk_head_dim)
        q_nope, q_rope = q.split([a.qk_nope_head_dim, a.qk_rope_head_dim], dim=-1)
        latent, k_rope = self.kv_a_proj_with_mqa(x).split(
            [a.kv_lora_rank, a.qk_rope_head_dim], dim=-1
        )
        latent = self.kv_a_layernorm(latent)
        k_rope = _rope(self.shared_key_hook(k_rope).unsqueeze(2), positions, theta=self.rope_theta)
        if cache is not None:
            latent, k_rope = cache.update(self.layer_index, latent, k_rope)
        (latent, k_rope), key_positions = self._gather_keys(x, latent, k_rope)
        kv = self.kv_b_proj(latent).view(
            batch, latent.shape[1], -1, a.qk_nope_head_dim + a.v_head_dim
        )
        k_nope, v = kv.split([a.qk_nope_head_dim, a.v_head_dim], dim=-1)
        q = torch.cat([q_nope, _rope(q_rope, positions, theta=self.rope_theta)], dim=-1)
        k = torch.cat([k_nope, k_rope.expand(-1, -1, k_nope.shape[2], -1)], dim=-1)
        return _attend(
            q,
            k,
            v,
            offset=offset,
            scale=a.qk_head_dim**-0.5,
            query_positions=positions,
            key_positions=key_positions,
        )

    def _gqa(self, x: torch.Tensor, offset: int, cache: KVCache | None) -> torch.Tensor:
        a, (batch, seq) = self.attention, x.shape[:2]
        positions = self._positions(x, offset)
        q = _rope(self.q_proj(x).view(batch, seq, -1, a.head_dim), positions, theta=self.rope_theta)
        k, v = self.kv_heads_hook(
            self.k_proj(x).view(batch, seq, -1, a.head_dim),
            self.v_proj(x).view(batch, seq, -1, a.head_dim),
        )
        k = _rope(k, positions, theta=self.rope_theta)
        if cache is not None:
            k, v = cache.update(self.layer_index, k, v)
        (k, v), key_positions = self._gather_keys(x, k, v)
        if q.shape[2] % k.shape[2]:
            raise ValueError(
                f"local query heads ({q.shape[2]}) must be divisible by local KV heads ({k.shape[2]})"
            )
        group = q.shape[2] // k.shape[2]
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
        return _attend(
            q,
            k,
            v,
            offset=offset,
            scale=a.head_dim**-0.5,
            query_positions=positions,
            key_positions=key_positions,
        )


class FeedForward(nn.Module):
    """SwiGLU FFN: ``down_proj(silu(gate_proj(x)) * up_proj(x))`` (Shazeer 2020)."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int, *, device=None, dtype=None) -> None:
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.gate_proj = _linear(hidden_size, ffn_hidden_size, **kw)
        self.up_proj = _linear(hidden_size, ffn_hidden_size, **kw)
        self.down_proj = _linear(ffn_hidden_size, hidden_size, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Linear):
    """Top-k router (``mlp.gate``): scores = softmax or sigmoid of ``x @ weight.T``.

    Returns (weights, expert ids), each (tokens, top_k). Sigmoid scores are renormalized over
    the chosen experts (DeepSeek-V3 sec. 2.1.2); softmax scores are used as they are (DeepSeek-V2).
    """

    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        *,
        top_k: int,
        scoring: RouterScoring,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(hidden_size, num_experts, bias=False, device=device, dtype=dtype)
        if scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"router scoring ({scoring!r}) must be 'softmax' or 'sigmoid'")
        self.top_k = top_k
        self.scoring = scoring

    def reset_parameters(self) -> None:
        return None

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(tokens.float(), self.weight.float())
        scores = logits.softmax(dim=-1) if self.scoring == "softmax" else logits.sigmoid()
        weights, expert_ids = scores.topk(self.top_k, dim=-1)
        if self.scoring == "sigmoid":
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.type_as(tokens), expert_ids


class TokenDispatcher(Protocol):
    """Sends each token to its top-k experts and combines their outputs, weighted.

    ``tokens`` (T, hidden), ``weights`` and ``expert_ids`` (T, top_k) with global expert ids,
    ``experts`` maps ``str(global id)`` -> expert module (only the experts this rank holds).
    Returns (T, hidden). Expert parallelism replaces ``MoEBlock.dispatcher`` with an all-to-all
    implementation of this protocol.
    """

    def __call__(
        self,
        tokens: torch.Tensor,
        weights: torch.Tensor,
        expert_ids: torch.Tensor,
        experts: nn.ModuleDict,
    ) -> torch.Tensor: ...


class LocalDispatcher:
    """Every expert is on this rank: gather each expert's tokens, run it, scatter-add back.

    Every expert runs, even on zero tokens, so every expert weight gets a (possibly zero)
    gradient and gradient synchronization sees the same tensors on every rank.
    """

    def __call__(
        self,
        tokens: torch.Tensor,
        weights: torch.Tensor,
        expert_ids: torch.Tensor,
        experts: nn.ModuleDict,
    ) -> torch.Tensor:
        out = torch.zeros_like(tokens)
        for key, expert in experts.items():
            token_index, slot = torch.where(expert_ids == int(key))
            expert_out = expert(tokens[token_index]) * weights[token_index, slot, None]
            out = out.index_add(0, token_index, expert_out)
        return out


class MoEBlock(nn.Module):
    """Routed experts (``experts``, a ``ModuleDict`` keyed by global expert id), shared experts
    and the router ``gate``. ``dispatcher`` moves tokens to experts (``LocalDispatcher`` here).

    ``experts`` (global ids) builds only those routed experts, as an expert-parallel rank holds
    them; ``num_experts`` stays the model's count (the router scores all of them).
    """

    def __init__(
        self,
        spec: ModelSpec,
        *,
        scoring: RouterScoring,
        experts: Iterable[int] | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        moe: MoESpec = spec.moe
        h, kw = spec.hidden_size, dict(device=device, dtype=dtype)
        self.num_experts = moe.num_routed_experts
        self.gate = Router(h, moe.num_routed_experts, top_k=moe.top_k, scoring=scoring, **kw)
        held = _held_ids(experts, moe.num_routed_experts, field="experts")
        self.experts = nn.ModuleDict(
            {str(e): FeedForward(h, moe.expert_ffn_hidden_size, **kw) for e in held}
        )
        self.shared_experts = None
        if moe.num_shared_experts:
            self.shared_experts = FeedForward(h, moe.num_shared_experts * moe.shared_ffn_size, **kw)
        self.shared_expert_gate = _linear(h, 1, **kw) if moe.shared_expert_gate else None
        self.dispatcher: TokenDispatcher = LocalDispatcher()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        weights, expert_ids = self.gate(tokens)
        out = self.dispatcher(tokens, weights, expert_ids, self.experts).view_as(x)
        if self.shared_experts is not None:
            shared = self.shared_experts(x)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return out


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


def _held_ids(ids: Iterable[int] | None, count: int, *, field: str) -> tuple[int, ...]:
    """``ids`` sorted (all of ``range(count)`` when ``None``); each must lie in ``[0, count)``."""
    if ids is None:
        return tuple(range(count))
    held = tuple(sorted(set(ids)))
    outside = [i for i in held if not 0 <= i < count]
    if outside:
        raise ValueError(f"{field} ({outside}) must be ids in [0, {count})")
    return held


def _check_family(spec: ModelSpec) -> None:
    unsupported = {
        "ffn_activation": (spec.ffn_activation, "swiglu"),
        "norm": (spec.norm, "rmsnorm"),
        "position_embedding": (spec.position_embedding, "rope"),
        "linear_bias": (spec.linear_bias, False),
        "attention.variant": (spec.attention.variant, "full"),
    }
    for field, (value, required) in unsupported.items():
        if value != required:
            raise ValueError(
                f"{field} ({value!r}) must be {required!r} for the reference MoE transformer"
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
) -> ModelSpec:
    """A small member of the ``ref-3t-moe`` family for tests and examples (hidden 64, 8 experts)."""
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
