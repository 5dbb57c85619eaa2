"""Context parallel over the plan's ``cp`` axis: every sequence is split over the cp ranks.

Layout (load-balanced, "two chunks per rank"): a sequence of ``S`` tokens is cut into ``2*cp``
chunks of ``S / (2*cp)`` tokens and cp rank ``r`` holds chunks ``r`` and ``2*cp - 1 - r``, so
under a causal mask every rank does the same attention work (the layout of Llama 3, Dubey et al.
2024, arXiv:2407.21783 sec. 3.3.2, and of Megatron-core's context parallel, whose ring exchange
is Liu et al.'s Ring Attention, arXiv:2310.01889).

Attention gathers keys and values over the cp group (Llama 3: Dubey et al. 2024, "The Llama 3
Herd of Models", arXiv:2407.21783 sec. 3.3.2, all-gather K/V then attend locally): each rank's
queries attend to every key of the sequence with the causal mask drawn from *global* positions,
and RoPE rotates queries and keys by their global positions. MLA gathers its compressed latent
and RoPE key (the tensors its KV cache holds) rather than the expanded K/V; GQA gathers K and V
of its (local) KV heads. The gather's backward is a reduce-scatter (sum) of the gradients, so a
key's gradient from every rank's queries reaches the rank that computed the key. Each rank
receives the other ``cp - 1`` ranks' K/V once per layer forward (and sends back their gradients
once), the same bytes a ring exchange of those tensors moves. For GQA that is what the cost
model's ring prices; for MLA the cost model prices the expanded K/V (Megatron-core's MLA with
CP), more bytes than the latent gathered here.

Everything outside attention works token by token on the local tokens. Each rank's loss is the
mean over its local tokens; every rank holds ``S / cp`` tokens of each sequence, so the mean of
the cp ranks' losses is the loss over the whole sequence, and averaging gradients over the
``dp x cp`` ranks (data parallel's replica mesh, ``replica_mesh``) gives its gradient, exactly as
averaging over dp does for the batch (every target counts; with ignored targets, weight each
rank's loss by its share of the counted tokens). Expert gradients are divided by ``dp * cp`` likewise
(``ExpertParallelGroups.loss_replicas``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

__all__ = [
    "ContextParallel",
    "apply_context_parallel",
    "check_context_parallel_module",
    "check_sequence_length",
    "replica_mesh",
    "zigzag_positions",
]

logger = logging.getLogger(__name__)

_CONTEXT_ATTRIBUTE = "sequence_context"


def check_sequence_length(
    sequence_tokens: int, cp: int, *, field: str = "sequence_length_tokens"
) -> None:
    """Raise ``ValueError`` unless ``sequence_tokens`` splits into ``2*cp`` equal chunks."""
    if sequence_tokens <= 0 or sequence_tokens % (2 * cp):
        raise ValueError(
            f"{field} ({sequence_tokens}) must be a positive multiple of 2*cp ({2 * cp}): context parallel "
            f"gives cp rank r chunks r and 2*cp-1-r of {2 * cp} equal chunks of every sequence"
        )


def zigzag_positions(
    *, sequence_tokens: int, cp: int, rank: int, device: torch.device | None = None
) -> torch.Tensor:
    """Global positions (in order) of the tokens cp rank ``rank`` holds: chunks ``rank`` and ``2*cp-1-rank``."""
    check_sequence_length(sequence_tokens, cp)
    if not 0 <= rank < cp:
        raise ValueError(f"rank ({rank}) must be in [0, cp = {cp})")
    chunk = sequence_tokens // (2 * cp)
    first = torch.arange(rank * chunk, (rank + 1) * chunk, device=device)
    last = 2 * cp - 1 - rank
    return torch.cat([first, torch.arange(last * chunk, (last + 1) * chunk, device=device)])


_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _gather_dim1(x: torch.Tensor, size: int, group) -> torch.Tensor:
    """All-gather ``x`` (batch, local_tokens, ...) along dim 1, ranks in group-rank order."""
    front = x.transpose(0, 1).contiguous()
    out = front.new_empty((size * front.shape[0], *front.shape[1:]))
    _all_gather(out, front, group=group)
    return out.transpose(0, 1)


class _GatherSequence(torch.autograd.Function):
    """All-gather along the sequence (dim 1); backward reduce-scatters (sums) the gradient."""

    @staticmethod
    def forward(ctx, x, size, group):  # autograd API
        ctx.size, ctx.group = size, group
        return _gather_dim1(x, size, group)

    @staticmethod
    def backward(ctx, grad):
        front = grad.transpose(0, 1).contiguous()
        out = front.new_empty((front.shape[0] // ctx.size, *front.shape[1:]))
        _reduce_scatter(out, front, group=ctx.group)
        return out.transpose(0, 1), None, None


@dataclass(frozen=True)
class ContextParallel:
    """This rank's place in its cp group and the sequence collectives attention uses.

    ``rank`` is this process's rank within ``group`` (the order the collectives use), so
    sharding and gathering agree whatever the plan's rank placement.
    """

    group: dist.ProcessGroup
    rank: int
    size: int

    @classmethod
    def from_mesh(cls, cp_mesh: DeviceMesh) -> ContextParallel:
        group = cp_mesh.get_group()
        return cls(group=group, rank=dist.get_rank(group), size=cp_mesh.size())

    def _sequence_tokens(self, local_tokens: int) -> int:
        if local_tokens <= 0 or local_tokens % 2:
            raise ValueError(
                f"local sequence tokens ({local_tokens}) must be a positive even number under context "
                f"parallel (two chunks per rank); shard inputs with AppliedPlan.shard_inputs"
            )
        return local_tokens * self.size

    def positions(self, local_tokens: int, *, device: torch.device | None = None) -> torch.Tensor:
        """Global positions of this rank's ``local_tokens`` tokens (queries, RoPE)."""
        total = self._sequence_tokens(local_tokens)
        return zigzag_positions(sequence_tokens=total, cp=self.size, rank=self.rank, device=device)

    def key_positions(
        self, local_tokens: int, *, device: torch.device | None = None
    ) -> torch.Tensor:
        """Global positions of the gathered keys (every rank's tokens, in group-rank order)."""
        total = self._sequence_tokens(local_tokens)
        return torch.cat(
            [
                zigzag_positions(sequence_tokens=total, cp=self.size, rank=r, device=device)
                for r in range(self.size)
            ]
        )

    def gather(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """All-gather each (batch, local_tokens, ...) tensor along its tokens, in one collective.

        Autograd-aware: the backward reduce-scatters the gradients to the ranks that own the tokens.
        """
        batch, tokens = tensors[0].shape[:2]
        flat = [t.reshape(batch, tokens, -1) for t in tensors]
        widths = [t.shape[-1] for t in flat]
        gathered = _GatherSequence.apply(torch.cat(flat, dim=-1), self.size, self.group)
        return tuple(
            piece.reshape(batch, gathered.shape[1], *t.shape[2:])
            for piece, t in zip(gathered.split(widths, dim=-1), tensors)
        )

    def shard(self, tensor: torch.Tensor, *, field: str = "input") -> torch.Tensor:
        """This rank's tokens of ``tensor`` (batch, sequence, ...): chunks ``rank`` and ``2*cp-1-rank``."""
        if tensor.dim() < 2:
            raise ValueError(
                f"{field} shape ({tuple(tensor.shape)}) must be (batch, sequence, ...)"
            )
        check_sequence_length(tensor.shape[1], self.size, field=f"{field} sequence length")
        index = zigzag_positions(
            sequence_tokens=tensor.shape[1], cp=self.size, rank=self.rank, device=tensor.device
        )
        return tensor.index_select(1, index)

    def unshard(self, tensor: torch.Tensor) -> torch.Tensor:
        """The whole sequences, in global order, from every rank's local (batch, tokens, ...) part.

        Collective over the cp group; not autograd-aware (for logits, metrics and tests).
        """
        gathered = _gather_dim1(tensor.detach(), self.size, self.group)
        order = self.key_positions(tensor.shape[1], device=tensor.device)
        return gathered.index_select(1, torch.argsort(order))

    def average(self, value: torch.Tensor) -> torch.Tensor:
        """Mean over the cp group of a per-rank scalar (e.g. the local-token loss), detached."""
        total = value.detach().clone().reshape(1).float()
        dist.all_reduce(total, group=self.group)
        return (total / self.size).reshape(())


def _context_attention(module: nn.Module) -> list[tuple[str, nn.Module]]:
    from autoparallel.runtime._tensor_parallel import walk_modules

    return [
        (name, sub) for name, sub in walk_modules(module) if hasattr(type(sub), _CONTEXT_ATTRIBUTE)
    ]


def check_context_parallel_module(module: nn.Module, *, cp: int) -> None:
    """Raise ``ValueError`` when ``cp > 1`` and ``module`` has no attention that can gather its
    keys over cp (an attention module with a ``sequence_context`` hook, as the reference model's,
    or transformers' attention modules, ``_transformers_context``)."""
    from autoparallel.runtime._transformers_context import transformers_attention

    if cp > 1 and not _context_attention(module) and not transformers_attention(module):
        raise ValueError(
            f"cp ({cp}) > 1 needs attention modules with a {_CONTEXT_ATTRIBUTE!r} hook (the reference "
            f"model's Attention) or transformers' attention modules; {type(module).__name__} has none"
        )


def apply_context_parallel(modules: list[nn.Module], *, cp_mesh: DeviceMesh) -> ContextParallel:
    """Set every attention module's ``sequence_context`` to this rank's ``ContextParallel``
    (transformers' attention modules also get the attention function that uses it)."""
    from autoparallel.runtime._transformers_context import apply_transformers_context

    context = ContextParallel.from_mesh(cp_mesh)
    count = 0
    for module in modules:
        for _, attention in _context_attention(module):
            setattr(attention, _CONTEXT_ATTRIBUTE, context)
            count += 1
    count += apply_transformers_context(modules, context)
    logger.info(
        "context parallel: %d attention modules over cp=%d (rank %d)",
        count,
        context.size,
        context.rank,
    )
    return context


def replica_mesh(dense: DeviceMesh) -> DeviceMesh:
    """The mesh data parallel averages gradients over: ``dp``, or ``dp x cp`` flattened when cp > 1
    (every cp rank's loss covers other tokens of the same sequences, like another dp replica)."""
    if dense["cp"].size() == 1:
        return dense["dp"]
    if dense["dp"].size() == 1:
        return dense["cp"]
    return dense["dp", "cp"]._flatten("dp_cp")
