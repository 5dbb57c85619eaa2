"""Data parallel over the plan's ``dp`` axis: replication or FSDP2, per the plan's ZeRO stage.

* ``zero_stage == 0``: every dp rank holds whole weights; ``DataParallel.sync_gradients``
  averages gradients over dp after backward (one flat all-reduce, as DDP's bucket does).
* ``zero_stage in (1, 2)``: FSDP2 ``fully_shard`` with ``reshard_after_forward=False``:
  gradients and optimizer states are sharded, weights stay gathered from forward to backward
  (ZeRO-2, Rajbhandari et al. 2020, arXiv:1910.02054 sec. 5; FSDP2 has no separate ZeRO-1 mode,
  stage 1 gets stage 2's layout).
* ``zero_stage == 3``: ``fully_shard`` with ``reshard_after_forward=True`` (weights sharded too).

Each decoder layer (``*.layers.N``) is its own FSDP unit, then the root, as torchtitan does.
Expert weights under expert parallelism are excluded (``ignored``): their gradients are summed
over edp by ``ExpertParallel.sync_gradients`` instead.

With context parallel (cp > 1) the mesh given here is dp x cp flattened
(``_context_parallel.replica_mesh``): each cp rank's loss covers other tokens of the same
sequences, so dense gradients are averaged (or FSDP-sharded and reduced) over dp * cp ranks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from autoparallel.plan import ShardingPlan

__all__ = ["DataParallel", "apply_data_parallel"]

logger = logging.getLogger(__name__)


@dataclass
class DataParallel:
    """What ``apply_data_parallel`` did. ``mode`` is ``"replicate"`` or ``"fsdp"``."""

    dp_mesh: DeviceMesh
    mode: str
    modules: list[nn.Module]
    ignored: frozenset[int]

    def sync_gradients(self) -> None:
        """Replication: average gradients over dp (FSDP already reduced them in backward)."""
        if self.mode != "replicate":
            return
        grads = []
        for module in self.modules:
            for parameter in module.parameters():
                if id(parameter) in self.ignored or parameter.grad is None:
                    continue
                grad = parameter.grad
                grads.append(grad.to_local() if isinstance(grad, DTensor) else grad)
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.dp_mesh.get_group())
        flat /= self.dp_mesh.size()
        for grad, piece in zip(grads, flat.split([g.numel() for g in grads])):
            grad.copy_(piece.view_as(grad))


def _layers(module: nn.Module) -> list[nn.Module]:
    backbone = getattr(module, "model", module)
    layers = getattr(backbone, "layers", None)
    if isinstance(layers, (nn.ModuleDict, nn.ModuleList)):
        return list(layers.values()) if isinstance(layers, nn.ModuleDict) else list(layers)
    return []


def apply_data_parallel(
    modules: list[nn.Module], *, plan: ShardingPlan, dp_mesh: DeviceMesh, ignored: set[nn.Parameter]
) -> DataParallel:
    """Replicate or ``fully_shard`` each module (a model or pipeline chunk) over ``dp_mesh``.

    Mutates the modules in place under FSDP (parameters become dp-sharded DTensors). Parameters
    in ``ignored`` are left alone (not sharded, not reduced).
    """
    zero_stage = plan.config.zero_stage
    ignored_ids = frozenset(id(p) for p in ignored)
    if zero_stage == 0:
        logger.info("data parallel: replication over dp=%d", dp_mesh.size())
        return DataParallel(dp_mesh=dp_mesh, mode="replicate", modules=modules, ignored=ignored_ids)
    from torch.distributed.fsdp import fully_shard

    reshard = zero_stage == 3
    for module in modules:
        for layer in _layers(module):
            layer_ignored = {p for p in layer.parameters() if id(p) in ignored_ids}
            fully_shard(
                layer,
                mesh=dp_mesh,
                reshard_after_forward=reshard,
                ignored_params=layer_ignored or None,
            )
        root_ignored = {p for p in module.parameters() if id(p) in ignored_ids}
        fully_shard(
            module, mesh=dp_mesh, reshard_after_forward=reshard, ignored_params=root_ignored or None
        )
    logger.info("data parallel: FSDP2 (ZeRO-%d) over dp=%d", zero_stage, dp_mesh.size())
    return DataParallel(dp_mesh=dp_mesh, mode="fsdp", modules=modules, ignored=ignored_ids)
