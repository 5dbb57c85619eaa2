"""Each package imports the others only through their public names (``__init__`` and ``__all__``).

A private module (``cost_model._units``) or a private name may be imported inside its own package;
from another package it is reached through the package (``from cost_model import human_bytes``).
Tests and benchmarks may reach into internals; the installed packages may not.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("autoparallel", "cost_model", "profilers", "search", "topology")


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def _private_imports(source: str, *, package: str) -> list[tuple[int, str]]:
    """(line, module) of each import in ``source``, a file of ``package``, of another package's
    private module or name (function-level imports included)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [(node.module, [alias.name for alias in node.names])]
        elif isinstance(node, ast.Import):
            modules = [(alias.name, []) for alias in node.names]
        else:
            continue
        for module, names in modules:
            parts = module.split(".")
            if parts[0] not in PACKAGES or parts[0] == package:
                continue
            if any(_private(part) for part in parts[1:]) or any(_private(name) for name in names):
                found.append((node.lineno, module))
    return found


def _all_private_imports() -> dict[str, set[str]]:
    sites: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for _, module in _private_imports(path.read_text(), package=package):
                sites.setdefault(path.relative_to(ROOT).as_posix(), set()).add(module)
    return sites


def test_the_scanner_finds_a_cross_package_private_import():
    source = (
        "from cost_model._units import human_bytes\n"
        "from cost_model import _units\n"
        "import topology._cluster\n"
        "from search._space import select\n"  # own package: fine
        "from cost_model import human_seconds\n"  # public: fine
        "def later():\n"
        "    from autoparallel.plan._build import build_plan\n"
    )
    assert _private_imports(source, package="search") == [
        (1, "cost_model._units"),
        (2, "cost_model"),
        (3, "topology._cluster"),
        (7, "autoparallel.plan._build"),
    ]


def test_packages_import_each_other_only_through_public_names():
    sites = {path: sorted(modules) for path, modules in _all_private_imports().items()}
    assert not sites, f"import these through the package's public names (its __init__): {sites}"


@pytest.mark.parametrize("package", ["cost_model", "search", "topology", "autoparallel.plan"])
def test_every_public_name_of_a_torch_free_package_resolves(package):
    module = importlib.import_module(package)
    names = module.__all__
    assert len(names) == len(set(names)), f"{package}.__all__ lists a name twice"
    missing = [name for name in names if not hasattr(module, name)]
    assert not missing, f"{package}.__all__ names what it does not define: {missing}"
