"""The Retuner's data: measured steps, settings, calibration, candidates, decisions and the window
summary. Torch-free; ``autoparallel.runtime.Retuner`` shares them between ranks."""

from __future__ import annotations

import statistics
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from autoparallel.plan import ShardingPlan
from cost_model import Inference, ParallelConfig

ChangeKind = Literal["keep", "expert_placement", "micro_batch", "batch_size", "reshard"]
_STRICT = ConfigDict(extra="forbid", frozen=True)


class MeasuredStep(BaseModel):
    """What one step of the running job measured (the step profiler fills it)."""

    model_config = _STRICT

    step: int = Field(ge=0)
    step_time_s: float = Field(gt=0)
    peak_memory_bytes: float | None = Field(default=None, ge=0)
    expert_load: tuple[tuple[float, ...], ...] | None = Field(
        default=None, description="tokens routed to each expert, [moe layer][expert], this step"
    )
    communication_time_s: float | None = Field(
        default=None, ge=0, description="exposed communication, if measured"
    )

    @classmethod
    def from_step_report(cls, report, *, step: int) -> MeasuredStep:  # profilers StepReport
        """One measurement from a ``profilers`` ``StepReport``: its median step time, peak memory,
        communication wait and router counts (MoE layers in module order, one row per router)."""
        load = tuple(
            tuple(float(c) for c in counts)
            for _, counts in sorted(report.expert_load.items(), key=_layer_order)
        )
        return cls(
            step=step,
            step_time_s=report.median_step_time_s,
            peak_memory_bytes=report.peak_memory_bytes,
            expert_load=load or None,
            communication_time_s=report.comm_time_s,
        )


def _layer_order(item: tuple[str, Any]) -> tuple:
    """Sort FQNs with their integer parts as numbers (``layers.10`` after ``layers.9``)."""
    return tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part) for part in item[0].split(".")
    )


class RetuneSettings(BaseModel):
    """When to look, what a change may cost, what counts as noise. Each default is a stated choice."""

    model_config = _STRICT

    every_n_steps: int = Field(default=50, gt=0)
    warmup_steps: int = Field(
        default=2, ge=0, description="first steps ignored: lazy init, allocator growth"
    )
    horizon_steps: int = Field(
        default=1000, gt=0, description="steps a change has to pay back over"
    )
    min_relative_gain: float = Field(
        default=0.03, ge=0, description="smaller gains are within measurement noise"
    )
    safety_factor: float = Field(
        default=1.5, ge=1.0, description="gain * horizon must exceed this x change cost"
    )
    num_redundant_experts: int | None = Field(
        default=None, ge=0, description="replica slots; default: compare one per EP rank with none"
    )
    ranks_per_node: int | None = Field(
        default=None, gt=0, description="EP ranks per node; default the cluster's"
    )
    live_change_overhead_steps: float = Field(
        default=1.0, ge=0, description="a live change costs this many steps"
    )
    restart_overhead_s: float = Field(
        default=120.0, ge=0, description="relaunch + process-group init of a reshard"
    )
    checkpoint_bandwidth_bytes_per_s: float = Field(
        default=2e9, gt=0, description="per device, save and load"
    )
    search_trials: int = Field(
        default=16, gt=0, description="re-search budget; warm-started, so a local refinement"
    )
    max_cp_degree: int | None = Field(
        default=1, gt=0, description="apply_plan has no context parallel yet: cp 1"
    )
    fit_cost_model: bool = Field(
        default=True, description="training: refit matmul efficiency with cost_model.calibrate"
    )
    calibration_iterations: int = Field(
        default=8, gt=0, description="Levenberg-Marquardt iterations per window"
    )
    seed: int = 0
    allowed_changes: tuple[ChangeKind, ...] = (
        "expert_placement",
        "micro_batch",
        "batch_size",
        "reshard",
    )


class RetuneCalibration(BaseModel):
    """Measured / predicted, fitted on one window of steps."""

    model_config = _STRICT

    method: str
    time_scale: float = Field(
        gt=0, description="measured step time / (predicted x expert imbalance)"
    )
    communication_scale: float | None = None
    memory_scale: float | None = None
    expert_imbalance: float = Field(
        default=1.0, ge=1.0, description="max/mean tokens per EP rank, measured"
    )


class RetuneCandidate(BaseModel):
    """One change the Retuner considered, priced with the calibrated model."""

    model_config = _STRICT

    kind: ChangeKind
    plan: ShardingPlan
    step_time_s: float
    change_cost_s: float
    gain_s_per_step: float
    detail: str = ""


class RetuneDecision(BaseModel):
    """The Retuner's verdict on one window; ``plan`` is the plan to run next."""

    model_config = _STRICT

    kind: ChangeKind
    plan: ShardingPlan
    reason: str
    step: int
    measured_step_time_s: float
    predicted_step_time_s: float
    new_step_time_s: float
    change_cost_s: float
    calibration: RetuneCalibration
    candidates: tuple[RetuneCandidate, ...] = ()
    decision_latency_s: float = 0.0

    @property
    def changed(self) -> bool:
        return self.kind != "keep"

    @property
    def gain_s_per_step(self) -> float:
        return self.predicted_step_time_s - self.new_step_time_s

    def overridden(self, kind: ChangeKind) -> RetuneDecision:
        """This decision made ``kind`` anyway, with the best priced candidate of that kind (an
        operator's override, e.g. to measure a change the model rejected); the reason says so."""
        options = [c for c in self.candidates if c.kind == kind]
        if not options:
            raise ValueError(
                f"kind ({kind!r}) was not among the priced candidates {sorted({c.kind for c in self.candidates})}"
            )
        best = min(options, key=lambda c: c.step_time_s)
        return self.model_copy(
            update={
                "kind": kind,
                "plan": best.plan,
                "new_step_time_s": best.step_time_s,
                "change_cost_s": best.change_cost_s,
                "reason": f"override to {kind} ({best.detail}); the Retuner's verdict: {self.reason}",
            }
        )


class WindowSummary(BaseModel):
    """One window of steps on one rank (or combined over ranks)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    step: int
    step_time_s: float
    expert_load: Any = None  # np.ndarray [num_experts], tokens summed over layers and steps
    peak_memory_bytes: float | None = None
    communication_time_s: float | None = None


def summarize(window: list[MeasuredStep]) -> WindowSummary:
    """Median step and communication times, summed expert load, largest peak memory."""
    loads = [
        np.asarray(m.expert_load, dtype=np.float64) for m in window if m.expert_load is not None
    ]
    load = np.sum([x.sum(axis=0) if x.ndim == 2 else x for x in loads], axis=0) if loads else None
    comm = [m.communication_time_s for m in window if m.communication_time_s is not None]
    memory = [m.peak_memory_bytes for m in window if m.peak_memory_bytes is not None]
    return WindowSummary(
        step=window[-1].step,
        step_time_s=statistics.median(m.step_time_s for m in window),
        expert_load=load,
        peak_memory_bytes=max(memory) if memory else None,
        communication_time_s=statistics.median(comm) if comm else None,
    )


def plan_batch_size(plan: ShardingPlan) -> float:
    """Sequences per replica of an inference plan, else the predicted micro-batch size."""
    if plan.serving is not None:
        return float(plan.serving.batch_size)
    return float(plan.predicted.batch_size or 1) if plan.predicted is not None else 1.0


def communication_s(predicted) -> float:  # CostBreakdown
    """Exposed communication seconds of a prediction."""
    return sum(v for k, v in predicted.time_s.items() if k.endswith("_comm"))


_DEGREES = ("dp", "tp", "pp", "cp", "ep", "etp", "attention_data_parallel", "virtual_stages")


def change_kind(old: ShardingPlan, new: ShardingPlan, workload) -> ChangeKind:
    """What it takes to go from plan ``old`` to ``new``: nothing, a live change, or a reshard."""
    a, b = old.config, new.config
    if any(getattr(a, name) != getattr(b, name) for name in _DEGREES):
        return "reshard"
    rest = {k for k in ParallelConfig.model_fields if getattr(a, k) != getattr(b, k)}
    if isinstance(workload, Inference):
        if rest - {"micro_batch_size"}:
            return "reshard"
        old_batch = None if old.serving is None else old.serving.batch_size
        new_batch = None if new.serving is None else new.serving.batch_size
        return "batch_size" if old_batch != new_batch else "keep"
    if not rest:
        return "keep"
    # Schedule, recompute or ZeRO stage rebuild the job from a checkpoint, like a degree change.
    return "micro_batch" if rest == {"micro_batch_size"} else "reshard"


def describe_plan(plan: ShardingPlan) -> str:
    """Short text of a plan's degrees and batch, for logs and decisions."""
    config = plan.config
    degrees = " ".join(
        f"{k}{getattr(config, k)}"
        for k in ("pp", "dp", "cp", "tp", "ep", "etp")
        if getattr(config, k) > 1
    )
    batch = (
        f"batch {plan.serving.batch_size}"
        if plan.serving is not None
        else f"mbs{config.micro_batch_size}"
    )
    return f"{degrees or 'one device'} {batch}"
