"""Decode's MoE terms against independent computations.

* ``experts_touched_fraction``: a Monte-Carlo of top-k routing (each token picks ``k`` distinct
  experts uniformly at random) with a fixed seed; the closed form is exact for that process.
* ``max_load_factor`` (the busiest EP rank over the mean): the same Monte-Carlo, counting the
  copies each rank receives when experts sit contiguously on ranks. Raab & Steger's
  ``1 + sqrt(2 ln m / mean)`` is the large-load asymptote; for a finite number of ranks the
  expected maximum of ``m`` near-normal counts lies below ``sqrt(2 ln m)`` standard deviations,
  so the formula is an upper bound whose excess is at most ~1.6x the simulated one for the
  loads decode sees (mean >= 2 copies per rank). A factor 2 either way, or a lost ``2``
  under the square root, leaves that band.
* A known configuration's TPOT against the bytes a decode step must read (below).
"""

from __future__ import annotations

import numpy as np
import pytest

import autoparallel as ap
from cost_model import Inference, ParallelConfig, estimate
from cost_model._inference_ops import experts_touched_fraction
from cost_model._routing_skew import max_load_factor


def _route(
    *, rng: np.random.Generator, trials: int, tokens: int, top_k: int, num_experts: int
) -> np.ndarray:
    """Expert ids (trials, tokens, top_k): each token's ``top_k`` distinct experts, uniform."""
    keys = rng.random((trials, tokens, num_experts))
    return np.argpartition(keys, top_k - 1, axis=-1)[..., :top_k]


@pytest.mark.parametrize(
    ("tokens", "top_k", "num_experts"),
    [(1, 8, 256), (16, 8, 256), (64, 8, 256), (4, 2, 8), (4, 8, 16), (3, 1, 4)],
)
def test_touched_fraction_matches_a_monte_carlo_of_top_k_routing(
    tokens: int, top_k: int, num_experts: int
) -> None:
    rng = np.random.default_rng(tokens * 1000 + top_k * 10 + num_experts)
    trials = 400
    chosen = _route(rng=rng, trials=trials, tokens=tokens, top_k=top_k, num_experts=num_experts)
    touched = np.array([len(np.unique(trial)) / num_experts for trial in chosen])
    standard_error = max(touched.std(ddof=1) / np.sqrt(trials), 1e-12)
    predicted = float(experts_touched_fraction(tokens, top_k=top_k, num_experts=num_experts))
    assert abs(predicted - touched.mean()) <= 4 * standard_error + 1e-9, (
        predicted,
        touched.mean(),
        standard_error,
    )
    # The closed form by hand: an expert escapes one token with probability 1 - k/E.
    assert predicted == pytest.approx(1 - (1 - top_k / num_experts) ** tokens, rel=1e-12)


def test_touched_fraction_distinguishes_distinct_choices_from_independent_draws() -> None:
    """Where k/E is large, k *distinct* choices touch more experts than k independent draws
    ``1 - (1 - 1/E)^(kT)``; the simulation sides with the closed form used by the model."""
    rng = np.random.default_rng(7)
    chosen = _route(rng=rng, trials=2000, tokens=4, top_k=8, num_experts=16)
    simulated = np.mean([len(np.unique(trial)) / 16 for trial in chosen])
    independent_draws = 1 - (1 - 1 / 16) ** (8 * 4)
    assert float(experts_touched_fraction(4, top_k=8, num_experts=16)) == pytest.approx(
        simulated, abs=0.005
    )
    assert abs(independent_draws - simulated) > 0.04


def test_touched_fraction_is_vectorized_and_bounded() -> None:
    fractions = experts_touched_fraction(np.array([0, 1, 10, 10_000]), top_k=8, num_experts=256)
    assert fractions[0] == 0.0 and fractions[1] == pytest.approx(8 / 256)
    assert np.all(np.diff(fractions) > 0) and fractions[-1] == pytest.approx(1.0)


# (tokens, top_k, num_experts, ep): decode batches of DeepSeek-V3-like (top-8 of 256) and
# Mixtral-like (top-2 of 8) routing; mean copies per rank from 2 to 1024.
LOAD_CASES = [
    (1024, 8, 256, 8),
    (128, 8, 256, 8),
    (128, 8, 256, 32),
    (64, 8, 256, 64),
    (16, 8, 256, 64),
    (512, 8, 256, 256),
    (2, 8, 256, 8),
    (64, 2, 8, 8),
]


def _simulated_max_over_mean(
    *, tokens: int, top_k: int, num_experts: int, ep: int, seed: int
) -> float:
    rng = np.random.default_rng(seed)
    trials = min(300, 25_000_000 // (tokens * num_experts))  # a second at most
    chosen = _route(rng=rng, trials=trials, tokens=tokens, top_k=top_k, num_experts=num_experts)
    ranks = chosen // (
        num_experts // ep
    )  # contiguous placement: rank r holds experts [r E/ep, (r+1) E/ep)
    counts = np.stack([np.bincount(trial.ravel(), minlength=ep) for trial in ranks])
    return float(np.mean(counts.max(axis=1) / counts.mean(axis=1)))


@pytest.mark.parametrize(("tokens", "top_k", "num_experts", "ep"), LOAD_CASES)
def test_busiest_rank_factor_bounds_a_monte_carlo_from_above_within_its_asymptotic_slack(
    tokens: int, top_k: int, num_experts: int, ep: int
) -> None:
    mean = tokens * top_k / ep
    simulated = _simulated_max_over_mean(
        tokens=tokens, top_k=top_k, num_experts=num_experts, ep=ep, seed=tokens + ep
    )
    predicted = float(max_load_factor(mean, ep))
    ratio = (predicted - 1) / (simulated - 1)
    print(
        f"mean {mean:g} per rank on {ep} ranks: predicted {predicted:.3f}, simulated {simulated:.3f}, excess x{ratio:.2f}"
    )
    assert 1.0 <= ratio <= 1.6, (mean, predicted, simulated, ratio)
    assert predicted == pytest.approx(simulated, rel=0.2)  # the factor itself, within 20%


def test_busiest_rank_factor_edges() -> None:
    assert float(max_load_factor(100.0, 1)) == 1.0  # one rank is its own busiest
    factors = max_load_factor(np.array([1.0, 10.0, 100.0, 1e6]), 64)
    assert np.all(np.diff(factors) < 0) and factors[-1] == pytest.approx(
        1.0, abs=0.01
    )  # more load, better balance
    assert float(max_load_factor(10.0, 256)) > float(
        max_load_factor(10.0, 8)
    )  # more ranks, worse maximum


# --------------------------------------------------------------------------- a known TPOT
# Mixtral-8x22B (56 layers, hidden 6144, 48 query / 8 KV heads of 128, 8 experts of FFN 16384,
# top-2, vocabulary 32000) in FP8 on one B200 (8.0 TB/s HBM, as the dgx-b200 preset cites),
# tp = ep = 1: no communication at all. A decode step at batch B is memory-bound (B <= 4 tokens
# against ~140 GB of weights): it must read the attention weights, the LM head, the experts
# that at least one of the B tokens chose (the expected fraction 1 - (1 - 2/8)^B per layer) and
# the KV cache. Lower bound: those bytes at the peak bandwidth (nothing reads faster). Upper
# bound: +35% around the same bytes at the speed each kind of kernel is measured to reach.
# Dense memory-bound kernels reach 80-90% of HBM peak (FlashMLA README: 3000 GB/s of the
# H800's 3350 in its memory-bound setting). A fused MoE layer at one to four tokens does not:
# routing, permute, activation and un-permute kernels and the GEMMs' ramp are latency, not
# bandwidth. The fastest fused MoE kernel aiconfigurator-core 0.12.0 measured on B200 for
# 8 experts of 4096 x 14336, top-2, block FP8, one rank (vLLM 0.24.0 table,
# systems/data/b200_sxm/moe/vllm/0.24.0/moe_perf.parquet, balanced routing) takes 82.5 us at
# 1 token and 225 us at 4 tokens for 44 us and 120 us of touched expert bytes at peak: 0.53
# of HBM peak (Mixtral-8x22B's larger experts stream longer against the same fixed part, so
# this bounds them from above). So the experts' bytes count at 0.53 of peak, the rest at 0.8.
# A short prompt (256 tokens against 1024 outputs) keeps the amortized prefill under 1% of a
# step. Reading every expert at B = 1 would be 3.6x the lower bound; taking the touched
# fraction per sequence instead of per batch cuts the B = 4 bytes to 0.4x.
FUSED_MOE_MEASURED_OVER_IDEAL = 82.5 / 44.0  # measured / ideal, B200 FP8 fused MoE at 1-4 tokens
PROMPT_TOKENS, OUTPUT_TOKENS = 256, 1024
B200_PEAK_BYTES_PER_S = 8.0e12


def _decode_bytes_touched(*, batch: int) -> tuple[float, float]:
    """(expert bytes, other bytes) a decode step at ``batch`` must read."""
    hidden, layers, vocab = 6144, 56, 32000
    heads, kv_heads, head_dim = 48, 8, 128
    num_experts, top_k, expert_ffn = 8, 2, 16384
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2  # q, o + k, v
    router = hidden * num_experts
    expert = 3 * hidden * expert_ffn  # gate, up, down
    touched = 1 - (1 - top_k / num_experts) ** batch
    expert_bytes = 1.0 * layers * num_experts * touched * expert  # FP8
    weight_bytes = 1.0 * (layers * (attention + router) + vocab * hidden)  # FP8
    mean_context = PROMPT_TOKENS + OUTPUT_TOKENS / 2
    kv_bytes = batch * mean_context * layers * 2 * kv_heads * head_dim * 2.0  # K and V, bf16
    return expert_bytes, weight_bytes + kv_bytes


@pytest.mark.parametrize("batch", [1, 4])
def test_single_device_tpot_is_the_touched_bytes_over_hbm_bandwidth(batch: int) -> None:
    model = ap.get_model("mixtral-8x22b")
    assert (
        model.hidden_size,
        model.num_layers,
        model.moe.num_routed_experts,
        model.moe.top_k,
    ) == (6144, 56, 8, 2)
    cluster = ap.get_preset("dgx-b200", num_nodes=1)
    assert cluster.device.memory_bandwidth_bytes_per_s == B200_PEAK_BYTES_PER_S
    workload = Inference(
        prompt_tokens=PROMPT_TOKENS, output_tokens=OUTPUT_TOKENS, weight_dtype="fp8"
    )
    tpot_s = estimate(model, cluster, workload, ParallelConfig(), batch_size=batch).tpot_s
    expert_bytes, other_bytes = _decode_bytes_touched(batch=batch)
    lower_s = (expert_bytes + other_bytes) / B200_PEAK_BYTES_PER_S
    measured_speed_s = (
        expert_bytes * FUSED_MOE_MEASURED_OVER_IDEAL + other_bytes / 0.8
    ) / B200_PEAK_BYTES_PER_S
    assert lower_s <= tpot_s <= 1.35 * measured_speed_s, (
        batch,
        tpot_s,
        lower_s,
        tpot_s / lower_s,
    )
