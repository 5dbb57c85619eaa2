"""Legality rules of a parallel layout, as pure functions of integers.

Shared by ``ParallelConfig.validate_for``, the search space and the runtime adapter, so that
what the search proposes is exactly what the runtime accepts. Each rule raises ``ValueError``
naming the field, its value and the constraint (torchtitan's wording). ``illegal_rows`` applies
the same rules to the columns of a config table, which ``estimate_table`` checks before pricing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from cost_model._table import SCHEDULE_CODES, table_row

if TYPE_CHECKING:
    from cost_model._model_spec import ModelSpec
    from cost_model._parallel import ParallelConfig


def _divides(name: str, value: int, by_name: str, by: int) -> None:
    if value % by:
        raise ValueError(f"{name} ({value}) must be divisible by {by_name} ({by})")


def check_parallel_config(
    config: ParallelConfig,
    model: ModelSpec,
    world_size: int | None = None,
    *,
    num_redundant_experts: int | None = 0,
    empty_chunks: bool = False,
) -> None:
    """Raise ``ValueError`` for the first rule ``config`` breaks for ``model`` on ``world_size``.

    ``num_redundant_experts``: extra routed-expert slots spread over the ep ranks (DeepSeek EPLB);
    ``ep`` must divide ``num_routed_experts + num_redundant_experts`` (0, the default: training
    and a layout without replicas). ``None`` = not fixed yet (the serving search): any ep is
    legal, since ``minimum_redundant_experts`` slots make the per-rank count whole.
    ``empty_chunks``: more pipeline chunks than layers is legal (a published Megatron layout
    that counts the embedding and the loss as pipeline layers,
    ``--account-for-embedding-in-pipeline-split``; the cost model prices the empty chunks).
    """
    if world_size is not None and config.world_size != world_size:
        raise ValueError(
            f"dp*cp*tp*pp ({config.dp}*{config.cp}*{config.tp}*{config.pp} = {config.world_size}) "
            f"must equal world_size ({world_size})"
        )
    attention = model.attention
    if not config.attention_data_parallel:
        _divides("num_attention_heads", attention.num_heads, "tp", config.tp)
        if attention.has_linear_mixer:
            # Gated DeltaNet shards its key heads too (vLLM Qwen3NextGatedDeltaNet); Mamba-2's
            # B/C groups are copied where tp exceeds them (vLLM MambaMixer2), its heads split
            if attention.linear_kind == "gated_deltanet":
                _divides("linear_num_key_heads", attention.linear_key_heads, "tp", config.tp)
            _divides("linear_num_value_heads", attention.linear_value_heads, "tp", config.tp)
        kv_heads = attention.num_kv_heads
        if attention.kind == "gqa" and kv_heads % config.tp and config.tp % kv_heads:
            raise ValueError(
                f"num_key_value_heads ({kv_heads}) must be divisible by tp ({config.tp}) "
                f"or tp a multiple of it (KV heads are then replicated)"
            )
    if model.num_dense_ffn_layers:
        _divides("ffn_hidden_size", model.ffn_hidden_size, "tp", config.tp)
    if config.sequence_parallel and config.tp == 1:
        raise ValueError("sequence_parallel (True) requires tp > 1 (tp is 1)")
    _check_pipeline(config, model, empty_chunks=empty_chunks)
    _check_experts(config, model, num_redundant_experts)


def illegal_rows(
    table: Mapping[str, np.ndarray], model: ModelSpec, *, expert_slots_fixed: bool
) -> np.ndarray:
    """Mask of the rows of a config table (``cost_model._table``) that ``check_parallel_config``
    rejects, the same rules over columns (more pipeline chunks than layers allowed:
    ``empty_chunks``): a table of many layouts is checked at numpy speed.
    ``expert_slots_fixed``: ``ep`` must divide the routed experts (training; ``False``: any ep,
    redundant slots making the per-rank count whole, as for serving)."""
    col = {name: np.asarray(table[name]) for name in ("dp", "cp", "tp", "pp", "ep", "etp")}
    tp, ep, etp = col["tp"], col["ep"], col["etp"]
    degrees = np.stack(list(col.values()))
    vs = np.asarray(table["virtual_stages"])
    bad = (degrees < 1).any(axis=0) | (vs < 1) | (np.asarray(table["micro_batch_size"]) < 1)
    tp = np.maximum(tp, 1)
    attention = model.attention
    heads = attention.num_heads % tp != 0
    if attention.has_linear_mixer:
        if attention.linear_kind == "gated_deltanet":
            heads |= attention.linear_key_heads % tp != 0
        heads |= attention.linear_value_heads % tp != 0
    if attention.kind == "gqa":
        heads |= (attention.num_kv_heads % tp != 0) & (tp % attention.num_kv_heads != 0)
    bad |= heads & ~np.asarray(table["attention_data_parallel"], dtype=bool)
    if model.num_dense_ffn_layers:
        bad |= model.ffn_hidden_size % tp != 0
    bad |= np.asarray(table["sequence_parallel"], dtype=bool) & (tp == 1)
    pp = col["pp"]
    interleaved = np.asarray(table["pipeline_schedule"]) == SCHEDULE_CODES["interleaved_1f1b"]
    bad |= np.where(interleaved, (vs < 2) | (pp < 2), vs != 1)
    moe = model.moe
    if moe is None:
        return bad | (ep > 1) | (etp > 1)
    experts = np.maximum(ep, 1) * np.maximum(etp, 1)
    if expert_slots_fixed:
        bad |= moe.num_routed_experts % np.maximum(ep, 1) != 0
    bad |= (col["dp"] * col["cp"] * tp) % experts != 0
    return bad | (moe.expert_ffn_hidden_size % np.maximum(etp, 1) != 0)


def check_table(
    table: Mapping[str, np.ndarray], model: ModelSpec, *, expert_slots_fixed: bool
) -> None:
    """Raise ``ValueError`` naming the first row of ``table`` that ``check_parallel_config``
    rejects, with that rule's message (``illegal_rows``)."""
    rows = np.flatnonzero(illegal_rows(table, model, expert_slots_fixed=expert_slots_fixed))
    if rows.size == 0:
        return
    first = int(rows[0])
    rule = row_rule_broken(table, first, model, expert_slots_fixed=expert_slots_fixed)
    raise ValueError(f"table row {first} ({rows.size} illegal rows): {rule or 'a layout rule'}")


def row_rule_broken(
    table: Mapping[str, np.ndarray], row: int, model: ModelSpec, *, expert_slots_fixed: bool
) -> str | None:
    """The message of the rule row ``row`` of ``table`` breaks (``check_parallel_config`` on that
    row, more pipeline chunks than layers allowed), None where it breaks none."""
    try:
        check_parallel_config(
            table_row(table, row),
            model,
            num_redundant_experts=0 if expert_slots_fixed else None,
            empty_chunks=True,
        )
    except ValueError as error:
        return str(error)
    return None


def _check_pipeline(config: ParallelConfig, model: ModelSpec, *, empty_chunks: bool) -> None:
    chunks = config.pp * config.virtual_stages
    if chunks > model.num_layers and not empty_chunks:
        raise ValueError(
            f"pp*virtual_stages ({config.pp}*{config.virtual_stages} = {chunks}) must be <= "
            f"num_layers ({model.num_layers})"
        )
    if config.pipeline_schedule == "interleaved_1f1b":
        if config.virtual_stages < 2:
            raise ValueError(
                f"virtual_stages ({config.virtual_stages}) must be >= 2 for pipeline_schedule 'interleaved_1f1b'"
            )
        if config.pp < 2:
            raise ValueError(
                f"pp ({config.pp}) must be >= 2 for pipeline_schedule 'interleaved_1f1b'"
            )
    elif config.virtual_stages != 1:
        raise ValueError(
            f"virtual_stages ({config.virtual_stages}) must be 1 for pipeline_schedule "
            f"{config.pipeline_schedule!r}; use 'interleaved_1f1b'"
        )


def minimum_redundant_experts(*, num_experts: int, ep: int) -> int:
    """Fewest extra expert slots that give every one of ``ep`` ranks the same whole number of
    slots: 256 experts over EP 72 need 32 (4 slots each, DeepSeek's 256 + 32 redundant)."""
    return -num_experts % ep


def _check_experts(
    config: ParallelConfig, model: ModelSpec, num_redundant_experts: int | None
) -> None:
    moe = model.moe
    if moe is None:
        if config.ep > 1 or config.etp > 1:
            raise ValueError(f"ep ({config.ep}) and etp ({config.etp}) must be 1 for a dense model")
        return
    if num_redundant_experts is not None and num_redundant_experts < 0:
        raise ValueError(f"num_redundant_experts ({num_redundant_experts}) must be >= 0")
    if num_redundant_experts == 0:
        _divides("num_routed_experts", moe.num_routed_experts, "ep", config.ep)
    elif num_redundant_experts is not None:
        slots = moe.num_routed_experts + num_redundant_experts
        _divides("num_routed_experts + num_redundant_experts", slots, "ep", config.ep)
    stage_ranks = config.dp * config.cp * config.tp
    _divides("dp*cp*tp", stage_ranks, "ep*etp", config.ep * config.etp)
    _divides("moe_intermediate_size", moe.expert_ffn_hidden_size, "etp", config.etp)


def check_sequence_fits(config: ParallelConfig, sequence_length_tokens: int) -> None:
    """Context parallel splits each sequence in 2*cp chunks (load-balanced causal ring)."""
    if config.cp > 1:
        _divides("sequence_length_tokens", sequence_length_tokens, "2*cp", 2 * config.cp)
    if config.sequence_parallel:
        _divides("sequence_length_tokens/cp", sequence_length_tokens // config.cp, "tp", config.tp)


def split_layers(num_layers: int, num_chunks: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, stop)`` layer ranges for ``num_chunks`` pipeline chunks, as even as
    possible; the remainder goes to the middle chunks, since the first and last also hold the
    embedding and the LM head."""
    if not 1 <= num_chunks <= num_layers:
        raise ValueError(
            f"num_chunks ({num_chunks}) must be between 1 and num_layers ({num_layers})"
        )
    base, extra = divmod(num_layers, num_chunks)
    sizes = [base] * num_chunks
    order = sorted(
        range(num_chunks), key=lambda i: (i in (0, num_chunks - 1), abs(i - (num_chunks - 1) / 2))
    )
    for index in order[:extra]:
        sizes[index] += 1
    ranges, start = [], 0
    for size in sizes:
        ranges.append((start, start + size))
        start += size
    return ranges
