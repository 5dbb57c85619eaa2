"""What ``plan`` and ``explain`` print of a serving plan's deployment: colocated against
prefill/decode pools, why one wins, and each pool as it was priced for its own phase."""

from __future__ import annotations

from autoparallel._planner import colocated_e2e_s
from cost_model import describe_layout, human_bytes, human_seconds

__all__ = ["deployment_line", "pool_lines"]


def deployment_line(plan) -> str:
    """Colocated vs disaggregated serving, when the plan priced both."""
    deployment = plan.deployment
    if not deployment.pools:
        return (
            f"deployment: [bold]{deployment.kind}[/] — {deployment.note}" if deployment.note else ""
        )
    pools = " + ".join(
        f"{p.role} {p.num_units} x {p.devices_per_unit} devices (units {describe_layout(p.config)}, "
        f"batch {p.serving.batch_size}, a2a {p.serving.all_to_all_backend}"
        f"{', two-batch overlap' if p.serving.two_batch_overlap else ''})"
        for p in deployment.pools
    )
    colocated = deployment.colocated_output_tokens_per_s_per_device or 0.0
    disaggregated = deployment.disaggregated_output_tokens_per_s_per_device or 0.0
    job = plan.job
    simulated = deployment.simulated_output_tokens_per_s_per_device
    if (
        simulated is not None
        and getattr(job, "request_rate_per_s", None) is None
        and (job.ttft_slo_s is not None or job.tpot_slo_s is not None)
    ):  # the planner compared the rate the simulated pools meet the SLOs at
        pools += f"; {simulated:,.1f} where the simulated pools meet the SLOs"
    else:
        simulated = None
    compared = disaggregated if simulated is None else simulated
    loser = "disaggregated" if deployment.kind == "colocated" else "colocated"
    ratio = max(colocated, compared) / max(min(colocated, compared), 1e-12)
    latency = (
        f"; TTFT {human_seconds(deployment.ttft_s)} mean, "
        f"{human_seconds(deployment.ttft_p90_s)} p90, TPOT {human_seconds(deployment.tpot_s)}"
        if deployment.ttft_s is not None
        and deployment.ttft_p90_s is not None
        and deployment.tpot_s is not None
        else ""
    )
    why = f"{deployment.kind} serves {ratio:.2f}x the output tokens per device of the best {loser} deployment"
    rate = getattr(plan.job, "request_rate_per_s", None)
    disaggregated_e2e = (
        None
        if deployment.ttft_s is None or deployment.tpot_s is None
        else deployment.ttft_s + max(plan.job.output_tokens - 1, 0) * deployment.tpot_s
    )
    colocated_e2e = colocated_e2e_s(plan)
    if rate is not None and disaggregated_e2e is not None and colocated_e2e is not None:
        why = (
            f"both serve the offered {rate:g} requests/s; mean end-to-end "
            f"latency disaggregated {human_seconds(disaggregated_e2e)} vs colocated "
            f"{human_seconds(colocated_e2e)}"
        )
    return (
        f"deployment: [bold]{deployment.kind}[/] — colocated {colocated:,.1f} "
        f"vs disaggregated {disaggregated:,.1f} output tokens/s per device "
        f"({pools}; the {deployment.bottleneck} pool binds{latency})\n"
        f"why: {why}" + (f"; {deployment.note}" if deployment.note else "")
    )


def pool_lines(plan) -> list[str]:
    """One line per pool of the plan's disaggregated split, as that pool was priced for its own
    phase: a prefill unit's pass over its batch of prompts, a decode unit's step, the input or
    output tokens/s per device, the memory per device and the two largest time parts."""
    lines = []
    for pool in plan.deployment.pools:
        cost = pool.predicted
        if cost is None:
            continue
        if pool.role == "prefill":
            speed = (
                f"pass {human_seconds(cost.ttft_s or 0.0)} over {pool.serving.batch_size} prompts"
            )
            rate = f"{cost.tokens_per_s_per_device or 0.0:,.0f} input tokens/s per device"
        else:
            speed = (
                f"step {human_seconds(cost.tpot_s or 0.0)} at {pool.serving.batch_size} sequences"
            )
            rate = f"{cost.tokens_per_s_per_device or 0.0:,.0f} output tokens/s per device"
        largest = sorted(cost.time_s.items(), key=lambda item: -item[1])[:2]
        parts = ", ".join(f"{part} {human_seconds(seconds)}" for part, seconds in largest)
        lines.append(
            f"{pool.role} pool: {pool.num_units} x {pool.devices_per_unit} devices "
            f"({describe_layout(pool.config)}): {speed}, {rate}, "
            f"{human_bytes(cost.memory_per_device_bytes)} of "
            f"{human_bytes(cost.memory_capacity_bytes)} per device; largest parts {parts}"
        )
    return lines
