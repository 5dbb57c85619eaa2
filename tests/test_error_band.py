"""The error bar of a training estimate (``cost_model.training_error_band``): the held-out errors
of the published runs in the estimate's regime, shipped beside the calibration and equal to the
current prediction, widened one key at a time until enough runs share it, printed by
``autoparallel estimate``."""

from __future__ import annotations

import json
import re
from importlib import resources

import numpy as np
import pytest

import autoparallel as ap
from autoparallel.cli import main
from cost_model import ParallelConfig, training_error_band
from cost_model._cross_validation import held_out_runs
from cost_model._error_band import MIN_RUNS, generation_of
from cost_model._validation import ValidationRow, run_case
from cost_model._validation_cases import training_cases


def _shipped_runs() -> list[dict]:
    text = (resources.files("cost_model") / "data" / "calibration.json").read_text()
    return json.loads(text)["held_out"]["per_run"]


def test_the_shipped_per_run_errors_are_the_current_prediction() -> None:
    cases = training_cases()
    rows = [row for case in cases for row in run_case(case)]
    now = held_out_runs(rows, cases)
    shipped = _shipped_runs()
    assert len(shipped) == len(now) == len(rows)
    for old, new in zip(shipped, now):
        assert {k: v for k, v in old.items() if k != "speed_error"} == {
            k: v for k, v in new.items() if k != "speed_error"
        }
        assert old["speed_error"] == pytest.approx(new["speed_error"], rel=1e-9, abs=1e-12), (
            f"{new['run']}: rerun python benchmarks/calibrate_operators.py"
        )


def test_a_time_figure_counts_too_slow_as_a_negative_speed_error() -> None:
    time = ValidationRow(table="t", run="r", metric="m", unit="s", predicted=2.0, published=1.0)
    rate = ValidationRow(table="t", run="r", metric="m", unit="%", predicted=2.0, published=1.0)
    assert time.error == pytest.approx(1.0) and time.speed_error == pytest.approx(-0.5)
    assert rate.speed_error == rate.error == pytest.approx(1.0)


def test_the_band_takes_the_narrowest_regime_with_enough_runs() -> None:
    runs = _shipped_runs()
    cluster = ap.get_preset("dgx-h100", num_nodes=32)
    config = ParallelConfig(
        dp=16,
        tp=2,
        pp=8,
        ep=32,
        virtual_stages=4,
        pipeline_schedule="interleaved_1f1b",
        sequence_parallel=True,
    )
    band = training_error_band(ap.get_model("qwen3-235b-a22b"), cluster, config)
    assert band is not None and band.scope == "Hopper, MoE, tp+pp+ep"
    same = [
        r["speed_error"]
        for r in runs
        if r["generation"] == "Hopper" and r["moe"] and r["parallelism"] == "tp+pp+ep"
    ]
    assert band.count == len(same) >= MIN_RUNS
    assert band.bias == pytest.approx(np.mean(same))
    assert min(same) <= band.low <= band.high <= max(same)
    low, high = band.time_range_s(10.0)
    assert low == pytest.approx(10.0 * (1 + band.low)) and high == pytest.approx(
        10.0 * (1 + band.high)
    )
    # No published run pipelines a 3T MoE 16 ways on GB200 with tp 4: the band widens.
    wide = training_error_band(
        ap.get_model("ref-3t-moe"),
        ap.get_preset("gb200-nvl72", num_nodes=16),
        ParallelConfig(dp=16, tp=4, pp=16, ep=64, sequence_parallel=True),
    )
    assert wide is not None and wide.scope == "Blackwell, MoE"
    assert wide.count > band.count


def test_generations_and_an_uncovered_device() -> None:
    assert generation_of("NVIDIA H200 SXM") == "Hopper"
    assert generation_of("NVIDIA GB200") == "Blackwell"
    assert generation_of("AMD Instinct MI300X") == "CDNA3"
    assert generation_of("Ascend 910B") is None
    # No published training run on MI300X: the band drops the generation.
    band = training_error_band(
        ap.get_model("tiny-moe"), ap.get_preset("mi300x", num_nodes=1), ParallelConfig(dp=8)
    )
    assert band is not None and band.scope in ("MoE, dp", "MoE")


def _text_and_document(capsys, job: list[str]) -> tuple[str, dict]:
    """What ``job`` prints (whitespace collapsed) and what it prints with ``--json``."""
    assert main(job) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert main([*job, "--json"]) == 0
    return text, json.loads(capsys.readouterr().out)


def test_estimate_prints_the_error_bar_of_a_training_layout(capsys) -> None:
    job = ["estimate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-b200", "--nodes", "1"]
    job += ["--tp", "1", "--pp", "1", "--ep", "8", "--sequence-length", "4096"]
    job += ["--global-batch-tokens", "2097152"]
    text, document = _text_and_document(capsys, job)
    assert "Error bar:" in text and "(Blackwell, MoE, ep;" in text
    band = document["error_band"]
    low, high = band["step_time_range_s"]
    assert low < high and band["scope"] == "Blackwell, MoE, ep"
    assert low == pytest.approx(document["step_time_s"] * (1 + band["low"]))


def test_a_training_plan_prints_the_error_bar_of_its_layout(tmp_path, capsys) -> None:
    job = ["plan", "--model", "tiny-moe", "--cluster", "dgx-h100", "--nodes", "1", "--training"]
    job += ["--sequence-length", "256", "--global-batch-tokens", "8192", "--trials", "5"]
    assert main([*job, "--output", str(tmp_path / "plan.json")]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Error bar:" in text and "published runs like this one (Hopper, MoE" in text
    assert "Memory error bar: " in text


def test_a_serving_estimate_gets_the_band_of_its_engine_generation_and_model_kind(capsys) -> None:
    from cost_model import serving_error_bands

    bands = serving_error_bands(
        ap.get_model("llama-3.1-405b"),
        ap.get_preset("dgx-h100", num_nodes=1),
        engine="trtllm",
        deployment="colocated",
    )
    assert set(bands) == {"TTFT", "TPOT"}
    # the NIM rows ran TensorRT-LLM's current releases, as this estimate does
    assert bands["TTFT"].scope == "trtllm 1.0-1.1, Hopper, dense, colocated"
    assert bands["TTFT"].count >= 3
    shipped = json.loads(
        (resources.files("cost_model") / "data" / "serving_held_out.json").read_text()
    )["rows"]
    same = [
        r["time_error"]
        for r in shipped
        if r["metric"] == "TTFT"
        and (r["engine"], r["generation"], r["moe"], r["deployment"])
        == ("trtllm", "Hopper", False, "colocated")
    ]
    assert bands["TTFT"].bias == pytest.approx(np.mean(same))
    job = ["estimate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-b200", "--nodes", "1"]
    job += ["--tp", "1", "--pp", "1", "--ep", "8", "--inference", "--serving-engine", "sglang"]
    assert main(job) == 0
    text = " ".join(capsys.readouterr().out.split())
    # no public run of SGLang's current releases: the band of its earlier ones, named
    assert (
        "Error bar: public runs like this one (sglang, Blackwell, MoE, colocated, measured on "
        "sglang 0.5.3-0.5.9;" in text
    )

    def sglang_ttft_scope(preset: str, version: str | None = None) -> str:
        bands = serving_error_bands(
            ap.get_model("qwen3-30b-a3b"),
            ap.get_preset(preset, num_nodes=1),
            engine="sglang",
            deployment="colocated",
            version=version,
        )
        return bands["TTFT"].scope

    older = sglang_ttft_scope("dgx-b200", "0.5.6")
    assert older == "sglang 0.5.3-0.5.9, Blackwell, MoE, colocated"
    # on Hopper the public SGLang runs are of early-2025 releases (0.4.2-0.4.3) and of the
    # releases just before the current ones on other GPUs: the nearer software is taken
    hopper = sglang_ttft_scope("dgx-h100")
    assert hopper == "sglang, MoE, colocated, measured on sglang 0.5.3-0.5.9"
    # no public run measured a disaggregated deployment's TTFT: the band says whose it is
    disaggregated = serving_error_bands(
        ap.get_model("deepseek-v3"),
        ap.get_preset("gb200-nvl72", num_nodes=1),
        engine="sglang",
        deployment="disaggregated",
    )
    assert disaggregated["TTFT"].scope.endswith(", colocated deployments")
    # 0.4.6-0.4.7 have no runs; 0.4.8-0.5.2 neither; 0.4.2-0.4.3 are as near and on Hopper
    assert sglang_ttft_scope("dgx-h100", "0.4.7").endswith("measured on sglang 0.4.2-0.4.3")


def test_the_memory_band_takes_the_published_peaks_of_the_layouts_regime(capsys) -> None:
    """Peak memory has its error bar too: the published peaks (torchtitan's runs, validation
    only) of the layout's parallel dimensions, widened to its ZeRO-3 class and pipelining, then
    to every run; the error is published / predicted - 1 (> 0: the model was low)."""
    from cost_model import memory_error_band
    from cost_model._error_band import _memory_runs
    from cost_model._validation import GIB, peak_memory_rows

    runs = _memory_runs()
    rows = {row.run: row for row in peak_memory_rows()}
    for run in runs:  # the band's errors are the validation table's
        row = rows[run["run"]]
        assert run["memory_error"] == pytest.approx(row.published / row.predicted - 1.0)
    fsdp = memory_error_band(ParallelConfig(dp=64, zero_stage=3))
    assert fsdp is not None and fsdp.scope.startswith("zero3;")
    same = [r["memory_error"] for r in runs if r["parallelism"] == "zero3"]
    assert fsdp.count == len(same) >= MIN_RUNS
    assert fsdp.bias == pytest.approx(np.mean(same))
    # No published peak of a ZeRO-1 layout: the band says it spans every run with a peak.
    megatron = memory_error_band(ParallelConfig(dp=8, tp=8, pp=4, sequence_parallel=True))
    assert megatron is not None and megatron.scope.startswith("every run with a published peak")
    assert megatron.count == len(runs)
    job = ["estimate", "--model", "llama-3.1-405b", "--cluster", "dgx-h100", "--nodes", "64"]
    job += ["--tp", "8", "--pp", "8", "--zero-stage", "3"]
    text, document = _text_and_document(capsys, job)
    assert "Memory error bar: " in text and "(tp+pp+zero3;" in text
    band = document["memory_error_band"]
    low, high = band["memory_range_bytes"]
    assert low == pytest.approx(document["memory_per_device_bytes"] * (1 + band["low"]))
    assert high > low > 0 and high / GIB < 200


def test_a_layout_whose_memory_error_bar_passes_the_device_is_flagged(tmp_path, capsys) -> None:
    """The plan keeps layouts that fit as priced; where the memory error bar's 90th percentile
    passes the device, plan and estimate say so, by how much, and how to find more room."""
    job = ["plan", "--training", "--model", "llama-3.1-405b", "--cluster", "dgx-h100"]
    job += ["--nodes", "64", "--sequence-length", "8192", "--global-batch-tokens", "16777216"]
    assert main([*job, "--output", str(tmp_path / "plan.json")]) == 0
    text = " ".join(capsys.readouterr().out.split())
    plan = json.loads((tmp_path / "plan.json").read_text())["predicted"]
    assert plan["memory_per_device_bytes"] <= plan["memory_capacity_bytes"]
    assert "Memory at risk:" in text
    assert re.search(r"over\); `--memory-fraction 0\.9\d` plans within", text)
    small = ["estimate", "--model", "megatron-gpt-1.7b", "--cluster", "dgx-h100", "--nodes", "1"]
    assert main([*small, "--tp", "1", "--pp", "1"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Memory error bar:" in text and "Memory at risk:" not in text


def test_a_memory_fraction_plans_with_a_margin(tmp_path, capsys) -> None:
    """``--memory-fraction F`` prices as if each device had F of its memory: the estimate's
    capacity shrinks by F, the plan keeps its layouts within it (the 405B plan that was at risk
    at 78.9 of 80 GB picks a layout with room), and a fraction above 1 is refused in one line."""
    small = ["estimate", "--model", "megatron-gpt-1.7b", "--cluster", "dgx-h100", "--nodes", "1"]
    small += ["--tp", "1", "--pp", "1", "--json"]
    assert main(small) == 0
    whole = json.loads(capsys.readouterr().out)["memory_capacity_bytes"]
    assert main([*small, "--memory-fraction", "0.9"]) == 0
    assert json.loads(capsys.readouterr().out)["memory_capacity_bytes"] == pytest.approx(
        0.9 * whole
    )
    job = ["plan", "--training", "--model", "llama-3.1-405b", "--cluster", "dgx-h100"]
    job += ["--nodes", "64", "--sequence-length", "8192", "--global-batch-tokens", "16777216"]
    assert main([*job, "--memory-fraction", "0.9", "--output", str(tmp_path / "plan.json")]) == 0
    text = " ".join(capsys.readouterr().out.split())
    predicted = json.loads((tmp_path / "plan.json").read_text())["predicted"]
    assert predicted["memory_per_device_bytes"] <= 0.9 * whole
    assert "Memory at risk:" not in text
    assert main([*small, "--memory-fraction", "1.5"]) == 2
    assert "--memory-fraction (1.5) must be in (0, 1]" in capsys.readouterr().err
