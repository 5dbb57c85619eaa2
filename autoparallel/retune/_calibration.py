"""How RetunePolicy calibrates the cost model on a window of measured steps.

Training: cost_model.calibrate refits the device's matmul efficiency so that the cost model,
at the measured expert imbalance, predicts the measured step; what one parameter cannot explain
is left to a scale fit (the whole fit for inference). The plan's prediction assumes balanced
experts; the measured max/mean tokens per EP rank ``r`` stretches the step by ``s(r)``
(expert GEMMs and the EP all-to-all wait for the busiest rank), priced by
``cost_model.estimate_table`` with ``EstimateOptions(routing_imbalance=r, calibration=...)``:
``t = s(r) * (a * t_rest + b * t_comm)`` with ``t_comm`` the predicted exposed communication.

``_PolicyCalibration`` is a base of ``RetunePolicy`` (its methods read the policy's plan,
model, cluster, workload and settings); it is not used on its own. Torch-free.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from autoparallel._expert_placement import contiguous_placement, load_imbalance
from autoparallel.plan import ExpertPlacement, ShardingPlan
from autoparallel.retune._types import (
    RetuneCalibration,
    RetuneSettings,
    WindowSummary,
    communication_s,
)
from cost_model import InfeasiblePlanError, Inference, ModelSpec, Training

logger = logging.getLogger("autoparallel.retune")


class _PolicyCalibration:
    """The calibration half of ``RetunePolicy``: fit a window, price plans under the fit."""

    plan: ShardingPlan
    model: ModelSpec
    cluster: Any  # topology.Cluster
    workload: Training | Inference
    settings: RetuneSettings
    _stretch_cache: dict
    _cost_calibration: Any  # cost_model.Calibration | None

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
            # the measured load holds the traffic's skew: no default skew on top of it
            options = EstimateOptions(
                routing_imbalance=imbalance,
                expert_load_skew=0.0,
                calibration=self._cost_calibration,
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
            measured = {"routing_imbalance": max(imbalance, 1.0), "expert_load_skew": 0.0}
            return fit(summary.step_time_s, measured)
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

    def _placement(self) -> ExpertPlacement:
        if self.plan.expert_placement is not None:
            return self.plan.expert_placement
        return contiguous_placement(
            num_experts=self.model.moe.num_routed_experts, ep=self.plan.config.ep
        )
