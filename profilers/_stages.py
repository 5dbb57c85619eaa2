"""Staged validation of the cost model on the machine at hand, as practitioners do it: an op,
a layer, one device, then multi-device plans — each measured and compared with its prediction
under a stated tolerance (time 25%, memory 15%).

References per stage:
  * op — one forward GEMM of the model's widest projection (tokens x hidden -> dense FFN),
    against ``cost_model`` 's roofline of that call on the profiled device;
  * layer — forward + backward of one MoE decoder layer, against the cost model's marginal layer
    (the estimate of the model with one more MoE layer minus the model's), time and stored
    activations (op and layer are timed with caches flushed before each call, as in a step,
    where each weight is read once per pass);
  * device — full training steps of the reference model on one process, against ``estimate``;
  * plan — the same steps under ``apply_plan`` on forked ranks, against ``estimate`` for the plan.

``calibrate_on_device=True`` fits the matmul and memory efficiencies on the one-device stage
(its step and optimizer time; ``cost_model.calibrate``, starting from the profile's measured
per-kernel launch cost) and predicts the plans with that calibration too: a plan's error is
then a test of the model, not of the fit.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from cost_model import (
    Axis,
    Calibration,
    Layout,
    ParallelConfig,
    StepMeasurement,
    axis_degrees,
    calibrate,
    estimate,
    op_time_s,
)
from profilers._step import StepReport, _peak_rise_bytes, merge_reports
from profilers._timing import cache_flusher, current_device, measure
from profilers._training_run import TORCH_DTYPES, TrainingSetup, build_model, measure_training
from topology import Cluster

logger = logging.getLogger(__name__)
TIME_TOLERANCE, MEMORY_TOLERANCE = 0.25, 0.15
#: ``wall``: seconds on the clock. ``cpu``: CPU seconds of the (single-threaded) ranks — the work,
#: whatever else shares the cores — against the prediction less the pipeline bubble (idle time).
CLOCKS = ("wall", "cpu")
_CLOCK = {"wall": "wall", "cpu": "thread"}
#: The reference model passes an explicit causal mask to SDPA: the math path, scores stored.
#: ``MasterWeightAdam`` adds each bf16 gradient into its fp32 main gradient in a hook: unfused.
ESTIMATE_OPTIONS = {"flash_attention": False, "fused_gradient_accumulation": False}
#: Fitted on the one-device stage: the step row fixes the matmul, the optimizer row the memory
#: efficiency. The fixed cost per kernel is the profile's measured launch cost, not fitted.
CALIBRATED = ("matmul_efficiency", "memory_bandwidth_efficiency")


class StageResult(BaseModel):
    """One stage: predicted and measured time (and memory), each with its tolerance."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: Literal["op", "layer", "device", "plan"]
    name: str
    reference: str
    predicted_time_s: float = Field(gt=0)
    measured_time_s: float = Field(gt=0)
    predicted_memory_bytes: float | None = None
    measured_memory_bytes: float | None = None
    calibrated_time_s: float | None = Field(
        default=None, description="prediction with the fitted calibration"
    )
    time_tolerance: float = TIME_TOLERANCE
    memory_tolerance: float = MEMORY_TOLERANCE
    details: dict[str, float] = Field(default_factory=dict)

    @property
    def time_error(self) -> float:
        """Relative error of the prediction used for the verdict (calibrated when there is one)."""
        predicted = (
            self.calibrated_time_s if self.calibrated_time_s is not None else self.predicted_time_s
        )
        return predicted / self.measured_time_s - 1.0

    @property
    def memory_error(self) -> float | None:
        if self.predicted_memory_bytes is None or not self.measured_memory_bytes:
            return None
        return self.predicted_memory_bytes / self.measured_memory_bytes - 1.0

    @property
    def time_ok(self) -> bool:
        return abs(self.time_error) <= self.time_tolerance

    @property
    def memory_ok(self) -> bool:
        error = self.memory_error
        return error is None or abs(error) <= self.memory_tolerance

    @property
    def passed(self) -> bool:
        return self.time_ok and self.memory_ok


class StagedReport(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    setup: TrainingSetup
    cluster_name: str
    stages: tuple[StageResult, ...]
    calibration: Calibration | None = None
    clock: Literal["wall", "cpu"] = "wall"
    rounds: int = Field(default=1, ge=1)

    @property
    def passed(self) -> bool:
        return all(stage.passed for stage in self.stages)


# ----------------------------------------------------------------------------- op
def check_op(*, setup: TrainingSetup, cluster: Cluster, clock: str = "wall") -> StageResult:
    """Time one forward GEMM (tokens x hidden) @ (hidden x ffn) in the setup's precision."""
    spec, device = setup.spec(), current_device()
    m, k, n = setup.batch_sequences * setup.sequence_tokens, spec.hidden_size, spec.ffn_hidden_size
    dtype = TORCH_DTYPES[setup.precision]
    x, weight = (
        torch.randn(m, k, dtype=dtype, device=device),
        torch.randn(n, k, dtype=dtype, device=device),
    )
    timing = measure(
        lambda: torch.nn.functional.linear(x, weight),
        device=device,
        warmup=2,
        repeats=9,
        clock=_CLOCK[clock],
        before_each=cache_flusher(device),
    )  # as in a step: the weight comes from memory
    measured_memory = _allocated_by(lambda: torch.nn.functional.linear(x, weight))
    element = x.element_size()
    predicted = float(
        op_time_s(
            flops=2.0 * m * n * k,
            bytes_moved=(m * k + n * k + m * n) * element,
            hardware=cluster.device,
            dtype=setup.precision,
            calibration=Calibration(),
        )
    )
    return StageResult(
        stage="op",
        name=f"linear {m}x{k}->{n} {setup.precision}",
        reference="roofline of the profiled device",
        predicted_time_s=predicted,
        measured_time_s=timing.median_s,
        predicted_memory_bytes=float(m * n * element),
        measured_memory_bytes=measured_memory,
        details={"spread": timing.spread},
    )


def _allocated_by(fn: Callable[[], object]) -> float:
    """Largest rise of tensor memory while ``fn`` runs (torch profiler, allocator events)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    del result
    return _peak_rise_bytes(list(prof.events()))


# ----------------------------------------------------------------------------- layer
def _moe_layer(model: torch.nn.Module) -> torch.nn.Module:
    layers = model.model.layers
    return next(layer for layer in layers.values() if hasattr(layer.mlp, "experts"))


def _layer_call(layer: torch.nn.Module, hidden: torch.Tensor) -> Callable[[], object]:
    def call() -> None:
        out = layer(hidden)
        out.backward(torch.ones_like(out))

    return call


def check_layer(*, setup: TrainingSetup, cluster: Cluster, clock: str = "wall") -> StageResult:
    """Forward + backward of one MoE layer against the estimate's marginal MoE layer."""
    model = build_model(setup)
    layer, device = _moe_layer(model), current_device()
    shape = (setup.batch_sequences, setup.sequence_tokens, setup.hidden_size)
    hidden = torch.randn(
        shape, dtype=TORCH_DTYPES[setup.precision], device=device, requires_grad=True
    )
    timing = measure(
        _layer_call(layer, hidden),
        device=device,
        warmup=1,
        repeats=5,
        clock=_CLOCK[clock],
        before_each=cache_flusher(device),
    )  # as in a step: weights come from memory
    stored = _stored_by(lambda: layer(hidden))
    config = ParallelConfig(micro_batch_size=setup.batch_sequences)
    workload = setup.workload(config)
    small, large = (
        estimate(
            setup.model_copy(update={"num_layers": n}).spec(),
            cluster,
            workload,
            config,
            **ESTIMATE_OPTIONS,
        )
        for n in (setup.num_layers, setup.num_layers + 1)
    )
    return StageResult(
        stage="layer",
        name=f"MoE layer {shape[0]}x{shape[1]} fwd+bwd",
        reference="estimate(L+1) - estimate(L)",
        predicted_time_s=large.time_s["compute"] - small.time_s["compute"],
        measured_time_s=timing.median_s,
        predicted_memory_bytes=large.memory_bytes["activations"]
        - small.memory_bytes["activations"],
        measured_memory_bytes=stored,
        details={"spread": timing.spread},
    )


def _stored_by(forward: Callable[[], torch.Tensor]) -> float:
    """Tensor bytes a forward leaves allocated (saved activations and its output)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        output = forward()
    stored = sum(getattr(e, "self_cpu_memory_usage", 0) for e in prof.events())
    del output
    return float(stored)


# ----------------------------------------------------------------------------- device and plans
def device_config(setup: TrainingSetup) -> ParallelConfig:
    """One process, the whole batch in one micro-batch (as ``measure_training`` runs it)."""
    return ParallelConfig(micro_batch_size=setup.batch_sequences)


def plan_for(*, setup: TrainingSetup, cluster: Cluster, config: ParallelConfig):  # ShardingPlan
    """The ``ShardingPlan`` the planner writes for ``config`` (stages, meshes, rules, prediction)."""
    from autoparallel.plan import build_plan

    spec, workload = setup.spec(), setup.workload(config)
    return build_plan(
        model=spec,
        cluster=cluster,
        job=workload,
        layout=Layout(config=config),
        estimate_options=ESTIMATE_OPTIONS,
    )


def _measured_step(reports: list[StepReport], clock: str) -> tuple[float, float]:
    """The slowest rank's median step and the largest peak memory over ranks."""
    times = [
        r.median_step_time_s if clock == "wall" else (r.median_cpu_time_s or 0.0) for r in reports
    ]
    return max(times), max(r.peak_memory_bytes or 0.0 for r in reports)


def _predicted_s(breakdown, clock: str) -> float:  # CostBreakdown
    return breakdown.step_time_s - (breakdown.time_s.get("bubble", 0.0) if clock == "cpu" else 0.0)


def _step_result(
    stage,
    name: str,
    setup: TrainingSetup,
    cluster: Cluster,
    config: ParallelConfig,
    reports: list[StepReport],
    calibration: Calibration | None,
    clock: str,
) -> StageResult:
    spec, workload = setup.spec(), setup.workload(config)
    raw = estimate(spec, cluster, workload, config, **ESTIMATE_OPTIONS)
    calibrated = None
    if calibration is not None:
        with_fit = estimate(
            spec, cluster, workload, config, calibration=calibration, **ESTIMATE_OPTIONS
        )
        calibrated = _predicted_s(with_fit, clock)
    time_s, memory = _measured_step(reports, clock)
    details = {
        "measured_comm_s": max((r.comm_time_s or 0.0) for r in reports),
        "measured_wall_s": max(r.median_step_time_s for r in reports),
        "measured_cpu_s": max((r.median_cpu_time_s or 0.0) for r in reports),
        **{f"predicted_{k}_s": v for k, v in raw.time_s.items() if v},
        **{
            f"measured_{phase}_s": max(r.median_phase_s(phase, clock=clock) for r in reports)
            for phase in reports[0].phase_times_s
        },
    }
    return StageResult(
        stage=stage,
        name=name,
        reference=f"estimate({_config_label(config)}), {clock} clock",
        predicted_time_s=_predicted_s(raw, clock),
        measured_time_s=time_s,
        calibrated_time_s=calibrated,
        predicted_memory_bytes=raw.memory_per_device_bytes,
        measured_memory_bytes=memory,
        details=details,
    )


def _config_label(config: ParallelConfig) -> str:
    degrees = [
        f"{axis}{degree}"
        for axis, degree in axis_degrees(config, (Axis.DP, Axis.TP, Axis.PP, Axis.EP))
        if degree > 1
    ]
    return " ".join(degrees) + (" sp" if config.sequence_parallel else "") or "1 device"


def _device_rows(
    setup: TrainingSetup, config: ParallelConfig, report: StepReport, clock: str
) -> list[StepMeasurement]:
    """The whole step (what the stage compares) and its optimizer phase (memory-bound)."""
    spec, workload = setup.spec(), setup.workload(config)
    step = report.median_step_time_s if clock == "wall" else report.median_cpu_time_s
    common = dict(model=spec, workload=workload, config=config, options=ESTIMATE_OPTIONS)
    tokens = setup.batch_sequences * setup.sequence_tokens
    return [
        StepMeasurement(
            label=f"device step {tokens} tokens", parts=("step",), measured_s=step, **common
        ),
        StepMeasurement(
            label=f"device optimizer {tokens} tokens",
            parts=("optimizer",),
            measured_s=report.median_phase_s("optimizer", clock=clock),
            **common,
        ),
    ]


def _plan_rank(rank: int, world_size: int, setup: TrainingSetup, plan_json: str) -> StepReport:
    from autoparallel import load_plan

    return measure_training(setup, plan=load_plan(plan_json))


def run_stages(
    *,
    setup: TrainingSetup,
    cluster: Cluster,
    configs: tuple[ParallelConfig, ...],
    calibrate_on_device: bool = True,
    progress: Callable[[str], None] | None = None,
    timeout_s: float = 1800.0,
    clock: str = "wall",
    rounds: int = 1,
) -> StagedReport:
    """Run every stage (see the module docstring) and return predicted vs measured for each.

    Single-process stages run with one intra-op thread, like each rank of the plans and of the
    profile. ``cluster`` must have at least as many devices as the largest config. ``clock``:
    see ``CLOCKS``. ``rounds`` > 1 repeats the one-device and plan runs in turn (device, plan 1,
    plan 2, device, ...) and pools their steps (``merge_reports``): on a shared machine a burst
    of load then spreads over every stage instead of landing on one.
    """
    if clock not in CLOCKS:
        raise ValueError(f"clock ({clock!r}) must be one of {list(CLOCKS)}")
    if rounds < 1:
        raise ValueError(f"rounds ({rounds}) must be >= 1")
    say = progress or (lambda text: None)
    with _one_thread():
        say("op")
        stages = [check_op(setup=setup, cluster=cluster, clock=clock)]
        say("layer")
        stages.append(check_layer(setup=setup, cluster=cluster, clock=clock))
    plans = [plan_for(setup=setup, cluster=cluster, config=config) for config in configs]
    device_runs, plan_runs = [], [[] for _ in plans]
    for round_index in range(rounds):
        say(f"one device (round {round_index + 1}/{rounds})")
        with _one_thread():
            device_runs.append(measure_training(setup))
        for plan, runs in zip(plans, plan_runs):
            say(f"{_config_label(plan.config)} (round {round_index + 1}/{rounds})")
            runs.append(_run_plan(setup, plan, timeout_s))
    device_report = merge_reports(device_runs)
    config = device_config(setup)
    calibration = None
    if calibrate_on_device:
        rows = _device_rows(setup, config, device_report, clock)
        calibration = calibrate(
            cluster=cluster, measurements=rows, parameters=CALIBRATED
        ).calibration
    stages.append(
        _step_result(
            "device",
            "model, 1 process",
            setup,
            cluster,
            config,
            [device_report],
            calibration,
            clock,
        )
    )
    for plan, runs in zip(plans, plan_runs):
        per_rank = [merge_reports([run[rank] for run in runs]) for rank in range(plan.world_size)]
        stages.append(
            _step_result(
                "plan",
                f"model, {_config_label(plan.config)}",
                setup,
                cluster,
                plan.config,
                per_rank,
                calibration,
                clock,
            )
        )
    return StagedReport(
        setup=setup,
        cluster_name=cluster.name,
        stages=tuple(stages),
        calibration=calibration,
        clock=clock,
        rounds=rounds,
    )


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _run_plan(setup: TrainingSetup, plan, timeout_s: float) -> list[StepReport]:  # ShardingPlan
    from autoparallel.runtime import run_ranks

    return run_ranks(
        _plan_rank, plan.world_size, args=(setup, plan.model_dump_json()), timeout_s=timeout_s
    )
