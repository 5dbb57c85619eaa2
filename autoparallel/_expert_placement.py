"""Balanced expert placement with replicas of hot experts (torch-free, pure).

The idea is the one DeepSeek describes for its expert-parallel load balancer (EPLB, the
"redundant experts" of the DeepSeek-V3 technical report, sec. 3.4): measure how many tokens each
routed expert receives, give the hottest experts extra copies ("replicas") so that their tokens
are split between several EP ranks, and pack the copies on ranks so that every rank receives about
the same number of tokens. It is hierarchical: experts are first packed onto nodes so that nodes
are balanced, then replicated and packed onto the ranks *inside* each node, so that the extra
all-to-all traffic a replica attracts stays on the fast intra-node fabric.

Contract shared with the runtime's dispatch: tokens routed to an expert with ``r`` replicas are
split evenly between them (round-robin over tokens), so a replica carries ``load / r``.

All functions take keyword arguments, work on integers and numpy arrays, and return the plan's
``ExpertPlacement`` or plain arrays; nothing here depends on torch or on a process group.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

import numpy as np

from autoparallel.plan import ExpertPlacement

__all__ = [
    "ExpertMove",
    "balanced_placement",
    "contiguous_placement",
    "expert_load_per_rank",
    "load_imbalance",
    "placement_moves",
    "rank_experts",
    "zipf_expert_load",
]


# A node-local placement may be this much worse (max/mean) than a flat one before the flat one
# wins: intra-node replicas keep dispatch traffic on the fast fabric, which is worth a little skew.
HIERARCHY_TOLERANCE = 0.05


class ExpertMove(NamedTuple):
    """Copy expert ``expert``'s weights from EP rank ``source_rank`` to EP rank ``target_rank``."""

    expert: int
    source_rank: int
    target_rank: int


def contiguous_placement(*, num_experts: int, ep: int) -> ExpertPlacement:
    """The default layout: rank ``r`` holds experts ``[r * n / ep, (r + 1) * n / ep)``, no replicas."""
    _check_divides("num_experts", num_experts, "ep", ep)
    per_rank = num_experts // ep
    return ExpertPlacement(
        num_experts=num_experts,
        ep=ep,
        expert_to_ranks=tuple((e // per_rank,) for e in range(num_experts)),
    )


def rank_experts(placement: ExpertPlacement) -> tuple[tuple[int, ...], ...]:
    """For each EP rank, the sorted global ids of the experts it holds (its local slots)."""
    held: list[list[int]] = [[] for _ in range(placement.ep)]
    for expert, ranks in enumerate(placement.expert_to_ranks):
        for rank in ranks:
            held[rank].append(expert)
    return tuple(tuple(sorted(experts)) for experts in held)


def _total_load(expert_load, num_experts: int | None = None) -> np.ndarray:
    """Sum a ``[num_experts]`` or ``[num_layers, num_experts]`` count array over layers."""
    load = np.asarray(expert_load, dtype=np.float64)
    if load.ndim == 2:
        load = load.sum(axis=0)
    if load.ndim != 1:
        raise ValueError(
            f"expert_load (shape {load.shape}) must be [num_experts] or [num_layers, num_experts]"
        )
    if num_experts is not None and load.shape[0] != num_experts:
        raise ValueError(
            f"expert_load (length {load.shape[0]}) must have num_experts ({num_experts}) entries"
        )
    if np.any(load < 0) or not np.all(np.isfinite(load)):
        raise ValueError("expert_load must hold finite counts >= 0")
    return load


def expert_load_per_rank(*, placement: ExpertPlacement, expert_load) -> np.ndarray:
    """Tokens each EP rank receives under ``placement``; a replicated expert's load is split evenly."""
    load = _total_load(expert_load, placement.num_experts)
    per_rank = np.zeros(placement.ep)
    for expert, ranks in enumerate(placement.expert_to_ranks):
        for rank in ranks:
            per_rank[rank] += load[expert] / len(ranks)
    return per_rank


def load_imbalance(*, placement: ExpertPlacement, expert_load) -> float:
    """max / mean of the per-rank load (1.0 is perfect balance; the slowest rank sets the pace)."""
    per_rank = expert_load_per_rank(placement=placement, expert_load=expert_load)
    mean = per_rank.mean()
    return 1.0 if mean == 0 else float(per_rank.max() / mean)


def zipf_expert_load(
    *, num_experts: int, exponent: float = 1.2, total_tokens: float = 1.0, seed: int | None = None
) -> np.ndarray:
    """Zipf-like expert popularity (rank ``i`` gets ``1 / (i + 1) ** exponent``), for tests and benchmarks.

    With ``seed`` the popularity order is a random permutation of the experts (hot experts are
    then not all on the first rank); without it expert 0 is the hottest.
    """
    weights = 1.0 / np.arange(1, num_experts + 1, dtype=np.float64) ** exponent
    if seed is not None:
        weights = weights[np.random.default_rng(seed).permutation(num_experts)]
    return total_tokens * weights / weights.sum()


def _check_divides(name: str, value: int, by_name: str, by: int) -> None:
    if by <= 0:
        raise ValueError(f"{by_name} ({by}) must be > 0")
    if value % by:
        raise ValueError(f"{name} ({value}) must be divisible by {by_name} ({by})")


def _pack(
    *, weights: np.ndarray, num_bins: int, items_per_bin: int, labels=None
) -> list[list[int]]:
    """Greedy balanced packing: heaviest item first into the lightest bin that still has room.

    Every bin ends with exactly ``items_per_bin`` items. With ``labels`` (e.g. the expert of a
    replica), a bin never receives two items with the same label while another open bin can.
    """
    assert len(weights) == num_bins * items_per_bin
    bins: list[list[int]] = [[] for _ in range(num_bins)]
    bin_labels: list[set] = [set() for _ in range(num_bins)]
    heap = [(0.0, b) for b in range(num_bins)]  # open bins by (load, index)
    for item in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        label = None if labels is None else labels[item]
        skipped = []
        while label is not None and len(heap) > 1 and label in bin_labels[heap[0][1]]:
            skipped.append(heapq.heappop(heap))
        total, target = heapq.heappop(heap)
        if (
            label is not None and label in bin_labels[target] and skipped
        ):  # every open bin has the label: take the lightest
            skipped.append((total, target))
            total, target = min(skipped)
            skipped.remove((total, target))
        bins[target].append(item)
        bin_labels[target].add(label)
        for entry in skipped:
            heapq.heappush(heap, entry)
        if len(bins[target]) < items_per_bin:
            heapq.heappush(heap, (total + weights[item], target))
    return bins


def _replicate(*, load: np.ndarray, num_slots: int, max_replicas: int) -> np.ndarray:
    """Replica counts (1 to ``max_replicas`` each, summing to ``num_slots``): each extra copy goes
    to the expert whose per-replica load ``load / count`` is currently the largest."""
    counts = np.ones(len(load), dtype=np.int64)
    heap = [(-load[e], e) for e in range(len(load))]
    heapq.heapify(heap)
    for _ in range(num_slots - len(load)):
        _, expert = heapq.heappop(heap)
        counts[expert] += 1
        if counts[expert] < max_replicas:
            heapq.heappush(heap, (-load[expert] / counts[expert], expert))
    return counts


def _place_in_node(
    *, experts: list[int], load: np.ndarray, ranks: list[int], slots_per_rank: int
) -> dict[int, list[int]]:
    """Replicate the node's experts into its slots and pack the replicas on the node's ranks."""
    counts = _replicate(
        load=load[experts], num_slots=len(ranks) * slots_per_rank, max_replicas=len(ranks)
    )
    replica_expert = [expert for expert, count in zip(experts, counts) for _ in range(count)]
    replica_load = np.array([load[e] / c for e, c in zip(experts, counts) for _ in range(c)])
    bins = _pack(
        weights=replica_load,
        num_bins=len(ranks),
        items_per_bin=slots_per_rank,
        labels=replica_expert,
    )
    held: dict[int, list[int]] = {}
    for rank, items in zip(ranks, bins):
        for item in items:
            held.setdefault(replica_expert[item], []).append(rank)
    return held


def balanced_placement(
    *,
    expert_load,
    ep: int,
    num_redundant_experts: int = 0,
    ranks_per_node: int | None = None,
) -> ExpertPlacement:
    """EPLB-style placement of ``len(expert_load)`` experts on ``ep`` ranks with replicas.

    Args:
        expert_load: tokens routed to each expert, ``[num_experts]`` or ``[num_layers, num_experts]``
            (summed over layers: the plan holds one placement for every MoE layer).
        ep: expert-parallel degree.
        num_redundant_experts: extra expert copies in total; ``num_experts + num_redundant_experts``
            must divide by ``ep`` (every rank holds the same number of slots).
        ranks_per_node: EP ranks that share a node (default: all ``ep``, one node). Experts are
            first packed onto the ``ep / ranks_per_node`` nodes so that nodes are balanced, then
            replicated and packed inside each node; every replica of an expert stays in its node.
            An expert hotter than a node's fair share cannot be balanced that way: when the
            hierarchical result is more than ``HIERARCHY_TOLERANCE`` worse (max/mean) than one
            flat placement over all ranks, the flat one is returned.

    Returns:
        An ``ExpertPlacement`` whose ``expert_to_ranks[e]`` lists the ranks holding ``e``.
    """
    load = _total_load(expert_load)
    num_experts = len(load)
    ranks_per_node = ep if ranks_per_node is None else ranks_per_node
    if num_redundant_experts < 0:
        raise ValueError(f"num_redundant_experts ({num_redundant_experts}) must be >= 0")
    _check_divides(
        "num_experts + num_redundant_experts", num_experts + num_redundant_experts, "ep", ep
    )
    _check_divides("ep", ep, "ranks_per_node", ranks_per_node)
    slots_per_rank = (num_experts + num_redundant_experts) // ep
    if slots_per_rank > num_experts:
        raise ValueError(
            f"slots per rank ((num_experts + num_redundant_experts) / ep = {slots_per_rank}) must be <= "
            f"num_experts ({num_experts}); a rank would hold one expert twice"
        )
    flat = _hierarchical(
        load=load, ep=ep, num_redundant_experts=num_redundant_experts, ranks_per_node=ep
    )
    num_nodes = ep // ranks_per_node
    if num_nodes == 1 or num_experts % num_nodes or slots_per_rank > num_experts // num_nodes:
        return (
            flat  # the node-local scheme needs whole experts per node and distinct slots per rank
        )
    nested = _hierarchical(
        load=load, ep=ep, num_redundant_experts=num_redundant_experts, ranks_per_node=ranks_per_node
    )
    nested_imbalance = load_imbalance(placement=nested, expert_load=load)
    if nested_imbalance > load_imbalance(placement=flat, expert_load=load) * (
        1.0 + HIERARCHY_TOLERANCE
    ):
        return flat
    return nested


def _hierarchical(
    *, load: np.ndarray, ep: int, num_redundant_experts: int, ranks_per_node: int
) -> ExpertPlacement:
    """Pack experts on nodes, then replicate and pack replicas on the ranks of each node."""
    num_experts = len(load)
    num_nodes = ep // ranks_per_node
    slots_per_rank = (num_experts + num_redundant_experts) // ep
    node_experts = _pack(weights=load, num_bins=num_nodes, items_per_bin=num_experts // num_nodes)
    held: dict[int, list[int]] = {}
    for node, experts in enumerate(node_experts):
        ranks = list(range(node * ranks_per_node, (node + 1) * ranks_per_node))
        held.update(
            _place_in_node(
                experts=sorted(experts), load=load, ranks=ranks, slots_per_rank=slots_per_rank
            )
        )
    return ExpertPlacement(
        num_experts=num_experts,
        ep=ep,
        expert_to_ranks=tuple(tuple(sorted(held[e])) for e in range(num_experts)),
        num_redundant_experts=num_redundant_experts,
    )


def placement_moves(
    *, old: ExpertPlacement, new: ExpertPlacement, ranks_per_node: int | None = None
) -> tuple[ExpertMove, ...]:
    """Weight copies that turn ``old`` into ``new``: one per (expert, rank) that ``new`` adds.

    The source is a rank that holds the expert under ``old``: the target itself never appears
    (nothing moves), then a rank on the target's node, then the holder that sends least so far —
    spreading the sends over the holders of a hot expert.
    """
    if (old.num_experts, old.ep) != (new.num_experts, new.ep):
        raise ValueError(
            f"placements differ in (num_experts, ep): old ({old.num_experts}, {old.ep}), new ({new.num_experts}, {new.ep})"
        )
    ranks_per_node = old.ep if ranks_per_node is None else ranks_per_node
    sends = np.zeros(old.ep, dtype=np.int64)
    moves = []
    for expert in range(new.num_experts):
        holders = old.expert_to_ranks[expert]
        for target in new.expert_to_ranks[expert]:
            if target in holders:
                continue
            source = min(
                holders,
                key=lambda r: (r // ranks_per_node != target // ranks_per_node, sends[r], r),
            )
            sends[source] += 1
            moves.append(ExpertMove(expert=expert, source_rank=source, target_rank=target))
    return tuple(moves)
