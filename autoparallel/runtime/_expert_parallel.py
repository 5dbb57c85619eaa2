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
loss replicas (dp * cp), which is what averaging the dense gradients over dp does to the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

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
    "ExpertParallel",
    "ExpertParallelGroups",
    "all_to_all",
    "apply_expert_parallel",
    "expert_placement_for",
    "local_experts",
]

logger = logging.getLogger(__name__)

# Projections of one expert FFN, by the role they play under expert TP: column-sliced projections
# split their output features, row-sliced ones their input features (HF deepseek_v3 / qwen3_moe /
# llama names and Mixtral's w1, w3 (gate, up) and w2 (down)).
_COLUMN_PROJECTIONS = ("gate_proj", "up_proj", "w1", "w3")
_ROW_PROJECTIONS = ("down_proj", "w2")


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


# --------------------------------------------------------------------------- applying to a model
def _expert_containers(model: nn.Module, plan: ShardingPlan) -> list[tuple[str, nn.Module]]:
    """Routed-expert containers: modules matching the plan's ``expert`` rules (``*.experts`` when
    ep is 1 and only expert-TP rules exist). A pipeline chunk of dense layers has none."""
    patterns = [rule.pattern for rule in plan.module_rules if rule.style == "expert"] or [
        "*.experts"
    ]
    return [
        (name, module)
        for name, module in model.named_modules()
        if any(fnmatchcase(name, pattern) for pattern in patterns)
        and isinstance(module, (nn.ModuleList, nn.ModuleDict))
    ]


def _declared_experts(model: nn.Module, containers: list[tuple[str, nn.Module]]) -> set[int]:
    """The model's routed-expert counts: a block's int ``num_experts`` where its container holds
    fewer (a part built for one rank, see ``_rank_build``), else the container's length."""
    declared = [
        (getattr(_parent(model, name)[0], "num_experts", None), len(c)) for name, c in containers
    ]
    return {count if isinstance(count, int) and count > held else held for count, held in declared}


def _local_container(
    container: nn.Module, local: tuple[int, ...], *, name: str, num_experts: int
) -> nn.ModuleDict:
    """This rank's experts of ``container``: picked from all ``num_experts``, or, from a container
    built with only some, checked to be exactly this rank's."""
    items = container.items() if isinstance(container, nn.ModuleDict) else enumerate(container)
    experts = {str(key): module for key, module in items}
    if len(experts) < num_experts and set(experts) != {str(e) for e in local}:
        held = sorted(int(key) for key in experts)
        raise ValueError(
            f"{name} holds experts {held}; this EP rank's experts under the plan are {list(local)} "
            f"(missing {sorted(set(local) - set(held))}, extra {sorted(set(held) - set(local))})"
        )
    return nn.ModuleDict({str(e): experts[str(e)] for e in local})


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    parent_name, _, child = name.rpartition(".")
    return (model.get_submodule(parent_name) if parent_name else model), child


def _slice(tensor: torch.Tensor, *, dim: int, start: int, size: int) -> torch.Tensor:
    """A copy of ``tensor``'s rows (``dim`` 0) or columns ``[start, start + size)``; on the meta
    device a new shape-only tensor (a meta ``clone`` costs ~8x more, for nothing)."""
    if tensor.is_meta:
        return tensor.new_empty(tensor.shape[:dim] + (size,) + tensor.shape[dim + 1 :])
    return tensor.detach().narrow(dim, start, size).clone()


def _slice_linear(linear: nn.Module, *, dim: int, rank: int, parts: int, name: str) -> None:
    """Keep slice ``rank`` of ``parts`` of a Linear's weight along ``dim`` (0: output features)."""
    weight = linear.weight
    if weight.shape[dim] % parts:
        raise ValueError(
            f"{name}.weight dim {dim} ({weight.shape[dim]}) must be divisible by etp ({parts})"
        )
    size = weight.shape[dim] // parts
    sliced = _slice(weight, dim=dim, start=rank * size, size=size)
    linear.weight = nn.Parameter(sliced, requires_grad=weight.requires_grad)
    bias = getattr(linear, "bias", None)
    if bias is not None:
        if dim == 1:
            raise ValueError(
                f"{name}.bias is not supported with etp ({parts}) > 1 (a row-sliced projection's bias)"
            )
        linear.bias = nn.Parameter(
            _slice(bias, dim=0, start=rank * size, size=size), requires_grad=bias.requires_grad
        )
    attribute = "out_features" if dim == 0 else "in_features"
    if hasattr(linear, attribute):
        setattr(linear, attribute, linear.weight.shape[dim])


def _shard_expert(expert: nn.Module, *, name: str, rank: int, parts: int) -> None:
    """Expert TP: gate/up projections keep a block of output rows, the down projection the
    matching block of input columns, so partial outputs sum to the whole (Megatron sec. 3)."""
    found = False
    for child_name, child in expert.named_children():
        if child_name in _COLUMN_PROJECTIONS or child_name in _ROW_PROJECTIONS:
            dim = 0 if child_name in _COLUMN_PROJECTIONS else 1
            _slice_linear(child, dim=dim, rank=rank, parts=parts, name=f"{name}.{child_name}")
            found = True
    if not found:
        names = _COLUMN_PROJECTIONS + _ROW_PROJECTIONS
        raise ValueError(
            f"expert {name} has none of the projections {names}; cannot split it over etp ({parts})"
        )


def _huggingface_topk_forward(block: nn.Module):  # a bound forward
    """The routing of HuggingFace's Mixtral / Qwen2-MoE / Qwen3-MoE sparse blocks (per-expert
    modules, ``transformers`` ``modeling_mixtral.py`` and ``modeling_qwen3_moe.py``): softmax over
    the router logits, top-k, renormalized unless ``norm_topk_prob`` is False, an optional shared
    expert scaled by ``sigmoid(shared_expert_gate(x))`` (Qwen2-MoE); returns (output, router
    logits) as those blocks do. Tokens go through ``block.dispatcher``."""

    def forward(hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])
        router_logits = block.gate(tokens)
        probabilities = torch.softmax(router_logits, dim=-1, dtype=torch.float)
        weights, expert_ids = probabilities.topk(block.top_k, dim=-1)
        if getattr(block, "norm_topk_prob", True):
            weights = weights / weights.sum(dim=-1, keepdim=True)
        out = block.dispatcher(tokens, weights.to(tokens.dtype), expert_ids, block.experts)
        shared = getattr(block, "shared_expert", None)
        if shared is not None:
            shared_out = shared(tokens)
            shared_gate = getattr(block, "shared_expert_gate", None)
            if shared_gate is not None:
                shared_out = torch.sigmoid(shared_gate(tokens)) * shared_out
            out = out + shared_out
        return out.view_as(hidden_states), router_logits

    return forward


def _route_through_dispatcher(block: nn.Module, *, name: str) -> None:
    """Give a HuggingFace-style top-k block (a Linear ``gate``, an integer ``top_k``) a forward
    that routes through ``block.dispatcher``; other blocks without a dispatcher are an error."""
    if not isinstance(getattr(block, "gate", None), nn.Linear) or not isinstance(
        getattr(block, "top_k", None), int
    ):
        raise ValueError(
            f"MoE block {name!r} ({type(block).__name__}) has no 'dispatcher' attribute and is not a "
            "HuggingFace top-k block (Linear 'gate', int 'top_k'); expert parallel needs blocks that route "
            "through self.dispatcher(tokens, weights, expert_ids, self.experts)"
        )
    block.forward = _huggingface_topk_forward(block)


@dataclass
class ExpertParallel:
    """What ``apply_expert_parallel`` did, and the gradient sync it leaves to the training loop.

    ``blocks`` are the MoE blocks (FQN, module) whose dispatcher was replaced; ``local_experts``
    the global ids of the experts this rank holds in each of them.
    """

    groups: ExpertParallelGroups
    placement: ExpertPlacement
    dispatcher: AllToAllDispatcher
    blocks: list[tuple[str, nn.Module]] = field(default_factory=list)

    @property
    def local_experts(self) -> tuple[int, ...]:
        return self.dispatcher.local_experts

    def named_expert_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """(FQN, parameter) of every local expert weight, in the same order on every rank."""
        for name, parameter, _, _ in self._expert_entries():
            yield name, parameter

    def expert_parameters(self) -> list[nn.Parameter]:
        """The local expert weights (data parallel over dp must leave these alone)."""
        return [parameter for _, parameter, _, _ in self._expert_entries()]

    def _expert_entries(self) -> Iterator[tuple[str, nn.Parameter, int, int]]:
        for index, (block_name, block) in enumerate(self.blocks):
            for expert in self.local_experts:
                for name, parameter in block.experts[str(expert)].named_parameters():
                    yield f"{block_name}.experts.{expert}.{name}", parameter, index, expert

    def sync_gradients(self, *, divide_by: int | None = None) -> None:
        """Make the expert gradients those of the global loss; call once after all backward
        passes of a step (gradient accumulation included), before the optimizer step.

        Sums over edp (ranks holding the same experts, fed different tokens), then over the
        replicas of each replicated expert, then divides by ``divide_by`` (default dp * cp: the
        global loss is the mean of the data-parallel ranks' losses). Collective over edp and ep.
        """
        entries = [(p, (b, e)) for _, p, b, e in self._expert_entries() if p.requires_grad]
        if not entries:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p, _ in entries]
        sizes = [g.numel() for g in grads]
        flat = torch.cat([g.reshape(-1) for g in grads])
        if self.groups.edp_size > 1:
            dist.all_reduce(flat, group=self.groups.edp_group)
        flat = self._sum_replicas(flat, [key for _, key in entries], sizes)
        flat /= self.groups.loss_replicas if divide_by is None else divide_by
        for (parameter, _), piece, grad in zip(entries, flat.split(sizes), grads):
            parameter.grad = piece.view_as(grad).clone()

    def _sum_replicas(
        self, flat: torch.Tensor, keys: list[tuple[int, int]], sizes: list[int]
    ) -> torch.Tensor:
        """All-reduce over ep the gradients of experts that several EP ranks hold: one row per
        (block, replicated expert), filled by its holders and zero elsewhere."""
        replicated = [
            e for e, ranks in enumerate(self.placement.expert_to_ranks) if len(set(ranks)) > 1
        ]
        if not replicated or self.groups.ep_size == 1:
            return flat
        row_of = {
            (b, e): b * len(replicated) + i
            for b in range(len(self.blocks))
            for i, e in enumerate(replicated)
        }
        per_expert = sum(size for size, key in zip(sizes, keys) if key == keys[0])
        buffer = flat.new_zeros(len(row_of), per_expert)
        pieces, columns, column = list(flat.split(sizes)), [], 0
        for index, key in enumerate(keys):
            column = 0 if index == 0 or key != keys[index - 1] else column
            columns.append(column)
            column += sizes[index]
        for piece, key, start in zip(pieces, keys, columns):
            if key in row_of:
                buffer[row_of[key], start : start + piece.numel()] = piece
        dist.all_reduce(buffer, group=self.groups.ep_group)
        for index, (key, start) in enumerate(zip(keys, columns)):
            if key in row_of:
                pieces[index] = buffer[row_of[key], start : start + sizes[index]]
        return torch.cat(pieces)


def apply_expert_parallel(
    model: nn.Module, *, plan: ShardingPlan, moe_mesh, dense_mesh=None
) -> ExpertParallel:
    """Put the routed experts of every MoE block of ``model`` on the EP ranks the plan names.

    Mutates ``model`` in place: each expert container (``*.experts``, a ModuleList or ModuleDict
    of expert FFNs) becomes an ``nn.ModuleDict`` keyed by global expert id holding only this
    rank's experts (FQNs such as ``mlp.experts.5.gate_proj.weight`` are kept; a container
    already holding fewer than its block's ``num_experts`` must hold exactly those), each expert is
    sliced over etp when ``etp > 1``, and the block's ``dispatcher`` attribute becomes an
    ``AllToAllDispatcher``. The MoE block must route through ``self.dispatcher(tokens,
    weights, expert_ids, self.experts)``, as the reference model in ``autoparallel.runtime``
    does; a HuggingFace Mixtral / Qwen-MoE style block (a Linear ``gate`` and an int ``top_k``)
    instead gets a forward with its routing that does. A module without expert containers (a
    pipeline chunk of dense layers) is left unchanged and gets an ``ExpertParallel`` with no
    blocks; ``apply_plan`` checks on the whole model that every rule matches some module.

    Args:
        model: the module (or one pipeline stage of it), weights on any device including meta.
        plan: supplies ep/etp/edp, tp/sp/attention-DP (token split) and the expert placement.
        moe_mesh: a DeviceMesh with dims ``edp``, ``ep``, ``etp`` (and possibly ``pp``).
        dense_mesh: the dense DeviceMesh (dim ``tp``), needed when tp > 1.

    Returns:
        An ``ExpertParallel`` whose ``sync_gradients()`` the training step calls after backward.

    Raises:
        ValueError: a block with neither a dispatcher nor HuggingFace top-k routing, containers
            of different sizes, experts not divisible by etp, or a placement that does not fit
            the experts; raised before any collective.
    """
    groups = ExpertParallelGroups.from_meshes(plan=plan, moe_mesh=moe_mesh, dense_mesh=dense_mesh)
    containers = _expert_containers(model, plan)
    num_experts = _declared_experts(model, containers)
    if len(num_experts) > 1:
        raise ValueError(
            f"expert containers hold different numbers of experts: {sorted(num_experts)}"
        )
    if not num_experts and plan.expert_placement is None:
        raise ValueError("the module has no expert containers and the plan no expert_placement")
    count = num_experts.pop() if num_experts else plan.expert_placement.num_experts
    placement = expert_placement_for(plan, num_experts=count)
    dispatcher = AllToAllDispatcher(placement=placement, groups=groups)
    blocks = []
    for name, container in containers:
        block, child = _parent(model, name)
        if not hasattr(block, "dispatcher"):
            _route_through_dispatcher(block, name=name.rpartition(".")[0])
        local = _local_container(container, dispatcher.local_experts, name=name, num_experts=count)
        if groups.etp_size > 1:
            for key, expert in local.items():
                _shard_expert(
                    expert, name=f"{name}.{key}", rank=groups.etp_rank, parts=groups.etp_size
                )
        setattr(block, child, local)
        block.dispatcher = dispatcher
        blocks.append((name.rpartition(".")[0], block))
    logger.info(
        "expert parallel: %d MoE blocks, local experts %s", len(blocks), dispatcher.local_experts
    )
    return ExpertParallel(groups=groups, placement=placement, dispatcher=dispatcher, blocks=blocks)
