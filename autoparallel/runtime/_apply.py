"""``apply_plan``: a thin interpreter of a ``ShardingPlan`` over a real ``torch.nn.Module``.

Order of passes (each one reads only the plan and the meshes): checks -> meshes -> pipeline cut
(``_pipeline``) -> tensor/sequence parallel (``_tensor_parallel``) -> expert parallel
(``_expert_parallel``) -> context parallel (``_context_parallel``) -> data parallel over dp x cp
(``_data_parallel``) -> pipeline schedule. Every check that can fail on user input runs before the
first collective.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from autoparallel.plan import ModuleRule, ShardingPlan, load_plan
from autoparallel.runtime._context_parallel import (
    ContextParallel,
    apply_context_parallel,
    check_context_parallel_module,
    check_sequence_length,
    replica_mesh,
)
from autoparallel.runtime._data_parallel import DataParallel, apply_data_parallel
from autoparallel.runtime._mesh import Meshes, build_meshes, mesh_rank_layout
from autoparallel.runtime._rank_build import check_rank_part, is_rank_part, whole_module_names
from autoparallel.runtime._tensor_parallel import (
    TensorParallel,
    apply_tensor_parallel,
    match_rules,
    walk_modules,
)

__all__ = ["AppliedPlan", "apply_plan", "check_plan_fits"]

logger = logging.getLogger(__name__)

_APPLIED = "_autoparallel_applied_plan"


@dataclass
class AppliedPlan:
    """The result of ``apply_plan`` on one rank.

    Attributes:
        plan: the plan that was applied.
        meshes: ``meshes.dense`` (pp, dp, cp, tp), ``meshes.moe`` (pp, edp, ep, etp), ``meshes.device``.
        modules: this rank's modules: the whole (parallelized) model, or its pipeline chunks.
        pipeline: the ``_pipeline.Pipeline`` (stages + schedule) when pp > 1, else ``None``.
        tensor_parallel, expert_parallel, data_parallel: what each pass did (``None`` if skipped).
        context_parallel: this rank's cp group and sequence collectives when cp > 1, else ``None``.
    """

    plan: ShardingPlan
    meshes: Meshes
    modules: list[nn.Module]
    pipeline: Any = None
    tensor_parallel: list[TensorParallel] = field(default_factory=list)
    expert_parallel: list[Any] = field(default_factory=list)
    data_parallel: DataParallel | None = None
    context_parallel: ContextParallel | None = None

    @property
    def module(self) -> nn.Module:
        """This rank's module (its first pipeline chunk when pp > 1)."""
        return self.modules[0]

    @property
    def schedule(self) -> Any:
        """torch's pipeline schedule, or ``None`` without pipeline parallel."""
        return None if self.pipeline is None else self.pipeline.schedule

    @property
    def device(self) -> torch.device:
        return self.meshes.device

    def shard_inputs(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """This rank's tokens of each (batch, sequence, ...) tensor of its data-parallel replica's
        batch (e.g. ``input_ids, targets``): with cp > 1, chunks ``r`` and ``2*cp-1-r`` of the
        sequence's ``2*cp`` chunks for cp rank ``r``; with cp == 1, the tensors unchanged.
        Raises ``ValueError`` when the sequence length is not a multiple of ``2*cp``."""
        if self.context_parallel is None:
            return tensors
        return tuple(
            self.context_parallel.shard(t, field=f"tensors[{i}]") for i, t in enumerate(tensors)
        )

    def gather_sequence(self, tensor: torch.Tensor) -> torch.Tensor:
        """Whole sequences in global token order from this rank's local (batch, tokens, ...) part,
        e.g. logits (collective over cp; unchanged when cp == 1; not autograd-aware)."""
        return tensor if self.context_parallel is None else self.context_parallel.unshard(tensor)

    def parameters(self) -> list[nn.Parameter]:
        """Every parameter this rank holds (for the optimizer), each once."""
        seen: dict[int, nn.Parameter] = {}
        for module in self.modules:
            for parameter in module.parameters():
                seen.setdefault(id(parameter), parameter)
        return list(seen.values())

    def sync_gradients(self) -> None:
        """Finish the step's gradients after backward (all micro-batches), before the optimizer:
        tp sums of replicated weights applied to sequence shards, expert gradients over edp and
        replicas, then the dp average under replication (FSDP reduced during backward)."""
        for tensor_parallel in self.tensor_parallel:
            tensor_parallel.sync_gradients()
        for expert_parallel in self.expert_parallel:
            expert_parallel.sync_gradients()
        if self.data_parallel is not None:
            self.data_parallel.sync_gradients()


# ----------------------------------------------------------------------------- checks
def _launched_world_size() -> int | None:
    if dist.is_initialized():
        return dist.get_world_size()
    value = os.environ.get("WORLD_SIZE")
    return int(value) if value else None


def _launched_rank() -> int | None:
    if dist.is_initialized():
        return dist.get_rank()
    value = os.environ.get("RANK")
    return int(value) if value else None


def _count_layers(module: nn.Module) -> int | None:
    layers = getattr(getattr(module, "model", module), "layers", None)
    return len(layers) if isinstance(layers, (nn.ModuleDict, nn.ModuleList)) else None


def _count_experts(walked: list[tuple[str, nn.Module]]) -> set[int]:
    return {
        len(child)
        for name, child in walked
        if name.endswith("experts")
        and not name.endswith("shared_experts")
        and isinstance(child, (nn.ModuleDict, nn.ModuleList))
    }


def _check_model(
    module: nn.Module, plan: ShardingPlan, walked: list[tuple[str, nn.Module]]
) -> None:
    """The module must be the plan's model: fingerprint (when it carries a spec), layers, experts."""
    spec = getattr(module, "spec", None)
    provenance = plan.provenance
    if (
        spec is not None
        and hasattr(spec, "fingerprint")
        and spec.fingerprint() != provenance.model_fingerprint
    ):
        raise ValueError(
            f"module's model fingerprint ({spec.fingerprint()}, {spec.name!r}) differs from the plan's "
            f"({provenance.model_fingerprint}, {provenance.model_name!r}): the plan is for another model"
        )
    if is_rank_part(module):  # built for one rank (``build_for_rank``): exactly that rank's parts
        check_rank_part(module, plan, rank=_launched_rank())
    else:
        _check_counts(module, plan, walked)
    if spec is not None and hasattr(spec, "attention"):
        redundant = (
            plan.expert_placement.num_redundant_experts if plan.expert_placement is not None else 0
        )
        plan.config.validate_for(spec, num_redundant_experts=redundant)


def _check_counts(
    module: nn.Module, plan: ShardingPlan, walked: list[tuple[str, nn.Module]]
) -> None:
    planned_layers = max((stage.stop_layer for stage in plan.stages), default=None)
    layers = _count_layers(module)
    if planned_layers is not None and layers is not None and layers != planned_layers:
        raise ValueError(
            f"module has {layers} layers; the plan's stages cover {planned_layers} layers"
        )
    experts = _count_experts(walked)
    placement = plan.expert_placement
    if placement is not None and experts and experts != {placement.num_experts}:
        raise ValueError(
            f"module's MoE blocks hold {sorted(experts)} experts; the plan's expert placement has {placement.num_experts}"
        )


def _check_rules(
    module: nn.Module, plan: ShardingPlan, names: list[str]
) -> dict[ModuleRule, list[str]]:
    matches = match_rules(module, plan.module_rules, names=names)
    for rule, names in matches.items():
        if not names:
            raise ValueError(
                f"module rule {rule.pattern!r} ({rule.style} over {rule.mesh_axis}) matches no module of "
                f"{type(module).__name__}"
            )
    return matches


#: Decoder sub-blocks that mix the sequence and that no module rule splits or gathers for:
#: linear attention (transformers' Qwen3-Next / Qwen3.5 ``linear_attn``, Gated DeltaNet).
_UNGATHERED_MIXERS = ("linear_attn",)


def _check_sequence_mixers(walked: list[tuple[str, nn.Module]], plan: ShardingPlan) -> None:
    """Under sequence parallel each rank holds a shard of the sequence between blocks; a block
    that mixes tokens and is not gathered for would read only its shard: an error naming it."""
    if not plan.config.sequence_parallel or plan.config.tp == 1:
        return
    for name, _ in walked:
        if name.rpartition(".")[2] in _UNGATHERED_MIXERS:
            raise ValueError(
                f"{name} mixes the sequence (linear attention) and is not gathered for under "
                f"sequence parallel here; plan it without sequence parallel"
            )


def _check_context_parallel(module: nn.Module, plan: ShardingPlan) -> None:
    cp = plan.config.cp
    if cp == 1:
        return
    check_context_parallel_module(module, cp=cp)
    workload = plan.job
    if workload.kind == "inference":
        raise ValueError(
            f"cp ({cp}) must be 1 for an inference plan: generation under context parallel is not supported"
        )
    check_sequence_length(workload.sequence_length_tokens, cp, field="job.sequence_length_tokens")


def check_plan_fits(module: nn.Module, plan: ShardingPlan) -> None:
    """Every check ``apply_plan`` makes before communicating; raises ``ValueError`` naming what differs."""
    if getattr(module, _APPLIED, None) is not None:
        raise ValueError(
            "apply_plan was already applied to this module; build a fresh module to apply a plan again"
        )
    world = _launched_world_size()
    if world is not None and world != plan.world_size:
        raise ValueError(
            f"plan world_size ({plan.world_size}) differs from the launched world size ({world})"
        )
    mesh_rank_layout(plan)
    _check_context_parallel(module, plan)
    walked = walk_modules(module)
    _check_model(module, plan, walked)
    _check_sequence_mixers(walked, plan)
    names = [name for name, _ in walked]
    # A rank's part is checked against the whole model's names: rules may name other ranks' modules.
    _check_rules(
        module, plan, names + whole_module_names(module) if is_rank_part(module) else names
    )


# ----------------------------------------------------------------------------- passes
def _stage_modules(
    module: nn.Module, plan: ShardingPlan, meshes: Meshes
) -> list[tuple[Any, nn.Module]]:
    if plan.config.pp == 1:
        return [(None, module)]
    from autoparallel.runtime._pipeline import split_stage_modules

    return split_stage_modules(module, plan=plan, pp_rank=meshes.coordinate("pp"))


def _parallelize(
    chunk: nn.Module, plan: ShardingPlan, meshes: Meshes, applied: AppliedPlan
) -> None:
    config = plan.config
    matches = match_rules(chunk, plan.module_rules)
    if config.tp > 1 and not config.attention_data_parallel:
        applied.tensor_parallel.append(
            apply_tensor_parallel(chunk, plan=plan, tp_mesh=meshes.dense["tp"], matches=matches)
        )
    if config.ep > 1 or config.etp > 1:
        from autoparallel.runtime._expert_parallel import apply_expert_parallel

        applied.expert_parallel.append(
            apply_expert_parallel(chunk, plan=plan, moe_mesh=meshes.moe, dense_mesh=meshes.dense)
        )


def _build_pipeline(
    stage_modules: list[tuple[Any, nn.Module]],
    plan: ShardingPlan,
    meshes: Meshes,
    *,
    loss_fn: Callable | None,
    num_micro_batches: int | None,
) -> Any:
    from autoparallel.runtime._pipeline import build_pipeline, num_micro_batches_for

    if loss_fn is None:
        raise ValueError(f"loss_fn (None) must be given for a plan with pp ({plan.config.pp}) > 1")
    if num_micro_batches is None:
        num_micro_batches = num_micro_batches_for(plan)
    return build_pipeline(
        stage_modules,
        plan=plan,
        pp_group=meshes.dense["pp"].get_group(),
        device=meshes.device,
        loss_fn=loss_fn,
        num_micro_batches=num_micro_batches,
    )


def _hold_experts_per_expert(module: nn.Module, plan: ShardingPlan) -> None:
    """transformers 5's fused expert weights as the per-expert modules the rules name, under
    expert parallel or expert TP (under tensor parallel alone, only Llama 4's, whose block
    routes every token through every expert); the same function, before any check."""
    config = plan.config
    if getattr(module, _APPLIED, None) is None and max(config.tp, config.ep, config.etp) > 1:
        from autoparallel.runtime._fused_experts import unfuse_experts

        unfuse_experts(module, dense_routing_only=config.ep == config.etp == 1)


def apply_plan(
    module: nn.Module,
    plan: ShardingPlan | str | Path,
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    num_micro_batches: int | None = None,
    device_type: str | None = None,
    backend: str | None = None,
) -> AppliedPlan:
    """Parallelize ``module`` in place as ``plan`` says, on this rank of the launched world.

    Mutates ``module``: with pp > 1 the layers of other stages are dropped (and, with virtual
    stages, chunk modules sharing its submodules are made); tp-split weights become DTensors;
    routed-expert containers keep only this rank's experts and MoE blocks get an all-to-all
    dispatcher; under FSDP (zero_stage >= 1) weights become dp-sharded DTensors (dp x cp with
    context parallel); with cp > 1 attention modules get a ``sequence_context`` that gathers K/V
    over cp (feed each rank ``AppliedPlan.shard_inputs`` of its batch). Parameter FQNs are
    unchanged, but for transformers 5's fused routed experts (3-D ``gate_up_proj`` /
    ``down_proj``), which expert parallel holds as one module per expert, named as in the
    checkpoint files (``experts.E.gate_proj.weight``). Applying a plan twice to one module is an
    error (``ValueError``), not a no-op.
    A model built with only this rank's part (``build_for_rank``: its stage's layers, its
    experts) is checked to be exactly that part and not cut again.

    Needs one process per rank (torchrun or ``autoparallel.runtime.run_ranks``); initializes
    the default process group if needed (``backend``, else the device's default). Weights may
    be on ``device_type``'s device, on CPU (moved), or on the meta device (shapes only).

    Args:
        module: the model (e.g. ``ReferenceMoETransformer``, or a HuggingFace-named module).
        plan: a ``ShardingPlan`` or a path / JSON text of one.
        loss_fn: ``loss_fn(logits, targets)``, needed by pipeline schedules (pp > 1).
        num_micro_batches: pipeline micro-batches per step (default from the plan's workload).
        device_type: force the device type (default: the current accelerator, else ``cpu``).
        backend: force the process-group backend (default: the device type's default).

    Returns:
        An ``AppliedPlan``: meshes, this rank's module(s), the pipeline schedule, and
        ``sync_gradients()`` to call after backward.

    Raises:
        ValueError: before any collective, when the plan's world size differs from the launched
            one, the plan is for another model (fingerprint, layer or expert count), a model built
            for a rank is not this rank's part (layers, experts, embedding, head), a module rule
            matches no module, or the plan was already applied to ``module``.
    """
    if not isinstance(plan, ShardingPlan):
        plan = load_plan(plan)
    _hold_experts_per_expert(module, plan)
    check_plan_fits(module, plan)
    meshes = build_meshes(plan, device_type=device_type, backend=backend)
    if meshes.device.type not in ("cpu", "meta") and not any(
        p.is_meta for p in module.parameters()
    ):
        module.to(meshes.device)
    stage_modules = _stage_modules(module, plan, meshes)
    applied = AppliedPlan(plan=plan, meshes=meshes, modules=[chunk for _, chunk in stage_modules])
    for _, chunk in stage_modules:
        _parallelize(chunk, plan, meshes, applied)
    if plan.config.cp > 1:
        applied.context_parallel = apply_context_parallel(
            applied.modules, cp_mesh=meshes.dense["cp"]
        )
    if plan.config.dp * plan.config.cp > 1:  # each cp rank's loss is another replica's, as dp's
        ignored = {p for ep in applied.expert_parallel for p in ep.expert_parameters()}
        applied.data_parallel = apply_data_parallel(
            applied.modules, plan=plan, dp_mesh=replica_mesh(meshes.dense), ignored=ignored
        )
    if plan.config.pp > 1:
        applied.pipeline = _build_pipeline(
            stage_modules, plan, meshes, loss_fn=loss_fn, num_micro_batches=num_micro_batches
        )
    setattr(module, _APPLIED, plan)
    logger.info("applied plan %s on rank %d", plan.config, dist.get_rank())
    return applied
