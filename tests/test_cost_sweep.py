"""Sequence sweep 4K -> 1M: super-linear point, long-context attention variants, training sweep."""

from __future__ import annotations

import numpy as np
import pytest

from autoparallel import get_model
from cost_model import Inference, ParallelConfig, ServingConfig, Training, sequence_sweep
from cost_model._sweep import DEFAULT_LENGTHS, superlinear_point
from topology import get_preset

REF = get_model("ref-3t-moe")
CLUSTER = get_preset("dgx-h100", num_nodes=128)
WORKLOAD = Inference(prompt_tokens=8192, output_tokens=1024, weight_dtype="fp8", kv_dtype="fp8")
# Context parallel splits each long prompt over 8 ranks; attention runs tensor-parallel.
LONG_CONTEXT = ParallelConfig(dp=16, tp=8, cp=8, ep=256)


def _variant(variant: str, **fields):
    attention = REF.attention.model_copy(update={"variant": variant, **fields})
    return REF.model_copy(update={"attention": attention})


def test_superlinear_point_of_a_known_curve() -> None:
    lengths = np.array(DEFAULT_LENGTHS, dtype=float)
    latency = lengths + lengths**2 / 65536.0  # slope crosses 1.2 between 16K and 32K
    exponent, point = superlinear_point(lengths, latency, threshold=1.2)
    assert np.isnan(exponent[0]) and np.all(np.diff(exponent[1:]) > 0)
    assert point == 32768
    assert superlinear_point(lengths, 3.0 * lengths)[1] is None
    with pytest.raises(ValueError, match="increasing"):
        superlinear_point(lengths[::-1], latency)


def test_ref_model_sweeps_to_one_million_tokens() -> None:
    sweep = sequence_sweep(REF, CLUSTER, WORKLOAD, LONG_CONTEXT)
    assert sweep.lengths[0] == 4096 and sweep.lengths[-1] == 1_048_576
    assert sweep.feasible.all()
    assert np.all(np.diff(sweep.latency_s) > 0) and np.all(np.diff(sweep.tpot_s) > 0)
    assert np.all(np.diff(sweep.memory_per_device_bytes) > 0)
    assert sweep.superlinear_length is not None and 4096 < sweep.superlinear_length < 1_048_576
    index = int(np.flatnonzero(sweep.lengths == sweep.superlinear_length)[0])
    assert sweep.scaling_exponent[index] > 1.2 >= np.nanmax(sweep.scaling_exponent[:index])
    assert sweep.scaling_exponent[-1] > 1.6  # quadratic attention dominates at 1M
    assert len(sweep.rows()) == 9


def test_memory_limit_is_reported_not_raised() -> None:
    # One 1M-token sequence per rank without context parallel: its cache alone needs ~46 GB in fp8.
    sweep = sequence_sweep(
        REF, CLUSTER, WORKLOAD, ParallelConfig(dp=128, tp=8, ep=256, attention_data_parallel=True)
    )
    assert sweep.feasible[0] and not sweep.feasible[-1]
    assert np.isnan(sweep.scaling_exponent[-1])


def test_bounded_attention_variants_stay_linear() -> None:
    full = sequence_sweep(REF, CLUSTER, WORKLOAD, LONG_CONTEXT)
    # vLLM frees the blocks that leave a window; SGLang keeps one pool of full-length layers
    # for a model class without its hybrid SWA pools (``ServingProfile.window_kv_ratio``)
    vllm = WORKLOAD.model_copy(update={"serving_engine": "vllm"})
    window = sequence_sweep(
        _variant("sliding_window", window_tokens=8192), CLUSTER, WORKLOAD, LONG_CONTEXT
    )
    freed = sequence_sweep(
        _variant("sliding_window", window_tokens=8192), CLUSTER, vllm, LONG_CONTEXT
    )
    sparse = sequence_sweep(
        _variant("sparse_topk", topk_tokens=2048), CLUSTER, WORKLOAD, LONG_CONTEXT
    )
    linear = sequence_sweep(_variant("linear"), CLUSTER, WORKLOAD, LONG_CONTEXT)
    for bounded in (window, sparse, linear):
        assert bounded.superlinear_length is None
        assert bounded.latency_s[-1] < full.latency_s[-1] / 5
        assert np.nanmax(bounded.scaling_exponent) < 1.2
    # A window caps the cache; sparse top-k keeps every key (it chooses among them); linear keeps a state.
    window_growth = freed.memory_per_device_bytes[-1] - freed.memory_per_device_bytes[2]
    full_growth = full.memory_per_device_bytes[-1] - full.memory_per_device_bytes[2]
    assert window_growth < 0.1 * full_growth
    kept_growth = window.memory_per_device_bytes[-1] - window.memory_per_device_bytes[2]
    assert kept_growth == pytest.approx(full_growth, rel=0.02)
    assert sparse.memory_per_device_bytes[-1] == pytest.approx(
        full.memory_per_device_bytes[-1], rel=0.02
    )
    # but a decode step reads only the selected keys: its attention (the TPOT above the linear
    # variant's, whose state is constant) is a fraction of full attention's. A lone request's
    # TPOT holds no prefill (its prompt is in its TTFT), so the per-step floor is common to all.
    assert sparse.tpot_s[-1] - linear.tpot_s[-1] < (full.tpot_s[-1] - linear.tpot_s[-1]) / 3
    assert linear.memory_per_device_bytes[-1] < window.memory_per_device_bytes[-1]


def test_serving_config_and_bad_lengths() -> None:
    sweep = sequence_sweep(
        REF,
        CLUSTER,
        WORKLOAD,
        LONG_CONTEXT,
        lengths=[4096, 8192],
        serving=ServingConfig(batch_size=4, phase="prefill"),
    )
    assert np.all(np.isnan(sweep.tpot_s)) and np.all(sweep.tokens_per_s_per_device > 0)
    with pytest.raises(ValueError, match="lengths"):
        sequence_sweep(REF, CLUSTER, WORKLOAD, LONG_CONTEXT, lengths=[4096])
    with pytest.raises(ValueError, match="divisible"):
        sequence_sweep(REF, CLUSTER, WORKLOAD, ParallelConfig(dp=16, tp=8, cp=8, ep=7))


def test_training_sweep_keeps_tokens_per_step() -> None:
    training = Training(sequence_length_tokens=4096, global_batch_tokens=4096 * 1024)
    config = ParallelConfig(dp=8, tp=8, pp=16, ep=64, recompute="full", zero_stage=1)
    sweep = sequence_sweep(REF, CLUSTER, training, config, lengths=[4096, 16384, 65536, 262144])
    assert np.all(np.isnan(sweep.tpot_s))
    assert np.all(np.diff(sweep.latency_s) > 0)
    assert (
        sweep.memory_per_device_bytes[-1] > sweep.memory_per_device_bytes[0]
    )  # activations of longer sequences
    assert sweep.tokens_per_s_per_device[-1] < sweep.tokens_per_s_per_device[0]
