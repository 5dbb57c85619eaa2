"""Device meshes from a plan: the dense mesh (pp, dp, cp, tp) and the MoE view (pp, edp, ep, etp).

Both meshes hold the same ranks in the same order: mesh position ``i`` (row-major over the
axes) is global rank ``plan.rank_to_device[i]``. The MoE view re-reads each stage's dp*cp*tp
ranks as edp x ep x etp (Megatron-core's parallel folding, Liu et al. arXiv:2504.14960), so
ep groups are drawn from tp ranks first, then cp, then dp.

Device type and process-group backend come from torch's device-agnostic APIs: the current
accelerator's type (CUDA, XPU, MPS, ...) when there is one, else ``cpu``; the backend is
``dist.get_default_backend_for_device`` of it (NCCL, XCCL, gloo, ...). Both can be forced.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from autoparallel.plan import ShardingPlan
from cost_model import DENSE_MESH_ORDER, MOE_MESH_ORDER

__all__ = [
    "DENSE_AXES",
    "MOE_AXES",
    "Meshes",
    "build_meshes",
    "default_device_type",
    "mesh_rank_layout",
]

DENSE_AXES = tuple(axis.value for axis in DENSE_MESH_ORDER)
MOE_AXES = tuple(axis.value for axis in MOE_MESH_ORDER)


@dataclass(frozen=True)
class Meshes:
    """The two views of the launched ranks, and this rank's device."""

    dense: DeviceMesh
    moe: DeviceMesh
    device: torch.device

    def coordinate(self, axis: str) -> int:
        """This rank's index along ``axis`` (a dense or MoE axis name): its rank in that axis's
        process group (the index pipeline stages, FSDP shards and EP placement use)."""
        mesh = self.dense if axis in DENSE_AXES else self.moe
        return mesh[axis].get_local_rank()


def default_device_type() -> str:
    """The current accelerator's device type, or ``"cpu"`` when there is none."""
    accelerator = torch.accelerator.current_accelerator() if hasattr(torch, "accelerator") else None
    return accelerator.type if accelerator is not None else "cpu"


def _axis_sizes(plan: ShardingPlan) -> tuple[tuple[int, ...], tuple[int, ...]]:
    config = plan.config
    dense = (config.pp, config.dp, config.cp, config.tp)
    moe = (config.pp, config.edp, config.ep, config.etp)
    declared = {axis.name: axis.size for axis in plan.mesh_axes + plan.moe_mesh_axes}
    expected = dict(zip(DENSE_AXES, dense)) | dict(zip(MOE_AXES, moe))
    for name, size in declared.items():
        if name in expected and expected[name] != size:
            raise ValueError(
                f"plan mesh axis {name!r} has size {size}; the plan's config gives {expected[name]}"
            )
    return dense, moe


def mesh_rank_layout(plan: ShardingPlan) -> torch.Tensor:
    """Global ranks laid out as the dense mesh (pp, dp, cp, tp), from ``plan.rank_to_device``."""
    dense, _ = _axis_sizes(plan)
    ranks = list(plan.rank_to_device)
    if len(ranks) != plan.world_size or sorted(ranks) != list(range(plan.world_size)):
        raise ValueError(
            f"rank_to_device (length {len(ranks)}) must be a permutation of range(world_size = {plan.world_size})"
        )
    if plan.config.world_size != plan.world_size:
        raise ValueError(
            f"plan world_size ({plan.world_size}) must equal dp*cp*tp*pp of its config ({plan.config.world_size})"
        )
    layout = torch.tensor(ranks, dtype=torch.int64).view(dense)
    _check_increasing(layout)
    if plan.config.cp > 1 and plan.config.zero_stage > 0:
        _check_replica_order(layout)
    return layout


def _check_increasing(layout: torch.Tensor) -> None:
    """torch orders a process group's ranks by global rank while DTensor places shards by mesh
    position, so along the DTensor axes (tp, and dp under FSDP) global ranks must increase."""
    for axis in ("dp", "tp"):
        dim = DENSE_AXES.index(axis)
        if layout.shape[dim] > 1 and not bool((layout.diff(dim=dim) > 0).all()):
            groups = layout.movedim(dim, -1).reshape(-1, layout.shape[dim])
            bad = next(group.tolist() for group in groups if not bool((group.diff() > 0).all()))
            raise ValueError(
                f"rank_to_device places the {axis} group {bad} out of increasing rank order; "
                f"ranks must increase along the {axis} axis (process groups order ranks by global rank)"
            )


def _check_replica_order(layout: torch.Tensor) -> None:
    """FSDP under context parallel shards over dp x cp flattened (``_context_parallel.replica_mesh``),
    a DTensor axis too: global ranks must increase along it."""
    if not bool((layout.flatten(1, 2).diff(dim=1) > 0).all()):
        raise ValueError(
            "rank_to_device places a dp x cp group out of increasing rank order; under FSDP with cp > 1 "
            "ranks must increase along dp x cp flattened (process groups order ranks by global rank)"
        )


def _init_process_group(backend: str | None, device_type: str) -> None:
    if dist.is_initialized():
        if backend is not None and dist.get_backend() != backend:
            raise ValueError(
                f"backend ({backend!r}) differs from the initialized process group's ({dist.get_backend()!r})"
            )
        return
    dist.init_process_group(backend or dist.get_default_backend_for_device(device_type))


def _local_device(device_type: str) -> torch.device:
    if device_type == "cpu" or device_type == "meta":
        return torch.device(device_type)
    module = torch.get_device_module(device_type)
    local_rank = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
    index = local_rank % max(module.device_count(), 1)
    module.set_device(index)
    return torch.device(device_type, index)


def build_meshes(
    plan: ShardingPlan, *, device_type: str | None = None, backend: str | None = None
) -> Meshes:
    """Build the dense and MoE device meshes of ``plan`` on the launched ranks.

    Initializes the default process group (``backend``, else the device's default backend,
    from the torchrun environment) if it is not yet initialized. Raises ``ValueError`` when the
    plan's world size differs from the launched world, before any collective.
    """
    device_type = device_type or default_device_type()
    layout = mesh_rank_layout(plan)
    _init_process_group(backend, device_type)
    world = dist.get_world_size()
    if world != plan.world_size:
        raise ValueError(
            f"plan world_size ({plan.world_size}) differs from the launched world size ({world})"
        )
    _, moe_sizes = _axis_sizes(plan)
    mesh_type = "cpu" if device_type == "meta" else device_type
    dense = DeviceMesh(mesh_type, layout, mesh_dim_names=DENSE_AXES)
    moe = DeviceMesh(mesh_type, layout.reshape(moe_sizes), mesh_dim_names=MOE_AXES)
    # A mesh smaller than the world is accepted silently by torch and fails much later.
    assert dense.size() == world == moe.size(), (dense.size(), moe.size(), world)
    return Meshes(dense=dense, moe=moe, device=_local_device(device_type))
