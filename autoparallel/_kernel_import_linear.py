"""Gated DeltaNet curves from aiconfigurator-core's ``linear_attention/*/gdn_perf.parquet`` tables.

A Gated DeltaNet layer (Qwen3-Next, Qwen3.5; Yang et al., "Gated Delta Networks", arXiv:2412.06464)
runs two kernels beside its projections: a causal depthwise convolution over q, k and v
(``causal_conv1d_fn`` over a prompt, ``causal_conv1d_update`` one token per sequence) and the
recurrence (the chunked ``chunk_gated_delta_rule`` of flash-linear-attention over a prompt, the
fused recurrent kernel one token per sequence). The tables time both per engine on each device,
for the per-rank head counts of the Qwen3.5 family split over 1-16 tensor-parallel ranks (key and
value heads of 128 dims): in the context phase on a grid of sequences x prompt length, in the
generation phase by sequences. They are kept as measured latencies of the two kernels together
(microseconds, three significant digits), by ``LINEAR_BATCH_GRID`` sequences in decode and on
the grid ``LINEAR_PREFILL_BATCH_GRID`` x ``LINEAR_TOKENS_GRID`` in prefill; where a shape was
timed for several models (the kernels do not see the model's hidden size) the fastest is kept.
Cells the table leaves out (many long sequences) are extended from the largest batch measured at
that length, in proportion to the sequences (the kernels are saturated there), and every curve is
made non-decreasing in sequences and in length (a cell below its smaller neighbour is a failed
measurement: it takes the neighbour's latency).

The package's Mamba-2 tables (``linear_attention/trtllm/*/mamba2_perf.parquet``) time the causal
convolution alone, not the selective-scan kernels, so they are not imported: Mamba-2 layers keep
their roofline (``cost_model._inference_compute._linear_mixer_roofline``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from autoparallel._kernel_import_tables import DEVICES, _latest_tables, _read, measured_by
from topology import get_preset

#: Sequences per call (generation phase) and prompt tokens per sequence (context phase) of the
#: curves: the tables' own grids, 2x apart; the context phase keeps every other sequence count
#: (4x apart, interpolated between: the curves stay small).
LINEAR_BATCH_GRID = tuple(2**i for i in range(11))
LINEAR_PREFILL_BATCH_GRID = LINEAR_BATCH_GRID[::2]
LINEAR_TOKENS_GRID = tuple(2**i for i in range(16))
#: Device folders whose tables are imported -> preset (the kernel-curve devices, the A100 and
#: the GB300, whose tables the package also ships).
LINEAR_DEVICES = {**DEVICES, "a100_sxm": "dgx-a100", "gb300": "gb300-nvl72"}
#: The kernels of each phase, by the tables' ``kernel_source`` prefix.
_KERNELS = {
    "context": ("causal_conv1d_fn", "chunk_gated_delta_rule"),
    "generation": ("causal_conv1d_update", "fused_recurrent_gated_delta_rule"),
}


def _kernel(phase: str, source: str) -> str | None:
    for name in _KERNELS[phase]:
        if source.startswith(name):
            return name
    return None


def _filled(table: np.ndarray) -> np.ndarray:
    """Cells missing along the sequences axis (axis 0) extended in proportion to the sequences
    from the largest measured; then non-decreasing along every axis."""
    batches = np.array(LINEAR_BATCH_GRID, dtype=np.float64)
    out = table.copy()
    if out.ndim == 1:
        out = out[:, None]
    for j in range(out.shape[1]):
        measured = np.flatnonzero(np.isfinite(out[:, j]))
        if measured.size == 0:
            continue
        last = measured[-1]
        out[last + 1 :, j] = out[last, j] * batches[last + 1 :] / batches[last]
    missing = ~np.isfinite(out)
    if missing.any():  # lengths no batch measured: from the longest measured, by length
        tokens = np.array(LINEAR_TOKENS_GRID, dtype=np.float64)
        for i in range(out.shape[0]):
            measured = np.flatnonzero(np.isfinite(out[i]))
            if measured.size:
                last = measured[-1]
                out[i, last + 1 :] = out[i, last] * tokens[last + 1 :] / tokens[last]
    out = np.maximum.accumulate(np.maximum.accumulate(out, axis=0), axis=1)
    return out[:, 0] if table.ndim == 1 else out


def _gdn_curves(root: Path, device: str, engine: str) -> list[dict]:
    """One curve of the newest GDN table of ``engine`` on ``device`` that times both kernels of
    both phases: per per-rank (key heads, value heads) shape, the generation latency by sequences
    and the context latency by sequences and prompt length (module docstring)."""
    hardware = get_preset(LINEAR_DEVICES[device]).device
    batches = {b: i for i, b in enumerate(LINEAR_BATCH_GRID)}
    lengths = {n: i for i, n in enumerate(LINEAR_TOKENS_GRID)}
    for path in _latest_tables(root, device, "linear_attention", engine, "gdn_perf.parquet"):
        # (key heads, value heads) -> model -> kernel -> cells of (batch, length) in ms
        cells: dict[tuple[int, int], dict[str, dict[str, dict]]] = {}
        for row in _read(path):
            if int(row["head_k_dim"]) != 128 or int(row["head_v_dim"]) != 128:
                continue
            phase = str(row["phase"])
            kernel = _kernel(phase, str(row["kernel_source"])) if phase in _KERNELS else None
            batch = int(row["batch_size"])
            length = int(row["seq_len"]) if phase == "context" else 1
            if kernel is None or batch not in batches or length not in lengths:
                continue
            shape = (int(row["num_k_heads"]), int(row["num_v_heads"]))
            by_kernel = cells.setdefault(shape, {}).setdefault(str(row["model_name"]), {})
            by_kernel.setdefault(kernel, {})[(phase, batch, length)] = float(row["latency"])
        shapes = []
        for (key_heads, value_heads), models in sorted(cells.items()):
            decode = np.full(len(batches), np.inf)
            prefill = np.full((len(batches), len(lengths)), np.inf)
            for kernels in models.values():  # the fastest model timing the shape, per cell
                if set(kernels) != set(_KERNELS["context"] + _KERNELS["generation"]):
                    continue
                for phase, (first, second) in _KERNELS.items():
                    for (_, batch, length), ms in kernels[first].items():
                        other = kernels[second].get((phase, batch, length))
                        if other is None:
                            continue
                        us = (ms + other) * 1e3
                        if phase == "generation":
                            decode[batches[batch]] = min(decode[batches[batch]], us)
                        else:
                            cell = (batches[batch], lengths[length])
                            prefill[cell] = min(prefill[cell], us)
            decode[np.isinf(decode)] = np.nan
            prefill[np.isinf(prefill)] = np.nan
            if np.isnan(decode[0]) or np.isnan(prefill[0]).any():
                continue  # one sequence must be measured at every length
            shapes.append(
                {
                    "key_heads": key_heads,
                    "value_heads": value_heads,
                    "decode_us_by_batch": [float(f"{v:.3g}") for v in _filled(decode)],
                    "prefill_us_by_batch": {
                        str(b): [float(f"{v:.3g}") for v in row]
                        for b, row in zip(LINEAR_BATCH_GRID, _filled(prefill))
                        if b in LINEAR_PREFILL_BATCH_GRID
                    },
                }
            )
        if not shapes:
            continue
        return [
            {
                **measured_by(hardware.name, engine, path),
                "kind": "gated_deltanet",
                "head_dims": [128, 128],
                "file": str(path.relative_to(root.parent)),
                "shapes": shapes,
            }
        ]
    return []
