"""Balanced expert placement with replicas (pure, torch-free)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoparallel._expert_placement import (
    balanced_placement,
    contiguous_placement,
    expert_load_per_rank,
    load_imbalance,
    placement_moves,
    rank_experts,
    zipf_expert_load,
)
from autoparallel.plan import ExpertPlacement


def _check_shape(placement: ExpertPlacement, *, num_experts: int, ep: int, redundant: int) -> None:
    held = rank_experts(placement)
    assert len(held) == ep
    assert all(len(experts) == (num_experts + redundant) // ep for experts in held)
    assert all(len(set(experts)) == len(experts) for experts in held)  # no expert twice on a rank
    assert all(len(ranks) >= 1 for ranks in placement.expert_to_ranks)
    assert sum(len(ranks) for ranks in placement.expert_to_ranks) == num_experts + redundant
    assert placement.slots_per_rank == (num_experts + redundant) // ep


def test_contiguous_is_the_default_layout() -> None:
    placement = contiguous_placement(num_experts=8, ep=4)
    assert rank_experts(placement) == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert load_imbalance(placement=placement, expert_load=np.ones(8)) == pytest.approx(1.0)


def test_zipf_skew_is_balanced_with_replicas() -> None:
    load = zipf_expert_load(num_experts=8, exponent=1.2)
    before = contiguous_placement(num_experts=8, ep=4)
    after = balanced_placement(expert_load=load, ep=4, num_redundant_experts=4)
    _check_shape(after, num_experts=8, ep=4, redundant=4)
    assert load_imbalance(placement=before, expert_load=load) > 1.8
    assert load_imbalance(placement=after, expert_load=load) <= 1.05
    hottest = int(np.argmax(load))
    assert len(after.expert_to_ranks[hottest]) > 1  # the hot expert is replicated


def test_per_rank_load_splits_a_replicated_expert_evenly() -> None:
    placement = ExpertPlacement(
        num_experts=2, ep=2, expert_to_ranks=((0, 1), (1,)), num_redundant_experts=1
    )
    assert expert_load_per_rank(placement=placement, expert_load=[10.0, 4.0]).tolist() == [5.0, 9.0]


def test_layers_are_summed() -> None:
    per_layer = np.array([[4.0, 0, 0, 0], [4.0, 0, 0, 0]])
    placement = balanced_placement(expert_load=per_layer, ep=2, num_redundant_experts=0)
    assert load_imbalance(placement=placement, expert_load=per_layer) == pytest.approx(2.0)


def test_hierarchical_keeps_replicas_inside_a_node() -> None:
    load = zipf_expert_load(num_experts=64, exponent=0.6, seed=3)
    placement = balanced_placement(
        expert_load=load, ep=16, num_redundant_experts=16, ranks_per_node=4
    )
    _check_shape(placement, num_experts=64, ep=16, redundant=16)
    nodes = [{rank // 4 for rank in ranks} for ranks in placement.expert_to_ranks]
    assert all(len(node_set) == 1 for node_set in nodes)
    assert load_imbalance(placement=placement, expert_load=load) <= 1.1


def test_expert_hotter_than_a_node_falls_back_to_flat() -> None:
    load = np.ones(32)
    load[0] = 40.0  # more than a node's share: only cross-node replicas can balance it
    nested_only = balanced_placement(
        expert_load=load, ep=8, num_redundant_experts=8, ranks_per_node=2
    )
    flat = balanced_placement(expert_load=load, ep=8, num_redundant_experts=8)
    assert load_imbalance(placement=nested_only, expert_load=load) == pytest.approx(
        load_imbalance(placement=flat, expert_load=load)
    )
    assert len({rank // 2 for rank in nested_only.expert_to_ranks[0]}) > 1


def test_reference_scale_is_fast_and_balanced() -> None:
    load = zipf_expert_load(num_experts=768, exponent=1.0, seed=0)
    placement = balanced_placement(
        expert_load=load, ep=64, num_redundant_experts=64, ranks_per_node=8
    )
    _check_shape(placement, num_experts=768, ep=64, redundant=64)
    assert (
        load_imbalance(placement=contiguous_placement(num_experts=768, ep=64), expert_load=load) > 5
    )
    assert load_imbalance(placement=placement, expert_load=load) <= 1.05


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"expert_load": np.ones(8), "ep": 3}, "num_experts + num_redundant_experts (8)"),
        (
            {"expert_load": np.ones(8), "ep": 4, "num_redundant_experts": -4},
            "num_redundant_experts (-4)",
        ),
        (
            {"expert_load": np.ones(8), "ep": 4, "ranks_per_node": 3},
            "ep (4) must be divisible by ranks_per_node (3)",
        ),
        ({"expert_load": np.ones(4), "ep": 2, "num_redundant_experts": 8}, "slots per rank"),
        ({"expert_load": -np.ones(4), "ep": 2}, "expert_load"),
        ({"expert_load": np.ones((2, 2, 2)), "ep": 2}, "expert_load"),
    ],
)
def test_bad_input_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(
        ValueError, match=field.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")
    ):
        balanced_placement(**kwargs)


def test_moves_only_copy_what_is_missing_and_come_from_holders() -> None:
    old = contiguous_placement(num_experts=8, ep=4)
    new = balanced_placement(
        expert_load=zipf_expert_load(num_experts=8, exponent=1.2), ep=4, num_redundant_experts=4
    )
    moves = placement_moves(old=old, new=new)
    for move in moves:
        assert move.source_rank in old.expert_to_ranks[move.expert]
        assert move.target_rank in new.expert_to_ranks[move.expert]
        assert move.target_rank not in old.expert_to_ranks[move.expert]
    added = sum(len(set(n) - set(o)) for o, n in zip(old.expert_to_ranks, new.expert_to_ranks))
    assert len(moves) == added
    assert placement_moves(old=new, new=new) == ()


def test_moves_reject_mismatched_placements() -> None:
    with pytest.raises(ValueError, match="num_experts, ep"):
        placement_moves(
            old=contiguous_placement(num_experts=8, ep=4),
            new=contiguous_placement(num_experts=8, ep=2),
        )


@settings(max_examples=60, deadline=None)
@given(
    ep_log=st.integers(min_value=0, max_value=4),
    experts_per_rank=st.integers(min_value=1, max_value=6),
    redundant_per_rank=st.integers(min_value=0, max_value=3),
    nodes_log=st.integers(min_value=0, max_value=2),
    exponent=st.floats(min_value=0.0, max_value=2.0),
    seed=st.integers(min_value=0, max_value=1000),
)
def test_property_placement_is_legal_and_never_worse(
    ep_log: int,
    experts_per_rank: int,
    redundant_per_rank: int,
    nodes_log: int,
    exponent: float,
    seed: int,
) -> None:
    ep = 2**ep_log
    num_experts = ep * experts_per_rank
    redundant = ep * min(
        redundant_per_rank, num_experts - experts_per_rank
    )  # <= num_experts slots per rank
    ranks_per_node = max(1, ep // 2**nodes_log)
    load = zipf_expert_load(num_experts=num_experts, exponent=exponent, seed=seed)
    placement = balanced_placement(
        expert_load=load, ep=ep, num_redundant_experts=redundant, ranks_per_node=ranks_per_node
    )
    _check_shape(placement, num_experts=num_experts, ep=ep, redundant=redundant)
    baseline = load_imbalance(
        placement=contiguous_placement(num_experts=num_experts, ep=ep), expert_load=load
    )
    # Greedy packing is at most one item's load above the optimum; never much worse than contiguous.
    assert load_imbalance(placement=placement, expert_load=load) <= baseline * 1.10 + 1e-9
