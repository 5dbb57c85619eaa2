"""The settings of a study and the problem its trials price.

``SearchSettings`` holds the study's knobs beyond the sampler, storage and seed. ``_Problem``
holds the space and what prices it: each trial samples one *level* (index into the sorted legal
values) per mesh axis, mapped to the nearest legal mesh (L1 distance in levels, ``suggest``), so
every trial prices a legal layout; a batch of meshes is priced with one call of the vectorized
cost model (``price``: the best row of each mesh, its local Pareto rows and row-level
infeasibility counts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from search._candidate import best_row, candidate_at, pareto_rows
from search._objective import Estimator, Objective, evaluate
from search._space import MESH_AXES, SearchBounds, SearchSpace

if TYPE_CHECKING:  # optuna is imported on first use (search._lazy); the checker sees the module
    import optuna


class SearchSettings(BaseModel):
    """Knobs of the study beyond the sampler, storage and seed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_size: int = Field(default=16, gt=0, description="trials asked and priced together")
    top_k: int = Field(default=5, gt=0, description="alternatives kept in the result")
    polish_fraction: float = Field(
        default=0.4, ge=0, le=1, description="share of the budget spent around the best mesh"
    )
    brute_force_limit: int | None = Field(
        default=None, description="meshes; default: the trial budget"
    )
    brute_force_layouts: int = Field(
        default=20_000,
        ge=0,
        description="also brute-force a space of at most this many layouts (cheaper than a study)",
    )
    bounds: SearchBounds = SearchBounds()
    study_name: str | None = None
    heartbeat_interval_s: int | None = Field(
        default=5,
        gt=0,
        description="RDB storages: seconds between heartbeats of in-flight trials (None: off)",
    )
    grace_period_s: int | None = Field(
        default=20,
        gt=0,
        description="a trial without a heartbeat for this long is failed and retried",
    )
    idle_devices: Literal["never", "when_needed", "compare"] = Field(
        default="when_needed",
        description="plan on fewer whole nodes when no layout uses them all (when_needed), or also "
        "search the largest smaller legal node count and keep the faster plan (compare)",
    )
    coordinates: Literal["mesh", "folded"] = Field(
        default="folded",
        description="sample ep (mesh) or the expert-data-parallel degree edp (folded; fewer stuck seeds on ref-3t-moe)",
    )

    @model_validator(mode="after")
    def _grace_after_heartbeat(self) -> SearchSettings:
        interval, grace = self.heartbeat_interval_s, self.grace_period_s
        if interval is not None and grace is not None and grace <= interval:
            raise ValueError(
                f"grace_period_s ({grace}) must be > heartbeat_interval_s ({interval}): a live trial would be failed"
            )
        return self


class _Problem:
    """The space plus what is needed to price it; caches priced meshes."""

    def __init__(
        self,
        *,
        model,
        cluster,
        workload,
        objective: Objective,
        estimator: Estimator,
        bounds: SearchBounds,
        coordinates: str = "mesh",
    ):
        self.model, self.cluster, self.workload, self.objective = (
            model,
            cluster,
            workload,
            objective,
        )
        self.coordinates = coordinates
        self.estimator = estimator
        self.space = SearchSpace(
            model=model,
            workload=workload,
            world_size=cluster.num_devices,
            devices_per_node=cluster.devices_per_node,
            bounds=bounds,
        )
        self.axes = [
            a
            for a in (*MESH_AXES, "attention_data_parallel")
            if len(self.space.axis_choices[a]) > 1
        ]
        self.levels = (
            np.stack(
                [
                    np.searchsorted(self.space.axis_choices[a], self.space.mesh[a])
                    for a in self.axes
                ],
                axis=1,
            )
            if self.axes
            else np.zeros((self.space.num_meshes, 0), dtype=np.int64)
        )
        self.enqueued: set[int] = set()
        self.folded_levels = self._folded_levels()

    def _folded_levels(self) -> np.ndarray:
        """Levels in the *folded* coordinates: ep replaced by edp = dp*cp*tp / (ep*etp).

        Expert memory per device depends on edp*etp, so moves that keep edp (pp down, ep up
        together) are single steps here; the polish walks both coordinate systems."""
        mesh = self.space.mesh
        edp = mesh["dp"] * mesh["cp"] * mesh["tp"] // (mesh["ep"] * mesh["etp"])
        columns = [
            np.searchsorted(np.unique(edp), edp) if a == "ep" else self.levels[:, i]
            for i, a in enumerate(self.axes)
        ]
        return np.stack(columns, axis=1) if columns else self.levels

    @property
    def sampled_levels(self) -> np.ndarray:
        """The coordinates the sampler works in (``SearchSettings.coordinates``)."""
        return self.folded_levels if self.coordinates == "folded" else self.levels

    def _param_names(self) -> list[str]:
        rename = {"ep": "edp"} if self.coordinates == "folded" else {}
        return [f"{rename.get(a, a)}_level" for a in self.axes]

    def suggest(self, trial: optuna.Trial) -> int:
        """Mesh index for the trial's sampled levels (nearest legal mesh)."""
        if not self.axes:
            return 0
        levels = self.sampled_levels
        wanted = np.array(
            [
                trial.suggest_int(name, 0, int(levels[:, i].max()))
                for i, name in enumerate(self._param_names())
            ]
        )
        return int(np.argmin(np.abs(levels - wanted).sum(axis=1)))

    def level_params(self, mesh_index: int) -> dict[str, int]:
        return {
            name: int(v) for name, v in zip(self._param_names(), self.sampled_levels[mesh_index])
        }

    def price(self, mesh_indices: list[int]) -> dict[int, dict[str, Any]]:
        """Best row (and local Pareto rows) of each mesh, with row-level infeasibility counts."""
        table = self.space.expand(sorted(set(mesh_indices)))
        evaluation = evaluate(
            model=self.model,
            cluster=self.cluster,
            workload=self.workload,
            table=table,
            estimator=self.estimator,
        )
        out = {}
        for mesh in np.unique(table["mesh_index"]):
            rows = np.flatnonzero(table["mesh_index"] == mesh)
            counts = {name: int((v[rows] > 0).sum()) for name, v in evaluation.violations.items()}
            best = candidate_at(evaluation, best_row(evaluation, self.objective, rows))
            front = (
                [
                    candidate_at(evaluation, r).to_attrs()
                    for r in pareto_rows(evaluation, self.objective, rows)
                ]
                if self.objective.is_multi
                else []
            )
            out[int(mesh)] = {
                "best": best,
                "front": front,
                "rows": len(rows),
                "infeasible_rows": counts,
            }
        return out
