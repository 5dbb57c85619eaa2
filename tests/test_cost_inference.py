"""Inference cost model: invariants, monotonicity, batch choice, layouts, disaggregation."""

from __future__ import annotations

import numpy as np
import pytest

from autoparallel import get_model
from cost_model import (
    CostBreakdown,
    EstimateOptions,
    InfeasiblePlanError,
    Inference,
    ParallelConfig,
    PoolConfig,
    ServingConfig,
    disaggregated_split,
    estimate,
    estimate_inference_table,
    sglang_uses_deepep,
    table_from_columns,
)
from cost_model._inference_ops import (
    attention_flops_per_key,
    kv_bytes_per_sequence_layer,
    mean_attended_between,
)
from cost_model._reasons import REASON_CODES
from cost_model._serving_columns import KV_DTYPE_CODES, PHASE_CODES
from topology import get_preset

REF = get_model("ref-3t-moe")
DSV3 = get_model("deepseek-v3")
LLAMA = get_model("llama-3.1-405b")
H100_1024 = get_preset("dgx-h100", num_nodes=128)
WORKLOAD = Inference(prompt_tokens=8192, output_tokens=1024, weight_dtype="fp8")


def _table(rows: int = 64, seed: int = 0, **fixed) -> dict[str, np.ndarray]:
    """Random legal-looking layouts of ref-3t-moe on up to 1024 devices."""
    rng = np.random.default_rng(seed)
    tp = 2 ** rng.integers(0, 4, rows)
    dp = 2 ** rng.integers(2, 7, rows)
    columns = dict(
        dp=dp,
        tp=tp,
        pp=2 ** rng.integers(0, 3, rows),
        ep=np.minimum(dp * tp, 2 ** rng.integers(0, 9, rows)),
        attention_data_parallel=rng.integers(0, 2, rows).astype(bool),
        batch_size=rng.integers(1, 64, rows),
        phase=rng.integers(0, 3, rows),
        two_batch_overlap=rng.integers(0, 2, rows).astype(bool),
    )
    columns.update(fixed)
    return table_from_columns(**columns)


def _run(table, *, model=REF, cluster=H100_1024, workload=WORKLOAD, options=None):
    return estimate_inference_table(
        model=model, cluster=cluster, workload=workload, table=table, options=options
    )


def test_parts_sum_to_totals_and_inference_has_no_training_parts() -> None:
    out = _run(_table())
    time_parts = [k for k in out if k.startswith("time.")]
    memory_parts = [k for k in out if k.startswith("memory.")]
    np.testing.assert_allclose(sum(out[k] for k in time_parts), out["step_time_s"], rtol=1e-12)
    np.testing.assert_allclose(
        sum(out[k] for k in memory_parts), out["memory_per_device_bytes"], rtol=1e-12
    )
    for forbidden in ("backward", "optimizer", "gradient", "recompute", "bubble", "dp_comm"):
        assert not [k for k in out if forbidden in k], forbidden
    assert all(np.all(out[k] >= 0) for k in time_parts + memory_parts)


def test_single_config_breakdown_has_no_backward_optimizer_or_gradients() -> None:
    config = ParallelConfig(dp=128, tp=8, ep=256, attention_data_parallel=True)
    breakdown = estimate(REF, H100_1024, WORKLOAD, config, two_batch_overlap=True)
    assert isinstance(breakdown, CostBreakdown)
    assert set(breakdown.memory_bytes) == {
        "weights",
        "kv_cache",
        "activations",
        "comm_buffers",
        "fragmentation",
    }
    assert breakdown.ttft_s > 0 and breakdown.tpot_s > 0 and breakdown.batch_size >= 1
    assert breakdown.tokens_per_s_per_device > 0
    assert breakdown.memory_per_device_bytes <= breakdown.memory_capacity_bytes
    assert sum(breakdown.time_s.values()) == pytest.approx(breakdown.step_time_s)


def test_ep1_has_no_all_to_all_and_tp1_no_tp_traffic() -> None:
    table = _table(rows=48, seed=1)
    out = _run(table)
    for phase in ("prefill", "decode"):
        ep_traffic = out[f"time.{phase}_ep_comm"] + out[f"hidden.{phase}_ep_comm"]
        tp_traffic = out[f"time.{phase}_tp_comm"] + out[f"hidden.{phase}_tp_comm"]
        assert np.all(ep_traffic[table["ep"] == 1] == 0)
        assert np.all(tp_traffic[table["tp"] == 1] == 0)
    decode_rows = table["phase"] != PHASE_CODES["prefill"]
    # SGLang (the workload's engine) runs DeepEP only where ep spans its instance; with
    # experts inside a replica it moves no tokens (tests/test_sglang_expert_parallel.py)
    deepep = sglang_uses_deepep(tp=table["tp"], ep=table["ep"], etp=table["etp"])
    decode_ep = out["time.decode_ep_comm"] + out["hidden.decode_ep_comm"]
    assert np.all(decode_ep[decode_rows & deepep] > 0) and np.any(decode_rows & deepep)
    assert np.all(decode_ep[~deepep] == 0) and np.any((table["ep"] > 1) & ~deepep)
    tensor_parallel_attention = (table["tp"] > 1) & ~table["attention_data_parallel"]
    assert np.all(
        (out["time.decode_tp_comm"] + out["hidden.decode_tp_comm"])[
            decode_rows & tensor_parallel_attention
        ]
        > 0
    )


def test_more_bandwidth_is_never_slower() -> None:
    table = _table(rows=64, seed=2)
    device = H100_1024.device
    faster_memory = H100_1024.model_copy(
        update={
            "device": device.model_copy(
                update={"memory_bandwidth_bytes_per_s": 2 * device.memory_bandwidth_bytes_per_s}
            )
        }
    )
    network = H100_1024.inter_node
    faster_network = H100_1024.model_copy(
        update={
            "inter_node": network.model_copy(
                update={"bandwidth_bytes_per_s": 2 * network.bandwidth_bytes_per_s}
            )
        }
    )
    base = _run(table)
    decode = table["phase"] == PHASE_CODES["decode"]
    for cluster in (faster_memory, faster_network):
        fast = _run(table, cluster=cluster)
        assert np.all(fast["step_time_s"] <= base["step_time_s"] * (1 + 1e-12))
    fast = _run(table, cluster=faster_memory)
    assert np.all(
        fast["step_time_s"][decode] < base["step_time_s"][decode]
    )  # decode is memory-bound


def test_vectorized_cache_bytes_match_the_model_spec() -> None:
    variants = {"full": {}, "sliding_window": {"window_tokens": 4096}, "linear": {}}
    for variant, extra in variants.items():
        model = REF.model_copy(
            update={"attention": REF.attention.model_copy(update={"variant": variant, **extra})}
        )
        for context in (1000, 4096, 100_000):
            per_layer = kv_bytes_per_sequence_layer(
                model, np.array([float(context)]), 1.0, block_tokens=1
            )
            assert model.num_layers * per_layer[0] == pytest.approx(
                model.kv_cache_bytes(context, "fp8")
            )


def test_fp8_kv_halves_kv_bytes_and_int4_quarters_them() -> None:
    table = _table(rows=16, seed=3)
    kv = {
        name: _run({**table, "kv_dtype": np.full(16, KV_DTYPE_CODES[name])})["memory.kv_cache"]
        for name in ("bf16", "fp8", "int4")
    }
    np.testing.assert_allclose(kv["fp8"], kv["bf16"] / 2)
    np.testing.assert_allclose(kv["int4"], kv["bf16"] / 4)


def test_attention_dp_removes_mla_kv_duplication_but_gqa_tp_splits_heads() -> None:
    # Eight sequences on one node of 8 ranks: one TP replica of 8 sequences, or 8 DP replicas of 1.
    tp_table = table_from_columns(tp=8, ep=8, batch_size=8, phase=PHASE_CODES["decode"])
    dp_table = table_from_columns(
        tp=8, ep=8, batch_size=1, phase=PHASE_CODES["decode"], attention_data_parallel=True
    )
    tp_kv, dp_kv = _run(tp_table)["memory.kv_cache"], _run(dp_table)["memory.kv_cache"]
    assert tp_kv[0] == pytest.approx(8 * dp_kv[0])  # MLA latent copied on every tp rank
    llama = Inference(prompt_tokens=8192, output_tokens=1024)
    tp_gqa = _run(table_from_columns(tp=8, batch_size=8, phase=2), model=LLAMA, workload=llama)[
        "memory.kv_cache"
    ]
    dp_gqa = _run(
        table_from_columns(tp=8, batch_size=1, phase=2, attention_data_parallel=True),
        model=LLAMA,
        workload=llama,
    )["memory.kv_cache"]
    assert tp_gqa[0] == pytest.approx(dp_gqa[0])  # 8 KV heads split over tp=8: no duplication


def test_redundant_experts_cost_exactly_their_weights() -> None:
    base = table_from_columns(dp=32, ep=32, batch_size=4, phase=1)
    plus = {**base, "num_redundant_experts": np.array([32])}
    extra = _run(plus)["memory.weights"][0] - _run(base)["memory.weights"][0]
    expert_bytes = REF.ffn_parameters(REF.moe.expert_ffn_hidden_size) * 1.0  # fp8
    assert extra == pytest.approx(REF.num_moe_layers * (32 / 32) * expert_bytes)


def test_ttft_and_tpot_grow_with_prompt_and_batch() -> None:
    config = dict(dp=16, tp=8, ep=128, attention_data_parallel=True, two_batch_overlap=True)
    prompts = np.array([1024, 4096, 16384, 65536])
    by_prompt = estimate_inference_table(
        model=REF,
        cluster=H100_1024,
        workload=WORKLOAD,
        table=table_from_columns(length=4, batch_size=2, **config),
        prompt_tokens=prompts,
    )
    assert np.all(np.diff(by_prompt["ttft_s"]) > 0) and np.all(np.diff(by_prompt["tpot_s"]) > 0)
    batches = np.array([1, 2, 8, 32, 128])
    by_batch = _run(table_from_columns(batch_size=batches, phase=PHASE_CODES["decode"], **config))
    assert np.all(np.diff(by_batch["tpot_s"]) > 0)
    per_device = by_batch["tokens_per_s_per_device"]
    assert per_device[-1] > 20 * per_device[0]  # decode is memory-bound: batching pays


def test_monotonic_over_random_layouts() -> None:
    rows, prompts = 32, np.array([2048, 8192, 32768])
    table = _table(rows=rows, seed=5)
    repeated = {name: np.repeat(column, prompts.size) for name, column in table.items()}
    out = estimate_inference_table(
        model=REF,
        cluster=H100_1024,
        workload=WORKLOAD,
        table=repeated,
        prompt_tokens=np.tile(prompts, rows),
    )
    ttft = out["ttft_s"].reshape(rows, prompts.size)
    has_ttft = table["phase"] != PHASE_CODES["decode"]
    assert np.all(np.diff(ttft[has_ttft], axis=1) > 0)
    step = out["step_time_s"].reshape(rows, prompts.size)
    assert np.all(np.diff(step, axis=1) > 0)
    bigger = _run({**table, "batch_size": 2 * table["batch_size"]})
    assert np.all(bigger["step_time_s"] > _run(table)["step_time_s"])


def test_more_tp_means_fewer_weight_bytes_per_device() -> None:
    table = table_from_columns(dp=[64, 32, 16, 8], tp=[1, 2, 4, 8], ep=64, batch_size=1, phase=2)
    weights = _run(table)["memory.weights"]
    assert np.all(np.diff(weights) < 0)


def test_measured_routing_imbalance_slows_the_experts() -> None:
    table = table_from_columns(dp=32, ep=32, batch_size=4, phase=1)
    even = _run(table, options=EstimateOptions(expert_load_skew=0.0))
    skewed = _run(table, options=EstimateOptions(routing_imbalance=1.5))
    assert skewed["time.prefill_compute"][0] > 1.2 * even["time.prefill_compute"][0]
    assert skewed["time.prefill_attention"][0] == even["time.prefill_attention"][0]


def test_prefix_cache_hits_skip_prefill_compute() -> None:
    table = table_from_columns(
        dp=16, tp=8, ep=128, attention_data_parallel=True, batch_size=4, phase=1
    )
    cold = _run(table)
    warm = _run(table, workload=WORKLOAD.model_copy(update={"prefix_cache_hit_rate": 0.5}))
    assert warm["time.prefill_compute"][0] < 0.6 * cold["time.prefill_compute"][0]
    assert (
        warm["prefill_tokens_per_s_per_device"][0]
        > 1.5 * cold["prefill_tokens_per_s_per_device"][0]
    )
    assert (
        warm["memory.kv_cache"][0] == cold["memory.kv_cache"][0]
    )  # the whole prompt is cached either way


def test_prompt_length_spread_prices_prefill_attention_at_the_token_weighted_mean() -> None:
    """A token's causal context grows with its request's length: a mix of prompts with
    coefficient of variation cv costs E[P^2]/E[P] = P(1 + cv^2) keys per token; nothing else moves."""
    table = table_from_columns(
        dp=16, tp=8, ep=128, attention_data_parallel=True, batch_size=4, phase=0
    )
    even = _run(table)
    for cv in (0.5, 1.0):
        spread = _run(table, workload=WORKLOAD.model_copy(update={"prompt_tokens_cv": cv}))
        ratio = spread["time.prefill_attention"][0] / even["time.prefill_attention"][0]
        keys = mean_attended_between(
            REF, 1.0, WORKLOAD.prompt_tokens * (1 + cv**2)
        ) / mean_attended_between(REF, 1.0, WORKLOAD.prompt_tokens)
        assert ratio == pytest.approx(float(keys), rel=0.02) and ratio > 1.2
        for part in (
            "time.prefill_compute",
            "time.decode_attention",
            "time.decode_compute",
            "memory_per_device_bytes",
        ):
            assert spread[part][0] == even[part][0], part
        assert spread["ttft_s"][0] > even["ttft_s"][0]
    with pytest.raises(ValueError, match="prompt_tokens_cv"):
        Inference(prompt_tokens=100, output_tokens=10, prompt_tokens_cv=-0.1)


def test_output_length_spread_lengthens_the_mean_decode_context() -> None:
    """Decoding tokens of a mix of output lengths sit at P + (E[O^2]/E[O] + 1) / 2 on average."""
    table = table_from_columns(
        dp=16, tp=8, ep=128, attention_data_parallel=True, batch_size=4, phase=2
    )
    even = _run(table)
    spread = _run(table, workload=WORKLOAD.model_copy(update={"output_tokens_cv": 1.0}))
    longer = _run(
        table, workload=WORKLOAD.model_copy(update={"output_tokens": 2 * WORKLOAD.output_tokens})
    )
    for part in ("time.decode_attention", "memory.kv_cache", "tpot_s"):
        assert spread[part][0] == pytest.approx(longer[part][0], rel=1e-9), (
            part
        )  # O (1 + 1^2) = 2 O
        assert spread[part][0] > even[part][0], part
    assert spread["time.decode_compute"][0] == even["time.decode_compute"][0]


def test_paged_blocks_round_the_cache_up() -> None:
    table = table_from_columns(dp=64, ep=64, batch_size=1, phase=1)
    odd = Inference(prompt_tokens=1000, output_tokens=10, kv_block_tokens=256)
    exact = Inference(prompt_tokens=1024, output_tokens=10, kv_block_tokens=256)
    assert (
        _run(table, workload=odd)["memory.kv_cache"][0]
        == _run(table, workload=exact)["memory.kv_cache"][0]
    )
    per_layer = (
        REF.kv_cache_bytes(1024, "bf16") / 1024 * 1024 / REF.num_layers
    )  # bytes of 1024 tokens, one layer
    assert _run(table, workload=exact)["memory.kv_cache"][0] == pytest.approx(
        REF.num_layers * per_layer
    )


def test_largest_batch_fits_and_one_more_does_not() -> None:
    table = _table(rows=24, seed=4, batch_size=np.zeros(24, dtype=np.int64))
    out = _run(table)
    fits = out["memory.weights"] < out["memory_capacity_bytes"]
    assert fits.any()
    assert np.all(out["memory_per_device_bytes"][fits] <= out["memory_capacity_bytes"][fits])
    more = _run({**table, "batch_size": out["batch_size"] + 1})
    # a pool runs what its memory holds; a colocated engine admits what its default memory
    # fraction's KV pool holds (``_inference_load._engine_admits``), which the memory also holds
    pool = fits & (np.asarray(table["phase"]) != PHASE_CODES["both"])
    assert pool.any()
    assert np.all(more["memory_per_device_bytes"][pool] > more["memory_capacity_bytes"][pool])


def test_tpot_slo_picks_the_largest_batch_that_meets_it() -> None:
    slo = 0.05  # the per-kernel floor (serving profile) puts batch 1 of this layout near 39 ms
    workload = WORKLOAD.model_copy(update={"tpot_slo_s": slo})
    table = table_from_columns(
        dp=128, tp=8, ep=256, attention_data_parallel=True, phase=2, two_batch_overlap=True
    )
    out = _run(table, workload=workload)
    assert out["feasible"][0] and out["tpot_s"][0] <= slo
    one_more = _run({**table, "batch_size": out["batch_size"] + 1}, workload=workload)
    assert one_more["tpot_s"][0] > slo and one_more["reason"][0] == REASON_CODES["tpot_slo"]


def test_pipeline_keeps_stages_in_flight() -> None:
    base = table_from_columns(dp=16, tp=8, ep=128, batch_size=8, phase=2)
    piped = table_from_columns(dp=16, tp=8, pp=4, ep=128, batch_size=8, phase=2)
    one, four = _run(base), _run(piped)
    assert four["memory.weights"][0] < 0.35 * one["memory.weights"][0]
    # Four micro-batches in flight over a quarter of the layers each: the same cache per device.
    assert four["memory.kv_cache"][0] == pytest.approx(one["memory.kv_cache"][0])
    assert four["time.decode_pp_comm"][0] > 0 and one["time.decode_pp_comm"][0] == 0


def test_mla_decode_uses_the_absorbed_form() -> None:
    a = DSV3.attention
    assert attention_flops_per_key(DSV3, decode=True) == 2 * 128 * (2 * 512 + 64)
    assert attention_flops_per_key(DSV3, decode=False) == 2 * 128 * (192 + 128)
    assert a.kv_lora_rank == 512
    # Mean keys of positions 5..8 under full attention is their mean position.
    assert mean_attended_between(DSV3, 5.0, 8.0) == pytest.approx(6.5)


def test_infeasible_plan_and_bad_input_raise() -> None:
    with pytest.raises(InfeasiblePlanError, match="largest part is weights"):
        estimate(
            REF,
            get_preset("dgx-h100"),
            WORKLOAD,
            ParallelConfig(dp=8, ep=8, attention_data_parallel=True),
        )
    with pytest.raises(InfeasiblePlanError, match="TPOT SLO"):
        estimate(
            REF,
            H100_1024,
            WORKLOAD.model_copy(update={"tpot_slo_s": 1e-4}),
            ParallelConfig(dp=128, tp=8, ep=256),
        )
    with pytest.raises(ValueError, match="kv_dtype"):
        _run({**table_from_columns(dp=64, ep=64), "kv_dtype": np.array([9])})
    with pytest.raises(ValueError, match="extra"):
        ServingConfig(batch=4)
    with pytest.raises(ValueError, match=r"batch_size \(-1\) must be >= 0"):
        _run(table_from_columns(dp=64, ep=64, batch_size=-1))


def test_disaggregation_balances_the_two_pools() -> None:
    workload = WORKLOAD.model_copy(update={"tpot_slo_s": 0.05})
    prefill = PoolConfig(
        config=ParallelConfig(dp=128, ep=128), serving=ServingConfig(two_batch_overlap=True)
    )
    decode = PoolConfig(
        config=ParallelConfig(dp=256, ep=256), serving=ServingConfig(two_batch_overlap=True)
    )
    split = disaggregated_split(
        model=REF, cluster=H100_1024, workload=workload, prefill=prefill, decode=decode
    )
    assert split.prefill_devices + split.decode_devices <= 1024
    assert split.prefill_devices % 128 == 0 and split.decode_devices % 256 == 0
    rates = (
        split.prefill_units * split.prefill_requests_per_s_per_unit,
        split.decode_units * split.decode_requests_per_s_per_unit,
    )
    assert split.requests_per_s == pytest.approx(min(rates))
    # One unit fewer on either side serves less: the split is rate-matched.
    assert (split.prefill_units - 1) * split.prefill_requests_per_s_per_unit < split.requests_per_s
    assert (split.decode_units - 1) * split.decode_requests_per_s_per_unit < split.requests_per_s
    cache_bytes = REF.kv_cache_bytes(workload.prompt_tokens, "bf16")
    assert split.kv_transfer_s > cache_bytes / H100_1024.inter_node.bandwidth_bytes_per_s
    # TTFT under load: overhead, the wait for the running prefill pass, the pass, the transfer and
    # the wait to join the decode batch (half a decode step).
    parts = (
        split.prefill_ttft_s
        + split.kv_transfer_s
        + split.prefill_queue_s
        + split.decode_admission_s
    )
    assert (
        split.ttft_s == pytest.approx(parts + split.request_overhead_s) and split.prefill_ttft_s > 0
    )
    assert (
        0 < split.prefill_queue_s <= split.prefill_ttft_s / 2
        and split.decode_admission_s == pytest.approx(split.tpot_s / 2)
    )
    assert 0 < split.kv_transfer_network_fraction < 1
    # Under an offered rate every device serves it, each pool at the load the rate puts on its
    # units: half the saturated rate waits less for the running prefill pass and steps faster.
    fixed = workload.model_copy(update={"request_rate_per_s": split.requests_per_s / 2})
    half = disaggregated_split(
        model=REF, cluster=H100_1024, workload=fixed, prefill=prefill, decode=decode
    )
    assert half.prefill_devices + half.decode_devices == 1024
    assert half.requests_per_s == pytest.approx(split.requests_per_s / 2)
    assert half.prefill_queue_s < split.prefill_queue_s and half.ttft_s < split.ttft_s
    assert half.tpot_s <= split.tpot_s
    with pytest.raises(InfeasiblePlanError, match="devices"):
        disaggregated_split(
            model=REF,
            cluster=H100_1024,
            workload=workload,
            prefill=prefill,
            decode=decode,
            num_devices=256,
        )


def test_hidden_prefill_traffic_slows_compute_by_its_sm_share() -> None:
    """Two-batch-overlap prefill: compute pays COMMUNICATION_SM_FRACTION of the hidden all-to-all
    time; a faster network hides less and the compute part shrinks by exactly that share (two
    networks fast enough that every stage of the other micro-batch hides its traffic)."""
    from cost_model._inference_ops import COMMUNICATION_SM_FRACTION

    table = table_from_columns(
        dp=32, ep=32, attention_data_parallel=True, batch_size=4, phase=1, two_batch_overlap=True
    )
    h800 = get_preset("hgx-h800", num_nodes=4)
    network = h800.inter_node

    def scaled(factor: float):
        return h800.model_copy(
            update={
                "inter_node": network.model_copy(
                    update={"bandwidth_bytes_per_s": factor * network.bandwidth_bytes_per_s}
                )
            }
        )

    # 1.25x and 1.5x the H800's RDMA: every stage hides its traffic, which is still RDMA-bound
    # at 1.25x (DeepEP's 4-node RDMA efficiency, 0.85 / 0.84 of the link) and NVLink-bound at 1.5x
    cluster = scaled(1.25)
    base, fast = (_run(table, model=DSV3, cluster=c) for c in (cluster, scaled(1.5)))
    hidden_drop = base["hidden.prefill_ep_comm"][0] - fast["hidden.prefill_ep_comm"][0]
    assert (
        hidden_drop > 0
        and base["time.prefill_ep_comm"][0] == fast["time.prefill_ep_comm"][0] == 0.0
    )
    compute_drop = base["time.prefill_compute"][0] - fast["time.prefill_compute"][0]
    assert compute_drop == pytest.approx(COMMUNICATION_SM_FRACTION * hidden_drop, rel=1e-9)
    decode = _run(
        table_from_columns(
            dp=32,
            ep=32,
            attention_data_parallel=True,
            batch_size=64,
            phase=2,
            two_batch_overlap=True,
        ),
        model=DSV3,
        cluster=cluster,
    )
    decode_fast = _run(
        table_from_columns(
            dp=32,
            ep=32,
            attention_data_parallel=True,
            batch_size=64,
            phase=2,
            two_batch_overlap=True,
        ),
        model=DSV3,
        cluster=scaled(4.0),
    )
    assert (
        decode["time.decode_compute"][0] == decode_fast["time.decode_compute"][0]
    )  # low-latency kernels hold no SM


def test_memory_passes_follow_the_attention_form_the_cast_and_the_shard() -> None:
    from cost_model._inference_ops import (
        attention_side_bytes,
        moe_token_bytes,
        routed_bytes_per_assignment,
    )

    h, a = DSV3.hidden_size, DSV3.attention
    prefill = attention_side_bytes(DSV3, decode=False, act=2.0, cast=1.0, shard=1.0)
    decode = attention_side_bytes(DSV3, decode=True, act=2.0, cast=1.0, shard=1.0)
    # explicit prefill re-expands per-head keys and values; absorbed decode moves latent-wide ones
    assert (
        decode - prefill
        == 2.0
        * a.num_heads
        * (2 * a.kv_lora_rank + a.qk_rope_head_dim - a.qk_head_dim - a.value_head_dim)
        * 2.0
    )
    gqa = [
        attention_side_bytes(LLAMA, decode=d, act=2.0, cast=2.0, shard=8.0) for d in (False, True)
    ]
    assert gqa[0] == gqa[1]  # one form for both phases
    by_shard = [
        attention_side_bytes(DSV3, decode=False, act=2.0, cast=1.0, shard=t)
        for t in (1.0, 2.0, 4.0)
    ]
    assert (
        by_shard[0] - by_shard[1] == pytest.approx(2 * (by_shard[1] - by_shard[2]))
        and by_shard[2] < by_shard[1]
    )  # heads split over tp
    bf16 = attention_side_bytes(DSV3, decode=False, act=2.0, cast=2.0, shard=1.0)
    assert (
        bf16 < prefill
    )  # no cast kernel before the output projection outweighs the wider GEMM inputs
    routed = routed_bytes_per_assignment(DSV3, act=2.0, cast=1.0, etp=1.0)
    assert (
        3 * h * 1.0 + 3 * h * 2.0
        < routed
        < 3 * h * 1.0 + 3 * h * 2.0 + 5 * DSV3.moe.expert_ffn_hidden_size * 2.0
    )
    assert moe_token_bytes(DSV3, act=2.0, cast=1.0, shard=1.0) > 2 * DSV3.moe.top_k * h * 2.0
