"""Serving engine profiles: each engine's scheduling defaults and per-step floors.

The serving policy (``_serving_load``) has defaults that differ by engine (``ServingProfile``,
each with its documentation as source): whether prefill and decode mix in one iteration (vLLM
V1 and TensorRT-LLM's in-flight batching do; SGLang runs a waiting prefill alone, with the
whole budget, and the decodes wait for it) and whether a long prompt is chunked (TensorRT-LLM's
default prefills whole prompts). The engine's per-iteration floors are added to each
iteration's pass time (``_serving_replica.IterationCost``). The shipped profiles live in
``data/serving_profiles.json``; ``serving_profile`` picks one by engine and release.

Some defaults depend on the device and the layout the engine starts on: SGLang sizes its
chunked-prefill budget and its largest CUDA-graph batch by the device's memory (and the
tensor-parallel size), and from 0.4.8 derives ``mem_fraction_static`` from what it reserves for
activations and graphs (``server_args.py`` ``_handle_gpu_memory_settings``). A profile states
them as ordered ``DeviceRule`` lists (``token_budget``, ``graph_tokens``) and ``ReserveRule``
tiers (``memory_fraction``), each with its source.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

Engine = Literal["vllm", "sglang", "trtllm"]

MIB = 2.0**20
GIB = 2.0**30


class DeviceRule(BaseModel):
    """One device-dependent default of an engine: it applies on a device with less than
    ``below_gib`` GiB of memory, at a tensor-parallel size below ``tp_below`` and of a vendor
    whose name the device's holds (``vendor``, e.g. ``"AMD"``), each where given (the engines read
    the device memory in MiB, the driver's total); in a list of rules the first that applies
    gives ``value``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    below_gib: float | None = Field(default=None, gt=0)
    tp_below: int | None = Field(default=None, gt=1)
    vendor: str | None = None
    value: float = Field(gt=0)


class ReserveRule(BaseModel):
    """Device memory (MiB) an engine keeps out of its static pool of weights and KV cache on
    devices under ``below_gib`` GiB (None: any larger one), so that its default pool fraction is
    ``round((M - R) / M, 3)`` of the device's ``M`` MiB (SGLang ``mem_fraction_static``; not
    rounded where ``rounded`` is false): ``R = base_mib + per_parallel_mib * tp * pp +
    per_budget_token_mib * max(budget, min_budget_tokens) + per_graph_batch_mib * graph batch``,
    at least ``floor_mib``; with attention data parallelism over ``dp`` ranks (``dp = tp``) also
    ``dp_attention_mib + graph batch * dp * (per_dp_graph_batch_mib + per_dp_large_graph_batch_mib
    where the graph batch exceeds large_graph_batch_above)`` before the floor. A tier with
    ``by_tp`` keeps the profile's fraction by tensor-parallel size (``kv_memory_fraction_by_tp``)
    instead."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    below_gib: float | None = Field(default=None, gt=0)
    by_tp: bool = False
    rounded: bool = True
    base_mib: float = Field(default=0.0, ge=0)
    per_parallel_mib: float = Field(default=0.0, ge=0)
    per_budget_token_mib: float = Field(default=0.0, ge=0)
    min_budget_tokens: float = Field(default=0.0, ge=0)
    per_graph_batch_mib: float = Field(default=0.0, ge=0)
    dp_attention_mib: float = Field(default=0.0, ge=0)
    per_dp_graph_batch_mib: float = Field(default=0.0, ge=0)
    per_dp_large_graph_batch_mib: float = Field(default=0.0, ge=0)
    large_graph_batch_above: float = Field(default=float("inf"), ge=0)
    floor_mib: float = Field(default=0.0, ge=0)


def _device_rules(
    rules: tuple[DeviceRule, ...],
    default: float,
    *,
    memory_bytes: float,
    tp,
    device_name: str = "",
) -> np.ndarray:
    """The value ``rules`` give on a device of ``memory_bytes`` named ``device_name`` at each
    tensor-parallel size of ``tp`` (the first rule that applies), ``default`` where none does."""
    tp = np.asarray(tp, dtype=np.float64)
    gib = memory_bytes / GIB
    value = np.full(tp.shape, float(default))
    decided = np.zeros(tp.shape, dtype=bool)
    for rule in rules:
        applies = ~decided
        if rule.below_gib is not None:
            applies = applies & (gib < rule.below_gib)
        if rule.tp_below is not None:
            applies = applies & (tp < rule.tp_below)
        if rule.vendor is not None:
            applies = applies & (rule.vendor.lower() in device_name.lower())
        value = np.where(applies, rule.value, value)
        decided = decided | applies
    return value


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
    #: whether an iteration carrying prompt tokens replays a CUDA graph (up to ``graph_max_tokens``,
    #: or up to the token budget with ``prefill_graph_tokens == "token_budget"``)
    prefill_graphs: bool
    #: the largest prompt-carrying iteration that replays a graph: the decode graphs' size
    #: (vLLM's one capture list) or the engine's token budget (SGLang's prefill graphs)
    prefill_graph_tokens: Literal["graph_max_tokens", "token_budget"] = "graph_max_tokens"
    #: the prefill graphs' limit for an MLA model, where smaller
    prefill_graph_mla_max_tokens: int | None = Field(default=None, gt=0)
    #: where the engine turns its prefill graphs off by default: attention data parallelism,
    #: pipeline parallelism, an expert all-to-all backend (DeepEP), AMD devices, a disaggregated
    #: prefill or decode pool
    prefill_graphs_off_with: tuple[
        Literal["attention_dp", "pipeline", "expert_all_to_all", "amd", "disaggregated"], ...
    ] = ()
    #: the largest iteration, in tokens per forward, that replays a CUDA graph (where no
    #: ``graph_max_tokens_rules`` rule applies)
    graph_max_tokens: int = Field(ge=0)
    #: the same by device memory and tensor-parallel size (SGLang ``cuda_graph_max_bs``)
    graph_max_tokens_rules: tuple[DeviceRule, ...] = ()
    #: whether data-parallel attention ranks that iterate together replay a decode graph only
    #: when every rank decodes the same number of requests (TensorRT-LLM's attention DP with
    #: ``cuda_graph_config.enable_padding`` off, its default): where their batches differ, no
    #: rank replays one (``_serving_coupling.TRTLLM_ATTENTION_DP_COUPLING``)
    graphs_need_equal_batches: bool = False
    sampling_s: float = Field(ge=0)
    scheduler_s: float = Field(ge=0)
    request_overhead_s: float = Field(ge=0)
    max_batched_tokens: int = Field(gt=0)
    #: the default token budget by device memory, where it depends on it (SGLang
    #: ``chunked_prefill_size``); ``max_batched_tokens`` where no rule applies
    max_batched_tokens_rules: tuple[DeviceRule, ...] = ()
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
    #: where the engine derives its fraction from what it reserves (SGLang >= 0.4.8): the tiers
    #: by device memory, the first whose ``below_gib`` the device is under (or None) applies;
    #: they replace ``kv_memory_fraction`` and ``kv_memory_fraction_by_tp``
    kv_memory_reserve: tuple[ReserveRule, ...] = ()
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

    def token_budget(self, memory_bytes: float, device_name: str = "") -> float:
        """The default tokens per iteration on a device of ``memory_bytes`` named
        ``device_name``."""
        return float(
            _device_rules(
                self.max_batched_tokens_rules,
                self.max_batched_tokens,
                memory_bytes=memory_bytes,
                tp=1.0,
                device_name=device_name,
            )
        )

    def graph_tokens(self, memory_bytes: float, tp, device_name: str = "") -> np.ndarray:
        """The largest iteration (tokens per forward) that replays a CUDA graph, by default, on a
        device of ``memory_bytes`` named ``device_name`` at each tensor-parallel size of ``tp``."""
        return _device_rules(
            self.graph_max_tokens_rules,
            self.graph_max_tokens,
            memory_bytes=memory_bytes,
            tp=tp,
            device_name=device_name,
        )

    def memory_fraction(
        self,
        tp: np.ndarray,
        *,
        memory_bytes: float | None = None,
        pp=1.0,
        budget: float | None = None,
        device_name: str = "",
        attention_dp=False,
    ) -> np.ndarray:
        """The default memory fraction at each row's tensor-parallel size ``tp``: from the tier
        of ``kv_memory_reserve`` the device of ``memory_bytes`` falls in (with the row's
        ``pp``, the iteration token ``budget``, default ``token_budget``, the graph batch,
        ``graph_tokens``, and whether it runs attention data-parallel over its tp ranks,
        ``attention_dp``), else by ``tp`` (``kv_memory_fraction_by_tp``)."""
        tp = np.asarray(tp, dtype=np.float64)
        fraction = np.full(tp.shape, self.kv_memory_fraction)
        for size in sorted(self.kv_memory_fraction_by_tp):
            fraction = np.where(tp >= size, self.kv_memory_fraction_by_tp[size], fraction)
        if not self.kv_memory_reserve or memory_bytes is None:
            return fraction
        gib, mib = memory_bytes / GIB, memory_bytes / MIB
        tier = next(
            (
                rule
                for rule in self.kv_memory_reserve
                if rule.below_gib is None or gib < rule.below_gib
            ),
            None,
        )
        if tier is None:
            return np.full(tp.shape, self.kv_memory_fraction)
        if tier.by_tp:
            return fraction
        tokens = self.token_budget(memory_bytes, device_name) if budget is None else float(budget)
        graph = self.graph_tokens(memory_bytes, tp, device_name)
        per_dp_batch = tier.per_dp_graph_batch_mib + np.where(
            graph > tier.large_graph_batch_above, tier.per_dp_large_graph_batch_mib, 0.0
        )
        reserved = (
            tier.base_mib
            + tier.per_parallel_mib * tp * np.asarray(pp, dtype=np.float64)
            + tier.per_budget_token_mib * max(tokens, tier.min_budget_tokens)
            + tier.per_graph_batch_mib * graph
            + np.where(attention_dp, tier.dp_attention_mib + graph * tp * per_dp_batch, 0.0)
        )
        fraction = (mib - np.maximum(reserved, tier.floor_mib)) / mib
        return np.round(fraction, 3) if tier.rounded else fraction

    @property
    def iteration_floor_s(self) -> float:
        """Paid once per iteration whatever it holds: sampling and the exposed scheduler."""
        return self.sampling_s + self.scheduler_s


def _release_parts(version: str) -> list[str]:
    """Dotted components of a version, its local part (``+g...``) dropped."""
    return version.strip().split("+", 1)[0].split(".")


def _with_base(row: dict, rows: list[dict]) -> dict:
    """A profile row that ``extends`` another of its engine (named by its ``version``): the
    other's fields, its own over them, sources merged key by key."""
    base_version = row.get("extends")
    if base_version is None:
        return row
    bases = [r for r in rows if r["engine"] == row["engine"] and r["version"] == base_version]
    if len(bases) != 1:
        raise ValueError(
            f"serving profile {row['engine']} {row['version']}: extends ({base_version!r}) must "
            f"name exactly one other profile version of {row['engine']}"
        )
    base = _with_base(bases[0], rows)
    merged = {**base, **{key: value for key, value in row.items() if key != "extends"}}
    merged["sources"] = {**base["sources"], **row["sources"]}
    merged["default"] = row.get("default", False)
    return merged


@cache
def _profiles() -> tuple[ServingProfile, ...]:
    data = json.loads(
        (resources.files("cost_model") / "data" / "serving_profiles.json").read_text()
    )
    rows = data["profiles"]
    return tuple(ServingProfile(**_with_base(row, rows)) for row in rows)


def engine_profiles(engine: str) -> list[ServingProfile]:
    """``engine``'s shipped profiles, oldest releases first."""

    def key(profile: ServingProfile) -> tuple:
        return tuple(
            (0, int(part), "") if part.isdigit() else (1, 0, part)
            for part in _release_parts(profile.releases[0])
        )

    return sorted((p for p in _profiles() if p.engine == engine), key=key)


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
