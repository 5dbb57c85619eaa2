"""A synthetic aiconfigurator-core operator table, imported as the kernel import reads a package."""

from __future__ import annotations

from pathlib import Path


def import_synthetic_table(root: Path, folder: str, name: str, rows: list[dict]) -> dict:
    """Write ``rows`` as ``aiconfigurator_core/systems/data/<folder>/<name>`` under ``root`` and
    return the curves ``autoparallel._kernel_import.import_aiconfigurator`` makes of it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from autoparallel._kernel_import import import_aiconfigurator

    path = root / "aiconfigurator_core" / "systems" / "data" / folder
    path.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), path / name)
    return import_aiconfigurator(root, version="test")


def deepseek_moe_row(
    *, tokens: int, ep: int, latency_s: float, dtype: str = "fp8_block", **extra
) -> dict:
    """One ``moe_perf.parquet`` row of DeepSeek-V3's experts (hidden 7168, FFN 2048, top-8 of
    256, no expert tensor parallelism, balanced routing) at ``tokens`` and expert parallelism
    ``ep``, timed at ``latency_s``; ``extra`` adds columns (``kernel_source``)."""
    return {
        "moe_dtype": dtype,
        "num_tokens": tokens,
        "hidden_size": 7168,
        "inter_size": 2048,
        "topk": 8,
        "num_experts": 256,
        "moe_tp_size": 1,
        "moe_ep_size": ep,
        "distribution": "balanced",
        "latency": latency_s * 1e3,
        **extra,
    }
