"""Pipeline stages and parameters per device, vectorized over a config table.

* **Pipeline stages.** Layers held by the *first*, a *middle* and the *last* pipeline rank
  (``STAGES``), from the split rule of ``cost_model.split_layers`` (the middle chunks take the
  remainder), so uneven splits cost what they cost. Arrays of shape ``(3, n)``. With ``pp == 1``
  the three rows are the single rank; with ``pp == 2`` the middle row repeats the first.
* **Parameters per device** by part, under TP, EP/ETP (Megatron-core parallel folding) and
  attention data parallel, with the embedding on the first and the LM head on the last stage.

Every function takes arrays (or a config table, see ``cost_model._table``) and returns arrays;
nothing here loops over configs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from cost_model._model_spec import ModelSpec
from cost_model._rules import split_layers

STAGES: tuple[str, ...] = ("first", "middle", "last")


@dataclass(frozen=True)
class StageLayout:
    """Per pipeline rank (rows ``STAGES``) and config (columns): the layers it holds."""

    layers: np.ndarray  # (3, n) transformer layers on the rank
    moe_layers: np.ndarray  # (3, n) of which MoE layers
    has_embedding: np.ndarray  # (3, n) bool
    has_lm_head: np.ndarray  # (3, n) bool

    @cached_property
    def dense_layers(self) -> np.ndarray:
        return self.layers - self.moe_layers


def _int(table: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    return np.asarray(table[name], dtype=np.int64)


def stage_layout(
    *,
    model: ModelSpec,
    pp: np.ndarray,
    virtual_stages: np.ndarray,
    layer_weights: tuple | None = None,
) -> StageLayout:
    """Layers per pipeline rank: the first, the fullest middle and the last rank of each config.

    Chunks follow ``split_layers`` over ``pp * virtual_stages`` chunks; rank r of an interleaved
    schedule holds chunks r, r + pp, ... (Megatron-LM's virtual pipeline order); the leading
    dense layers of an MoE model are the first layers, so they fill rank 0 and spill into the
    next ranks; interleaved dense layers (``MoESpec.moe_layer_step``) fall where they are. The middle row is the middle rank that holds the most: the one with the largest
    ``dense_weight * dense_layers + moe_weight * moe_layers`` (``layer_weights``, parameters of
    one dense and one MoE layer per device, shape (n,) or scalars; default: whole layers), so a
    rank whose dense layers spilled over is not taken for the rank full of MoE layers. With
    ``pp`` <= 2 the middle row repeats the first.
    """
    pp = np.asarray(pp, dtype=np.int64)
    v = np.broadcast_to(np.asarray(virtual_stages, dtype=np.int64), pp.shape)
    key = pp * 4096 + v
    distinct, inverse = np.unique(key, return_inverse=True)
    rows = [
        _rank_rows(model.dense_ffn_layer_mask(), int(k) // 4096, int(k) % 4096) for k in distinct
    ]
    width = max(len(row[1]) for row in rows)
    ends = np.array([[row[0][0], row[0][1], row[2][0], row[2][1]] for row in rows], dtype=np.int64)[
        inverse.reshape(-1)
    ]
    padded = [list(row[1]) + [row[1][-1]] * (width - len(row[1])) for row in rows]
    middle = np.array(padded, dtype=np.int64)[
        inverse.reshape(-1)
    ]  # (n, width, 2) of (layers, dense)
    dense_weight, moe_weight = (
        layer_weights if layer_weights is not None else _whole_layer_weights(model)
    )
    dense_weight = np.broadcast_to(np.asarray(dense_weight, dtype=np.float64), pp.shape).reshape(
        -1, 1
    )
    moe_weight = np.broadcast_to(np.asarray(moe_weight, dtype=np.float64), pp.shape).reshape(-1, 1)
    load = (
        middle[..., 1] * dense_weight
        + (middle[..., 0] - middle[..., 1]) * moe_weight
        + middle[..., 0] * 1e-9
    )
    pick = np.take_along_axis(middle, np.argmax(load, axis=1)[:, None, None], axis=1)[:, 0]
    shape = pp.shape
    layers = np.stack([ends[:, 0], pick[:, 0], ends[:, 2]]).reshape((3, *shape))
    dense = np.stack([ends[:, 1], pick[:, 1], ends[:, 3]]).reshape((3, *shape))
    has_embedding = np.stack([np.ones(shape, dtype=bool), pp <= 2, pp == 1])
    has_lm_head = np.stack([pp == 1, pp == 1, np.ones(shape, dtype=bool)])
    return StageLayout(
        layers=layers,
        moe_layers=layers - dense,
        has_embedding=has_embedding,
        has_lm_head=has_lm_head,
    )


def _whole_layer_weights(model: ModelSpec) -> tuple[float, float]:
    """Parameters of one dense and one MoE layer, unsharded."""
    common = model.attention_parameters() + model.layer_norm_parameters()
    dense = common + model.ffn_parameters(model.ffn_hidden_size)
    moe = model.moe
    if moe is None:
        return float(dense), float(dense)
    experts = moe.num_routed_experts * model.ffn_parameters(moe.expert_ffn_hidden_size)
    shared = moe.num_shared_experts * model.ffn_parameters(moe.shared_ffn_size)
    return float(dense), float(common + experts + shared + model.router_parameters())


def _chunk_sizes(num_layers: int, num_chunks: int) -> list[int]:
    """``split_layers`` chunk sizes; more chunks than layers leaves empty chunks (an illegal
    config the caller reports, priced rather than raised here)."""
    if 1 <= num_chunks <= num_layers:
        return [stop - start for start, stop in split_layers(num_layers, num_chunks)]
    base, extra = divmod(num_layers, num_chunks)
    sizes = [base] * num_chunks
    order = sorted(
        range(num_chunks), key=lambda i: (i in (0, num_chunks - 1), abs(i - (num_chunks - 1) / 2))
    )
    for index in order[:extra]:
        sizes[index] += 1
    return sizes


@lru_cache(maxsize=4096)
def _rank_rows(dense_mask: tuple[bool, ...], pp: int, v: int) -> tuple:
    """((layers, dense) of rank 0, the distinct (layers, dense) of the middle ranks, of the
    last rank) for one (pp, virtual_stages); ``dense_mask``: per layer, whether its FFN is
    dense."""
    pp, v = max(pp, 1), max(v, 1)
    sizes = _chunk_sizes(len(dense_mask), pp * v)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    flags = np.asarray(dense_mask, dtype=np.int64)
    dense = np.array([flags[a : a + n].sum() for a, n in zip(starts, sizes, strict=True)])
    per_rank = [(int(sum(sizes[r::pp])), int(dense[r::pp].sum())) for r in range(pp)]
    middle = sorted(set(per_rank[1:-1])) if pp >= 3 else [per_rank[0]]
    return per_rank[0], tuple(middle), per_rank[-1]


def attention_replicated_parameters(model: ModelSpec) -> int:
    """Attention weights tensor parallel keeps whole on every rank: MLA's down-projections
    (``q_a_proj``, ``kv_a_proj_with_mqa``) and their norms produce the latent all heads read
    (Megatron-core MLA, vLLM's ``ReplicatedLinear``, torchtitan's ``NoParallel``), and a DSA
    indexer (vLLM ``deepseek_v2.py`` ``Indexer``: ``wq_b``, ``wk`` and ``weights_proj`` are
    ``ReplicatedLinear``); 0 for MHA/GQA without an indexer."""
    a = model.attention
    h = model.hidden_size
    indexer = a.indexer_parameters(h)
    if a.kind != "mla":
        return indexer
    q = h * a.q_lora_rank + model._norm_parameters(a.q_lora_rank) if a.q_lora_rank else 0
    latent = h * (a.kv_lora_rank + a.qk_rope_head_dim) + model._norm_parameters(a.kv_lora_rank)
    return q + latent + indexer


def attention_parameters_per_device(
    *, model: ModelSpec, table: Mapping[str, np.ndarray]
) -> np.ndarray:
    """Attention weights of one layer on one device: sharded by tp (less the replicated MLA
    down-projections), whole under attention-DP."""
    shard = np.where(np.asarray(table["attention_data_parallel"], dtype=bool), 1, _int(table, "tp"))
    replicated = attention_replicated_parameters(model)
    return replicated + (model.attention_parameters() - replicated) / shard


def layer_weights_per_device(
    *, model: ModelSpec, table: Mapping[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Parameters of one dense and one MoE layer on one device (shape (n,)), the weights
    ``stage_layout`` uses to find the fullest middle rank."""
    tp, ep, etp = _int(table, "tp"), _int(table, "ep"), _int(table, "etp")
    common = (
        attention_parameters_per_device(model=model, table=table) + model.layer_norm_parameters()
    )
    dense = common + model.ffn_parameters(model.ffn_hidden_size) / tp
    moe = model.moe
    if moe is None:
        return dense, dense
    redundant = np.asarray(table.get("num_redundant_experts", 0), dtype=np.float64)
    experts = (
        (moe.num_routed_experts + redundant)
        / ep
        * model.ffn_parameters(moe.expert_ffn_hidden_size)
        / etp
    )
    dense_shard = np.where(np.asarray(table["attention_data_parallel"], dtype=bool), 1, tp)
    shared = moe.num_shared_experts * model.ffn_parameters(moe.shared_ffn_size) / dense_shard
    return dense, common + experts + shared + model.router_parameters()


def parameters_per_device(
    *, model: ModelSpec, table: Mapping[str, np.ndarray], layout: StageLayout | None = None
) -> dict[str, np.ndarray]:
    """Parameters held by one device of each stage (rows ``STAGES``), by part.

    Parts: ``attention`` (/tp, or whole under attention-DP), ``dense_ffn`` (/tp), ``routed_experts``
    (num_routed_experts/ep experts of size ffn/etp, plus the rank's share of the
    ``num_redundant_experts`` extra column, DeepSeek EPLB replicas), ``shared_experts`` (as
    attention: /tp or whole under attention-DP), ``router`` and ``norms`` (replicated),
    ``embedding`` and ``lm_head`` (vocab-parallel over tp, first/last stage; a tied head is
    counted once per stage that holds it).
    """
    tp, ep, etp = _int(table, "tp"), _int(table, "ep"), _int(table, "etp")
    if layout is None:
        layout = stage_layout(
            model=model,
            pp=_int(table, "pp"),
            virtual_stages=_int(table, "virtual_stages"),
            layer_weights=layer_weights_per_device(model=model, table=table),
        )
    attention_dp = np.asarray(table["attention_data_parallel"], dtype=bool)
    dense_shard = np.where(attention_dp, 1, tp)
    parts = {
        "attention": layout.layers * attention_parameters_per_device(model=model, table=table),
        "dense_ffn": layout.dense_layers * (model.ffn_parameters(model.ffn_hidden_size) / tp),
        "routed_experts": np.zeros(layout.layers.shape),
        "shared_experts": np.zeros(layout.layers.shape),
        "router": layout.moe_layers * float(model.router_parameters()),
        "norms": layout.layers * float(model.layer_norm_parameters())
        + layout.has_lm_head * model.final_norm_parameters(),
    }
    moe = model.moe
    if moe is not None:
        redundant = np.asarray(table.get("num_redundant_experts", 0), dtype=np.float64)
        experts_per_rank = (moe.num_routed_experts + redundant) / ep
        expert = model.ffn_parameters(moe.expert_ffn_hidden_size)
        parts["routed_experts"] = layout.moe_layers * experts_per_rank * expert / etp
        shared = moe.num_shared_experts * model.ffn_parameters(moe.shared_ffn_size)
        parts["shared_experts"] = layout.moe_layers * (shared / dense_shard)
    embedding = model.vocab_size * model.hidden_size / tp
    positions = model.embedding_parameters() - model.vocab_size * model.hidden_size
    parts["embedding"] = layout.has_embedding * (embedding + positions)
    parts["lm_head"] = (
        layout.has_lm_head
        * (model.vocab_size * model.hidden_size / tp)
        * ((~layout.has_embedding) | (not model.tie_word_embeddings))
    )
    return parts
