"""The smallest cluster on which some layout fits, for the message of ``InfeasiblePlanError``.

Node counts are tried upward from the weight-bytes lower bound (weights sharded over every
device, nothing else). At each size only the leanest switches are priced — ZeRO-3, full
recompute and micro-batch 1 for training; batch 1 and the smallest KV dtype for inference — since
if those do not fit nothing does; every mesh is still tried.
"""

from __future__ import annotations

import math

from cost_model import Inference, ModelSpec, Training
from search._exhaustive import exhaustive_search
from search._objective import Estimator, Objective
from search._space import SearchBounds
from topology import Cluster

_MAX_ATTEMPTS = 24


def lean_bounds(bounds: SearchBounds | None = None) -> SearchBounds:
    bounds = bounds or SearchBounds()
    kv = ("fp8",) if bounds.kv_dtypes is None else (bounds.kv_dtypes[-1],)
    return bounds.model_copy(
        update={
            "zero_stages": (max(bounds.zero_stages),),
            "recompute_policies": ("full",)
            if "full" in bounds.recompute_policies
            else bounds.recompute_policies[-1:],
            "max_micro_batch_size": 1,
            "max_batch_size": 1,
            "kv_dtypes": kv,
            "redundant_expert_multiples": (0,),
            "two_batch_overlap": False,
        }
    )


def smallest_feasible_devices(
    *,
    model: ModelSpec,
    cluster: Cluster,
    workload: Training | Inference,
    objective: Objective | None = None,
    bounds: SearchBounds | None = None,
    estimator: Estimator | None = None,
    max_nodes: int = 65_536,
) -> int | None:
    """Fewest devices (whole nodes of ``cluster``) with a feasible layout, or None up to ``max_nodes``."""
    weight_bytes = model.weight_bytes(
        getattr(workload, "weight_dtype", "bf16"), getattr(workload, "weight_dtype_by_part", None)
    )
    per_node = cluster.memory_per_device_bytes * cluster.devices_per_node
    nodes = max(1, math.ceil(weight_bytes / per_node))
    lean = lean_bounds(bounds)

    def fits(num_nodes: int) -> bool:
        try:
            result = exhaustive_search(
                model,
                cluster.with_nodes(num_nodes),
                workload,
                objective=objective,
                bounds=lean,
                estimator=estimator,
            )
        except ValueError:  # no legal mesh at this size (e.g. heads do not divide it)
            return False
        return result.best.feasible

    below = nodes - 1  # largest size known not to fit
    for _ in range(_MAX_ATTEMPTS):
        if nodes > max_nodes:
            return None
        if fits(nodes):
            return _bisect(fits, below=below, above=nodes) * cluster.devices_per_node
        below, nodes = nodes, max(nodes + 1, math.ceil(nodes * 1.25))
    return None


def _bisect(fits, *, below: int, above: int) -> int:
    """Smallest size in (below, above] that fits, assuming fit is monotone in the size."""
    while above - below > 1:
        middle = (below + above) // 2
        if fits(middle):
            above = middle
        else:
            below = middle
    return above
