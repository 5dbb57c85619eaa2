"""A closed loop whose clients leave its replicas, or the data-parallel ranks that iterate
together, unequally loaded: priced from the loads each replica actually holds.

``closed_loop`` (``_serving_load``) prices one replica at ``c`` requests in flight, the clients
spread evenly. ``dealt_closed_loop`` turns a mean load into the loads the replicas hold:

Fewer requests than replicas (a share ``c < 1`` per replica) leave each replica holding one
request or none: a busy replica runs one request's whole prompt and decodes, as at one
request in flight, for ``c`` of the completions; of data-parallel ranks that iterate
together, only the ``c R`` holding a request send prompts. Equal requests on ranks that
iterate together, dealt round robin (a router's default: SGLang's ``round_robin``), leave
``ceil(c)`` on the fullest ranks, whose prompts and decodes set every iteration of the
lock-step waves: the times are those at ``ceil(c)``, the completions those of ``c``. Equal
requests on replicas that iterate alone, at a load ``c`` between ``k`` and ``k + 1``: a share
``c - k`` of the replicas holds ``k + 1`` and the rest ``k``, and the mean times are those of
the two loads weighted by the requests each completes (the waves do not interpolate: a
replica's prompts fit its iterations whole or not).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from cost_model._serving_replica import LoadPolicy, as_columns

if TYPE_CHECKING:
    from cost_model._serving_load import LoadTimes

__all__ = ["dealt_closed_loop"]


def dealt_closed_loop(
    price: Callable[[LoadPolicy, np.ndarray], LoadTimes], *, policy: LoadPolicy, concurrency
) -> LoadTimes:
    """``price(policy, concurrency)`` (a closed loop at one request or more per replica) at the
    loads ``concurrency`` clients per replica leave (see the module docstring)."""
    concurrency = np.asarray(concurrency, dtype=np.float64)
    col = as_columns(concurrency)
    ranks = np.asarray(policy.coupled_ranks, dtype=np.float64)
    busy = np.maximum(concurrency, 1.0)  # requests on a replica (rank) that holds any
    if policy.output_tokens_cv == 0:
        busy = np.where(col(ranks) > 1.0, np.ceil(busy - 1e-9), busy)
    fraction = busy - np.floor(busy)
    dealt = (policy.output_tokens_cv == 0) & (col(ranks) <= 1.0) & (fraction > 1e-9)
    if np.all(busy == concurrency) and not np.any(dealt):
        return price(policy, concurrency)
    share = concurrency / busy
    held = np.minimum(concurrency, 1.0)
    fewest = held if held.ndim < 2 else held.min(axis=1)  # rows: the fewest busy ranks
    busy_policy = replace(policy, coupled_ranks=np.maximum(ranks * fewest, 1.0))
    times = price(busy_policy, busy)
    times = replace(
        times, requests_per_s=times.requests_per_s * share, running=times.running * share
    )
    if not np.any(dealt):
        return times
    fewer, more = (
        price(busy_policy, np.where(dealt, load, busy)) for load in (np.floor(busy), np.ceil(busy))
    )
    weight_fewer = (1.0 - fraction) * fewer.requests_per_s
    weight_more = fraction * more.requests_per_s

    def mean(name: str) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):  # rows not dealt keep ``times``
            mixed = (weight_fewer * getattr(fewer, name) + weight_more * getattr(more, name)) / (
                weight_fewer + weight_more
            )
        return np.where(dealt, mixed, getattr(times, name))

    return replace(
        times,
        ttft_s=mean("ttft_s"),
        tpot_s=mean("tpot_s"),
        e2e_s=mean("e2e_s"),
        requests_per_s=np.where(dealt, weight_fewer + weight_more, times.requests_per_s),
    )
