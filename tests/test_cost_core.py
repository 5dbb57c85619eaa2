"""The shared vectorized core: config tables, stage layout, parameters per device, placement."""

from __future__ import annotations

import numpy as np
import pytest

from autoparallel import get_model
from cost_model import ParallelConfig, split_layers
from cost_model._model_spec import AttentionSpec
from cost_model._options import Calibration
from cost_model._pricing import mean_attended_tokens, op_time_s, ranks_per_node
from cost_model._stages import STAGES, parameters_per_device, stage_layout
from cost_model._table import (
    configs_to_table,
    select_rows,
    table_from_columns,
    table_length,
    table_row,
)
from topology import get_preset

CONFIGS = [
    ParallelConfig(),
    ParallelConfig(
        dp=4, tp=8, pp=4, ep=32, sequence_parallel=True, recompute="selective", zero_stage=1
    ),
    ParallelConfig(
        tp=2, pp=4, virtual_stages=3, pipeline_schedule="interleaved_1f1b", micro_batch_size=2
    ),
    ParallelConfig(
        dp=16, cp=2, ep=8, etp=2, zero_stage=3, recompute="full", pipeline_schedule="zero_bubble"
    ),
]


def test_table_round_trips_every_config() -> None:
    table = configs_to_table(CONFIGS, batch_size=np.arange(4))
    assert table_length(table) == 4
    assert [table_row(table, i) for i in range(4)] == CONFIGS
    assert table["batch_size"].tolist() == [0, 1, 2, 3]
    assert table_row(select_rows(table, [2]), 0) == CONFIGS[2]


def test_table_from_columns_fills_defaults_and_encodes_labels() -> None:
    table = table_from_columns(
        tp=[1, 2, 4], recompute="full", pipeline_schedule=["gpipe", "1f1b", "zero_bubble"]
    )
    assert table_length(table) == 3
    assert table_row(table, 2) == ParallelConfig(
        tp=4, recompute="full", pipeline_schedule="zero_bubble"
    )
    with pytest.raises(ValueError, match="recompute"):
        table_from_columns(recompute="sometimes")


def test_table_with_ragged_columns_is_rejected() -> None:
    table = configs_to_table(CONFIGS[:2])
    table["tp"] = np.array([1, 2, 3])
    with pytest.raises(ValueError, match="one length"):
        table_length(table)


@pytest.mark.parametrize(
    "num_layers,pp", [(80, 1), (80, 2), (80, 3), (61, 8), (96, 8), (105, 35), (7, 4)]
)
def test_stage_layout_matches_split_layers(num_layers: int, pp: int) -> None:
    model = get_model("ref-3t-moe").model_copy(update={"num_layers": num_layers})
    layout = stage_layout(model=model, pp=np.array([pp]), virtual_stages=np.array([1]))
    sizes = [stop - start for start, stop in split_layers(num_layers, pp)]
    assert layout.layers[0, 0] == sizes[0]
    assert layout.layers[2, 0] == sizes[-1]
    assert layout.layers[1, 0] == max(sizes[1:-1] or [sizes[0]])


def test_parameters_per_device_add_up_to_the_model() -> None:
    model = get_model("ref-3t-moe")
    table = configs_to_table([ParallelConfig()])
    parts = parameters_per_device(model=model, table=table)
    assert sum(part[0, 0] for part in parts.values()) == pytest.approx(
        model.num_parameters, rel=1e-12
    )


def test_more_tp_or_ep_means_fewer_parameters_per_device() -> None:
    model = get_model("ref-3t-moe")
    configs = [
        ParallelConfig(tp=tp, ep=ep, dp=8) for tp, ep in [(1, 1), (2, 1), (8, 1), (8, 8), (8, 64)]
    ]
    parts = parameters_per_device(model=model, table=configs_to_table(configs))
    totals = sum(parts.values())[0]
    assert np.all(np.diff(totals) < 0)


def test_redundant_experts_cost_memory() -> None:
    model = get_model("ref-3t-moe")
    table = configs_to_table(
        [ParallelConfig(dp=32, ep=32)] * 2, num_redundant_experts=np.array([0, 32])
    )
    routed = parameters_per_device(model=model, table=table)["routed_experts"][1]
    assert routed[1] / routed[0] == pytest.approx((768 + 32) / 768)


def test_ranks_per_node_follows_megatron_order() -> None:
    table = configs_to_table(
        [ParallelConfig(dp=4, tp=4, pp=2, ep=8, etp=2), ParallelConfig(dp=16, tp=1, cp=2)]
    )
    local = ranks_per_node(table=table, devices_per_node=8)
    assert local["tp"].tolist() == [4, 1]
    assert local["dp"].tolist() == [2, 4]
    assert local["cp"].tolist() == [1, 2]
    assert local["pp"].tolist() == [1, 1]
    assert local["ep"].tolist() == [4, 1]


def test_roofline_takes_the_slower_of_compute_and_memory() -> None:
    hardware = get_preset("dgx-h100").device
    neutral = Calibration()
    flops = np.array([1e12, 1e6])
    bytes_moved = np.array([1e3, 1e9])
    seconds = op_time_s(
        flops=flops, bytes_moved=bytes_moved, hardware=hardware, dtype="bf16", calibration=neutral
    )
    assert seconds[0] == pytest.approx(1e12 / (989e12 * hardware.matmul_efficiency))
    assert seconds[1] == pytest.approx(1e9 / (3.35e12 * hardware.memory_bandwidth_efficiency))


def test_mean_attended_tokens_matches_a_direct_sum() -> None:
    window = AttentionSpec(
        kind="gqa",
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        variant="sliding_window",
        window_tokens=100,
    )
    full = window.model_copy(update={"variant": "full", "window_tokens": None})
    for spec in (window, full):
        for length in (10, 100, 1000):
            direct = np.mean([spec.attended_tokens(i) for i in range(1, length + 1)])
            assert mean_attended_tokens(attention=spec, sequence_tokens=length) == pytest.approx(
                direct
            )


def test_stage_rows_are_named() -> None:
    assert STAGES == ("first", "middle", "last")


@pytest.mark.parametrize("pp", [32, 48])
@pytest.mark.parametrize(
    "mesh", [{"dp": 8, "ep": 8}, {"dp": 4, "tp": 2, "ep": 8}, {"dp": 16, "ep": 16, "etp": 1}]
)
def test_fullest_pipeline_rank_holds_at_least_the_average(pp: int, mesh: dict) -> None:
    """ref-3t-moe's 3 dense layers spill past the first chunk at pp 32 and 48; the ranks the
    layout reports must include one holding at least the average parameters per rank."""
    model = get_model("ref-3t-moe")
    table = configs_to_table([ParallelConfig(pp=pp, **mesh)])
    per_rank = sum(parameters_per_device(model=model, table=table).values())[:, 0]
    # Every rank's parameters, summed over all pp ranks of one (tp, ep) slice, by hand.
    rows = []
    for start, stop in split_layers(model.num_layers, pp):
        dense = max(0, min(model.num_dense_ffn_layers, stop) - start)
        rows.append((stop - start, dense))
    one = configs_to_table([ParallelConfig(pp=1, **mesh)])
    whole = sum(parameters_per_device(model=model, table=one).values())[0, 0]
    average = whole / pp
    assert per_rank.max() >= average
    # The middle row is a real rank: its (layers, dense) pair occurs among the middle ranks.
    layout = stage_layout(model=model, pp=np.array([pp]), virtual_stages=np.array([1]))
    middle = (int(layout.layers[1, 0]), int(layout.dense_layers[1, 0]))
    assert middle in rows[1:-1]
    assert middle[1] == 0  # MoE layers are the heavier ones for ref-3t-moe


@pytest.mark.parametrize("pp,v", [(4, 2), (8, 5), (16, 5), (3, 3)])
def test_interleaved_layout_counts_each_ranks_chunks(pp: int, v: int) -> None:
    model = get_model("ref-3t-moe")
    layout = stage_layout(model=model, pp=np.array([pp]), virtual_stages=np.array([v]))
    sizes = [stop - start for start, stop in split_layers(model.num_layers, pp * v)]
    per_rank = [sum(sizes[r::pp]) for r in range(pp)]
    assert layout.layers[0, 0] == per_rank[0]
    assert layout.layers[2, 0] == per_rank[-1]
    assert layout.layers[1, 0] in per_rank[1:-1] or pp < 3
