"""Validation of the inference model on DeepSeek-V3/R1 production serving (open-infra Day 6).

Published (``cost_model/data/dsv3_day6.json``, kept verbatim with its source): 73.7k input
tokens/s per H800 node in prefill (cache hits included) and 14.8k output tokens/s per node in
decode, averaged over 24 h. The published deployment units are modelled as they are described:

* prefill: routed experts EP32, MLA and shared expert DP32 (4 nodes), 32 redundant experts,
  dual micro-batch overlap;
* decode: EP144 / DP144 (18 nodes), 32 redundant experts, two micro-batches overlapped;
* FP8 matmuls and FP8 dispatch, BF16 core attention (MLA) and BF16 combine; BF16 KV cache.

Workload, DERIVED from the same records: prefix-cache hit rate = hit input tokens / input tokens
(342B / 608B); output length O and prompt length P from the input/output token ratio
r = 608B / 168B and the mean KV length per output token K = 4,989 = P + (O + 1) / 2, so
O = (K - 1/2) / (r + 1/2), P = r O; the TPOT SLO is 1 / 21 s (published 20-22 tokens/s per user).
Each pool serves the largest batch that memory holds and, for decode, that meets the TPOT.

Efficiencies are the shared calibration of the device (``cost_model/data/calibration.json``):
the H800 is the H100's GH100 die, so it takes the H100-class entry fitted on the Megatron H100
training rows. Nothing here is fitted on these two rows: they are an out-of-sample check.
The published figures are 24-hour production averages, while the model predicts what a fully
loaded unit serves; requests' prompt lengths are known only through their means. Prefill
attention grows with the square of a prompt's length and every layer's all-to-all waits for the
busiest of the 32 attention ranks, so a spread of prompt lengths costs more than the mean prompt
the model prices (DeepSeek's prefill load balancer exists for this); the model has no input for
that spread, and the prefill row stays above its published figure (see ``validate``).
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import NamedTuple

from cost_model._common import Calibration, EstimateOptions, calibration_for
from cost_model._inference import estimate_inference_table
from cost_model._model_spec import ModelSpec
from cost_model._parallel import ParallelConfig
from cost_model._serving_columns import ServingConfig
from cost_model._table import configs_to_table
from cost_model._workload import Inference

#: The published TPOT is a range of 20-22 tokens/s per user; its midpoint is the SLO.
PUBLISHED_TOKENS_PER_S_PER_USER = 21.0
H800_PRESET = "hgx-h800"


class ValidationRow(NamedTuple):
    """One published figure and the model's prediction; ``error`` = predicted / published - 1."""

    name: str
    predicted: float
    published: float
    error: float
    metric: str = ""
    unit: str = ""


@lru_cache(maxsize=1)
def day6_records() -> dict:
    """The Day-6 records by field, plus ``source`` and the model's HF config."""
    data = json.loads((resources.files("cost_model") / "data" / "dsv3_day6.json").read_text())
    records = {record["field"]: record["value"] for record in data["records"]}
    return {"source": data["source"], "records": records, "model_config": data["model_config"]}


def day6_model() -> ModelSpec:
    return ModelSpec.from_hf_config(day6_records()["model_config"], name="deepseek-v3")


def day6_workload() -> Inference:
    """The served workload, derived from the published token counts (see the module docstring)."""
    records = day6_records()["records"]
    ratio = records["total_input_tokens_24h"] / records["total_output_tokens_24h"]
    output_tokens = (records["avg_kv_cache_len_per_output_token"] - 0.5) / (ratio + 0.5)
    return Inference(
        prompt_tokens=round(ratio * output_tokens),
        output_tokens=round(output_tokens),
        prefix_cache_hit_rate=records["cache_hit_input_tokens_24h"] / records["total_input_tokens_24h"],
        tpot_slo_s=1.0 / PUBLISHED_TOKENS_PER_S_PER_USER,
        weight_dtype="fp8",
        activation_dtype="bf16",
        kv_dtype="bf16",
    )


def _published_serving(phase: str) -> ServingConfig:
    """32 redundant experts and two overlapped micro-batches in both pools."""
    return ServingConfig(num_redundant_experts=32, phase=phase, two_batch_overlap=True)


def day6_units() -> dict[str, tuple[int, ParallelConfig, ServingConfig]]:
    """``{pool: (nodes, config, serving)}`` of the published prefill and decode units."""
    return {
        "prefill": (4, ParallelConfig(dp=32, ep=32), _published_serving("prefill")),
        "decode": (18, ParallelConfig(dp=144, ep=144), _published_serving("decode")),
    }


def predict_day6(*, calibration: Calibration | None = None) -> dict[str, float]:
    """Predicted tokens/s per H800 node of each pool (input tokens for prefill, output for decode)."""
    from topology import get_preset

    model, workload = day6_model(), day6_workload()
    predictions = {}
    for pool, (nodes, config, serving) in day6_units().items():
        cluster = get_preset(H800_PRESET, num_nodes=nodes)
        options = EstimateOptions(calibration=calibration or calibration_for(cluster.device))
        table = configs_to_table([config], **serving.columns(workload=workload))
        columns = estimate_inference_table(model=model, cluster=cluster, workload=workload, table=table, options=options)
        predictions[pool] = float(columns["tokens_per_s_per_device"][0]) * cluster.devices_per_node
    return predictions


def validate_dsv3_day6(*, calibration: Calibration | None = None) -> list[ValidationRow]:
    """Predicted vs published Day-6 throughput per H800 node, prefill then decode."""
    records = day6_records()["records"]
    published = {
        "prefill": float(records["prefill_throughput_tokens_per_s_per_H800_node"]),
        "decode": float(records["decode_throughput_tokens_per_s_per_H800_node"]),
    }
    names = {"prefill": "prefill unit EP32/DP32, 4 nodes", "decode": "decode unit EP144/DP144, 18 nodes"}
    metrics = {"prefill": "input tokens/s per H800 node (cache hits included)", "decode": "output tokens/s per H800 node"}
    predicted = predict_day6(calibration=calibration)
    return [
        ValidationRow(names[p], predicted[p], published[p], predicted[p] / published[p] - 1.0, metrics[p], "tokens/s/node")
        for p in ("prefill", "decode")
    ]


def day6_fleet_rows(*, calibration: Calibration | None = None) -> list[ValidationRow]:
    """DERIVED check of the rate matching: split the published average fleet (226.75 nodes)
    between prefill and decode units with ``disaggregated_split`` and compare the requests it
    serves, as input and output tokens per second, with the 24 h totals / 86,400 s."""
    from topology import get_preset

    from cost_model._serving import PoolConfig, disaggregated_split

    records = day6_records()["records"]
    units = day6_units()
    cluster = get_preset(H800_PRESET, num_nodes=int(records["peak_nodes"]))
    split = disaggregated_split(
        model=day6_model(), cluster=cluster, workload=day6_workload(),
        prefill=PoolConfig(config=units["prefill"][1], serving=units["prefill"][2]),
        decode=PoolConfig(config=units["decode"][1], serving=units["decode"][2]),
        num_devices=int(records["avg_nodes"] * cluster.devices_per_node),
        options=EstimateOptions(calibration=calibration or calibration_for(cluster.device)),
    )
    seconds = 24 * 3600.0
    published = {kind: records[f"total_{kind}_tokens_24h"] / seconds for kind in ("input", "output")}
    predicted = {"input": split.input_tokens_per_s, "output": split.output_tokens_per_s}
    return [
        ValidationRow(
            f"fleet of the average {records['avg_nodes']} nodes, rate-matched (DERIVED)", predicted[kind], published[kind],
            predicted[kind] / published[kind] - 1.0, f"{kind} tokens/s, 24 h total / 86,400 s", "tokens/s",
        )
        for kind in ("input", "output")
    ]
