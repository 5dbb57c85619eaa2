"""The five packages import from this repository, and the planning side never imports torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "package", ["autoparallel", "cost_model", "topology", "search", "profilers"]
)
def test_package_imports_from_this_repository(package: str) -> None:
    module = __import__(package)
    assert Path(module.__file__).resolve().parent == REPO / package


def test_planning_side_never_imports_torch() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch is blocked in this test')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import autoparallel, cost_model, topology, search, profilers\n"
        "import autoparallel.cli\n"
        "autoparallel.cli.build_parser()\n"
        "assert not any(m == 'torch' or m.startswith('torch.') for m in sys.modules)\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
