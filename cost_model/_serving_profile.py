"""Serving engine profiles: each engine's scheduling defaults and per-step floors.

The serving policy (``_serving_load``) has defaults that differ by engine (``ServingProfile``,
each with its documentation as source): whether prefill and decode mix in one iteration (vLLM
V1 and TensorRT-LLM's in-flight batching do; SGLang runs a waiting prefill alone, with the
whole budget, and the decodes wait for it) and whether a long prompt is chunked (TensorRT-LLM's
default prefills whole prompts). The engine's per-iteration floors are added to each
iteration's pass time (``_serving_replica.IterationCost``). The shipped profiles live in
``data/serving_profiles.json``; ``serving_profile`` picks one by engine and release.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

Engine = Literal["vllm", "sglang", "trtllm"]


class ServingProfile(BaseModel):
    """Per-step and per-request floors of one engine (``data/serving_profiles.json``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: Engine
    version: str
    #: release prefixes this profile describes (``"0.7.3"`` matches ``"0.7.3.dev138+g21f6ca217"``)
    releases: tuple[str, ...] = Field(min_length=1)
    #: whether this is the engine's profile when no version is named (its current releases)
    default: bool = False
    kernel_floor_s: float = Field(ge=0)
    #: host seconds of one kernel of an eager pass (no CUDA graph): module code, dispatcher, launch
    eager_kernel_host_s: float = Field(ge=0)
    #: whether an iteration carrying prompt tokens replays a CUDA graph (up to ``graph_max_tokens``)
    prefill_graphs: bool
    #: the largest iteration, in tokens per forward, that replays a CUDA graph
    graph_max_tokens: int = Field(ge=0)
    sampling_s: float = Field(ge=0)
    scheduler_s: float = Field(ge=0)
    request_overhead_s: float = Field(ge=0)
    max_batched_tokens: int = Field(gt=0)
    chunked_prefill: bool
    mixed_prefill_decode: bool
    #: share of the device memory the engine's static pool may take (weights and KV cache:
    #: vLLM ``gpu_memory_utilization``, SGLang ``mem_fraction_static``), or, with
    #: ``kv_memory_of == "free"``, of the memory left after the weights that the KV cache takes
    #: (TensorRT-LLM ``free_gpu_memory_fraction``)
    kv_memory_fraction: float = Field(gt=0, le=1)
    kv_memory_of: Literal["total", "free"]
    #: the engine's default fraction by tensor-parallel size, where it depends on it (SGLang
    #: ``mem_fraction_static``): the value of the largest key <= tp; ``kv_memory_fraction``
    #: below every key or without any
    kv_memory_fraction_by_tp: dict[int, float] = {}
    #: the forward pass the engine profiles before it sizes its KV pool, whose peak activation
    #: memory the pool loses: ``"none"`` (the fraction itself leaves the rest of the device to
    #: activations and graphs: SGLang ``mem_fraction_static``), or a dummy pass of the engine's
    #: token budget split over ``"running_cap"`` sequences (vLLM ``profile_run``:
    #: ``max_num_seqs`` of them, one sampled token each) or over sequences of the model's whole
    #: ``"context"`` (TensorRT-LLM's dummy context requests of ``max_seq_len`` tokens)
    kv_sizing_pass: Literal["none", "running_cap", "context"]
    #: tokens the fused MoE kernel holds intermediate buffers for at once (it loops over chunks
    #: of them: vLLM ``VLLM_FUSED_MOE_CHUNK_SIZE``); None: every token of the pass at once
    moe_chunk_tokens: int | None = Field(default=None, gt=0)
    #: share of a request's output tokens (at most ``admission_output_clip`` of them) that its
    #: admission reserves in the KV cache, beyond its prompt
    admission_output_share: float = Field(ge=0, le=1)
    admission_output_clip: float = Field(gt=0)
    #: the engine's default cap on the requests one instance runs at once (vLLM
    #: ``max_num_seqs``, TensorRT-LLM ``max_batch_size``, SGLang ``max_running_requests``)
    max_running_requests: int = Field(gt=0)
    #: vLLM's smaller default on devices under ``small_device_below_gib`` or named here
    max_running_requests_small_device: int | None = Field(default=None, gt=0)
    small_device_below_gib: float | None = Field(default=None, gt=0)
    small_devices: tuple[str, ...] = ()
    #: SGLang derives its cap from the KV pool: at least ``min_running_requests``,
    #: ``running_requests_per_context`` per context length of pool tokens, and at most
    #: ``running_requests_pool_token_share`` of the pool's tokens
    min_running_requests: int | None = Field(default=None, gt=0)
    running_requests_per_context: float | None = Field(default=None, gt=0)
    running_requests_pool_token_share: float | None = Field(default=None, gt=0, le=1)
    #: per tensor-parallel size, the largest all-reduce (bytes per rank) the engine runs fused
    #: with the residual add and RMSNorm after it, one kernel instead of two (vLLM's
    #: AllReduceFusionPass); absent sizes, and engines without the fusion, run them apart
    fused_allreduce_norm_max_bytes: dict[int, float] = {}
    #: KV tokens a sliding-window or chunked layer holds per token of a sequence's context when
    #: the engine sizes its pool and admits requests: 1.0 where every layer shares one pool of
    #: full-length layers (SGLang, but for ``window_kv_pools``); None where the layer holds only
    #: its window and frees the blocks that left it (vLLM's sliding-window KV spec)
    window_kv_pool_ratio: float | None = Field(default=None, gt=0, le=1)
    #: model classes (``ModelSpec.architecture``) whose window layers get a pool of their own,
    #: sized at the given share of the full layers' pool tokens (SGLang's hybrid SWA memory,
    #: ``swa_full_tokens_ratio``)
    window_kv_pools: dict[str, float] = {}
    sources: dict[str, str]

    def window_kv_ratio(self, architecture: str | None) -> float | None:
        """KV tokens a window layer of a model of class ``architecture`` holds per token of
        context (``kv_cached_tokens``): its own pool's share where the engine gives the class
        one, else the engine's ratio for window layers (None: the window alone)."""
        if architecture is not None and architecture in self.window_kv_pools:
            return self.window_kv_pools[architecture]
        return self.window_kv_pool_ratio

    def running_cap(
        self, *, device_name: str, memory_bytes: float, pool_tokens, context_tokens: float
    ) -> np.ndarray:
        """Requests one engine instance runs at once by its defaults, before the KV pool's own
        limit: ``pool_tokens`` (per row) is what its KV pool holds, ``context_tokens`` the
        model's context length."""
        pool_tokens = np.maximum(np.asarray(pool_tokens, dtype=np.float64), 0.0)
        cap = float(self.max_running_requests)
        small = self.max_running_requests_small_device
        if small is not None and (
            (
                self.small_device_below_gib is not None
                and memory_bytes < self.small_device_below_gib * 2**30
            )
            or any(name.lower() in device_name.lower() for name in self.small_devices)
        ):
            cap = float(small)
        caps = np.full(pool_tokens.shape, cap)
        if self.running_requests_per_context is not None:
            sized = np.floor(pool_tokens / context_tokens * self.running_requests_per_context)
            caps = np.minimum(caps, np.maximum(sized, self.min_running_requests or 1))
        if self.running_requests_pool_token_share is not None:
            caps = np.minimum(caps, np.floor(pool_tokens * self.running_requests_pool_token_share))
        return np.maximum(caps, 1.0)

    def memory_fraction(self, tp: np.ndarray) -> np.ndarray:
        """The default memory fraction at each row's tensor-parallel size ``tp``."""
        fraction = np.full(np.shape(tp), self.kv_memory_fraction)
        for size in sorted(self.kv_memory_fraction_by_tp):
            fraction = np.where(tp >= size, self.kv_memory_fraction_by_tp[size], fraction)
        return fraction

    @property
    def iteration_floor_s(self) -> float:
        """Paid once per iteration whatever it holds: sampling and the exposed scheduler."""
        return self.sampling_s + self.scheduler_s


def _release_parts(version: str) -> list[str]:
    """Dotted components of a version, its local part (``+g...``) dropped."""
    return version.strip().split("+", 1)[0].split(".")


@cache
def _profiles() -> tuple[ServingProfile, ...]:
    data = json.loads(
        (resources.files("cost_model") / "data" / "serving_profiles.json").read_text()
    )
    return tuple(ServingProfile(**row) for row in data["profiles"])


@cache
def serving_profile(engine: str, version: str | None = None) -> ServingProfile:
    """The shipped profile of ``engine`` at ``version`` (None: its current releases, the
    default profile). A version names the release it ran, e.g. ``"0.7.4.dev181+gf35f8e22"``;
    the profile whose release prefix matches the most dotted components is taken. Raises
    ``ValueError`` naming the known engines, or the known releases of ``engine``."""
    own = [profile for profile in _profiles() if profile.engine == engine]
    if not own:
        engines = sorted({profile.engine for profile in _profiles()})
        raise ValueError(f"serving_engine ({engine!r}) must be one of {engines}")
    if version is None:
        (default,) = [profile for profile in own if profile.default]
        return default
    parts = _release_parts(version)
    best, best_length = None, 0
    for profile in own:
        for release in profile.releases:
            prefix = _release_parts(release)
            if parts[: len(prefix)] == prefix and len(prefix) > best_length:
                best, best_length = profile, len(prefix)
    if best is None:
        known = "; ".join(f"{', '.join(profile.releases)} ({profile.version})" for profile in own)
        raise ValueError(
            f"serving_engine_version ({version!r}) of {engine} must start with a release "
            f"that has a profile: {known}"
        )
    return best
