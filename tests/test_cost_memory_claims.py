"""Published "it fit" / "it did not fit" statements against the predicted peak memory, and
every published run of the throughput tables fits where its publication trained it."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from cost_model import estimate_table
from cost_model._table import configs_to_table
from cost_model._validation import _cluster, _options, _workload, training_cases

CLAIMS = json.loads((resources.files("cost_model") / "data" / "memory_claims.json").read_text())[
    "claims"
]
#: Tables whose publication does not state the memory-saving setup of its runs, and whose
#: assumed setup (no recompute) is predicted not to fit: listed, not hidden. Llama 3 Table 4
#: gives no recompute or interleaving setting for its 405B runs; the Megatron-Bridge tables
#: give no recompute setting (their recipes choose one per model).
UNSTATED_SETUP = {"llama3_table4", "megatron_bridge_perf"}


def _peak_bytes(case, *, micro_batch: int | None = None) -> tuple[float, float]:
    cluster = _cluster(case.hardware, case.config.world_size)
    config, workload = case.config, _workload(case)
    if micro_batch is not None:
        scale = micro_batch / config.micro_batch_size
        config = config.model_copy(update={"micro_batch_size": micro_batch})
        workload = workload.model_copy(
            update={"global_batch_sequences": int(workload.global_batch_sequences * scale)}
        )
    columns = estimate_table(
        case.model,
        cluster,
        workload,
        configs_to_table([config]),
        options=_options(case, None, cluster),
    )
    return float(columns["memory_per_device_bytes"][0]), float(cluster.device.memory_bytes)


@pytest.mark.parametrize("claim", CLAIMS, ids=lambda c: f"{c['run']}{c['change']}")
def test_each_published_memory_claim_holds(claim: dict) -> None:
    case = next(c for c in training_cases() if c.table == claim["table"] and c.run == claim["run"])
    needed, capacity = _peak_bytes(case, micro_batch=claim["change"].get("micro_batch"))
    assert (needed <= capacity) == claim["fits"], (claim["run"], claim["change"], needed / 2**30)


def test_every_published_throughput_run_fits_where_it_was_trained() -> None:
    too_big = []
    for case in training_cases():
        if case.table in UNSTATED_SETUP:
            continue
        needed, capacity = _peak_bytes(case)
        if needed > capacity:
            too_big.append((case.table, case.run, round(needed / 2**30, 1)))
    assert not too_big
