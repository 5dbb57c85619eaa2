"""Hardware profiles: schema, rejection of bad files, interpolation, HardwareSpec/Cluster loading.

Torch-free: these run where only the planning side is installed.
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
from pydantic import ValidationError

from profilers import cluster_from_profile, fit_link
from topology import HardwareProfile, HardwareSpec, MeasuredCurve, get_preset, load_hardware_profile

SOURCE = "measured: synthetic test curve"


def curve(work, seconds, spread=None):
    return {
        "work": list(work),
        "seconds": list(seconds),
        "spread": list(spread or [0.1] * len(work)),
        "source": SOURCE,
    }


def profile_document(device_type: str = "cpu") -> dict:
    gemm_work = [1e3, 1e5, 1e7, 1e9]
    gemm_rates = [1e8, 5e9, 4e10, 5e10]
    alpha, bandwidth = 2e-4, 1e9
    sizes = [4096.0, 65536.0, 1048576.0, 8388608.0]

    def ring(n: int, s: float) -> float:
        return 2 * (n - 1) * alpha + 2 * (n - 1) / n * s / bandwidth

    return {
        "device_type": device_type,
        "device_name": "Test CPU" if device_type == "cpu" else "NVIDIA Test GPU",
        "num_threads": 1,
        "torch_version": "2.13.0",
        "created_utc": "2026-01-01T00:00:00+00:00",
        "provenance": "measured: synthetic",
        "memory_bytes": 8e9,
        "kernel_overhead_s": 5e-6,
        "gemm": {
            "fp32": curve(gemm_work, [w / r for w, r in zip(gemm_work, gemm_rates)]),
            "bf16": curve(gemm_work, [2 * w / r for w, r in zip(gemm_work, gemm_rates)]),
        },
        "memory": curve([1e4, 1e6, 1e8], [1e4 / 2e9, 1e6 / 2e10, 1e8 / 1e10]),
        "collectives": {"all_reduce": {"2": curve(sizes, [ring(2, s) for s in sizes])}},
    }


def test_valid_document_round_trips_through_json(tmp_path):
    profile = HardwareProfile.model_validate(profile_document())
    path = profile.save(tmp_path / "profile.json")
    assert load_hardware_profile(path) == profile
    assert profile.collectives["all_reduce"][2].work[0] == 4096.0


@pytest.mark.parametrize(
    "field", ["gemm", "memory", "device_type", "kernel_overhead_s", "provenance"]
)
def test_missing_field_is_rejected_by_name(tmp_path, field):
    document = profile_document()
    del document[field]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError, match=f"field '{field}'"):
        load_hardware_profile(path)


@pytest.mark.parametrize(
    ("mutate", "named"),
    [
        (lambda d: d["gemm"]["fp32"]["seconds"].__setitem__(1, -1.0), "gemm.fp32"),
        (lambda d: d["gemm"]["fp32"]["seconds"].__setitem__(2, "fast"), "gemm.fp32.seconds.2"),
        (lambda d: d["memory"]["work"].reverse(), "memory"),
        (lambda d: d["memory"]["spread"].pop(), "memory"),
        (
            lambda d: d["collectives"]["all_reduce"]["2"].__setitem__("source", "guessed"),
            "collectives.all_reduce.2",
        ),
        (lambda d: d.__setitem__("memory_bytes", 0), "memory_bytes"),
        (lambda d: d.__setitem__("gemm_typo", {}), "gemm_typo"),
    ],
)
def test_corrupted_field_is_rejected_by_name(tmp_path, mutate, named):
    document = profile_document()
    mutate(document)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError) as error:
        load_hardware_profile(path)
    assert named in str(error.value) and str(path) in str(error.value)


def test_nan_and_broken_json_are_rejected(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile_document())[:-20])
    with pytest.raises(ValueError, match="not valid JSON"):
        load_hardware_profile(path)
    with pytest.raises(ValueError, match=r"seconds\[0\]"):
        MeasuredCurve(work=(1.0,), seconds=(math.nan,), spread=(0.0,), source=SOURCE)
    with pytest.raises(ValueError, match="does not exist"):
        load_hardware_profile(tmp_path / "absent.json")


def test_other_device_type_is_refused_unless_forced(tmp_path):
    gpu = HardwareProfile.model_validate(profile_document("cuda"))
    path = gpu.save(tmp_path / "gpu.json")
    with pytest.raises(ValueError, match=r"device_type \('cuda'.* must match .*\('cpu'\)"):
        load_hardware_profile(path, expected_device_type="cpu")
    assert load_hardware_profile(path, expected_device_type="cpu", force=True).device_type == "cuda"
    cpu = HardwareProfile.model_validate(profile_document("cpu"))
    h100 = get_preset("dgx-h100").device
    with pytest.raises(ValueError, match="force"):
        h100.with_profile(cpu)
    assert h100.with_profile(cpu, force=True).profile == cpu
    assert h100.with_profile(gpu).sources["profile"] == gpu.provenance


def test_curve_interpolates_in_log_work_and_floors_small_calls():
    c = MeasuredCurve(
        work=(1e3, 1e5), seconds=(1e-5, 1e-5 * 100 / 10), spread=(0, 0), source=SOURCE
    )
    rates = c.rate_per_s([1e3, 1e4, 1e5, 1e7])
    assert rates[0] == pytest.approx(1e8) and rates[2] == pytest.approx(1e9)
    assert rates[1] == pytest.approx((1e8 + 1e9) / 2)  # halfway in log(work)
    assert rates[3] == pytest.approx(1e9)  # clamped above the largest point
    assert c.time_s([1.0, 10.0, 1e3]) == pytest.approx([1e-5, 1e-5, 1e-5])  # constant floor below
    assert c.time_s(np.ones((2, 3))).shape == (2, 3) and c.time_s(0.0) == 0.0


def test_spec_from_profile_interpolates_measured_efficiency():
    profile = HardwareProfile.model_validate(profile_document())
    spec = HardwareSpec.from_profile(profile)
    assert spec.peak_flops["fp32"] == pytest.approx(5e10) and spec.resolved_device_type == "cpu"
    efficiency = spec.gemm_efficiency(np.array([1e3, 1e7, 1e9]), "fp32")
    assert efficiency == pytest.approx([1e8 / 5e10, 0.8, 1.0])
    assert spec.peak_flops["bf16"] == pytest.approx(2.5e10) and spec.gemm_efficiency(
        1e7, "bf16"
    ) == pytest.approx(0.8)
    with pytest.raises(ValueError, match="no entry for dtype 'fp16'"):
        spec.gemm_efficiency(1e9, "fp16")  # no fp16 measured: no fp16 peak either
    assert spec.memory_efficiency(1e6) == pytest.approx(1.0)
    assert spec.memory_efficiency(1e8) == pytest.approx(0.5)
    assert spec.attention_efficiency(1e7, "fp32") == pytest.approx(
        0.8
    )  # falls back to the GEMM curve
    assert spec.kernel_overhead_s == 5e-6
    # Without a profile the hooks stay the constant fractions.
    preset = get_preset("dgx-h100").device
    assert preset.gemm_efficiency(np.ones(3)).tolist() == [preset.matmul_efficiency] * 3
    assert preset.kernel_overhead_s == 0.0


def test_link_fit_recovers_alpha_beta_and_cluster_uses_profile():
    profile = HardwareProfile.model_validate(profile_document())
    latency, bandwidth, error = fit_link(profile)
    assert (
        latency == pytest.approx(2e-4, rel=1e-6)
        and bandwidth == pytest.approx(1e9, rel=1e-6)
        and error < 1e-9
    )
    cluster = cluster_from_profile(profile, num_devices=2)
    assert cluster.num_devices == 2 and cluster.device.profile == profile
    seconds = cluster.collective_time(
        "all_reduce", group_size=2, ranks_per_node=2, message_bytes=1048576.0
    )
    assert seconds == pytest.approx(2 * 2e-4 + 1048576 / 1e9, rel=0.01)  # 2(n-1) latency steps
    no_collectives = HardwareProfile.model_validate({**profile_document(), "collectives": {}})
    with pytest.raises(ValueError, match="collectives has no measured op"):
        fit_link(no_collectives)


def test_profile_is_hashable_and_frozen():
    profile = HardwareProfile.model_validate(profile_document())
    spec = HardwareSpec.from_profile(profile)
    assert hash(spec) == hash(HardwareSpec.from_profile(copy.deepcopy(profile)))
    with pytest.raises(ValidationError, match="frozen"):
        profile.kernel_overhead_s = 1.0  # type: ignore[misc]


def test_tensor_parallel_host_overhead_is_charged_per_sharded_linear_only_with_tp():
    from autoparallel import get_model
    from cost_model import ParallelConfig, Training, estimate

    model = get_model("tiny-moe")  # MLA, 1 dense + 3 MoE layers, a shared expert
    base = HardwareProfile.model_validate(profile_document())
    costly = base.model_copy(update={"sharded_module_overhead_s": 1e-3})
    assert HardwareSpec.from_profile(costly).sharded_module_overhead_s == 1e-3
    assert get_preset("dgx-h100").device.sharded_module_overhead_s == 0.0
    workload = Training(sequence_length_tokens=64, global_batch_sequences=4)
    times = {}
    for name, profile in (("base", base), ("costly", costly)):
        cluster = cluster_from_profile(profile, num_devices=2)
        for config in (
            ParallelConfig(micro_batch_size=2),
            ParallelConfig(tp=2, micro_batch_size=2),
        ):
            times[name, config.tp] = estimate(model, cluster, workload, config).time_s["compute"]
    assert times["costly", 1] == pytest.approx(times["base", 1])
    # 2 micro-batches x (4 layers x (3 attention + 3 FFN or shared-expert linears) + embedding + LM head).
    assert times["costly", 2] - times["base", 2] == pytest.approx(2 * (4 * 6 + 2) * 1e-3, rel=1e-6)


def test_sharded_linear_curve_prices_the_overhead_by_activation_size():
    document = profile_document()
    document["sharded_linear"] = curve([1e4, 1e6], [2e-3, 2e-2])
    spec = HardwareSpec.from_profile(HardwareProfile.model_validate(document))
    assert spec.sharded_module_time_s([1e3, 1e4, 1e6]) == pytest.approx([2e-3, 2e-3, 2e-2])


def test_cluster_prices_profiled_collectives_from_their_measured_curves():
    document = profile_document()
    sizes = [4096.0, 65536.0, 1048576.0]
    document["collectives"]["send_recv"] = {
        "2": curve(sizes, [3e-3, 3.1e-3, 4e-3])
    }  # gloo's slow p2p wake-up
    cluster = cluster_from_profile(HardwareProfile.model_validate(document), num_devices=2)
    seconds = cluster.collective_time(
        "send_recv", group_size=2, ranks_per_node=2, message_bytes=[4096.0, 1024.0]
    )
    assert seconds == pytest.approx([3e-3, 3e-3])  # measured, and held below the smallest size
    bare = cluster.model_copy(
        update={"device": cluster.device.model_copy(update={"profile": None})}
    )
    assert (
        bare.collective_time("send_recv", group_size=2, ranks_per_node=2, message_bytes=4096.0)
        < 1e-3
    )
    assert cluster.collective_time(
        "all_to_all", group_size=2, ranks_per_node=2, message_bytes=4096.0
    ) == pytest.approx(
        bare.collective_time("all_to_all", group_size=2, ranks_per_node=2, message_bytes=4096.0)
    )  # not measured: the alpha-beta model


def test_one_device_profiled_cluster_estimates():
    from autoparallel import get_model
    from cost_model import ParallelConfig, Training, estimate

    cluster = cluster_from_profile(
        HardwareProfile.model_validate(profile_document()), num_devices=1
    )
    workload = Training(sequence_length_tokens=64, global_batch_sequences=2)
    breakdown = estimate(get_model("tiny-moe"), cluster, workload, ParallelConfig())
    assert (
        breakdown.step_time_s > 0
        and breakdown.time_s["pp_comm"] == breakdown.time_s["cp_comm"] == 0.0
    )


def _with_host(**fields) -> HardwareProfile:
    document = profile_document()
    document.update(fields)
    return HardwareProfile.model_validate(document)


def _host(**values) -> dict:
    base = {"dense_layer_s": 0.0, "moe_layer_s": 0.0, "routed_expert_s": 0.0, "source": SOURCE}
    return {**base, **values}


def _tiny_estimate(profile: HardwareProfile, config=None, **options):
    from autoparallel import get_model
    from cost_model import ParallelConfig, Training, estimate

    workload = Training(sequence_length_tokens=64, global_batch_sequences=4)
    cluster = cluster_from_profile(profile, num_devices=4)
    return estimate(
        get_model("tiny-moe"),
        cluster,
        workload,
        config or ParallelConfig(micro_batch_size=2),
        **options,
    )


def test_profiles_without_the_optional_host_fields_estimate_as_before():
    base = HardwareProfile.model_validate(profile_document())
    assert base.optimizer is None and base.gradient_accumulation is None and base.host is None
    spec = HardwareSpec.from_profile(base)
    assert spec.optimizer_time_s(1e6) is None and spec.gradient_accumulation_time_s(1e6) is None
    assert spec.sharded_parameter_update_s == spec.pipeline_micro_batch_s == 0.0
    assert [float(v) for v in spec.layer_host_time_s(8.0)] == [0.0, 0.0]
    assert get_preset("dgx-h100").device.layer_host_time_s([4.0])[1].tolist() == [0.0]
    zeroed = _with_host(host=_host())
    assert _tiny_estimate(zeroed).step_time_s == pytest.approx(
        _tiny_estimate(base).step_time_s, rel=1e-12
    )


def test_measured_layer_host_cost_is_charged_per_layer_expert_and_micro_batch():
    from cost_model import ParallelConfig

    base = _with_host(host=_host())
    costly = _with_host(host=_host(dense_layer_s=3e-3, moe_layer_s=5e-3, routed_expert_s=1e-3))
    for config, experts in (
        (ParallelConfig(micro_batch_size=2), 8),
        (ParallelConfig(ep=2, dp=2, micro_batch_size=1), 4),
    ):
        extra = (
            _tiny_estimate(costly, config).time_s["compute"]
            - _tiny_estimate(base, config).time_s["compute"]
        )
        micro_batches = 4 // (config.dp * config.micro_batch_size)
        # tiny-moe: 1 dense + 3 MoE layers; each MoE layer pays its rank's routed experts.
        assert extra == pytest.approx(
            micro_batches * (3e-3 + 3 * (5e-3 + experts * 1e-3)), rel=1e-9
        )


def test_measured_optimizer_and_accumulation_curves_price_their_bytes():
    rate = 2e9  # bytes/s, flat
    flat = curve([1e3, 1e9], [1e3 / rate, 1e9 / rate])
    base = HardwareProfile.model_validate(profile_document())
    measured = _with_host(optimizer=flat, gradient_accumulation=flat)
    breakdown = _tiny_estimate(measured)
    from autoparallel import get_model

    parameters = sum(get_model("tiny-moe").parameter_breakdown().values())
    # The update moves 4 + 3 x 8 + 2 bytes per parameter at the measured rate; doubling the rate
    # halves that part and leaves the rest of the step's optimizer time (gradient clipping).
    doubled = curve([1e3, 1e9], [1e3 / (2 * rate), 1e9 / (2 * rate)])
    faster = _tiny_estimate(_with_host(optimizer=doubled, gradient_accumulation=flat))
    update = parameters * (4 + 3 * 8 + 2) / rate
    saved = breakdown.time_s["optimizer"] - faster.time_s["optimizer"]
    assert saved == pytest.approx(update / 2, rel=1e-9)
    assert breakdown.time_s["optimizer"] >= update
    fused = _tiny_estimate(measured).time_s["compute"]
    assert fused == pytest.approx(
        _tiny_estimate(base).time_s["compute"], rel=1e-12
    )  # fused by default
    unfused = _tiny_estimate(measured, fused_gradient_accumulation=False).time_s["compute"]
    assert unfused - fused == pytest.approx(
        2 * parameters * (2 + 4 + 4) / rate, rel=1e-9
    )  # 2 micro-batches
    roofline = _tiny_estimate(base, fused_gradient_accumulation=False).time_s["compute"]
    assert roofline > _tiny_estimate(base).time_s["compute"]  # unmeasured: the memory roofline


def test_sharded_weight_update_and_pipeline_schedule_costs_need_their_axis():
    from cost_model import ParallelConfig

    base = _with_host(host=_host())
    costly = _with_host(host=_host(sharded_parameter_update_s=1e-3, pipeline_micro_batch_s=2e-3))
    tp2, pp2 = ParallelConfig(tp=2, micro_batch_size=2), ParallelConfig(pp=2, micro_batch_size=1)
    for config in (ParallelConfig(micro_batch_size=2), pp2):
        assert _tiny_estimate(costly, config).time_s["optimizer"] == pytest.approx(
            _tiny_estimate(base, config).time_s["optimizer"], rel=1e-12
        )
    # 4 layers x (3 attention + 3 FFN or shared-expert linears) + embedding + LM head, once per step.
    extra = (
        _tiny_estimate(costly, tp2).time_s["optimizer"]
        - _tiny_estimate(base, tp2).time_s["optimizer"]
    )
    assert extra == pytest.approx((4 * 6 + 2) * 1e-3, rel=1e-9)
    extra = (
        _tiny_estimate(costly, pp2).time_s["pp_comm"] - _tiny_estimate(base, pp2).time_s["pp_comm"]
    )
    assert extra == pytest.approx(4 * 2e-3, rel=1e-9)  # 4 micro-batches
    assert _tiny_estimate(costly, tp2).time_s["pp_comm"] == 0.0


@pytest.mark.parametrize("field", ["dense_layer_s", "routed_expert_s", "source"])
def test_corrupted_host_overhead_is_rejected_by_name(tmp_path, field):
    document = profile_document()
    document["host"] = _host(dense_layer_s=1e-3)
    document["host"][field] = -1.0 if field != "source" else "guessed"
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError, match=f"host.{field}" if field != "source" else "host"):
        load_hardware_profile(path)


def test_collective_sync_cost_is_charged_per_blocking_tp_and_ep_collective():
    from cost_model import ParallelConfig

    base = _with_host(host=_host())
    costly = _with_host(host=_host(collective_sync_s=1e-3))
    assert HardwareSpec.from_profile(costly).collective_sync_s == 1e-3
    one = ParallelConfig(micro_batch_size=2)
    assert _tiny_estimate(costly, one).step_time_s == pytest.approx(
        _tiny_estimate(base, one).step_time_s, rel=1e-12
    )
    tp2 = ParallelConfig(tp=2, micro_batch_size=2)
    extra = (
        _tiny_estimate(costly, tp2).time_s["tp_comm"] - _tiny_estimate(base, tp2).time_s["tp_comm"]
    )
    # 2 micro-batches x (2 passes x 4 layers x 2 + embedding + MLA's 2 more per layer in backward)
    assert extra == pytest.approx(2 * (2 * 4 * 2 + 1 + 4 * 2) * 1e-3, rel=1e-9)
    ep2 = ParallelConfig(ep=2, dp=2, micro_batch_size=1)
    extra = (
        _tiny_estimate(costly, ep2).time_s["ep_comm"] - _tiny_estimate(base, ep2).time_s["ep_comm"]
    )
    assert extra == pytest.approx(
        2 * (2 * 3 * 2) * 1e-3, rel=1e-9
    )  # 2 micro-batches x 2 passes x 3 MoE layers x 2 all-to-alls
