"""Validation of the serving model on end-to-end public measurements (``data/serving_validation.json``).

Every row is a published result of a whole deployment: a benchmark run (mean TTFT, mean TPOT
and output throughput of a fixed number of requests at a fixed concurrency) or a disaggregated
pool's throughput per node. None is an input of any fit (``calibration.json`` fits training
rows; ``serving_profiles.json`` cites operator-level and runtime publications): a test checks
that the two share no source.

Benchmark rows are priced the way they were measured: the serving simulator
(``_simulator.simulate``) runs the benchmark's protocol — ``num_requests`` requests of the stated
lengths, ``concurrency`` clients that start together, spread evenly over the layout's replicas
— on the iteration cost of the stated layout, with the defaults and floors of the stated engine
at the release it ran (a row's ``engine_version``; the engine's current profile without one). Pool rows
price the pool's pass at its published batch (``_inference_validation``); the Day-6 and DeepSeek
profile rows reuse ``validate_dsv3_day6`` and ``validate_dsv3_profile``.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any, NamedTuple, cast

import numpy as np

from cost_model._bench_serving import RandomRun, RequestLengths, run_request_lengths
from cost_model._inference_load import serving_inputs
from cost_model._inference_validation import (
    _tokens_per_node,
    day6_model,
    validate_dsv3_day6,
    validate_dsv3_profile,
)
from cost_model._model_spec import ModelSpec
from cost_model._options import EstimateOptions, calibration_for
from cost_model._parallel import ParallelConfig
from cost_model._serving_columns import ServingConfig
from cost_model._serving_precision import (
    checkpoint_dtype,
    checkpoint_dtype_by_part,
    checkpoint_fp8_scaling,
    checkpoint_kv_dtype,
)
from cost_model._serving_profile import Engine
from cost_model._simulator import simulate
from cost_model._simulator_layout import dealt_clients, simulate_layout
from cost_model._table import configs_to_table
from cost_model._workload import Inference

#: Engine names of the measurements -> serving profiles (DeepSeek's own engine: SGLang's floors).
ENGINE_PROFILES: dict[str, Engine] = {
    "sglang": "sglang",
    "vllm": "vllm",
    "trtllm": "trtllm",
    "deepseek": "sglang",
}


class ServingValidationRow(NamedTuple):
    """One published figure and the model's prediction; ``error`` = predicted / measured - 1."""

    row_id: str
    source: str
    engine: str
    gpu: str
    deployment: str
    metric: str
    unit: str
    predicted: float
    measured: float

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0


@lru_cache(maxsize=1)
def serving_validation_data() -> dict:
    """``data/serving_validation.json``: ``sources`` by id and ``rows``."""
    return json.loads(
        (resources.files("cost_model") / "data" / "serving_validation.json").read_text()
    )


def row_model(row: dict) -> ModelSpec:
    """The row's model: a config of the file's ``models`` (HF ``config.json`` fields with their
    ``_source``), else ``deepseek-v3`` (the DeepSeek-V3 config of the Day-6 records)."""
    name = row.get("model", "deepseek-v3")
    configs = serving_validation_data().get("models", {})
    if name in configs:
        return ModelSpec.from_hf_config(configs[name], name=name)
    if name != "deepseek-v3":
        raise ValueError(f"row {row['id']!r}: model {name!r} is not in the file's models")
    return day6_model()


def row_weight_dtype_by_part(row: dict) -> dict[str, str]:
    """The parts the row's checkpoint keeps in another dtype than its ``weight_dtype``: from the
    ``quantization_config`` of its model's config (``_serving_precision.checkpoint_dtype_by_part``)
    when that config's checkpoint is in the row's dtype; {} otherwise."""
    config = serving_validation_data().get("models", {}).get(row.get("model", "deepseek-v3"))
    if config is None or checkpoint_dtype(config) != row.get("weight_dtype"):
        return {}
    return checkpoint_dtype_by_part(config, row_model(row))


def row_fp8_scaling(row: dict) -> str:
    """How the row's FP8 weights are scaled: as its model's config declares
    (``_serving_precision.checkpoint_fp8_scaling``) when that config's checkpoint is in the row's
    dtype, else block-scaled (the FP8 releases of the file's MoE models)."""
    config = serving_validation_data().get("models", {}).get(row.get("model", "deepseek-v3"))
    if config is None or checkpoint_dtype(config) != row.get("weight_dtype"):
        return "block"
    return checkpoint_fp8_scaling(config) or "block"


def row_kv_dtype(row: dict) -> str:
    """The row's KV-cache dtype. ``auto`` (the launch sets no KV-cache dtype) is what the engine
    resolves it to: the dtype the checkpoint's ``quantization_config`` declares
    (``_serving_precision.checkpoint_kv_dtype``), else the compute dtype (bf16)."""
    if row["kv_dtype"] != "auto":
        return str(row["kv_dtype"])
    config = serving_validation_data().get("models", {}).get(row.get("model", "deepseek-v3"), {})
    return checkpoint_kv_dtype(config) or "bf16"


def _random_run(spec: list[int]) -> RandomRun:
    input_len, output_len, num_prompts = spec
    return RandomRun(input_len=input_len, output_len=output_len, num_prompts=num_prompts)


def row_request_lengths(row: dict) -> RequestLengths | None:
    """The row's own requests where it states its ``bench_serving`` random run
    (``bench_serving_random``: ``input_len``, ``output_len`` and the ``earlier_runs``
    ``[input_len, output_len, num_prompts]`` its server served before it, default seed):
    lengths as the benchmark draws them, less the prompt tokens the server's prefix cache holds
    (``_bench_serving.run_request_lengths``); None for a row without it."""
    spec = row.get("bench_serving_random")
    if spec is None:
        return None
    run = _random_run([spec["input_len"], spec["output_len"], row["num_requests"]])
    earlier = [_random_run(e) for e in spec.get("earlier_runs", [])]
    return run_request_lengths(run, earlier_runs=earlier)


def _benchmark_workload(row: dict) -> Inference:
    return Inference(
        prompt_tokens=row["prompt_tokens"],
        output_tokens=row["output_tokens"],
        weight_dtype=row["weight_dtype"],
        weight_dtype_by_part=cast(Any, row_weight_dtype_by_part(row)),
        kv_dtype=cast(Any, row_kv_dtype(row)),
        serving_engine=ENGINE_PROFILES[row["engine"]],
        serving_engine_version=row.get("engine_version"),
        max_batched_tokens=row.get("max_batched_tokens"),
        fp8_scaling=cast(Any, row_fp8_scaling(row)),
    )


def simulate_benchmark(row: dict, *, seed: int = 0) -> dict[str, float]:
    """The simulator's mean TTFT / TPOT (ms) and output tokens/s for a benchmark row.

    A row with ``num_requests`` runs exactly that many requests from clients that start
    together, all measured (``bench_serving``'s protocol), with request lengths spread by the
    row's ``prompt_tokens_cv`` / ``output_tokens_cv`` (fixed lengths when absent), or, for a row
    with ``bench_serving_random`` on one replica, the run's own requests
    (``row_request_lengths``). A row without it was measured in
    steady state (a client that reports stable measurement windows of a running closed loop):
    the layout simulation's steady closed loop, whose warm-up is not measured."""
    from topology import get_preset

    cluster = get_preset(row["preset"], num_nodes=row.get("nodes", 1))
    workload = _benchmark_workload(row)
    config = ParallelConfig(**row["config"])
    serving = ServingConfig(batch_size=row.get("max_batch_size_per_rank", 0))
    options = EstimateOptions(calibration=calibration_for(cluster.device))
    table = configs_to_table([config], **serving.columns(workload=workload))
    cost, policy, replicas = serving_inputs(
        model=row_model(row),
        cluster=cluster,
        workload=workload,
        table=table,
        options=options,
    )
    count = float(replicas[0])
    if row.get("num_requests") is None:
        layout = simulate_layout(
            model=row_model(row),
            cluster=cluster,
            workload=workload,
            config=config,
            serving=serving,
            options=options,
            concurrency_per_replica=max(round(row["concurrency"] / count), 1),
            seed=seed,
        )
        steady = layout.result
        return {
            "ttft_ms": float(np.mean(steady.ttft_s)) * 1e3,
            "tpot_ms": float(np.mean(steady.tpot_s)) * 1e3,
            "output_tokens_per_s": steady.output_tokens_per_s * count,
        }
    one = policy.row(0)
    # clients dealt over the replicas (round robin over coupled attention-DP ranks), the run's
    # requests shared by the ranks that hold a client
    clients, _ = dealt_clients(row["concurrency"], count, one)
    busy = sum(1 for held in clients if held) if isinstance(clients, tuple) else 1
    ranks = len(clients) if isinstance(clients, tuple) else 1
    result = simulate(
        cost=cost.row(0),
        policy=one,
        concurrency=clients,
        num_requests=max(round(row["num_requests"] / count * ranks / busy), 1),
        prompt_tokens_cv=row.get("prompt_tokens_cv", 0.0),
        output_tokens_cv=row.get("output_tokens_cv", 0.0),
        seed=seed,
        lengths=row_request_lengths(row) if count == 1 else None,
    )
    tokens = float(
        result.e2e_s.size / result.ranks * row["output_tokens"]
    )  # every request of the run (per rank), over the whole run
    return {
        "ttft_ms": float(np.mean(result.ttft_s)) * 1e3,
        "tpot_ms": float(np.mean(result.tpot_s)) * 1e3,
        "output_tokens_per_s": tokens * count / result.simulated_s,
    }


_BENCHMARK_METRICS = {
    "ttft_ms": ("mean TTFT", "ms"),
    "tpot_ms": ("mean TPOT", "ms"),
    "output_tokens_per_s": ("output throughput", "tokens/s"),
}


def _benchmark_rows(row: dict) -> list[ServingValidationRow]:
    predicted = simulate_benchmark(row)
    measured = row["measured"]
    # Where a run publishes TTFT and TPOT, those are the figures compared; throughput otherwise.
    names = [name for name in ("ttft_ms", "tpot_ms") if name in measured] or ["output_tokens_per_s"]
    return [
        _row(
            row,
            f"{_BENCHMARK_METRICS[name][0]}",
            _BENCHMARK_METRICS[name][1],
            predicted[name],
            measured[name],
        )
        for name in names
    ]


def _pool_rows(row: dict) -> list[ServingValidationRow]:
    precision = {
        "weight_dtype": row["weight_dtype"],
        "weight_dtype_by_part": row_weight_dtype_by_part(row),
        "kv_dtype": row_kv_dtype(row),
        "serving_engine": ENGINE_PROFILES[row["engine"]],
        "serving_engine_version": row.get("engine_version"),
    }
    workload = Inference(
        prompt_tokens=row["prompt_tokens"],
        output_tokens=row["output_tokens"],
        **precision,
    )
    if row["phase"] == "prefill":
        batch = row["tokens_per_device"] // row["prompt_tokens"]
        metric, name = "input tokens/s per node", "input_tokens_per_s_per_node"
    else:
        batch = row["sequences_per_device"]
        metric, name = "output tokens/s per node", "output_tokens_per_s_per_node"
    serving = ServingConfig(
        batch_size=batch,
        phase=row["phase"],
        two_batch_overlap=row.get("two_batch_overlap", False),
    )
    predicted = _tokens_per_node(
        preset=row["preset"],
        nodes=row["nodes"],
        workload=workload,
        config=ParallelConfig(**row["config"]),
        serving=serving,
        calibration=None,
    )
    return [_row(row, metric, "tokens/s/node", predicted, row["measured"][name])]


def _deepseek_rows(row: dict) -> list[ServingValidationRow]:
    """A Day-6 pool (``validate_dsv3_day6``) or a profiled unit (``validate_dsv3_profile``: the
    run its ``profile_run`` names)."""
    if row["kind"] == "dsv3_day6":
        found = [r for r in validate_dsv3_day6() if r.name.startswith(row["phase"])]
    else:
        found = [r for r in validate_dsv3_profile() if r.name.startswith(row["profile_run"])]
    (match,) = found
    return [_row(row, match.metric, match.unit, match.predicted, match.published)]


def _row(
    row: dict, metric: str, unit: str, predicted: float, measured: float
) -> ServingValidationRow:
    return ServingValidationRow(
        row["id"],
        row["source"],
        row["engine"],
        row["gpu"],
        row["deployment"],
        metric,
        unit,
        float(predicted),
        float(measured),
    )


def validate_serving(*, row_ids: tuple[str, ...] | None = None) -> list[ServingValidationRow]:
    """Predicted vs measured for every row of ``data/serving_validation.json`` (or ``row_ids``)."""
    pricers = {
        "benchmark": _benchmark_rows,
        "pool": _pool_rows,
        "dsv3_day6": _deepseek_rows,
        "dsv3_profile": _deepseek_rows,
    }
    rows = []
    for row in serving_validation_data()["rows"]:
        if row_ids is None or row["id"] in row_ids:
            rows.extend(pricers[row["kind"]](row))
    return rows


def metric_kind(row: ServingValidationRow) -> str:
    """``TTFT``, ``TPOT`` or ``throughput`` (every other published figure)."""
    for kind in ("TTFT", "TPOT"):
        if kind in row.metric:
            return kind
    return "throughput"


def summarize_serving(rows: list[ServingValidationRow]) -> dict[str, dict[str, float]]:
    """Count, mean and largest |error| per metric kind (TTFT, TPOT, throughput)."""
    summary = {}
    for kind in ("TTFT", "TPOT", "throughput"):
        errors = np.abs([r.error for r in rows if metric_kind(r) == kind])
        if errors.size:
            summary[kind] = {
                "count": int(errors.size),
                "mean_abs_error": float(errors.mean()),
                "max_abs_error": float(errors.max()),
            }
    return summary


def summarize_serving_by_source(
    rows: list[ServingValidationRow],
) -> dict[str, dict[str, dict[str, float]]]:
    """``summarize_serving`` for each source's rows: source -> metric kind -> count, mean and
    largest |error| (a source is one publication, so one protocol and one set of engines)."""
    sources = dict.fromkeys(r.source for r in rows)
    return {
        source: summarize_serving([r for r in rows if r.source == source]) for source in sources
    }


def held_out_serving_rows(rows: list[ServingValidationRow] | None = None) -> list[dict]:
    """The TTFT and TPOT rows of ``validate_serving`` (every row when ``rows`` is None) with the
    regime their run belongs to, as ``_error_band.serving_error_bands`` reads them: row id,
    source, engine profile and its release group (the ``ServingProfile`` version that priced
    the row), GPU generation, MoE or dense, deployment, metric and ``time_error`` = measured /
    predicted - 1 (> 0: the model was optimistic)."""
    from cost_model._error_band import generation_of
    from cost_model._serving_profile import serving_profile

    rows = validate_serving() if rows is None else rows
    records = {row["id"]: row for row in serving_validation_data()["rows"]}
    out = []
    for row in rows:
        kind = metric_kind(row)
        if kind not in ("TTFT", "TPOT"):
            continue
        record = records[row.row_id]
        out.append(
            {
                "id": row.row_id,
                "source": row.source,
                "engine": ENGINE_PROFILES[record["engine"]],
                "release": serving_profile(
                    ENGINE_PROFILES[record["engine"]], record.get("engine_version")
                ).version,
                "generation": generation_of(record["gpu"]),
                "moe": row_model(record).moe is not None,
                "deployment": row.deployment,
                "metric": kind,
                "time_error": row.measured / row.predicted - 1.0,
            }
        )
    return out
