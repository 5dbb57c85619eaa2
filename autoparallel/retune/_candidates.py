"""The changes ``RetunePolicy`` prices: expert re-placements from the measured load, live
micro-batch or batch-size variants, and resharded plans from a warm-started re-search.

Each candidate's step time is the calibrated model's (``_PolicyCalibration._calibrated_time``)
at the expert imbalance it would run with; its change cost is the time to move expert weights
(and, training, their optimizer state) over one point-to-point link, a few steps for a live
change, or a checkpoint round trip plus restart for a reshard. Replicated experts add, per
training step, one all-reduce of their gradients over the EP group (as ``ExpertParallel``
does). A candidate that does not fit the device's memory under the calibrated memory scale is
skipped and logged.

``_PolicyCandidates`` is a base of ``RetunePolicy``; it is not used on its own. Torch-free.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from autoparallel._expert_placement import (
    balanced_placement,
    contiguous_placement,
    load_imbalance,
    placement_moves,
)
from autoparallel.plan import ExpertPlacement, ShardingPlan
from autoparallel.retune._calibration import _PolicyCalibration
from autoparallel.retune._types import (
    ChangeKind,
    RetuneCalibration,
    RetuneCandidate,
    change_kind,
    describe_plan,
    plan_batch_size,
)
from cost_model import Inference, Training

logger = logging.getLogger("autoparallel.retune")


class _PolicyCandidates(_PolicyCalibration):
    """The candidate half of ``RetunePolicy``: the plans it could switch to, priced."""

    _search: Callable[[ShardingPlan], list[ShardingPlan]] | None
    _space: Any  # search.SearchSpace | None

    def _bounds(self):  # search.SearchBounds
        from search import SearchBounds

        return SearchBounds(max_cp_degree=self.settings.max_cp_degree)

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
