"""Exports of a ``ShardingPlan`` to launch recipes of the engines people run, and back.

Serving: vLLM, SGLang, TensorRT-LLM. Training: Megatron-LM, torchtitan, DeepSpeed. Every recipe
is stamped with an engine version (default: the current release in
``cost_model/data/engine_rules.json``), names the model (``model_path``, else the hub id of a
catalog model, else ``${MODEL_PATH}``), carries per-node launch commands, and a README note. What
the engine cannot express is listed in ``Export.dropped`` (never silently), with the rule and its
source. ``import_config`` reads a recipe (or a user's own launch arguments) back into a
``ParallelConfig``.

Serving vocabulary (``cp`` is 1 for inference): an *instance* is one engine process group per
pipeline stage of ``G = max(tp, ep * etp)`` ranks; attention is split ``attention_tp`` ways (1
under attention data parallel, else ``tp``) and replicated ``G / attention_tp`` times; experts
are split ``ep`` ways with ``G / ep`` tensor shards. The world holds ``world / (pp * G)``
instances behind a router.
"""

from __future__ import annotations

from collections.abc import Callable

from autoparallel.export._common import (
    FORMATS,
    Export,
    Recipe,
    recipe,
    rule_violations,
    runnable_engines,
)
from autoparallel.export._import import import_config
from autoparallel.export._megatron import megatron
from autoparallel.export._serving import sglang, trtllm, vllm
from autoparallel.export._torchtitan import torchtitan
from autoparallel.export._training import deepspeed
from autoparallel.plan import ShardingPlan

__all__ = [
    "FORMATS",
    "Export",
    "export_plan",
    "import_config",
    "rule_violations",
    "runnable_engines",
]

_EXPORTERS: dict[str, Callable[[ShardingPlan, Recipe], Export]] = {
    "vllm": vllm,
    "sglang": sglang,
    "trtllm": trtllm,
    "megatron": megatron,
    "torchtitan": torchtitan,
    "deepspeed": deepspeed,
}


def export_plan(
    plan: ShardingPlan,
    *,
    format: str,
    model_path: str | None = None,
    engine_version: str | None = None,
) -> Export:
    """The ``format`` launch recipe of ``plan`` for ``engine_version`` (default: current release)."""
    if format not in _EXPORTERS:
        raise ValueError(f"format ({format!r}) must be one of {list(FORMATS)}")
    return _EXPORTERS[format](
        plan, recipe(plan, engine=format, version=engine_version, model_path=model_path)
    )
