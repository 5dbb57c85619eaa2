"""The deployment part of a serving plan: prefill/decode pools beside the colocated layout, and
which of the two wins (``find_plan`` calls ``with_disaggregation``)."""

from __future__ import annotations

import math

from autoparallel.plan import Deployment, PlanRecord, Pool, ShardingPlan, build_plan
from autoparallel.plan._build import serving_settings
from cost_model import Inference, ModelSpec, unit_workload
from topology import Cluster

__all__ = ["colocated_e2e_s", "misses_only_slos", "with_disaggregation"]


def misses_only_slos(candidate) -> bool:
    """Whether ``candidate`` fits (memory, the cost model's rules) and misses only SLOs."""
    violated = {name for name, excess in candidate.violations.items() if excess > 0}
    return bool(violated) and violated <= {"ttft_slo", "tpot_slo"}


def with_disaggregation(
    plan: ShardingPlan,
    *,
    model: ModelSpec,
    cluster: Cluster,
    workload: Inference,
    estimator=None,
    bounds=None,  # search.SearchBounds (e.g. an engine's), None: the defaults
    colocated_violations: dict[str, float] | None = None,
) -> ShardingPlan:
    """``plan`` with the best prefill/decode pools and which deployment wins (output tokens/s
    per device; the lower latency under an offered rate). ``colocated_violations``: the SLOs
    the plan's colocated layout misses (normalized excess), when none meets them: any split
    that meets them wins."""
    from search import find_disaggregated

    found = find_disaggregated(model, cluster, workload, estimator=estimator, bounds=bounds)
    if found is None:
        deployment = Deployment(
            kind="colocated",
            note="no unit of a pool fits, or no split's p90 TTFT (prefill queue, KV transfer "
            "and decode admission included) meets the SLO",
        )
        return _rebuilt(plan, model=model, cluster=cluster, deployment=deployment)
    pools = _pools(found, model=model, workload=workload)
    colocated = plan.predicted.tokens_per_s_per_device or 0.0
    simulated = _simulated_pools(found, pools, model=model, workload=workload)
    missed = {k: v for k, v in (colocated_violations or {}).items() if v > 0}
    wins = bool(missed) or _disaggregated_wins(
        found, simulated, plan=plan, workload=workload, colocated=colocated
    )
    deployment = Deployment(
        kind="disaggregated" if wins else "colocated",
        pools=tuple(pools),
        colocated_output_tokens_per_s_per_device=colocated,
        disaggregated_output_tokens_per_s_per_device=found.output_tokens_per_s_per_device,
        bottleneck=found.bottleneck,
        ttft_s=found.ttft_s,
        ttft_p90_s=found.ttft_p90_s,
        tpot_s=found.tpot_s,
        **simulated,
        note=(
            "no colocated layout meets the SLOs (the least-violating one misses "
            + ", ".join(
                f"{name.replace('_slo', '').upper()} by {_share(excess)}"
                for name, excess in missed.items()
            )
            + "); "
            if missed
            else ""
        )
        + _pairs_note(found),
    )
    return _rebuilt(plan, model=model, cluster=cluster, deployment=deployment)


def _pools(found, *, model: ModelSpec, workload: Inference) -> list[Pool]:
    """The prefill and decode ``Pool`` of a split (``search.DisaggregatedResult``), each unit
    priced as its rate was counted: saturated (the stated load is the deployment's, whose
    latency under it the deployment records)."""
    from autoparallel._planner import predict_all

    saturated = unit_workload(workload)
    pools = []
    for role, candidate, unit, devices in (
        ("prefill", found.prefill, found.prefill_cluster, found.prefill_devices),
        ("decode", found.decode, found.decode_cluster, found.decode_devices),
    ):
        (cost,) = predict_all(model=model, cluster=unit, workload=saturated, candidates=[candidate])
        size = candidate.config.world_size
        pools.append(
            Pool(
                role=role,
                num_units=devices // size,
                devices_per_unit=size,
                config=candidate.config,
                serving=serving_settings(layout=candidate.layout, job=saturated, predicted=cost),
                predicted=cost,
            )
        )
    return pools


def _disaggregated_wins(
    found, simulated: dict[str, float], *, plan: ShardingPlan, workload: Inference, colocated
) -> bool:
    """Whether the split beats the plan's colocated layout: on output tokens/s per device (where
    SLOs bind, at the rate its simulated pools meet them, as the colocated layout's load was
    checked by ``search.simulate_top_k``), or, under an offered rate that both serve, on mean
    end-to-end latency."""
    if workload.request_rate_per_s is None:
        slos = workload.ttft_slo_s is not None or workload.tpot_slo_s is not None
        rate = simulated.get("simulated_output_tokens_per_s_per_device") if slos else None
        return (found.output_tokens_per_s_per_device if rate is None else rate) > colocated
    colocated_e2e = colocated_e2e_s(plan)
    return colocated_e2e is None or (found.e2e_s or math.inf) < colocated_e2e


def _simulated_pools(
    found, pools: list[Pool], *, model: ModelSpec, workload: Inference
) -> dict[str, float]:
    """The split's ``pools`` as deployed (each unit's batch cap the one its price resolved) in
    the serving simulator (``cost_model.simulate_pools``), as ``Deployment`` fields: at the
    offered rate, else at the split's own rate or, where the simulated p90 TTFT or TPOT misses
    an SLO there, the largest share of it that meets them (``cost_model.slo_rate``); {} where
    the split has no rate to run."""
    from cost_model import PoolUnit, simulate_pools, slo_rate

    split = found.split
    if split is None or not split.requests_per_s > 0:
        return {}
    clusters = {"prefill": found.prefill_cluster, "decode": found.decode_cluster}
    units = {
        pool.role: PoolUnit(
            cluster=clusters[pool.role],
            config=pool.config,
            serving=pool.serving.serving_config(phase=pool.role),
            units=pool.num_units,
        )
        for pool in pools
    }
    common = {
        "model": model,
        "workload": workload,
        "prefill": units["prefill"],
        "decode": units["decode"],
        "kv_transfer_s": split.kv_transfer_s,
    }
    if workload.request_rate_per_s is not None:
        run = simulate_pools(requests_per_s=workload.request_rate_per_s, **common)
    else:
        _, run = slo_rate(requests_per_s=split.requests_per_s, **common)
    figures = run.summary()
    devices = max(split.prefill_devices + split.decode_devices, 1)
    return {
        "simulated_requests_per_s": run.requests_per_s,
        "simulated_ttft_p90_s": figures["ttft_p90_s"],
        "simulated_tpot_p90_s": figures["tpot_p90_s"],
        "simulated_output_tokens_per_s_per_device": run.requests_per_s
        * workload.output_tokens
        / devices,
    }


def _share(excess: float) -> str:
    """A relative excess in words: whole percent, or under one percent."""
    return f"{excess:.0%}" if excess >= 0.01 else "under 1%"


def colocated_e2e_s(plan: ShardingPlan) -> float | None:
    """Mean end-to-end seconds of the plan's colocated layout under its load: TTFT and the
    remaining output tokens at its TPOT; None where the plan has no serving figures."""
    cost = plan.predicted
    if cost is not None and cost.e2e_s is not None:
        return cost.e2e_s  # the load's own figure
    if cost is None or cost.ttft_s is None or cost.tpot_s is None:
        return None
    output_tokens = getattr(plan.job, "output_tokens", 1)
    return cost.ttft_s + max(output_tokens - 1, 0) * cost.tpot_s


def _pairs_note(found) -> str:  # search.DisaggregatedResult
    """The unit-size pairs the split was chosen from, best first (why this split)."""
    shown = "{:,.0f}" if found.ranked_by == "output tokens/s/device" else "{:.2f}"
    pairs = ", ".join(f"{p}/{d}: {shown.format(r)}" for p, d, r in found.considered[:6])
    dropped = (
        f"; {found.over_ttft_slo} more left out, their p90 TTFT (prefill queue, KV transfer and "
        "decode admission included) over the SLO"
        if found.over_ttft_slo
        else ""
    )
    return (
        f"{len(found.considered)} prefill/decode unit-size pairs priced (devices per unit: "
        f"{found.ranked_by}) {pairs}{dropped}"
    )


def _rebuilt(
    plan: ShardingPlan, *, model: ModelSpec, cluster: Cluster, deployment: Deployment
) -> ShardingPlan:
    """``plan`` built again with ``deployment`` (same layout, price and record otherwise)."""
    record = PlanRecord(
        alternatives=plan.alternatives,
        search=plan.provenance.search,
        deployment=deployment,
        library_version=plan.provenance.library_version,
        created_at=plan.provenance.created_at,
    )
    return build_plan(
        model=model,
        cluster=cluster,
        job=plan.job,
        layout=plan.layout,
        predicted=plan.predicted,
        record=record,
    )
