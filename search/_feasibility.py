"""The smallest cluster on which some layout fits, for the message of ``InfeasiblePlanError``.

Node counts are tried upward from the weight-bytes lower bound (weights sharded over every
device, nothing else). At each size only the leanest switches are priced — full recompute and
micro-batch 1 for training; batch 1 and the smallest KV dtype for inference — since if those do
not fit nothing does; every mesh is still tried. Every sharding stage from ZeRO-1 up is kept:
ZeRO-3 is not the leanest under pipeline parallelism, where each stage holds its parameters
gathered and its gradients unsharded through the step (``cost_model._memory.
pipeline_unsharded_stage``), so a ZeRO-1 pipeline can fit where ZeRO-3 does not.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator

from cost_model import Inference, ModelSpec, Training
from search._exhaustive import exhaustive_search
from search._objective import Estimator, Objective
from search._space import SearchBounds
from topology import Cluster

_MAX_ATTEMPTS = 24
#: Verdicts of ``fits`` inside ``shared_fit_verdicts()``: (model, cluster, workload, objective,
#: bounds) -> whether a lean layout fits. None outside it.
_VERDICTS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("verdicts", default=None)


@contextlib.contextmanager
def shared_fit_verdicts() -> Iterator[None]:
    """Within the block, ``smallest_feasible_devices`` prices each cluster size of the same model,
    workload and objective once: a caller that plans one model at several sizes (each failed
    search walks the same sizes again for its message) reuses the earlier walks' verdicts. A
    verdict depends on its inputs only, so the answers are those of a fresh walk; a custom
    estimator is not shared (it may hold state)."""
    token = _VERDICTS.set({})
    try:
        yield
    finally:
        _VERDICTS.reset(token)


def lean_bounds(bounds: SearchBounds | None = None, workload=None) -> SearchBounds:
    """The leanest corner of ``bounds``: sharded states, full recompute, batch 1, the narrowest
    KV dtype the search may use (the one ``workload`` names where it names one)."""
    bounds = bounds or SearchBounds()
    if bounds.kv_dtypes is not None:
        kv = (bounds.kv_dtypes[-1],)
    elif workload is not None and "kv_dtype" in getattr(workload, "model_fields_set", ()):
        kv = (workload.kv_dtype,)
    else:
        kv = ("fp8",)
    sharded = tuple(stage for stage in bounds.zero_stages if stage >= 1)
    return bounds.model_copy(
        update={
            "zero_stages": sharded or (max(bounds.zero_stages),),
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
    start = max(1, math.ceil(weight_bytes / per_node))
    lean = lean_bounds(bounds, workload)

    verdicts = _VERDICTS.get() if estimator is None else None

    def fits(num_nodes: int) -> bool:
        sized = cluster.with_nodes(num_nodes)
        key = (model, sized, workload, objective, lean)
        if verdicts is None:
            return _fits(sized)
        if key not in verdicts:
            verdicts[key] = _fits(sized)
        return verdicts[key]

    def _fits(sized: Cluster) -> bool:
        try:
            result = exhaustive_search(
                model,
                sized,
                workload,
                objective=objective,
                bounds=lean,
                estimator=estimator,
            )
        except ValueError:  # no legal mesh at this size (e.g. heads do not divide it)
            return False
        return result.best.feasible

    below = start - 1  # largest size known not to fit
    for nodes in _sizes_upward(start, max_nodes=max_nodes):
        if fits(nodes):
            return _bisect(fits, below=below, above=nodes) * cluster.devices_per_node
        below = nodes
    return None


def _sizes_upward(start: int, *, max_nodes: int) -> list[int]:
    """Node counts from ``start`` upward: ``_MAX_ATTEMPTS`` steps of 1.25x, merged with the
    powers of two in the same range. A model's heads and experts divide power-of-two meshes
    (128 heads, 256 experts), so most 1.25x steps have no legal mesh at all; the powers of two
    keep the walk from stepping over every size that has one."""
    steps, size = [], start
    for _ in range(_MAX_ATTEMPTS):
        steps.append(size)
        size = max(size + 1, math.ceil(size * 1.25))
    powers = [2**k for k in range(max(start - 1, 1).bit_length(), steps[-1].bit_length() + 1)]
    return sorted({n for n in steps + powers if start <= n <= min(steps[-1], max_nodes)})


def _bisect(fits, *, below: int, above: int) -> int:
    """Smallest size in (below, above] that fits, assuming fit is monotone in the size."""
    while above - below > 1:
        middle = (below + above) // 2
        if fits(middle):
            above = middle
        else:
            below = middle
    return above
