"""Framework profiles: the software facts of Megatron-core, DeepSpeed and torchtitan/FSDP2.

A profile names what a framework runs by default (fused attention, fused gradient
accumulation, fused norm/activation/rotary kernels, what selective recompute repeats, tensor- and data-parallel overlap, the dtype gradients are reduced in, whether ZeRO-2 reduces
every micro-batch, whether its dropless MoE dispatch waits on the host for the token counts and
the host seconds to issue one expert GEMM); each comes with its source in
``data/framework_profiles.json``. They are
facts of the software, never fitted: the differences between frameworks enter the cost model
through these named features, not through a per-run efficiency factor.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cost_model._precision import FP8_RECIPES

__all__ = [
    "ExpertQuantizationOps",
    "FrameworkProfile",
    "HostOpCounts",
    "framework_names",
    "framework_profile",
]


class ExpertQuantizationOps(BaseModel):
    """Operators the host issues per local expert and ``GroupedLinear`` call to quantize the
    expert GEMMs' operands under one fp8 recipe: in forward (the input) and in backward (the
    output gradient); counted from the framework's code (``HostOpCounts.expert_quantization``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    forward: float = Field(ge=0.0)
    backward: float = Field(ge=0.0)


class HostOpCounts(BaseModel):
    """Operators the host issues per layer and pass (forward, backward), counted from the
    framework's code, and the host seconds per eagerly issued operator; ``basis`` says where
    each count comes from (``_training_host``). Expert GEMMs are counted apart, one per local
    expert and ``GroupedLinear`` call (``FrameworkProfile.expert_gemm_host_s``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attention_forward: float = Field(ge=0.0)
    attention_backward: float = Field(ge=0.0)
    #: Core attention issued as separate kernels (batched GEMMs, softmax, dropout) instead of
    #: one fused kernel: the extra forward operators (twice that in backward).
    unfused_attention_extra: float = Field(ge=0.0)
    dense_mlp_forward: float = Field(ge=0.0)
    dense_mlp_backward: float = Field(ge=0.0)
    router_forward: float = Field(default=0.0, ge=0.0)
    router_backward: float = Field(default=0.0, ge=0.0)
    dispatch_preprocess_forward: float = Field(default=0.0, ge=0.0)
    dispatch_preprocess_backward: float = Field(default=0.0, ge=0.0)
    expert_segment_forward: float = Field(default=0.0, ge=0.0)
    #: Of ``expert_segment_forward``, the operators issued before the first expert GEMM (the
    #: dispatch all-to-alls and the sort by local expert); the rest follow the GEMMs.
    expert_dispatch_forward: float = Field(default=0.0, ge=0.0)
    expert_segment_backward: float = Field(default=0.0, ge=0.0)
    shared_experts_forward: float = Field(default=0.0, ge=0.0)
    shared_experts_backward: float = Field(default=0.0, ge=0.0)
    embedding_forward: float = Field(ge=0.0)
    embedding_backward: float = Field(ge=0.0)
    lm_head_forward: float = Field(ge=0.0)
    lm_head_backward: float = Field(ge=0.0)
    eager_op_host_s: float = Field(gt=0.0, le=1e-3)
    basis: str = Field(min_length=1)
    eager_op_host_source: str = Field(min_length=1)
    #: Host seconds per counted operator of the MoE routing code (the router, the dispatch
    #: preprocessing, the dispatch and the combine, forward and backward) measured by running
    #: that code, where it carries more Python per operator than ``eager_op_host_s``; None: the
    #: generic figure. On the reference x86 host, like ``eager_op_host_s``.
    moe_routing_op_host_s: float | None = Field(default=None, gt=0.0, le=1e-3)
    moe_routing_op_host_source: str = ""
    #: Per fp8 recipe (``Training.fp8_recipe``), the quantization operators of each local expert
    #: and ``GroupedLinear`` call (fp8 runs only); a recipe absent here adds none.
    expert_quantization: dict[str, ExpertQuantizationOps] = Field(default_factory=dict)
    expert_quantization_basis: str = ""

    @field_validator("expert_quantization")
    @classmethod
    def _known_recipes(
        cls, value: dict[str, ExpertQuantizationOps]
    ) -> dict[str, ExpertQuantizationOps]:
        unknown = sorted(set(value) - set(FP8_RECIPES))
        if unknown:
            raise ValueError(
                f"expert_quantization recipes ({unknown}) must be among {sorted(FP8_RECIPES)}"
            )
        return value

    @model_validator(mode="after")
    def _quantization_sourced(self) -> HostOpCounts:
        if self.expert_quantization and not self.expert_quantization_basis:
            raise ValueError(
                "expert_quantization_basis ('') must say where expert_quantization is counted "
                "from when expert_quantization is given"
            )
        return self

    @model_validator(mode="after")
    def _dispatch_within_segment(self) -> HostOpCounts:
        if self.expert_dispatch_forward > self.expert_segment_forward:
            raise ValueError(
                f"expert_dispatch_forward ({self.expert_dispatch_forward}) must be at most "
                f"expert_segment_forward ({self.expert_segment_forward})"
            )
        return self


class FrameworkProfile(BaseModel):
    """One framework's defaults (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    flash_attention: bool
    fused_gradient_accumulation: bool
    fused_elementwise: bool
    selective_recompute: Literal["attention_core", "every_second_matmul"]
    dp_comm_overlap: float = Field(ge=0.0, le=1.0)
    tp_comm_overlap: float = Field(ge=0.0, le=1.0)
    #: Under tensor-parallel overlap, the reduce-scatter of a column-parallel block's input
    #: gradient hides beside the block's weight-gradient GEMM (Megatron-core
    #: ``tp_comm_bulk_dgrad``); False where it is exposed (torch's asynchronous tensor parallel
    #: fuses a reduce-scatter only into the one matmul producing its input, and the input
    #: gradient of separate Q/K/V or gate/up linears is a sum of matmuls)
    #: (``_training_tp_overlap``).
    tp_overlap_input_gradient_scatter: bool = True
    #: Bytes per element of the data-parallel gradient reduction; None: the main gradients'
    #: (``Training.gradient_dtype``), as Megatron-core reduces its main-gradient buffer.
    gradient_reduce_bytes: int | None = Field(default=None, ge=1, le=4)
    zero2_reduce_every_micro_batch: bool
    #: The step begins by zeroing the rank's contiguous main-gradient buffer in place (Megatron-LM
    #: megatron/training/training.py ``train_step`` calls ``zero_grad_buffer``, whose buffers'
    #: ``reset`` runs ``grad_data.zero_()``, core/distributed/param_and_grad_buffer.py at
    #: 937571cfd4); False where gradients are freed instead (``zero_grad(set_to_none=True)``)
    #: (step time, ``_training_dp``).
    zeroes_gradient_buffer_each_step: bool = False
    #: Gradient buckets fill in reverse parameter order, at least max(40M, 1M x dp) parameters
    #: each (``DistributedDataParallel.__init__``, core/distributed/distributed_data_parallel.py
    #: at 937571cfd4), so the last bucket holds the first parameters (the embedding): its
    #: reduce-scatter starts after the step's last backward kernel, and its all-gather, the first
    #: the next forward waits on, is launched in ``zero_grad`` just before it
    #: (core/optimizer/distrib_optimizer.py): neither has compute to hide behind (step time,
    #: ``_training_dp``).
    last_gradient_bucket_exposed: bool = False
    #: Bytes per logit held at the loss (memory): 4, the fp32 softmax a fused vocab-parallel
    #: cross entropy keeps for its backward (Megatron-LM core/tensor_parallel/cross_entropy.py);
    #: an eager ``cross_entropy(logits.float())`` holds its fp32 log-softmax output, the incoming
    #: gradient and the outgoing one at the start of the backward pass, 12.
    loss_bytes_per_logit: float = Field(default=4.0, gt=0.0)
    #: Bytes per logit held at the loss with tp > 1 where the framework runs the vocab-parallel
    #: loss through DTensor's ``loss_parallel`` (torchtitan: on whenever tp > 1); None: as
    #: ``loss_bytes_per_logit``. Its fused NLL + log-softmax backward
    #: (torch/distributed/tensor/parallel/loss.py ``_nll_loss_and_log_softmax_backward``, torch
    #: 2.13) builds ``(zeros_like(x) + exp(x)) * grad`` in fp32 beside the saved fp32 log-softmax
    #: output x: 16 bytes per logit at the add (memory). Both figures measured on torch 2.13:
    #: 12.0 and 16.01 bytes per logit of a rank's slice (tests/test_loss_memory_measured.py).
    loss_parallel_bytes_per_logit: float | None = Field(default=None, gt=0.0)
    #: Bytes per logit held at the loss where the framework runs it under torch.compile (tp = 1):
    #: AOTAutograd's partitioner saves the bf16 logits themselves and each row's max and
    #: log-sum-exp, and Inductor's fused backward writes one bf16 gradient, so no fp32 copy of
    #: the logits is ever materialized: 2 + 2 (checked by compiling torch's cross entropy,
    #: ``tests/test_memory_terms.py``). None: the framework runs its loss eagerly
    #: (``loss_bytes_per_logit``); a run that kept it eager says so (``EstimateOptions.eager_loss``).
    compiled_loss_bytes_per_logit: float | None = Field(default=None, gt=0.0)
    #: Under ZeRO-3 the sharded parameters are the fp32 master weights, no low-precision sharded
    #: copy (FSDP2 MixedPrecisionPolicy casts to bf16 at the all-gather) (memory).
    sharded_master_weights: bool = False
    #: Under pipeline parallel a ZeRO-3 stage frees its gathered layers after each micro-batch's
    #: forward (FSDP2 ``reshard_after_forward=True``: autoparallel's runtime and its torchtitan
    #: export, policy ``always``), so each backward that follows a forward gathers them again;
    #: False where the framework keeps them gathered from the step's first forward (torchtitan's
    #: policy ``default`` is ``not pp_enabled``) (step time, ``_training_dp``).
    pipeline_reshard_after_forward: bool = True
    #: The pipeline runs on torch.distributed.pipelining (memory, ``_memory.pipeline_buffer_bytes``):
    #: its stages allocate a receive buffer per micro-batch for the stage input and another for
    #: the output's gradient when the schedule is set up and keep them for the run
    #: (``_PipelineStageBase`` ``_setup_forward_recv_info`` / ``_setup_backward_recv_info``, one
    #: ``_RecvInfo`` buffer per ``chunk_id`` / ``mb_index``), and the schedule holds each
    #: micro-batch's stage output until its backward (``forward_one_chunk`` stores it in
    #: ``fwd_cache``; torch 2.13 distributed/pipelining/stage.py). False: a receive allocates its
    #: tensor per transfer, which then is the stage input the activations count, and the sent
    #: output's storage is freed at once (Megatron-core ``p2p_communication._communicate``,
    #: ``schedules.deallocate_output_tensor``).
    torch_pipelining: bool = False
    #: Tensor parallel runs as a DTensor plan (torch.distributed.tensor.parallel): under sequence
    #: parallelism a column-parallel linear keeps the all-gathered full-sequence input for its
    #: weight gradient (``SequenceParallel`` norms, then ``ColwiseParallel`` /
    #: ``PrepareModuleInput`` gather; the linear's autograd saves the gathered tensor), where
    #: Megatron-core keeps the sequence shard and gathers it again in backward
    #: (``LinearWithGradAccumulationAndAsyncCommunication``; Korthikanti et al. sec. 4.2.2)
    #: (memory, ``_memory._layer_activation_bytes``).
    tp_saves_gathered_input: bool = False
    #: The library that quantizes the fp8 GEMM operands (``_precision``): Transformer Engine
    #: casts an operand once into both layouts and keeps the fp8 input for the backward pass;
    #: torchao (``Float8Linear``, ``mx_mm``) keeps the bf16 input and casts it again in backward,
    #: the MX recipe in a separate kernel per layout (``_precision.TORCHAO_QUANTIZATION_BYTES``).
    fp8_library: Literal["transformer_engine", "torchao"] = "transformer_engine"
    fp8_library_source: str = ""
    #: The fused attention kernel the framework runs on Hopper (step time,
    #: ``_training_ops.core_attention_time``): ``cudnn``, a cuDNN / FlashAttention-3-class kernel
    #: (Transformer Engine's fused attention; torch SDPA with CUDNN_ATTENTION first), priced at
    #: the calibration's attention efficiency; ``flash2``, torch SDPA's FlashAttention-2 backend,
    #: priced at the measured cuDNN-class curve times the measured FlashAttention-2 / cuDNN time
    #: ratio (``data/attention_kernels.json``). A run of an older release says which it ran
    #: (``EstimateOptions.attention_kernel``).
    attention_kernel: Literal["cudnn", "flash2"] = "cudnn"
    attention_kernel_source: str = ""
    #: The transformer blocks run under torch.compile (memory, ``_memory.op_level_selective_bytes``):
    #: of an operator-level selective checkpoint's saved outputs AOTAutograd's partitioner keeps
    #: only those the backward reads, where eager selective checkpointing stores them all.
    compiled_blocks: bool = False
    moe_dispatch_host_sync: bool = False
    expert_gemm_host_s: float = Field(default=0.0, ge=0.0, le=1e-3)
    moe_host_source: str = ""
    host_ops: HostOpCounts | None = None
    source: str = Field(min_length=1)


@lru_cache(maxsize=1)
def _profiles() -> dict[str, FrameworkProfile]:
    text = (resources.files("cost_model") / "data" / "framework_profiles.json").read_text()
    profiles = (FrameworkProfile.model_validate(entry) for entry in json.loads(text)["profiles"])
    return {profile.name: profile for profile in profiles}


def framework_names() -> tuple[str, ...]:
    return tuple(_profiles())


def framework_profile(name: str) -> FrameworkProfile:
    """The shipped profile called ``name``; ``ValueError`` naming the known ones otherwise."""
    profiles = _profiles()
    if name not in profiles:
        raise ValueError(f"framework ({name!r}) must be one of {sorted(profiles)}")
    return profiles[name]
