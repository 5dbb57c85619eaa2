"""Prefill/decode disaggregation: the best unit of each pool and the rate-matched device split.

A disaggregated deployment runs prompts on a prefill pool and generation on a decode pool, each
made of identical *units* (DistServe, Zhong et al. OSDI'24; DeepSeek's prefill and decode units).
For each candidate unit size the layouts of one unit are priced for its phase — prefill by input
tokens/s per device under the TTFT SLO, decode by output tokens/s per device under the TPOT SLO —
and the best unit of each pool is sized by ``cost_model.disaggregated_split`` (rate matching).
The deployment is worth it when it serves more output tokens per second per device than the best
colocated layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cost_model import (
    POOL_SLO_QUANTILE,
    DisaggregatedSplit,
    InfeasiblePlanError,
    Inference,
    Layout,
    ModelSpec,
    PoolConfig,
    ServingConfig,
    disaggregated_split,
    pass_curve,
    pool_curve,
    pool_unit_rate,
    unit_workload,
)
from search._candidate import Candidate
from search._exhaustive import exhaustive_search
from search._space import SearchBounds, divisors
from topology import Cluster

#: Serving settings a pool's unit takes for its phase: the prefill pool runs DeepEP's "normal"
#: (throughput, NVLink-forwarded) all-to-all, the decode pool its "low-latency" kernels (DeepEP
#: README; SGLang's ``--deepep-mode normal|low_latency`` per pool in its disaggregated examples).
POOL_A2A_BACKEND = {"prefill": "normal", "decode": "low_latency"}


@dataclass(frozen=True)
class DisaggregatedResult:
    """Best unit of each pool and the split; ``output_tokens_per_s_per_device`` over the devices used.

    ``considered`` lists every (prefill unit size, decode unit size, output tokens/s per device)
    pair that was priced, best first: the reason the chosen split won.
    """

    prefill: Candidate
    decode: Candidate
    prefill_cluster: Cluster
    decode_cluster: Cluster
    prefill_devices: int
    decode_devices: int
    output_tokens_per_s_per_device: float
    bottleneck: str
    prefill_units: int = 1
    decode_units: int = 1
    considered: tuple[tuple[int, int, float], ...] = ()
    #: the deployment's first-token time (mean and p90: overhead, prefill queue and pass, KV
    #: transfer, decode admission) and its decode step
    ttft_s: float | None = None
    ttft_p90_s: float | None = None
    tpot_s: float | None = None
    #: unit-size pairs priced but left out: their p90 TTFT misses the workload's SLO
    over_ttft_slo: int = 0
    #: mean end-to-end seconds of a request (TTFT, then the other output tokens' steps)
    e2e_s: float | None = None
    #: what ``considered`` lists per pair: output tokens/s per device, or, under an offered
    #: request rate (which every pair carries alike), mean end-to-end seconds
    ranked_by: str = "output tokens/s/device"
    #: the closed form's split of the chosen pair (its request rate, KV transfer, waits)
    split: DisaggregatedSplit | None = None


def unit_sizes(*, model: ModelSpec, cluster: Cluster, workload: Inference) -> list[int]:
    """Every unit size that can hold the weights and leaves room for a unit of the other pool:
    divisors of one host, whole numbers of hosts within one node and whole numbers of nodes (a
    host is a whole node, or one compute tray of a rack-scale NVLink domain:
    ``Cluster.devices_per_host``, 4 GPUs of a GB200 NVL72)."""
    weights = model.weight_bytes(workload.weight_dtype, workload.weight_dtype_by_part)
    smallest = math.ceil(weights / cluster.memory_per_device_bytes)
    node, host = cluster.devices_per_node, cluster.host_devices
    options = [d for d in divisors(host) if d >= smallest]
    options += [t for t in range(host, node, host) if t >= smallest]
    options += [node * k for k in range(1, cluster.num_nodes + 1) if node * k >= smallest]
    fewest = min(options, default=cluster.num_devices)
    return sorted({u for u in options if u + fewest <= cluster.num_devices})


def unit_cluster(cluster: Cluster, size: int) -> Cluster:
    """``size`` devices of ``cluster`` (a ``unit_sizes`` size): whole nodes, whole hosts of one
    node, or part of one host (then the unit is a host of its own); the NIC sharing and measured
    links follow the devices kept (``Cluster.with_devices_per_node``)."""
    node = cluster.devices_per_node
    whole = cluster.with_nodes(max(1, size // node))
    per_node = min(size, node)
    if per_node % whole.host_devices:
        whole = whole.model_copy(update={"devices_per_host": None})
    return whole.with_devices_per_node(per_node)


def _best_units(
    *, model, cluster, workload, phase: str, bounds: SearchBounds, estimator
) -> dict[int, tuple[Candidate, Cluster]]:
    """The best feasible layout of one unit of each size for ``phase`` (by tokens/s per device)."""
    best = {}
    for size in unit_sizes(model=model, cluster=cluster, workload=workload):
        unit = unit_cluster(cluster, size)
        try:
            found = exhaustive_search(  # a unit is counted at its saturated rate
                model,
                unit,
                workload,
                objective="throughput",
                bounds=bounds.model_copy(update={"phase": phase}),
                estimator=estimator,
            ).best
        except ValueError:  # no legal layout on this many devices
            continue
        if found.feasible:
            best[size] = (found, unit)
    return best


def find_disaggregated(
    model: ModelSpec,
    cluster: Cluster,
    workload: Inference,
    *,
    bounds: SearchBounds | None = None,
    estimator=None,
) -> DisaggregatedResult | None:
    """The best disaggregated deployment on ``cluster``, or None when no unit of a pool fits or
    no split's p90 TTFT (``DisaggregatedSplit.ttft_quantile_s``) meets the workload's SLO.

    Every pair of unit sizes is split by rate matching (``cost_model.disaggregated_split``:
    several units per pool, pools of any size), so the pools may be asymmetric (16 + 56 devices
    of a 72-GPU NVLink domain); the pair serving the most output tokens/s per device used wins,
    or, under an offered request rate (which every pair serves alike), the one
    with the least mean end-to-end latency. Under a stated load the pools are priced at the load
    they carry (``cost_model._serving_pool_load``), the units themselves saturated.
    """
    bounds = bounds or SearchBounds()
    units = {  # each unit searched saturated: the stated load is the whole deployment's
        phase: _best_units(
            model=model,
            cluster=cluster,
            workload=unit_workload(workload),
            phase=phase,
            bounds=bounds,
            estimator=estimator,
        )
        for phase in ("prefill", "decode")
    }
    priced, over_slo = _priced_pairs(model, cluster, workload, units)
    if not priced:
        return None
    offered = workload.request_rate_per_s is not None
    # the offered rate is carried by every pair alike: the least latency wins there
    priced.sort(key=lambda pair: pair.e2e_s if offered else -pair.rate)
    best = priced[0]
    split = best.split
    return DisaggregatedResult(
        prefill=_with_pool_serving(best.prefill[0], "prefill"),
        decode=_with_pool_serving(best.decode[0], "decode"),
        prefill_cluster=best.prefill[1],
        decode_cluster=best.decode[1],
        prefill_devices=split.prefill_devices,
        decode_devices=split.decode_devices,
        output_tokens_per_s_per_device=best.rate,
        bottleneck=split.bottleneck,
        prefill_units=split.prefill_units,
        decode_units=split.decode_units,
        considered=tuple(
            (pair.sizes[0], pair.sizes[1], pair.e2e_s if offered else pair.rate) for pair in priced
        ),
        ranked_by="mean end-to-end s" if offered else "output tokens/s/device",
        ttft_s=split.ttft_s,
        ttft_p90_s=split.ttft_quantile_s(POOL_SLO_QUANTILE),
        tpot_s=split.tpot_s,
        e2e_s=best.e2e_s,
        over_ttft_slo=over_slo,
        split=split,
    )


@dataclass(frozen=True)
class _PricedPair:
    """One prefill/decode pair of unit sizes, split and priced."""

    sizes: tuple[int, int]
    split: DisaggregatedSplit
    rate: float  # output tokens/s per device used
    e2e_s: float
    prefill: tuple[Candidate, Cluster]
    decode: tuple[Candidate, Cluster]


def _priced_pairs(model, cluster, workload: Inference, units: dict) -> tuple[list, int]:
    """Every pair of the best units of each size split (``cost_model.disaggregated_split``),
    each unit's rate (and, under a stated load, its ``pass_curve``) priced once; the pairs whose
    p90 TTFT misses the SLO left out and counted."""
    rates = {
        phase: _unit_rates(model, cluster, workload, found, phase) for phase, found in units.items()
    }
    loaded = workload.request_rate_per_s is not None or workload.concurrency is not None
    curves = (  # under a stated load, each unit's pass against the requests it holds
        {
            phase: _unit_curves(model, cluster, workload, found, phase)
            for phase, found in units.items()
        }
        if loaded
        else None
    )
    priced, over_slo = [], 0
    for prefill_size, prefill in units["prefill"].items():
        for decode_size, decode in units["decode"].items():
            if prefill_size not in rates["prefill"] or decode_size not in rates["decode"]:
                continue
            try:
                split = disaggregated_split(
                    model=model,
                    cluster=cluster,
                    workload=workload,
                    prefill=_pool(prefill[0], "prefill"),
                    decode=_pool(decode[0], "decode"),
                    rates=(rates["prefill"][prefill_size], rates["decode"][decode_size]),
                    curves=None
                    if curves is None
                    else (curves["prefill"][prefill_size], curves["decode"][decode_size]),
                )
            except InfeasiblePlanError:
                continue
            slo = workload.ttft_slo_s
            if slo is not None and split.ttft_quantile_s(POOL_SLO_QUANTILE) > slo:
                over_slo += 1  # the queue, transfer and admission push the p90 past the SLO
                continue
            used = split.prefill_devices + split.decode_devices
            priced.append(
                _PricedPair(
                    sizes=(prefill_size, decode_size),
                    split=split,
                    rate=split.output_tokens_per_s / used,
                    e2e_s=split.e2e_s(workload.output_tokens),
                    prefill=prefill,
                    decode=decode,
                )
            )
    return priced, over_slo


def _unit_rates(model, cluster, workload, units: dict, phase: str) -> dict:
    """``pool_unit_rate`` of the best unit of each size (sizes whose unit does not fit left out)."""
    rates = {}
    for size, (candidate, _) in units.items():
        try:
            rates[size] = pool_unit_rate(model, cluster, workload, _pool(candidate, phase), phase)
        except InfeasiblePlanError:
            continue
    return rates


def _unit_curves(model, cluster, workload, units: dict, phase: str) -> dict:
    """``cost_model.pass_curve`` of the best unit of each size, up to the batch its search
    resolved (the batch its unit rate is counted at)."""
    curves = {}
    for size, (candidate, _) in units.items():
        batch = int(candidate.metrics.get("batch_size") or 0)
        pool = _pool(candidate, phase)
        if batch < 1:
            curves[size] = pool_curve(model, cluster, workload, pool, phase)
        else:
            curves[size] = pass_curve(model, cluster, workload, pool, phase, batch)
    return curves


def _pool(candidate: Candidate, phase: str) -> PoolConfig:
    """The unit's layout and its own serving settings: the batch, KV dtype, redundant experts and
    two-batch overlap it was searched with, and its phase's all-to-all backend."""
    serving = candidate.serving or ServingConfig()
    update = {"phase": "both", "a2a_backend": POOL_A2A_BACKEND[phase]}
    return PoolConfig(config=candidate.config, serving=serving.model_copy(update=update))


def _with_pool_serving(candidate: Candidate, phase: str) -> Candidate:
    """``candidate`` whose layout carries its pool's serving settings and phase (the plan records
    them, and prices the pool as the split did: ``pool_unit_rate`` prices a unit in its own
    phase, so the batch the plan records and the rate the deployment claims are one price)."""
    serving = _pool(candidate, phase).serving.model_copy(update={"phase": phase})
    layout = Layout(config=candidate.config, serving=serving)
    return Candidate(layout, candidate.metrics, candidate.violations, candidate.trial_number)
