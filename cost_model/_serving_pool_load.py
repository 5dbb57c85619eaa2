"""A disaggregated deployment under a stated load: each pool at the load it carries.

A pool's unit is priced saturated (``_serving.pool_unit_rate``: the largest batch its SLO allows);
under a request rate below that, a unit runs smaller batches. A prefill unit batches what arrived
while its previous pass ran, so in steady state a pass carries ``c = rate x T(c)`` prompts (a
pass of one prompt where even that leaves it idle between arrivals); a decode unit holds
``c = rate x output tokens x S(c)`` sequences (Little's law), ``S`` its step at ``c``. Both are
solved on the unit's own curve of pass time against the requests it holds, priced in one table
over a grid of batch sizes (``PassCurve``). Under a load the units fill the cluster: the split
gives the prefill pool ``p`` units and the decode pool as many as the rest holds, and keeps the ``p``
whose mean end-to-end latency is least among those whose p90 TTFT and TPOT meet the SLOs (the
least overall where none does). A closed loop of ``C`` clients drives the rate ``r`` with
``r x end-to-end(r) = C`` (Little's law; past the split's capacity the clients queue for
admission), and the split serving the most requests is kept. DistServe (Zhong et al., OSDI'24,
sec. 4.1) prices the prefill queue of a batching pool the same way; Splitwise (Patel et al.,
ISCA'24) sizes the two pools for a target load.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from cost_model._inference_load import POOL_SLO_QUANTILE, estimate_inference_table
from cost_model._table import configs_to_table

#: Batch sizes of a pass curve: 1, then geometric up to the unit's saturated batch.
CURVE_POINTS = 16


@dataclass(frozen=True)
class PassCurve:
    """A unit's pass (prefill) or step (decode) seconds against the requests it holds at once
    (``concurrency``: prompts in a pass, sequences decoding), ascending; the last point is the
    saturated batch its rate is counted at."""

    concurrency: np.ndarray
    seconds: np.ndarray

    def at(self, held: float) -> float:
        """Seconds at ``held`` requests: linear between the priced points, the first point's
        below them (a pass is never shorter than the smallest one priced)."""
        return float(np.interp(held, self.concurrency, self.seconds))

    def steady(self, arrivals_per_s: float) -> float:
        """Requests held in steady state at ``arrivals_per_s``: the least ``c`` with
        ``c = arrivals_per_s x seconds(c)`` (the curve's first point where even that is more than
        the load keeps busy); the saturated point where the load exceeds it."""
        demand = arrivals_per_s * self.seconds - self.concurrency
        over = np.flatnonzero(demand <= 0.0)
        if over.size == 0:
            return float(self.concurrency[-1])
        i = int(over[0])
        if i == 0:
            return float(max(arrivals_per_s * self.seconds[0], 0.0))
        # the root between the points either side, where demand changes sign
        d0, d1 = demand[i - 1], demand[i]
        c0, c1 = self.concurrency[i - 1], self.concurrency[i]
        return float(c0 + (c1 - c0) * d0 / (d0 - d1))


def unit_workload(workload):
    """``workload`` for pricing one pool's unit: without the deployment's load (its concurrency or
    request rate is the whole deployment's, not one unit's), so the unit is priced saturated."""
    if workload.concurrency is None and workload.request_rate_per_s is None:
        return workload
    return workload.model_copy(update={"concurrency": None, "request_rate_per_s": None})


def pass_curve(model, cluster, workload, pool, phase: str, saturated_batch: int, options=None):
    """The ``PassCurve`` of ``pool``'s unit for ``phase``, priced in one table over batch sizes
    1 .. ``saturated_batch`` (the batch its unit rate was counted at)."""
    workload = unit_workload(workload)
    top = max(int(saturated_batch), 1)
    batches = np.unique(np.rint(np.geomspace(1, top, min(CURVE_POINTS, top))).astype(np.int64))
    serving = pool.serving.model_copy(update={"phase": phase})
    columns_by_row = [
        serving.model_copy(update={"batch_size": int(b)}).columns(workload=workload)
        for b in batches
    ]
    extras = {
        name: np.concatenate([row[name] for row in columns_by_row]) for name in columns_by_row[0]
    }
    columns = estimate_inference_table(
        model=model,
        cluster=cluster,
        workload=workload,
        table=configs_to_table([pool.config] * len(batches), **extras),
        options=options,
    )
    seconds = np.nan_to_num(columns["ttft_s" if phase == "prefill" else "tpot_s"])
    return PassCurve(np.asarray(columns["concurrency"], dtype=np.float64), seconds)


@dataclass(frozen=True)
class PoolLoad:
    """One split under a load: units, the requests/s it serves, the pools' steady passes and the
    latency (``ttft_s``, ``ttft_p90_s`` and ``e2e_s`` hold the KV transfer and, in a closed loop
    past the split's capacity, ``admission_wait_s``, the clients' wait to be admitted)."""

    prefill_units: int
    decode_units: int
    requests_per_s: float
    prefill_pass_s: float
    prefill_utilization: float
    decode_step_s: float
    ttft_s: float
    ttft_p90_s: float
    e2e_s: float
    admission_wait_s: float = 0.0


@dataclass(frozen=True)
class PoolPair:
    """A prefill and a decode unit (size, saturated requests/s, ``PassCurve``) and what a
    request meets besides the passes: the engine's overhead, the KV transfer, the SLOs."""

    prefill: tuple[int, float, PassCurve]
    decode: tuple[int, float, PassCurve]
    output_tokens: int
    overhead_s: float
    transfer_s: float
    ttft_slo_s: float | None
    tpot_slo_s: float | None

    def splits(self, num_devices: int):
        """(prefill units, decode units) filling the devices: ``p`` prefill units, as many decode units
        as the rest holds, at least one of each."""
        p_size, d_size = self.prefill[0], self.decode[0]
        for p_units in range(1, num_devices // p_size + 1):
            d_units = (num_devices - p_units * p_size) // d_size
            if d_units >= 1:
                yield p_units, d_units

    def capacity(self, p_units: int, d_units: int) -> float:
        """Requests/s the split serves with both pools saturated."""
        return min(p_units * self.prefill[1], d_units * self.decode[1])

    def at(self, p_units: int, d_units: int, rate: float) -> PoolLoad:
        """The split carrying ``rate`` requests/s (at most its capacity)."""
        p_curve, d_curve = self.prefill[2], self.decode[2]
        per_prefill, per_decode = rate / p_units, rate / d_units
        prompts = p_curve.steady(per_prefill)
        pass_s = p_curve.at(max(prompts, 1.0))
        utilization = min(per_prefill * pass_s / max(prompts, 1.0), 1.0)
        step_s = d_curve.at(max(d_curve.steady(per_decode * self.output_tokens), 1.0))
        # first token: overhead, the wait for the running pass and for the decode batch (each
        # uniform: mean half, p90 0.9 of its span), the pass, the cache's move
        waits = utilization * pass_s + step_s
        fixed = self.overhead_s + pass_s + self.transfer_s
        ttft = fixed + waits / 2.0
        return PoolLoad(
            prefill_units=p_units,
            decode_units=d_units,
            requests_per_s=rate,
            prefill_pass_s=pass_s,
            prefill_utilization=utilization,
            decode_step_s=step_s,
            ttft_s=ttft,
            ttft_p90_s=fixed + POOL_SLO_QUANTILE * waits,
            e2e_s=ttft + max(self.output_tokens - 1, 0) * step_s,
        )

    def meets(self, load: PoolLoad) -> bool:
        return (self.ttft_slo_s is None or load.ttft_p90_s <= self.ttft_slo_s) and (
            self.tpot_slo_s is None or load.decode_step_s <= self.tpot_slo_s
        )

    def closed_loop(self, p_units: int, d_units: int, concurrency: float) -> PoolLoad:
        """The split driven by ``concurrency`` clients, each sending its next request when the
        last one ends: the rate ``r`` with ``r x e2e(r) = concurrency`` (Little's law), found by
        bisection; past the split's capacity the clients queue for admission, their wait the
        rest of ``concurrency / capacity``."""
        top = self.capacity(p_units, d_units)
        saturated = self.at(p_units, d_units, top)
        if top * saturated.e2e_s <= concurrency:
            wait = concurrency / top - saturated.e2e_s
            return replace(
                saturated,
                ttft_s=saturated.ttft_s + wait,
                ttft_p90_s=saturated.ttft_p90_s + wait,
                e2e_s=saturated.e2e_s + wait,
                admission_wait_s=wait,
            )
        low, high = 0.0, top
        for _ in range(BISECTION_STEPS):
            middle = (low + high) / 2.0
            if middle * self.at(p_units, d_units, middle).e2e_s < concurrency:
                low = middle
            else:
                high = middle
        return self.at(p_units, d_units, max(low, 1e-12))


#: Halvings of the closed loop's rate bracket: 2^-40 of the capacity.
BISECTION_STEPS = 40


def rate_split(pair: PoolPair, *, rate: float, num_devices: int) -> PoolLoad | None:
    """The split filling the devices that carries ``rate`` at the least mean end-to-end latency,
    preferring splits that meet the SLOs at p90; None where no split carries the rate."""
    best: tuple[tuple[bool, float], PoolLoad] | None = None
    for p_units, d_units in pair.splits(num_devices):
        if pair.capacity(p_units, d_units) < rate:
            continue
        load = pair.at(p_units, d_units, rate)
        key = (not pair.meets(load), load.e2e_s)
        if best is None or key < best[0]:
            best = (key, load)
    return None if best is None else best[1]


def concurrency_split(pair: PoolPair, *, concurrency: float, num_devices: int) -> PoolLoad | None:
    """The split filling the devices that serves ``concurrency`` closed-loop clients the most
    requests/s, preferring splits that meet the SLOs at p90; None where no split exists."""
    best: tuple[tuple[bool, float], PoolLoad] | None = None
    for p_units, d_units in pair.splits(num_devices):
        load = pair.closed_loop(p_units, d_units, concurrency)
        key = (not pair.meets(load), -load.requests_per_s)
        if best is None or key < best[0]:
            best = (key, load)
    return None if best is None else best[1]
