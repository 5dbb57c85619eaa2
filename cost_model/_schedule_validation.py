"""Validation of pipeline schedules: one model, layout, GPU count and workload under two schedules.

pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 5, trains Llama 3.1 405B on
512 H100 (FSDP 8, TP 8, PP 8; torch.compile, Float8, asynchronous TP, full activation
checkpointing) under 1F1B and under interleaved 1F1B with two stages per rank, and publishes the
tokens/s per GPU of each: 100 and 128. The runs are the records of ``data/published_peak_memory.json``
that carry ``tokens_per_s_per_gpu`` (their layout, workload and recipe facts are those of the
peak-memory check). The compared figure is each schedule's throughput over the 1F1B twin's: the
benchmark's H100s ran at 500 W with 96 GB of HBM2e, clocks the 700 W preset does not price, so
their absolute throughput is not compared; their ratio holds the schedules' bubbles and the
interleaved schedule's extra point-to-point traffic. Validation only, never fitted; the order is
also checked as a ranking (``tests/test_cost_ranking.py``).
"""

from __future__ import annotations

from cost_model._validation_cases import Case, peak_memory_cases, peak_memory_records

__all__ = ["schedule_rows", "schedule_speedups"]

#: The schedule every other one is compared with.
_BASE_SCHEDULE = "1f1b"


def _throughput_cases() -> list[tuple[Case, float]]:
    """(case, published tokens/s per GPU) of the peak-memory records that publish throughput."""
    published = {
        r["run"]: float(r["tokens_per_s_per_gpu"])
        for r in peak_memory_records()
        if "tokens_per_s_per_gpu" in r
    }
    return [(case, published[case.run]) for case, _ in peak_memory_cases() if case.run in published]


def _predicted_tokens_per_s(case: Case) -> float:
    """Tokens/s per GPU of ``case`` as its peak memory is estimated (the recipe's recorded
    settings applied, ``_validation.recipe_estimate``)."""
    from cost_model._validation import recipe_estimate

    columns, _, workload = recipe_estimate(case)
    return workload.tokens_per_step / (float(columns["step_time_s"][0]) * case.config.world_size)


def _twin_key(case: Case) -> tuple:
    """What two runs must share to be schedule twins: everything but the schedule."""
    config = case.config.model_copy(
        update={"pipeline_schedule": _BASE_SCHEDULE, "virtual_stages": 1}
    )
    return (case.table, case.hardware, config, case.workload, case.memory_setup)


def schedule_speedups() -> list[dict]:
    """Per run with a 1F1B twin: its schedule, the published and the predicted throughput over
    the twin's."""
    cases = _throughput_cases()
    base = {
        _twin_key(case): (case, published)
        for case, published in cases
        if case.config.pipeline_schedule == _BASE_SCHEDULE
    }
    rows = []
    for case, published in cases:
        twin = base.get(_twin_key(case))
        if twin is None or twin[0] is case:
            continue
        rows.append(
            {
                "run": case.run,
                "schedule": case.config.pipeline_schedule,
                "virtual_stages": case.config.virtual_stages,
                "published": published / twin[1],
                "predicted": _predicted_tokens_per_s(case) / _predicted_tokens_per_s(twin[0]),
            }
        )
    return rows


def schedule_rows() -> list:
    """The twins as ``ValidationRow``s, table ``torchtitan_schedules``."""
    from cost_model._validation import ValidationRow

    return [
        ValidationRow(
            table="torchtitan_schedules",
            run=row["run"],
            metric="throughput / 1F1B",
            unit="x",
            predicted=row["predicted"],
            published=row["published"],
        )
        for row in schedule_speedups()
    ]
