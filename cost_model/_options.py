"""How an estimate runs: ``EstimateOptions`` and the fitted ``Calibration``.

* ``COMM_KINDS`` with ``DEFAULT_OVERLAP``: the communication kinds of a step and the fraction of
  each that may hide behind independent compute before any fit.
* ``EstimateOptions``: how the modelled software runs, one per estimate (not per config).
* ``Calibration``: a few fitted efficiencies per hardware type; ``calibration_for`` picks the
  shipped one from ``data/calibration.json`` (or carries a preset's reference calibration over
  to a generation without fitted runs, ``_calibration_transfer``).

Shared by the training and inference cost models; the pricing helpers that read a calibration
are in ``_pricing``.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cost_model._calibration_transfer import transferred_calibration
from cost_model._routing_skew import eplb_skew

#: Communication kinds of a step; each has an overlap fraction (see ``Calibration``).
COMM_KINDS: tuple[str, ...] = ("tp_comm", "ep_comm", "cp_comm", "pp_comm", "dp_comm")

#: Fraction of each communication kind that may hide behind independent compute, before any
#: fit. TP and EP collectives sit on the critical path of the layer that needs their result
#: (Megatron-LM's default; Narayanan et al. SC'21 sec. 3.4); the CP ring exchange of block
#: k+1 runs under attention of block k (Liu et al., Ring Attention, arXiv:2310.01889);
#: pipeline send/recv is blocking in 1F1B; bucketed gradient reduction (and ZeRO-3 parameter
#: gathers) overlap backward compute (PyTorch DDP, Li et al. VLDB 2020; Megatron
#: ``--overlap-grad-reduce``).
DEFAULT_OVERLAP: dict[str, float] = {
    "tp_comm": 0.0,
    "ep_comm": 0.0,
    "cp_comm": 1.0,
    "pp_comm": 0.0,
    "dp_comm": 1.0,
}


class EstimateOptions(BaseModel):
    """How the modelled software runs; one per estimate (not per config).

    ``flash_attention``: fused attention that never stores the s x s scores and skips the
    masked half (Dao et al., FlashAttention, arXiv:2205.14135); off, the scores are
    materialized, softmax/dropout are memory-bound passes over them and the full square is
    multiplied (Megatron-LM 2021-22). ``hidden_dropout`` / ``attention_dropout``: GPT-style
    dropout layers (their masks are stored: Korthikanti et al. 2022 sec. 4.1).
    ``routing_imbalance``: tokens of the busiest expert rank over the mean (>= 1).
    ``expert_load_skew``: in inference, the relative spread of the expert ranks' expected loads
    that real traffic leaves beyond uniform routing's sampling (``_routing_skew``); None: the
    residual skew measured behind an expert-placement balancer (EPLB), ``eplb_skew``; 0: routing
    as uniform as synthetic balanced benchmarks make it, and what goes with a measured
    ``routing_imbalance``, which holds the traffic's skew already (the CLI's
    ``--routing-imbalance`` sets it so). The busiest rank's experts and its share of the
    dispatch and combine carry ``max(routing_imbalance, max_load_factor)``.
    ``moe_capacity_factor``: training's token dropping: each expert takes at most
    ``ceil(tokens x top_k / experts x factor)`` tokens, the rest are dropped (Megatron-core
    ``--moe-expert-capacity-factor``, ``moe_utils.get_capacity``); None: dropless.
    ``moe_pad_to_capacity``: every expert's input padded to that capacity
    (``--moe-pad-expert-input-to-capacity``), so each expert computes ``factor`` times the
    balanced load whatever the routing, the all-to-alls carry the padding, and the token
    counts are static: the alltoall dispatcher takes them from the capacity instead of copying
    them to the host and waiting (``token_dispatcher.py`` ``drop_and_pad``: ``cuda_sync_point``
    stays ``no_sync``), which is what lets a whole iteration be one CUDA graph. Without padding
    the dropped load is ``min(routing_imbalance, factor)`` of the balanced one and the counts
    still go to the host.
    ``fragmentation_fraction``: allocator reserve as a fraction of the other memory parts.
    ``two_batch_stages``: serving two-batch overlap hides a micro-batch's all-to-all only behind
    the stage the other micro-batch runs meanwhile (SGLang's operations strategy,
    ``_inference_overlap``); off, behind the whole pass's compute (DeepSeek's inference system,
    whose decode splits attention in two over a five-stage pipeline for a seamless overlap:
    DeepSeek Open Infra Index, day 6).
    ``fused_gradient_accumulation``: with fp32 main gradients, the weight-gradient GEMM adds
    into them (Megatron-LM ``--gradient-accumulation-fusion``, on by default); off, every
    micro-batch adds each low-precision gradient into its main gradient in a separate
    memory-bound pass (Megatron-LM's unfused ``main_grad.add_(grad)`` hook).
    ``unfused_cross_entropy``: Megatron-core's eager vocab-parallel cross entropy
    (``--cross-entropy-loss-fusion`` off, its default in r0.8), whose fp32 passes over the
    logits ``_training_ops.cross_entropy_bytes_per_logit`` counts; off, three fp32 passes.
    Training MoE traffic: ``expert_dispatcher`` ``all_to_all`` (NCCL all-to-all, Megatron-core's
    alltoall dispatcher) or ``deepep`` (DeepEP kernels: node de-duplication, NVLink and RDMA at
    once; ``expert_dispatch_time_s``) or ``hybridep`` (Megatron-core's flex dispatcher with the
    HybridEP backend, ``--moe-flex-dispatcher-backend hybridep``: like DeepEP's normal kernels it
    sends each token once per destination and reduces a token's expert outputs before sending
    them back; no HybridEP operator measurement is shipped, so it is priced as DeepEP's normal
    kernels, ``_training_comm._deepep_exchange``); ``expert_dispatch_fp8``: dispatch in fp8 with its
    per-128 scales, combine in bf16 (DeepSeek-V3 report sec. 3.3); ``max_routed_nodes``:
    node-limited routing. ``bidirectional_pipeline``: a DualPipe-style schedule (DeepSeek-V3
    report sec. 3.2.1) that runs a forward and a backward chunk together so each one's EP
    all-to-all hides behind the other's compute, with the bubble (pp/2 - 1)(F&B + B - 3W)
    instead of 1F1B's (pp - 1)(F + B); each rank holds and trains two stages (i and pp - 1 - i)
    and pp + 1 micro-batches' activations (the report's Table 2: parameters 2x, activations
    PP + 1; ``TrainingContext.stage_copies``). ``moe_act_input_fp8``: with fp8 training, the
    routed experts keep their activation's input (the FC1 output) for the backward pass in fp8
    (DeepSeek-V3 report sec. 3.3.3, "Inputs of the SwiGLU Operator in MoE ... stored in FP8 with
    our fine-grained quantization method"; memory only). ``context_parallel``: ``ring`` (K/V blocks passed
    around the ring under attention; Liu et al.) or ``all_gather`` (K/V all-gathered before
    attention and their gradients reduce-scattered after, exposed; Llama 3 report sec. 3.3.2).

    The framework's recompute and offload settings, priced in activation memory
    (``_memory``) and in step time (``_training``: each recomputed module or layer costs its
    forward once more; offloaded layers' host copies are exposed where they outlast the
    compute they run beside, ``time.offload``): ``recompute_modules``: what
    selective recompute (``recompute="selective"``) recomputes, Megatron-core's
    ``--recompute-modules`` (``core_attn``, the default: the attention scores; ``mla_up_proj``:
    the MLA up-projection outputs; ``layernorm``: the norm outputs; ``mlp``: a dense MLP's
    intermediates; ``moe_act``: the experts' activation outputs; ``moe``: the whole MoE layer but
    its input; ``shared_experts``: the shared experts' intermediates; Megatron-Bridge
    docs/training/activation-recomputation.md). ``recompute_layers``: under ``recompute="full"``,
    the layers of each model chunk recomputed (Megatron-core ``--recompute-method block
    --recompute-num-layers``); None: every layer. ``activation_offload_layers``: layers whose
    saved activations are copied to host memory after their forward and reloaded for their
    backward (Megatron-core ``--cpu-offloading-num-layers``; one offloaded layer is in transit
    on the device at a time without double buffering: Megatron-Bridge docs/training/
    cpu-offloading.md; the copies cross ``HardwareSpec.host_link_bandwidth_bytes_per_s``,
    which the device must state). ``optimizer_instances``: replicas of the sharded model states across the
    data-parallel ranks (Megatron-core ``--num-distributed-optimizer-instances``: ZeRO shards
    over dp / instances, HSDP-style; memory only). ``pipeline_keeps_outputs``: the last
    pipeline stage keeps every micro-batch's output (the logits) until the step ends, to return
    them from the schedule's ``step`` (torch.distributed.pipelining ``forward_one_chunk`` appends
    them to ``output_chunks``; before torch PR #165822 always, since then unless ``step`` is
    called with ``return_outputs=False``, as torchtitan does from e5ef99a, 2025-10-22; memory
    only). ``eager_loss``: the loss runs eagerly under a framework that compiles it
    (``FrameworkProfile.compiled_loss_bytes_per_logit``): torchtitan before bbb1b616e
    (2025-04-02), whose train.py left compiling the loss commented out ("compiling loss
    function causes CUDA errors, turning off for now"); memory only.
    ``pipeline_p2p_overlap``: the pipeline's activation and gradient sends and receives are
    asynchronous, posted ahead and waited on only where the data is needed (the Llama 3 report,
    arXiv:2407.21783 sec. 3.3.2: "we adopt asynchronous point-to-point communication in PP"),
    so a rank's steady-state transfers run beside its compute and only the fill and drain's
    boundary crossings stay on the critical path; off, every transfer is exposed.
    ``tp_comm_overlap``: whether the run pipelines its sequence-parallel all-gathers and
    reduce-scatters with the GEMMs (Megatron-core ``--tp-comm-overlap``, Megatron-Bridge
    ``CommOverlapConfig(tp_comm_overlap=...)``; torch's asynchronous TP): False leaves every
    tensor-parallel collective exposed, True lets each hide behind its GEMM (with sequence
    parallel); None: the framework profile's setting (``FrameworkProfile.tp_comm_overlap``),
    else the calibration's.
    ``expert_parallel_comm_overlap``: Megatron-core ``--overlap-moe-expert-parallel-comm``
    (Megatron-Bridge ``moe_a2a_overlap``, which also sets ``delay_wgrad_compute``): the EP
    all-to-alls of one micro-batch run beside the compute of another (a forward merged with a
    backward, layer by layer, in the 1F1B steady state), priced per merged layer pair with
    the unpaired warm-up and cool-down micro-batches exposed (``_training_ep_overlap``); inert
    where Megatron-core refuses it (ep = 1, pp > 1 without virtual stages, full recompute).
    ``cuda_graphs``: what the run captures in CUDA
    graphs: ``none``; ``partial``, Transformer Engine per-layer graphs of the static-shape
    parts (Megatron-core ``--cuda-graph-impl transformer_engine``, scopes ``attn``,
    ``moe_router``, ``moe_preprocess``: the dropless dispatch, the experts and the combine
    stay eager); ``full_iteration``, the whole forward and backward (sync-free dispatch
    only). ``cuda_graph_scope``: the scopes a ``partial`` capture covers (Megatron-core
    ``--cuda-graph-scope``; the run's recipe records them). What is captured costs the host
    one graph launch instead of issuing each operator (``_training_host``: a stretch takes
    max(host issue time, GPU time)).
    ``measured_attention``: training prices fused causal attention at the efficiency measured
    for its sequence and heads (``_training_ops.measured_core_attention_time``) instead of the
    calibration's single attention efficiency; off by default: on, the whole runs it speeds up
    come out too fast elsewhere (its docstring). ``attention_kernel``: the fused attention
    kernel the run's framework release ran on Hopper, where it differs from the framework
    profile's (``FrameworkProfile.attention_kernel``): ``flash2`` for torch SDPA's
    FlashAttention-2 backend (torchtitan on Hopper before 6a3a9da95, 2025-10-09), ``cudnn`` for a
    cuDNN / FlashAttention-3-class kernel; None: the profile's.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    calibration: Calibration | None = None
    fused_gradient_accumulation: bool = True
    flash_attention: bool = True
    hidden_dropout: bool = False
    attention_dropout: bool = False
    unfused_cross_entropy: bool = False
    routing_imbalance: float = Field(default=1.0, ge=1.0)
    expert_load_skew: float | None = Field(default=None, ge=0.0)
    moe_capacity_factor: float | None = Field(default=None, gt=0.0)
    moe_pad_to_capacity: bool = False
    fragmentation_fraction: float = Field(default=0.05, ge=0.0, lt=1.0)
    two_batch_stages: bool = True
    expert_dispatcher: Literal["all_to_all", "deepep", "hybridep"] = "all_to_all"
    expert_dispatch_fp8: bool = False
    max_routed_nodes: int | None = Field(default=None, gt=0)
    bidirectional_pipeline: bool = False
    moe_act_input_fp8: bool = False
    context_parallel: Literal["ring", "all_gather"] = "ring"
    recompute_modules: tuple[
        Literal["core_attn", "mla_up_proj", "layernorm", "mlp", "moe_act", "moe", "shared_experts"],
        ...,
    ] = ("core_attn",)
    recompute_layers: int | None = Field(default=None, gt=0)
    activation_offload_layers: int = Field(default=0, ge=0)
    optimizer_instances: int = Field(default=1, ge=1)
    expert_parallel_comm_overlap: bool = False
    tp_comm_overlap: bool | None = None
    pipeline_keeps_outputs: bool = False
    eager_loss: bool = False
    pipeline_p2p_overlap: bool = False
    cuda_graphs: Literal["none", "partial", "full_iteration"] = "none"
    cuda_graph_scope: tuple[Literal["attn", "moe_router", "moe_preprocess"], ...] = (
        "attn",
        "moe_router",
        "moe_preprocess",
    )
    measured_attention: bool = False
    attention_kernel: Literal["cudnn", "flash2"] | None = None

    @model_validator(mode="after")
    def _padding_needs_a_capacity(self) -> EstimateOptions:
        if self.moe_pad_to_capacity and self.moe_capacity_factor is None:
            raise ValueError(
                "moe_pad_to_capacity (True) needs moe_capacity_factor (None): an expert's input "
                "is padded to its capacity, which the capacity factor sets (Megatron-core "
                "asserts the same)"
            )
        return self

    @property
    def expert_load_factor(self) -> float:
        """Tokens the busiest expert rank computes over the balanced load: the routing
        imbalance, clipped at the capacity factor where tokens are dropped, exactly the factor
        where inputs are padded to capacity (``moe_capacity_factor``)."""
        factor = self.moe_capacity_factor
        if factor is None:
            return self.routing_imbalance
        return factor if self.moe_pad_to_capacity else min(self.routing_imbalance, factor)

    @property
    def routing_skew(self) -> float:
        """``expert_load_skew``, or the measured residual behind EPLB where it is None."""
        return eplb_skew() if self.expert_load_skew is None else self.expert_load_skew

    def calibration_for(self, hardware) -> Calibration:
        return self.calibration if self.calibration is not None else calibration_for(hardware)


class Calibration(BaseModel):
    """A few global efficiency parameters of one hardware type (never per run).

    ``matmul_efficiency`` / ``memory_bandwidth_efficiency`` are end-to-end achievable fractions
    of peak that replace the hardware's own (a measured efficiency curve is rescaled by the
    same ratio); ``attention_efficiency`` is the fraction core-attention kernels reach (default:
    as matmuls); ``kernel_overhead_s`` is a fixed cost per kernel (launch, wave tail) that the
    roofline misses on small layers; ``collective_efficiency`` divides every collective time
    but the all-to-all where ``all_to_all_efficiency`` is set, and ``collective_overhead_s`` is
    added to each such call on a group of two or more ranks (the Hockney alpha-beta model:
    a fixed cost per call beside the bandwidth term, NCCL's launch and protocol set-up that
    the topology's link latency does not cover); the all-to-all (training's expert dispatch
    and combine) has its own operator table and its own fit, an efficiency and a fixed cost per
    call (``all_to_all_overhead_s``); ``overlap`` overrides ``DEFAULT_OVERLAP``. ``fit``
    documents how the values were fitted (rows, residuals).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    device_pattern: str = Field(default=".*", description="regex matched against HardwareSpec.name")
    matmul_efficiency: float | None = Field(default=None, gt=0, le=1)
    memory_bandwidth_efficiency: float | None = Field(default=None, gt=0, le=1)
    attention_efficiency: float | None = Field(default=None, gt=0, le=1)
    kernel_overhead_s: float = Field(default=0.0, ge=0, le=1e-3)
    collective_efficiency: float = Field(default=1.0, gt=0, le=2)
    collective_overhead_s: float = Field(default=0.0, ge=0, le=1e-3)
    all_to_all_efficiency: float | None = Field(default=None, gt=0, le=2)
    all_to_all_overhead_s: float = Field(default=0.0, ge=0, le=1e-3)
    overlap: dict[str, float] = Field(default_factory=dict)
    fit: dict[str, Any] = Field(default_factory=dict)

    def __hash__(self) -> int:
        return hash(self.model_dump_json())

    def matmul_scale(self, hardware) -> float:
        return (
            1.0
            if self.matmul_efficiency is None
            else self.matmul_efficiency / hardware.matmul_efficiency
        )

    def attention_scale(self, hardware) -> float:
        if self.attention_efficiency is None:
            return self.matmul_scale(hardware)
        return self.attention_efficiency / hardware.matmul_efficiency

    def memory_scale(self, hardware) -> float:
        if self.memory_bandwidth_efficiency is None:
            return 1.0
        return self.memory_bandwidth_efficiency / hardware.memory_bandwidth_efficiency

    def overlap_fraction(self, kind: str) -> float:
        if kind not in DEFAULT_OVERLAP:
            raise ValueError(
                f"communication kind ({kind!r}) must be one of {list(DEFAULT_OVERLAP)}"
            )
        return float(self.overlap.get(kind, DEFAULT_OVERLAP[kind]))


@lru_cache(maxsize=1)
def _shipped_calibrations() -> tuple[Calibration, ...]:
    text = (resources.files("cost_model") / "data" / "calibration.json").read_text()
    return tuple(Calibration.model_validate(entry) for entry in json.loads(text)["calibrations"])


def calibration_for(hardware) -> Calibration:
    """The shipped calibration whose ``device_pattern`` matches ``hardware.name``, else neutral."""
    for calibration in _shipped_calibrations():
        if re.search(calibration.device_pattern, hardware.name):
            return calibration
    # A generation without fitted runs: its preset's reference calibration carried over.
    return transferred_calibration(hardware, _shipped_calibrations()) or Calibration()
