"""The load one simulation runs (``_simulator.simulate``): its arguments checked, each coupled
rank's clients, and the first arrivals (a closed loop's clients at once, or Poisson times)."""

from __future__ import annotations

import numpy as np

from cost_model._bench_serving import RequestLengths


def per_rank_clients(concurrency, ranks: int) -> tuple[int, ...] | None:
    """The closed loop's clients on each of ``ranks`` coupled ranks: ``concurrency`` on each, or
    a tuple of one count per rank (each >= 0)."""
    if concurrency is None:
        return None
    if isinstance(concurrency, tuple):
        if len(concurrency) != ranks or any(count < 0 for count in concurrency):
            raise ValueError(
                f"concurrency ({concurrency}) must give each of the {ranks} coupled ranks "
                "a client count >= 0"
            )
        return tuple(int(count) for count in concurrency)
    return (concurrency,) * ranks


#: Requests one replica's run may take when its duration is chosen for it (``simulate_layout``,
#: ``simulate_pools``): enough for stable p99 figures (the speed benchmark's 10 minutes at 50
#: requests/s are 30,000), while a small model's design rate or concurrency, tens of thousands
#: of requests per second, would otherwise fill the host's memory with request state.
MAX_SIMULATED_REQUESTS = 100_000


def bounded_duration_s(duration_s: float, *, requests_per_s: float) -> float:
    """``duration_s``, shortened to what ``MAX_SIMULATED_REQUESTS`` arrivals at
    ``requests_per_s`` take (a closed loop: its clients over their end-to-end latency)."""
    if not requests_per_s > 0:
        return duration_s
    return min(duration_s, MAX_SIMULATED_REQUESTS / requests_per_s)


def check_load(
    concurrency: int | None, request_rate_per_s: float | None, num_requests: int | None
) -> None:
    if (concurrency is None) == (request_rate_per_s is None):
        raise ValueError("give concurrency or request_rate_per_s (one of them)")
    if concurrency is not None and concurrency <= 0:
        raise ValueError(f"concurrency ({concurrency}) must be > 0")
    if request_rate_per_s is not None and request_rate_per_s <= 0:
        raise ValueError(f"request_rate_per_s ({request_rate_per_s}) must be > 0")
    if num_requests is not None and num_requests <= 0:
        raise ValueError(f"num_requests ({num_requests}) must be > 0")


def first_arrivals(
    rng: np.random.Generator,
    *,
    concurrency: int | None,
    request_rate_per_s: float | None,
    duration_s: float,
) -> list[float]:
    """Arrival times of one replica's first requests: Poisson over ``duration_s`` at
    ``request_rate_per_s``, or the ``concurrency`` clients of a closed loop at once."""
    if request_rate_per_s is None:
        return [0.0] * int(concurrency or 0)
    expected = request_rate_per_s * duration_s
    count = int(expected + 6 * np.sqrt(expected)) + 16
    times = np.cumsum(rng.exponential(1.0 / request_rate_per_s, count))
    return [float(t) for t in times[times < duration_s]]


def check_replay(lengths: RequestLengths, *, num_requests: int | None, ranks: int) -> None:
    if num_requests is None or num_requests > lengths.prompt_tokens.size:
        raise ValueError(
            f"num_requests ({num_requests}) must be given and <= the "
            f"{lengths.prompt_tokens.size} requests of lengths"
        )
    if ranks != 1:
        raise ValueError(f"lengths replay one rank's requests; the policy couples {ranks}")
