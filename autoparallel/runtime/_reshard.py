"""Resharding by checkpoint: save under plan A with ``torch.distributed.checkpoint`` (DCP), load under
plan B — other tp/pp/ep/dp degrees, the same or another world size; the model is the same model.

Why it works: every rank's state is keyed by the *global* module FQN, which the runtime keeps
under every plan (pipeline chunks share the model's submodules, experts are keyed by global
id, tensor- and data-parallel shards are ``DTensor``s). DCP writes each key once — a ``DTensor``
as its shards, a replicated plain tensor (dense weights under data parallel, replicated experts)
from one rank — and on load each rank reads exactly the pieces its own tensors cover.

Layout of a checkpoint directory ``root/step-00000012/``: DCP's files plus ``autoparallel.json``
(the plan it was saved under, the step, the caller's ``extra`` state, the optimizer's kind,
hyper-parameters and state keys). ``root/latest`` names the newest *complete* checkpoint; it is
replaced atomically after the save finished on every rank, so a job killed mid-save leaves the
previous one in force.

Optimizer state is stored per parameter under ``optimizer.<fqn>.<key>`` (same sharding as the
parameter), so it reshards with the weights; AdamW continues exactly where it stopped.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from autoparallel.plan import ShardingPlan
from cost_model import DENSE_MESH_ORDER, Axis, axis_degrees

__all__ = [
    "CheckpointInfo",
    "latest_checkpoint",
    "load_checkpoint",
    "load_full_state_dict",
    "read_checkpoint_info",
    "reshard_in_place",
    "save_checkpoint",
]

logger = logging.getLogger(__name__)

INFO_FILE = "autoparallel.json"
LATEST_FILE = "latest"


@dataclass(frozen=True)
class CheckpointInfo:
    """What ``autoparallel.json`` of a checkpoint says."""

    path: Path
    plan: ShardingPlan
    step: int
    extra: dict[str, Any] = field(default_factory=dict)
    optimizer: dict[str, Any] = field(default_factory=dict)


def _modules(modules) -> list[nn.Module]:
    """A module, a list of pipeline chunks, or ``apply_plan``'s result (its ``modules``)."""
    if isinstance(modules, nn.Module):
        return [modules]
    return list(getattr(modules, "modules", modules))


def _named_parameters(modules: list[nn.Module]) -> dict[str, nn.Parameter]:
    """FQN -> parameter over this rank's modules (pipeline chunks), each parameter once."""
    out, seen = {}, set()
    for module in modules:
        for name, parameter in module.named_parameters(remove_duplicate=True):
            if id(parameter) not in seen:
                seen.add(id(parameter))
                out[name] = parameter
    return out


def _model_state(modules: list[nn.Module]) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for module in modules:
        for name, value in module.state_dict().items():
            state.setdefault(name, value)
    return state


def _optimizer_keys(optimizer, parameters: dict[str, nn.Parameter]) -> tuple[list[str], list[str]]:
    """State keys shaped like the parameter, and the others (scalars such as Adam's ``step``)."""
    for parameter in parameters.values():
        state = optimizer.state.get(parameter)
        if state:
            shaped = sorted(
                k for k, v in state.items() if torch.is_tensor(v) and v.shape == parameter.shape
            )
            return shaped, sorted(k for k in state if k not in shaped)
    return [], []


def _agreed_keys(optimizer, parameters) -> tuple[list[str], list[str]]:
    """The optimizer state keys, agreed by every rank (a rank with no parameters has none)."""
    keys = _optimizer_keys(optimizer, parameters)
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return keys
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, keys)
    distinct = {json.dumps(k) for k in gathered if k != ([], [])}
    if len(distinct) > 1:
        raise ValueError(f"optimizer state keys differ between ranks: {sorted(distinct)}")
    return json.loads(distinct.pop()) if distinct else ([], [])


def _optimizer_state(optimizer, parameters: dict[str, nn.Parameter], keys) -> dict[str, Any]:
    shaped, scalars = keys
    state: dict[str, Any] = {}
    for name, parameter in parameters.items():
        entry = optimizer.state.get(parameter, {})
        for key in (*shaped, *scalars):
            if key in entry:
                value = entry[key]
                state[f"optimizer.{name}.{key}"] = (
                    value if torch.is_tensor(value) else torch.tensor(float(value))
                )
    return state


def _hyperparameters(optimizer) -> list[dict[str, Any]]:
    groups = []
    for group in optimizer.param_groups:
        groups.append(
            {
                k: v
                for k, v in group.items()
                if k != "params" and isinstance(v, (int, float, bool, str, list, tuple, type(None)))
            }
        )
    return groups


def _is_rank_zero() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save_checkpoint(
    root: str | Path,
    *,
    modules: nn.Module | Iterable[nn.Module],
    plan: ShardingPlan,
    step: int,
    optimizer=None,  # torch.optim.Optimizer
    extra: dict[str, Any] | None = None,
) -> Path:
    """Save this rank's part of the model (and optimizer) as step ``step`` under ``root``.

    Collective: every rank of the job calls it. ``modules`` are this rank's modules after
    ``apply_plan`` (a list for several pipeline chunks, or ``apply_plan``'s result itself). ``extra`` (JSON-able, e.g. the data
    position) is stored from rank 0. Returns the checkpoint directory; ``root/latest`` points to
    it once every rank finished.
    """
    _check_supported(plan)
    modules = _modules(modules)
    path = Path(root) / f"step-{step:08d}"
    parameters = _named_parameters(modules)
    state = _model_state(modules)
    optimizer_info: dict[str, Any] = {}
    if optimizer is not None:
        keys = _agreed_keys(optimizer, parameters)
        state.update(_optimizer_state(optimizer, parameters, keys))
        optimizer_info = {
            "class": type(optimizer).__name__,
            "shaped_keys": keys[0],
            "scalar_keys": keys[1],
            "param_groups": _hyperparameters(optimizer),
        }
    dcp.save(state, checkpoint_id=str(path))
    if _is_rank_zero():
        info = {
            "plan": json.loads(plan.to_json()),
            "step": step,
            "extra": extra or {},
            "optimizer": optimizer_info,
        }
        (path / INFO_FILE).write_text(json.dumps(info, indent=1))
    _barrier()
    if _is_rank_zero():
        temporary = Path(root) / f".{LATEST_FILE}.tmp"
        temporary.write_text(path.name)
        os.replace(temporary, Path(root) / LATEST_FILE)
    _barrier()
    logger.info("checkpoint: saved step %d under plan %s to %s", step, _degrees(plan), path)
    return path


def latest_checkpoint(root: str | Path) -> Path:
    """The newest complete checkpoint under ``root`` (or ``root`` itself if it is one)."""
    root = Path(root)
    if (root / INFO_FILE).exists():
        return root
    pointer = root / LATEST_FILE
    if not pointer.exists():
        raise ValueError(
            f"checkpoint ({str(root)!r}) has no {LATEST_FILE!r} file and no {INFO_FILE!r}: nothing was saved there"
        )
    return root / pointer.read_text().strip()


def read_checkpoint_info(path: str | Path) -> CheckpointInfo:
    """The plan, step and extra state of a checkpoint (``root`` or a ``step-*`` directory)."""
    path = latest_checkpoint(path)
    info = json.loads((path / INFO_FILE).read_text())
    return CheckpointInfo(
        path=path,
        plan=ShardingPlan.model_validate(info["plan"]),
        step=int(info["step"]),
        extra=dict(info.get("extra", {})),
        optimizer=dict(info.get("optimizer", {})),
    )


def load_checkpoint(
    path: str | Path,
    *,
    modules: nn.Module | Iterable[nn.Module],
    optimizer=None,
    plan: ShardingPlan | None = None,
) -> CheckpointInfo:
    """Load a checkpoint into this rank's ``modules`` (already under the new plan) and optimizer.

    Collective. The modules may follow any plan for the same model: each rank reads the pieces
    of every tensor it holds. Parameters are overwritten in place; the optimizer's state for
    every local parameter is replaced by the saved one and its groups' hyper-parameters are
    restored when the number of groups matches. With ``plan`` (the new plan), a checkpoint of
    another model is refused before anything is read.

    Raises:
        ValueError: no checkpoint at ``path``, or it was saved for another model.
    """
    info = read_checkpoint_info(path)
    if (
        plan is not None
        and plan.provenance.model_fingerprint != info.plan.provenance.model_fingerprint
    ):
        raise ValueError(
            f"checkpoint model_fingerprint ({info.plan.provenance.model_fingerprint}, {info.plan.provenance.model_name}) "
            f"must equal the plan's ({plan.provenance.model_fingerprint}, {plan.provenance.model_name}): "
            "resharding keeps the model"
        )
    if plan is not None:
        _check_supported(plan)
    modules = _modules(modules)
    parameters = _named_parameters(modules)
    state = _model_state(modules)
    shaped, scalars = info.optimizer.get("shaped_keys", []), info.optimizer.get("scalar_keys", [])
    templates: dict[str, torch.Tensor] = {}
    if optimizer is not None and (shaped or scalars):
        for name, parameter in parameters.items():
            for key in shaped:
                templates[f"optimizer.{name}.{key}"] = torch.zeros_like(parameter.detach())
            for key in scalars:
                templates[f"optimizer.{name}.{key}"] = torch.zeros((), dtype=torch.float32)
    state.update(templates)
    dcp.load(state, checkpoint_id=str(info.path))
    if optimizer is not None and templates:
        for name, parameter in parameters.items():
            optimizer.state[parameter] = {
                key: state[f"optimizer.{name}.{key}"] for key in (*shaped, *scalars)
            }
        saved_groups = info.optimizer.get("param_groups", [])
        if len(saved_groups) == len(optimizer.param_groups):
            for group, saved in zip(optimizer.param_groups, saved_groups):
                group.update(
                    {
                        k: (tuple(v) if isinstance(group.get(k), tuple) else v)
                        for k, v in saved.items()
                    }
                )
    logger.info(
        "checkpoint: loaded step %d (saved under %s) from %s",
        info.step,
        _degrees(info.plan),
        info.path,
    )
    return info


def load_full_state_dict(
    path: str | Path, *, keys: Iterable[str] | None = None
) -> dict[str, torch.Tensor]:
    """Every saved model tensor, whole, in this process (no process group needed): for checks and
    for exporting. ``keys`` restricts it to some FQNs; optimizer entries are excluded by default."""
    from torch.distributed.checkpoint import FileSystemReader

    info = read_checkpoint_info(path)
    metadata = FileSystemReader(str(info.path)).read_metadata()
    wanted = (
        [k for k in metadata.state_dict_metadata if not k.startswith("optimizer.")]
        if keys is None
        else list(keys)
    )
    state = {}
    for key in wanted:
        entry = metadata.state_dict_metadata[key]
        state[key] = torch.empty(entry.size, dtype=entry.properties.dtype)
    dcp.load(state, checkpoint_id=str(info.path), no_dist=True)
    return state


def reshard_in_place(
    *,
    old: ShardingPlan,
    new: ShardingPlan,
    modules,
    optimizer,
    step: int,
    checkpoint,
    build,
    extra: dict[str, Any] | None = None,
):
    """Change degrees on the same ranks: save under ``old``, ``build(new) -> (modules, optimizer,
    ...)``, load into the result and return it. Collective."""
    if new.world_size != old.world_size:
        raise ValueError(
            f"new plan world_size ({new.world_size}) differs from the running world ({old.world_size}); "
            "save a checkpoint and relaunch, then Retuner.recover(...)"
        )
    save_checkpoint(
        checkpoint, modules=modules, plan=old, step=step, optimizer=optimizer, extra=extra
    )
    built = build(new)
    load_checkpoint(checkpoint, modules=built[0], optimizer=built[1], plan=new)
    logger.info("reshard: %s -> %s at step %d", _degrees(old), _degrees(new), step)
    return built


def _check_supported(plan: ShardingPlan) -> None:
    """Expert-TP slices are plain tensors under one FQN on every etp rank: DCP would keep one."""
    if plan.config.etp > 1:
        raise ValueError(
            f"etp ({plan.config.etp}) must be 1 to checkpoint for resharding: expert-TP slices are not "
            "saved as shards yet; reshard through a plan with etp 1"
        )


def _degrees(plan: ShardingPlan) -> str:
    degrees = axis_degrees(plan.config, (*DENSE_MESH_ORDER, Axis.EP, Axis.ETP))
    return " ".join(f"{name}{degree}" for name, degree in degrees) + f" on {plan.world_size}"
