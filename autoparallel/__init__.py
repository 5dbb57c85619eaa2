"""autoparallel: find how to split a huge Mixture-of-Experts model across accelerators, then do it.

``import autoparallel as ap`` never imports torch; ``ap.apply_plan``, ``ap.build_for_rank`` and ``ap.Retuner`` load the
torch runtime on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from autoparallel._catalog import DEFAULT_MODEL, get_model, list_models
from autoparallel.plan import SCHEMA_VERSION, PlanError, ShardingPlan, build_plan, load_plan
from cost_model import (
    CostBreakdown,
    InfeasiblePlanError,
    Inference,
    ModelSpec,
    ParallelConfig,
    Training,
)
from topology import Cluster, HardwareSpec, get_preset, list_presets

__version__ = "0.1.0"

# Public names resolved on first access, so that a bare import stays torch-free and light.
_LAZY = {
    "estimate": ("cost_model", "estimate"),
    "find_plan": ("autoparallel._planner", "find_plan"),
    "apply_plan": ("autoparallel.runtime", "apply_plan"),
    "build_for_rank": ("autoparallel.runtime", "build_for_rank"),
    "Retuner": ("autoparallel.runtime.retune", "Retuner"),
}

__all__ = [
    "Cluster",
    "CostBreakdown",
    "DEFAULT_MODEL",
    "HardwareSpec",
    "InfeasiblePlanError",
    "Inference",
    "ModelSpec",
    "ParallelConfig",
    "PlanError",
    "SCHEMA_VERSION",
    "ShardingPlan",
    "Training",
    "__version__",
    "apply_plan",
    "build_plan",
    "build_for_rank",
    "estimate",
    "find_plan",
    "get_model",
    "get_preset",
    "list_models",
    "list_presets",
    "load_plan",
    "Retuner",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module_name, attribute = _LAZY[name]
        return getattr(import_module(module_name), attribute)
    raise AttributeError(f"module 'autoparallel' has no attribute {name!r}")
