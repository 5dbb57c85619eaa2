"""A disaggregated deployment in the serving simulator: the prefill pool, the KV transfer and
the decode pool, each pool's unit run iteration by iteration (``_simulator.simulate``).

The closed form (``_serving.DisaggregatedSplit``) prices each pool at its mean load and a
request's waits as uniform; here each pool's unit serves its share of an offered request rate
with the dynamics the closed form averages away: bursts of Poisson arrivals queueing for a
prefill pass, prompts batched up to the unit's batch, decode batches that swell and shrink as
requests join and leave. A prefill unit serves each request's prompt and lets it go at its first
token (DistServe, Zhong et al. OSDI'24; SGLang's and Dynamo's prefill servers); the prompt's
cache then moves to a decode unit (``kv_transfer_s``, the closed form's figure), where the
request joins the running batch at the next iteration with room (its batch cap, or what the
unit's KV pool holds) and decodes its other output tokens. A request's first token reaches the
client after the transfer and the decode unit's first iteration with it (the closed form's
"decode admission"); its TPOT is the decode unit's. Requests arrive at each unit as a Poisson
stream of the unit's share of the rate (a router spreading requests over units; Vidur, Agrawal
et al. MLSys'24, drives its replicas the same way). The two pools are run apart and a
request's first-token time is a prefill sample plus the transfer plus a decode admission
sample: the pools couple only through the arrival stream, which a rate-matched split passes on
unchanged in the mean.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from cost_model._parallel import ParallelConfig
from cost_model._serving_columns import ServingConfig
from cost_model._simulator import SimulationResult, simulate
from cost_model._simulator_load import bounded_duration_s

if TYPE_CHECKING:
    from topology import Cluster


@dataclass(frozen=True)
class PoolUnit:
    """One pool: ``units`` units, each a ``config`` (a ``ParallelConfig``) with ``serving``
    settings (a ``ServingConfig``: batch, KV dtype, all-to-all backend) on ``cluster`` (the
    devices of one unit)."""

    cluster: Cluster
    config: ParallelConfig
    serving: ServingConfig
    units: int


@dataclass(frozen=True)
class PoolsSimulation:
    """Per-request figures of the deployment (paired prefill and decode samples), seconds."""

    ttft_s: np.ndarray
    tpot_s: np.ndarray
    e2e_s: np.ndarray
    requests_per_s: float
    prefill: SimulationResult
    decode: SimulationResult

    def summary(self) -> dict[str, float]:
        """Mean, p50, p90 and p99 of TTFT, TPOT and end-to-end latency, and the offered rate."""
        figures: dict[str, float] = {"requests_per_s": self.requests_per_s}
        for name, values in (("ttft", self.ttft_s), ("tpot", self.tpot_s), ("e2e", self.e2e_s)):
            figures[f"{name}_mean_s"] = float(np.mean(values))
            for p in (50, 90, 99):
                figures[f"{name}_p{p}_s"] = float(np.percentile(values, p))
        return figures

    def meets(self, workload) -> bool:
        """p90 TTFT and p90 TPOT within the workload's SLOs (an unset SLO holds)."""
        figures = self.summary()
        return (workload.ttft_slo_s is None or figures["ttft_p90_s"] <= workload.ttft_slo_s) and (
            workload.tpot_slo_s is None or figures["tpot_p90_s"] <= workload.tpot_slo_s
        )


#: The pools' simulated time unless the caller gives one (before ``bounded_duration_s``).
DEFAULT_DURATION_S = 600.0


def simulate_pools(
    *,
    model,
    workload,
    prefill: PoolUnit,
    decode: PoolUnit,
    requests_per_s: float,
    kv_transfer_s: float,
    options=None,
    duration_s: float | None = None,
    seed: int = 0,
) -> PoolsSimulation:
    """Serve ``requests_per_s`` (the whole deployment's) for ``duration_s`` on the two pools;
    by default 10 minutes, shortened to ``MAX_SIMULATED_REQUESTS`` per unit replica
    (``bounded_duration_s``)."""
    if not requests_per_s > 0:
        raise ValueError(f"requests_per_s ({requests_per_s}) must be > 0")
    if prefill.units < 1 or decode.units < 1:
        raise ValueError(
            f"units (prefill {prefill.units}, decode {decode.units}) must be >= 1 in each pool"
        )
    first, _ = _pool_run(
        model, workload, prefill, "prefill", requests_per_s, options, duration_s, seed
    )
    second, overhead = _pool_run(
        model, workload, decode, "decode", requests_per_s, options, duration_s, seed + 1
    )
    count = min(first.ttft_s.size, second.ttft_s.size)
    if count == 0:
        raise ValueError(
            f"no request finished in {duration_s or DEFAULT_DURATION_S:g} s at "
            f"{requests_per_s:g} requests/s: "
            "a longer run or a higher rate"
        )
    # the decode unit's own first token: its admission wait and first iteration (its
    # per-request overhead is the prefill side's, counted there once)
    joined = second.ttft_s[:count] - overhead
    ttft = first.ttft_s[:count] + kv_transfer_s + joined
    tpot = second.tpot_s[:count]
    e2e = ttft + (second.e2e_s[:count] - second.ttft_s[:count])
    return PoolsSimulation(ttft, tpot, e2e, float(requests_per_s), first, second)


def _inputs(model, workload, pool: PoolUnit, phase: str, options):
    from cost_model._inference_load import serving_inputs
    from cost_model._serving_pool_load import unit_workload
    from cost_model._table import configs_to_table

    saturated = unit_workload(workload)
    serving = pool.serving.model_copy(update={"phase": phase})
    table = configs_to_table([pool.config], **serving.columns(workload=saturated))
    return serving_inputs(
        model=model, cluster=pool.cluster, workload=saturated, table=table, options=options
    )


def _pool_run(
    model, workload, pool: PoolUnit, phase: str, requests_per_s, options, duration_s, seed
) -> tuple[SimulationResult, float]:
    """One unit of ``pool`` serving its share of the rate, as the ``phase`` pool runs it, and the
    engine's per-request overhead the simulator adds to each request's TTFT."""
    cost, policy, replicas = _inputs(model, workload, pool, phase, options)
    one, row = policy.row(0), cost.row(0)
    if phase == "prefill":  # a request leaves at its first token
        one = replace(one, output_tokens=np.ones(1))
        cvs = {"prompt_tokens_cv": workload.prompt_tokens_cv, "output_tokens_cv": 0.0}
    else:
        # The prompt's cache arrives whole: the request joins the running batch with no extend
        # pass (SGLang's decode server adds it prebuilt), its one "prompt" token priced as one
        # more decoding row, in the decode graphs.
        one = replace(one, prompt_tokens=np.ones(1), mixed_prefill_decode=True)
        row = replace(
            row,
            prefill_linear_s=row.linear_s,
            prefill_token_s=row.decode_attention_s,
            prefill_graphs=True,
            prefill_graph_max_tokens=row.graph_max_tokens,
        )
        cvs = {"prompt_tokens_cv": 0.0, "output_tokens_cv": workload.output_tokens_cv}
    rate = requests_per_s / pool.units / float(np.asarray(replicas).ravel()[0])
    result = simulate(
        cost=row,
        policy=one,
        request_rate_per_s=rate,
        duration_s=(
            bounded_duration_s(DEFAULT_DURATION_S, requests_per_s=rate)
            if duration_s is None
            else duration_s
        ),
        seed=seed,
        **cvs,
    )
    return result, float(one.request_overhead_s)


#: Halvings of the rate ``slo_rate`` tries below the design rate (to within 1/32 of it).
RATE_HALVINGS = 5


def slo_rate(
    *,
    model,
    workload,
    prefill: PoolUnit,
    decode: PoolUnit,
    requests_per_s: float,
    kv_transfer_s: float,
    options=None,
    seed: int = 0,
) -> tuple[float, PoolsSimulation]:
    """(share of ``requests_per_s``, its simulation): the design rate where the simulated p90
    TTFT and TPOT meet the workload's SLOs, else the largest share of it that does, bisected
    (``RATE_HALVINGS``); the least share tried where none does."""
    run = partial(
        simulate_pools,
        model=model,
        workload=workload,
        prefill=prefill,
        decode=decode,
        kv_transfer_s=kv_transfer_s,
        options=options,
        seed=seed,
    )
    full = run(requests_per_s=requests_per_s)
    if full.meets(workload):
        return 1.0, full
    low, high, best = 0.0, 1.0, None
    for _ in range(RATE_HALVINGS):
        share = (low + high) / 2.0
        trial = run(requests_per_s=requests_per_s * share)
        if trial.meets(workload):
            low, best = share, trial
        else:
            high = share
    if best is None:
        return high, run(requests_per_s=requests_per_s * high)
    return low, best
