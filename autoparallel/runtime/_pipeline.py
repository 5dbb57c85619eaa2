"""Pipeline parallel with ``torch.distributed.pipelining``: stages from the plan's stage -> layer map.

A plan's ``stages`` lists pipeline *chunks*: chunk ``c`` holds decoder layers ``[start_layer,
stop_layer)`` and runs on pipeline rank ``c % pp`` (interleaved schedules give a rank
``virtual_stages`` chunks, the looped layout of Narayanan et al. SC'21, arXiv:2104.04473 sec.
2.2). The first chunk also holds the embedding, the last the final norm and the LM head; layer
counts may be uneven (``cost_model.split_layers``).

A chunk module shares its submodules with the model it was cut from, so FQNs are unchanged
(``model.layers.7.mlp.gate.weight`` stays that name on whichever rank holds layer 7) and the
tensor, expert and data parallel passes that follow apply to it like to the whole model. The
model's forward must skip a ``None`` embedding / norm / LM head and iterate ``layers.values()``
of an ``nn.ModuleDict`` keyed by layer id, as ``ReferenceMoETransformer`` does; a transformers
causal LM gets such a forward on each chunk (``_transformers_stages``).

Schedules (the plan's ``pipeline_schedule``): ``gpipe`` (Huang et al. 2019), ``1f1b``
(PipeDream-flush, Narayanan et al. 2021), ``interleaved_1f1b`` (same paper, sec. 2.2) and
``zero_bubble`` (Qi et al. 2024, arXiv:2401.10241, torch's ``ScheduleInterleavedZeroBubble``).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)

from autoparallel.plan import ShardingPlan, StageLayers
from autoparallel.runtime._transformers_stages import (
    as_stage,
    is_transformers_causal_lm,
    keyed_layers,
)

__all__ = [
    "Pipeline",
    "StepOutput",
    "build_pipeline",
    "num_micro_batches_for",
    "split_stage_modules",
    "stage_chunks",
]

logger = logging.getLogger(__name__)

_SINGLE_STAGE_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
_MULTI_STAGE_SCHEDULES = {
    "interleaved_1f1b": ScheduleInterleaved1F1B,
    "zero_bubble": ScheduleInterleavedZeroBubble,
}


def _shallow_copy(module: nn.Module) -> nn.Module:
    """A new module object sharing every parameter, buffer and child with ``module``; its hooks
    so far too, while a hook registered on one copy later stays that copy's."""
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    clone._parameters = dict(module._parameters)
    clone._buffers = dict(module._buffers)
    for key, value in module.__dict__.items():
        if "hooks" in key and isinstance(value, dict):
            clone.__dict__[key] = type(value)(value)
    return clone


def _check_layout(model: nn.Module, plan: ShardingPlan, pp_rank: int) -> None:
    """The module must have the HF causal-LM layout with layers in a ModuleDict keyed by id:
    the whole model's layers, or (a part built for one rank) exactly ``pp_rank``'s."""
    backbone = getattr(model, "model", None)
    layers = getattr(backbone, "layers", None)
    if not isinstance(layers, nn.ModuleDict) or not all(
        hasattr(backbone, n) for n in ("embed_tokens", "norm")
    ):
        raise ValueError(
            f"module ({type(model).__name__}) must have model.embed_tokens, model.layers (an nn.ModuleDict "
            "keyed by layer id), model.norm and lm_head to be split into pipeline stages"
        )
    expected = max((stage.stop_layer for stage in plan.stages), default=0)
    if _is_stage_part(model, expected):
        _check_stage_part(model, plan, pp_rank)
    elif len(layers) != expected:
        raise ValueError(
            f"module has {len(layers)} layers; the plan's stages cover {expected} layers"
        )
    lm_head = getattr(model, "lm_head", None)
    if (
        plan.config.pp > 1
        and lm_head is not None
        and lm_head.weight is getattr(backbone.embed_tokens, "weight", None)
    ):
        raise ValueError(
            "tied embeddings (lm_head.weight is embed_tokens.weight) are not supported with pp > 1"
        )


def _is_stage_part(model: nn.Module, num_layers: int) -> bool:
    """A model built with only some of its spec's ``num_layers`` layers, or without its embedding
    or head (``ReferenceMoETransformer(..., layers=..., embedding=..., lm_head=...)``)."""
    declared = getattr(getattr(model, "spec", None), "num_layers", None)
    if declared != num_layers:
        return False
    backbone = model.model
    return (
        len(backbone.layers) != declared
        or backbone.embed_tokens is None
        or getattr(model, "lm_head", None) is None
    )


def _check_stage_part(model: nn.Module, plan: ShardingPlan, pp_rank: int) -> None:
    """A stage part must hold exactly ``pp_rank``'s layers, embedding and head; else ValueError."""
    chunks = stage_chunks(plan, pp_rank)
    expected = {i for chunk in chunks for i in range(chunk.start_layer, chunk.stop_layer)}
    held = {int(key) for key in model.model.layers}
    if held != expected:
        raise ValueError(
            f"module holds layers {sorted(held)}; the plan gives pipeline rank {pp_rank} layers {sorted(expected)} "
            f"(missing {sorted(expected - held)}, extra {sorted(held - expected)})"
        )
    for name, held_part, wanted in (
        (
            "model.embed_tokens",
            model.model.embed_tokens is not None,
            any(c.has_embedding for c in chunks),
        ),
        ("lm_head", model.lm_head is not None, any(c.has_lm_head for c in chunks)),
    ):
        if held_part != wanted:
            raise ValueError(
                f"module {'holds' if held_part else 'lacks'} {name}; the plan's chunks of pipeline rank {pp_rank} "
                f"{'include' if wanted else 'do not include'} it"
            )


def stage_chunks(plan: ShardingPlan, pp_rank: int) -> list[StageLayers]:
    """The chunks pipeline rank ``pp_rank`` runs, in chunk order."""
    chunks = sorted((s for s in plan.stages if s.stage == pp_rank), key=lambda s: s.chunk)
    if not chunks:
        raise ValueError(
            f"the plan's stages give pipeline rank {pp_rank} no chunk (stages: {len(plan.stages)})"
        )
    return chunks


def _cut(model: nn.Module, chunk: StageLayers, *, in_place: bool) -> nn.Module:
    """The part of ``model`` one chunk runs (layers, plus embedding / norm and head at the ends)."""
    top = model if in_place else _shallow_copy(model)
    backbone = top.model if in_place else _shallow_copy(model.model)
    keys = [str(i) for i in range(chunk.start_layer, chunk.stop_layer)]
    backbone.layers = type(model.model.layers)({key: model.model.layers[key] for key in keys})
    if not chunk.has_embedding:
        backbone.embed_tokens = None
    if not chunk.has_lm_head:
        backbone.norm = None
        top.lm_head = None
    top.model = backbone
    return top


def split_stage_modules(
    model: nn.Module, *, plan: ShardingPlan, pp_rank: int
) -> list[tuple[StageLayers, nn.Module]]:
    """Cut ``model`` into the chunk modules pipeline rank ``pp_rank`` runs.

    With one chunk per rank the model itself is cut in place; with several, each chunk is a
    shallow copy sharing the model's submodules, and the model keeps only what its chunks use.
    Either way the layers (and embedding / head) of other ranks are dropped, so their memory
    can be freed. A model built with only this rank's layers (``_rank_build.build_for_rank``)
    is used as it is. Raises ``ValueError`` when the module does not match the plan's layers.
    """
    transformers = is_transformers_causal_lm(model)
    if transformers:
        keyed_layers(model)
    _check_layout(model, plan, pp_rank)
    chunks = stage_chunks(plan, pp_rank)
    if len(chunks) == 1:
        cut = [(chunks[0], _cut(model, chunks[0], in_place=True))]
    else:
        cut = [(chunk, _cut(model, chunk, in_place=False)) for chunk in chunks]
        _prune(model, chunks)
    if transformers:
        cut = [(chunk, as_stage(module)) for chunk, module in cut]
    return cut


def _prune(model: nn.Module, chunks: list[StageLayers]) -> None:
    """Drop from ``model`` the layers, embedding and head none of ``chunks`` uses."""
    keep = {str(i) for chunk in chunks for i in range(chunk.start_layer, chunk.stop_layer)}
    backbone = model.model
    backbone.layers = type(backbone.layers)(
        {key: layer for key, layer in backbone.layers.items() if key in keep}
    )
    if not any(chunk.has_embedding for chunk in chunks):
        backbone.embed_tokens = None
    if not any(chunk.has_lm_head for chunk in chunks):
        backbone.norm = None
        model.lm_head = None


def num_micro_batches_for(plan: ShardingPlan, *, local_batch_sequences: int | None = None) -> int:
    """Micro-batches per step: the local batch (default: the plan's training batch / dp) divided
    by ``config.micro_batch_size``; both must divide."""
    config = plan.config
    if local_batch_sequences is None:
        global_batch = getattr(plan.job, "global_batch_sequences", None)
        if not global_batch:
            raise ValueError(
                "the plan's workload has no global_batch_sequences; pass local_batch_sequences"
            )
        return config.num_micro_batches(int(global_batch))
    if local_batch_sequences % config.micro_batch_size:
        raise ValueError(
            f"local_batch_sequences ({local_batch_sequences}) must be divisible by "
            f"micro_batch_size ({config.micro_batch_size})"
        )
    return local_batch_sequences // config.micro_batch_size


class StepOutput(NamedTuple):
    """One pipeline step's results on this rank: the mean micro-batch loss and, where the step
    was asked to return them, the merged outputs (logits) on the last stage; ``None`` on the
    others."""

    loss: torch.Tensor | None
    outputs: torch.Tensor | None


@dataclass
class Pipeline:
    """This rank's pipeline: its chunk modules, torch's stages and the schedule.

    ``step(inputs, targets=...)`` runs one training step of all micro-batches (inputs are used
    on the first stage, targets on the last); ``schedule`` is torch's schedule object for
    anything else (``schedule.eval(...)`` runs forward only).
    """

    plan: ShardingPlan
    modules: list[nn.Module]
    chunks: list[StageLayers]
    stages: list[PipelineStage]
    schedule: Any
    num_micro_batches: int

    @property
    def is_first(self) -> bool:
        return any(chunk.has_embedding for chunk in self.chunks)

    @property
    def is_last(self) -> bool:
        return any(chunk.has_lm_head for chunk in self.chunks)

    def step(
        self,
        inputs: torch.Tensor | None = None,
        *,
        targets: torch.Tensor | None = None,
        return_outputs: bool = False,
    ) -> StepOutput:
        """One forward and backward pass of every micro-batch; gradients accumulate in the modules
        (averaged over micro-batches, so they are those of the mean loss of the local batch).

        ``return_outputs``: the last stage keeps every micro-batch's output (the logits) until the
        step ends and returns them merged (torch's ``forward_one_chunk`` appends each to
        ``output_chunks`` when asked to save it). Off by default: a training step needs only the
        loss, and the kept logits are micro-batches x tokens x vocabulary / tp values, which the
        cost model does not count unless ``EstimateOptions.pipeline_keeps_outputs`` says so."""
        losses: list[torch.Tensor] = []
        if self.is_first and inputs is None:
            raise ValueError("inputs (None) must be given on the first pipeline stage")
        if self.is_last and targets is None:
            raise ValueError("targets (None) must be given on the last pipeline stage")
        for tensor, name in ((inputs, "inputs"), (targets, "targets")):
            if tensor is not None and tensor.shape[0] % self.num_micro_batches:
                raise ValueError(
                    f"{name} batch ({tensor.shape[0]}) must be divisible by the number of micro-batches "
                    f"({self.num_micro_batches})"
                )
        args = (inputs,) if self.is_first else ()
        kwargs = {"target": targets, "losses": losses} if self.is_last else {}
        outputs = self.schedule.step(*args, return_outputs=return_outputs, **kwargs)
        if not self.is_last:
            return StepOutput(loss=None, outputs=None)
        return StepOutput(
            loss=torch.stack(losses).mean().detach(), outputs=outputs if return_outputs else None
        )


def _check_schedule(plan: ShardingPlan, *, num_local_chunks: int, num_micro_batches: int) -> None:
    """The schedule's rules on chunks per rank and micro-batches, before any stage is built."""
    config, name = plan.config, plan.config.pipeline_schedule
    if name not in _SINGLE_STAGE_SCHEDULES and name not in _MULTI_STAGE_SCHEDULES:
        known = sorted(_SINGLE_STAGE_SCHEDULES) + sorted(_MULTI_STAGE_SCHEDULES)
        raise ValueError(f"pipeline_schedule ({name!r}) is not one of {known}")
    if name in _SINGLE_STAGE_SCHEDULES and num_local_chunks != 1:
        raise ValueError(
            f"pipeline_schedule ({name!r}) runs one chunk per rank; this rank has {num_local_chunks}"
        )
    if num_micro_batches < 1:
        raise ValueError(f"num_micro_batches ({num_micro_batches}) must be >= 1")
    if name == "interleaved_1f1b" and num_micro_batches % config.pp:
        raise ValueError(
            f"num_micro_batches ({num_micro_batches}) must be divisible by pp ({config.pp}) "
            "for pipeline_schedule 'interleaved_1f1b'"
        )


def build_pipeline(
    stage_modules: list[tuple[StageLayers, nn.Module]],
    *,
    plan: ShardingPlan,
    pp_group,
    device: torch.device,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    num_micro_batches: int,
) -> Pipeline:
    """Wrap chunk modules in ``PipelineStage``s and build the plan's schedule.

    Args:
        stage_modules: ``split_stage_modules``'s result, after any tensor/expert/data parallel.
        plan: names the schedule (``config.pipeline_schedule``) and the number of chunks.
        pp_group: the pipeline process group (the dense mesh's ``pp`` axis).
        device: the device the stages run on.
        loss_fn: ``loss_fn(output, target) -> scalar`` on the last stage, a micro-batch mean.
        num_micro_batches: micro-batches per step (``num_micro_batches_for``).

    Raises:
        ValueError: a single-chunk schedule with several chunks on this rank, or a micro-batch
            count the schedule cannot run; raised before any stage is built.
    """
    config = plan.config
    _check_schedule(plan, num_local_chunks=len(stage_modules), num_micro_batches=num_micro_batches)
    num_chunks = config.pp * config.virtual_stages
    stages = [
        PipelineStage(module, chunk.chunk, num_chunks, device, group=pp_group)
        for chunk, module in stage_modules
    ]
    name = config.pipeline_schedule
    if name in _SINGLE_STAGE_SCHEDULES:
        schedule = _SINGLE_STAGE_SCHEDULES[name](
            stages[0], n_microbatches=num_micro_batches, loss_fn=loss_fn
        )
    else:
        schedule = _MULTI_STAGE_SCHEDULES[name](
            stages, n_microbatches=num_micro_batches, loss_fn=loss_fn
        )
    logger.info(
        "pipeline: chunks %s, schedule %s, %d micro-batches",
        [c.chunk for c, _ in stage_modules],
        name,
        num_micro_batches,
    )
    return Pipeline(
        plan=plan,
        modules=[module for _, module in stage_modules],
        chunks=[chunk for chunk, _ in stage_modules],
        stages=stages,
        schedule=schedule,
        num_micro_batches=num_micro_batches,
    )
