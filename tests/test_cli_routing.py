"""The MoE routing flags of ``autoparallel estimate`` and ``autoparallel plan``: a measured
busiest-rank load (``--routing-imbalance``) and serving traffic's expert-load skew
(``--expert-load-skew``) reach the estimate, move the busiest expert rank's time, are recorded in a
plan, and are refused where they cannot apply."""

from __future__ import annotations

import autoparallel as ap
from autoparallel.cli import main
from cost_model import eplb_skew

#: A DeepSeek-V3 prefill unit as LMSYS ran it: EP 32 with attention data parallel on 4 nodes.
PREFILL = [
    "estimate",
    "--model",
    "deepseek-v3",
    "--cluster",
    "dgx-h100",
    "--nodes",
    "4",
    "--inference",
    "--dp",
    "32",
    "--ep",
    "32",
    "--prompt-tokens",
    "4096",
    "--output-tokens",
    "1",
    "--batch-size",
    "4",
    "--json",
]


def test_the_skew_and_a_measured_imbalance_move_the_busiest_expert_ranks_time(cli_json):
    default = cli_json(PREFILL)
    balanced = cli_json([*PREFILL, "--expert-load-skew", "0"])
    explicit = cli_json([*PREFILL, "--expert-load-skew", f"{eplb_skew()!r}"])
    measured = cli_json([*PREFILL, "--routing-imbalance", "1.5"])
    assert explicit == default  # the default is the residual behind EPLB
    for part in ("prefill_compute", "prefill_ep_comm"):
        assert balanced["time_s"][part] < default["time_s"][part] < measured["time_s"][part]
    assert balanced["time_s"]["prefill_attention"] == default["time_s"]["prefill_attention"]


def test_a_measured_imbalance_slows_a_training_run_of_experts(cli_json):
    job = ["estimate", "--model", "tiny-moe", "--cluster", "dgx-h100", "--nodes", "1"]
    job += ["--training", "--tp", "1", "--dp", "8", "--ep", "8", "--sequence-length", "1024"]
    job += ["--global-batch-tokens", "65536", "--recompute", "none", "--json"]
    even = cli_json(job)
    skewed = cli_json([*job, "--routing-imbalance", "2"])
    assert skewed["time_s"]["compute"] > even["time_s"]["compute"]


def test_routing_flags_are_refused_where_they_cannot_apply(cli_refused):
    dense = ["estimate", "--model", "llama-3.1-8b", "--inference", "--expert-load-skew", "0"]
    assert "--expert-load-skew needs a MoE model; llama-3.1-8b has no MoE layers" in cli_refused(
        dense
    )
    training = ["estimate", "--model", "tiny-moe", "--training", "--expert-load-skew", "0.1"]
    assert "--expert-load-skew (0.1) prices serving traffic" in cli_refused(training)
    low = cli_refused([*PREFILL, "--routing-imbalance", "0.9"])
    assert "--routing-imbalance" in low and "(0.9) must be >= 1" in low
    negative = cli_refused([*PREFILL, "--expert-load-skew", "-0.1"])
    assert "--expert-load-skew" in negative


def test_a_plan_records_the_routing_it_was_priced_with(tmp_path, capsys, cli_refused):
    output = tmp_path / "plan.json"
    job = ["plan", "--model", "tiny-moe", "--cluster", "dgx-h100", "--nodes", "1", "--inference"]
    job += ["--prompt-tokens", "512", "--output-tokens", "64", "--trials", "10"]
    job += ["--no-disaggregation", "--expert-load-skew", "0", "--output", str(output)]
    assert main(job) == 0, capsys.readouterr().err
    capsys.readouterr()
    plan = ap.load_plan(output)
    assert plan.estimate_options is not None and plan.estimate_options.expert_load_skew == 0.0
    storage = f"sqlite:///{tmp_path}/study.db"
    message = cli_refused(
        ["plan", "--from-study", "--storage", storage, "--routing-imbalance", "1.2"]
    )
    assert "drop --routing-imbalance" in message


def test_a_measured_serving_imbalance_replaces_the_default_skew(cli_json):
    """``--routing-imbalance`` measures the traffic: in serving it comes without the default
    skew on top (a measured 1.0 prices as balanced routing), unless ``--expert-load-skew`` is
    given too."""
    balanced = cli_json([*PREFILL, "--expert-load-skew", "0"])
    measured_even = cli_json([*PREFILL, "--routing-imbalance", "1"])
    both = cli_json([*PREFILL, "--routing-imbalance", "1", "--expert-load-skew", "0.1"])
    assert measured_even == balanced
    assert both["time_s"]["prefill_compute"] > balanced["time_s"]["prefill_compute"]
