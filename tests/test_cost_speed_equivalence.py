"""The fast paths of the inference table price exactly what a row priced on its own does.

``collective_time_s`` and the kernel-curve lookups evaluate each group of alike rows once
(``_rows.RowPartition``) on tables of ``_DISTINCT_MIN_SIZE`` rows or more; a table of one row
takes the straightforward path. A large table made of a sample of distinct layouts, each
repeated in shuffled order, must give every row the columns its layout gets alone.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest

from autoparallel import get_model
from cost_model import Inference, ParallelConfig, configs_to_table, estimate_inference_table
from cost_model._options import Calibration
from cost_model._pricing import collective_time_s
from cost_model._rows import _DISTINCT_MIN_SIZE, RowPartition, distinct_rows
from cost_model._serving_columns import A2A_BACKEND_CODES, KV_DTYPE_CODES, PHASE_CODES
from cost_model._table import select_rows
from topology import get_preset, load_hardware_profile

DSV3 = get_model("deepseek-v3")
CLUSTER = get_preset("dgx-h200", num_nodes=4)
WORKLOAD = Inference(prompt_tokens=2048, output_tokens=512, weight_dtype="fp8")
WORKLOADS = {
    "loaded": WORKLOAD,
    "slos": WORKLOAD.model_copy(update={"ttft_slo_s": 1.0, "tpot_slo_s": 0.04}),
}
#: Relative tolerance: element-wise numpy is exact per element, but vectorized transcendental
#: kernels may differ in the last bit between a long and a short array.
RELATIVE = 1e-12


def _layouts(count: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``count`` distinct legal layouts on 32 GPUs with varied serving columns."""
    world = CLUSTER.num_devices
    meshes = []
    for tp, pp, cp, ep, attention_dp in itertools.product(
        [1, 2, 4, 8], [1, 2, 4], [1, 2], [1, 4, 8, 16, 32], [False, True]
    ):
        dp, rest = divmod(world, tp * pp * cp)
        if rest or not dp:
            continue
        config = ParallelConfig(
            dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, attention_data_parallel=attention_dp
        )
        try:
            config.validate_for(DSV3, world)
        except ValueError:
            continue
        meshes.append(config)
    serving = list(
        itertools.product(
            [0, 4],  # batch_size
            [0, 32],  # num_redundant_experts
            [KV_DTYPE_CODES["bf16"], KV_DTYPE_CODES["fp8"]],
            list(PHASE_CODES.values()),
            [False, True],  # two_batch_overlap
            list(A2A_BACKEND_CODES.values()),
        )
    )
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(meshes) * len(serving), size=count, replace=False)
    chosen = [(meshes[i // len(serving)], serving[i % len(serving)]) for i in picks]
    columns = np.array([c[1] for c in chosen])
    return configs_to_table(
        [c[0] for c in chosen],
        batch_size=columns[:, 0],
        num_redundant_experts=columns[:, 1],
        kv_dtype=columns[:, 2],
        phase=columns[:, 3],
        two_batch_overlap=columns[:, 4].astype(bool),
        a2a_backend=columns[:, 5],
    )


@pytest.fixture(scope="module")
def layouts() -> dict[str, np.ndarray]:
    return _layouts(48)


@pytest.fixture(scope="module")
def repeated(layouts) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The layouts repeated in shuffled order to more rows than the fast paths start at."""
    count = len(layouts["tp"])
    copies = -(-_DISTINCT_MIN_SIZE // count) + 1
    order = np.random.default_rng(1).permutation(np.tile(np.arange(count), copies))
    return select_rows(layouts, order), order


def _assert_same(batch: dict, alone: dict, row: int, label: str) -> None:
    assert set(batch) == set(alone)
    for name, column in alone.items():
        expected, got = np.asarray(column)[0], np.asarray(batch[name])[row]
        if np.issubdtype(np.asarray(column).dtype, np.floating):
            assert (np.isnan(expected) and np.isnan(got)) or got == pytest.approx(
                expected, rel=RELATIVE, abs=0.0
            ), f"{label}: column {name} row {row}: {got!r} != {expected!r}"
        else:
            assert got == expected, f"{label}: column {name} row {row}: {got!r} != {expected!r}"


@pytest.mark.parametrize("label", sorted(WORKLOADS))
def test_large_table_prices_each_row_as_alone(layouts, repeated, label):
    workload = WORKLOADS[label]
    table, order = repeated
    assert len(order) >= _DISTINCT_MIN_SIZE  # the grouped paths run
    batch = estimate_inference_table(model=DSV3, cluster=CLUSTER, workload=workload, table=table)
    checked = 0
    for layout in range(len(layouts["tp"])):
        alone = estimate_inference_table(
            model=DSV3, cluster=CLUSTER, workload=workload, table=select_rows(layouts, [layout])
        )
        for row in np.flatnonzero(order == layout)[:2]:
            _assert_same(batch, alone, int(row), f"{label} layout {layout}")
            checked += 1
    assert checked == 2 * len(layouts["tp"])
    # the sample is not degenerate: the layouts price differently
    assert len(np.unique(np.asarray(batch["ttft_s"])[np.isfinite(batch["ttft_s"])])) > 5


def test_distinct_rows_represent_every_row():
    rng = np.random.default_rng(2)
    group = rng.choice([1.0, 2.0, 8.0], size=10_000)
    message = rng.choice([0.0, -0.0, 3.5, np.nan, 1e9], size=10_000)
    first, inverse = distinct_rows([group, message], size=10_000)
    for value in (group, message):
        np.testing.assert_array_equal(value[first][inverse], value)
    assert len(first) <= 15


def test_distinct_rows_survive_a_hash_collision():
    # two integer tuples hashed to the same key: (a, b) and (a + 1, b - 0x9E3779B1)
    size = 5000
    a = np.where(np.arange(size) % 2 == 0, 7, 8).astype(np.int64)
    b = np.where(np.arange(size) % 2 == 0, 0x9E3779B1 + 5, 5).astype(np.int64)
    first, inverse = distinct_rows([a, b], size=size)
    for value in (a, b):
        np.testing.assert_array_equal(value[first][inverse], value)


def test_partition_reuses_a_grouping_only_where_inputs_are_alike():
    size = 8000
    rows = RowPartition(size)
    coarse = np.repeat([1.0, 2.0], size // 2)
    first, inverse = rows.grouping([coarse], size=size, site="a")
    assert len(first) == 2
    fine = np.tile([3.0, 4.0], size // 2)  # splits both groups of the first grouping
    found = rows.grouping([fine], size=size, site="b")
    assert found is not None
    np.testing.assert_array_equal(fine[found[0]][found[1]], fine)
    both = rows.grouping([coarse, fine], size=size, site="c")
    assert both is not None and len(both[0]) == 4
    for value in (coarse, fine):
        np.testing.assert_array_equal(value[both[0]][both[1]], value)
    again = rows.grouping([coarse * 10.0], size=size, site="a")  # alike on the first: no sort
    assert again is not None and again[0] is first
    # rows that hardly repeat are priced directly (None), and still exactly once grouped
    assert rows.grouping([np.arange(size, dtype=np.float64)], size=size, site="d") is None
    calls = []

    def double(*, value):
        calls.append(value.size)
        return 2.0 * value

    np.testing.assert_array_equal(rows.evaluate(double, value=coarse * 3.0), coarse * 6.0)
    assert calls == [2]
    distinct = np.arange(size, dtype=np.float64)
    np.testing.assert_array_equal(rows.evaluate(double, value=distinct), 2.0 * distinct)
    assert calls == [2, size]


@dataclasses.dataclass(frozen=True)
class _Record:
    table: np.ndarray  # (rows, 2)
    column: np.ndarray  # (rows,)
    scalar: float


def test_partition_picks_the_rows_of_dataclass_arguments():
    size = 6000
    rows = RowPartition(size)
    kind = np.arange(size) % 3
    record = _Record(np.stack([kind * 1.0, kind * 2.0], axis=1), np.repeat(5.0, size), 0.5)
    seen = []

    def total(*, record, extra):
        seen.append(record.column.size)
        return record.table.sum(axis=1) + record.column * record.scalar + extra

    expected = record.table.sum(axis=1) + record.column * 0.5 + kind
    np.testing.assert_array_equal(rows.evaluate(total, record=record, extra=kind * 1.0), expected)
    assert seen == [3]
    split = dataclasses.replace(record, column=np.arange(size) % 2 * 1.0)  # six groups now
    np.testing.assert_array_equal(
        rows.evaluate(total, record=split, extra=0.0),
        split.table.sum(axis=1) + split.column * 0.5,
    )
    assert seen == [3, 6]


def test_collective_time_same_with_and_without_partition():
    rng = np.random.default_rng(3)
    size = 6000
    group = rng.choice([2.0, 4.0, 8.0, 16.0, 64.0], size=size)
    local = np.minimum(group, rng.choice([1.0, 2.0, 8.0], size=size))
    message = rng.choice([1e3, 1e6, 3e7], size=size)
    calibration = Calibration(collective_efficiency=0.8)
    shared = RowPartition(size)
    for op in ("all_reduce", "all_gather", "send_recv", "all_to_all"):
        kwargs = dict(
            cluster=CLUSTER,
            op=op,
            group_size=group,
            ranks_per_node=local,
            message_bytes=message,
            calibration=calibration,
        )
        grouped = collective_time_s(**kwargs, rows=shared)
        plain = collective_time_s(**kwargs)
        straight = (
            np.asarray(
                CLUSTER.collective_time(
                    op, group_size=group, ranks_per_node=local, message_bytes=message
                )
            )
            / 0.8
        )
        np.testing.assert_allclose(grouped, straight, rtol=RELATIVE, atol=0.0)
        np.testing.assert_allclose(plain, straight, rtol=RELATIVE, atol=0.0)
        assert np.all(straight[group > 1] > 0)


def test_profile_collective_time_matches_each_element_alone():
    path = (
        Path(__file__).resolve().parents[1] / "benchmarks/results/profile_cpu_gloo_2ranks_1150.json"
    )
    profile = load_hardware_profile(path)
    curve = profile.collectives["all_reduce"][2]
    wider = profile.model_copy(
        update={"collectives": {"all_reduce": {2: curve, 4: profile.collectives["all_gather"][2]}}}
    )
    rng = np.random.default_rng(4)
    sizes = rng.choice([1.0, 2.0, 4.0, 8.0], size=300)
    nbytes = rng.choice([0.0, 10.0, 1e4, 1e6, 1e9], size=300)
    got = wider.collective_time_s("all_reduce", sizes, nbytes)
    for size, message, value in zip(sizes, nbytes, got, strict=True):
        if size in (2.0, 4.0):
            expected = float(wider.collectives["all_reduce"][int(size)].time_s(message))
            assert value == pytest.approx(expected, rel=RELATIVE, abs=0.0)
        else:
            assert np.isnan(value)
    assert np.isnan(wider.collective_time_s("broadcast", 2.0, 1e3))
    assert float(wider.collective_time_s("all_reduce", 2.0, 1e3)) == float(curve.time_s(1e3))
