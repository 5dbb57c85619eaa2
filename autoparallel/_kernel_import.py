"""Import public per-operator kernel tables into the cost model's kernel curves (fit inputs).

Source: NVIDIA's ``aiconfigurator-core`` package (PyPI, Apache-2.0), whose wheel ships
per-operator latency tables measured per device, engine and engine version under
``aiconfigurator_core/systems/data/<device>/<op>/<engine>/<version>/*.parquet``. Only
operator tables are read — the fused MoE expert layer (``moe/*/moe_perf.parquet``, for the
expert shapes of ``EXPERT_SHAPES``), MLA decode and prefill attention
(``mla/*/generation_mla_perf.parquet``, ``context_mla_perf.parquet``), the batched GEMMs of
absorbed MLA decode (``mla_bmm/*/mla_bmm_perf.parquet``, kept as measured), MHA/GQA context
and decode attention (``attention/*/context_attention_perf.parquet``,
``generation_attention_perf.parquet``) and dense GEMMs
(``gemm/*/gemm_perf.parquet``, on the grid of ``GEMM_M_GRID`` x ``GEMM_NK_GRID``^2; per-tensor
FP8 rows less the dynamic scale step of ``quantize/*/computescale_perf.parquet``) and the
serving engines' tensor-parallel all-reduce (``comm/*/custom_allreduce_perf.parquet``: latency by
message size and GPU count, kept as measured) and the Gated DeltaNet kernels of hybrid linear
attention models (``linear_attention/*/gdn_perf.parquet``, kept as measured) and the DSA
indexer's decode step (SGLang's ``sparse_attention/*/dsa_generation_module_perf.parquet``: the
attention module with the indexer less the same module without it). End-to-end tables of whole serving
runs in the same package (``silicon_sample.csv``) are never opened: they are validation data,
not fit input (DESIGN.md, "Fidelity").

Each measured point becomes an *efficiency*: the project's own ideal time for the same work
(``cost_model._kernel_curves_moe.grouped_gemm_ideal_s`` /
``cost_model._kernel_curves_attention.mla_decode_ideal_s``, rooflines at the
device's peak FLOP/s and memory bandwidth) over the measured latency. The reduced curves —
efficiency at a fixed log grid of tokens per expert for each number of experts per device, one
per (device, engine, dtype); efficiency by context length and batch for MLA decode, one per head
count per rank — are written as one
small JSON file with the package, version, file and licence of every curve.

MLA decode also gets curves of one kernel from its authors' published figures (DeepSeek's
FlashMLA, ``cost_model/data/flashmla_decode.json``: README throughput at the benchmark's shapes,
``flashmla_decode_curves``), written with the imported ones under engine ``"flashmla"``.

The readers live per table kind: ``_kernel_import_moe`` (grouped GEMM), ``_kernel_import_mla``
(MLA attention, absorbed-MLA GEMMs, FlashMLA), ``_kernel_import_gemm`` (dense GEMM),
``_kernel_import_attention`` (MHA/GQA context and decode), ``_kernel_import_comm`` (all-reduce,
DeepEP), ``_kernel_import_linear`` (Gated DeltaNet convolution and recurrence, kept as
measured), ``_kernel_import_dsa`` (the DSA indexer's decode step, kept as measured) over
``_kernel_import_tables`` (locating and reading the tables); this module assembles
and writes their curves.

Re-run: ``autoparallel profile --import-aiconfigurator PATH`` (PATH: an unpacked wheel or the
``aiconfigurator_core`` folder); needs ``pyarrow`` (``pip install pyarrow``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from autoparallel._kernel_import_attention import (
    ATTENTION_TOKENS,
    DECODE_ATTENTION_DEVICES,
    DECODE_ATTENTION_TOKENS,
    _context_attention_curves,
    _decode_attention_curves,
)
from autoparallel._kernel_import_comm import (
    ALLREDUCE_DEVICES,
    _custom_allreduce_curves,
    fit_deepep_low_latency,
    fit_deepep_normal,
)
from autoparallel._kernel_import_dsa import DSA_BATCH_GRID, DSA_CONTEXT_GRID, dsa_indexer_curves
from autoparallel._kernel_import_gemm import _gemm_curves
from autoparallel._kernel_import_linear import (
    LINEAR_BATCH_GRID,
    LINEAR_DEVICES,
    LINEAR_PREFILL_BATCH_GRID,
    LINEAR_TOKENS_GRID,
    _gdn_curves,
)
from autoparallel._kernel_import_mla import (
    MLA_BMM_TOKENS,
    _mla_bmm_curves,
    _mla_curves,
    flashmla_decode_curves,
)
from autoparallel._kernel_import_moe import _grouped_gemm_curves
from autoparallel._kernel_import_prefill_module import (
    PREFILL_MODULE_BATCH,
    PREFILL_MODULE_TABLES,
    PREFILL_MODULE_TOKENS,
    prefill_module_curves,
)
from autoparallel._kernel_import_tables import DEVICES, ENGINES, PACKAGE
from cost_model import ALL_REDUCE_MESSAGE_BYTES, GEMM_M_GRID, GEMM_NK_GRID, TOKENS_PER_EXPERT_GRID


def import_aiconfigurator(path: str | Path, *, version: str) -> dict:
    """The reduced kernel curves of an unpacked ``aiconfigurator_core`` package at ``path``."""
    root = Path(path)
    if (root / "aiconfigurator_core").is_dir():
        root = root / "aiconfigurator_core"
    if not (root / "systems" / "data").is_dir():
        raise ValueError(
            f"path ({path}) must be an unpacked aiconfigurator-core wheel (no systems/data folder)"
        )
    grouped, mla, prefill, gemm, context, bmm, decode = [], [], [], [], [], [], []
    for device in DEVICES:
        for engine in ENGINES:
            gemm += _gemm_curves(root, device, engine)
            bmm += _mla_bmm_curves(root, device, engine)
            context += _context_attention_curves(root, device, engine)
            grouped += _grouped_gemm_curves(root, device, engine)
            mla += _mla_curves(root, device, engine, "mla_decode")
            prefill += _mla_curves(root, device, engine, "mla_prefill")
    mla += flashmla_decode_curves()
    decode = [
        curve
        for device in DECODE_ATTENTION_DEVICES
        for engine in ENGINES
        for curve in _decode_attention_curves(root, device, engine)
    ]
    allreduce = [
        curve
        for device in ALLREDUCE_DEVICES
        for engine in ENGINES
        for curve in _custom_allreduce_curves(root, device, engine)
    ]
    linear = [
        curve
        for device in LINEAR_DEVICES
        for engine in ENGINES
        for curve in _gdn_curves(root, device, engine)
    ]
    return {
        "_source": f"{PACKAGE} {version} (PyPI wheel, NVIDIA, Apache-2.0): per-operator tables under "
        "aiconfigurator_core/systems/data; each curve names its file. Derived by autoparallel._kernel_import "
        "(efficiency = the cost model's ideal time / measured latency); silicon_sample.csv is never read. "
        "MLA decode curves of engine 'flashmla': DeepSeek's published FlashMLA figures (cost_model/data/flashmla_decode.json).",
        "_license": "Apache-2.0 (derived data; copyright NVIDIA CORPORATION & AFFILIATES for the measurements)",
        "kind": "fit_input",
        "tokens_per_expert_grid": TOKENS_PER_EXPERT_GRID.tolist(),
        "grouped_gemm": grouped,
        "mla_decode": mla,
        "mla_prefill": prefill,
        "mla_bmm_tokens": list(MLA_BMM_TOKENS),
        "mla_bmm": bmm,
        "gemm_m_grid": GEMM_M_GRID.tolist(),
        "gemm_nk_grid": list(GEMM_NK_GRID),
        "gemm": gemm,
        "context_attention_tokens": list(ATTENTION_TOKENS),
        "context_attention": context,
        "decode_attention_tokens": list(DECODE_ATTENTION_TOKENS),
        "decode_attention": decode,
        "deepep_low_latency": fit_deepep_low_latency(root),
        "deepep_normal": fit_deepep_normal(root),
        "custom_allreduce_message_bytes": [int(b) for b in ALL_REDUCE_MESSAGE_BYTES],
        "custom_allreduce": allreduce,
        "linear_attention_batch_grid": list(LINEAR_BATCH_GRID),
        "linear_attention_prefill_batch_grid": list(LINEAR_PREFILL_BATCH_GRID),
        "linear_attention_tokens_grid": list(LINEAR_TOKENS_GRID),
        "linear_attention": linear,
        "dsa_indexer_batch_grid": list(DSA_BATCH_GRID),
        "dsa_indexer_context_grid": list(DSA_CONTEXT_GRID),
        "dsa_indexer_decode": dsa_indexer_curves(root),
        "prefill_module_batch_grid": list(PREFILL_MODULE_BATCH),
        "prefill_module_tokens_grid": list(PREFILL_MODULE_TOKENS),
        **{kind: prefill_module_curves(root, kind) for kind in PREFILL_MODULE_TABLES},
    }


def write_kernel_curves(path: str | Path, *, output: str | Path, version: str) -> dict:
    """Import and write the curves as JSON; returns them."""
    curves = import_aiconfigurator(path, version=version)
    dump_kernel_curves(curves, output=output)
    return curves


def dump_kernel_curves(curves: dict, *, output: str | Path) -> None:
    """Write ``curves`` as the shipped JSON layout."""
    text = json.dumps(curves, indent=1)
    # one line per list of numbers: the file stays small and a re-import diffs point by point
    text = re.sub(
        r"\[\s*([-0-9.e,\s]+?)\s*\]",
        lambda m: "[" + " ".join(m.group(1).split()) + "]",
        text,
    )
    Path(output).write_text(text + "\n")
