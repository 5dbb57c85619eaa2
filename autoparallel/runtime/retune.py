"""``Retuner``: keep a running job's plan tuned — measure, recalibrate, re-plan, change if it pays.

Used inside the user's training or inference loop::

    retuner = ap.Retuner(plan, model=spec, cluster=cluster, workload=workload)
    for step in range(num_steps):
        ...one step...
        decision = retuner.observe(MeasuredStep(step=step, step_time_s=..., expert_load=...))
        if decision is not None and decision.changed:
            plan = retuner.apply(decision, runtime=handle, optimizer=optimizer)

Every ``every_n_steps`` steps ``observe`` compares the window's median step time, peak memory and
expert load with the plan's prediction, recalibrates the cost model (``cost_model.calibrate`` for
training, plus a residual scale fit), re-searches warm-started from the current plan with the
recalibrated model, and returns a ``RetuneDecision`` (under torch.distributed: decided on rank 0
from every rank's window, then broadcast). A change is chosen only when its
predicted gain over the remaining horizon beats ``safety_factor`` times the change's cost; every
candidate and the reason for the choice are logged (logger ``autoparallel.retune``).

Changes, cheapest first: expert re-placement (EPLB-style replicas of hot experts, weights moved
between EP ranks with collectives, outputs unchanged), micro-batch size/count (training) or batch
size (inference), live; new tp/pp/ep degrees by a resharded ``torch.distributed.checkpoint``
(``save_checkpoint`` under the old plan, ``load_checkpoint`` under the new). ``Retuner.recover``
restarts after a lost rank on the largest legal world the survivors allow.

The decisions are ``autoparallel.retune.RetunePolicy``'s (torch-free); this class only gathers
windows across ranks, shares the decision and applies it. It imports torch only inside the
methods that touch modules or process groups.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

import numpy as np

from autoparallel.plan import ShardingPlan
from autoparallel.retune import (
    MeasuredStep,
    RetuneCalibration,
    RetuneDecision,
    RetunePolicy,
    RetuneSettings,
    WindowSummary,
    summarize,
)
from cost_model import Inference, ModelSpec, Training

__all__ = [
    "MeasuredStep",
    "RetuneCalibration",
    "RetuneDecision",
    "RetuneSettings",
    "Retuner",
    "WindowSummary",
    "summarize",
]

logger = logging.getLogger("autoparallel.retune")


class Retuner:
    """Online re-tuning of one torch job's ``ShardingPlan``; see the module docstring for the loop.

    Arguments are ``RetunePolicy``'s. ``policy`` holds the decision logic; ``plan`` is the plan
    in force (updated by ``apply`` and ``reshard``).
    """

    def __init__(
        self,
        plan: ShardingPlan,
        *,
        model: ModelSpec,
        cluster,  # topology.Cluster
        workload: Training | Inference,
        settings: RetuneSettings | None = None,
        search: Callable[[ShardingPlan], list[ShardingPlan]] | None = None,
    ) -> None:
        self.policy = RetunePolicy(
            plan, model=model, cluster=cluster, workload=workload, settings=settings, search=search
        )
        self._window: list[MeasuredStep] = []
        self._steps_seen = 0
        self.decisions: list[RetuneDecision] = []

    @property
    def plan(self) -> ShardingPlan:
        return self.policy.plan

    @plan.setter
    def plan(self, plan: ShardingPlan) -> None:
        self.policy.plan = plan

    @property
    def settings(self) -> RetuneSettings:
        return self.policy.settings

    def prepare(self) -> Retuner:
        """Enumerate this world's legal layouts ahead of the first decision; returns ``self``."""
        self.policy.prepare()
        return self

    def calibrate(self, summary: WindowSummary) -> RetuneCalibration:
        """``RetunePolicy.calibrate`` on one window summary."""
        return self.policy.calibrate(summary)

    # ------------------------------------------------------------------ the loop
    def observe(self, measurement: MeasuredStep) -> RetuneDecision | None:
        """Record one step; every ``every_n_steps`` steps return a decision (else ``None``)."""
        self._steps_seen += 1
        if self._steps_seen > self.settings.warmup_steps:
            self._window.append(measurement)
        if len(self._window) < self.settings.every_n_steps:
            return None
        decision = self.decide()
        self._window = []
        return decision

    def decide(self, window: list[MeasuredStep] | None = None) -> RetuneDecision:
        """Decide on ``window`` (default: the steps observed since the last decision).

        Under torch.distributed every rank must call it (``observe`` does, on the same step): the
        ranks' windows are combined (slowest median step, summed expert load, largest memory),
        rank 0 decides with the policy and the decision is broadcast, so every rank applies the
        same change.
        """
        window = list(self._window if window is None else window)
        if not window:
            raise ValueError("window (0 measurements) must hold at least one measured step")
        summary = _combine_ranks(summarize(window))
        decision = self.policy.decide(summary) if _rank() == 0 else None
        decision = _share_from_rank_zero(decision)
        self.decisions.append(decision)
        return decision

    # ------------------------------------------------------------------ acting
    def apply(self, decision: RetuneDecision, *, runtime=None, optimizer=None) -> ShardingPlan:
        """Carry out a live decision on this rank; return the plan now in force.

        ``runtime`` is ``apply_plan``'s ``AppliedPlan``; its ``plan`` is updated. For
        ``expert_placement`` the expert weights (and ``optimizer`` state) move between EP ranks —
        collective over each EP group, so every rank calls ``apply`` with the same decision — and
        data parallel learns the new expert weights (they stay out of its dp average).
        ``micro_batch`` rebuilds the pipeline schedule for the new micro-batch count when pp > 1;
        otherwise the training loop reads ``retuner.plan.config.micro_batch_size``. ``batch_size``:
        the serving loop reads ``retuner.plan.serving.batch_size``. ``reshard`` is not live (see
        ``reshard``).
        """
        if decision.kind == "reshard":
            raise ValueError(
                "decision.kind ('reshard') is not a live change; call Retuner.reshard(...) instead"
            )
        if decision.kind == "expert_placement":
            if runtime is None or not runtime.expert_parallel:
                raise ValueError(
                    "runtime (apply_plan's result, with expert parallel) is needed to re-place experts"
                )
            from autoparallel.runtime._rebalance import rebalance_experts

            for part in runtime.expert_parallel:
                rebalance_experts(
                    part, placement=decision.plan.expert_placement, optimizer=optimizer
                )
            if runtime.data_parallel is not None:
                experts = {
                    id(p) for part in runtime.expert_parallel for p in part.expert_parameters()
                }
                runtime.data_parallel.ignored = frozenset(experts)
        if decision.kind == "micro_batch" and runtime is not None and runtime.pipeline is not None:
            from autoparallel.runtime._pipeline import num_micro_batches_for
            from autoparallel.runtime._recovery import rebuild_schedule

            rebuild_schedule(
                runtime.pipeline,
                plan=decision.plan,
                num_micro_batches=num_micro_batches_for(decision.plan),
            )
        if decision.kind != "keep":
            logger.info("retune: applied %s at step %d", decision.kind, decision.step)
        self.plan = decision.plan
        if runtime is not None:
            runtime.plan = decision.plan
        return self.plan

    def reshard(
        self,
        decision: RetuneDecision,
        *,
        modules,
        optimizer,
        step: int,
        checkpoint: str,
        build,
        extra=None,
    ):
        """Change degrees in place on the same ranks: save a checkpoint under the running plan,
        ``build(decision.plan) -> (modules, optimizer, ...)`` the job under the new one, load the
        checkpoint into it and return ``build``'s result. Collective."""
        from autoparallel.runtime._reshard import reshard_in_place

        built = reshard_in_place(
            old=self.plan,
            new=decision.plan,
            modules=modules,
            optimizer=optimizer,
            step=step,
            checkpoint=checkpoint,
            build=build,
            extra=extra,
        )
        self.plan = decision.plan
        return built

    @classmethod
    def recover(
        cls,
        checkpoint: str,
        *,
        build,  # Callable[[ShardingPlan], tuple]
        model: ModelSpec | None = None,
        cluster=None,
        workload: Training | Inference | None = None,
        settings: RetuneSettings | None = None,
        n_trials: int = 64,
        seed: int = 0,
    ):  # -> Recovery | None
        """Continue a job after lost ranks, on the ranks launched now. Collective.

        Reads the last complete checkpoint under ``checkpoint``, finds the largest world the
        launched ranks allow (``largest_legal_world``), re-plans for it on rank 0 (warm-started
        from the old plan) and shares the plan, shrinks the process group to it, calls
        ``build(plan) -> (modules, optimizer, ...)`` and loads the checkpoint into the result.
        Model, cluster and workload default to the ones the old plan names (catalog model,
        cluster preset). Returns ``None`` on a rank left out of the new world (a spare).
        """
        from autoparallel.runtime._recovery import Recovery, recover_job

        settings = settings or RetuneSettings()
        restored = recover_job(
            checkpoint,
            build=build,
            model=model,
            cluster=cluster,
            workload=workload,
            n_trials=n_trials,
            seed=seed,
            max_cp_degree=settings.max_cp_degree,
        )
        if restored is None:
            return None
        plan, job, built, info = restored
        retuner = cls(plan, model=job[0], cluster=job[1], workload=job[2], settings=settings)
        return Recovery(
            retuner=retuner,
            plan=plan,
            built=built,
            step=info.step,
            extra=info.extra,
            world_size=plan.world_size,
            previous_world_size=info.plan.world_size,
        )


# ---------------------------------------------------------------------- ranks
def _distributed() -> bool:
    dist = sys.modules.get("torch.distributed")  # never import torch just to ask
    return (
        dist is not None
        and dist.is_available()
        and dist.is_initialized()
        and dist.get_world_size() > 1
    )


def _rank() -> int:
    return sys.modules["torch.distributed"].get_rank() if _distributed() else 0


def _combine_ranks(summary: WindowSummary) -> WindowSummary:
    """The job's view: slowest rank's times, expert load summed over ranks, largest memory."""
    if not _distributed():
        return summary
    import torch.distributed as dist

    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, summary.model_dump())
    loads = [g["expert_load"] for g in gathered if g["expert_load"] is not None]
    memory = [g["peak_memory_bytes"] for g in gathered if g["peak_memory_bytes"] is not None]
    comm = [g["communication_time_s"] for g in gathered if g["communication_time_s"] is not None]
    return WindowSummary(
        step=summary.step,
        step_time_s=max(g["step_time_s"] for g in gathered),
        expert_load=np.sum(loads, axis=0) if loads else None,
        peak_memory_bytes=max(memory) if memory else None,
        communication_time_s=max(comm) if comm else None,
    )


def _share_from_rank_zero(decision: RetuneDecision | None) -> RetuneDecision:
    if not _distributed():
        assert decision is not None  # rank 0 of a single process always decides
        return decision
    import torch.distributed as dist

    payload = [decision.model_dump_json() if decision is not None else None]
    dist.broadcast_object_list(payload, src=0)
    return RetuneDecision.model_validate_json(payload[0])
