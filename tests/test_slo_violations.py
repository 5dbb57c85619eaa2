"""A serving SLO limits the p90 (``--ttft-slo-s``: p90 time to first token): a layout the cost
model rejects for its p90 under the offered load is counted against that SLO, with its excess,
not as an unexplained cost-model rejection."""

from __future__ import annotations

import json

import numpy as np

import autoparallel as ap
from cost_model import Inference
from search import SearchSpace
from search._objective import default_estimator, evaluate

# DeepSeek-V2-Lite's shape (deepseek-ai/DeepSeek-V2-Lite config.json): small MLA experts
DEEPSEEK_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "vocab_size": 102400,
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "n_shared_experts": 2,
    "n_routed_experts": 64,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "max_position_embeddings": 163840,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def test_a_p90_over_the_slo_is_counted_against_the_slo(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DEEPSEEK_V2_LITE))
    model, cluster = ap.get_model(str(path)), ap.get_preset("dgx-h100", num_nodes=1)
    workload = Inference(
        prompt_tokens=1000,
        output_tokens=300,
        request_rate_per_s=20.0,
        ttft_slo_s=5.0,
        tpot_slo_s=0.05,
        disaggregation_allowed=False,
    )
    space = SearchSpace(model=model, workload=workload, world_size=8, devices_per_node=8)
    table = next(space.iter_chunks(max_rows=100_000))
    result = evaluate(
        model=model, cluster=cluster, workload=workload, table=table, estimator=default_estimator()
    )
    tpot_p90 = np.asarray(result.metrics["tpot_p90_s"], dtype=np.float64)
    tpot_mean = np.asarray(result.metrics["tpot_s"], dtype=np.float64)
    over_at_p90_only = (tpot_p90 > 0.05) & (tpot_mean <= 0.05)
    assert over_at_p90_only.any()  # the rows this is about: the mean meets the SLO, the p90 not
    excess = result.violations["tpot_slo"][over_at_p90_only]
    assert np.allclose(excess, tpot_p90[over_at_p90_only] / 0.05 - 1.0)
    assert not result.violations["cost_model"][over_at_p90_only].any()
    # every rejected row names a limit it breaks
    rejected = ~np.asarray(result.metrics["feasible"], dtype=bool)
    named = np.any([v > 0 for v in result.violations.values()], axis=0)
    assert (named[rejected]).all()
