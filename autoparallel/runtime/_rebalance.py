"""Move expert weights between EP ranks to a new ``ExpertPlacement``, live, outputs unchanged.

Every EP rank computes the same copy list (``autoparallel._expert_placement.placement_moves``,
a pure function of the old and new placements), packs the experts it must send — weights and,
when an optimizer is given, the optimizer state of each weight — into one buffer, and a single
``all_to_all_single`` over the EP group delivers them. Each rank then rebuilds each MoE block's
``experts`` ``ModuleDict`` with the experts the new placement gives it (kept experts keep their
very ``Parameter`` objects and optimizer state; received ones are new modules filled with the
sender's values; hooks registered on the old experts are not copied), installs a dispatcher for the new placement, and updates the optimizer's
parameter groups. Since every replica of an expert holds the same values and the dispatcher only
changes *which* replica computes a token's expert output, the model's outputs do not change.

Collective over the EP group (and independent across edp replicas and pipeline stages, each of
which runs the same moves on its own EP group). Call it between steps: after
``optimizer.step()`` / ``zero_grad()``, before the next forward.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from autoparallel._expert_placement import ExpertMove, placement_moves, rank_experts
from autoparallel.plan import ExpertPlacement
from autoparallel.runtime._expert_dispatch import AllToAllDispatcher
from autoparallel.runtime._expert_parallel import ExpertParallel
from autoparallel.runtime._fused_experts import DispatchedExperts

__all__ = ["RebalanceReport", "rebalance_experts"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RebalanceReport:
    """What one rank did: experts received and sent (global ids), and the bytes it moved."""

    received: tuple[int, ...]
    sent: tuple[int, ...]
    dropped: tuple[int, ...]
    bytes_sent: int
    bytes_received: int


def _state_layout(
    optimizer, parameters: list[nn.Parameter]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Optimizer state keys of the expert weights: those shaped like the weight, and scalars."""
    if optimizer is None:
        return (), ()
    for parameter in parameters:
        state = optimizer.state.get(parameter)
        if state:
            shaped = tuple(
                sorted(
                    k for k, v in state.items() if torch.is_tensor(v) and v.shape == parameter.shape
                )
            )
            scalars = tuple(sorted(k for k, v in state.items() if k not in shaped))
            return shaped, scalars
    return (), ()


def _agree_on_layout(layout, group) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Every EP rank must move the same kinds of state (e.g. all stepped, or none)."""
    if group is None:
        return layout
    gathered: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, layout, group=group)
    if any(other != gathered[0] for other in gathered):
        raise ValueError(f"optimizer state of expert weights differs between EP ranks: {gathered}")
    return gathered[0]


def _expert_tensors(expert: nn.Module, optimizer, shaped: tuple[str, ...]) -> list[torch.Tensor]:
    """Weights then, per weight, its shaped optimizer state, in a fixed order."""
    out = []
    for _, parameter in sorted(expert.named_parameters()):
        out.append(parameter.detach())
        for key in shaped:
            out.append(optimizer.state[parameter][key])
    return out


def _expert_scalars(expert: nn.Module, optimizer, scalars: tuple[str, ...]) -> list[float]:
    out = []
    for _, parameter in sorted(expert.named_parameters()):
        out.extend(float(optimizer.state[parameter][key]) for key in scalars)
    return out


def _pack(blocks, moves: list[ExpertMove], optimizer, layout) -> tuple[torch.Tensor, torch.Tensor]:
    shaped, scalars = layout
    tensors, values = [], []
    for move in moves:
        for _, block in blocks:
            expert = block.experts[str(move.expert)]
            tensors += [t.reshape(-1) for t in _expert_tensors(expert, optimizer, shaped)]
            values += _expert_scalars(expert, optimizer, scalars)
    template = next(iter(blocks[0][1].experts.parameters()))
    flat = torch.cat(tensors) if tensors else template.new_zeros(0)
    return flat, torch.tensor(values, dtype=torch.float64, device=template.device)


def _unpack_into(
    expert: nn.Module, flat: torch.Tensor, scalars_flat: torch.Tensor, optimizer, layout
) -> tuple[int, int]:
    """Fill a fresh expert (and its optimizer state) from the front of the buffers; return the
    numbers of elements consumed from each."""
    shaped, scalars = layout
    offset = scalar_offset = 0
    for _, parameter in sorted(expert.named_parameters()):
        size = parameter.numel()
        with torch.no_grad():
            parameter.copy_(flat[offset : offset + size].view_as(parameter))
        offset += size
        if optimizer is None or not (shaped or scalars):
            continue
        state = optimizer.state[parameter]
        for key in shaped:
            state[key] = flat[offset : offset + size].view_as(parameter).clone()
            offset += size
        for key in scalars:
            state[key] = torch.tensor(float(scalars_flat[scalar_offset]), dtype=torch.float32)
            scalar_offset += 1
    return offset, scalar_offset


def _move_sizes(blocks, layout) -> tuple[int, int]:
    """Elements per moved expert (all blocks) in the tensor buffer and in the scalar buffer."""
    shaped, scalars = layout
    per_tensor = per_scalar = 0
    for _, block in blocks:
        expert = next(iter(block.experts.values()))
        for _, parameter in expert.named_parameters():
            per_tensor += parameter.numel() * (1 + len(shaped))
            per_scalar += len(scalars)
    return per_tensor, per_scalar


def _exchange(
    send: torch.Tensor, *, send_counts: list[int], recv_counts: list[int], per_move: int, group
) -> torch.Tensor:
    out = send.new_empty(sum(recv_counts) * per_move)
    if group is None or per_move == 0:
        return send if group is None else out
    dist.all_to_all_single(
        out,
        send.contiguous(),
        [c * per_move for c in recv_counts],
        [c * per_move for c in send_counts],
        group=group,
    )
    return out


def rebalance_experts(
    expert_parallel: ExpertParallel, *, placement: ExpertPlacement, optimizer=None
) -> RebalanceReport:
    """Re-place the experts of ``expert_parallel``'s MoE blocks as ``placement`` says.

    Mutates, on this rank: each block's ``experts`` and ``dispatcher``, ``expert_parallel.placement``
    and ``.dispatcher``, and ``optimizer``'s parameter groups and state (new experts join the
    group their predecessors were in; experts this rank no longer holds leave it). Collective over
    the EP group: every EP rank of the group must call it with the same ``placement``.

    Raises:
        ValueError: ``placement`` is for another number of experts or EP degree, or the EP ranks'
            optimizer states differ; raised before any weight moves.
    """
    old, groups = expert_parallel.placement, expert_parallel.groups
    if (placement.num_experts, placement.ep) != (old.num_experts, old.ep):
        raise ValueError(
            f"placement (num_experts {placement.num_experts}, ep {placement.ep}) must match the running one "
            f"(num_experts {old.num_experts}, ep {old.ep})"
        )
    me, blocks = groups.ep_rank, expert_parallel.blocks
    moves = list(placement_moves(old=old, new=placement))
    local_parameters = [p for _, b in blocks for p in b.experts.parameters()]
    layout = _agree_on_layout(_state_layout(optimizer, local_parameters), groups.ep_group)
    outgoing = sorted((m for m in moves if m.source_rank == me), key=lambda m: m.target_rank)
    incoming = sorted((m for m in moves if m.target_rank == me), key=lambda m: m.source_rank)
    send_counts = [sum(m.target_rank == r for m in outgoing) for r in range(old.ep)]
    recv_counts = [sum(m.source_rank == r for m in incoming) for r in range(old.ep)]
    per_move, per_scalar = _move_sizes(blocks, layout)
    flat, scalars = _pack(blocks, outgoing, optimizer, layout)
    received = _exchange(
        flat,
        send_counts=send_counts,
        recv_counts=recv_counts,
        per_move=per_move,
        group=groups.ep_group,
    )
    received_scalars = _exchange(
        scalars,
        send_counts=send_counts,
        recv_counts=recv_counts,
        per_move=per_scalar,
        group=groups.ep_group,
    )
    new_local = rank_experts(placement)[me]
    group_of = _param_groups(optimizer)
    dropped = _install(
        blocks,
        new_local=new_local,
        incoming=incoming,
        received=(received, received_scalars),
        optimizer=optimizer,
        layout=layout,
        group_of=group_of,
    )
    dispatcher = AllToAllDispatcher(placement=placement, groups=groups)
    for _, block in blocks:
        block.dispatcher = dispatcher
        if isinstance(block.experts, DispatchedExperts):  # experts that dispatch their own tokens
            block.experts.dispatcher = dispatcher
    expert_parallel.placement, expert_parallel.dispatcher = placement, dispatcher
    element = next(iter(blocks[0][1].experts.parameters())).element_size()
    report = RebalanceReport(
        received=tuple(m.expert for m in incoming),
        sent=tuple(m.expert for m in outgoing),
        dropped=dropped,
        bytes_sent=flat.numel() * element,
        bytes_received=received.numel() * element,
    )
    logger.info(
        "rebalance: EP rank %d received %s, sent %s, dropped %s",
        me,
        report.received,
        report.sent,
        dropped,
    )
    return report


def _param_groups(optimizer) -> dict[int, int]:
    """id(parameter) -> index of its optimizer parameter group."""
    if optimizer is None:
        return {}
    return {
        id(p): index for index, group in enumerate(optimizer.param_groups) for p in group["params"]
    }


def _install(
    blocks, *, new_local, incoming, received, optimizer, layout, group_of
) -> tuple[int, ...]:
    """Build each block's new ``experts`` dict and keep the optimizer in step with it."""
    flat, scalars = received
    offset = scalar_offset = 0
    fresh: dict[tuple[int, int], nn.Module] = {}
    for move in incoming:  # same order as the sender packed: by source rank, then move order
        for index, (_, block) in enumerate(blocks):
            template = next(iter(block.experts.values()))
            expert = _fresh_copy(template)
            used, used_scalars = _unpack_into(
                expert, flat[offset:], scalars[scalar_offset:], optimizer, layout
            )
            offset, scalar_offset = offset + used, scalar_offset + used_scalars
            fresh[(index, move.expert)] = expert
            _register(optimizer, template, expert, group_of)
    dropped: set[int] = set()
    for index, (_, block) in enumerate(blocks):
        old = block.experts
        kept = {key: old[key] for key in old.keys() if int(key) in new_local}
        for key in old.keys():
            if int(key) not in new_local:
                dropped.add(int(key))
                _unregister(optimizer, old[key])
        modules = {str(e): kept[str(e)] if str(e) in kept else fresh[(index, e)] for e in new_local}
        block.experts = (
            old.with_experts(modules)
            if isinstance(old, DispatchedExperts)
            else nn.ModuleDict(modules)
        )
    return tuple(sorted(dropped))


_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_load_state_dict_pre_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks_always_called",
)


def _fresh_copy(template: nn.Module) -> nn.Module:
    """A new expert shaped like ``template``: no gradients, and none of the hooks others put on
    the template (a profiler's timing hook must not count a received expert twice; a data-parallel
    wrapper's hook state must not be deep-copied). The hooks are set aside while copying."""
    saved = []
    for module in template.modules():
        for name in _HOOK_DICTS:
            hooks = module.__dict__.get(name)
            if hooks:
                saved.append((module, name, hooks))
                module.__dict__[name] = type(hooks)()
    try:
        expert = copy.deepcopy(template)
    finally:
        for module, name, hooks in saved:
            module.__dict__[name] = hooks
    for parameter in expert.parameters():
        parameter.grad = None
    return expert


def _register(optimizer, template: nn.Module, expert: nn.Module, group_of: dict[int, int]) -> None:
    if optimizer is None:
        return
    for (_, like), (_, parameter) in zip(
        sorted(template.named_parameters()), sorted(expert.named_parameters())
    ):
        index = group_of.get(id(like))
        if index is None:
            raise ValueError(
                "an expert weight is not in the optimizer; pass the optimizer that trains the experts"
            )
        optimizer.param_groups[index]["params"].append(parameter)


def _unregister(optimizer, expert: nn.Module) -> None:
    if optimizer is None:
        return
    gone = {id(p) for p in expert.parameters()}
    for group in optimizer.param_groups:
        group["params"] = [p for p in group["params"] if id(p) not in gone]
    for parameter in expert.parameters():
        optimizer.state.pop(parameter, None)
