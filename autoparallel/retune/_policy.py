"""``RetunePolicy``: the Retuner's decisions, torch-free — calibrate the cost model on a window
of measured steps, price the changes that could pay (expert re-placement, micro-batch or batch
size, a resharded plan) with the cost model's own functions, and choose.

``autoparallel.runtime.Retuner`` is the thin torch part around it: it gathers every rank's
window, lets rank 0 decide with this policy, shares the decision and applies it to the modules.
A policy alone can be driven by any loop (or a notebook) with measured steps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from autoparallel._expert_placement import (
    balanced_placement,
    contiguous_placement,
    load_imbalance,
    placement_moves,
)
from autoparallel.plan import ExpertPlacement, ShardingPlan
from autoparallel.retune._types import (
    ChangeKind,
    MeasuredStep,
    RetuneCalibration,
    RetuneCandidate,
    RetuneDecision,
    RetuneSettings,
    WindowSummary,
    change_kind,
    communication_s,
    describe_plan,
    plan_batch_size,
    summarize,
)
from cost_model import InfeasiblePlanError, Inference, ModelSpec, Training

logger = logging.getLogger("autoparallel.retune")


class RetunePolicy:
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

    def _bounds(self):  # search.SearchBounds
        from search import SearchBounds

        return SearchBounds(max_cp_degree=self.settings.max_cp_degree)

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

    # ------------------------------------------------------------------ calibration
    def calibrate(self, summary: WindowSummary) -> RetuneCalibration:
        """Fit measured / predicted on one window.

        Training: first ``cost_model.calibrate`` refits the device's matmul efficiency so that the
        cost model, at the measured expert imbalance, predicts the measured step; every candidate
        (and the re-search) is then priced with that calibration. What one parameter cannot
        explain is left to the scale fit below (the whole fit for inference).

        The plan's prediction assumes balanced experts; the measured max/mean tokens per EP rank
        ``r`` stretches the step by ``s(r)`` (expert GEMMs and the EP all-to-all wait for the
        busiest rank; see ``_stretch``): ``t = s(r) * (a * t_rest + b * t_comm)`` with ``t_comm``
        the predicted exposed communication. Without measured communication time
        ``a = b`` is the one number fitted (``time_scale``); with it, ``b`` is fitted on the
        communication and ``a`` on the rest. With measured peak memory, a memory scale too.
        """
        predicted = self.plan.predicted
        imbalance = 1.0
        if summary.expert_load is not None and self.plan.config.ep > 1:
            imbalance = load_imbalance(placement=self._placement(), expert_load=summary.expert_load)
        self._cost_calibration, self._stretch_cache = None, {}
        if self.settings.fit_cost_model:
            self._cost_calibration = self._fit_cost_model(summary, imbalance)
            self._stretch_cache = {}  # the fit may have priced uncalibrated stretches
        stretch = self._stretch(self.plan, imbalance)
        comm = communication_s(predicted)
        rest = predicted.step_time_s - comm
        time_scale, comm_scale = summary.step_time_s / (predicted.step_time_s * stretch), None
        measured_comm = summary.communication_time_s
        if (
            measured_comm is not None
            and comm > 0
            and rest > 0
            and measured_comm < summary.step_time_s
        ):
            comm_scale = measured_comm / (comm * stretch)
            time_scale = (summary.step_time_s - measured_comm) / (rest * stretch)
        memory_scale = None
        if summary.peak_memory_bytes is not None and predicted.memory_per_device_bytes > 0:
            memory_scale = summary.peak_memory_bytes / predicted.memory_per_device_bytes
        return RetuneCalibration(
            method=(
                "cost_model.calibrate (matmul_efficiency) + residual scale"
                if self._cost_calibration is not None
                else "scale fit (retune)"
            ),
            time_scale=time_scale,
            communication_scale=comm_scale,
            memory_scale=memory_scale,
            expert_imbalance=max(1.0, imbalance),
        )

    def _stretch(self, plan: ShardingPlan, imbalance: float) -> float:
        """The cost model's step time for ``plan`` at expert imbalance ``imbalance`` — with the
        efficiencies ``cost_model.calibrate`` fitted on the last window when there are some — over
        the plan's own (balanced, uncalibrated) prediction.

        Priced by ``cost_model.estimate_table`` with ``EstimateOptions(routing_imbalance=r,
        calibration=...)``: the busiest rank's expert GEMMs and all-to-all messages (training and
        serving alike; serving plans keep their batch and serving settings).
        """
        imbalance = max(float(imbalance), 1.0)
        if imbalance == 1.0 and self._cost_calibration is None:
            return 1.0
        key = (plan.config, round(imbalance, 6))
        if key not in self._stretch_cache:
            self._prefetch_stretch([(plan, imbalance)])
        return self._stretch_cache[key]

    def _prefetch_stretch(self, pairs: list[tuple[ShardingPlan, float]]) -> None:
        """Fill the stretch cache for many (plan, imbalance) pairs: one table per imbalance."""
        groups: dict[float, list[ShardingPlan]] = {}
        for plan, imbalance in pairs:
            key = round(max(float(imbalance), 1.0), 6)
            if (key > 1.0 or self._cost_calibration is not None) and (
                plan.config,
                key,
            ) not in self._stretch_cache:
                groups.setdefault(key, []).append(plan)
        from cost_model import EstimateOptions

        for imbalance, plans in groups.items():
            options = EstimateOptions(
                routing_imbalance=imbalance, calibration=self._cost_calibration
            )
            for plan, seconds in zip(plans, self._step_times(plans, options)):
                self._stretch_cache[(plan.config, imbalance)] = (
                    float(seconds) / plan.predicted.step_time_s
                )

    def _step_times(self, plans: list[ShardingPlan], options) -> np.ndarray:  # EstimateOptions
        """The cost model's step time of each plan under ``options``, in one vectorized call."""
        from cost_model import ServingConfig, configs_to_table, estimate_table

        extras: dict[str, np.ndarray] = {}
        if isinstance(self.workload, Inference):
            rows = [
                ServingConfig(
                    **{
                        k: v
                        for k, v in plan.serving.model_dump().items()
                        if k in ServingConfig.model_fields
                    }
                ).columns(workload=self.workload)
                for plan in plans
            ]
            extras = {name: np.concatenate([row[name] for row in rows]) for name in rows[0]}
        table = configs_to_table([plan.config for plan in plans], **extras)
        columns = estimate_table(self.model, self.cluster, self.workload, table, options=options)
        return np.asarray(columns["step_time_s"], dtype=np.float64)

    def _fit_cost_model(
        self, summary: WindowSummary, imbalance: float
    ):  # cost_model.Calibration | None
        """``cost_model.calibrate`` on the window (training): the matmul efficiency that makes the
        cost model, at the measured imbalance, predict the measured step; ``None`` when it cannot."""
        if not isinstance(self.workload, Training):
            return None
        import cost_model

        def fit(measured_s: float, options: dict):
            row = cost_model.StepMeasurement(
                label=f"step {summary.step}",
                model=self.model,
                workload=self.workload,
                config=self.plan.config,
                measured_s=measured_s,
                options=options,
            )
            return cost_model.calibrate(
                cluster=self.cluster,
                measurements=[row],
                parameters=("matmul_efficiency",),
                initial=start,
                max_iterations=self.settings.calibration_iterations,
            ).calibration

        from cost_model import calibration_for

        start = calibration_for(self.cluster.device)  # the calibration the plan was priced with

        try:
            return fit(summary.step_time_s, {"routing_imbalance": max(imbalance, 1.0)})
        except InfeasiblePlanError:
            # The cost model's memory at this skew exceeds the device, yet the job runs: fit the
            # balanced step instead (the measured time over the uncalibrated skew stretch).
            try:
                return fit(summary.step_time_s / self._stretch(self.plan, imbalance), {})
            except (ValueError, ArithmeticError) as error:
                logger.info("retune: cost_model.calibrate failed (%s); scale fit only", error)
        except (ValueError, ArithmeticError) as error:
            logger.info("retune: cost_model.calibrate failed (%s); scale fit only", error)
        return None

    def _calibrated_time(
        self, plan: ShardingPlan, imbalance: float, calibration: RetuneCalibration
    ) -> float:
        """A plan's step time under the fitted model (see ``calibrate``) at expert imbalance ``imbalance``."""
        predicted = plan.predicted
        stretch = self._stretch(plan, imbalance)
        comm = communication_s(predicted)
        comm_scale = (
            calibration.time_scale
            if calibration.communication_scale is None
            else calibration.communication_scale
        )
        return stretch * (
            calibration.time_scale * (predicted.step_time_s - comm) + comm_scale * comm
        )

    # ------------------------------------------------------------------ candidates
    def _placement(self) -> ExpertPlacement:
        if self.plan.expert_placement is not None:
            return self.plan.expert_placement
        return contiguous_placement(
            num_experts=self.model.moe.num_routed_experts, ep=self.plan.config.ep
        )

    def _placement_candidates(
        self, load, calibration: RetuneCalibration, current: float
    ) -> list[RetuneCandidate]:
        """Re-placements from the measured load. ``num_redundant_experts`` unset: one with a replica
        slot per EP rank and one without replicas, and the model chooses (replicas balance better
        but cost memory and, in training, a gradient sync each step). Set: that many replicas, or
        none if they do not fit in memory."""
        if (
            "expert_placement" not in self.settings.allowed_changes
            or load is None
            or self.plan.config.ep == 1
        ):
            return []
        ep, explicit = self.plan.config.ep, self.settings.num_redundant_experts
        out = []
        for redundant in dict.fromkeys((ep if explicit is None else explicit, 0)):
            if out and explicit is not None:
                break  # an explicit replica count is only replaced by none when it does not fit
            predicted = self._with_replicas(redundant, calibration)
            if predicted is None:
                logger.info(
                    "retune: skip expert_placement with %d replicas: calibrated memory exceeds the device",
                    redundant,
                )
                continue
            ranks_per_node = self.settings.ranks_per_node or min(ep, self.cluster.devices_per_node)
            new = balanced_placement(
                expert_load=load,
                ep=ep,
                num_redundant_experts=redundant,
                ranks_per_node=ranks_per_node,
            )
            after = load_imbalance(placement=new, expert_load=load)
            step_time = self._calibrated_time(self.plan, after, calibration) + self._replica_sync_s(
                new, calibration
            )
            plan = self.plan.model_copy(update={"expert_placement": new, "predicted": predicted})
            detail = f"max/mean tokens per EP rank {calibration.expert_imbalance:.2f} -> {after:.2f}, {redundant} replicas"
            out.append(
                RetuneCandidate(
                    kind="expert_placement",
                    plan=plan,
                    step_time_s=step_time,
                    detail=detail,
                    change_cost_s=self._placement_change_cost(new),
                    gain_s_per_step=current - step_time,
                )
            )
        return out

    def _replica_sync_s(self, placement: ExpertPlacement, calibration: RetuneCalibration) -> float:
        """Training: per step, the gradients of replicated experts are summed over the EP group
        (one all-reduce of every replicated expert's gradient, as ``ExpertParallel`` does)."""
        replicated = sum(1 for ranks in placement.expert_to_ranks if len(set(ranks)) > 1)
        if not replicated or not isinstance(self.workload, Training):
            return 0.0
        from cost_model import dtype_bytes

        ep, config = placement.ep, self.plan.config
        layers = -(-self.model.num_moe_layers // config.pp)
        parameters = (
            replicated
            * layers
            * self.model.ffn_parameters(self.model.moe.expert_ffn_hidden_size)
            / config.etp
        )
        seconds = float(
            self.cluster.collective_time(
                "all_reduce",
                group_size=ep,
                ranks_per_node=min(ep, self.cluster.devices_per_node),
                message_bytes=parameters * dtype_bytes(self.workload.precision),
            )
        )
        scale = calibration.communication_scale or calibration.time_scale
        return scale * seconds

    def _with_replicas(
        self, redundant: int, calibration: RetuneCalibration
    ):  # CostBreakdown | None
        """The running plan's cost with ``redundant`` replica slots (training: their weights,
        gradients and optimizer states count in memory), or ``None`` if the calibrated memory no
        longer fits the device. Inference plans are returned unchanged (their serving settings
        price replicas at planning time)."""
        predicted = self.plan.predicted
        if redundant and isinstance(self.workload, Training):
            from cost_model import breakdown_from_row, configs_to_table, estimate_table

            table = configs_to_table([self.plan.config], num_redundant_experts=[redundant])
            predicted = breakdown_from_row(
                estimate_table(self.model, self.cluster, self.workload, table), 0
            )
        scale = max(calibration.memory_scale or 1.0, 1.0)
        return (
            predicted
            if predicted.memory_per_device_bytes * scale <= predicted.memory_capacity_bytes
            else None
        )

    def _placement_change_cost(self, new: ExpertPlacement) -> float:
        """Seconds to move expert weights (and, training, their optimizer state): the busiest
        receiver's bytes over one point-to-point link (``Cluster.collective_time``)."""
        moves = placement_moves(old=self._placement(), new=new)
        if not moves:
            return 0.0
        received = np.bincount([m.target_rank for m in moves], minlength=new.ep).max()
        expert_parameters = (
            self.model.ffn_parameters(self.model.moe.expert_ffn_hidden_size) / self.plan.config.etp
        )
        moe_layers_per_stage = -(-self.model.num_moe_layers // self.plan.config.pp)
        bytes_per_parameter = self._state_bytes_per_parameter()
        message = float(received * expert_parameters * moe_layers_per_stage * bytes_per_parameter)
        ranks_per_node = min(new.ep, self.cluster.devices_per_node)
        return float(
            self.cluster.collective_time(
                "send_recv",
                group_size=2,
                ranks_per_node=min(2, ranks_per_node),
                message_bytes=message,
            )
        )

    def _state_bytes_per_parameter(self) -> float:
        """Bytes that move with one expert parameter: its weight and, in training, its optimizer
        state, in the proportion the cost model priced them on this plan's devices."""
        from cost_model import dtype_bytes

        weight_dtype = (
            self.workload.part_weight_dtype("routed_experts")
            if isinstance(self.workload, Inference)
            else self.workload.precision
        )
        memory = self.plan.predicted.memory_bytes
        weights = memory.get("weights", 0.0)
        if isinstance(self.workload, Inference) or weights <= 0:
            return dtype_bytes(weight_dtype)
        return dtype_bytes(weight_dtype) * (weights + memory.get("optimizer_states", 0.0)) / weights

    def _search_candidates(
        self, calibration: RetuneCalibration, current: float, load
    ) -> list[RetuneCandidate]:
        kinds = set(self.settings.allowed_changes) - {"expert_placement"}
        if not kinds:
            return []
        plans = self._live_variants() if kinds & {"micro_batch", "batch_size"} else []
        if "reshard" in kinds:
            plans += self._research()
        out, seen = [], set()
        for plan in plans:
            kind = change_kind(self.plan, plan, self.workload)
            key = (plan.config, plan.serving)
            if kind == "keep" or kind not in kinds or plan.predicted is None or key in seen:
                continue
            seen.add(key)
            if kind == "reshard" and max(plan.config.etp, self.plan.config.etp) > 1:
                logger.info(
                    "retune: skip reshard %s: checkpoint resharding needs etp 1",
                    describe_plan(plan),
                )
                continue
            if kind != "reshard":  # a live change keeps the running expert placement
                plan = plan.model_copy(update={"expert_placement": self.plan.expert_placement})
            if not self._fits(plan, calibration):
                logger.info(
                    "retune: skip %s %s: calibrated memory exceeds the device",
                    kind,
                    describe_plan(plan),
                )
                continue
            out.append((kind, plan, self._imbalance_under(plan, load)))
        self._prefetch_stretch([(plan, imbalance) for _, plan, imbalance in out])
        candidates = []
        for kind, plan, imbalance in out:
            step_time = self._calibrated_time(plan, imbalance, calibration) * self._work_ratio(plan)
            candidates.append(
                RetuneCandidate(
                    kind=kind,
                    plan=plan,
                    step_time_s=step_time,
                    gain_s_per_step=current - step_time,
                    change_cost_s=self._change_cost(kind, current),
                    detail=describe_plan(plan),
                )
            )
        return candidates

    def _imbalance_under(self, plan: ShardingPlan, load) -> float:
        """Measured load's max/mean per EP rank under ``plan``: its placement when it keeps the
        running EP degree, else the contiguous default of its degree."""
        if load is None or plan.config.ep == 1:
            return 1.0
        same = plan.config.ep == self.plan.config.ep and plan.expert_placement is not None
        placement = (
            plan.expert_placement
            if same
            else contiguous_placement(
                num_experts=self.model.moe.num_routed_experts, ep=plan.config.ep
            )
        )
        return load_imbalance(placement=placement, expert_load=load)

    def _live_variants(self) -> list[ShardingPlan]:
        from autoparallel.retune._replan import live_variant_plans

        self.prepare()  # the world does not change while a Retuner lives: enumerate once
        return live_variant_plans(
            plan=self.plan,
            model=self.model,
            cluster=self.cluster,
            workload=self.workload,
            space=self._space,
        )

    def _work_ratio(self, plan: ShardingPlan) -> float:
        """Inference: a decode step of ``plan`` serves its own batch; scale its time to the
        running batch, so candidates are compared on the same work (seconds per token)."""
        if not isinstance(self.workload, Inference):
            return 1.0
        return plan_batch_size(self.plan) / plan_batch_size(plan)

    def _fits(self, plan: ShardingPlan, calibration: RetuneCalibration) -> bool:
        scale = calibration.memory_scale or 1.0
        return (
            plan.predicted.memory_per_device_bytes * max(scale, 1.0)
            <= plan.predicted.memory_capacity_bytes
        )

    def _change_cost(self, kind: ChangeKind, current: float) -> float:
        if kind in ("micro_batch", "batch_size"):
            return self.settings.live_change_overhead_steps * current
        memory = self.plan.predicted.memory_bytes
        state = sum(memory.get(k, 0.0) for k in ("weights", "optimizer_states"))
        return (
            2.0 * state / self.settings.checkpoint_bandwidth_bytes_per_s
            + self.settings.restart_overhead_s
        )

    def _research(self) -> list[ShardingPlan]:
        """Plans from a search warm-started with the current plan (its config is the first trial)."""
        if self._search is not None:
            return list(self._search(self.plan))
        from autoparallel.retune._replan import research_plans

        return research_plans(
            plan=self.plan,
            model=self.model,
            cluster=self.cluster,
            workload=self.workload,
            n_trials=self.settings.search_trials,
            seed=self.settings.seed,
            bounds=self._bounds(),
            estimator=self._calibrated_estimator(),
        )

    def _calibrated_estimator(self):  # search Estimator | None
        """``cost_model.estimate_table`` with the last window's fitted calibration, for the re-search."""
        if self._cost_calibration is None:
            return None
        from cost_model import EstimateOptions, estimate_table

        options = EstimateOptions(calibration=self._cost_calibration)
        return lambda model, cluster, workload, table: estimate_table(
            model, cluster, workload, table, options=options
        )

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
