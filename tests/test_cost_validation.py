"""Predicted vs published: acceptance per table, the calibration data and its fit, the CLI."""

from __future__ import annotations

import importlib.util
import json
import time
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from autoparallel import get_model
from autoparallel.cli import main
from cost_model import Training, estimate_table
from cost_model._common import Calibration, calibration_for
from cost_model._table import select_rows
from cost_model._validation import (
    FIT_PARAMETERS,
    KORTHIKANTI_MODELS,
    TOLERANCES,
    _log_errors,
    _nelder_mead,
    calibration_with,
    published_records,
    robust_loss,
    run_case,
    summarize,
    training_cases,
    training_rows,
)
from topology import get_preset

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rows():
    return training_rows()


def test_every_training_table_is_within_its_tolerance(rows) -> None:
    summary = summarize(rows)
    assert set(summary) == {
        "megatron_sc21_table1",
        "korthikanti_table5",
        "megatron_readme_2022_mfu",
        "megatron_readme_h100",
        "korthikanti_fig1_memory",
        "torchtitan_a100_fsdp",
        "llama3_table4",
        "megatron_bridge_perf",
    }
    for table, figures in summary.items():
        mean, largest = TOLERANCES.get(table, (0.05, 0.12))
        assert mean is None or figures["mean_abs_error"] <= mean, (table, figures)
        assert largest is None or figures["max_abs_error"] <= largest, (table, figures)


def test_every_published_training_run_is_compared(rows) -> None:
    records = [r for r in published_records() if r["kind"] == "training"]
    sc21 = [r for r in records if r["table"] == "megatron_sc21_table1"]
    table5 = [r for r in records if r["table"] == "korthikanti_table5"]
    assert len([r for r in rows if r.table == "megatron_sc21_table1"]) == len(sc21) == 10
    assert len([r for r in rows if r.table == "korthikanti_table5"]) == 2 * len(table5) == 8
    assert len([r for r in rows if r.table == "korthikanti_fig1_memory"]) == 12
    assert len([r for r in rows if r.table == "megatron_readme_h100"]) == 9
    assert all(r.get("source") for r in published_records())


def test_sc21_tflops_use_the_papers_formula(rows) -> None:
    """TFLOP/s = 96·B·s·l·h²·(1 + s/6h + V/16lh) / (predicted iteration time · GPUs), by hand."""
    from cost_model._table import configs_to_table
    from cost_model._validation import _cluster, _options, _workload

    case = next(c for c in training_cases() if c.table == "megatron_sc21_table1" and c.run == "1T")
    row = next(r for r in rows if r.table == "megatron_sc21_table1" and r.run == "1T")
    cluster = _cluster(case.hardware, case.config.world_size)
    columns = estimate_table(
        case.model,
        cluster,
        _workload(case),
        configs_to_table([case.config]),
        options=_options(case, None, cluster),
    )
    b, s, layers, h, v = 3072, 2048, 128, 25600, 51200
    flops = 96 * b * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
    assert (
        case.config.world_size == 3072 and case.config.pp == 64 and case.config.recompute == "full"
    )
    assert row.predicted == pytest.approx(
        flops / (columns["step_time_s"][0] * 3072) / 1e12, rel=1e-12
    )


def test_korthikanti_architectures_match_the_catalog() -> None:
    model = get_model("megatron-gpt-22b")
    arch = KORTHIKANTI_MODELS["22B"]
    assert (model.attention.num_heads, model.hidden_size, model.num_layers) == (
        arch["heads"],
        arch["hidden"],
        arch["layers"],
    )
    for name, catalog in (
        ("175B", "gpt3-175b"),
        ("530B", "megatron-gpt-530b"),
        ("1T", "megatron-gpt-1t"),
    ):
        spec = get_model(catalog)
        arch = KORTHIKANTI_MODELS[name]
        assert (spec.attention.num_heads, spec.hidden_size, spec.num_layers) == (
            arch["heads"],
            arch["hidden"],
            arch["layers"],
        )


# ------------------------------------------------------------------------------ calibration
def test_shipped_calibrations_are_documented_fits() -> None:
    document = json.loads((resources.files("cost_model") / "data" / "calibration.json").read_text())
    assert {c["device_pattern"] for c in document["calibrations"]} == {"A100", "H100|H200|H800"}
    for entry in document["calibrations"]:
        fit = entry["fit"]
        assert len(fit["rows"]) == len(fit["residuals"]) >= 9
        # A robust fit: most rows close, a few (small-expert MoE runs) far; the A100 rows all close.
        assert np.median(np.abs(fit["residuals"])) < 0.1
        if entry["device_pattern"] == "A100":
            assert max(abs(r) for r in fit["residuals"]) < 0.15
        assert fit["preset"] in ("dgx-a100", "dgx-h100")


def test_calibration_is_chosen_by_hardware_type() -> None:
    assert calibration_for(get_preset("dgx-a100").device).device_pattern == "A100"
    for preset in ("dgx-h100", "dgx-h200", "hgx-h800"):
        assert calibration_for(get_preset(preset).device).device_pattern == "H100|H200|H800"
    assert calibration_for(get_preset("mi300x").device) == Calibration()


def test_shipped_a100_fit_is_a_local_least_squares_optimum() -> None:
    """Moving the fitted matmul efficiency either way makes the A100 fit loss worse."""
    names = FIT_PARAMETERS["A100"]
    shipped = calibration_for(get_preset("dgx-a100").device)
    values = np.array([getattr(shipped, name) for name in names])
    cases = [c for c in training_cases() if c.hardware == "A100"]
    loss = {
        step: robust_loss(_log_errors(cases, calibration_with(names, values * np.array([step, 1]))))
        for step in (0.95, 1.0, 1.05)
    }
    assert loss[1.0] < loss[0.95] and loss[1.0] < loss[1.05]


def test_nelder_mead_finds_a_quadratic_minimum() -> None:
    target = np.array([0.7, 0.4, 1.2])
    best = _nelder_mead(
        lambda x: float(np.sum((x - target) ** 2)), np.array([0.5, 0.5, 1.0]), max_evaluations=400
    )
    np.testing.assert_allclose(best, target, atol=1e-3)


def test_calibration_bounds_clip() -> None:
    calibration = calibration_with(("matmul_efficiency", "overlap.tp_comm"), [1.7, -0.2])
    assert calibration.matmul_efficiency == 1.0 and calibration.overlap == {"tp_comm": 0.0}


# ------------------------------------------------------------------------------ speed (CPU time)
def test_a_table_is_much_faster_than_one_config_at_a_time() -> None:
    spec = importlib.util.spec_from_file_location(
        "cost_model_speed", REPO / "benchmarks" / "cost_model_speed.py"
    )
    speed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(speed)
    config_table = speed.config_table
    model = get_model("ref-3t-moe")
    cluster = get_preset("dgx-h200", num_nodes=128)
    workload = Training(sequence_length_tokens=4096, global_batch_tokens=4096 * 4096)
    table, _ = config_table(model, cluster.num_devices, 20000)
    started = time.process_time()
    estimate_table(model, cluster, workload, table)
    batch = (time.process_time() - started) / 20000
    singles = [select_rows(table, [i]) for i in range(0, 20000, 1000)]
    started = time.process_time()
    for one in singles:
        estimate_table(model, cluster, workload, one)
    single = (time.process_time() - started) / len(singles)
    assert single / batch > 50


# ------------------------------------------------------------------------------ CLI
def test_validate_command_prints_the_tables(capsys) -> None:
    assert main(["validate", "--table", "korthikanti_fig1_memory", "--strict"]) == 0
    out = capsys.readouterr().out
    assert "activations_sp_selective" in out and "Mean and max absolute error" in out


def test_validate_command_rejects_an_unknown_table(capsys) -> None:
    assert main(["validate", "--table", "no_such_table"]) == 2
    assert "no_such_table" in capsys.readouterr().err


def test_estimate_command_prints_a_breakdown_and_reports_infeasible(capsys) -> None:
    assert main(["estimate", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["step_time_s"] == pytest.approx(sum(payload["time_s"].values()))
    assert main(["estimate", "--tp", "1", "--pp", "1", "--ep", "8", "--zero-stage", "0"]) == 2
    assert "optimizer_states" in capsys.readouterr().err


# ------------------------------------------------------------------------------ generalization
def test_no_shipped_parameter_sits_at_a_bound() -> None:
    """A fitted value at its bound means the fit wanted a value the physics forbids: a term is
    missing. Every fitted parameter of every shipped calibration is strictly inside."""
    from cost_model._validation import BOUNDS

    for hardware, names in FIT_PARAMETERS.items():
        shipped = calibration_for(
            get_preset({"A100": "dgx-a100", "H100": "dgx-h100"}[hardware]).device
        )
        for name in names:
            value = (
                shipped.overlap[name.split(".", 1)[1]]
                if name.startswith("overlap.")
                else getattr(shipped, name)
            )
            low, high = BOUNDS[name]
            margin = 1e-3 * (high - low)
            assert low + margin < value < high - margin, (hardware, name, value, (low, high))
        assert len(names) <= 3


def test_leave_one_source_out_never_fits_on_the_source_it_predicts(monkeypatch) -> None:
    from cost_model import _cross_validation

    cases = [c for c in training_cases() if c.hardware == "H100"]
    assert len({c.source for c in cases}) >= 2
    seen = []
    real_fit = _cross_validation.fit_calibration

    def spying_fit(hardware, *, max_evaluations, cases):
        seen.append({c.source for c in cases})
        return real_fit(hardware, max_evaluations=max_evaluations, cases=cases)

    monkeypatch.setattr(_cross_validation, "fit_calibration", spying_fit)
    rows = _cross_validation.leave_one_source_out(max_evaluations=4, cases=cases)
    sources = list(dict.fromkeys(c.source for c in cases))
    assert seen == [set(sources) - {source} for source in sources]
    assert len(rows) == sum(len(c.metrics) for c in cases)
    # Predicted without its own source, a figure differs from the shipped fit's prediction.
    shipped = {(r.table, r.run): r.predicted for c in cases for r in run_case(c)}
    assert any(abs(r.predicted / shipped[(r.table, r.run)] - 1) > 1e-6 for r in rows)


def test_the_published_set_spans_sources_hardware_and_kinds() -> None:
    cases = training_cases()
    assert len(cases) >= 60 and len({c.source for c in cases}) >= 6
    assert {c.hardware for c in cases} >= {"A100", "H100", "B200", "GB200"}  # three generations
    assert any(c.model.moe is not None and c.config.ep > 1 for c in cases)
    assert any(c.config.zero_stage == 3 for c in cases)
    assert any(c.config.cp > 1 for c in cases)
    assert all(
        r.get("source") and r.get("source_id")
        for r in published_records()
        if r.get("format") == "run"
    )


def test_shipped_cross_validation_figures_are_recorded() -> None:
    document = json.loads((resources.files("cost_model") / "data" / "calibration.json").read_text())
    figures = document["cross_validation"]
    assert (
        figures["fit"]["count"] == figures["leave_one_source_out"]["count"] == len(training_cases())
    )
    assert (
        figures["leave_one_source_out"]["mean_abs_error"] >= figures["fit"]["mean_abs_error"] * 0.9
    )


def test_leave_one_source_out_carries_the_reference_fit_over_to_unfitted_hardware(
    monkeypatch,
) -> None:
    """B200/GB200 are never fitted: as in the shipped model, their rows are predicted with the
    H100 fit (here made without their source) carried over, not with the bare preset."""
    from cost_model import _cross_validation
    from cost_model._calibration_transfer import transferred_calibration
    from cost_model._common import Calibration
    from cost_model._validation import _cluster

    cases = [c for c in training_cases() if c.hardware in ("H100", "GB200")]
    gb200 = [c for c in cases if c.hardware == "GB200"]
    assert gb200 and {c.source for c in gb200} == {gb200[0].source}
    fitted = []
    real_fit = _cross_validation.fit_calibration

    def spying_fit(hardware, *, max_evaluations, cases):
        fitted.append(
            (
                hardware,
                {c.source for c in cases},
                real_fit(hardware, max_evaluations=max_evaluations, cases=cases),
            )
        )
        return fitted[-1][2]

    monkeypatch.setattr(_cross_validation, "fit_calibration", spying_fit)
    rows = _cross_validation.leave_one_source_out(max_evaluations=4, cases=cases)
    source = gb200[0].source
    h100_without = [
        fit for hardware, sources, fit in fitted if hardware == "H100" and source not in sources
    ]
    assert len(h100_without) == 1  # fitted once for the source, shared by H100 and GB200 rows
    carried = transferred_calibration(_cluster("GB200", 8).device, [h100_without[0]])
    expected = {
        (r.table, r.run): r.predicted for c in gb200 for r in run_case(c, calibration=carried)
    }
    bare = {
        (r.table, r.run): r.predicted for c in gb200 for r in run_case(c, calibration=Calibration())
    }
    got = {(r.table, r.run): r.predicted for r in rows if (r.table, r.run) in expected}
    assert got == expected and got != bare


def test_held_out_errors_are_grouped_and_printed_per_run(capsys) -> None:
    from dataclasses import asdict

    from autoparallel.cli._cost import _print_generalization
    from cost_model._cross_validation import (
        GROUPINGS,
        error_summary,
        grouped_errors,
        parallelism_label,
    )

    cases = [c for c in training_cases() if c.hardware in ("H100", "GB200")]
    rows = [row for case in cases for row in run_case(case)]
    groups = {by: grouped_errors(rows, cases, by=by) for by in GROUPINGS}
    assert sum(g["count"] for g in groups["source"].values()) == len(rows)
    assert {"megatron-core"} <= set(groups["framework"])
    assert any("zero3" in name for name in groups["parallelism"]) and any(
        "ep" in name for name in groups["parallelism"]
    )
    for by in GROUPINGS:
        for g in groups[by].values():
            assert g["max_abs_error"] >= g["mean_abs_error"] >= abs(g["mean_error"]) - 1e-12
    assert parallelism_label(cases[0]) in groups["parallelism"]
    with pytest.raises(ValueError, match="by"):
        grouped_errors(rows, cases, by="colour")
    runs = [dict(row.model_dump(), error=row.error, fit_error=row.error) for row in rows]
    figures = {
        "fit": asdict(error_summary(rows, cases)),
        "leave_one_source_out": asdict(error_summary(rows, cases)),
        "leave_one_source_out_runs": runs,
        "leave_one_source_out_groups": groups,
    }
    _print_generalization(figures)
    printed = capsys.readouterr().out
    assert (
        "by parallelism" in printed
        and "megatron_bridge_perf" in printed
        and "each source predicted" in printed
    )
