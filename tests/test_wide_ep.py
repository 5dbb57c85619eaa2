"""Wide expert parallelism: redundant slots make any ep legal, and the serving search reaches it."""

from __future__ import annotations

import numpy as np
import pytest

from autoparallel import get_model
from cost_model import (
    Inference,
    ParallelConfig,
    check_parallel_config,
    estimate_inference_table,
    expert_all_to_all_bytes,
    table_from_columns,
)
from cost_model._rules import minimum_redundant_experts
from cost_model._serving_columns import A2A_BACKEND_CODES, PHASE_CODES
from search._space import SearchSpace, config_from_row, row_extras
from topology import get_preset

REF = get_model("ref-3t-moe")
DSV3 = get_model("deepseek-v3")


def test_deepseek_eplb_slot_counts() -> None:
    assert minimum_redundant_experts(num_experts=256, ep=72) == 32  # 288 = 4 x 72
    assert minimum_redundant_experts(num_experts=256, ep=144) == 32
    assert minimum_redundant_experts(num_experts=256, ep=32) == 0
    assert minimum_redundant_experts(num_experts=768, ep=72) == 24


def test_ep_need_not_divide_experts_when_redundant_slots_fill_the_ranks() -> None:
    config = ParallelConfig(dp=144, ep=144)
    check_parallel_config(config, DSV3, num_redundant_experts=32)
    with pytest.raises(
        ValueError, match=r"num_routed_experts \(256\) must be divisible by ep \(144\)"
    ):
        check_parallel_config(config, DSV3)
    with pytest.raises(
        ValueError,
        match=r"num_routed_experts \+ num_redundant_experts \(260\) must be divisible by ep \(144\)",
    ):
        check_parallel_config(config, DSV3, num_redundant_experts=4)


def test_serving_search_on_nvl72_offers_ep72_with_redundant_slots() -> None:
    workload = Inference(prompt_tokens=4096, output_tokens=1024, weight_dtype="fp8")
    space = SearchSpace(model=REF, workload=workload, world_size=72, devices_per_node=72)
    assert 72 in space.mesh["ep"].tolist()
    table = space.expand(np.flatnonzero(space.mesh["ep"] == 72))
    for index in range(len(table["dp"])):
        config, extras = config_from_row(table, index), row_extras(table, index)
        assert (768 + extras["num_redundant_experts"]) % config.ep == 0
        check_parallel_config(
            config, REF, 72, num_redundant_experts=extras["num_redundant_experts"]
        )


def test_training_search_keeps_ep_dividing_the_experts() -> None:
    from cost_model import Training

    workload = Training(sequence_length_tokens=4096, global_batch_tokens=2**22)
    space = SearchSpace(model=REF, workload=workload, world_size=72, devices_per_node=72)
    assert all(768 % ep == 0 for ep in space.mesh["ep"].tolist())


def test_low_latency_all_to_all_sends_every_copy_and_normal_deduplicates_per_node() -> None:
    cluster = get_preset("dgx-h200", num_nodes=8)
    workload = Inference(prompt_tokens=2048, output_tokens=256, weight_dtype="fp8")
    columns = {
        "dp": 64,
        "tp": 1,
        "ep": 64,
        "batch_size": np.array([16, 16]),
        "phase": PHASE_CODES["decode"],
    }
    backends = np.array([A2A_BACKEND_CODES["normal"], A2A_BACKEND_CODES["low_latency"]])
    out = estimate_inference_table(
        model=DSV3,
        cluster=cluster,
        workload=workload,
        table=table_from_columns(length=2, a2a_backend=backends, **columns),
    )
    ep_comm = out["time.decode_ep_comm"] + out["hidden.decode_ep_comm"]
    # 16 tokens a rank: latency, not bytes, sets the time. The normal kernels' notify step grows
    # with the 7 remote nodes (DeepEP's table: about 300 us a dispatch at 128 tokens on 8 nodes),
    # which is why decode runs the low-latency kernels.
    assert ep_comm[0] > ep_comm[1] > 0
    # the bytes: 8 copies over RDMA vs at most one per remote node
    low_latency, normal = (
        expert_all_to_all_bytes(
            rank_tokens=16.0,
            hidden_size=DSV3.hidden_size,
            element_bytes=1.0,
            copies=8.0,
            ep=64.0,
            local=8.0,
            node_dedup=node_dedup,
        )[1]
        for node_dedup in (False, True)
    )
    assert low_latency == pytest.approx(16.0 * DSV3.hidden_size * 8.0 * 56.0 / 64.0)
    assert normal == pytest.approx(16.0 * DSV3.hidden_size * 7.0 * (1.0 - (7.0 / 8.0) ** 8))


def test_estimate_cli_fills_ep72_with_the_fewest_redundant_slots(capsys) -> None:
    import json

    from autoparallel.cli import main

    argv = [
        "estimate",
        "--inference",
        "--cluster",
        "gb200-nvl72",
        "--nodes",
        "1",
        "--tp",
        "1",
        "--pp",
        "1",
        "--ep",
        "72",
        "--batch-size",
        "4",
        "--json",
    ]
    assert main(argv) == 0
    wide = json.loads(capsys.readouterr().out)
    assert main([*argv, "--num-redundant-experts", "96"]) == 0
    more = json.loads(capsys.readouterr().out)
    expert_bytes = REF.num_moe_layers * REF.ffn_parameters(
        REF.moe.expert_ffn_hidden_size
    )  # one fp8 slot per layer
    extra = more["memory_bytes"]["weights"] - wide["memory_bytes"]["weights"]
    assert extra == pytest.approx(expert_bytes * (96 - 24) / 72)
    assert (
        main([*argv[:-1], "--num-redundant-experts", "0"]) == 2
    )  # 768 experts do not split over 72 ranks
