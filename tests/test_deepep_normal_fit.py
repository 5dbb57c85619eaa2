"""DeepEP's normal (node-deduplicating) kernels: the shipped operator fit and both paths that
price with it (SGLang / TensorRT-LLM prefill, training's DeepEP dispatcher)."""

from __future__ import annotations

import numpy as np
import pytest

from autoparallel import get_model
from autoparallel._kernel_import_comm import _DEEPEP_NORMAL_GRID
from cost_model import (
    EstimateOptions,
    Inference,
    ParallelConfig,
    Training,
    configs_to_table,
    table_from_columns,
)
from cost_model import _kernel_curves_comm as curves_module
from cost_model._inference_comm import _deepep_expert_comm
from cost_model._inference_setup import _setup
from cost_model._kernel_curves import kernel_curves
from cost_model._kernel_curves_comm import deepep_normal_s
from cost_model._options import Calibration
from cost_model._pricing import collective_time_s, expert_dispatch_time_s
from cost_model._routing_skew import eplb_skew, predicted_excess
from cost_model._serving_columns import A2A_BACKEND_CODES, PHASE_CODES
from cost_model._training_comm import collective_times
from cost_model._training_context import training_context
from topology import get_preset

DSV3 = get_model("deepseek-v3")
H100_4_NODES = get_preset("dgx-h100", num_nodes=4)
RANK_TOKENS = 4096.0


def _normal_fit() -> dict:
    return kernel_curves()["deepep_normal"]


def _by_hand(direction: str, element_bytes: float, rank_tokens: float) -> float:
    """Top-8 of 256 experts over EP32 on 4 nodes of 8: each rank forwards the tokens of 4 source
    ranks to 7 other ranks, each reached with probability 1 - (31/32)^8 (NVLink), and sends
    3 x (1 - (3/4)^8) distinct remote nodes (RDMA), at 450 / 50 GB/s preset peaks, after the
    fixed latency and 3 remote nodes' latency."""
    params = _normal_fit()[direction]
    token_bytes = rank_tokens * DSV3.hidden_size * element_bytes
    intra = token_bytes * 4.0 * 7.0 * (1.0 - (31.0 / 32.0) ** 8)
    inter = token_bytes * 3.0 * (1.0 - 0.75**8)
    return (
        params["latency_s"]
        + 3.0 * params["latency_per_remote_node_s"]
        + max(
            intra / (450e9 * params["nvlink_efficiency"]),
            inter / (50e9 * params["rdma_efficiency_by_nodes"]["4"]),
        )
    )


def _without_normal_fit(monkeypatch) -> None:
    shipped = {k: v for k, v in kernel_curves().items() if k != "deepep_normal"}
    monkeypatch.setattr(curves_module, "kernel_curves", lambda: shipped)


def test_shipped_normal_fit_is_an_operator_fit_with_no_value_at_a_grid_bound() -> None:
    fit = _normal_fit()
    assert fit["file"].endswith(
        "h100_sxm/comm/sglang/0.5.6.post2/wideep_deepep_normal_perf.parquet"
    )
    assert "silicon_sample" not in fit["file"] and fit["sms"] == 20 and fit["preset"] == "dgx-h100"
    for direction in ("dispatch", "combine"):
        params = fit[direction]
        assert params["points"] == 92  # 23 token counts x 4 node counts at 20 SMs
        for name, grid in _DEEPEP_NORMAL_GRID.items():
            values = (
                params["rdma_efficiency_by_nodes"].values()
                if name == "rdma_efficiency"
                else [params[name]]
            )
            for value in values:
                assert grid[0] < value < grid[-1], (direction, name)
        assert set(params["rdma_efficiency_by_nodes"]) == {"2", "4", "8"}


def test_rdma_efficiency_per_node_count_fits_each_count_and_says_its_held_out_error() -> None:
    # DeepEP runs each EP size with its own buffer chunking (Buffer.get_dispatch_config), and the
    # table's per-byte RDMA rate moves with it: 37 / 46 / 22 GB/s on 2 / 4 / 8 nodes at 131072
    # tokens. One efficiency per node count fits every count within 11% / 14% mean (dispatch /
    # combine; one shared efficiency: 17.5% / 23.3% at 4 nodes, max 0.46 / 0.62); a node count
    # held out and priced from the others is missed by up to 0.36 / 0.42, the spread across
    # counts that no term explains, and so the error bar of an EP size the table does not hold.
    for direction in ("dispatch", "combine"):
        params = _normal_fit()[direction]
        by_nodes = params["rdma_efficiency_by_nodes"]
        assert by_nodes["4"] > by_nodes["2"] and by_nodes["4"] > by_nodes["8"]
        assert params["mean_abs_error"] < 0.12 and params["max_abs_error"] < 0.30
        assert max(params["mean_abs_error_by_nodes"].values()) < 0.15
        assert max(params["held_out_node_count_mean_abs_error"].values()) < 0.45


def test_rdma_efficiency_between_measured_node_counts_is_interpolated_in_log_nodes() -> None:
    by_nodes = {"2": 0.6, "4": 0.8, "8": 0.4}
    at = curves_module.rdma_efficiency_at_nodes(
        np.array([1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 18.0]), by_nodes
    )
    between = 0.6 + 0.2 * np.log2(1.5)
    assert at == pytest.approx([0.6, 0.6, between, 0.8, 0.8 - 0.4 * np.log2(1.5), 0.4, 0.4])


def test_single_node_fit_is_the_one_node_kernel_and_notify_grows_with_nodes() -> None:
    # One node: no notify step, about 37 us (dispatch) measured at small token counts; each
    # remote node adds its count exchange (the notify step alone: 31 / 57 / 69 us on 2 / 4 / 8).
    for direction in ("dispatch", "combine"):
        params = _normal_fit()[direction]
        assert 30e-6 < params["latency_s"] < 70e-6
        assert 5e-6 < params["latency_per_remote_node_s"] < 30e-6
        assert params["nvlink_efficiency"] < 1.0
        assert max(params["rdma_efficiency_by_nodes"].values()) < 1.0


def _inference_normal_s(options: EstimateOptions | None = None) -> float:
    """A prefill's DeepEP normal dispatch and combine under ``options`` (default: uniform
    routing, as DeepEP's measured kernels ran)."""
    table = table_from_columns(
        batch_size=1,
        phase=PHASE_CODES["prefill"],
        a2a_backend=A2A_BACKEND_CODES["normal"],
        dp=32,
        ep=32,
    )
    workload = Inference(
        prompt_tokens=1024, output_tokens=1, weight_dtype="fp8", serving_engine="trtllm"
    )
    options = options or EstimateOptions(expert_load_skew=0.0)
    s = _setup(model=DSV3, cluster=H100_4_NODES, workload=workload, table=table, options=options)
    return float(_deepep_expert_comm(s, np.array([RANK_TOKENS]), decode=False)[0])


def test_inference_normal_kernels_take_the_fitted_time() -> None:
    # FP8 experts: FP8 dispatch (1 byte), BF16 combine (2 bytes)
    by_hand = _by_hand("dispatch", 1.0, RANK_TOKENS) + _by_hand("combine", 2.0, RANK_TOKENS)
    assert _inference_normal_s() == pytest.approx(by_hand, rel=1e-9)


def test_real_traffic_skew_lengthens_the_busiest_ranks_transfers() -> None:
    """Real traffic's expert-load skew (``_routing_skew``) adds the busiest rank's load over
    uniform routing's, which the fitted kernels already ran: its bytes grow by that ratio."""
    skew = eplb_skew()
    real = _inference_normal_s(EstimateOptions())
    mean = RANK_TOKENS * 8  # top-8 (token, expert) assignments per rank
    ratio = (1.0 + predicted_excess(ep=32, mean_load=mean, skew=skew)) / (
        1.0 + predicted_excess(ep=32, mean_load=mean, skew=0.0)
    )
    assert ratio > 1.0
    by_hand = _by_hand("dispatch", ratio, RANK_TOKENS) + _by_hand(
        "combine", 2.0 * ratio, RANK_TOKENS
    )
    assert real == pytest.approx(by_hand, rel=1e-9)
    assert real > _inference_normal_s()


def _training_forward_s() -> tuple[object, float]:
    ctx = training_context(
        model=DSV3,
        cluster=get_preset("dgx-h100", num_nodes=32),
        workload=Training(sequence_length_tokens=4096, global_batch_sequences=512),
        table=configs_to_table([ParallelConfig(dp=32, pp=8, ep=32, recompute="none")]),
        options=EstimateOptions(calibration=Calibration(), expert_dispatcher="deepep"),
    )
    return ctx, float(collective_times(ctx).ep_exchange[0])


def test_training_deepep_dispatcher_takes_the_fitted_time() -> None:
    ctx, forward = _training_forward_s()
    tokens = float(np.asarray(ctx.moe_tokens * ctx.options.routing_imbalance).ravel()[0])
    by_hand = _by_hand("dispatch", 2.0, tokens) + _by_hand("combine", 2.0, tokens)
    assert forward == pytest.approx(by_hand, rel=1e-9)


def test_without_a_fit_normal_kernels_fall_back_to_the_topology(monkeypatch) -> None:
    _without_normal_fit(monkeypatch)
    assert (
        deepep_normal_s(
            direction="dispatch", intra_bytes=1.0, inter_bytes=1.0, nodes=2.0, cluster=None
        )
        is None
    )
    ctx, forward = _training_forward_s()
    tokens = ctx.moe_tokens * ctx.options.routing_imbalance
    topology = 2.0 * expert_dispatch_time_s(
        cluster=ctx.cluster,
        calibration=ctx.calibration,
        hidden_size=DSV3.hidden_size,
        top_k=8,
        ep=32.0,
        etp=1.0,
        ep_per_node=ctx.local["ep"],
        rank_tokens=tokens,
        element_bytes=2.0,
        node_dedup=True,
    )
    assert forward == pytest.approx(float(np.asarray(topology).ravel()[0]), rel=1e-12)
    # inference: the slower tier as a point-to-point transfer over the calibrated efficiency
    calibration = _setup(
        model=DSV3,
        cluster=H100_4_NODES,
        workload=Inference(prompt_tokens=1, output_tokens=1, serving_engine="trtllm"),
        table=table_from_columns(batch_size=1, dp=32, ep=32),
        options=EstimateOptions(),
    ).calibration
    token_bytes = RANK_TOKENS * DSV3.hidden_size
    seconds = 0.0
    for element_bytes in (1.0, 2.0):
        rdma = token_bytes * element_bytes * 3.0 * (1.0 - 0.75**8)
        nvlink = token_bytes * element_bytes * 4.0 * 7.0 * (1.0 - (31.0 / 32.0) ** 8)
        seconds += max(
            float(
                collective_time_s(
                    cluster=H100_4_NODES,
                    op="send_recv",
                    group_size=2.0,
                    ranks_per_node=local,
                    message_bytes=message,
                    calibration=calibration,
                )
            )
            for local, message in ((2.0, nvlink), (1.0, rdma))
        )
    assert _inference_normal_s() == pytest.approx(seconds, rel=1e-9)
