"""A closed loop of more clients than the engine admits: the plan records what runs at once."""

from __future__ import annotations

import pytest

import autoparallel as ap
from cost_model import (
    Inference,
    ParallelConfig,
    ServingConfig,
    configs_to_table,
    estimate_table,
    simulate_layout,
)
from topology import get_preset


def test_clients_past_the_engines_admission_wait_and_the_cap_is_what_runs() -> None:
    """Llama 3.1 70B, tp8 with attention data parallel on one DGX H100: each rank's KV pool
    admits 18 requests of 2,000 + 500 tokens, so of 64 clients per rank 46 wait. The batch the
    layout records (the cap its launch sets) is the 18 that run, and the simulator run at that
    cap, as ``plan`` runs it, reproduces the closed form's times."""
    model, cluster = ap.get_model("llama-3.1-70b"), get_preset("dgx-h100")
    config = ParallelConfig(tp=8, attention_data_parallel=True)
    workload = Inference(prompt_tokens=2000, output_tokens=500, concurrency=512)
    serving = ServingConfig(kv_dtype="fp8")
    columns = estimate_table(
        model, cluster, workload, configs_to_table([config], **serving.columns(workload=workload))
    )
    running = int(columns["batch_size"][0])
    assert running == int(columns["running_cap"][0]) < 512 // 8
    recorded = serving.model_copy(update={"batch_size": running})
    run = simulate_layout(
        model=model, cluster=cluster, workload=workload, config=config, serving=recorded
    )
    figures = run.result.summary()
    assert figures["ttft_mean_s"] == pytest.approx(float(columns["ttft_s"][0]), rel=0.1)
    assert figures["tpot_mean_s"] == pytest.approx(float(columns["tpot_s"][0]), rel=0.1)
    # more clients than run: the first token waits for admission, far past one prefill
    assert float(columns["ttft_s"][0]) > 10 * figures["tpot_mean_s"] * running
