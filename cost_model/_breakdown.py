"""``CostBreakdown`` and ``InfeasiblePlanError``: what the cost model returns.

Time parts (``time_s``) are the *exposed* seconds of one step (training) or of the phase the
workload asks about (inference); they sum to ``step_time_s``. Communication that overlaps
compute is reported in ``hidden_time_s`` and is not part of the sum. Memory parts sum to
``memory_per_device_bytes``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from cost_model._units import human_bytes


class CostBreakdown(BaseModel):
    """Predicted cost of one (model, cluster, workload, config).

    Keys of ``time_s`` used by the library: ``compute``, ``recompute``, ``tp_comm``,
    ``ep_comm``, ``cp_comm``, ``pp_comm``, ``dp_comm``, ``contention`` (compute slowed by the
    communication it hides), ``offload`` (CPU activation offloading's exposed copies),
    ``bubble``, ``optimizer`` (training);
    ``prefill`` / ``decode`` parts for inference. Keys of ``memory_bytes``: ``weights``,
    ``gradients``, ``optimizer_states``, ``activations``, ``kv_cache``, ``comm_buffers``,
    ``fragmentation``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    step_time_s: float = Field(ge=0)
    time_s: dict[str, float]
    hidden_time_s: dict[str, float] = Field(default_factory=dict)
    memory_per_device_bytes: float = Field(ge=0)
    memory_bytes: dict[str, float]
    memory_capacity_bytes: float = Field(gt=0)
    mfu: float | None = None
    tokens_per_s_per_device: float | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    #: Inference under a load: a request's mean end-to-end latency (colocated rows)
    e2e_s: float | None = None
    batch_size: int | None = None
    #: Inference: sequences per micro-batch one replica's engine admits at once, the cap its
    #: launch sets (``batch_size`` but under a request rate, where that is the mean in flight).
    running_cap: int | None = None
    bottleneck: str = ""

    def __hash__(self) -> int:
        return hash(self.model_dump_json())

    @property
    def memory_headroom_bytes(self) -> float:
        return self.memory_capacity_bytes - self.memory_per_device_bytes


class InfeasiblePlanError(ValueError):
    """A plan or a request that does not fit, with what was needed and what is available.

    ``str(error)`` reads like "weights need 6.0 TB, the cluster has 5.1 TB of HBM".
    ``smallest_devices``: the fewest devices (whole nodes of the cluster) on which the planner
    found a layout that fits, where it searched for one (``search.smallest_feasible_devices``).
    """

    def __init__(
        self,
        message: str,
        *,
        part: str,
        needed_bytes: float | None = None,
        available_bytes: float | None = None,
        suggestion: str = "",
        smallest_devices: int | None = None,
    ) -> None:
        self.part = part
        self.needed_bytes = needed_bytes
        self.available_bytes = available_bytes
        self.suggestion = suggestion
        self.smallest_devices = smallest_devices
        detail = message
        if needed_bytes is not None and available_bytes is not None and "need" not in message:
            detail += f": {part} need {human_bytes(needed_bytes)}, {human_bytes(available_bytes)} available"
        if suggestion:
            detail += f" ({suggestion})"
        super().__init__(detail)
