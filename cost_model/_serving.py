"""Prefill/decode disaggregation: split devices between a prefill pool and a decode pool.

Each pool is a whole number of *units* (one unit = one replica of its ``ParallelConfig``, as
DeepSeek's 4-node prefill and 18-node decode units; Zhong et al., DistServe, OSDI'24). A prefill
unit completes ``input tokens/s / prompt_tokens`` requests per second, a decode unit
``output tokens/s / output_tokens``; the deployment serves the smaller of the two pools' rates
(rate matching): the split of ``num_devices`` that serves the most requests. With
``workload.request_rate_per_s`` the units fill the devices and serve that rate, split for the
least latency; with ``workload.concurrency`` they serve that many closed-loop clients, split for the most
requests; each pool at the load it carries (``_serving_pool_load``).
Each request's prompt cache then crosses the scale-out network from a prefill rank to a decode
rank; its time adds to the TTFT and its volume to the decode pool's network load.

TTFT under load (DistServe sec. 4.1; Mooncake, FAST'25): the engine's per-request overhead, the
wait for the prefill pass running when the request arrives (half a pass, times the prefill
pool's utilization at the served rate: a pool that batches whatever is queued never holds a
request longer than the running pass), its own prefill pass, the KV transfer, and the wait to
join the decode pool's running batch (half a decode step).
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from cost_model._breakdown import InfeasiblePlanError
from cost_model._inference_load import estimate_inference_table
from cost_model._model_spec import ModelSpec
from cost_model._options import EstimateOptions
from cost_model._parallel import ParallelConfig
from cost_model._reasons import REASON_LABELS
from cost_model._serving_columns import ServingConfig
from cost_model._serving_pool_load import (
    PassCurve,
    PoolPair,
    concurrency_split,
    pass_curve,
    rate_split,
    unit_workload,
)
from cost_model._serving_profile import serving_profile
from cost_model._table import configs_to_table
from cost_model._workload import Inference

_STRICT = ConfigDict(extra="forbid", frozen=True)


class PoolConfig(BaseModel):
    """The layout of one pool's unit and its serving knobs (``phase`` is set by the pool)."""

    model_config = _STRICT

    config: ParallelConfig
    serving: ServingConfig = ServingConfig()


class DisaggregatedSplit(BaseModel):
    """Devices per pool and what the deployment then serves."""

    model_config = _STRICT

    prefill_units: int = Field(ge=0)
    decode_units: int = Field(ge=0)
    prefill_devices: int = Field(ge=0)
    decode_devices: int = Field(ge=0)
    prefill_requests_per_s_per_unit: float = Field(gt=0)
    decode_requests_per_s_per_unit: float = Field(gt=0)
    requests_per_s: float = Field(ge=0)
    input_tokens_per_s: float = Field(ge=0)
    output_tokens_per_s: float = Field(ge=0)
    bottleneck: str = Field(description="'prefill' or 'decode': the pool whose rate binds")
    prefill_ttft_s: float = Field(
        ge=0, description="the prefill pool's pass over its batch of prompts"
    )
    kv_transfer_s: float = Field(
        ge=0, description="one request's prompt cache, prefill rank to decode rank"
    )
    kv_transfer_network_fraction: float = Field(
        ge=0, description="share of the decode pool's scale-out bandwidth the arriving caches use"
    )
    prefill_queue_s: float = Field(
        default=0.0, ge=0, description="mean wait for the running prefill pass"
    )
    decode_admission_s: float = Field(
        default=0.0, ge=0, description="mean wait to join the decode batch"
    )
    request_overhead_s: float = Field(
        default=0.0, ge=0, description="the engine's per-request overhead"
    )
    tpot_s: float = Field(default=0.0, ge=0, description="the decode pool's step at its batch")
    client_wait_s: float = Field(
        default=0.0,
        ge=0,
        description="closed-loop clients past the split's capacity: their wait to be admitted",
    )

    @property
    def ttft_s(self) -> float:
        """First token: overhead, prefill queue and pass, the cache's move, decode admission."""
        return (
            self.request_overhead_s
            + self.client_wait_s
            + self.prefill_queue_s
            + self.prefill_ttft_s
            + self.kv_transfer_s
            + self.decode_admission_s
        )

    def e2e_s(self, output_tokens: int) -> float:
        """Mean end-to-end seconds of a request: its first token, then the other output
        tokens' decode steps."""
        return self.ttft_s + max(output_tokens - 1, 0) * self.tpot_s

    def ttft_quantile_s(self, p: float) -> float:
        """The p-quantile of the first token's time: each of the two waits (for the running
        prefill pass, to join the decode batch) is uniform from zero to twice its mean, so its
        p-quantile is 2p times the mean (``_inference_load.prefill_pool_ttft_quantile_s``)."""
        return (
            self.request_overhead_s
            + self.client_wait_s
            + 2.0 * p * self.prefill_queue_s
            + self.prefill_ttft_s
            + self.kv_transfer_s
            + 2.0 * p * self.decode_admission_s
        )


UnitRate = tuple[int, float, float]


def pool_unit_rate(
    model, cluster, workload: Inference, pool: PoolConfig, phase: str, options=None
) -> UnitRate:
    """(devices per unit, requests/s per unit, pass time: TTFT of a prefill unit, TPOT of a
    decode unit) of a pool; raises ``InfeasiblePlanError`` if the pool does not fit. A search
    pairing many units prices each once and hands the pairs to ``disaggregated_split(rates=)``."""
    workload = unit_workload(workload)
    serving = pool.serving.model_copy(update={"phase": phase})
    table = configs_to_table([pool.config], **serving.columns(workload=workload))
    columns = estimate_inference_table(
        model=model, cluster=cluster, workload=workload, table=table, options=options
    )
    if not bool(columns["feasible"][0]):
        label = REASON_LABELS[int(columns["reason"][0])]
        raise InfeasiblePlanError(
            f"the {phase} pool's unit ({pool.config.world_size} devices) is infeasible ({label})",
            part=label,
            needed_bytes=float(columns["memory_per_device_bytes"][0]),
            available_bytes=float(columns["memory_capacity_bytes"][0]),
        )
    devices = pool.config.world_size
    tokens_per_request = workload.prompt_tokens if phase == "prefill" else workload.output_tokens
    seconds = float(np.nan_to_num(columns["ttft_s" if phase == "prefill" else "tpot_s"][0]))
    return (
        devices,
        float(columns["tokens_per_s_per_device"][0]) * devices / tokens_per_request,
        seconds,
    )


def _kv_transfer(
    model: ModelSpec,
    cluster,
    workload: Inference,
    decode: PoolConfig,
    requests_per_s: float,
    decode_devices: int,
) -> tuple[float, float]:
    """Seconds to send one prompt's cache over the scale-out network (one rank to one rank; the
    transfer of layer l overlaps the prefill of layer l+1 in practice, so this bounds the added
    TTFT), and the share of the decode pool's network the arriving caches take (Mooncake, DistServe)."""
    kv_dtype = decode.serving.kv_dtype or workload.kv_dtype
    cache_bytes = model.kv_cache_bytes(workload.prompt_tokens, kv_dtype)
    seconds = float(
        cluster.collective_time(
            "send_recv", group_size=2, ranks_per_node=1, message_bytes=cache_bytes
        )
    )
    network = (
        cluster.inter_node.bandwidth_bytes_per_s
        * cluster.inter_node.efficiency
        * max(decode_devices, 1)
    )
    return seconds, requests_per_s * cache_bytes / network


def disaggregated_split(
    *,
    model: ModelSpec,
    cluster,
    workload: Inference,
    prefill: PoolConfig,
    decode: PoolConfig,
    num_devices: int | None = None,
    options: EstimateOptions | None = None,
    rates: tuple[UnitRate, UnitRate] | None = None,
    curves: tuple[PassCurve, PassCurve] | None = None,
) -> DisaggregatedSplit:
    """Rate-matched split of ``num_devices`` (default: the cluster's) into prefill and decode units.
    ``rates``: the (prefill, decode) ``pool_unit_rate`` of these pools when already priced.
    Under a stated load (rate or concurrency) the units fill the devices and each pool is priced at the
    load that rate puts on its units (``_serving_pool_load``; ``curves``: their ``pass_curve``
    when already priced)."""
    num_devices = cluster.num_devices if num_devices is None else num_devices
    if rates is None:
        rates = (
            pool_unit_rate(model, cluster, workload, prefill, "prefill", options),
            pool_unit_rate(model, cluster, workload, decode, "decode", options),
        )
    (prefill_size, prefill_rate, prefill_ttft), (decode_size, decode_rate, decode_step) = rates
    if workload.request_rate_per_s is not None or workload.concurrency is not None:
        return _offered_load_split(
            model=model,
            cluster=cluster,
            workload=workload,
            pools=(prefill, decode),
            rates=rates,
            num_devices=num_devices,
            options=options,
            curves=curves,
        )
    prefill_units, decode_units = _best_split(
        num_devices, prefill_size, prefill_rate, decode_size, decode_rate
    )
    served = min(prefill_units * prefill_rate, decode_units * decode_rate)
    transfer_s, network_fraction = _kv_transfer(
        model, cluster, workload, decode, served, decode_units * decode_size
    )
    profile = serving_profile(workload.serving_engine, workload.serving_engine_version)
    prefill_utilization = (
        min(served / (prefill_units * prefill_rate), 1.0) if prefill_units else 0.0
    )
    return DisaggregatedSplit(
        prefill_queue_s=prefill_utilization * prefill_ttft / 2.0,
        decode_admission_s=decode_step / 2.0,
        request_overhead_s=profile.request_overhead_s,
        tpot_s=decode_step,
        prefill_ttft_s=prefill_ttft,
        kv_transfer_s=transfer_s,
        kv_transfer_network_fraction=network_fraction,
        prefill_units=prefill_units,
        decode_units=decode_units,
        prefill_devices=prefill_units * prefill_size,
        decode_devices=decode_units * decode_size,
        prefill_requests_per_s_per_unit=prefill_rate,
        decode_requests_per_s_per_unit=decode_rate,
        requests_per_s=served,
        input_tokens_per_s=served * workload.prompt_tokens,
        output_tokens_per_s=served * workload.output_tokens,
        bottleneck="prefill"
        if prefill_units * prefill_rate <= decode_units * decode_rate
        else "decode",
    )


def _best_split(
    num_devices: int, prefill_size: int, prefill_rate: float, decode_size: int, decode_rate: float
) -> tuple[int, int]:
    """Units of each pool that maximize min(prefill rate, decode rate) within ``num_devices``;
    among equal rates, the fewest devices."""
    prefill_units = np.arange(1, num_devices // prefill_size + 1)
    decode_units = (num_devices - prefill_units * prefill_size) // decode_size
    if prefill_units.size == 0 or decode_units.max(initial=0) < 1:
        raise InfeasiblePlanError(
            f"{num_devices} devices cannot hold one prefill unit ({prefill_size}) and one decode unit ({decode_size})",
            part="devices",
        )
    served = np.minimum(prefill_units * prefill_rate, np.maximum(decode_units, 0) * decode_rate)
    best = int(np.argmax(served))
    # Trim the pool that has slack: fewest units of each that still serve the best rate.
    rate = served[best]
    return int(np.ceil(rate / prefill_rate - 1e-9)), int(np.ceil(rate / decode_rate - 1e-9))


def pool_curve(
    model, cluster, workload: Inference, pool: PoolConfig, phase: str, options=None
) -> PassCurve:
    """The pool's ``pass_curve`` for ``phase`` up to the batch its unit is saturated at (its
    serving batch, or the one ``pool_unit_rate`` resolves)."""
    workload = unit_workload(workload)
    batch = pool.serving.batch_size
    if not batch:
        serving = pool.serving.model_copy(update={"phase": phase})
        table = configs_to_table([pool.config], **serving.columns(workload=workload))
        columns = estimate_inference_table(
            model=model, cluster=cluster, workload=workload, table=table, options=options
        )
        batch = int(columns["batch_size"][0])
    return pass_curve(model, cluster, workload, pool, phase, batch, options)


def _offered_load_split(
    *, model, cluster, workload: Inference, pools, rates, num_devices: int, options, curves
) -> DisaggregatedSplit:
    """``disaggregated_split`` under an offered request rate or a closed loop of clients
    (``_serving_pool_load``): units filling the devices, each pool at the load it carries."""
    prefill, decode = pools
    (prefill_size, prefill_rate, _), (decode_size, decode_rate, _) = rates
    if curves is None:
        curves = (
            pool_curve(model, cluster, workload, prefill, "prefill", options),
            pool_curve(model, cluster, workload, decode, "decode", options),
        )
    transfer_s, _ = _kv_transfer(model, cluster, workload, decode, 0.0, 1)
    profile = serving_profile(workload.serving_engine, workload.serving_engine_version)
    pair = PoolPair(
        prefill=(prefill_size, prefill_rate, curves[0]),
        decode=(decode_size, decode_rate, curves[1]),
        output_tokens=workload.output_tokens,
        overhead_s=profile.request_overhead_s,
        transfer_s=transfer_s,
        ttft_slo_s=workload.ttft_slo_s,
        tpot_slo_s=workload.tpot_slo_s,
    )
    if workload.request_rate_per_s is not None:
        rate = float(workload.request_rate_per_s)
        load = rate_split(pair, rate=rate, num_devices=num_devices)
        if load is None:
            units = _best_split(num_devices, prefill_size, prefill_rate, decode_size, decode_rate)
            raise InfeasiblePlanError(
                f"serving {rate:g} requests/s needs more than {num_devices} devices: the best "
                f"split ({units[0]} prefill x {prefill_size} + {units[1]} decode x {decode_size}) "
                f"carries {pair.capacity(*units):.3g} requests/s",
                part="devices",
            )
    else:
        load = concurrency_split(
            pair, concurrency=float(workload.concurrency or 0), num_devices=num_devices
        )
        if load is None:
            raise InfeasiblePlanError(
                f"{num_devices} devices cannot hold one prefill unit ({prefill_size}) and one "
                f"decode unit ({decode_size})",
                part="devices",
            )
    rate = load.requests_per_s
    decode_devices = load.decode_units * decode_size
    _, network_fraction = _kv_transfer(model, cluster, workload, decode, rate, decode_devices)
    prefill_capacity = load.prefill_units * prefill_rate
    return DisaggregatedSplit(
        prefill_queue_s=load.prefill_utilization * load.prefill_pass_s / 2.0,
        decode_admission_s=load.decode_step_s / 2.0,
        client_wait_s=load.admission_wait_s,
        request_overhead_s=profile.request_overhead_s,
        tpot_s=load.decode_step_s,
        prefill_ttft_s=load.prefill_pass_s,
        kv_transfer_s=transfer_s,
        kv_transfer_network_fraction=network_fraction,
        prefill_units=load.prefill_units,
        decode_units=load.decode_units,
        prefill_devices=load.prefill_units * prefill_size,
        decode_devices=decode_devices,
        prefill_requests_per_s_per_unit=prefill_rate,
        decode_requests_per_s_per_unit=decode_rate,
        requests_per_s=rate,
        input_tokens_per_s=rate * workload.prompt_tokens,
        output_tokens_per_s=rate * workload.output_tokens,
        bottleneck="prefill" if prefill_capacity <= load.decode_units * decode_rate else "decode",
    )
