"""The serving simulator (``_simulator``) run on one layout of a plan: its iteration cost and
scheduling policy from the cost model's pricing of the layout (``_inference_load``), its load
the closed form's chosen concurrency or the workload's request rate, per replica; and the
concurrency lowered until the simulated p90 TTFT and TPOT meet the SLOs (``slo_concurrency``),
the load a plan should be run at."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from cost_model._inference_load import estimate_inference_table, serving_inputs
from cost_model._serving_columns import ServingConfig
from cost_model._simulator import SimulationResult, simulate
from cost_model._simulator_load import bounded_duration_s
from cost_model._table import configs_to_table

__all__ = ["LayoutSimulation", "dealt_clients", "simulate_layout", "slo_concurrency"]


@dataclass(frozen=True)
class LayoutSimulation:
    """The simulator's figures for one layout, with the load it ran and the closed form's."""

    result: SimulationResult
    #: clients per replica (per attention-DP rank of a coupled instance: their mean, where the
    #: instance's clients are not a multiple of its ranks)
    concurrency_per_replica: float | None
    request_rate_per_s_per_replica: float | None
    replicas: float
    closed_form: dict[str, float]

    def meets(self, workload) -> bool:
        """p90 TTFT and p90 TPOT within the workload's SLOs (an unset SLO holds)."""
        figures = self.result.summary()
        ttft_ok = workload.ttft_slo_s is None or figures["ttft_p90_s"] <= workload.ttft_slo_s
        return ttft_ok and (
            workload.tpot_slo_s is None or figures["tpot_p90_s"] <= workload.tpot_slo_s
        )


def simulate_layout(
    *,
    model,
    cluster,
    workload,
    config,
    serving=None,
    options=None,
    concurrency_per_replica: int | None = None,
    duration_s: float | None = None,
    seed: int = 0,
) -> LayoutSimulation:
    """Simulate one replica of a colocated ``config`` (phase ``both``).

    The load is ``concurrency_per_replica`` if given, else the workload's ``concurrency`` or
    ``request_rate_per_s`` over the layout's replicas, else the concurrency the closed form
    chose (its SLO-constrained choice, or the row's batch x pp). ``duration_s`` defaults to
    twenty mean end-to-end latencies of the closed form (60 s to 1 h) for a closed loop, 10
    minutes for an open one, shortened to ``MAX_SIMULATED_REQUESTS`` per replica
    (``_default_duration_s``).
    """
    serving = (serving or ServingConfig()).model_copy(update={"phase": "both"})
    table = configs_to_table([config], **serving.columns(workload=workload))
    columns = estimate_inference_table(
        model=model, cluster=cluster, workload=workload, table=table, options=options
    )
    cost, policy, replicas = serving_inputs(
        model=model, cluster=cluster, workload=workload, table=table, options=options
    )
    figures = {name: float(np.asarray(columns[name])[0]) for name in _CLOSED_FORM_FIGURES}
    one, count = policy.row(0), float(replicas[0])
    load = _replica_load(
        workload=workload,
        policy=one,
        replicas=count,
        concurrency_per_replica=concurrency_per_replica,
        closed_form_concurrency=figures["concurrency"],
    )
    if duration_s is None:
        duration_s = _default_duration_s(load, e2e_s=figures["e2e_s"])
    run = partial(
        simulate,
        cost=cost.row(0),
        policy=one,
        request_rate_per_s=load.rate,
        duration_s=duration_s,
        prompt_tokens_cv=workload.prompt_tokens_cv,
        output_tokens_cv=workload.output_tokens_cv,
        seed=seed,
    )
    split = (
        _uneven_replicas(load.total, count)
        if load.total is not None and isinstance(load.clients, int)
        else None
    )
    if split is None:
        return LayoutSimulation(
            run(concurrency=load.clients), load.per_replica, load.rate, count, figures
        )
    result, per_replica = _simulated_as_dealt(run, split)
    return LayoutSimulation(result, per_replica, load.rate, count, figures)


def _default_duration_s(load: _ReplicaLoad, *, e2e_s: float) -> float:
    """10 minutes of an open loop; twenty of the closed form's mean end-to-end latencies
    (60 s to 1 h) of a closed loop; either shortened to ``MAX_SIMULATED_REQUESTS`` arrivals
    (a closed loop's clients each send one request per end-to-end latency), a closed loop to no
    less than two latencies."""
    if load.rate is not None:
        return bounded_duration_s(600.0, requests_per_s=load.rate)
    latency = float(np.nan_to_num(e2e_s, nan=3.0))
    clients = load.clients if isinstance(load.clients, int) else sum(load.clients or (1,))
    duration = float(np.clip(20.0 * latency, 60.0, 3600.0))
    # at least two latencies: every client's first request ends inside the run
    bounded = bounded_duration_s(duration, requests_per_s=clients / max(latency, 1e-9))
    return max(bounded, min(duration, 2.0 * latency))


#: The closed form's figures a layout simulation reports beside its own.
_CLOSED_FORM_FIGURES = ("ttft_s", "tpot_s", "ttft_p90_s", "tpot_p90_s", "e2e_s", "concurrency")


@dataclass(frozen=True)
class _ReplicaLoad:
    """The load one replica of a layout simulation carries: an open loop's ``rate`` per
    replica, or a closed loop's ``clients`` (dealt over coupled ranks where a tuple), their mean
    per replica and the ``total`` over the layout's replicas where it was dealt."""

    rate: float | None
    clients: int | tuple[int, ...] | None
    per_replica: float | None
    total: float | None


def _replica_load(
    *,
    workload,
    policy,
    replicas: float,
    concurrency_per_replica: int | None,
    closed_form_concurrency: float,
) -> _ReplicaLoad:
    """``concurrency_per_replica`` as given; else the workload's request rate over the
    replicas; else its concurrency, or the closed form's, dealt over them (``dealt_clients``)."""
    if concurrency_per_replica is not None:
        return _ReplicaLoad(None, concurrency_per_replica, concurrency_per_replica, None)
    if workload.request_rate_per_s is not None:
        return _ReplicaLoad(workload.request_rate_per_s / replicas, None, None, None)
    total = workload.concurrency if workload.concurrency is not None else closed_form_concurrency
    clients, per_replica = dealt_clients(total, replicas, policy)
    return _ReplicaLoad(None, clients, per_replica, total)


def _simulated_as_dealt(run, split: tuple[tuple[int, int], ...]) -> tuple[SimulationResult, float]:
    """(one replica's figures, mean clients per replica) of replicas holding one client fewer
    and one more (``_uneven_replicas``): each kind simulated by ``run``, weighted by its count;
    replicas holding none add only their share of the throughput."""
    (fewer, fewer_count), (more, more_count) = split
    replicas = fewer_count + more_count
    results = [(run(concurrency=more), more_count)]
    if fewer:
        results.append((run(concurrency=fewer), fewer_count))
    mean = (fewer * fewer_count + more * more_count) / replicas
    return _weighted(results, replicas=replicas), mean


def _uneven_replicas(total: float, replicas: float) -> tuple[tuple[int, int], ...] | None:
    """((clients, replicas holding them), ...) of ``total`` clients dealt over ``replicas``
    that each iterate alone, where they do not divide evenly: ``r`` replicas hold one more than
    the rest (those below one client hold none); None where every replica holds the same."""
    clients, count = int(round(total)), int(round(replicas))
    if count < 2 or clients % count == 0:
        return None
    fewer, more_count = divmod(clients, count)
    return (fewer, count - more_count), (fewer + 1, more_count)


def _weighted(results: list[tuple[SimulationResult, int]], *, replicas: int) -> SimulationResult:
    """One replica's figures of ``replicas`` replicas, ``count`` of them as each ``result``
    (the rest idle): every request of each weighted by its count, the throughputs averaged over
    all ``replicas``."""
    from math import gcd

    unit = 0
    for _, count in results:
        unit = gcd(unit, count)

    def requests(name: str) -> np.ndarray:
        return np.concatenate(
            [np.tile(getattr(result, name), count // unit) for result, count in results]
        )

    return SimulationResult(
        ttft_s=requests("ttft_s"),
        tpot_s=requests("tpot_s"),
        e2e_s=requests("e2e_s"),
        requests_per_s=sum(r.requests_per_s * count for r, count in results) / replicas,
        output_tokens_per_s=sum(r.output_tokens_per_s * count for r, count in results) / replicas,
        iterations=sum(result.iterations for result, _ in results),
        simulated_s=max(result.simulated_s for result, _ in results),
    )


def dealt_clients(total: float, replicas: float, policy) -> tuple[int | tuple[int, ...], float]:
    """(the simulator's clients, their mean per replica) for ``total`` clients over
    ``replicas``: at least one per replica where each iterates alone (a replica holds one or
    none below that); on an instance of ``R`` coupled attention-DP ranks, its share of the
    clients dealt round robin over its ranks (ranks beyond the clients hold none: two clients on
    eight ranks keep six idle, where one client a rank put eight in flight)."""
    ranks = max(int(round(float(np.asarray(policy.coupled_ranks).ravel()[0]))), 1)
    if ranks == 1:
        each = max(round(total / replicas), 1)
        return each, float(each)
    instance = max(round(total * ranks / replicas), 1)
    if instance % ranks == 0:
        return instance // ranks, float(instance // ranks)
    dealt = tuple(instance // ranks + (rank < instance % ranks) for rank in range(ranks))
    return dealt, instance / ranks


def slo_concurrency(
    *, model, cluster, workload, config, serving=None, options=None, step: float = 0.8
) -> LayoutSimulation:
    """The closed form's chosen concurrency, lowered by ``step`` until the simulated p90 TTFT
    and TPOT meet the SLOs (or one request per replica): the load a plan should be run at."""
    run = simulate_layout(
        model=model,
        cluster=cluster,
        workload=workload,
        config=config,
        serving=serving,
        options=options,
    )
    while (
        not run.meets(workload) and run.concurrency_per_replica and run.concurrency_per_replica > 1
    ):
        lower = max(int(run.concurrency_per_replica * step), 1)
        run = simulate_layout(
            model=model,
            cluster=cluster,
            workload=workload,
            config=config,
            serving=serving,
            options=options,
            concurrency_per_replica=lower,
        )
    return run
