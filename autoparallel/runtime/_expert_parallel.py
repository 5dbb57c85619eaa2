"""Expert parallel for MoE blocks: put each rank's routed experts in place and sync their gradients.

The layout follows Megatron-core's *parallel folding* (Liu et al., "MoE Parallel Folding",
arXiv:2504.14960): attention and dense layers use ``pp x dp x cp x tp``; the MoE layers of a
stage re-view the same ranks as ``edp x ep x etp``. ``apply_expert_parallel`` keeps, in every
expert container, only the experts this EP rank holds (``ExpertPlacement.expert_to_ranks``),
slices each over etp when ``etp > 1`` (gate/up projections by output rows, down projection by
input columns; Megatron's ``--expert-tensor-parallel-size``) and routes every MoE block through
one ``AllToAllDispatcher`` (``_expert_dispatch``: split, dispatch, expert TP, combine).

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

import torch
import torch.distributed as dist
from torch import nn

from autoparallel.plan import ExpertPlacement, ShardingPlan
from autoparallel.runtime._expert_dispatch import (
    AllToAllDispatcher,
    ExpertParallelGroups,
    expert_placement_for,
)
from autoparallel.runtime._fused_experts import DispatchedExperts, unfuse_experts

__all__ = ["ExpertParallel", "apply_expert_parallel"]

logger = logging.getLogger(__name__)


# Projections of one expert FFN, by the role they play under expert TP: column-sliced projections
# split their output features, row-sliced ones their input features (HF deepseek_v3 / qwen3_moe /
# llama names and Mixtral's w1, w3 (gate, up) and w2 (down)).
_COLUMN_PROJECTIONS = ("gate_proj", "up_proj", "w1", "w3")
_ROW_PROJECTIONS = ("down_proj", "w2")


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
    kept = {str(e): experts[str(e)] for e in local}
    if isinstance(container, DispatchedExperts):
        return container.with_experts(kept)
    return nn.ModuleDict(kept)


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
    instead gets a forward with its routing that does. transformers 5's fused experts (3-D
    ``gate_up_proj`` / ``down_proj``) become one module per expert first
    (``_fused_experts.unfuse_experts``) and dispatch their own tokens, the block and its router
    unchanged. A module without expert containers (a
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
    unfuse_experts(model)  # transformers 5's 3-D expert weights, one module per expert
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
        if not hasattr(block, "dispatcher") and not isinstance(container, DispatchedExperts):
            _route_through_dispatcher(block, name=name.rpartition(".")[0])
        local = _local_container(container, dispatcher.local_experts, name=name, num_experts=count)
        if isinstance(local, DispatchedExperts):  # the experts dispatch their own tokens
            local.dispatcher = dispatcher
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
