"""Optuna, imported on first use (as Optuna's own ``_imports.try_import`` defers optional
imports): ``import search`` stays light, and a missing install fails with an actionable message."""

from __future__ import annotations

from importlib import import_module
from types import ModuleType
from typing import Any


class _LazyModule:
    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attribute: str) -> Any:
        if self._module is None:
            try:
                self._module = import_module(self._name)
            except ImportError as error:
                raise ImportError(
                    f"the search needs {self._name}: pip install 'moe-autoparallel' (it depends on {self._name})"
                ) from error
        return getattr(self._module, attribute)


optuna = _LazyModule("optuna")
