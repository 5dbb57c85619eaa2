"""The per-table quantities every training formula reads: ``TrainingContext``.

``training_context`` derives, once per config table, the stage layout (``_stages.stage_layout``),
the placement of each axis's group (``_pricing.ranks_per_node``), the micro-batch count and the
config columns as float64; the framework profile (``_frameworks``) replaces the option defaults
of the kernels it runs (FlashAttention, fused gradient accumulation). The context answers the
questions the formulas share: tokens of one micro-batch on a rank (b * s / cp; Megatron-core
folds the MoE tokens over tp), the layers full recompute repeats (Megatron-core
``--recompute-granularity full --recompute-method block --recompute-num-layers``), the bytes of
a gradient element (Megatron-LM's fp32 ``main_grad``) and of its data-parallel reduction, the
overlap fraction of each communication kind (Megatron-core ``--tp-comm-overlap``; a
bidirectional, DualPipe-style schedule hides the EP all-to-all), and the roofline time of an
operator under the workload's precision (``_precision.training_op_time_s``) and of a collective
on its placed group (``_pricing.collective_time_s``). Split from ``_training``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from cost_model._frameworks import FrameworkProfile, framework_profile
from cost_model._model_spec import ModelSpec
from cost_model._options import Calibration, EstimateOptions
from cost_model._precision import training_op_time_s
from cost_model._pricing import collective_time_s, ranks_per_node
from cost_model._stages import (
    StageLayout,
    layer_weights_per_device,
    parameters_per_device,
    stage_layout,
)
from cost_model._table import CONFIG_COLUMNS, RECOMPUTE_CODES, select_rows, table_length
from cost_model._workload import Training

if TYPE_CHECKING:
    from topology import Cluster

__all__ = ["TrainingContext", "training_context"]


@dataclass(frozen=True)
class TrainingContext:
    """Per-table quantities every training formula needs (arrays of shape (n,) or (3, n))."""

    model: ModelSpec
    cluster: Cluster
    workload: Training
    options: EstimateOptions
    calibration: Calibration
    table: Mapping[str, np.ndarray]
    layout: StageLayout
    local: dict[str, np.ndarray]
    num_micro_batches: np.ndarray
    batch_divides: np.ndarray
    columns: dict[str, np.ndarray]

    def column(self, name: str) -> np.ndarray:
        """A config column as float64 (converted once)."""
        return self.columns[name]

    @cached_property
    def parameters(self) -> dict[str, np.ndarray]:
        """``parameters_per_device`` of each pipeline rank (rows ``STAGES``)."""
        return parameters_per_device(model=self.model, table=self.table, layout=self.layout)

    def restricted(self, rows: np.ndarray) -> TrainingContext:
        """The same estimate over a subset of the rows."""
        return training_context(
            model=self.model,
            cluster=self.cluster,
            workload=self.workload,
            options=self.options,
            table=select_rows(self.table, rows),
        )

    @property
    def sequence_parallel(self) -> np.ndarray:
        return np.asarray(self.table["sequence_parallel"], dtype=bool)

    @cached_property
    def tokens(self) -> np.ndarray:
        """Tokens of one micro-batch on one rank of the attention/dense part: b * s / cp."""
        return (
            self.column("micro_batch_size")
            * self.workload.sequence_length_tokens
            / self.column("cp")
        )

    @cached_property
    def moe_tokens(self) -> np.ndarray:
        """Tokens one rank routes: the attention tokens split over tp (Megatron-core folding).

        Without sequence parallel the tp ranks hold the same tokens; the runtime splits them
        among the tp ranks only on the expert-parallel path (ep or etp > 1). With ep = etp = 1
        every tp rank routes every token through its replicated experts, so nothing is split.
        """
        split = self.sequence_parallel | (self.column("ep") > 1) | (self.column("etp") > 1)
        return np.where(split, self.tokens / self.column("tp"), self.tokens)

    @cached_property
    def fully_recomputed_layers(self) -> np.ndarray:
        """Layers of each pipeline rank (rows ``STAGES``) whose forward full recompute repeats in
        backward: every layer, or the first ``EstimateOptions.recompute_layers`` of each of the
        rank's v model chunks (Megatron-core ``--recompute-granularity full --recompute-method
        block --recompute-num-layers``); zero unless ``recompute`` is ``full``."""
        layers = self.layout.layers
        if self.options.recompute_layers is not None:
            chunks = self.column("virtual_stages")
            layers = np.minimum(self.options.recompute_layers * chunks, layers)
        full = np.asarray(self.table["recompute"]) == RECOMPUTE_CODES["full"]
        return np.where(full, layers, 0.0)

    @cached_property
    def full_recompute_share(self) -> np.ndarray:
        """``fully_recomputed_layers`` over the rank's layers (3, n): 1 for full recompute of every
        layer, 0 without full recompute."""
        return self.fully_recomputed_layers / np.maximum(self.layout.layers, 1.0)

    @cached_property
    def stage_copies(self) -> np.ndarray:
        """Pipeline stages each rank holds and trains (n,): two under a bidirectional
        (DualPipe-style) schedule with pp > 1, whose ranks hold stage i and stage pp - 1 - i so
        that micro-batches enter from both ends ("DualPipe requires keeping two copies of the
        model parameters", DeepSeek-V3 report sec. 3.2.1 and Table 2: parameters 2x against
        1F1B's 1x); their weights, gradients and optimizer states are the rank's twice over, and
        each copy's gradients are reduced with the other's. A micro-batch still runs one stage
        per rank, so compute per step is 1F1B's; one elsewhere."""
        two = self.options.bidirectional_pipeline & (self.column("pp") > 1)
        return np.where(two, 2.0, 1.0)

    @property
    def optimizer_state_bytes(self) -> float:
        """Bytes per parameter of one optimizer moment: fp32, or bf16 where the run keeps its
        moments in bf16 (``Training.optimizer_state_dtype``)."""
        return 2.0 if self.workload.optimizer_state_dtype == "bf16" else 4.0

    @property
    def grad_bytes(self) -> float:
        """fp32 main gradients with fp32 master weights (Megatron-LM's ``main_grad``), else 2."""
        return (
            4.0
            if self.workload.master_weights_fp32 and self.workload.gradient_dtype == "fp32"
            else 2.0
        )

    @cached_property
    def framework(self) -> FrameworkProfile | None:
        name = self.workload.framework
        return None if name is None else framework_profile(name)

    @property
    def reduce_bytes(self) -> float:
        """Bytes per gradient element the data-parallel reduction moves: the framework's
        reduction dtype where it has its own, else the main gradients' (``grad_bytes``)."""
        if self.framework is None or self.framework.gradient_reduce_bytes is None:
            return self.grad_bytes
        return float(self.framework.gradient_reduce_bytes)

    @property
    def dp_overlap(self) -> float:
        """Fraction of data-parallel traffic that may hide behind compute: the framework's
        overlap features, else the calibration's."""
        if self.framework is None:
            return self.calibration.overlap_fraction("dp_comm")
        return self.framework.dp_comm_overlap

    def overlap_fraction(self, kind: str):
        """Fraction of a TP/EP/CP communication kind that may hide behind compute. With a
        framework, tensor-parallel overlap is its feature (Megatron-core ``--tp-comm-overlap``
        pipelines the sequence-parallel all-gather / reduce-scatter with the GEMMs, only with
        sequence parallel) unless the run turns it off (``EstimateOptions.tp_comm_overlap``);
        a bidirectional (DualPipe-style) schedule hides the EP all-to-all
        behind the paired chunk's compute (Megatron-core's EP communication overlap,
        ``EstimateOptions.expert_parallel_comm_overlap``, is priced per merged layer pair by
        ``_training_ep_overlap``); an all-gather context parallel is exposed; the rest, and
        everything without a framework, the calibration's."""
        if kind == "ep_comm" and self.options.bidirectional_pipeline:
            return 1.0
        if kind == "cp_comm" and self.options.context_parallel == "all_gather":
            return 0.0
        if kind == "tp_comm" and self.options.tp_comm_overlap is not None:
            # the run's own setting: pipelined with the GEMMs (sequence parallel only) or not
            on = self.options.tp_comm_overlap
            return np.where(self.sequence_parallel & on, 1.0, 0.0)
        if kind == "tp_comm" and self.framework is not None:
            return np.where(self.sequence_parallel, self.framework.tp_comm_overlap, 0.0)
        return self.calibration.overlap_fraction(kind)

    @property
    def moe_dispatch_syncs(self) -> bool:
        """Every MoE layer's forward copies its token counts to the host and waits
        (``FrameworkProfile.moe_dispatch_host_sync``), unless the experts' inputs are padded to
        a static capacity (``EstimateOptions.moe_pad_to_capacity``: the counts come from the
        capacity)."""
        return (
            self.framework is not None
            and self.framework.moe_dispatch_host_sync
            and not self.options.moe_pad_to_capacity
        )

    @property
    def fused_elementwise(self) -> bool:
        """Fused norm, activation and rotary kernels (every framework profile says; True
        without one, the Megatron-core default the calibrations were fitted with)."""
        return True if self.framework is None else self.framework.fused_elementwise

    @property
    def zero2_reduce_every_micro_batch(self) -> bool:
        return True if self.framework is None else self.framework.zero2_reduce_every_micro_batch

    @property
    def zeroes_gradient_buffer_each_step(self) -> bool:
        return self.framework is not None and self.framework.zeroes_gradient_buffer_each_step

    @property
    def last_gradient_bucket_exposed(self) -> bool:
        return self.framework is not None and self.framework.last_gradient_bucket_exposed

    @property
    def pipeline_reshard_after_forward(self) -> bool:
        """``FrameworkProfile.pipeline_reshard_after_forward``; True without a framework (the
        plan as ``autoparallel.apply_plan`` runs it: ZeRO-3 is ``reshard_after_forward=True``)."""
        return True if self.framework is None else self.framework.pipeline_reshard_after_forward

    @property
    def torch_pipelining(self) -> bool:
        """``FrameworkProfile.torch_pipelining``; True without a framework (the plan as
        ``autoparallel.apply_plan`` runs it, on torch.distributed.pipelining)."""
        return True if self.framework is None else self.framework.torch_pipelining

    @property
    def tp_saves_gathered_input(self) -> bool:
        """``FrameworkProfile.tp_saves_gathered_input``; True without a framework (the plan as
        ``autoparallel.apply_plan`` runs it: tensor parallel as a DTensor plan)."""
        return True if self.framework is None else self.framework.tp_saves_gathered_input

    def op(
        self, flops, bytes_moved, calls=1.0, kind: str = "matmul", role: str = "linear"
    ) -> np.ndarray:
        """Roofline time under the workload's precision; in fp8 training only the GEMMs whose
        ``role`` runs in fp8 (``_precision.FP8_ROLES``) take the measured fp8 speed-up."""
        return training_op_time_s(
            self, flops=flops, bytes_moved=bytes_moved, calls=calls, kind=kind, role=role
        )

    def collective(self, op: str, *, axis: str, group_size, message_bytes) -> np.ndarray:
        return collective_time_s(
            cluster=self.cluster,
            op=op,
            group_size=group_size,
            ranks_per_node=self.local[axis],
            message_bytes=message_bytes,
            calibration=self.calibration,
        )


def _without_runtime_measurements(cluster):  # topology.Cluster
    """``cluster`` whose device profile keeps only device-level measurements
    (``HardwareProfile.device_level``): a measured profile times the autoparallel runtime's own
    modules, which a job run by a named framework does not run."""
    device = cluster.device
    profile = getattr(device, "profile", None)
    if profile is None:
        return cluster
    return cluster.model_copy(
        update={"device": device.model_copy(update={"profile": profile.device_level()})}
    )


def training_context(
    *, model, cluster, workload: Training, table, options: EstimateOptions
) -> TrainingContext:
    """Derive the shared per-table quantities (stage layout, placement, micro-batch count)."""
    table_length(table)
    if workload.framework is not None:  # the framework's kernels replace the option defaults
        profile = framework_profile(workload.framework)
        options = options.model_copy(
            update={
                "flash_attention": profile.flash_attention,
                "fused_gradient_accumulation": profile.fused_gradient_accumulation,
            }
        )
        cluster = _without_runtime_measurements(cluster)
    _check_full_iteration_graph(model=model, workload=workload, options=options)
    _check_fp8_options(workload=workload, options=options)
    per_replica = np.asarray(table["dp"], dtype=np.int64) * np.asarray(
        table["micro_batch_size"], dtype=np.int64
    )
    batch = workload.sequences_per_step
    return TrainingContext(
        model=model,
        cluster=cluster,
        workload=workload,
        options=options,
        calibration=options.calibration_for(cluster.device),
        table=table,
        layout=stage_layout(
            model=model,
            pp=table["pp"],
            virtual_stages=table["virtual_stages"],
            layer_weights=layer_weights_per_device(model=model, table=table),
        ),
        local=ranks_per_node(table=table, devices_per_node=cluster.devices_per_node),
        num_micro_batches=np.maximum(batch // per_replica, 1).astype(np.float64),
        batch_divides=(batch % per_replica) == 0,
        columns={name: np.asarray(table[name], dtype=np.float64) for name in CONFIG_COLUMNS},
    )


def _check_fp8_options(*, workload: Training, options: EstimateOptions) -> None:
    """Options that keep tensors in fp8 need fp8 training."""
    if options.moe_act_input_fp8 and workload.precision != "fp8":
        raise ValueError(
            f"moe_act_input_fp8 (True) keeps the experts' activation input in fp8, which needs "
            f"precision 'fp8' (the workload's precision is {workload.precision!r})"
        )


def _check_full_iteration_graph(*, model, workload: Training, options: EstimateOptions) -> None:
    """A whole iteration cannot be one CUDA graph where an MoE layer's dispatch copies its token
    counts to the host and waits: Megatron-core captures an MoE layer only with drop-padding
    (``transformer_config.py`` ``__post_init__``: "moe cuda graph is only supported with
    drop-padding MoE")."""
    if options.cuda_graphs != "full_iteration" or model.moe is None or workload.framework is None:
        return
    if framework_profile(workload.framework).moe_dispatch_host_sync and not (
        options.moe_pad_to_capacity
    ):
        raise ValueError(
            f"cuda_graphs ('full_iteration') needs a sync-free MoE dispatch: framework "
            f"{workload.framework!r} copies each MoE layer's token counts to the host and waits "
            "unless the experts' inputs are padded to a static capacity; set "
            "moe_capacity_factor and moe_pad_to_capacity, or capture 'partial' scopes"
        )
