"""Published "it fit" / "it did not fit" statements against the predicted peak memory, and
every published run of the throughput tables fits where its publication trained it."""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest

from cost_model._validation import TOLERANCES, peak_memory_bytes, peak_memory_rows
from cost_model._validation_cases import blackwell_cases, training_cases

CLAIMS = json.loads((resources.files("cost_model") / "data" / "memory_claims.json").read_text())[
    "claims"
]
#: Tables whose publication does not state the memory-saving setup of its runs, and whose
#: assumed setup is predicted not to fit: listed, not hidden. Llama 3 Table 4
#: (arXiv:2407.21783 sec. 3.3.2): the report trains on its own modified interleaved pipeline
#: schedule with a tunable number N of consecutive micro-batches per stage and frees each
#: stage's input and output tensors early; it does not give N or the micro-batch size, so the
#: micro-batches in flight on the first stage, which set its activation memory, cannot be
#: counted (the rows are predicted at 88-95 GiB; at 8K without activation checkpointing, which the
#: report says fit in 80 GB).
UNSTATED_SETUP = {"llama3_table4"}


def _peak_bytes(case, *, micro_batch: int | None = None) -> tuple[float, float]:
    return peak_memory_bytes(case, micro_batch=micro_batch)


@pytest.mark.parametrize("claim", CLAIMS, ids=lambda c: f"{c['run']}{c['change']}")
def test_each_published_memory_claim_holds(claim: dict) -> None:
    case = next(c for c in training_cases() if c.table == claim["table"] and c.run == claim["run"])
    needed, capacity = _peak_bytes(case, micro_batch=claim["change"].get("micro_batch"))
    assert (needed <= capacity) == claim["fits"], (claim["run"], claim["change"], needed / 2**30)


def test_every_published_training_run_fits_where_it_was_trained() -> None:
    """Every published training run of the validation set (the throughput tables and the
    Blackwell table), under its recipe's memory settings where the recipe states them
    (``memory_setup``), is predicted to fit in its device's memory."""
    cases = [c for c in training_cases() + blackwell_cases() if c.table not in UNSTATED_SETUP]
    assert len(cases) >= 40
    too_big = []
    for case in cases:
        needed, capacity = _peak_bytes(case)
        if needed > capacity:
            too_big.append((case.table, case.run, round(needed / 2**30, 1)))
    assert not too_big


def test_megatron_bridge_runs_carry_their_recipe_memory_settings() -> None:
    """Each Megatron-Bridge run names the performance-recipe preset its memory settings were
    read from, with the file and commit."""
    cases = [c for c in training_cases() + blackwell_cases() if c.source == "megatron_bridge_perf"]
    assert len(cases) >= 45
    for case in cases:
        setup = dict(case.memory_setup)
        assert setup["recompute"] in ("none", "selective", "full"), case.run
        assert setup["gradient_dtype"] == "bf16", case.run
        # the release whose recipes it read, or the commit that published its table
        assert re.search(r"Megatron-Bridge (v0\.3\.0|at [0-9a-f]{9})", setup["source"]), case.run
        assert setup["recipe"].split(" ")[0] in setup["source"], case.run


def test_published_peak_memory_is_predicted_within_its_bound() -> None:
    """torchtitan's H100 benchmark publishes each run's peak reserved memory: the FSDP and
    FSDP + CP runs are predicted within 10%, the TP/PP runs within 22%, the 405B TP/PP/CP runs
    within 17%; Trainy's H200 runs (compiled loss) within 10%."""
    rows = peak_memory_rows()
    assert TOLERANCES["torchtitan_h100_peak_memory"][1] == 0.10
    assert TOLERANCES["torchtitan_h100_peak_memory_tp_pp"][1] == 0.22
    assert len([row for row in rows if row.table == "torchtitan_h100_peak_memory"]) >= 10
    assert len([row for row in rows if row.table == "torchtitan_h100_peak_memory_tp_pp"]) == 4
    assert TOLERANCES["torchtitan_h100_peak_memory_4d"][1] == 0.17
    four_d = [row for row in rows if row.table == "torchtitan_h100_peak_memory_4d"]
    assert len(four_d) == 4
    assert TOLERANCES["torchtitan_h200_peak_memory"][1] == 0.10
    assert len([row for row in rows if row.table == "torchtitan_h200_peak_memory"]) == 2
    off = [
        (row.run, round(row.predicted, 1), row.published)
        for row in rows
        if abs(row.error) > (TOLERANCES[row.table][1] or 0.0)
    ]
    assert not off
