"""Training's MoE token dropping (``EstimateOptions.moe_capacity_factor`` /
``moe_pad_to_capacity``, Megatron-core ``--moe-expert-capacity-factor`` and
``--moe-pad-expert-input-to-capacity``): a padded expert computes exactly its capacity and its
all-to-alls carry the padding, the static counts remove the dispatch's host sync (which is what
lets a whole iteration be one CUDA graph), and the published token-dropping runs priced that
way."""

from __future__ import annotations

import json
import shlex

import numpy as np
import pytest

import autoparallel as ap
from autoparallel.cli import main
from autoparallel.export import export_plan
from autoparallel.plan import build_plan
from cost_model import EstimateOptions, Layout, ParallelConfig, Training, configs_to_table
from cost_model._estimate import estimate_table
from cost_model._training_context import training_context
from cost_model._validation import training_rows
from cost_model._validation_runs import run_config
from topology import get_preset

CLUSTER = get_preset("dgx-h100", num_nodes=1)
LAYOUT = ParallelConfig(dp=8, ep=8, micro_batch_size=1)
PADDED = dict(moe_capacity_factor=1.0, moe_pad_to_capacity=True)


def _workload(framework: str | None = "megatron-core", *, sequence: int = 4096) -> Training:
    return Training(sequence_length_tokens=sequence, global_batch_sequences=64, framework=framework)


def _estimate(
    options: EstimateOptions,
    *,
    model: str = "qwen3-30b-a3b",
    framework: str | None = "megatron-core",
    sequence: int = 4096,
):
    return estimate_table(
        ap.get_model(model),
        CLUSTER,
        _workload(framework, sequence=sequence),
        configs_to_table([LAYOUT]),
        options=options,
    )


def test_padding_needs_a_capacity_factor_and_the_factor_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"moe_pad_to_capacity \(True\) needs moe_capacity_factor"):
        EstimateOptions(moe_pad_to_capacity=True)
    with pytest.raises(ValueError, match="moe_capacity_factor"):
        EstimateOptions(moe_capacity_factor=0.0)


@pytest.mark.parametrize(
    "fields, load",
    [
        ({}, 1.0),
        ({"routing_imbalance": 1.4}, 1.4),
        ({"routing_imbalance": 1.4, "moe_capacity_factor": 1.2}, 1.2),  # dropped at capacity
        ({"routing_imbalance": 1.1, "moe_capacity_factor": 1.2}, 1.1),  # nothing dropped
        ({"routing_imbalance": 1.1, **PADDED, "moe_capacity_factor": 1.5}, 1.5),  # padded up
    ],
)
def test_the_busiest_expert_load_is_clipped_at_capacity_and_padded_up_to_it(fields, load) -> None:
    assert EstimateOptions(**fields).expert_load_factor == pytest.approx(load)


def test_padding_to_a_larger_capacity_costs_expert_compute_traffic_and_memory() -> None:
    exact = _estimate(EstimateOptions(moe_capacity_factor=1.0, moe_pad_to_capacity=True))
    padded = _estimate(EstimateOptions(moe_capacity_factor=1.5, moe_pad_to_capacity=True))
    # The all-to-alls carry every padded slot: 1.5x the bytes (less each call's fixed cost).
    ratio = float(padded["time.ep_comm"][0] / exact["time.ep_comm"][0])
    assert 1.3 < ratio <= 1.5 + 1e-9
    assert padded["time.compute"][0] > exact["time.compute"][0]
    assert padded["memory.activations"][0] > exact["memory.activations"][0]


def test_static_counts_remove_the_dispatch_host_sync() -> None:
    def context(**fields):
        return training_context(
            model=ap.get_model("qwen3-30b-a3b"),
            cluster=CLUSTER,
            workload=_workload(),
            table=configs_to_table([LAYOUT]),
            options=EstimateOptions(**fields),
        )

    assert context().moe_dispatch_syncs
    assert context(moe_capacity_factor=1.0).moe_dispatch_syncs  # dropped, but counts dynamic
    assert not context(**PADDED).moe_dispatch_syncs
    # Same GPU work at capacity factor 1 (balanced routing), so only the sync's cost goes
    # where the host binds: short sequences, little GPU work per local expert.
    dropless = float(_estimate(EstimateOptions(), sequence=256)["step_time_s"][0])
    padded = float(_estimate(EstimateOptions(**PADDED), sequence=256)["step_time_s"][0])
    assert padded < dropless


def test_a_whole_iteration_graph_needs_a_sync_free_moe_dispatch() -> None:
    with pytest.raises(ValueError, match=r"cuda_graphs \('full_iteration'\) needs a sync-free"):
        _estimate(EstimateOptions(cuda_graphs="full_iteration"))
    graphed = _estimate(EstimateOptions(cuda_graphs="full_iteration", **PADDED))
    eager = _estimate(EstimateOptions(**PADDED))
    assert graphed["step_time_s"][0] <= eager["step_time_s"][0]
    # A dense model, or a framework whose dispatch does not wait on the host, may be captured.
    estimate_table(
        ap.get_model("megatron-gpt-1.7b"),
        CLUSTER,
        _workload(),
        configs_to_table([ParallelConfig(dp=8)]),
        options=EstimateOptions(cuda_graphs="full_iteration"),
    )
    _estimate(EstimateOptions(cuda_graphs="full_iteration"), framework=None)


def _cli_refusal(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    return " ".join(captured.err.split())


ESTIMATE = ["estimate", "--model", "tiny-moe", "--cluster", "dgx-h100", "--nodes", "1"]
ESTIMATE += ["--tp", "1", "--pp", "1", "--ep", "2", "--sequence-length", "256"]
ESTIMATE += ["--global-batch-tokens", "8192", "--framework", "megatron-core", "--json"]


def test_the_cli_prices_token_dropping_and_refuses_what_cannot_run(capsys) -> None:
    assert main(ESTIMATE) == 0
    dropless = json.loads(capsys.readouterr().out)["time_s"]["ep_comm"]
    assert main([*ESTIMATE, "--moe-capacity-factor", "1.25", "--moe-pad-to-capacity"]) == 0
    padded = json.loads(capsys.readouterr().out)["time_s"]["ep_comm"]
    assert dropless < padded <= 1.25 * dropless * (1 + 1e-9)
    message = _cli_refusal(capsys, [*ESTIMATE, "--moe-pad-to-capacity"])
    assert "--moe-pad-to-capacity needs --moe-capacity-factor" in message
    message = _cli_refusal(capsys, [*ESTIMATE, "--cuda-graphs", "full_iteration"])
    assert "--cuda-graphs full_iteration cannot capture tiny-moe's MoE layers" in message
    assert "--moe-pad-to-capacity" in message
    message = _cli_refusal(capsys, [*ESTIMATE, "--moe-capacity-factor", "0"])
    assert "0 must be > 0" in message
    dense = ["estimate", "--model", "megatron-gpt-1.7b", "--cluster", "dgx-h100", "--nodes", "1"]
    dense += ["--tp", "1", "--pp", "1", "--ep", "1", "--moe-capacity-factor", "1"]
    assert "--moe-capacity-factor needs a MoE model" in _cli_refusal(capsys, dense)


def test_the_megatron_export_writes_the_capacity_and_its_padding() -> None:
    plan = build_plan(
        model=ap.get_model("qwen3-30b-a3b"),
        cluster=CLUSTER,
        job=_workload(),
        layout=Layout(config=LAYOUT),
        predicted=None,
        estimate_options=dict(moe_capacity_factor=1.25, moe_pad_to_capacity=True),
    )
    text = export_plan(plan, format="megatron").files["megatron_args.sh"].replace("\\\n", " ")
    words = shlex.split(text.split("pretrain_gpt.py", 1)[1])
    index = words.index("--moe-expert-capacity-factor")
    assert words[index + 1] == "1.25"
    assert "--moe-pad-expert-input-to-capacity" in words


def test_published_token_dropping_runs_are_priced_padded_and_within_their_bound() -> None:
    """The Megatron-Bridge 25.09 '(tokendrop)' runs: capacity factor 1.0, inputs padded (the
    recipe's apply_moe_token_drop), priced so; validation rows, never fitted."""
    from cost_model._validation_cases import published_records

    records = [r for r in published_records() if "tokendrop" in r.get("run", "")]
    assert len(records) >= 9
    for record in records:
        assert record["estimate_options"]["moe_pad_to_capacity"] is True
        assert record["estimate_options"]["moe_capacity_factor"] == 1.0
        assert run_config(record).ep > 1
    names = {r["run"] for r in records}
    rows = [row for row in training_rows() if row.run in names]
    assert len(rows) == len(records)
    errors = np.abs([row.predicted / row.published - 1.0 for row in rows])
    assert errors.mean() <= 0.08 and errors.max() <= 0.15, errors
