"""``Workload``: what the job is — training, or inference with latency SLOs."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cost_model._serving_profile import serving_profile
from cost_model._units import Dtype

_STRICT = ConfigDict(extra="forbid", frozen=True)

#: Parts of a model whose weights a checkpoint may keep in a dtype of their own: the keys of
#: ``ModelSpec.parameter_breakdown`` less the norms (which no checkpoint quantizes).
WeightPart = Literal[
    "attention", "dense_ffn", "routed_experts", "shared_experts", "router", "embedding", "lm_head"
]
WEIGHT_PARTS: tuple[str, ...] = get_args(WeightPart)


class Training(BaseModel):
    """One optimizer step over ``global_batch_sequences`` sequences of ``sequence_length_tokens``.

    Give the batch either in sequences or in tokens (``global_batch_tokens`` must then be a
    multiple of the sequence length); the other is derived. ``framework`` names a profile of
    ``data/framework_profiles.json`` (megatron-core, deepspeed, torchtitan, ...): its
    data-parallel overlap, gradient-reduction dtype and ZeRO-2 reduction rule are priced;
    None keeps the calibration's overlap and the precision's gradients.
    """

    model_config = _STRICT

    kind: Literal["training"] = "training"
    sequence_length_tokens: int = Field(gt=0)
    global_batch_sequences: int | None = Field(default=None, gt=0)
    global_batch_tokens: int | None = Field(default=None, gt=0)
    precision: Literal["bf16", "fp16", "fp8"] = "bf16"
    optimizer: Literal["adam", "sgd"] = "adam"
    master_weights_fp32: bool = True
    #: Dtype of the optimizer's moments (Adam m and v, SGD momentum): fp32, or bf16 as
    #: DeepSeek-V3 tracks AdamW's moments (DeepSeek-V3 report sec. 3.3.3, "Low-Precision
    #: Optimizer States") and Megatron-core's precision-aware optimizer can
    #: (``--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``);
    #: the fp32 master weights stay fp32.
    optimizer_state_dtype: Literal["fp32", "bf16"] = "fp32"
    #: Main-gradient dtype: fp32 (Megatron ``--accumulate-allreduce-grads-in-fp32``) or bf16
    #: (``--grad-reduce-in-bf16``); without fp32 master weights gradients are bf16 either way.
    gradient_dtype: Literal["fp32", "bf16"] = "fp32"
    #: Scaling recipe when ``precision`` is fp8 (``cost_model._precision.FP8_RECIPES``).
    fp8_recipe: Literal["delayed", "current", "tensorwise", "rowwise", "blockwise", "mxfp8"] = (
        "current"
    )
    #: Layers at each end kept in bf16 under fp8 (Megatron ``--first-last-layers-bf16``).
    fp8_bf16_layers_at_start: int = Field(default=0, ge=0)
    fp8_bf16_layers_at_end: int = Field(default=0, ge=0)
    framework: str | None = None

    @model_validator(mode="after")
    def _check(self) -> Training:
        if self.framework is not None:
            from cost_model._frameworks import framework_profile

            framework_profile(self.framework)  # raises naming the known profiles
        seqs, tokens = self.global_batch_sequences, self.global_batch_tokens
        if seqs is None and tokens is None:
            raise ValueError("global_batch_sequences or global_batch_tokens must be given")
        if tokens is not None:
            if tokens % self.sequence_length_tokens:
                raise ValueError(
                    f"global_batch_tokens ({tokens}) must be a multiple of "
                    f"sequence_length_tokens ({self.sequence_length_tokens})"
                )
            derived = tokens // self.sequence_length_tokens
            if seqs is not None and seqs != derived:
                raise ValueError(
                    f"global_batch_sequences ({seqs}) must equal global_batch_tokens / "
                    f"sequence_length_tokens ({derived})"
                )
            object.__setattr__(self, "global_batch_sequences", derived)
        else:
            assert seqs is not None  # checked above: one of the two is given
            object.__setattr__(self, "global_batch_tokens", seqs * self.sequence_length_tokens)
        return self

    @property
    def tokens_per_step(self) -> int:
        assert self.global_batch_tokens is not None  # derived on validation when not given
        return self.global_batch_tokens

    @property
    def sequences_per_step(self) -> int:
        """``global_batch_sequences``, derived on validation when the batch is given in tokens."""
        assert self.global_batch_sequences is not None
        return self.global_batch_sequences


class Inference(BaseModel):
    """Serving requests of ``prompt_tokens`` in and ``output_tokens`` out (means over requests).

    ``prompt_tokens_cv`` is the spread of prompt lengths across requests (standard deviation over
    mean). Prefill attention grows with the square of each prompt's length, so a mix of lengths
    costs more per token than its mean prompt: the model prices prefill attention at the
    token-weighted mean prompt ``E[P^2] / E[P] = prompt_tokens * (1 + cv^2)``. 0 = every request
    has the mean length. ``output_tokens_cv`` likewise: a decoding token's context averages
    ``prompt_tokens + (output_tokens * (1 + cv^2) + 1) / 2`` over the output tokens of the mix.

    Load is either a fixed ``concurrency`` (closed loop: that many requests in flight, each
    client sending its next request when the previous completes, as serving benchmarks drive an
    engine) or a ``request_rate_per_s`` (open loop, Poisson arrivals); with neither, the search
    picks the largest concurrency that memory and the SLOs allow. The SLOs bound the p90 TTFT
    and p90 TPOT. ``serving_engine`` picks the per-step and per-request floors
    (``data/serving_profiles.json``) and the default chunked-prefill budget
    (``max_batched_tokens``, tokens per iteration); ``serving_engine_version`` names the
    release the engine ran (e.g. ``"0.7.4.dev181"``), whose defaults and floors then apply
    instead of the current releases' (None: the engine's current profile; a release without a
    profile is an error naming those that have one). ``mla_decode_kernel`` names an MLA decode
    kernel other than the serving engine's default, priced from its published figures where it
    has them (``"flashmla"``: DeepSeek's FlashMLA, the kernel of DeepSeek's own serving; None:
    the engine's own measured kernel, ``_kernel_curves_attention.mla_efficiency``).

    ``weight_dtype`` is the dtype of every weight; ``weight_dtype_by_part`` overrides it for the
    parts (``WEIGHT_PARTS``) a released checkpoint keeps in another dtype, as NVIDIA's NVFP4
    exports keep attention and the LM head in BF16 (``_serving_precision.checkpoint_dtype_by_part``
    reads them from a ``quantization_config``). Each part's GEMMs run in its dtype and its weights
    take its bytes. The router's GEMM runs in the activation dtype unless overridden.
    ``fp8_scaling`` is how FP8 weights are scaled: ``"block"`` (128 x 128 weight tiles with
    1 x 128 dynamic activation groups: DeepSeek-V3/R1, Kimi-K2 and Qwen3's FP8 releases, whose
    ``quantization_config`` names a ``weight_block_size``) or ``"tensor"`` (one scale per
    weight and a static one per activation: ModelOpt's FP8 checkpoints, TensorRT-LLM's
    ``QuantAlgo.FP8``, NVIDIA's FP8 Llama releases). Their GEMMs are different kernels, priced on
    their own tables (``_kernel_curves.gemm_curve_dtype``).
    """

    model_config = _STRICT

    kind: Literal["inference"] = "inference"
    prompt_tokens: int = Field(gt=0)
    output_tokens: int = Field(gt=0)
    concurrency: int | None = None
    request_rate_per_s: float | None = None
    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None
    serving_engine: Literal["vllm", "sglang", "trtllm"] = "sglang"
    serving_engine_version: str | None = None
    mla_decode_kernel: Literal["flashmla"] | None = None
    max_batched_tokens: int | None = None
    weight_dtype: Dtype = "bf16"
    weight_dtype_by_part: dict[WeightPart, Dtype] = Field(default_factory=dict)
    kv_dtype: Dtype = "bf16"
    activation_dtype: Literal["bf16", "fp16", "fp8"] = "bf16"
    fp8_scaling: Literal["block", "tensor"] = "block"
    prefix_cache_hit_rate: float = Field(default=0.0, ge=0.0, lt=1.0)
    prompt_tokens_cv: float = Field(default=0.0, ge=0.0, le=10.0)
    output_tokens_cv: float = Field(default=0.0, ge=0.0, le=10.0)
    disaggregation_allowed: bool = True
    kv_block_tokens: int = Field(default=64, gt=0)

    @field_validator(
        "concurrency", "request_rate_per_s", "ttft_slo_s", "tpot_slo_s", "max_batched_tokens"
    )
    @classmethod
    def _positive(cls, value, info):  # pydantic's validator signature
        if value is not None and not value > 0:
            raise ValueError(f"{info.field_name} ({value}) must be > 0")
        return value

    @model_validator(mode="after")
    def _check(self) -> Inference:
        if self.concurrency is not None and self.request_rate_per_s is not None:
            raise ValueError("give concurrency or request_rate_per_s, not both")
        if self.serving_engine_version is not None:
            serving_profile(self.serving_engine, self.serving_engine_version)  # names the known
        return self

    def __hash__(self) -> int:  # the per-part dict is not hashable; the JSON is
        return hash(self.model_dump_json())

    def part_weight_dtype(self, part: str) -> str:
        """The dtype of ``part``'s weights: its override, else ``weight_dtype``. ``norms`` (never
        quantized by a checkpoint, and too small to matter) take ``weight_dtype``."""
        if part not in WEIGHT_PARTS and part != "norms":
            raise ValueError(f"weight part ({part!r}) must be one of {', '.join(WEIGHT_PARTS)}")
        return self.weight_dtype_by_part.get(part, self.weight_dtype)  # type: ignore[call-overload]


Workload = Annotated[Training | Inference, Field(discriminator="kind")]
