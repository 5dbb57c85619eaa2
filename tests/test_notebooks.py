"""Every notebook in notebooks/ runs top to bottom in a real kernel."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path, tmp_path: Path) -> None:
    import nbclient  # both in the test extras
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    os.environ.setdefault("MPLBACKEND", "Agg")
    env_path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))
    os.environ["PYTHONPATH"] = env_path
    client = nbclient.NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    errors = [
        o
        for cell in notebook.cells
        for o in cell.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors
