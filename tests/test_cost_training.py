"""Training step time and memory: parts sum to totals, physical invariants, cited formulas."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from autoparallel import get_model
from cost_model import (
    CostBreakdown,
    EstimateOptions,
    InfeasiblePlanError,
    Inference,
    ParallelConfig,
    Training,
    configs_to_table,
    estimate,
    estimate_table,
    table_row,
)
from cost_model._options import Calibration
from cost_model._reasons import MEMORY_PARTS, REASON_CODES
from cost_model._training import TRAINING_TIME_PARTS
from cost_model._validation_cases import gpt_model
from topology import get_preset

REF = get_model("ref-3t-moe")
CLUSTER_1024 = get_preset("dgx-h200", num_nodes=128)
TRAINING = Training(sequence_length_tokens=4096, global_batch_tokens=4096 * 4096)
NEUTRAL = EstimateOptions(calibration=Calibration())


def random_legal_table(model, world: int, rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random legal configs of ``model`` on ``world`` devices (rules checked one by one)."""
    rng = np.random.default_rng(seed)
    configs = []
    while len(configs) < rows:
        tp, pp, cp = (
            int(rng.choice(values)) for values in ([1, 2, 4, 8], [1, 2, 4, 8, 16], [1, 2])
        )
        dp, rest = divmod(world, tp * pp * cp)
        ep = int(rng.choice([1, 2, 8, 32, 64])) if model.moe else 1
        schedule, virtual = [
            ("1f1b", 1),
            ("gpipe", 1),
            ("zero_bubble", 1),
            ("interleaved_1f1b", 2),
        ][rng.integers(4)]
        if rest or (virtual > 1 and pp == 1):
            continue
        config = ParallelConfig(
            dp=dp,
            tp=tp,
            pp=pp,
            cp=cp,
            ep=ep,
            sequence_parallel=bool(tp > 1 and rng.integers(2)),
            zero_stage=int(rng.integers(4)),
            pipeline_schedule=schedule,
            virtual_stages=virtual,
            micro_batch_size=int(rng.choice([1, 2])),
            recompute=["none", "selective", "full"][rng.integers(3)],
        )
        try:
            config.validate_for(model, world)
        except ValueError:
            continue
        configs.append(config)
    return configs_to_table(configs)


@pytest.fixture(scope="module")
def ref_table() -> dict[str, np.ndarray]:
    return random_legal_table(REF, CLUSTER_1024.num_devices, 300)


@pytest.fixture(scope="module")
def ref_columns(ref_table) -> dict[str, np.ndarray]:
    return estimate_table(REF, CLUSTER_1024, TRAINING, ref_table)


# ------------------------------------------------------------------------------ sums and ranges
def test_time_parts_sum_to_the_step(ref_columns) -> None:
    parts = sum(ref_columns[f"time.{part}"] for part in TRAINING_TIME_PARTS)
    np.testing.assert_allclose(parts, ref_columns["step_time_s"], rtol=1e-12)
    assert all(np.all(ref_columns[f"time.{part}"] >= 0) for part in TRAINING_TIME_PARTS)
    assert all(np.all(ref_columns[name] >= 0) for name in ref_columns if name.startswith("hidden."))


def test_hidden_communication_slows_the_compute_beside_it(ref_columns) -> None:
    """Every hidden second costs s / (1 + s) of compute (s: the measured mean slowdown of
    compute under an overlapped collective, arXiv:2507.03114); none hidden, none lost."""
    from cost_model._training_dp import overlap_compute_slowdown

    s = overlap_compute_slowdown()
    assert 0.0 < s <= 0.4  # the paper's mean, below its 40% maximum
    hidden = sum(ref_columns[name] for name in ref_columns if name.startswith("hidden."))
    assert np.any(hidden > 0)
    np.testing.assert_allclose(ref_columns["time.contention"], hidden * s / (1.0 + s), rtol=1e-9)
    assert np.all(ref_columns["time.contention"][hidden == 0] == 0)


def test_distributed_optimizer_gather_hides_only_behind_a_forward() -> None:
    """Megatron-core's ``--overlap-param-gather`` waits on each bucket before its layers'
    forward, so the weight all-gather hides behind the first micro-batch's forward only: the
    16B H100 run (tp 4, dp 48) gathers for longer than one forward and shows the rest, though
    a whole micro-batch would have hidden the gather. The forward's window is its compute and
    the tensor-parallel traffic it leaves exposed on NVLink (the NIC moves the gather
    meanwhile)."""
    from cost_model._training_comm import table_collective_times
    from cost_model._training_context import training_context
    from cost_model._training_micro_batch import micro_batch_times
    from cost_model._validation import _cluster, _options, _workload
    from cost_model._validation_cases import training_cases

    (case,) = [c for c in training_cases() if (c.table, c.run) == ("megatron_readme_h100", "16B")]
    cluster = _cluster(case.hardware, case.config.world_size)
    options = _options(case, None, cluster)
    table = configs_to_table([case.config])
    ctx = training_context(
        model=case.model, cluster=cluster, workload=_workload(case), table=table, options=options
    )
    times = table_collective_times(ctx)
    mb = micro_batch_times(ctx, times)
    gather, forward = times.dp_weight_gather[0, 0], mb.forward[0, 0]
    assert forward < gather < mb.forward[0, 0] + mb.backward[0, 0]
    columns = estimate_table(case.model, cluster, _workload(case), table, options=options)
    exposed_tp = columns["time.tp_comm"][0] / ctx.num_micro_batches[0]  # one micro-batch's
    assert columns["time.dp_comm"][0] >= gather - forward - exposed_tp > 0


def test_memory_parts_sum_to_the_total(ref_columns) -> None:
    parts = sum(ref_columns[f"memory.{part}"] for part in MEMORY_PARTS)
    np.testing.assert_allclose(parts, ref_columns["memory_per_device_bytes"], rtol=1e-12)
    assert np.all(ref_columns["memory.kv_cache"] == 0)


def test_breakdown_parts_sum_and_derived_figures() -> None:
    config = ParallelConfig(
        dp=16, tp=4, pp=16, ep=32, sequence_parallel=True, zero_stage=1, recompute="selective"
    )
    breakdown = estimate(REF, CLUSTER_1024, TRAINING, config, fragmentation_fraction=0.0)
    assert sum(breakdown.time_s.values()) == pytest.approx(breakdown.step_time_s, rel=1e-12)
    assert sum(breakdown.memory_bytes.values()) == pytest.approx(
        breakdown.memory_per_device_bytes, rel=1e-12
    )
    assert breakdown.memory_bytes["fragmentation"] == 0.0
    world = config.world_size
    assert breakdown.tokens_per_s_per_device == pytest.approx(
        TRAINING.tokens_per_step / breakdown.step_time_s / world
    )
    assert 0 < breakdown.mfu < 1
    assert breakdown.bottleneck == max(breakdown.time_s, key=breakdown.time_s.get)


def test_scalar_estimate_is_the_table_row() -> None:
    config = ParallelConfig(
        dp=8, tp=8, pp=16, ep=64, sequence_parallel=True, zero_stage=1, recompute="full"
    )
    breakdown = estimate(REF, CLUSTER_1024, TRAINING, config)
    columns = estimate_table(REF, CLUSTER_1024, TRAINING, configs_to_table([config]))
    assert isinstance(breakdown, CostBreakdown)
    assert breakdown.step_time_s == columns["step_time_s"][0]
    assert breakdown.memory_bytes == {part: columns[f"memory.{part}"][0] for part in MEMORY_PARTS}


# ------------------------------------------------------------------------------ invariants
def test_no_tp_traffic_without_tp(ref_table, ref_columns) -> None:
    single = ref_table["tp"] == 1
    assert single.any() and (~single).any()
    assert np.all(ref_columns["time.tp_comm"][single] == 0) and np.all(
        ref_columns["hidden.tp_comm"][single] == 0
    )
    assert np.all((ref_columns["time.tp_comm"] + ref_columns["hidden.tp_comm"])[~single] > 0)


def test_no_all_to_all_without_ep(ref_table, ref_columns) -> None:
    single = ref_table["ep"] == 1
    assert single.any() and (~single).any()
    assert np.all(ref_columns["time.ep_comm"][single] == 0) and np.all(
        ref_columns["hidden.ep_comm"][single] == 0
    )
    assert np.all(ref_columns["time.ep_comm"][~single] > 0)


def test_no_pipeline_costs_without_pp(ref_table, ref_columns) -> None:
    single = ref_table["pp"] == 1
    assert np.all(ref_columns["time.bubble"][single] == 0) and np.all(
        ref_columns["time.pp_comm"][single] == 0
    )
    assert np.all(ref_columns["time.bubble"][~single] > 0)
    assert np.all(
        (ref_columns["time.cp_comm"] + ref_columns["hidden.cp_comm"])[ref_table["cp"] == 1] == 0
    )


def test_more_tp_means_fewer_weight_bytes_per_device() -> None:
    configs = [
        ParallelConfig(dp=1024 // (tp * 16), tp=tp, pp=16, ep=64, zero_stage=1, recompute="full")
        for tp in (1, 2, 4, 8)
    ]
    columns = estimate_table(REF, CLUSTER_1024, TRAINING, configs_to_table(configs))
    assert np.all(np.diff(columns["memory.weights"]) < 0)


def _scaled_cluster(cluster, factor: float):
    return cluster.model_copy(
        update={
            "intra_node": cluster.intra_node.model_copy(
                update={"bandwidth_bytes_per_s": cluster.intra_node.bandwidth_bytes_per_s * factor}
            ),
            "inter_node": cluster.inter_node.model_copy(
                update={"bandwidth_bytes_per_s": cluster.inter_node.bandwidth_bytes_per_s * factor}
            ),
            "device": cluster.device.model_copy(
                update={
                    "memory_bandwidth_bytes_per_s": cluster.device.memory_bandwidth_bytes_per_s
                    * factor
                }
            ),
        }
    )


def test_more_bandwidth_is_never_slower(ref_table, ref_columns) -> None:
    faster = estimate_table(REF, _scaled_cluster(CLUSTER_1024, 2.0), TRAINING, ref_table)
    assert np.all(faster["step_time_s"] <= ref_columns["step_time_s"] * (1 + 1e-12))
    assert np.any(faster["step_time_s"] < ref_columns["step_time_s"] * 0.99)


def test_recompute_trades_time_for_memory() -> None:
    configs = [
        ParallelConfig(dp=8, tp=8, pp=16, ep=64, sequence_parallel=True, zero_stage=1, recompute=r)
        for r in ("none", "selective", "full")
    ]
    columns = estimate_table(
        REF,
        CLUSTER_1024,
        TRAINING,
        configs_to_table(configs),
        options=EstimateOptions(flash_attention=False),
    )
    assert (
        columns["time.recompute"][0]
        == 0
        < columns["time.recompute"][1]
        < columns["time.recompute"][2]
    )
    assert (
        columns["memory.activations"][0]
        > columns["memory.activations"][1]
        > columns["memory.activations"][2]
    )


def test_schedules_order_their_bubbles_and_memory() -> None:
    base = dict(dp=8, tp=8, pp=16, ep=64, sequence_parallel=True, zero_stage=1, recompute="full")
    schedules = [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 5), ("zero_bubble", 1)]
    configs = [ParallelConfig(**base, pipeline_schedule=s, virtual_stages=v) for s, v in schedules]
    columns = estimate_table(REF, CLUSTER_1024, TRAINING, configs_to_table(configs))
    gpipe, one_f_one_b, interleaved, zero_bubble = columns["time.bubble"]
    assert (
        gpipe == pytest.approx(one_f_one_b)
        and interleaved < one_f_one_b
        and zero_bubble < one_f_one_b
    )
    assert columns["memory.activations"][0] > columns["memory.activations"][1]


def test_zero_stages_shard_states_gradients_then_weights() -> None:
    configs = [
        ParallelConfig(dp=8, tp=8, pp=16, ep=64, zero_stage=z, recompute="full") for z in range(4)
    ]
    columns = estimate_table(REF, CLUSTER_1024, TRAINING, configs_to_table(configs))
    states, grads, weights = (
        columns[f"memory.{p}"] for p in ("optimizer_states", "gradients", "weights")
    )
    assert states[0] > states[1] == states[2] == states[3]
    # Under pp a ZeRO-3 stage keeps its gradients unsharded and its layers gathered through the
    # step (``_memory.pipeline_unsharded_stage``): they are sharded only between steps.
    assert grads[0] == grads[1] > grads[2] < grads[3]
    assert weights[0] == weights[1] == weights[2] < weights[3]


def test_sliding_window_attention_is_cheaper_at_long_context() -> None:
    long = Training(sequence_length_tokens=131072, global_batch_sequences=64)
    windowed = REF.model_copy(
        update={
            "attention": REF.attention.model_copy(
                update={"variant": "sliding_window", "window_tokens": 4096}
            )
        }
    )
    config = configs_to_table(
        [
            ParallelConfig(
                dp=4,
                tp=8,
                pp=16,
                cp=2,
                ep=64,
                sequence_parallel=True,
                recompute="full",
                zero_stage=1,
            )
        ]
    )
    full = estimate_table(REF, CLUSTER_1024, long, config)["time.compute"][0]
    window = estimate_table(windowed, CLUSTER_1024, long, config)["time.compute"][0]
    assert window < 0.5 * full


# ------------------------------------------------------------------------------ formulas
def test_compute_time_brackets_six_n_t() -> None:
    """One GPU, no recompute: compute >= 6·N·T / achievable FLOP/s (matmuls alone) and within 30%."""
    model = gpt_model(
        name="gpt-1.3b", heads=32, hidden=2048, layers=24, vocab=51200, sequence=2048, tied=True
    )
    cluster = get_preset("dgx-a100")
    workload = Training(sequence_length_tokens=2048, global_batch_sequences=8)
    columns = estimate_table(
        model,
        cluster,
        workload,
        configs_to_table([ParallelConfig(micro_batch_size=8)]),
        options=NEUTRAL,
    )
    matmul_flops = 6.0 * model.matmul_parameters_per_token() * workload.tokens_per_step
    lower = matmul_flops / (312e12 * cluster.device.matmul_efficiency)
    assert lower < columns["time.compute"][0] < 1.3 * lower


@pytest.mark.parametrize("tp,micro_batch", [(4, 2), (8, 1)])
def test_activations_follow_korthikanti_table_2(tp: int, micro_batch: int) -> None:
    """No SP, no recompute, unfused attention with dropout: sbh(10 + 24/t + 5as/(ht)) per layer
    (Korthikanti et al. 2022 eq. 2 with tensor parallel), plus the fp32 logits of the last stage."""
    s, h, a, layers, vocab = 1024, 2048, 16, 8, 32000
    model = gpt_model(
        name="gpt", heads=a, hidden=h, layers=layers, vocab=vocab, sequence=s, tied=True
    )
    options = EstimateOptions(
        calibration=Calibration(),
        flash_attention=False,
        hidden_dropout=True,
        attention_dropout=True,
    )
    workload = Training(sequence_length_tokens=s, global_batch_sequences=micro_batch)
    config = ParallelConfig(tp=tp, micro_batch_size=micro_batch)
    columns = estimate_table(
        model, get_preset("dgx-a100"), workload, configs_to_table([config]), options=options
    )
    sbh = s * micro_batch * h
    expected = (
        layers * sbh * (10 + 24 / tp + 5 * a * s / (h * tp)) + 4.0 * s * micro_batch * vocab / tp
    )
    assert columns["memory.activations"][0] == pytest.approx(expected, rel=1e-9)


def test_model_states_cost_eighteen_bytes_per_parameter() -> None:
    """fp16 weights 2 + fp32 main gradients 4 + Adam fp32 master/m/v 12 (ZeRO paper K = 12)."""
    model = gpt_model(
        name="gpt", heads=16, hidden=1024, layers=4, vocab=1024, sequence=512, tied=True
    )
    columns = estimate_table(
        model,
        get_preset("dgx-a100"),
        Training(sequence_length_tokens=512, global_batch_sequences=1),
        configs_to_table([ParallelConfig()]),
    )
    states = sum(columns[f"memory.{p}"][0] for p in ("weights", "gradients", "optimizer_states"))
    assert states == pytest.approx(18.0 * model.num_parameters)


# ------------------------------------------------------------------------------ infeasible and errors
def test_plan_that_does_not_fit_names_the_part() -> None:
    config = ParallelConfig(dp=1024, ep=64, zero_stage=0, recompute="none")
    columns = estimate_table(REF, CLUSTER_1024, TRAINING, configs_to_table([config]))
    assert not columns["feasible"][0]
    assert columns["reason"][0] == REASON_CODES["optimizer_states"]
    with pytest.raises(InfeasiblePlanError) as caught:
        estimate(REF, CLUSTER_1024, TRAINING, config)
    assert caught.value.part == "optimizer_states"
    assert (
        caught.value.needed_bytes > caught.value.available_bytes == CLUSTER_1024.device.memory_bytes
    )
    assert "TB" in str(caught.value) and "141.0 GB" in str(caught.value)


def test_batch_that_does_not_divide_is_reported() -> None:
    config = ParallelConfig(
        dp=8, tp=8, pp=16, ep=64, micro_batch_size=3, recompute="full", zero_stage=1
    )
    columns = estimate_table(REF, CLUSTER_1024, TRAINING, configs_to_table([config]))
    assert (
        not columns["feasible"][0] and columns["reason"][0] == REASON_CODES["batch_not_divisible"]
    )
    with pytest.raises(ValueError, match="global_batch_sequences"):
        estimate(REF, CLUSTER_1024, TRAINING, config)


def test_illegal_config_and_unknown_option_raise() -> None:
    with pytest.raises(ValueError, match="num_routed_experts"):
        estimate(REF, CLUSTER_1024, TRAINING, ParallelConfig(dp=128, tp=8, ep=5))
    with pytest.raises(ValueError, match="flash_atention"):
        estimate(
            REF,
            CLUSTER_1024,
            TRAINING,
            ParallelConfig(dp=8, tp=8, pp=16, ep=64),
            flash_atention=False,
        )


# ------------------------------------------------------------------------------ acceptance and dispatch
def test_reference_model_on_1024_cards_completes_and_passes_invariants() -> None:
    grid = [
        ParallelConfig(
            dp=1024 // (tp * pp),
            tp=tp,
            pp=pp,
            ep=ep,
            sequence_parallel=tp > 1,
            zero_stage=1,
            recompute="full",
        )
        for tp, pp, ep in itertools.product((4, 8), (8, 16), (32, 64))
    ]
    columns = estimate_table(REF, CLUSTER_1024, TRAINING, configs_to_table(grid))
    assert columns["feasible"].any()
    best = int(np.argmax(np.where(columns["feasible"], columns["tokens_per_s_per_device"], -1)))
    breakdown = estimate(REF, CLUSTER_1024, TRAINING, grid[best])
    assert breakdown.memory_per_device_bytes <= CLUSTER_1024.device.memory_bytes
    assert 0 < breakdown.mfu < 0.8 and breakdown.step_time_s > 0
    assert breakdown.time_s["ep_comm"] > 0 and breakdown.time_s["bubble"] > 0


def test_inference_dispatch_has_no_backward_or_optimizer() -> None:
    workload = Inference(prompt_tokens=2048, output_tokens=256)
    config = ParallelConfig(dp=128, tp=8, ep=64)
    columns = estimate_table(REF, CLUSTER_1024, workload, configs_to_table([config]))
    names = set(columns)
    assert not {"time.optimizer", "time.recompute", "time.dp_comm", "time.bubble"} & names
    assert "memory.gradients" not in names and "memory.optimizer_states" not in names
    assert columns["step_time_s"][0] > 0


def test_dense_model_tables_sum_and_have_no_expert_traffic() -> None:
    model = get_model("megatron-gpt-39b")
    cluster = get_preset("dgx-a100", num_nodes=64)
    workload = Training(sequence_length_tokens=2048, global_batch_sequences=1536)
    table = random_legal_table(model, cluster.num_devices, 200, seed=3)
    columns = estimate_table(model, cluster, workload, table)
    np.testing.assert_allclose(
        sum(columns[f"time.{p}"] for p in TRAINING_TIME_PARTS), columns["step_time_s"], rtol=1e-12
    )
    np.testing.assert_allclose(
        sum(columns[f"memory.{p}"] for p in MEMORY_PARTS),
        columns["memory_per_device_bytes"],
        rtol=1e-12,
    )
    assert np.all(columns["time.ep_comm"] == 0) and np.all(columns["hidden.ep_comm"] == 0)
    assert np.all((columns["mfu"] > 0) & (columns["mfu"] < 1))


def test_a_faster_device_is_never_slower(ref_table, ref_columns) -> None:
    device = CLUSTER_1024.device
    faster = CLUSTER_1024.model_copy(
        update={
            "device": device.model_copy(
                update={"peak_flops": {k: 2 * v for k, v in device.peak_flops.items()}}
            )
        }
    )
    columns = estimate_table(REF, faster, TRAINING, ref_table)
    assert np.all(columns["step_time_s"] <= ref_columns["step_time_s"] * (1 + 1e-12))
    assert np.all(columns["time.compute"] < ref_columns["time.compute"])


def test_large_tables_match_row_by_row_estimates() -> None:
    """Tables above the de-duplication thresholds (distinct meshes, distinct collectives) give
    the same numbers as one row at a time."""
    table = random_legal_table(REF, CLUSTER_1024.num_devices, 60, seed=7)
    big = {name: np.tile(column, 100) for name, column in table.items()}  # 6000 rows, 60 distinct
    columns = estimate_table(REF, CLUSTER_1024, TRAINING, big)
    for index in range(0, 6000, 97):
        single = estimate_table(
            REF, CLUSTER_1024, TRAINING, configs_to_table([table_row(big, index)])
        )
        for name in (
            "step_time_s",
            "time.ep_comm",
            "time.dp_comm",
            "hidden.tp_comm",
            "memory_per_device_bytes",
        ):
            assert columns[name][index] == pytest.approx(single[name][0], rel=1e-12, abs=1e-15), (
                name
            )


def test_uneven_stages_make_the_larger_stage_the_bottleneck() -> None:
    model = REF.model_copy(
        update={"num_layers": 61, "moe": REF.moe.model_copy(update={"num_dense_layers": 0})}
    )
    config = ParallelConfig(
        dp=8, tp=8, pp=16, ep=64, sequence_parallel=True, zero_stage=1, recompute="full"
    )
    columns = estimate_table(model, CLUSTER_1024, TRAINING, configs_to_table([config]))
    assert (
        columns["bottleneck_stage"][0] == 1
    )  # a middle stage holds 4 layers, the ends 3 (plus embedding / head)
    # 48 layers put 3 on every stage: the 13 extra layers land on middle stages and slow the step.
    even = estimate_table(
        model.model_copy(update={"num_layers": 48}),
        CLUSTER_1024,
        TRAINING,
        configs_to_table([config]),
    )
    assert even["bottleneck_stage"][0] == 2  # with equal stages the LM head's stage is the slowest
    assert columns["step_time_s"][0] > 1.1 * even["step_time_s"][0]


def test_context_parallel_trades_activations_for_ring_traffic() -> None:
    long = Training(sequence_length_tokens=32768, global_batch_sequences=256)
    configs = [
        ParallelConfig(
            dp=8 // cp,
            cp=cp,
            tp=8,
            pp=16,
            ep=64,
            sequence_parallel=True,
            zero_stage=1,
            recompute="full",
        )
        for cp in (1, 2, 4)
    ]
    columns = estimate_table(REF, CLUSTER_1024, long, configs_to_table(configs))
    ring = columns["time.cp_comm"] + columns["hidden.cp_comm"]
    assert ring[0] == 0 < ring[1] < ring[2]
    assert (
        columns["memory.activations"][0]
        > columns["memory.activations"][1]
        > columns["memory.activations"][2]
    )


def test_mla_without_sp_all_reduces_each_replicated_latent_in_backward() -> None:
    """With latency-only collectives the TP time counts collectives: per layer a GQA layer has 2
    all-reduces in forward and 2 in backward; MLA's backward all-reduces its query latent, KV
    latent and shared RoPE key instead of the one attention input (the runtime issues the same)."""
    from cost_model import AttentionSpec

    mla = get_model("tiny-moe")
    a = mla.attention
    gqa = mla.model_copy(
        update={
            "attention": AttentionSpec(
                kind="gqa", num_heads=a.num_heads, num_kv_heads=a.num_heads, head_dim=a.v_head_dim
            )
        }
    )
    cluster = get_preset("dgx-h100", num_nodes=1)
    link = cluster.intra_node
    latency_only = cluster.model_copy(
        update={"intra_node": link.model_copy(update={"bandwidth_bytes_per_s": 1e30})}
    )
    workload = Training(sequence_length_tokens=64, global_batch_tokens=64 * 8)
    table = configs_to_table(
        [ParallelConfig(dp=4, tp=2, ep=1), ParallelConfig(dp=4, tp=2, ep=1, sequence_parallel=True)]
    )
    tp = {
        name: (lambda c: c["time.tp_comm"] + c["hidden.tp_comm"])(
            estimate_table(model, latency_only, workload, table, options=NEUTRAL)
        )
        for name, model in (("mla", mla), ("gqa", gqa))
    }
    layers = mla.num_layers
    assert tp["mla"][0] / tp["gqa"][0] == pytest.approx(
        (4 * layers + 1 + 2 * layers) / (4 * layers + 1), rel=1e-6
    )
    assert tp["mla"][1] == pytest.approx(tp["gqa"][1], rel=1e-6)  # sequence parallel: unchanged


# ------------------------------------------------------------------------------ ZeRO / FSDP per layer
LLAMA_8B = gpt_model(
    name="llama-like-8b", heads=32, hidden=4096, layers=32, vocab=128256, sequence=8192, tied=False
)


def _fsdp_columns(
    *, nodes: int, zero_stage: int = 3, micro_batches: int = 1
) -> dict[str, np.ndarray]:
    cluster = get_preset("dgx-h100", num_nodes=nodes)
    world = cluster.num_devices
    workload = Training(sequence_length_tokens=8192, global_batch_sequences=world * micro_batches)
    config = ParallelConfig(dp=world, zero_stage=zero_stage, recompute="full")
    return estimate_table(LLAMA_8B, cluster, workload, configs_to_table([config]), options=NEUTRAL)


def test_fsdp_gathers_every_layer_twice_and_scatters_once_per_micro_batch() -> None:
    """ZeRO-3 moves 2 bf16 gathers + 1 gradient reduce-scatter of every layer per micro-batch:
    with 2 micro-batches its data-parallel traffic doubles, ZeRO-1's does not."""
    one, two = _fsdp_columns(nodes=2), _fsdp_columns(nodes=2, micro_batches=2)
    fsdp_one = one["time.dp_comm"] + one["hidden.dp_comm"]
    fsdp_two = two["time.dp_comm"] + two["hidden.dp_comm"]
    assert fsdp_two[0] == pytest.approx(2.0 * fsdp_one[0], rel=1e-9)
    zero1_one, zero1_two = (
        _fsdp_columns(nodes=2, zero_stage=1),
        _fsdp_columns(nodes=2, zero_stage=1, micro_batches=2),
    )
    assert (zero1_two["time.dp_comm"] + zero1_two["hidden.dp_comm"])[0] == pytest.approx(
        (zero1_one["time.dp_comm"] + zero1_one["hidden.dp_comm"])[0], rel=1e-9
    )
    assert fsdp_one[0] > (zero1_one["time.dp_comm"] + zero1_one["hidden.dp_comm"])[0]


def test_fsdp_exposes_its_first_gather_and_more_across_more_nodes() -> None:
    """The first layer's gather has no compute to hide behind, so ZeRO-3 always exposes some
    traffic; across more nodes (same per-GPU batch) each gather crosses the NICs and the
    exposed seconds grow, as published ZeRO-3 runs lose per-GPU throughput with dp."""
    small, large = _fsdp_columns(nodes=1), _fsdp_columns(nodes=64)
    assert small["time.dp_comm"][0] > 0
    assert large["time.dp_comm"][0] > small["time.dp_comm"][0]


def test_zero2_reduces_gradients_every_micro_batch_zero1_once() -> None:
    zero1 = _fsdp_columns(nodes=4, zero_stage=1, micro_batches=4)
    zero2 = _fsdp_columns(nodes=4, zero_stage=2, micro_batches=4)
    total1 = zero1["time.dp_comm"] + zero1["hidden.dp_comm"]
    total2 = zero2["time.dp_comm"] + zero2["hidden.dp_comm"]
    assert total2[0] > 2.0 * total1[0]


def test_gradient_clipping_costs_more_on_a_larger_world() -> None:
    """The optimizer part carries the norm/clip passes and a scalar all-reduce over every rank,
    so at the same local shard it grows with the world size (latency of the all-reduce)."""
    small, large = _fsdp_columns(nodes=1, zero_stage=0), _fsdp_columns(nodes=64, zero_stage=0)
    assert large["time.optimizer"][0] > small["time.optimizer"][0]


def test_pipeline_fill_and_flush_latency_is_charged() -> None:
    cluster = get_preset("dgx-h100", num_nodes=4)
    workload = Training(sequence_length_tokens=2048, global_batch_sequences=64)
    configs = [ParallelConfig(dp=32 // pp, pp=pp, tp=1) for pp in (2, 8)]
    columns = estimate_table(
        LLAMA_8B, cluster, workload, configs_to_table(configs), options=NEUTRAL
    )
    per_hop = columns["time.pp_comm"] / (2.0 * (np.array([64 / 16, 64 / 4]) + np.array([1.0, 7.0])))
    assert np.all(per_hop > 0)
    # Without the fill/flush hops the per-micro-batch count alone would not explain the total.
    assert np.all(columns["time.pp_comm"] > 2.0 * np.array([64 / 16, 64 / 4]) * per_hop)


def test_fsdp_holds_two_gathered_layers_and_a_gradient_bucket() -> None:
    """ZeRO-3 adds 2 unsharded bf16 layers + the root's embedding/LM head + one layer of fp32
    gradients to the communication buffers; ZeRO-2 only the gradient bucket; ZeRO-1 neither."""
    cluster = get_preset("dgx-h100", num_nodes=2)
    workload = Training(sequence_length_tokens=8192, global_batch_sequences=16)
    configs = [ParallelConfig(dp=16, zero_stage=z, recompute="full") for z in (1, 2, 3)]
    buffers = estimate_table(
        LLAMA_8B, cluster, workload, configs_to_table(configs), options=NEUTRAL
    )["memory.comm_buffers"]
    layer = (
        LLAMA_8B.attention_parameters()
        + LLAMA_8B.ffn_parameters(LLAMA_8B.ffn_hidden_size)
        + LLAMA_8B.layer_norm_parameters()
    )
    ends = (
        LLAMA_8B.embedding_parameters() + LLAMA_8B.vocab_size * LLAMA_8B.hidden_size
    )  # untied head
    assert buffers[1] - buffers[0] == pytest.approx(layer * 4.0, rel=1e-9)
    assert buffers[2] - buffers[1] == pytest.approx(2 * layer * 2.0 + ends * 2.0, rel=1e-9)
