"""Expert parallel for MoE blocks: all-to-all token dispatch and combine over the EP group.

The layout follows Megatron-core's *parallel folding* (Liu et al., "MoE Parallel Folding",
arXiv:2504.14960): attention and dense layers use ``pp x dp x cp x tp``; the MoE layers of a
stage re-view the same ranks as ``edp x ep x etp``. One MoE forward on a rank:

1. *split* -- when attention ran tensor-parallel without sequence parallel, the tp ranks hold the
   same tokens; each keeps a distinct slice so that every token reaches the experts once
   (Megatron requires sequence parallel for the same reason). Backward all-gathers the slices'
   gradients, so the router and the input get the full, tp-identical gradient a replicated
   activation has.
2. *dispatch* -- each (token, expert) assignment goes to an EP rank holding the expert
   (``ExpertPlacement.expert_to_ranks``); tokens of a replicated expert are spread round-robin
   over its replicas, offset by the sender's EP rank (the contract of
   ``autoparallel._expert_placement``). One ``all_to_all_single`` with uneven splits.
3. *expert TP* -- with ``etp > 1`` the received tokens are all-gathered over the etp group, each
   etp rank applies its slice of every local expert (gate/up projections by output rows, down
   projection by input columns) and the partial outputs are reduce-scattered back (Megatron's
   ``--expert-tensor-parallel-size``).
4. *combine* -- the inverse all-to-all returns each output to its token, weighted by the router.

Every collective is autograd-aware, so gradients flow back through dispatch and combine. Expert
weights are not synchronised by data parallel: ``ExpertParallel.sync_gradients`` sums their
gradients over edp and over the replicas of an expert, then divides by the number of data-parallel

This module holds the process groups of one rank's MoE layers (``ExpertParallelGroups``), the
expert -> EP-rank map (``expert_placement_for``, ``local_experts``) and the all-to-all
``AllToAllDispatcher`` (steps 1-4); ``_expert_parallel`` applies them to a model and syncs the
expert gradients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from autoparallel.plan import ExpertPlacement, ShardingPlan
from autoparallel.runtime._row_collectives import (
    GatherRows,
    SplitRows,
    all_to_all,
    gather_counts,
    gather_rows,
    raw_all_to_all,
    row_sizes,
)

__all__ = [
    "AllToAllDispatcher",
    "ExpertParallelGroups",
    "expert_placement_for",
    "local_experts",
]


# --------------------------------------------------------------------------- groups and placement
@dataclass(frozen=True)
class ExpertParallelGroups:
    """The process groups one rank's MoE layers use (``None`` for a group of one).

    ``split_group`` is the tp group when the tp ranks hold identical tokens (tensor parallel
    without sequence parallel or attention data parallel), else ``None``.
    """

    ep_group: Any
    ep_rank: int
    ep_size: int
    etp_group: Any
    etp_rank: int
    etp_size: int
    edp_group: Any
    edp_size: int
    split_group: Any
    split_rank: int
    split_size: int
    loss_replicas: int

    @classmethod
    def from_meshes(cls, *, plan: ShardingPlan, moe_mesh, dense_mesh=None) -> ExpertParallelGroups:
        """Groups from the MoE mesh view (dims ``edp``, ``ep``, ``etp``) and the dense mesh (``tp``)."""
        config = plan.config

        def axis(mesh, name: str) -> tuple[Any, int, int]:
            if mesh is None or name not in (mesh.mesh_dim_names or ()) or mesh[name].size() == 1:
                return None, 0, 1
            sub = mesh[name]
            return sub.get_group(), sub.get_local_rank(), sub.size()

        ep_group, ep_rank, ep_size = axis(moe_mesh, "ep")
        etp_group, etp_rank, etp_size = axis(moe_mesh, "etp")
        edp_group, _, edp_size = axis(moe_mesh, "edp")
        for name, got, want in (
            ("ep", ep_size, config.ep),
            ("etp", etp_size, config.etp),
            ("edp", edp_size, config.edp),
        ):
            if got != want:
                raise ValueError(
                    f"moe_mesh axis {name!r} has size {got}; the plan's config needs {name} = {want}"
                )
        split = config.tp > 1 and not (config.sequence_parallel or config.attention_data_parallel)
        split_group, split_rank, split_size = axis(dense_mesh, "tp") if split else (None, 0, 1)
        if split and split_size != config.tp:
            raise ValueError(
                f"dense_mesh axis 'tp' has size {split_size}; the plan's config needs tp = {config.tp}"
            )
        return cls(
            ep_group=ep_group,
            ep_rank=ep_rank,
            ep_size=ep_size,
            etp_group=etp_group,
            etp_rank=etp_rank,
            etp_size=etp_size,
            edp_group=edp_group,
            edp_size=edp_size,
            split_group=split_group,
            split_rank=split_rank,
            split_size=split_size,
            loss_replicas=config.dp * config.cp,
        )


def expert_placement_for(plan: ShardingPlan, *, num_experts: int) -> ExpertPlacement:
    """The plan's expert -> EP-rank map, or the contiguous default when the plan has none."""
    placement = plan.expert_placement
    if placement is None:
        ep = plan.config.ep
        if num_experts % ep:
            raise ValueError(f"num_experts ({num_experts}) must be divisible by ep ({ep})")
        per_rank = num_experts // ep
        return ExpertPlacement(
            num_experts=num_experts,
            ep=ep,
            expert_to_ranks=tuple((e // per_rank,) for e in range(num_experts)),
        )
    if placement.num_experts != num_experts:
        raise ValueError(
            f"expert_placement.num_experts ({placement.num_experts}) differs from the module's experts ({num_experts})"
        )
    if placement.ep != plan.config.ep:
        raise ValueError(
            f"expert_placement.ep ({placement.ep}) differs from config.ep ({plan.config.ep})"
        )
    for expert, ranks in enumerate(placement.expert_to_ranks):
        if not ranks or any(not 0 <= r < placement.ep for r in ranks):
            raise ValueError(
                f"expert_placement.expert_to_ranks[{expert}] ({ranks}) must list EP ranks in [0, {placement.ep})"
            )
    return placement


def local_experts(placement: ExpertPlacement, ep_rank: int) -> tuple[int, ...]:
    """Global ids of the experts EP rank ``ep_rank`` holds under ``placement``, ascending."""
    return tuple(e for e, ranks in enumerate(placement.expert_to_ranks) if ep_rank in ranks)


# --------------------------------------------------------------------------- dispatch
@dataclass
class _Routing:
    """Where this rank's (token, expert) assignments go: the send order and the split sizes."""

    send_order: torch.Tensor
    token_of_sent: torch.Tensor
    input_splits: list[int]
    output_splits: list[int]
    received_slot: torch.Tensor


class AllToAllDispatcher:
    """Routes tokens to the EP ranks holding their experts and back: the all-to-all
    implementation of the reference model's ``TokenDispatcher`` protocol,
    ``dispatcher(tokens, weights, expert_ids, experts) -> routed_output``.

    ``tokens`` is ``[T, hidden]``, ``weights``/``expert_ids`` ``[T, top_k]`` (global expert ids),
    ``experts`` maps ``str(global id)`` to this rank's expert modules. The output is
    ``sum_k weight_k * expert_k(token)`` per token, the routed part of the MoE block.

    ``received_tokens[e]`` counts the (token, expert) rows local expert ``e`` has processed
    since construction, summed over the MoE blocks sharing this dispatcher (measured load).
    """

    def __init__(self, *, placement: ExpertPlacement, groups: ExpertParallelGroups) -> None:
        self.placement, self.groups = placement, groups
        ep = placement.ep
        unique = [sorted(set(ranks)) for ranks in placement.expert_to_ranks]
        held: list[list[int]] = [[] for _ in range(ep)]  # each EP rank's experts, ascending
        for expert, ranks in enumerate(unique):
            for rank in ranks:
                held[rank].append(expert)
        self.local_experts = tuple(held[groups.ep_rank])
        self.num_slots = max(len(experts) for experts in held)
        widest = max(len(ranks) for ranks in unique)
        # owners[e, i]: the i-th EP rank holding expert e (padded with 0 past its replicas);
        # slot[r, e]: expert e's index among rank r's experts (-1 where r does not hold it).
        self._owners = torch.tensor(
            [ranks + [0] * (widest - len(ranks)) for ranks in unique], dtype=torch.long
        )
        self._num_replicas = torch.tensor([len(ranks) for ranks in unique], dtype=torch.long)
        self._slot = torch.full((ep, placement.num_experts), -1, dtype=torch.long)
        rows = [rank for rank, experts in enumerate(held) for _ in experts]
        columns = [expert for experts in held for expert in experts]
        self._slot[rows, columns] = torch.tensor(
            [i for experts in held for i in range(len(experts))], dtype=torch.long
        )
        self.received_tokens: dict[int, int] = {expert: 0 for expert in self.local_experts}

    def __call__(
        self, tokens: torch.Tensor, weights: torch.Tensor, expert_ids: torch.Tensor, experts
    ) -> torch.Tensor:
        hidden, topk_weights, topk_ids, groups = tokens, weights, expert_ids, self.groups
        if groups.split_size > 1:
            sizes = row_sizes(hidden.shape[0], groups.split_size)
            hidden = SplitRows.apply(hidden, sizes, groups.split_rank, groups.split_group)
            topk_weights = SplitRows.apply(
                topk_weights, sizes, groups.split_rank, groups.split_group
            )
            start = sum(sizes[: groups.split_rank])
            topk_ids = topk_ids[start : start + sizes[groups.split_rank]]
        routed = self._dispatch_combine(hidden, topk_ids, topk_weights, experts)
        if groups.split_size > 1:
            routed = GatherRows.apply(routed, sizes, groups.split_rank, groups.split_group)
        return routed

    def _route(self, topk_ids: torch.Tensor) -> _Routing:
        """Choose a replica for every assignment and exchange the per-(rank, slot) counts."""
        groups, ep, slots, device = self.groups, self.placement.ep, self.num_slots, topk_ids.device
        if self._owners.device != device:
            self._owners, self._num_replicas, self._slot = (
                t.to(device) for t in (self._owners, self._num_replicas, self._slot)
            )
        expert = topk_ids.reshape(-1).to(torch.long)
        # Round-robin over an expert's replicas: the i-th assignment to it goes to replica
        # (i + ep_rank) mod replicas, so replicas share the load and senders start apart.
        by_expert = torch.argsort(expert, stable=True)
        sorted_expert = expert[by_expert]
        first = torch.searchsorted(sorted_expert, sorted_expert, right=False)
        occurrence = torch.empty_like(expert)
        occurrence[by_expert] = torch.arange(expert.numel(), device=device) - first
        choice = (occurrence + groups.ep_rank) % self._num_replicas[expert]
        dest = self._owners[expert, choice]
        key = dest * slots + self._slot[dest, expert]
        send_order = torch.argsort(key, stable=True)
        send_counts = torch.bincount(key, minlength=ep * slots)
        recv_counts = (
            raw_all_to_all(send_counts, [slots] * ep, [slots] * ep, groups.ep_group)
            if ep > 1
            else send_counts
        )
        recv_counts = recv_counts.view(ep, slots)
        slot_ids = torch.arange(slots, device=device).repeat(ep)
        return _Routing(
            send_order=send_order,
            token_of_sent=send_order // topk_ids.shape[1],
            input_splits=send_counts.view(ep, slots).sum(1).tolist(),
            output_splits=recv_counts.sum(1).tolist(),
            received_slot=torch.repeat_interleave(slot_ids, recv_counts.reshape(-1)),
        )

    def _dispatch_combine(self, hidden, topk_ids, topk_weights, experts) -> torch.Tensor:
        routing = self._route(topk_ids)
        group = self.groups.ep_group
        sent = hidden[routing.token_of_sent]
        received = all_to_all(
            sent,
            output_splits=routing.output_splits,
            input_splits=routing.input_splits,
            group=group,
        )
        processed = self._run_experts(received, routing.received_slot, experts)
        returned = all_to_all(
            processed,
            output_splits=routing.input_splits,
            input_splits=routing.output_splits,
            group=group,
        )
        weights = topk_weights.reshape(-1)[routing.send_order].unsqueeze(-1).to(returned.dtype)
        out = torch.zeros_like(hidden, dtype=returned.dtype)
        return out.index_add(0, routing.token_of_sent, returned * weights).to(hidden.dtype)

    def _run_experts(
        self, received: torch.Tensor, received_slot: torch.Tensor, experts
    ) -> torch.Tensor:
        """Apply local experts to the rows they received; with etp, on the etp group's rows."""
        groups = self.groups
        if groups.etp_size > 1:
            counts = gather_counts(
                received.shape[0], groups.etp_group, groups.etp_size, received.device
            )
            rows = all_to_all(
                received.repeat(groups.etp_size, 1),
                output_splits=counts,
                input_splits=[received.shape[0]] * groups.etp_size,
                group=groups.etp_group,
            )
            slot_of_row = gather_rows(received_slot, counts, groups.etp_group)
        else:
            rows, slot_of_row = received, received_slot
        outputs = self._apply_slots(rows, slot_of_row, experts)
        if groups.etp_size > 1:  # reduce-scatter: partial sums of this rank's rows come home
            partial = all_to_all(
                outputs,
                output_splits=[received.shape[0]] * groups.etp_size,
                input_splits=counts,
                group=groups.etp_group,
            )
            outputs = partial.view(groups.etp_size, received.shape[0], outputs.shape[-1]).sum(0)
        return outputs

    def _apply_slots(self, rows: torch.Tensor, slot_of_row: torch.Tensor, experts) -> torch.Tensor:
        # Every local expert runs, even on zero rows, so the autograd graph (and the gradient
        # buffers sync_gradients reduces) has the same shape on every rank.
        by_slot = torch.argsort(slot_of_row, stable=True)
        counts = torch.bincount(slot_of_row, minlength=self.num_slots).tolist()
        chunks = torch.split(rows[by_slot], counts)
        for slot, expert in enumerate(self.local_experts):
            self.received_tokens[expert] += counts[slot]
        outputs = [
            experts[str(expert)](chunks[slot]) for slot, expert in enumerate(self.local_experts)
        ]
        merged = torch.cat(outputs) if outputs else rows.new_zeros((0,) + tuple(rows.shape[1:]))
        inverse = torch.empty_like(by_slot)
        inverse[by_slot] = torch.arange(by_slot.numel(), device=by_slot.device)
        return merged[inverse]
