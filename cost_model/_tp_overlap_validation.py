"""Validation of tensor-parallel overlap: torchtitan's asynchronous tensor parallel against its
vanilla tensor parallel on the same model, layout, GPUs and precision.

pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md publishes both for
Llama 3 70B (256 H100, FSDP 32 x TP 8) and 8B (64 H100, FSDP 8 x TP 8) in bf16 and float8; the
runs are the twin records of ``data/fp8_twins.json`` whose names end in ", vanilla TP" and
", async TP" (the async ones run the ``torchtitan-compile-async-tp`` framework profile). The
compared figure is the async / vanilla throughput ratio: what the overlap of
``_training_tp_overlap`` hides, net of the compute slowdown it causes. Validation only, never
fitted. A float8 pair whose twin record is excluded (rowwise, see its reason) is shown, not
bounded; its bf16 runs are the tensorwise records' and are not repeated.
"""

from __future__ import annotations

from cost_model._precision_validation import fp8_twin_records, record_model, record_throughput

__all__ = ["async_tp_speedups", "async_tp_rows"]

_VANILLA, _ASYNC = ", vanilla TP", ", async TP"


def _pairs() -> list[tuple[dict, dict]]:
    """(vanilla, async) twin records of the same run."""
    records = {r["run"]: r for r in fp8_twin_records()}
    return [
        (record, records[name[: -len(_VANILLA)] + _ASYNC])
        for name, record in records.items()
        if name.endswith(_VANILLA) and name[: -len(_VANILLA)] + _ASYNC in records
    ]


def async_tp_speedups() -> list[dict]:
    """Per pair and precision: run, published and predicted async / vanilla throughput, and
    the exclusion reason of a float8 pair whose twin record is excluded (else None)."""
    rows, seen_bf16 = [], set()
    for vanilla, overlapped in _pairs():
        model = record_model(vanilla)
        base = vanilla["run"][: -len(_VANILLA)]
        bf16_key = (vanilla["bf16_tokens_per_s_per_gpu"], overlapped["bf16_tokens_per_s_per_gpu"])
        for precision in ("bf16", "fp8"):
            if precision == "bf16" and bf16_key in seen_bf16:
                continue
            seen_bf16.add(bf16_key)
            key = f"{precision}_tokens_per_s_per_gpu"
            predicted = record_throughput(
                overlapped, model=model, precision=precision
            ) / record_throughput(vanilla, model=model, precision=precision)
            excluded = vanilla.get("excluded") or overlapped.get("excluded")
            rows.append(
                {
                    "run": base.replace(f" {vanilla['fp8_recipe']}", "")
                    if precision == "bf16"
                    else base,
                    "precision": precision,
                    "published": overlapped[key] / vanilla[key],
                    "predicted": predicted,
                    "excluded": excluded if precision == "fp8" else None,
                }
            )
    return rows


def async_tp_rows() -> list:
    """The pairs as ``ValidationRow``s: table ``torchtitan_async_tp`` (bounded) and
    ``torchtitan_async_tp_excluded`` (shown)."""
    from cost_model._validation import ValidationRow

    return [
        ValidationRow(
            table="torchtitan_async_tp_excluded" if row["excluded"] else "torchtitan_async_tp",
            run=f"{row['run']} {row['precision']}",
            metric="async/vanilla TP throughput",
            unit="x",
            predicted=row["predicted"],
            published=row["published"],
        )
        for row in async_tp_speedups()
    ]
