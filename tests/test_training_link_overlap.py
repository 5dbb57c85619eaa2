"""Traffic on NVLink and on the NIC overlaps the same compute; traffic on one link shares it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cost_model import ParallelConfig, Training
from cost_model._model_spec import ModelSpec
from cost_model._options import EstimateOptions
from cost_model._table import configs_to_table
from cost_model._training import training_time_columns
from cost_model._training_comm import table_collective_times
from cost_model._training_context import training_context
from cost_model._training_dp import _data_parallel_comm, hidden_seconds
from cost_model._training_links import LinkWindows, crosses_nodes
from cost_model._training_micro_batch import micro_batch_times
from topology import get_preset

MODEL = ModelSpec.from_hf_config(
    json.loads((Path(__file__).parent / "data" / "dense_8_layers.json").read_text()), name="dense"
)
NIC, NVLINK = np.array([True]), np.array([False])


def _hide(windows: LinkWindows, comm: float, *, on_nic: np.ndarray) -> float:
    hidden = hidden_seconds(np.array([comm]), fraction=1.0, window=windows.free(on_nic))
    windows.take(hidden, exposed=comm - hidden, on_nic=on_nic)
    return float(hidden[0])


def test_nic_and_nvlink_transfers_shorter_than_the_backward_both_hide() -> None:
    windows = LinkWindows(np.array([1.0]))  # one backward, seconds
    assert _hide(windows, 0.9, on_nic=NVLINK) == pytest.approx(0.9)  # TP all-reduce
    assert _hide(windows, 0.8, on_nic=NIC) == pytest.approx(0.8)  # DP reduce-scatter


def test_two_transfers_on_one_link_longer_than_the_window_do_not_both_hide() -> None:
    windows = LinkWindows(np.array([1.0]))
    first = _hide(windows, 0.6, on_nic=NVLINK)
    second = _hide(windows, 0.7, on_nic=NVLINK)
    assert first + second == pytest.approx(1.0)  # 0.3 s of the 1.3 s shared link is exposed
    assert second == pytest.approx(0.4)


def test_exposed_collectives_of_one_link_are_time_for_the_other_links_stream() -> None:
    windows = LinkWindows(np.array([1.0]))
    _hide(windows, 1.5, on_nic=NVLINK)  # 0.5 s of blocking TP stalls the compute stream
    assert windows.stream_window(NIC)[0] == pytest.approx(1.5)
    assert windows.stream_window(NVLINK)[0] == pytest.approx(0.0)


def _context(*, nodes: int, tp: int, dp: int):
    config = ParallelConfig(tp=tp, dp=dp, micro_batch_size=1, sequence_parallel=True, zero_stage=1)
    workload = Training(
        sequence_length_tokens=1024,
        global_batch_sequences=dp,
        gradient_dtype="fp32",
        framework="megatron-core",
    )
    return training_context(
        model=MODEL,
        cluster=get_preset("dgx-h100", num_nodes=nodes),
        workload=workload,
        table=configs_to_table([config]),
        options=EstimateOptions(),
    )


def test_groups_that_span_nodes_cross_the_nic() -> None:
    two_nodes = _context(nodes=2, tp=8, dp=2)
    assert not crosses_nodes(two_nodes, "tp_comm")[0]
    assert crosses_nodes(two_nodes, "dp_comm")[0]
    one_node = _context(nodes=1, tp=4, dp=2)
    assert not crosses_nodes(one_node, "dp_comm")[0]


def _dp_hidden(ctx, *, free_share_of_tp: bool) -> tuple[float, float]:
    """(hidden DP seconds of the step, the same with the whole compute (or only what the
    TP traffic left, ``free_share_of_tp``) as its window)."""
    columns = training_time_columns(ctx)
    times = table_collective_times(ctx)
    mb = micro_batch_times(ctx, times)
    free = mb.forward + mb.backward + mb.recompute
    if free_share_of_tp:
        free = free - columns["hidden.tp_comm"] / ctx.num_micro_batches
    _, reference = _data_parallel_comm(ctx, free_compute=free, times=times, mb=mb)
    return float(columns["hidden.dp_comm"][0]), float(reference[0, 0])


@pytest.fixture
def no_bucket_edge(monkeypatch):
    """Every gradient bucket may hide (none held back as Megatron-core's last bucket), so
    the windows alone decide what hides: a rank of the small test model holds under two of
    its 40M-parameter buckets."""
    from cost_model import _training_dp

    monkeypatch.setattr(_training_dp, "_last_bucket_share", lambda ctx: 0.0)


def test_nic_gradient_reduce_keeps_the_backward_tp_traffic_hides_behind(no_bucket_edge) -> None:
    ctx = _context(nodes=2, tp=8, dp=2)
    hidden, whole_window = _dp_hidden(ctx, free_share_of_tp=False)
    _, what_tp_left = _dp_hidden(ctx, free_share_of_tp=True)
    assert what_tp_left < whole_window  # the old shared window would have cut it
    assert hidden >= whole_window


def test_nvlink_gradient_reduce_shares_the_window_with_tp_traffic(no_bucket_edge) -> None:
    ctx = _context(nodes=1, tp=2, dp=4)  # dp inside the node: both on NVLink
    hidden, whole_window = _dp_hidden(ctx, free_share_of_tp=False)
    _, what_tp_left = _dp_hidden(ctx, free_share_of_tp=True)
    assert hidden < whole_window
    assert hidden == pytest.approx(what_tp_left)
