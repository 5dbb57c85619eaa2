"""Work of one inference pass on one device: FLOPs, bytes, messages and memory (vectorized).

A *pass* pushes ``new_tokens`` tokens of each of ``batch`` sequences (per attention replica)
through the layers of a pipeline rank. Prefill is one pass over the uncached part of the
prompts; a decode step is one pass of one token per sequence. Every quantity is a numpy array
of shape ``(3, n)``: the first, a middle and the last pipeline rank (``_stages.STAGES``) of
each of the ``n`` rows of a config table.

Layout (DESIGN.md, "MoE parallelism semantics"): the ``dp*cp*tp`` ranks of a stage form
attention groups of ``cp*tp`` ranks, or of ``cp`` ranks under attention data parallel
(attention and shared experts replicated on each tp rank: SGLang's ``--enable-dp-attention``,
DeepSeek's "MLA/Shared Expert DP" units). Each attention group (a *replica*) serves ``batch``
sequences. The dense FFN stays tp-sharded (``_stages.parameters_per_device``), so under
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
  * Memory passes between matmuls (``*_side_bytes``): every tensor one kernel writes and the next
    reads, at the activation width, counted once written and once read; the casts to the GEMM
    input dtype are kernels of their own (DeepGEMM README: "FP8 casting ... must be handled
    separately") unless fused into the norm or activation before them, as counted here. They
    are memory-bound and add to the matmuls' time rather than hiding under their roofline.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_model._model_spec import ModelSpec
from cost_model._pricing import mean_attended_tokens

#: While hidden communication runs, its kernels hold SMs the matmuls would otherwise use:
#: DeepSeek-V3 (arXiv:2412.19437, sec. 3.2.2) gives 20 of the H800's 132 SMs to the EP all-to-all.
#: DeepEP's low-latency (decode) kernels overlap through a receive hook and hold no SM (DeepEP README).
COMMUNICATION_SM_FRACTION = 20.0 / 132.0
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

    def scaled(self, factor: float) -> Pass:
        """The same pass over ``factor`` times the sequences (a micro-batch of it)."""
        return Pass(
            self.batch * factor, self.new_tokens, self.cached_tokens, self.head_tokens, self.decode
        )


def mean_attended_between(model: ModelSpec, first_position, last_position) -> np.ndarray:
    """Mean keys attended by queries at causal positions ``first..last`` (1-based): the difference
    of two whole-sequence sums of ``_pricing.mean_attended_tokens``."""
    first = np.asarray(first_position, dtype=np.float64)
    last = np.maximum(np.asarray(last_position, dtype=np.float64), first)
    before = first - 1.0

    def total(length: np.ndarray) -> np.ndarray:
        safe = np.maximum(length, 1.0)
        return np.where(
            length > 0,
            safe * mean_attended_tokens(attention=model.attention, sequence_tokens=safe),
            0.0,
        )

    return (total(last) - total(before)) / (last - before)


def kv_cached_tokens(
    model: ModelSpec, context_tokens, block_tokens: int, *, window_ratio: float | None = None
) -> np.ndarray:
    """Tokens of cache one sequence occupies in one layer (the mean over layers), rounded up to
    whole paged blocks: the vectorized rule of ``AttentionSpec.cached_tokens`` (a window or a
    chunk keeps only the window, interleaved full layers everything, a linear layer none).
    ``window_ratio`` (``ServingProfile.window_kv_ratio``): a window or chunk layer costs that
    share of every context token instead, as an engine that sizes its window layers' pool
    against the full layers' (SGLang) or caches them at full length (ratio 1) counts it."""
    a = model.attention
    context = np.asarray(context_tokens, dtype=np.float64)

    def blocks(tokens: np.ndarray) -> np.ndarray:
        return np.ceil(tokens / block_tokens) * block_tokens

    if a.variant in ("sliding_window", "chunked") and window_ratio is not None:
        local = window_ratio * blocks(context)
    elif a.variant in ("sliding_window", "chunked"):
        assert a.window_tokens is not None  # AttentionSpec requires it for these variants
        local = blocks(np.minimum(context, float(a.window_tokens)))
    elif a.variant == "linear":
        local = np.zeros_like(context)
    else:
        return blocks(context)
    f = a.full_layer_fraction
    return f * blocks(context) + (1.0 - f) * local


def kv_read_tokens(model: ModelSpec, context_tokens) -> np.ndarray:
    """Cached tokens whose KV one pass reads: sparse top-k attention fetches only the selected
    ``topk_tokens`` (its indexer's keys are read apart, ``indexer_read_bytes``); a window's cache
    is the window (``kv_cached_tokens``)."""
    context = np.asarray(context_tokens, dtype=np.float64)
    if model.attention.variant == "sparse_topk":
        assert model.attention.topk_tokens is not None  # required for this variant
        return np.minimum(context, float(model.attention.topk_tokens))
    return context


def kv_bytes_per_sequence_layer(
    model: ModelSpec,
    context_tokens,
    element_bytes,
    block_tokens: int,
    *,
    with_indexer: bool = True,
    window_ratio: float | None = None,
) -> np.ndarray:
    """KV-cache bytes of one sequence in one layer, before sharding (the mean over layers): the
    cached tokens' keys and values (a window layer's by ``window_ratio``, ``kv_cached_tokens``),
    a linear layer's fixed state, and (``with_indexer``) a DSA indexer's FP8 keys of every
    cached token (``AttentionSpec.indexer_key_bytes``)."""
    a = model.attention
    element_bytes = np.asarray(element_bytes, dtype=np.float64)
    shape = np.broadcast(np.asarray(context_tokens), element_bytes).shape
    per_token = model.kv_cache_elements_per_token_per_layer() * element_bytes
    cached = kv_cached_tokens(model, context_tokens, block_tokens, window_ratio=window_ratio)
    indexer = a.indexer_key_bytes if with_indexer else 0.0
    total = np.broadcast_to(cached * (per_token + indexer), shape)
    if a.variant == "linear":
        state = a.linear_state_elements() * element_bytes
        total = total + a.linear_share * state
    return np.broadcast_to(total, shape)


def indexer_read_bytes(model: ModelSpec, context_tokens) -> np.ndarray:
    """Bytes of DSA indexer keys one query of a sequence reads in one layer: the keys of every
    cached token (the indexer scores the whole context to choose the top-k)."""
    context = np.asarray(context_tokens, dtype=np.float64)
    return context * model.attention.indexer_key_bytes


def kv_head_split(model: ModelSpec, attention_shard: np.ndarray) -> np.ndarray:
    """Ranks of a tp group that split one sequence's cache. MHA/GQA split by KV head (a head is
    replicated once tp exceeds the KV heads); MLA's latent serves every head, so each TP rank
    holds all of it — the duplication that attention-DP removes (SGLang DP-attention). The
    engines cache MLA as one KV head of ``kv_lora_rank + qk_rope_head_dim`` per token on every
    rank: vLLM (``MLAAttention.get_kv_cache_spec``: ``MLAAttentionSpec(num_kv_heads=1,
    head_size=kv_lora_rank + qk_rope_head_dim)``, each TP worker sizing its own pool; only decode
    context parallel, ``decode_context_parallel_size`` default 1, spreads a sequence's tokens over
    the TP ranks), SGLang (``MLATokenToKVPool``, cell size ``(kv_lora_rank + qk_rope_head_dim) x
    layers x dtype bytes`` with no tp divisor; its DCP is likewise off by default) and
    TensorRT-LLM (``KVCacheManager(num_kv_heads=1, head_dim=kv_lora_rank + qk_rope_head_dim)``
    for MLA; ``enable_attention_dp`` makes the attention tp 1). The layout's context-parallel
    ranks (``cp``) split the tokens on top of this; a DCP that reuses the TP ranks is not
    modelled (all three engines leave it off unless asked)."""
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


def live_activation_elements_per_token(model: ModelSpec, attention_shard: np.ndarray) -> np.ndarray:
    """Largest set of activations one token keeps alive inside a layer of a forward-only pass:
    residual, normed input, the attention's query / key-value / output widths (head-split), and
    the FFN's gate, up and activated widths. Freed at the next layer (no backward)."""
    a, h = model.attention, model.hidden_size
    attention_width = a.num_heads * (
        a.qk_head_dim + a.qk_head_dim + a.value_head_dim + a.value_head_dim
    )
    ffn = model.ffn_hidden_size if model.num_dense_ffn_layers else 0
    if model.moe is not None:
        ffn = max(
            ffn,
            model.moe.shared_ffn_size * model.moe.num_shared_experts,
            model.moe.expert_ffn_hidden_size,
        )
    return 3.0 * h + np.maximum(attention_width / attention_shard, 3.0 * ffn / attention_shard)


#: One GEMM of a block: (output width N, input width K, the width tensor parallelism splits:
#: "n" column-parallel, "k" row-parallel, "" replicated on every rank).
Projection = tuple[int, int, str]


def attention_projections(model: ModelSpec) -> tuple[Projection, ...]:
    """The GEMMs of one attention block (HF module names). MLA: ``q_a_proj`` and
    ``kv_a_proj_with_mqa`` replicated (``_stages.attention_replicated_parameters``) and run as
    one GEMM on the hidden state they share (SGLang ``fused_qkv_a_proj_with_mqa``,
    ``models/deepseek_v2.py``; vLLM ``fused_qkv_a_proj``), ``q_b_proj`` and ``kv_b_proj``
    column-parallel, ``o_proj`` row-parallel (DeepSeek-V2 sec. 2.1.2, explicit form; vLLM
    ``DeepseekV2MLAAttention``); MHA/GQA: the fused ``qkv_proj`` column-parallel and ``o_proj``
    row-parallel (Megatron-LM, Shoeybi et al. 2019)."""
    a, h = model.attention, model.hidden_size
    if a.kind == "mla":
        q_width, kv_a_width = a.num_heads * a.qk_head_dim, a.kv_lora_rank + a.qk_rope_head_dim
        down: tuple[Projection, ...] = (
            ((a.q_lora_rank + kv_a_width, h, ""), (q_width, a.q_lora_rank, "n"))
            if a.q_lora_rank
            else ((kv_a_width, h, ""), (q_width, h, "n"))
        )
        return (
            *down,
            kv_up_projection(model),
            (h, a.num_heads * a.v_head_dim, "k"),
            *indexer_projections(model),
        )
    q_heads = 2 * a.num_heads if a.output_gate else a.num_heads  # the gate comes with q
    return (
        ((q_heads + 2 * a.num_kv_heads) * a.head_dim, h, "n"),
        (h, a.num_heads * a.head_dim, "k"),
        *indexer_projections(model),
    )


def linear_projections(model: ModelSpec) -> tuple[Projection, ...]:
    """The GEMMs of one Gated DeltaNet layer: the input projections (q, k, v, z and the beta and
    alpha gates) column-parallel over the heads and the output projection row-parallel (vLLM
    ``Qwen3NextGatedDeltaNet``: ``in_proj_qkvz`` and ``in_proj_ba`` column-parallel,
    ``out_proj`` row-parallel); none without linear layers of their own shape."""
    a, h = model.attention, model.hidden_size
    if not a.has_linear_mixer:
        return ()
    keys = a.linear_key_heads * a.linear_key_head_dim
    values = a.linear_value_heads * a.linear_value_head_dim
    return ((2 * keys + 2 * values + 2 * a.linear_value_heads, h, "n"), (h, values, "k"))


def indexer_projections(model: ModelSpec) -> tuple[Projection, ...]:
    """A DSA indexer's GEMMs, replicated on every rank: ``wq_b`` from the query latent (the
    hidden state without one) and ``wk`` with ``weights_proj`` on the hidden state
    (DeepSeek-V3.2-Exp ``inference/model.py`` ``Indexer``); none without an indexer."""
    a, h = model.attention, model.hidden_size
    if not a.indexer_heads:
        return ()
    return (
        (a.indexer_heads * a.indexer_head_dim, a.q_lora_rank or h, ""),
        (a.indexer_head_dim + a.indexer_heads, h, ""),
    )


def kv_up_projection(model: ModelSpec) -> Projection:
    """MLA's ``kv_b_proj``: the latent up to every head's no-RoPE key and value. Absorbed decode
    (DeepSeek-V2 sec. 2.1.2) runs it as two batched GEMMs per head instead, the queries into the
    latent through W_UK and the attention output out of it through W_UV, on the same weights."""
    a = model.attention
    return (a.num_heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank, "n")


def ffn_projections(model: ModelSpec, width: int) -> tuple[Projection, ...]:
    """The GEMMs of one FFN of inner ``width``: the fused gate/up projection column-parallel and
    the down projection row-parallel (Megatron-LM)."""
    h = model.hidden_size
    return ((int(_gated(model)) * width, h, "n"), (h, width, "k"))


def router_projections(model: ModelSpec) -> tuple[Projection, ...]:
    """The router of an MoE block: one GEMM of the hidden state onto the routed experts' logits
    (and a shared-expert gate where the model has one), replicated on every rank and run in the
    activation dtype: the engines do not quantize it (SGLang ``MoEGate`` holds a plain weight;
    vLLM's gate is a ``ReplicatedLinear`` without a quantization config)."""
    assert model.moe is not None
    return ((model.router_parameters() // model.hidden_size, model.hidden_size, ""),)


def _gated(model: ModelSpec) -> float:
    return 2.0 if model.ffn_activation == "swiglu" else 1.0


def ffn_block_bytes(model: ModelSpec, width, *, act: float, cast: float) -> np.ndarray:
    """Memory passes of one FFN (dense, or a token's shared experts) of inner ``width`` per token:
    gate/up output written and read by the activation, which writes the down projection's input
    in the GEMM dtype; the down projection's output written."""
    width = np.asarray(width, dtype=np.float64)
    up = _gated(model) * width
    return 2.0 * up * act + width * cast + model.hidden_size * act


def attention_side_bytes(
    model: ModelSpec, *, decode: bool, act: float, cast: float, shard
) -> np.ndarray:
    """Memory passes of one attention block per token on one attention rank (heads split over
    ``shard``): the pre-norm (fused with the cast), MLA's low-rank latents and their norms,
    queries, keys and values (MLA prefill re-expands keys and values per head through
    ``kv_b_proj``; MLA decode works on the absorbed latent, DeepSeek-V2 sec. 2.1.2), the
    attention output and its cast, and the output projection plus residual add (4 vectors)."""
    a, h = model.attention, model.hidden_size
    shard = np.asarray(shard, dtype=np.float64)
    quant = 1.0 if cast < act else 0.0
    low_rank = 0.0
    if a.kind == "mla":
        latents = a.q_lora_rank + a.kv_lora_rank
        low_rank = 2.0 * (latents + a.qk_rope_head_dim) * act + latents * cast
    queries, output = a.num_heads * a.qk_head_dim / shard, a.num_heads * a.value_head_dim / shard
    if a.kind == "mla" and decode:  # queries absorbed into, and outputs read back from, the latent
        keys_values = a.num_heads * (2 * a.kv_lora_rank + a.qk_rope_head_dim) / shard
    else:
        heads = a.num_heads if a.kind == "mla" else a.num_kv_heads
        split = shard if a.kind == "mla" else kv_head_split(model, shard)
        keys_values = heads * (a.qk_head_dim + a.value_head_dim) / split
    per_head = 2.0 * (queries + keys_values) * act + output * (act + quant * (act + cast))
    return h * (act + cast) + low_rank + per_head + 4.0 * h * act


def routed_bytes_per_assignment(model: ModelSpec, *, act: float, cast: float, etp) -> np.ndarray:
    """Memory passes of one token copy on the expert rank that computes it: the dispatched copy
    written by the all-to-all, permuted into the grouped GEMM's contiguous layout (read, write;
    DeepGEMM contiguous layout), the expert FFN (its inner width split over ``etp``), and the
    output un-permuted and weighted into the combine buffer (read, write)."""
    moe, h = model.moe, model.hidden_size
    assert moe is not None
    width = moe.expert_ffn_hidden_size / np.asarray(etp, dtype=np.float64)
    return 3.0 * h * cast + ffn_block_bytes(model, width, act=act, cast=cast) + 2.0 * h * act


def moe_token_bytes(model: ModelSpec, *, act: float, cast: float, shard) -> np.ndarray:
    """Memory passes of one MoE block per token on its attention rank: the pre-norm (fused with
    the cast for the dispatch), the shared experts (split over ``shard``), the ``top_k``
    combined copies written by the all-to-all and read by the weighted reduction, and the
    residual add of the routed and shared outputs (4 vectors)."""
    moe, h = model.moe, model.hidden_size
    assert moe is not None
    shared = moe.num_shared_experts * moe.shared_ffn_size / np.asarray(shard, dtype=np.float64)
    shared_bytes = np.where(shared > 0, ffn_block_bytes(model, shared, act=act, cast=cast), 0.0)
    return (
        h * (act + cast)
        + shared_bytes
        + moe_combine_bytes(model, act=act)
        + h * act
        + 4.0 * h * act
    )


def moe_combine_bytes(model: ModelSpec, *, act: float) -> float:
    """The ``top_k`` expert outputs of one token written to the combine buffer and read by the
    weighted reduction (``moe_token_bytes``' share that a fused MoE op keeps inside its kernel:
    FlashInfer's TRT-LLM MoE finalizes into the layer's output, SGLang
    ``layers/moe/moe_runner/flashinfer_trtllm.py``, read in 0.5.23)."""
    moe = model.moe
    assert moe is not None
    return 2.0 * moe.top_k * model.hidden_size * act


def dense_ffn_side_bytes(model: ModelSpec, width, *, act: float, cast: float) -> np.ndarray:
    """Memory passes of a dense FFN block per token: pre-norm with cast, the FFN, residual add."""
    h = model.hidden_size
    return h * (act + cast) + ffn_block_bytes(model, width, act=act, cast=cast) + 4.0 * h * act


def prefix_expansion_bytes(model: ModelSpec, *, act: float, shard) -> np.ndarray:
    """Explicit-form MLA prefill writes, then attention reads, each cached prefix token's per-head
    keys and values re-expanded from its latent (``prefix_upprojection_flops_per_token``); other
    attention kinds read their cached keys and values as they are."""
    a = model.attention
    if a.kind != "mla":
        return np.zeros_like(np.asarray(shard, dtype=np.float64))
    return (
        2.0
        * a.num_heads
        * (a.qk_head_dim + a.value_head_dim)
        * act
        / np.asarray(shard, dtype=np.float64)
    )
