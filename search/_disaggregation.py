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

from cost_model import InfeasiblePlanError, Inference, ModelSpec, PoolConfig, disaggregated_split
from cost_model._serving_columns import ServingConfig
from search._candidate import Candidate
from search._exhaustive import exhaustive_search
from search._space import SearchBounds, divisors
from topology import Cluster

MAX_UNIT_SIZES = 3


@dataclass(frozen=True)
class DisaggregatedResult:
    """Best unit of each pool and the split; ``output_tokens_per_s_per_device`` over the devices used."""

    prefill: Candidate
    decode: Candidate
    prefill_cluster: Cluster
    decode_cluster: Cluster
    prefill_devices: int
    decode_devices: int
    output_tokens_per_s_per_device: float
    bottleneck: str


def unit_sizes(*, model: ModelSpec, cluster: Cluster, workload: Inference, limit: int = MAX_UNIT_SIZES) -> list[int]:
    """The smallest unit sizes that can hold the weights (whole nodes, or divisors of one big node),
    at most half the cluster so that both pools fit."""
    weights = model.weight_bytes(workload.weight_dtype)
    smallest = math.ceil(weights / cluster.memory_per_device_bytes)
    node = cluster.devices_per_node
    options = [d for d in divisors(node) if d >= smallest] if smallest <= node else []
    options += [node * k for k in divisors(cluster.num_nodes) if node * k >= smallest]
    return sorted({u for u in options if 2 * u <= cluster.num_devices})[:limit]


def unit_cluster(cluster: Cluster, size: int) -> Cluster:
    """``size`` devices of ``cluster``: whole nodes, or part of one node (re-validated, so the
    NIC sharing and measured links stay consistent with the smaller node)."""
    node = cluster.devices_per_node
    per_node = min(size, node)
    data = cluster.model_dump() | {
        "num_nodes": max(1, size // node),
        "devices_per_node": per_node,
        "devices_per_nic": math.gcd(cluster.devices_per_nic, per_node),
        "links": tuple(link for link in cluster.model_dump()["links"] if max(link["from_device"], link["to_device"]) < size),
    }
    return Cluster.model_validate(data)


def _best_unit(*, model, cluster, workload, phase: str, bounds: SearchBounds, estimator) -> tuple[Candidate, Cluster] | None:  # noqa: ANN001
    best = None
    for size in unit_sizes(model=model, cluster=cluster, workload=workload):
        unit = unit_cluster(cluster, size)
        try:
            found = exhaustive_search(
                model, unit, workload, bounds=bounds.model_copy(update={"phase": phase}), estimator=estimator
            ).best
        except ValueError:  # no legal layout on this many devices
            continue
        rate = found.metrics["tokens_per_s_per_device"]
        if found.feasible and (best is None or rate > best[0].metrics["tokens_per_s_per_device"]):
            best = (found, unit)
    return best


def find_disaggregated(
    model: ModelSpec, cluster: Cluster, workload: Inference, *, bounds: SearchBounds | None = None, estimator=None  # noqa: ANN001
) -> DisaggregatedResult | None:
    """The best disaggregated deployment on ``cluster``, or None when no unit of a pool fits."""
    bounds = bounds or SearchBounds()
    prefill = _best_unit(model=model, cluster=cluster, workload=workload, phase="prefill", bounds=bounds, estimator=estimator)
    decode = _best_unit(model=model, cluster=cluster, workload=workload, phase="decode", bounds=bounds, estimator=estimator)
    if prefill is None or decode is None:
        return None
    try:
        split = disaggregated_split(
            model=model, cluster=cluster, workload=workload, prefill=_pool(prefill[0]), decode=_pool(decode[0])
        )
    except InfeasiblePlanError:
        return None
    used = split.prefill_devices + split.decode_devices
    return DisaggregatedResult(
        prefill=prefill[0], decode=decode[0], prefill_cluster=prefill[1], decode_cluster=decode[1],
        prefill_devices=split.prefill_devices, decode_devices=split.decode_devices,
        output_tokens_per_s_per_device=split.output_tokens_per_s / used, bottleneck=split.bottleneck,
    )


def _pool(candidate: Candidate) -> PoolConfig:
    serving = candidate.serving or ServingConfig()
    return PoolConfig(config=candidate.config, serving=serving.model_copy(update={"phase": "both"}))
