"""The published training runs as cases: each table's model, layout, workload, software and metric.

Each record of ``data/published_runs.json`` becomes a ``Case``: the parallel layout and the
software of the run (recompute, sequence parallel, attention kernel, dropout, gradient-reduce
overlap), the hardware whose cluster preset prices it, and the metric of the table with the
function that computes it from an estimate:

* ``megatron_sc21_table1`` — TFLOP/s per GPU, counted with the paper's formula (Narayanan et
  al. SC'21 eq. 3: 96·B·s·l·h²·(1 + s/6h + V/16lh), which includes the recompute forward)
  applied to the predicted iteration time.
* ``korthikanti_table5`` — iteration time, full recompute and SP + selective recompute.
* ``megatron_readme_2022_mfu`` — MFU of the SP + selective runs of Table 5 (the README's
  model FLOPs: 72·B·s·l·h²·(1 + s/6h + V/16lh)).
* ``korthikanti_fig1_memory`` — per-GPU memory: parameters + optimizer (18 bytes/parameter)
  of a middle pipeline rank, activations of the first rank without recompute and with
  SP + selective recompute.
* ``megatron_readme_h100`` — MFU (Megatron-core's model FLOPs:
  72·B·s·l·h²·(1 + s/6h + V/12lh), i.e. logits counted 3x).

The ``"format": "run"`` records are read by ``cost_model._validation_runs``; the B200/GB200
runs (``data/published_runs_blackwell.json``) and the peak-memory runs
(``data/published_peak_memory.json``) are cases here too. ``_validation`` estimates and
scores them. Every run is validation only, never a fit input.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from cost_model._model_spec import ModelSpec
from cost_model._parallel import ParallelConfig
from cost_model._validation_runs import run_config, run_metric, run_model, run_workload
from cost_model._workload import Training

#: Korthikanti et al. 2022 Table 3 architectures (sequence 2048, vocabulary 51200 as in sec. 6).
KORTHIKANTI_MODELS: dict[str, dict[str, int]] = {
    "22B": {"heads": 64, "hidden": 6144, "layers": 48},
    "175B": {"heads": 96, "hidden": 12288, "layers": 96},
    "530B": {"heads": 128, "hidden": 20480, "layers": 105},
    "1T": {"heads": 160, "hidden": 25600, "layers": 128},
}

#: The software of each table's runs (facts of the run, not fitted): the framework profile
#: (``data/framework_profiles.json``: kernels and overlap features) and the run's dropout.
#: * Megatron-LM 2021-22 (A100 tables): hidden and attention dropout 0.1.
#: * Megatron-core r0.8 (H100 table): no dropout in the performance configs, sequence
#:   parallel whenever tp > 1; the loss is the eager vocab-parallel cross entropy (the README
#:   names only --overlap-grad-reduce, --overlap-param-gather and --tp-comm-overlap, and
#:   --cross-entropy-loss-fusion is off by default in megatron/training/arguments.py at
#:   937571cfd4).
SOFTWARE: dict[str, dict[str, Any]] = {
    "megatron_2021": {
        "framework": "megatron-lm-2021",
        "hidden_dropout": True,
        "attention_dropout": True,
    },
    "megatron_core_2024": {
        "framework": "megatron-core",
        "hidden_dropout": False,
        "attention_dropout": False,
        "unfused_cross_entropy": True,
    },
}
PRESETS = {
    "A100": "dgx-a100",
    "H100": "dgx-h100",
    "H200": "dgx-h200",
    "H800": "hgx-h800",
    "B200": "dgx-b200",
    "GB200": "gb200-nvl72",
    "GB300": "gb300-nvl72",
}
#: The publication behind each table of the older record forms; the README's 2022 MFU figures
#: are the Table 5 runs of Korthikanti et al., so they share its source.
TABLE_SOURCES = {
    "megatron_sc21_table1": "narayanan2021",
    "korthikanti_table5": "korthikanti2022",
    "megatron_readme_2022_mfu": "korthikanti2022",
    "megatron_readme_h100": "megatron_core_readme_2024",
}


@dataclass(frozen=True)
class Case:
    """One published run to re-estimate and how to score it."""

    table: str
    run: str
    hardware: str  # key of PRESETS
    model: ModelSpec
    workload: Training
    config: ParallelConfig
    software: str
    metrics: tuple[tuple[str, str, float, Callable[[dict, Case], float]], ...] = field(default=())
    source_id: str = ""
    estimate_options: tuple[tuple[str, Any], ...] = ()  # EstimateOptions facts of the run
    #: The run's recompute, offload and gradient settings where its publication's recipe
    #: states them (``memory_setup`` of the record; see ``memory_inputs``); used by the
    #: throughput estimate and the memory checks alike.
    memory_setup: tuple[tuple[str, Any], ...] = ()

    @property
    def source(self) -> str:
        """The independent publication this case comes from (the leave-one-source-out unit)."""
        return self.source_id or TABLE_SOURCES[self.table]


@lru_cache(maxsize=1)
def published_records() -> tuple[dict, ...]:
    """The records of ``cost_model/data/published_runs.json`` (a copy of the shared reference,
    each record with its source)."""
    text = (resources.files("cost_model") / "data" / "published_runs.json").read_text()
    return tuple(json.loads(text)["records"])


def gpt_model(
    *, name: str, heads: int, hidden: int, layers: int, vocab: int, sequence: int, tied: bool
) -> ModelSpec:
    """A Megatron GPT (GELU MLP of 4h, LayerNorm, biases, learned positions)."""
    config = {
        "model_type": "gpt2",
        "n_layer": layers,
        "n_embd": hidden,
        "n_head": heads,
        "n_positions": sequence,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
    }
    return ModelSpec.from_hf_config(config, name=name)


def record_gpt_model(record: dict, *, tied: bool) -> ModelSpec:
    """The Megatron GPT (``gpt_model``) of a published-table record: its model name, heads,
    hidden size, layers, vocabulary and sequence length."""
    return gpt_model(
        name=f"gpt-{record['model']}",
        heads=record["heads"],
        hidden=record["hidden"],
        layers=record["layers"],
        vocab=record["vocab"],
        sequence=record["seq_len"],
        tied=tied,
    )


def sc21_flops(case: Case, *, recompute_forward: bool, logit_divisor: float) -> float:
    """Narayanan et al. SC'21 eq. 3 family: c·B·s·l·h²·(1 + s/6h + V/(d·l·h)), c = 96 with the
    recompute forward, 72 without."""
    m, w = case.model, case.workload
    s, h, layers = w.sequence_length_tokens, m.hidden_size, m.num_layers
    factor = 96.0 if recompute_forward else 72.0
    return (
        factor
        * w.sequences_per_step
        * s
        * layers
        * h
        * h
        * (1.0 + s / (6.0 * h) + m.vocab_size / (logit_divisor * layers * h))
    )


def _tflops_sc21(columns: dict, case: Case) -> float:
    return (
        sc21_flops(case, recompute_forward=True, logit_divisor=16.0)
        / (columns["step_time_s"][0] * case.config.world_size)
        / 1e12
    )


def _mfu(logit_divisor: float, peak: float) -> Callable[[dict, Case], float]:
    def metric(columns: dict, case: Case) -> float:
        flops = sc21_flops(case, recompute_forward=False, logit_divisor=logit_divisor)
        return 100.0 * flops / (columns["step_time_s"][0] * case.config.world_size * peak)

    return metric


def _iteration_time(columns: dict, case: Case) -> float:
    return float(columns["step_time_s"][0])


def _sc21_cases() -> list[Case]:
    cases = []
    for r in (r for r in published_records() if r["table"] == "megatron_sc21_table1"):
        model = record_gpt_model(r, tied=True)
        v = (
            1
            if r["layers_per_virtual_stage"] is None
            else r["layers"] // (r["pp"] * r["layers_per_virtual_stage"])
        )
        config = ParallelConfig(
            tp=r["tp"],
            pp=r["pp"],
            dp=r["gpus"] // (r["tp"] * r["pp"]),
            micro_batch_size=r["micro_batch"],
            recompute="full",
            virtual_stages=v,
            pipeline_schedule="interleaved_1f1b" if v > 1 else "1f1b",
        )
        workload = Training(
            sequence_length_tokens=r["seq_len"],
            global_batch_sequences=r["global_batch"],
            precision="fp16",
        )
        metric = ("tflops_per_gpu", "TFLOP/s", float(r["tflops_per_gpu"]), _tflops_sc21)
        cases.append(
            Case(
                r["table"], r["model"], "A100", model, workload, config, "megatron_2021", (metric,)
            )
        )
    return cases


def _korthikanti_model(name: str) -> ModelSpec:
    arch = KORTHIKANTI_MODELS[name]
    return gpt_model(name=f"gpt-{name}", vocab=51200, sequence=2048, tied=True, **arch)


def _table5_config(r: dict, *, selective: bool) -> ParallelConfig:
    v = r["pipeline_interleaving"]
    return ParallelConfig(
        tp=r["tp"],
        pp=r["pp"],
        dp=r["gpus"] // (r["tp"] * r["pp"]),
        micro_batch_size=r["micro_batch"],
        virtual_stages=v,
        pipeline_schedule="interleaved_1f1b" if v > 1 else "1f1b",
        recompute="selective" if selective else "full",
        sequence_parallel=selective,
    )


def _table5_cases() -> list[Case]:
    cases = []
    mfu = {
        r["model"]: r["mfu_pct"]
        for r in published_records()
        if r["table"] == "megatron_readme_2022_mfu"
    }
    for r in (r for r in published_records() if r["table"] == "korthikanti_table5"):
        model = _korthikanti_model(r["model"])
        workload = Training(
            sequence_length_tokens=r["seq_len"],
            global_batch_sequences=r["global_batch"],
            precision="fp16",
        )
        full = (
            "iteration_time_full_recompute",
            "s",
            r["iter_time_full_recompute_s"],
            _iteration_time,
        )
        selective = (
            "iteration_time_sp_selective",
            "s",
            r["iter_time_seqpar_selective_s"],
            _iteration_time,
        )
        cases.append(
            Case(
                r["table"],
                r["model"],
                "A100",
                model,
                workload,
                _table5_config(r, selective=False),
                "megatron_2021",
                (full,),
            )
        )
        cases.append(
            Case(
                r["table"],
                r["model"],
                "A100",
                model,
                workload,
                _table5_config(r, selective=True),
                "megatron_2021",
                (selective,),
            )
        )
        if r["model"] in mfu:
            metric = ("mfu", "%", float(mfu[r["model"]]), _mfu(16.0, 312e12))
            config = _table5_config(r, selective=True)
            cases.append(
                Case(
                    "megatron_readme_2022_mfu",
                    r["model"],
                    "A100",
                    model,
                    workload,
                    config,
                    "megatron_2021",
                    (metric,),
                )
            )
    return cases


def _h100_cases() -> list[Case]:
    """Megatron-core r0.8 GPT runs. The README gives tp, pp, dp and the global batch; the rest
    is Megatron-core's performance setup and is assumed: micro-batch 1, no recompute, sequence
    parallel with tp > 1, distributed optimizer (ZeRO-1), plain 1F1B, bf16. Gradients are fp32
    main gradients reduced in fp32: Megatron-LM's megatron/training/arguments.py at the README's
    commit (937571cfd4) turns accumulate_allreduce_grads_in_fp32 on whenever --bf16 is set."""
    cases = []
    for r in (r for r in published_records() if r["table"] == "megatron_readme_h100"):
        model = record_gpt_model(r, tied=False)
        config = ParallelConfig(
            tp=r["tp"],
            pp=r["pp"],
            dp=r["dp"],
            micro_batch_size=1,
            sequence_parallel=r["tp"] > 1,
            zero_stage=1,
        )
        workload = Training(
            sequence_length_tokens=r["seq_len"],
            global_batch_sequences=r["global_batch"],
            precision="bf16",
            gradient_dtype="fp32",
        )
        metric = ("mfu", "%", float(r["mfu_pct"]), _mfu(12.0, 989e12))
        cases.append(
            Case(
                r["table"],
                r["model"],
                "H100",
                model,
                workload,
                config,
                "megatron_core_2024",
                (metric,),
            )
        )
    return cases


def _generic_cases() -> list[Case]:
    """The ``"format": "run"`` records (``cost_model._validation_runs``)."""
    cases = []
    for r in (r for r in published_records() if r.get("format") == "run"):
        cases.append(
            Case(
                r["table"],
                r["run"],
                r["hardware"],
                run_model(r),
                run_workload(r),
                run_config(r),
                "framework",
                (run_metric(r),),
                source_id=r["source_id"],
                estimate_options=tuple(r.get("estimate_options", {}).items()),
                memory_setup=_frozen_setup(r),
            )
        )
    return cases


def _frozen_setup(record: dict) -> tuple[tuple[str, Any], ...]:
    setup = record.get("memory_setup", {})
    return tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in setup.items())


def blackwell_cases() -> list[Case]:
    """The runs of ``data/published_runs_blackwell.json`` as cases (table
    ``blackwell_training``), for the memory checks; their throughput rows come from
    ``cost_model._blackwell_validation``."""
    from cost_model._blackwell_validation import blackwell_records, record_case

    hardware = {preset: name for name, preset in PRESETS.items()}
    cases = []
    for r in blackwell_records():
        model, _, workload, config = record_case(r)
        cases.append(
            Case(
                "blackwell_training",
                r["run"],
                hardware[r["preset"]],
                model,
                workload,
                config,
                "framework",
                source_id="megatron_bridge_perf"
                if "Megatron-Bridge" in r["source"]
                else "nemo_framework_docs",
                memory_setup=_frozen_setup(r),
            )
        )
    return cases


def training_cases() -> list[Case]:
    """Every published training run whose throughput is compared (not the memory figure)."""
    return _sc21_cases() + _table5_cases() + _h100_cases() + _generic_cases()


@lru_cache(maxsize=1)
def peak_memory_records() -> tuple[dict, ...]:
    """The records of ``data/published_peak_memory.json``: runs whose source publishes the peak
    memory per device (validation only)."""
    text = (resources.files("cost_model") / "data" / "published_peak_memory.json").read_text()
    return tuple(json.loads(text)["records"])


def peak_memory_cases() -> list[tuple[Case, float]]:
    """(case, published peak GiB) for each record of ``peak_memory_records``."""
    cases = []
    for r in peak_memory_records():
        workload = run_workload(r).model_copy(update={"fp8_recipe": r.get("fp8_recipe", "current")})
        case = Case(
            r["table"],
            r["run"],
            r["hardware"],
            run_model(r),
            workload,
            run_config(r),
            "",
            estimate_options=tuple(r.get("estimate_options", {}).items()),
            memory_setup=_frozen_setup(r),
        )
        cases.append((case, float(r["peak_memory_GiB"])))
    return cases
