"""The public serving table: coverage, per-row sources, and no source shared with any fit input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import cost_model
from autoparallel.cli import main
from cost_model import ParallelConfig
from cost_model._serving_profile import serving_profile
from cost_model._serving_validation import (
    ServingValidationRow,
    _benchmark_workload,
    held_out_serving_rows,
    row_model,
    serving_validation_data,
    simulate_benchmark,
    summarize_serving,
    summarize_serving_by_source,
    validate_serving,
)

DATA = Path(cost_model.__file__).parent / "data"


def _rows() -> list[dict]:
    return serving_validation_data()["rows"]


def test_the_table_covers_engines_gpus_deployments_and_loads() -> None:
    rows, sources = _rows(), serving_validation_data()["sources"]
    assert len(rows) >= 40
    assert len({row["source"] for row in rows}) >= 4 and all(
        row["source"] in sources for row in rows
    )
    assert all(
        sources[name]["url"].startswith("https://") and sources[name]["title"] for name in sources
    )
    engines = {row["engine"] for row in rows} - {"deepseek"}
    assert {"sglang", "vllm", "trtllm"} <= engines
    assert len({row["gpu"] for row in rows}) >= 3
    assert {row["deployment"] for row in rows} == {"colocated", "disaggregated"}
    loads = [row["concurrency"] for row in rows if "concurrency" in row]
    assert min(loads) <= 4 and max(loads) >= 128
    with_latency = [row for row in rows if "ttft_ms" in row.get("measured", {})]
    assert len(with_latency) >= 40 and all("tpot_ms" in row["measured"] for row in with_latency)
    # The TTFT/TPOT rows alone: several publications, engines, GPU kinds and loads.
    assert len({row["source"] for row in with_latency}) >= 4
    assert len({row["engine"] for row in with_latency}) >= 2
    assert len({row["gpu"] for row in with_latency}) >= 3
    latency_loads = [row["concurrency"] for row in with_latency]
    assert min(latency_loads) <= 4 and max(latency_loads) >= 128


def _fit_sources() -> set[str]:
    """Every source behind a fitted or sourced constant: the calibration's fit inputs (operator
    tables and the kernel figures, with their sources), the serving profiles' citations and the
    routing statistics of the expert-load skew (``data/expert_load_skew.json``)."""
    calibration = json.loads((DATA / "calibration.json").read_text())
    inputs = [item for entry in calibration["calibrations"] for item in entry["fit"]["inputs"]]
    assert inputs, "the calibration names its fit inputs"
    tables = {table for item in inputs for table in item["tables"]}
    profiles = json.loads((DATA / "serving_profiles.json").read_text())
    cited = " ".join(" ".join(profile["sources"].values()) for profile in profiles["profiles"])
    skew = json.loads((DATA / "expert_load_skew.json").read_text())["source"]
    cited += " " + skew["url"]
    words = " ".join(item["source"] for item in inputs) + " " + cited
    urls = {word.rstrip(".,;)'\"") for word in words.split() if word.startswith("http")}
    return urls | tables | {item["source"] for item in inputs} | {skew["id"], skew["title"]}


def test_no_validation_source_is_a_fit_input() -> None:
    fit = _fit_sources()
    assert fit, "the fit inputs name their sources"
    for name, source in serving_validation_data()["sources"].items():
        assert name not in fit and source["title"] not in fit
        for url in (source["url"], source.get("also", "")):
            assert not url or all(url.rstrip("/") != other.rstrip("/") for other in fit), (
                name,
                url,
            )
    # and no serving row is a fit input: the fits are operator tables
    assert not any(row["source"] in fit for row in _rows())


def test_a_benchmark_row_is_priced_under_its_protocol() -> None:
    row = next(r for r in _rows() if r["id"] == "dstack:h200:vllm:c4:in3200:out800")
    predicted = simulate_benchmark(row)
    assert predicted["ttft_ms"] > 0 and predicted["tpot_ms"] > 0
    # The four clients start together: their first prompts queue behind each other's prefill.
    alone = simulate_benchmark({**row, "concurrency": 1, "num_requests": 8})
    assert predicted["ttft_ms"] > alone["ttft_ms"] and predicted["tpot_ms"] > alone["tpot_ms"]
    (ttft, tpot) = validate_serving(row_ids=(row["id"],))
    assert (
        ttft.measured == row["measured"]["ttft_ms"] and tpot.measured == row["measured"]["tpot_ms"]
    )
    assert ttft.error == pytest.approx(ttft.predicted / ttft.measured - 1)


def test_a_row_without_a_request_count_is_priced_in_steady_state() -> None:
    """The NIM page publishes no request count: its rows run the steady closed loop, where the
    clients have drifted apart, instead of one wave of clients that start together and queue
    behind each other's 5,000-token prefills."""
    row = next(
        r for r in _rows() if r["id"] == "nim:h100:trtllm:llama-3.3-70b:tp2:c50:in5000:out500"
    )
    assert "num_requests" not in row
    steady = simulate_benchmark(row)
    wave = simulate_benchmark({**row, "num_requests": 100})
    assert 0 < steady["ttft_ms"] < wave["ttft_ms"]
    assert steady["tpot_ms"] == pytest.approx(wave["tpot_ms"], rel=0.25)


def test_a_row_carries_the_spread_of_its_request_lengths() -> None:
    """SGLang's bench_serving draws random-dataset lengths uniformly from 1 to L (coefficient of
    variation 1/sqrt(3)): the cookbook rows carry that spread and the simulator draws it, so
    long and short prompts of one wave no longer finish their prefills together."""
    rows = [r for r in _rows() if r["source"] == "sglang-cookbook"]
    assert rows and all(r["prompt_tokens_cv"] == pytest.approx(3**-0.5, abs=1e-3) for r in rows)
    row = next(
        r for r in rows if r["id"] == "sglang-cookbook:b200:qwen3-235b:tp8:c16:in8000:out1000"
    )
    row = {k: v for k, v in row.items() if k != "bench_serving_random"}  # drawn, not replayed
    spread = simulate_benchmark(row)
    fixed = simulate_benchmark({**row, "prompt_tokens_cv": 0.0, "output_tokens_cv": 0.0})
    assert spread["ttft_ms"] != pytest.approx(fixed["ttft_ms"], rel=1e-3)
    assert spread["tpot_ms"] > 0 and fixed["tpot_ms"] > 0


def test_pool_rows_compare_throughput_per_node() -> None:
    rows = validate_serving(
        row_ids=("lmsys-large-ep:h100:prefill:in2000", "deepseek-day6:h800:decode")
    )
    assert next(r.unit for r in rows) == "tokens/s/node" and all(
        np.isfinite(r.predicted) and r.predicted > 0 for r in rows
    )
    assert rows[1].measured == 14800.0


def test_validate_serving_cli_prints_the_table(capsys) -> None:
    assert main(["validate", "--serving", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert len(payload["rows"]) >= 90 and set(payload["summary"]) == {
        "TTFT",
        "TPOT",
        "throughput",
    }
    assert all(row["source_url"].startswith("https://") for row in payload["rows"])
    assert set(payload["summary_by_source"]) == {row["source"] for row in payload["rows"]}
    # The error bars of serving estimates (data/serving_held_out.json) are these rows' errors
    # as priced now (benchmarks/serving_held_out.py rewrites them).
    priced = [
        ServingValidationRow(**{name: row[name] for name in ServingValidationRow._fields})
        for row in payload["rows"]
    ]
    shipped = json.loads((DATA / "serving_held_out.json").read_text())["rows"]
    now = held_out_serving_rows(priced)
    assert len(shipped) == len(now) >= 2 * 40
    for old, new in zip(shipped, now):
        assert {k: v for k, v in old.items() if k != "time_error"} == {
            k: v for k, v in new.items() if k != "time_error"
        }
        assert old["time_error"] == pytest.approx(new["time_error"], rel=1e-9), (
            f"{new['id']}: rerun python benchmarks/serving_held_out.py"
        )


def test_the_summary_per_source_splits_the_summary_per_metric() -> None:
    rows = validate_serving(
        row_ids=(
            "dstack:h200:vllm:c4:in3200:out800",
            "nim:h100:trtllm:llama-3.3-70b:tp2:c1:in5000:out500",
            "nim:h100:trtllm:llama-3.3-70b:tp2:c50:in5000:out500",
        )
    )
    by_source = summarize_serving_by_source(rows)
    assert set(by_source) == {
        "dstack-deepseek-r1-mi300x-h200-2025",
        "nvidia-nim-llm-benchmarking-performance",
    }
    nim = by_source["nvidia-nim-llm-benchmarking-performance"]
    assert nim["TTFT"]["count"] == 2 and nim["TPOT"]["count"] == 2
    errors = [
        abs(r.error) for r in rows if r.source.startswith("nvidia-nim") and "TTFT" in r.metric
    ]
    assert nim["TTFT"]["mean_abs_error"] == pytest.approx(np.mean(errors))
    assert nim["TTFT"]["max_abs_error"] == pytest.approx(max(errors))
    overall = summarize_serving(rows)
    assert sum(s["TTFT"]["count"] for s in by_source.values()) == overall["TTFT"]["count"]


def test_a_row_runs_the_model_its_source_served() -> None:
    """The NIM rows serve Llama 3.3 70B (the Llama 3.1 70B architecture), given as HF config
    fields in the file; a row naming a model the file does not hold is refused."""
    row = next(r for r in _rows() if r["id"].startswith("nim:h100:"))
    model = row_model(row)
    assert model.num_layers == 80 and model.moe is None
    assert model.attention.num_kv_heads == 8
    assert row_model({"id": "x"}).moe is not None  # DeepSeek-V3 by default
    with pytest.raises(ValueError, match="not in the file's models"):
        row_model({"id": "x", "model": "no-such-model"})


def test_nim_rows_run_a_modelopt_fp8_checkpoint() -> None:
    """NIM's fp8 engines are ModelOpt FP8 quantizations: per-tensor weight scales (the
    ``fp8_tensor`` GEMM tables) and the LM head in BF16, as ModelOpt's export declares; the
    block-scaled DeepSeek releases keep the block-scaled tables."""
    from cost_model._serving_precision import checkpoint_fp8_scaling
    from cost_model._serving_validation import row_fp8_scaling, row_weight_dtype_by_part

    row = next(r for r in _rows() if r["id"].startswith("nim:h100:"))
    assert row_fp8_scaling(row) == "tensor"
    assert row_weight_dtype_by_part(row)["lm_head"] == "bf16"
    dstack = next(r for r in _rows() if r["id"].startswith("dstack:h200:trtllm"))
    assert row_fp8_scaling(dstack) == "block"
    deepseek = {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    assert checkpoint_fp8_scaling(deepseek) == "block"
    assert checkpoint_fp8_scaling({"torch_dtype": "bfloat16"}) is None


def test_a_row_runs_the_engine_settings_its_launch_states() -> None:
    """The dstack TensorRT-LLM server was launched with ``--max_num_tokens 16384`` (the
    source's launch command, recorded with the engine versions): the row carries that budget
    and the simulator runs it, so a wave of four 3,200-token prompts fits in one iteration
    instead of two: every prompt of a wave waits for the whole larger iteration, so its mean
    TTFT is clearly longer than under the default budget."""
    data = serving_validation_data()
    engines = data["sources"]["dstack-deepseek-r1-mi300x-h200-2025"]["engines"]
    assert "--max_num_tokens 16384" in engines["trtllm:H200"]
    row = next(r for r in _rows() if r["id"] == "dstack:h200:trtllm:c4:in3200:out800")
    assert row["max_batched_tokens"] == 16384
    launched = simulate_benchmark(row)
    default = simulate_benchmark({k: v for k, v in row.items() if k != "max_batched_tokens"})
    assert launched["ttft_ms"] > 1.15 * default["ttft_ms"]


def test_a_row_is_priced_with_the_profile_of_the_release_it_ran() -> None:
    """dstack's early-2025 runs name their engines' releases; each resolves to that release's
    profile (not the current one), and pricing the row without it changes the prediction."""
    dated = [row for row in _rows() if row["source"] == "dstack-deepseek-r1-mi300x-h200-2025"]
    assert dated and all("engine_version" in row for row in dated)
    for row in dated:
        workload = _benchmark_workload(row)
        assert workload.serving_engine_version == row["engine_version"]
        assert not serving_profile(row["engine"], row["engine_version"]).default
    row = next(r for r in dated if r["id"] == "dstack:h200:trtllm:c4:in3200:out800")
    current = {key: value for key, value in row.items() if key != "engine_version"}
    # the deepseek branch ran without CUDA graphs: every decode step is eager, so slower
    assert simulate_benchmark(row)["tpot_ms"] > simulate_benchmark(current)["tpot_ms"]


def test_dstack_rows_run_the_layouts_and_budgets_their_launch_commands_state() -> None:
    """dstack's README records each launch: SGLang H200 with --enable-dp-attention (attention
    data-parallel, experts tensor-parallel over all 8 GPUs, chunked prefill 8192 // 2 per
    scheduler), TensorRT-LLM with --ep_size 4 (experts over 4 groups of 2 ranks), vLLM H200
    with neither --max-model-len nor --enable-chunked-prefill (V0 prefills up to
    max(max_model_len, 2048) tokens); every run sent --num-prompts 500."""
    source = serving_validation_data()["sources"]["dstack-deepseek-r1-mi300x-h200-2025"]
    engines = source["engines"]
    rows = [row for row in _rows() if row["source"] == "dstack-deepseek-r1-mi300x-h200-2025"]
    assert all(row["num_requests"] == 500 for row in rows)
    assert "--num-prompts 500" in source["protocol"]
    for row in rows:
        key = f"{row['engine']}:{row['gpu']}"
        config = ParallelConfig(**row["config"])
        assert config.tp == 8 and config.attention_data_parallel == (
            "--enable-dp-attention" in engines[key]
        )
        assert config.ep == (4 if "--ep_size 4" in engines[key] else 1)
        assert config.ep * config.etp == 8
        if row["engine"] == "vllm" and "--max-model-len" not in engines[key]:
            assert row["max_batched_tokens"] == max(row_model(row).max_context_tokens, 2048)
    assert any(ParallelConfig(**row["config"]).attention_data_parallel for row in rows)


def test_a_v0_wave_of_prompts_is_prefilled_in_one_iteration() -> None:
    """vLLM 0.7.4's V0 engine does not chunk an MLA model's prompts: the four clients' first
    prompts (12,800 tokens, inside the 163,840-token budget) run as one prefill iteration and
    all wait for it, where a 2,048-token chunked budget lets the first prompts finish early."""
    row = next(r for r in _rows() if r["id"] == "dstack:h200:vllm:c4:in3200:out800")
    assert not serving_profile("vllm", row["engine_version"]).chunked_prefill
    whole = simulate_benchmark(row)["ttft_ms"]
    chunked = simulate_benchmark({**row, "max_batched_tokens": 2048})["ttft_ms"]
    assert whole > 1.1 * chunked


def test_the_lmsys_units_default_routing_is_priced_below_its_perfect_eplb_twin() -> None:
    """The blog's 4K-prompt prefill unit measured twice: with the data's routing behind EPLB
    (50,302 tokens/s per node) and with random routing (59,337). The first carries real
    traffic's expert-load skew (``_routing_skew``), the second none, so the model orders them as
    measured."""
    default, perfect = validate_serving(
        row_ids=(
            "lmsys-large-ep:h100:prefill:in4000",
            "lmsys-large-ep:h100:prefill:in4000:perfect-eplb",
        )
    )
    assert default.measured < perfect.measured
    assert default.predicted < perfect.predicted
