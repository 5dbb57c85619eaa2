"""Work of one inference pass on one device: FLOPs, bytes, messages and memory (vectorized).

A *pass* pushes ``new_tokens`` tokens of each of ``batch`` sequences (per attention replica)
through the layers of a pipeline rank. Prefill is one pass over the uncached part of the
prompts; a decode step is one pass of one token per sequence. Every quantity is a numpy array
of shape ``(3, n)``: the first, a middle and the last pipeline rank (``_common.STAGES``) of
each of the ``n`` rows of a config table.

Layout (DESIGN.md, "MoE parallelism semantics"): the ``dp*cp*tp`` ranks of a stage form
attention groups of ``cp*tp`` ranks, or of ``cp`` ranks under attention data parallel
(attention and shared experts replicated on each tp rank: SGLang's ``--enable-dp-attention``,
DeepSeek's "MLA/Shared Expert DP" units). Each attention group (a *replica*) serves ``batch``
sequences. The dense FFN stays tp-sharded (``_common.parameters_per_device``), so under
attention-DP its tokens are all-gathered over tp and reduce-scattered back. MoE layers re-view
the stage's ranks as ``edp x ep x etp``; ``num_redundant_experts`` extra expert slots (DeepSeek
EPLB) are spread over the ep ranks.

Sources:
  * FLOPs = 2 x multiply-accumulates of each matmul (Kaplan et al. 2020, Table 1).
  * MLA decode in absorbed form (DeepSeek-V2, arXiv:2405.04434, sec. 2.1.2: W^UK absorbed
    into W^Q, W^UV into W^O; FlashMLA): every head scores the shared latent of
    ``kv_lora_rank + qk_rope_head_dim`` elements and reads back ``kv_lora_rank`` values, so one
    cached key costs ``2*heads*(2*kv_lora_rank + qk_rope_head_dim)`` FLOPs and the latent is read
    once for all heads. Prefill uses the explicit form (``ModelSpec.attention_flops_per_token``)
    plus the up-projection of cached prefix latents through ``kv_b_proj``.
  * Experts touched by ``n`` tokens each choosing ``k`` of ``E``: ``E*(1-(1-k/E)^n)``.
  * Most loaded of ``m`` EP ranks when tokens route uniformly at random (balls into bins,
    Raab & Steger 1998): mean + sqrt(2 mean ln m).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_model._common import mean_attended_tokens
from cost_model._model_spec import ModelSpec

#: RMSNorm, residual add and RoPE read and write about 12 hidden-size vectors per token per layer.
ELEMENTWISE_VECTORS_PER_LAYER = 12.0
#: Logits are materialized in fp32 before sampling.
LOGIT_BYTES = 4.0


@dataclass(frozen=True)
class Pass:
    """One pass: per-row arrays of shape ``(n,)``; ``decode`` selects the attention form."""

    batch: np.ndarray  # sequences per attention replica
    new_tokens: np.ndarray  # tokens per sequence processed in this pass
    cached_tokens: np.ndarray  # tokens per sequence already in the KV cache
    head_tokens: np.ndarray  # tokens per sequence that need logits
    decode: bool

    def scaled(self, factor: float) -> "Pass":
        """The same pass over ``factor`` times the sequences (a micro-batch of it)."""
        return Pass(self.batch * factor, self.new_tokens, self.cached_tokens, self.head_tokens, self.decode)


def mean_attended_between(model: ModelSpec, first_position, last_position) -> np.ndarray:
    """Mean keys attended by queries at causal positions ``first..last`` (1-based): the difference
    of two whole-sequence sums of ``_common.mean_attended_tokens``."""
    first = np.asarray(first_position, dtype=np.float64)
    last = np.maximum(np.asarray(last_position, dtype=np.float64), first)
    before = first - 1.0

    def total(length: np.ndarray) -> np.ndarray:
        safe = np.maximum(length, 1.0)
        return np.where(length > 0, safe * mean_attended_tokens(attention=model.attention, sequence_tokens=safe), 0.0)

    return (total(last) - total(before)) / (last - before)


def kv_cached_tokens(model: ModelSpec, context_tokens, block_tokens: int) -> np.ndarray:
    """Tokens of cache one sequence occupies, rounded up to whole paged blocks: the vectorized
    rule of ``ModelSpec.kv_cache_bytes`` (a sliding window keeps only the window)."""
    a = model.attention
    context = np.asarray(context_tokens, dtype=np.float64)
    if a.variant == "sliding_window":
        context = np.minimum(context, float(a.window_tokens))
    return np.ceil(context / block_tokens) * block_tokens


def kv_read_tokens(model: ModelSpec, context_tokens) -> np.ndarray:
    """Cached tokens whose KV one pass reads: sparse top-k attention fetches only the selected
    ``topk_tokens`` (its indexer's small keys are not counted); a window's cache is the window."""
    context = np.asarray(context_tokens, dtype=np.float64)
    if model.attention.variant == "sparse_topk":
        return np.minimum(context, float(model.attention.topk_tokens))
    return context


def kv_bytes_per_sequence_layer(model: ModelSpec, context_tokens, element_bytes, block_tokens: int) -> np.ndarray:
    """KV-cache bytes of one sequence in one layer, before sharding (linear attention: its state)."""
    a = model.attention
    element_bytes = np.asarray(element_bytes, dtype=np.float64)
    shape = np.broadcast(np.asarray(context_tokens), element_bytes).shape
    if a.variant == "linear":
        return np.broadcast_to(a.num_heads * a.qk_head_dim * a.value_head_dim * element_bytes, shape)
    per_token = model.kv_cache_elements_per_token_per_layer() * element_bytes
    return kv_cached_tokens(model, context_tokens, block_tokens) * per_token


def kv_head_split(model: ModelSpec, attention_shard: np.ndarray) -> np.ndarray:
    """Ranks of a tp group that split one sequence's cache. MHA/GQA split by KV head (a head is
    replicated once tp exceeds the KV heads); MLA's latent serves every head, so each TP rank
    holds all of it — the duplication that attention-DP removes (SGLang DP-attention)."""
    if model.attention.kind == "mla":
        return np.ones_like(attention_shard, dtype=np.float64)
    return np.minimum(attention_shard, float(model.attention.num_kv_heads))


def attention_flops_per_key(model: ModelSpec, *, decode: bool) -> float:
    """Score + value FLOPs of one query against one key in one layer."""
    a = model.attention
    if decode and a.kind == "mla":
        return 2.0 * a.num_heads * (2 * a.kv_lora_rank + a.qk_rope_head_dim)
    return 2.0 * a.num_heads * (a.qk_head_dim + a.value_head_dim)


def prefix_upprojection_flops_per_token(model: ModelSpec) -> float:
    """Explicit-form MLA prefill re-expands each cached prefix latent through ``kv_b_proj``."""
    a = model.attention
    if a.kind != "mla":
        return 0.0
    return 2.0 * a.kv_lora_rank * a.num_heads * (a.qk_nope_head_dim + a.value_head_dim)


def experts_touched_fraction(tokens, *, top_k: int, num_experts: int) -> np.ndarray:
    """Expected fraction of ``num_experts`` experts receiving at least one of ``tokens`` tokens."""
    return 1.0 - np.power(1.0 - top_k / num_experts, np.asarray(tokens, dtype=np.float64))


def max_load_factor(mean_load, num_bins) -> np.ndarray:
    """Most-loaded bin over the mean when items land uniformly at random (Raab & Steger 1998)."""
    mean_load = np.maximum(np.asarray(mean_load, dtype=np.float64), 1e-12)
    bins = np.asarray(num_bins, dtype=np.float64)
    return 1.0 + np.where(bins > 1, np.sqrt(2.0 * np.log(np.maximum(bins, 1.0)) / mean_load), 0.0)


def live_activation_elements_per_token(model: ModelSpec, attention_shard: np.ndarray) -> np.ndarray:
    """Largest set of activations one token keeps alive inside a layer of a forward-only pass:
    residual, normed input, the attention's query / key-value / output widths (head-split), and
    the FFN's gate, up and activated widths. Freed at the next layer (no backward)."""
    a, h = model.attention, model.hidden_size
    attention_width = a.num_heads * (a.qk_head_dim + a.qk_head_dim + a.value_head_dim + a.value_head_dim)
    ffn = model.ffn_hidden_size if model.num_dense_ffn_layers else 0
    if model.moe is not None:
        ffn = max(ffn, model.moe.shared_ffn_size * model.moe.num_shared_experts, model.moe.expert_ffn_hidden_size)
    return 3.0 * h + np.maximum(attention_width / attention_shard, 3.0 * ffn / attention_shard)
