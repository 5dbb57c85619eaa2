"""Build only what one rank of a plan holds: its pipeline stage(s) and its experts.

A full-size model never needs to exist whole: rank ``r`` of a plan holds the layers of its
pipeline rank's chunks (``plan.stages``), the embedding / final norm and LM head when its
chunks include them, and in every MoE layer only the routed experts the plan's expert placement
gives its ep coordinate. ``build_for_rank`` builds exactly that part of a
``ReferenceMoETransformer`` (FQNs keep global layer and expert ids), and ``apply_plan``
recognizes such a part, checks it is this rank's, and skips its own cutting. On the meta device
a rank of the 3T reference model builds in milliseconds instead of the seconds the whole model
takes.

The rank's coordinates come from the plan's rank placement exactly as ``build_meshes`` lays
out the meshes: position of ``rank`` in ``mesh_rank_layout(plan)`` (pp, dp, cp, tp) and in its
MoE view (pp, edp, ep, etp).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from autoparallel.plan import ShardingPlan
from autoparallel.runtime._expert_dispatch import expert_placement_for, local_experts
from autoparallel.runtime._layers import RouterScoring
from autoparallel.runtime._mesh import mesh_rank_layout
from autoparallel.runtime._model import ReferenceMoETransformer
from autoparallel.runtime._tensor_parallel import iter_module_names
from cost_model import ModelSpec

__all__ = [
    "RankParts",
    "build_for_rank",
    "check_rank_part",
    "is_rank_part",
    "rank_parts",
    "whole_module_names",
]


@dataclass(frozen=True)
class RankParts:
    """What rank ``rank`` of a plan holds of the model.

    ``layers``: global decoder-layer ids (all chunks of its pipeline rank); ``experts``: global
    routed-expert ids of each MoE layer, ``None`` for all (no expert parallel or a dense model);
    ``embedding`` / ``lm_head``: whether it holds the embedding and the final norm with the head.
    """

    rank: int
    pp_rank: int
    ep_rank: int
    layers: tuple[int, ...]
    experts: tuple[int, ...] | None
    embedding: bool
    lm_head: bool


def _coordinates(plan: ShardingPlan, rank: int) -> tuple[int, int]:
    """(pp, ep) coordinates of ``rank`` in the plan's dense mesh and its MoE view."""
    if not 0 <= rank < plan.world_size:
        raise ValueError(f"rank ({rank}) must be in [0, world_size = {plan.world_size})")
    layout = mesh_rank_layout(plan)
    config = plan.config
    moe = layout.reshape(config.pp, config.edp, config.ep, config.etp)
    pp_rank = int((layout == rank).nonzero()[0, 0])
    ep_rank = int((moe == rank).nonzero()[0, 2])
    return pp_rank, ep_rank


def rank_parts(plan: ShardingPlan, *, rank: int, num_experts: int | None = None) -> RankParts:
    """The parts of the model rank ``rank`` holds under ``plan``.

    ``num_experts`` (routed experts per MoE layer) defaults to the plan's expert placement's;
    a dense model (no placement, no count) holds ``experts=None``.
    """
    from autoparallel.runtime._pipeline import (
        stage_chunks,  # torch.distributed.pipelining: only when used
    )

    if not plan.stages:
        raise ValueError("plan.stages is empty: the plan does not say which layers a rank holds")
    pp_rank, ep_rank = _coordinates(plan, rank)
    chunks = stage_chunks(plan, pp_rank)
    layers = sorted(i for chunk in chunks for i in range(chunk.start_layer, chunk.stop_layer))
    if num_experts is None and plan.expert_placement is not None:
        num_experts = plan.expert_placement.num_experts
    experts = None
    if num_experts is not None and plan.config.ep > 1:
        experts = local_experts(expert_placement_for(plan, num_experts=num_experts), ep_rank)
    return RankParts(
        rank=rank,
        pp_rank=pp_rank,
        ep_rank=ep_rank,
        layers=tuple(layers),
        experts=experts,
        embedding=any(chunk.has_embedding for chunk in chunks),
        lm_head=any(chunk.has_lm_head for chunk in chunks),
    )


def build_for_rank(
    spec: ModelSpec,
    plan: ShardingPlan,
    *,
    rank: int,
    router_scoring: RouterScoring = "softmax",
    rope_theta: float = 10000.0,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> ReferenceMoETransformer:
    """The ``ReferenceMoETransformer`` part rank ``rank`` of ``plan`` holds (see ``rank_parts``).

    Pass it to ``apply_plan`` on that rank as the whole model would be; ``init_weights(seed=...)``
    gives its weights the values the whole model's have (values depend only on seed and FQN).
    Experts are built whole and ``apply_plan`` slices them over etp and shards weights over tp:
    for a large model build on ``device="meta"``, apply, then ``to_empty`` and ``init_weights``.

    Raises:
        ValueError: ``plan`` is for another model (fingerprint), or ``rank`` is not a rank of it.
    """
    if spec.fingerprint() != plan.provenance.model_fingerprint:
        raise ValueError(
            f"spec's fingerprint ({spec.fingerprint()}, {spec.name!r}) differs from the plan's "
            f"({plan.provenance.model_fingerprint}, {plan.provenance.model_name!r}): the plan is for another model"
        )
    num_experts = spec.moe.num_routed_experts if spec.moe is not None else None
    parts = rank_parts(plan, rank=rank, num_experts=num_experts)
    return ReferenceMoETransformer(
        spec,
        router_scoring=router_scoring,
        rope_theta=rope_theta,
        device=device,
        dtype=dtype,
        layers=parts.layers,
        experts=parts.experts,
        embedding=parts.embedding,
        lm_head=parts.lm_head,
    )


# --------------------------------------------------------------------------- recognizing a part
def _expert_containers(module: ReferenceMoETransformer) -> Iterator[tuple[str, nn.ModuleDict, int]]:
    """(FQN, routed-expert container, the model's expert count) of each MoE layer held."""
    for key, layer in module.model.layers.items():
        mlp = getattr(layer, "mlp", None)
        experts = getattr(mlp, "experts", None)
        if isinstance(experts, nn.ModuleDict) and isinstance(
            getattr(mlp, "num_experts", None), int
        ):
            yield f"model.layers.{key}.mlp.experts", experts, mlp.num_experts


def is_rank_part(module: nn.Module) -> bool:
    """Whether ``module`` is a ``ReferenceMoETransformer`` holding less than its spec's model
    (one whose ``spec`` was removed is compared by counts instead, as any module is)."""
    spec = getattr(module, "spec", None)
    if not isinstance(module, ReferenceMoETransformer) or spec is None:
        return False
    backbone = module.model
    if (
        len(backbone.layers) != spec.num_layers
        or backbone.embed_tokens is None
        or module.lm_head is None
    ):
        return True
    return any(len(container) != count for _, container, count in _expert_containers(module))


def _difference(what: str, held, expected) -> str | None:
    missing, extra = sorted(set(expected) - set(held)), sorted(set(held) - set(expected))
    if not missing and not extra:
        return None
    return f"{what}: missing {missing}, extra {extra}"


def _part_differences(module: ReferenceMoETransformer, parts: RankParts) -> list[str]:
    backbone = module.model
    found = [_difference("layers", [int(key) for key in backbone.layers], parts.layers)]
    for name, held, expected in (
        ("embedding", backbone.embed_tokens is not None, parts.embedding),
        ("lm_head", module.lm_head is not None, parts.lm_head),
    ):
        if held != expected:
            gives = "gives" if expected else "does not give"
            found.append(f"{name}: {'held' if held else 'not held'}, the plan {gives} it")
    for name, container, count in _expert_containers(module):
        expected = range(count) if parts.experts is None else parts.experts
        found.append(_difference(name, [int(key) for key in container], expected))
    return [difference for difference in found if difference is not None]


def check_rank_part(
    module: ReferenceMoETransformer, plan: ShardingPlan, *, rank: int | None
) -> None:
    """A part built for a rank must hold exactly what ``plan`` gives ``rank``; with ``rank``
    unknown (no process group yet), what it gives some rank. ``ValueError`` names the difference."""
    num_experts = module.spec.moe.num_routed_experts if module.spec.moe is not None else None
    if rank is not None:
        differences = _part_differences(
            module, rank_parts(plan, rank=rank, num_experts=num_experts)
        )
        if differences:
            raise ValueError(
                f"the module built for a rank differs from what the plan gives rank {rank}: "
                + "; ".join(differences)
            )
        return
    config = plan.config
    moe = mesh_rank_layout(plan).reshape(config.pp, config.edp, config.ep, config.etp)
    for candidate in moe[:, 0, :, 0].reshape(-1).tolist():  # one rank per (pp, ep) coordinate
        if not _part_differences(module, rank_parts(plan, rank=candidate, num_experts=num_experts)):
            return
    raise ValueError(
        "the module built for a rank holds what the plan gives no rank (layers, embedding, head, experts)"
    )


_WHOLE_NAMES: dict[tuple[str, str], list[str]] = {}


def whole_module_names(module: ReferenceMoETransformer) -> list[str]:
    """Module FQNs of the whole model a part was cut from, with one routed expert per MoE layer
    (every layer id, expert id 0): what plan rules are checked against. Cached per spec."""
    spec = module.spec
    key = (spec.fingerprint(), type(module).__qualname__)
    if key not in _WHOLE_NAMES:
        experts = None if spec.moe is None else (0,)
        _WHOLE_NAMES[key] = iter_module_names(
            ReferenceMoETransformer(spec, experts=experts, device="meta")
        )
    return _WHOLE_NAMES[key]
