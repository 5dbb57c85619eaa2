"""Validation by ratios: runs of one source on the same GPUs that differ in one choice, compared by
their throughput over a base run's.

pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (torchtitan 9dec370, torch 1963fc8,
2024-12) publishes tokens/s per GPU beside the peak memory of each run; its runs are the records
of ``data/published_peak_memory.json`` that carry ``tokens_per_s_per_gpu``. They ran on H100s at
500 W with 96 GB of HBM2e, whose clocks the 700 W preset does not price, so their absolute
throughput is not compared (the preset prices them 1.24-1.44x faster at 8K tokens); each run's
throughput over its base run's is, the clocks cancelling out:

* ``torchtitan_schedules`` (Table 5): Llama 3.1 405B on 512 H100 (FSDP 8, TP 8, PP 8) under
  interleaved 1F1B (two stages per rank) over 1F1B: the schedules' bubbles and the interleaved
  schedule's extra point-to-point traffic;
* ``torchtitan_compile`` (Tables 1 and 3): Llama 3.1 8B under FSDP on 8 and 128 H100 with
  torch.compile over eager: the ``torchtitan-compile`` framework profile against ``torchtitan``;
* ``torchtitan_async_tp`` (Table 4, beside the June 2025 pairs of ``_tp_overlap_validation``):
  Llama 3.1 70B on 256 H100 (FSDP 32, TP 8) with asynchronous tensor parallel over plain;
* ``torchtitan_context_parallel`` (Tables 2 and 6): Llama 3.1 8B (FSDP + CP) and 405B (FSDP + TP
  8 + PP 8 + CP) at the same tokens per rank and micro-batch as context parallelism grows from 1
  to 8 and the sequence with it (32K to 256K): each over its CP 1 run.

Validation only, never fitted; the schedules' order is also checked as a ranking
(``tests/test_cost_ranking.py``).
"""

from __future__ import annotations

from cost_model._validation_cases import Case, peak_memory_cases, peak_memory_records

__all__ = ["RATIO_COMPARISONS", "ratio_rows", "ratio_speedups"]

#: (table, base run, compared runs, metric) of each comparison.
RATIO_COMPARISONS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    (
        "torchtitan_schedules",
        "405B FSDP8 TP8 PP8 1F1B full",
        ("405B FSDP8 TP8 PP8 interleaved 1F1B full",),
        "throughput / 1F1B",
    ),
    (
        "torchtitan_compile",
        "8B FSDP8 bs2 selective-op",
        ("8B FSDP8 bs2 selective-op compile",),
        "throughput / eager",
    ),
    (
        "torchtitan_compile",
        "8B FSDP128 bs2 selective-op",
        ("8B FSDP128 bs2 selective-op compile",),
        "throughput / eager",
    ),
    (
        "torchtitan_async_tp",
        "70B FSDP32 TP8 bs16 full",
        ("70B FSDP32 TP8 bs16 full async-TP",),
        "async/vanilla TP throughput",
    ),
    (
        "torchtitan_context_parallel",
        "8B FSDP8 CP1 seq 32768 full",
        (
            "8B FSDP4 CP2 seq 65536 full",
            "8B FSDP2 CP4 seq 131072 full",
            "8B FSDP1 CP8 seq 262144 full",
        ),
        "throughput / CP 1",
    ),
    (
        "torchtitan_context_parallel",
        "405B FSDP8 TP8 PP8 CP1 seq 32768 1F1B full",
        (
            "405B FSDP4 TP8 PP8 CP2 seq 65536 1F1B full",
            "405B FSDP2 TP8 PP8 CP4 seq 131072 1F1B full",
            "405B FSDP1 TP8 PP8 CP8 seq 262144 1F1B full",
        ),
        "throughput / CP 1",
    ),
)


def _throughput_cases() -> dict[str, tuple[Case, float]]:
    """Run name: (case, published tokens/s per GPU) of the peak-memory records that publish
    throughput."""
    published = {
        r["run"]: float(r["tokens_per_s_per_gpu"])
        for r in peak_memory_records()
        if "tokens_per_s_per_gpu" in r
    }
    return {
        case.run: (case, published[case.run])
        for case, _ in peak_memory_cases()
        if case.run in published
    }


def _predicted_tokens_per_s(case: Case) -> float:
    """Tokens/s per GPU of ``case`` as its peak memory is estimated (the recipe's recorded
    settings applied, ``_validation.recipe_estimate``)."""
    from cost_model._validation import recipe_estimate

    columns, _, workload = recipe_estimate(case)
    return workload.tokens_per_step / (float(columns["step_time_s"][0]) * case.config.world_size)


def ratio_speedups() -> list[dict]:
    """Per compared run: its table and metric, the published and the predicted throughput over
    its base run's."""
    cases = _throughput_cases()
    predicted = {run: _predicted_tokens_per_s(case) for run, (case, _) in cases.items()}
    rows = []
    for table, base, runs, metric in RATIO_COMPARISONS:
        for run in runs:
            rows.append(
                {
                    "table": table,
                    "run": run,
                    "metric": metric,
                    "published": cases[run][1] / cases[base][1],
                    "predicted": predicted[run] / predicted[base],
                }
            )
    return rows


def ratio_rows() -> list:
    """The comparisons as ``ValidationRow``s."""
    from cost_model._validation import ValidationRow

    return [
        ValidationRow(
            table=row["table"],
            run=row["run"],
            metric=row["metric"],
            unit="x",
            predicted=row["predicted"],
            published=row["published"],
        )
        for row in ratio_speedups()
    ]
