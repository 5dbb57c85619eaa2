"""Attention of the reference MoE transformer: MLA or grouped-query attention, RoPE, KV cache.

Module names follow HuggingFace's DeepSeek-V3 implementation (``modeling_deepseek_v3.py``)::

    model.layers.N.self_attn.{q_a_proj, q_a_layernorm, q_b_proj | q_proj,
                              kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj}   (MLA)
    model.layers.N.self_attn.{q_proj, k_proj, v_proj, o_proj[, q_norm, k_norm]}        (GQA)

Every projection reads its local head count from its weight's shape, so a tensor-parallel split
needs no change here.

Formulas: MLA, DeepSeek-V2 (arXiv:2405.04434) sec. 2.1.2-2.1.3 (low-rank query and key/value
compression, decoupled RoPE key shared by all heads, cache = latent + RoPE key); RoPE, Su et al.
(arXiv:2104.09864) in the rotate-half form of HuggingFace ``modeling_llama.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from autoparallel.runtime._layers import RMSNorm, _linear
from cost_model import AttentionSpec, ModelSpec

__all__ = ["Attention", "KVCache"]


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
            if a.qk_norm:  # Qwen3: an RMSNorm over each query and key head before RoPE
                self.q_norm = RMSNorm(a.head_dim, **kw)
                self.k_norm = RMSNorm(a.head_dim, **kw)

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
        q = self.q_proj(x).view(batch, seq, -1, a.head_dim)
        k = self.k_proj(x).view(batch, seq, -1, a.head_dim)
        if a.qk_norm:  # per head, before the heads are picked and rotated (HF ``Qwen3Attention``)
            q, k = self.q_norm(q), self.k_norm(k)
        q = _rope(q, positions, theta=self.rope_theta)
        k, v = self.kv_heads_hook(k, self.v_proj(x).view(batch, seq, -1, a.head_dim))
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
