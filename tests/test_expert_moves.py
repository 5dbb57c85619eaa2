"""Which EP rank sends an expert's weights when a re-placement copies it.

The rule (``placement_moves``): the sender holds the expert under the old placement; among the
holders it prefers one on the target's node, then the one that has sent fewest copies so far
(counted over all experts of the re-placement), then the lowest rank. Each case below is worked
out by hand so that a rule without the node preference, without the running count, or with a
per-expert count gives other moves. The last test runs the live re-placement on gloo ranks with
every replica filled with a value naming its rank, so the value a rank receives names its sender.
"""

from __future__ import annotations

import pytest

from autoparallel._expert_placement import ExpertMove, placement_moves, rank_experts
from autoparallel.plan import ExpertPlacement


def _placement(expert_to_ranks: tuple[tuple[int, ...], ...], *, ep: int) -> ExpertPlacement:
    num_experts = len(expert_to_ranks)
    slots = sum(len(ranks) for ranks in expert_to_ranks)
    placement = ExpertPlacement(
        num_experts=num_experts,
        ep=ep,
        expert_to_ranks=expert_to_ranks,
        num_redundant_experts=slots - num_experts,
    )
    held = rank_experts(placement)
    assert all(len(experts) == placement.slots_per_rank for experts in held), (
        held
    )  # a legal placement
    return placement


def _moves(*triples: tuple[int, int, int]) -> tuple[ExpertMove, ...]:
    return tuple(ExpertMove(expert=e, source_rank=s, target_rank=t) for e, s, t in triples)


def test_a_holder_on_the_targets_node_sends() -> None:
    """Nodes {0, 1} and {2, 3}. Expert 0 is on ranks 0 and 3; rank 2 needs it: rank 3 (same node)
    sends, though rank 0 is lower and has sent nothing either."""
    old = _placement(((0, 3), (0, 1), (1, 2), (2, 3)), ep=4)
    new = _placement(((0, 2, 3), (0, 1, 2), (1,), (3,)), ep=4)
    # Expert 1's holders (0, 1) are both off rank 2's node: the tie goes to the lowest rank, 0.
    assert placement_moves(old=old, new=new, ranks_per_node=2) == _moves((0, 3, 2), (1, 0, 2))
    # On one node the preference is gone: expert 0 comes from rank 0, so expert 1 from rank 1.
    assert placement_moves(old=old, new=new) == _moves((0, 0, 2), (1, 1, 2))


def test_the_copies_of_one_expert_are_spread_over_its_holders() -> None:
    """Expert 0 on ranks 0 and 1 gains ranks 2 and 3: one copy from each holder."""
    old = _placement(((0, 1), (2, 3), (0, 2), (1, 3)), ep=4)
    new = _placement(((0, 1, 2, 3), (2,), (0,), (1, 3)), ep=4)
    assert placement_moves(old=old, new=new) == _moves((0, 0, 2), (0, 1, 3))


def test_the_send_count_runs_over_all_experts() -> None:
    """Experts 0 and 1 both live on ranks 0 and 1. Rank 0 sends expert 0, so rank 1 (not rank 0
    again) sends expert 1: a count kept per expert would pick rank 0 twice."""
    old = _placement(((0, 1), (0, 1), (2, 3), (2, 3)), ep=4)
    new = _placement(((0, 1, 2), (0, 1, 3), (2,), (3,)), ep=4)
    assert placement_moves(old=old, new=new) == _moves((0, 0, 2), (1, 1, 3))


def test_many_copies_of_a_hot_expert_load_its_holders_evenly() -> None:
    """A hot expert held by ranks 0 and 1 is copied to the 6 others: 3 copies from each holder,
    alternating, where a fixed sender would send all 6 (the busiest sender sets the time)."""
    ep = 8
    # Old: expert 0 on ranks 0 and 1; expert 1 on rank 0, expert 2 on rank 1; experts 3..8 twice,
    # around ranks 2..7. New: expert 0 everywhere and expert r + 1 on rank r.
    cycle = {expert: (expert - 2, expert - 1) if expert > 3 else (2, 7) for expert in range(3, 9)}
    old = _placement(((0, 1), (0,), (1,), *[cycle[e] for e in range(3, 9)]), ep=ep)
    new = _placement((tuple(range(ep)), *[(expert - 1,) for expert in range(1, 9)]), ep=ep)
    moves = placement_moves(old=old, new=new)
    assert [(m.expert, m.target_rank) for m in moves] == [(0, target) for target in range(2, ep)]
    assert [m.source_rank for m in moves] == [0, 1, 0, 1, 0, 1]
    assert [sum(m.source_rank == rank for m in moves) for rank in range(ep)] == [
        3,
        3,
        0,
        0,
        0,
        0,
        0,
        0,
    ]


def test_swapped_halves_move_one_copy_per_expert_from_distinct_senders() -> None:
    old = _placement(((0, 1), (0, 1), (2, 3), (2, 3)), ep=4)
    new = _placement(((0, 2), (1, 3), (0, 2), (1, 3)), ep=4)
    # Experts 0 and 1 share holders (0, 1) and experts 2 and 3 share (2, 3): the second of each
    # pair comes from the holder that has not sent yet; nothing moves to a rank that keeps it.
    assert placement_moves(old=old, new=new) == _moves((0, 0, 2), (1, 1, 3), (2, 2, 0), (3, 3, 1))


# --------------------------------------------------------------------------- live, on gloo ranks
# tiny-moe: 8 experts on ep 4, 3 slots per rank. Old: experts 0 and 1 on ranks 0 and 1, experts 4
# and 6 on ranks 2 and 3. New: rank 2 needs expert 0, rank 3 expert 1, ranks 0 and 1 expert 4.
OLD = ((0, 1), (0, 1), (0,), (1,), (2, 3), (2,), (2, 3), (3,))
NEW = ((0, 2), (1, 3), (0,), (1,), (0, 1), (2,), (2, 3), (3,))
# By the rule: expert 0 from rank 0 (tie, lowest); expert 1 from rank 1 (rank 0 has sent one);
# expert 4's two copies from ranks 2 and 3. A lowest-holder rule would send expert 1 from rank 0
# and both copies of expert 4 from rank 2.
EXPECTED_SENDER = {(0, 2): 0, (1, 3): 1, (4, 0): 2, (4, 1): 3}


def _tagged_value(*, block: int, rank: int, expert: int) -> float:
    return 1000.0 * block + 100.0 * rank + expert


def _rebalance_rank(rank: int, world_size: int, plan_json: str, new_json: str) -> dict:
    import torch

    import autoparallel as ap
    from autoparallel.runtime import ReferenceMoETransformer
    from autoparallel.runtime._rebalance import rebalance_experts

    torch.set_num_threads(1)
    plan = ap.load_plan(plan_json)
    model = ReferenceMoETransformer(ap.get_model(plan.provenance.model_name))
    model.init_weights(seed=7)
    applied = ap.apply_plan(model, plan, device_type="cpu")
    expert_parallel = applied.expert_parallel[0]
    with torch.no_grad():  # every replica says which rank holds it
        for block_index, (_, block) in enumerate(expert_parallel.blocks):
            for key, expert in block.experts.items():
                for parameter in expert.parameters():
                    parameter.fill_(_tagged_value(block=block_index, rank=rank, expert=int(key)))
    report = rebalance_experts(
        expert_parallel, placement=ExpertPlacement.model_validate_json(new_json)
    )
    values = {}
    for block_index, (_, block) in enumerate(expert_parallel.blocks):
        for key, expert in block.experts.items():
            distinct = {
                float(v) for p in expert.parameters() for v in p.detach().reshape(-1).unique()
            }
            values[(block_index, int(key))] = sorted(distinct)
    return {"values": values, "sent": report.sent, "received": report.received}


@pytest.mark.distributed
def test_live_re_placement_copies_from_the_senders_the_rule_names() -> None:
    import autoparallel as ap
    from autoparallel.testing import plan_for_config, run_ranks
    from cost_model import ParallelConfig, Training

    old, new = _placement(OLD, ep=4), _placement(NEW, ep=4)
    assert {
        (m.expert, m.target_rank): m.source_rank for m in placement_moves(old=old, new=new)
    } == EXPECTED_SENDER
    plan = plan_for_config(
        ap.get_model("tiny-moe"),
        ParallelConfig(dp=4, ep=4),
        workload=Training(sequence_length_tokens=8, global_batch_sequences=4),
    ).model_copy(update={"expert_placement": old})
    results = run_ranks(
        _rebalance_rank, 4, args=(plan.to_json(), new.model_dump_json()), timeout_s=120
    )
    blocks = {block for block, _ in results[0]["values"]}
    assert blocks  # tiny-moe has MoE layers
    for rank, result in enumerate(results):
        assert sorted(e for _, e in result["values"]) == sorted(
            e for e in rank_experts(new)[rank] for _ in blocks
        )
        for (block, expert), values in result["values"].items():
            sender = EXPECTED_SENDER.get((expert, rank), rank)  # a kept expert keeps its own values
            assert values == [_tagged_value(block=block, rank=sender, expert=expert)], (
                rank,
                block,
                expert,
                values,
            )
        assert sorted(result["sent"]) == sorted(
            e for (e, _), s in EXPECTED_SENDER.items() if s == rank
        )
        assert sorted(result["received"]) == sorted(e for (e, t) in EXPECTED_SENDER if t == rank)
