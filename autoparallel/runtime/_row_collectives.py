"""Differentiable collectives over rows of uneven counts, for expert parallel's token exchange:
an all-to-all whose backward is the inverse exchange, and the split / gather of rows a group
holds identically (expert tensor parallel)."""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = [
    "GatherRows",
    "SplitRows",
    "all_to_all",
    "gather_counts",
    "gather_rows",
    "group_size",
    "raw_all_to_all",
    "row_sizes",
]


def group_size(group: dist.ProcessGroup | None) -> int:
    return 1 if group is None else dist.get_world_size(group)


def raw_all_to_all(
    x: torch.Tensor, output_splits: list[int], input_splits: list[int], group
) -> torch.Tensor:
    out = x.new_empty((sum(output_splits),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with uneven row splits; backward is the inverse exchange."""

    @staticmethod
    def forward(ctx, x, output_splits, input_splits, group):  # autograd API
        ctx.group, ctx.output_splits, ctx.input_splits = group, output_splits, input_splits
        return raw_all_to_all(x, output_splits, input_splits, group)

    @staticmethod
    def backward(ctx, grad):
        return (
            raw_all_to_all(grad, ctx.input_splits, ctx.output_splits, ctx.group),
            None,
            None,
            None,
        )


def all_to_all(
    x: torch.Tensor, *, output_splits: list[int], input_splits: list[int], group
) -> torch.Tensor:
    """Differentiable ``all_to_all_single`` of the rows of ``x`` (identity on a group of one)."""
    if group_size(group) == 1:
        return x
    return _AllToAll.apply(x, list(output_splits), list(input_splits), group)


def gather_rows(x: torch.Tensor, sizes: list[int], group) -> torch.Tensor:
    """All-gather rows of different counts (``sizes[i]`` from rank i), as one all-to-all."""
    size = len(sizes)
    return raw_all_to_all(
        x.repeat((size,) + (1,) * (x.dim() - 1)), sizes, [x.shape[0]] * size, group
    )


class SplitRows(torch.autograd.Function):
    """Keep this rank's slice of rows a group holds identically; backward all-gathers the slices."""

    @staticmethod
    def forward(ctx, x, sizes, rank, group):
        ctx.sizes, ctx.group = sizes, group
        start = sum(sizes[:rank])
        return x[start : start + sizes[rank]].clone()

    @staticmethod
    def backward(ctx, grad):
        return gather_rows(grad.contiguous(), ctx.sizes, ctx.group), None, None, None


class GatherRows(torch.autograd.Function):
    """All-gather slices into the rows every rank of a group holds; backward keeps this rank's
    slice (the gradient of a replicated activation is already whole on every rank)."""

    @staticmethod
    def forward(ctx, x, sizes, rank, group):
        ctx.sizes, ctx.rank = sizes, rank
        return gather_rows(x, sizes, group)

    @staticmethod
    def backward(ctx, grad):
        start = sum(ctx.sizes[: ctx.rank])
        return grad[start : start + ctx.sizes[ctx.rank]].clone(), None, None, None


def gather_counts(count: int, group, size: int, device: torch.device) -> list[int]:
    gathered = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(size)]
    dist.all_gather(gathered, torch.tensor([count], dtype=torch.long, device=device), group=group)
    return [int(value) for value in torch.cat(gathered).tolist()]


def row_sizes(num_rows: int, parts: int) -> list[int]:
    """Row counts of ``torch.tensor_split(rows, parts)``: the first ``num_rows % parts`` get one more."""
    base, extra = divmod(num_rows, parts)
    return [base + (1 if index < extra else 0) for index in range(parts)]
