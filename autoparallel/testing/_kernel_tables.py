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
