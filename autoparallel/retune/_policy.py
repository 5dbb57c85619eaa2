"""``RetunePolicy``: the Retuner's decisions, torch-free — calibrate the cost model on a window
of measured steps, price the changes that could pay (expert re-placement, micro-batch or batch
size, a resharded plan) with the cost model's own functions, and choose.

``autoparallel.runtime.Retuner`` is the thin torch part around it: it gathers every rank's
window, lets rank 0 decide with this policy, shares the decision and applies it to the modules.
A policy alone can be driven by any loop (or a notebook) with measured steps.

The calibration lives in ``_calibration`` (``_PolicyCalibration``) and the priced candidates in
``_candidates`` (``_PolicyCandidates``), the bases of ``RetunePolicy``; this module holds the
policy's state, ``decide`` and the choice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from autoparallel.plan import ShardingPlan
from autoparallel.retune._candidates import _PolicyCandidates
from autoparallel.retune._types import (
    MeasuredStep,
    RetuneCalibration,
    RetuneCandidate,
    RetuneDecision,
    RetuneSettings,
    WindowSummary,
    summarize,
)
from cost_model import Inference, ModelSpec, Training

logger = logging.getLogger("autoparallel.retune")


class RetunePolicy(_PolicyCandidates):
    """Decides, from measured windows, whether and how the running plan should change.

    Args:
        plan: the plan the job runs now (its ``predicted`` cost is the baseline).
        model, cluster, workload: what the plan was made for; re-planning uses the same.
        settings: thresholds and cadence (``RetuneSettings``).
        search: ``search(current_plan) -> list[ShardingPlan]``, the re-search warm-started from
            the current plan (default: ``autoparallel.find_plan`` with the current config
            enqueued as its first trial, and plans for its ranked alternatives).
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
        if plan.predicted is None:
            raise ValueError(
                "plan.predicted (None) must hold the plan's predicted cost; build plans with find_plan"
            )
        self.plan, self.model, self.cluster, self.workload = plan, model, cluster, workload
        self.settings = settings or RetuneSettings()
        self._search = search
        self._space = None
        self._stretch_cache: dict = {}
        self._cost_calibration = None  # cost_model.Calibration fitted on the last window

    def prepare(self) -> RetunePolicy:
        """Enumerate the legal layouts of this world once, ahead of the first decision (the space
        depends on the model, world and workload, never on measurements); returns ``self``."""
        from search import SearchSpace

        if self._space is None:
            self._space = SearchSpace(
                model=self.model,
                workload=self.workload,
                world_size=self.plan.world_size,
                devices_per_node=self.cluster.devices_per_node,
                bounds=self._bounds(),
            )
        return self

    def decide(self, window: list[MeasuredStep] | WindowSummary) -> RetuneDecision:
        """Compare a window (measured steps, or their ``summarize``-d summary) with the plan's
        prediction, recalibrate, re-plan, and choose; logs every candidate and the reason."""
        if isinstance(window, list):
            if not window:
                raise ValueError("window (0 measurements) must hold at least one measured step")
            window = summarize(window)
        started = time.perf_counter()
        calibration = self.calibrate(window)
        current = self._calibrated_time(self.plan, calibration.expert_imbalance, calibration)
        candidates = self._placement_candidates(window.expert_load, calibration, current)
        candidates += self._search_candidates(calibration, current, window.expert_load)
        decision = self._choose(
            candidates, summary=window, current=current, calibration=calibration
        )
        return decision.model_copy(update={"decision_latency_s": time.perf_counter() - started})

    # ------------------------------------------------------------------ the choice
    def _choose(
        self, candidates, *, summary: WindowSummary, current: float, calibration: RetuneCalibration
    ) -> RetuneDecision:
        settings = self.settings
        best, reasons = None, []
        for candidate in sorted(candidates, key=lambda c: c.step_time_s):
            payback = candidate.gain_s_per_step * settings.horizon_steps
            relative = candidate.gain_s_per_step / current if current > 0 else 0.0
            verdict = (
                "slower"
                if relative <= 0
                else "gain below noise"
                if relative < settings.min_relative_gain
                else "does not pay back its cost"
                if payback < settings.safety_factor * candidate.change_cost_s
                else "accepted"
            )
            line = (
                f"{candidate.kind} ({candidate.detail}): {current:.4g} s -> {candidate.step_time_s:.4g} s per step "
                f"({relative:+.1%}), gain over {settings.horizon_steps} steps {payback:.3g} s vs change cost "
                f"{candidate.change_cost_s:.3g} s x {settings.safety_factor}: {verdict}"
            )
            logger.info("retune: %s", line)
            reasons.append(line)
            if verdict == "accepted" and (
                best is None or _net(best, settings) < _net(candidate, settings)
            ):
                best = candidate
        step, measured = summary.step, summary.step_time_s
        head = (
            f"measured {measured:.4g} s/step vs predicted {self.plan.predicted.step_time_s:.4g} s "
            f"(scale {calibration.time_scale:.3g}, expert imbalance {calibration.expert_imbalance:.2f})"
        )
        if best is None:
            reason = f"{head}; keep the plan: " + (
                "; ".join(reasons) if reasons else "no candidate"
            )
            logger.info("retune: step %d: %s", step, reason)
            return RetuneDecision(
                kind="keep",
                plan=self.plan,
                reason=reason,
                step=step,
                measured_step_time_s=measured,
                predicted_step_time_s=current,
                new_step_time_s=current,
                change_cost_s=0.0,
                calibration=calibration,
                candidates=tuple(candidates),
            )
        reason = (
            f"{head}; change {best.kind}: {best.detail}; predicted {current:.4g} -> {best.step_time_s:.4g} s/step, "
            f"pays back {best.change_cost_s:.3g} s in {best.change_cost_s / best.gain_s_per_step:.1f} steps"
        )
        logger.info("retune: step %d: %s", step, reason)
        return RetuneDecision(
            kind=best.kind,
            plan=best.plan,
            reason=reason,
            step=step,
            measured_step_time_s=measured,
            predicted_step_time_s=current,
            new_step_time_s=best.step_time_s,
            change_cost_s=best.change_cost_s,
            calibration=calibration,
            candidates=tuple(candidates),
        )


def _net(candidate: RetuneCandidate, settings: RetuneSettings) -> float:
    return candidate.gain_s_per_step * settings.horizon_steps - candidate.change_cost_s
