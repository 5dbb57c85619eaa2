"""``sequence_sweep``: latency, throughput and memory of one layout from 4K to 1M tokens.

The *super-linear point* is the first length at which the local scaling exponent of latency,
``d log(latency) / d log(length)`` measured between consecutive lengths of the sweep, exceeds
``threshold`` (default 1.2): below it the per-token work (matmuls, weight and KV reads)
dominates and latency grows about linearly; above it the quadratic work of full attention does.
Sliding-window, sparse top-k and linear attention bound the keys per query
(``AttentionSpec.attended_tokens``) and the cache (``ModelSpec.kv_cache_bytes``), which moves the
point out or removes it.

Inference latency is the time to first token of one prompt of each length per replica (and the
decode step at that context is reported too); training latency is the step time per sequence,
with the global batch kept at about the same number of tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_model._model_spec import ModelSpec
from cost_model._options import EstimateOptions
from cost_model._parallel import ParallelConfig
from cost_model._table import configs_to_table
from cost_model._workload import Inference, Training

#: 4K, 8K, ..., 1M tokens.
DEFAULT_LENGTHS: tuple[int, ...] = tuple(4096 * 2**k for k in range(9))
DEFAULT_SUPERLINEAR_THRESHOLD = 1.2


@dataclass(frozen=True)
class SequenceSweep:
    """One row per length. ``latency_s`` is TTFT (inference) or step time per sequence
    (training); ``tpot_s`` is NaN for training; ``scaling_exponent[i]`` is the slope of
    log latency between lengths i-1 and i (NaN at i = 0 or where a row does not fit)."""

    lengths: np.ndarray
    latency_s: np.ndarray
    tpot_s: np.ndarray
    tokens_per_s_per_device: np.ndarray
    memory_per_device_bytes: np.ndarray
    feasible: np.ndarray
    scaling_exponent: np.ndarray
    threshold: float
    superlinear_length: int | None

    def rows(self) -> list[dict[str, float]]:
        """The sweep as a list of plain dicts (for tables and JSON)."""
        names = (
            "lengths",
            "latency_s",
            "tpot_s",
            "tokens_per_s_per_device",
            "memory_per_device_bytes",
            "feasible",
            "scaling_exponent",
        )
        return [
            {name: getattr(self, name)[i].item() for name in names}
            for i in range(len(self.lengths))
        ]


def superlinear_point(
    lengths, latency_s, *, threshold: float = DEFAULT_SUPERLINEAR_THRESHOLD
) -> tuple[np.ndarray, int | None]:
    """Local scaling exponents and the first length whose exponent exceeds ``threshold``."""
    lengths = np.asarray(lengths, dtype=np.float64)
    latency = np.asarray(latency_s, dtype=np.float64)
    if np.any(np.diff(lengths) <= 0):
        raise ValueError(f"lengths ({lengths.tolist()}) must be strictly increasing")
    exponent = np.full(lengths.shape, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        exponent[1:] = np.diff(np.log(latency)) / np.diff(np.log(lengths))
    above = np.flatnonzero(exponent > threshold)
    return exponent, (int(lengths[above[0]]) if above.size else None)


def sequence_sweep(
    model: ModelSpec,
    cluster,
    workload: Inference | Training,
    config: ParallelConfig,
    *,
    lengths=DEFAULT_LENGTHS,
    serving=None,
    threshold: float = DEFAULT_SUPERLINEAR_THRESHOLD,
    options: EstimateOptions | None = None,
) -> SequenceSweep:
    """Evaluate ``config`` at every length; see the module docstring for what is measured.

    ``serving`` (a ``ServingConfig``) applies to inference; by default one sequence per replica,
    colocated prefill and decode. Lengths that do not fit in memory are reported with
    ``feasible`` False, not raised.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.ndim != 1 or lengths.size < 2 or np.any(lengths <= 0):
        raise ValueError(f"lengths ({lengths.tolist()}) must be at least two positive token counts")
    config.validate_for(
        model, num_redundant_experts=serving.num_redundant_experts if serving is not None else 0
    )
    if isinstance(workload, Inference):
        columns = _inference_rows(model, cluster, workload, config, lengths, serving, options)
    elif isinstance(workload, Training):
        columns = _training_rows(model, cluster, workload, config, lengths, options)
    else:
        raise ValueError(f"workload ({type(workload).__name__}) must be Training or Inference")
    latency = np.where(columns["feasible"], columns["latency_s"], np.nan)
    exponent, point = superlinear_point(lengths, latency, threshold=threshold)
    return SequenceSweep(
        lengths=lengths,
        scaling_exponent=exponent,
        threshold=threshold,
        superlinear_length=point,
        **columns,
    )


def _inference_rows(
    model, cluster, workload, config, lengths, serving, options
) -> dict[str, np.ndarray]:
    from cost_model._inference_load import estimate_inference_table
    from cost_model._serving_columns import ServingConfig

    serving = serving or ServingConfig(batch_size=1)
    table = configs_to_table(
        [config] * lengths.size, **serving.columns(workload=workload, length=lengths.size)
    )
    columns = estimate_inference_table(
        model=model,
        cluster=cluster,
        workload=workload,
        table=table,
        options=options,
        prompt_tokens=lengths,
    )
    return {
        "latency_s": columns["ttft_s"],
        "tpot_s": columns["tpot_s"],
        "tokens_per_s_per_device": columns["tokens_per_s_per_device"],
        "memory_per_device_bytes": columns["memory_per_device_bytes"],
        "feasible": columns["feasible"],
    }


def _training_rows(
    model, cluster, workload: Training, config, lengths, options
) -> dict[str, np.ndarray]:
    from cost_model._estimate import estimate_table

    names = (
        "latency_s",
        "tpot_s",
        "tokens_per_s_per_device",
        "memory_per_device_bytes",
        "feasible",
    )
    rows: dict[str, list] = {name: [] for name in names}
    replica = config.dp * config.micro_batch_size
    for length in lengths.tolist():
        sequences = max(1, round(workload.global_batch_tokens / length / replica)) * replica
        at_length = workload.model_copy(
            update={
                "sequence_length_tokens": length,
                "global_batch_sequences": sequences,
                "global_batch_tokens": sequences * length,
            }
        )
        columns = estimate_table(
            model, cluster, at_length, configs_to_table([config]), options=options
        )
        rows["latency_s"].append(columns["step_time_s"][0] / sequences)
        rows["tpot_s"].append(np.nan)
        rows["tokens_per_s_per_device"].append(columns["tokens_per_s_per_device"][0])
        rows["memory_per_device_bytes"].append(columns["memory_per_device_bytes"][0])
        rows["feasible"].append(bool(columns["feasible"][0]))
    return {name: np.asarray(values) for name, values in rows.items()}
