"""``ShardingPlan`` schema version 2: the exported, versioned JSON document. Data only;
``apply_plan`` and the exporters interpret it.

Every fact a consumer needs is a typed field: the model (``ModelSpec``), the job (``Training`` or
``Inference``), devices per node, the serving settings, the software settings it was priced
with (``EstimateOptions``: a training recipe's EP overlap, CUDA graphs, recompute modules),
the deployment (colocated, or disaggregated prefill and decode pools, each with its own layout,
serving settings and price) and the provenance of the search. The whole plan is checked on construction
(``autoparallel.plan._validate``): an inconsistent plan cannot be built or loaded.

The plan round-trips through JSON exactly (``ShardingPlan.model_validate_json(plan.to_json())
== plan``), is frozen and hashable, and rejects unknown keys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cost_model import (
    CostBreakdown,
    Dtype,
    EstimateOptions,
    Layout,
    ModelSpec,
    ParallelConfig,
    ServingConfig,
    Workload,
)

__all__ = [
    "SCHEMA_VERSION",
    "Alternative",
    "Deployment",
    "ExpertPlacement",
    "MeshAxis",
    "ModuleRule",
    "ModuleStyle",
    "Pool",
    "Provenance",
    "SearchRecord",
    "ServingSettings",
    "ShardingPlan",
    "StageLayers",
]

SCHEMA_VERSION = 2

_STRICT = ConfigDict(extra="forbid", frozen=True)

ModuleStyle = Literal["colwise", "rowwise", "sequence", "replicate", "expert"]


class SearchRecord(BaseModel):
    """How the search that chose the plan ran (absent for a plan built for a given layout)."""

    model_config = _STRICT

    method: str
    objective: tuple[str, ...]
    space_size: int = Field(ge=0)
    num_meshes: int = Field(ge=0)
    num_trials: int = Field(ge=0)
    rows_evaluated: int = Field(ge=0)
    infeasible_trials: dict[str, int] = Field(default_factory=dict)
    infeasible_layouts: dict[str, int] = Field(default_factory=dict)
    elapsed_s: float = Field(ge=0)
    study_name: str = ""
    storage: str | None = None
    seed: int | None = None
    batch_size: int | None = Field(default=None, description="layouts priced per trial")
    polish_fraction: float | None = None
    idle_reason: str = Field(default="", description="why some devices of the cluster stay idle")


class Provenance(BaseModel):
    """Where the plan came from: library version, model and cluster fingerprints, the search."""

    model_config = _STRICT

    library_version: str
    model_name: str
    model_fingerprint: str
    cluster_name: str
    cluster_fingerprint: str
    created_at: str = ""
    search: SearchRecord | None = None


class MeshAxis(BaseModel):
    model_config = _STRICT

    name: str
    size: int = Field(gt=0)


class StageLayers(BaseModel):
    """Pipeline chunk ``chunk`` (= stage for 1 virtual stage) holds layers
    ``[start_layer, stop_layer)``.

    With interleaving, rank ``stage`` holds chunks ``stage, stage + pp, stage + 2 pp, ...``.
    """

    model_config = _STRICT

    chunk: int = Field(ge=0)
    stage: int = Field(ge=0)
    start_layer: int = Field(ge=0)
    stop_layer: int = Field(gt=0)
    has_embedding: bool = False
    has_lm_head: bool = False


class ExpertPlacement(BaseModel):
    """Expert -> EP ranks holding a replica (hot experts may be replicated, EPLB-style).

    ``expert_to_ranks[e]`` lists the ep-axis indices holding expert ``e``; every EP rank holds
    ``slots_per_rank`` experts (routed experts + redundant replicas) / ep.
    """

    model_config = _STRICT

    num_experts: int = Field(gt=0)
    ep: int = Field(gt=0)
    expert_to_ranks: tuple[tuple[int, ...], ...]
    num_redundant_experts: int = Field(default=0, ge=0)

    @property
    def slots_per_rank(self) -> int:
        return (self.num_experts + self.num_redundant_experts) // self.ep


class ModuleRule(BaseModel):
    """Modules whose fully-qualified name matches ``pattern`` (``fnmatch`` syntax) get ``style``."""

    model_config = _STRICT

    pattern: str
    style: ModuleStyle
    mesh_axis: str = "tp"


class ServingSettings(BaseModel):
    """Inference settings a layout was priced with, as resolved for a deployment (absent for
    training). Attention data parallelism is the layout's ``config.attention_data_parallel``."""

    model_config = _STRICT

    batch_size: int = Field(gt=0, description="sequences in flight per attention replica")
    kv_dtype: Dtype = "bf16"
    num_redundant_experts: int = Field(default=0, ge=0)
    two_batch_overlap: bool = False
    all_to_all_backend: str = Field(
        default="auto",
        description="expert all-to-all kernels ('auto': the engine's default)",
    )

    def serving_config(
        self, *, phase: Literal["both", "prefill", "decode"] = "both"
    ) -> ServingConfig:
        """The ``cost_model.ServingConfig`` that prices these settings."""
        return ServingConfig.model_validate(
            {
                "batch_size": self.batch_size,
                "num_redundant_experts": self.num_redundant_experts,
                "kv_dtype": self.kv_dtype,
                "phase": phase,
                "two_batch_overlap": self.two_batch_overlap,
                "a2a_backend": self.all_to_all_backend,  # a str in the plan, checked here
            }
        )


class Alternative(BaseModel):
    model_config = _STRICT

    config: ParallelConfig
    predicted: CostBreakdown
    reason_lost: str = ""
    serving: ServingSettings | None = None


class Pool(BaseModel):
    """One device pool of a deployment: ``num_units`` identical units of ``devices_per_unit``
    devices, each running ``config`` with ``serving``; ``role`` is the phase it serves."""

    model_config = _STRICT

    role: Literal["prefill", "decode", "both"]
    num_units: int = Field(gt=0)
    devices_per_unit: int = Field(gt=0)
    config: ParallelConfig
    serving: ServingSettings
    predicted: CostBreakdown | None = None

    @property
    def num_devices(self) -> int:
        return self.num_units * self.devices_per_unit

    @property
    def layout(self) -> Layout:
        """The ``Layout`` one unit of this pool was priced with, for its phase."""
        return Layout(config=self.config, serving=self.serving.serving_config(phase=self.role))


class Deployment(BaseModel):
    """Colocated (the plan's own layout on every device) or disaggregated (the prefill and decode
    ``pools``). ``pools`` also holds a disaggregated split that was priced but lost; the output
    tokens/s per device of both deployments, when both were priced, say which won."""

    model_config = _STRICT

    kind: Literal["colocated", "disaggregated"] = "colocated"
    pools: tuple[Pool, ...] = ()
    colocated_output_tokens_per_s_per_device: float | None = None
    disaggregated_output_tokens_per_s_per_device: float | None = None
    bottleneck: Literal["prefill", "decode"] | None = Field(
        default=None, description="the pool that binds the split"
    )
    ttft_s: float | None = Field(
        default=None,
        ge=0,
        description="the disaggregated deployment's mean first-token time: overhead, prefill "
        "queue and pass, KV transfer, decode admission",
    )
    ttft_p90_s: float | None = Field(
        default=None, ge=0, description="its p90, the figure the TTFT SLO bounds"
    )
    tpot_s: float | None = Field(
        default=None, ge=0, description="the disaggregated deployment's decode step"
    )
    simulated_requests_per_s: float | None = Field(
        default=None,
        ge=0,
        description="the request rate the serving simulator ran the pools at: the split's own "
        "(or the offered one), or the largest share of it whose simulated p90 TTFT and TPOT "
        "meet the SLOs",
    )
    simulated_ttft_p90_s: float | None = Field(
        default=None, ge=0, description="the simulated p90 first-token time at that rate"
    )
    simulated_tpot_p90_s: float | None = Field(
        default=None, ge=0, description="the simulated p90 TPOT at that rate"
    )
    simulated_output_tokens_per_s_per_device: float | None = Field(
        default=None, ge=0, description="output tokens/s per device at that rate"
    )
    note: str = Field(default="", description="why no disaggregated split was priced")


class ShardingPlan(BaseModel):
    """How to split one model on one cluster for one job. Built by ``build_plan``."""

    model_config = _STRICT

    schema_version: int = SCHEMA_VERSION
    provenance: Provenance
    model: ModelSpec
    job: Workload
    world_size: int = Field(gt=0)
    devices_per_node: int = Field(gt=0)
    devices_per_host: int | None = Field(
        default=None,
        gt=0,
        description="devices one host drives (one torchrun node) where a node's fabric spans "
        "several hosts (a GB200 NVL72 rack: 4); None: the node is one host",
    )
    config: ParallelConfig
    serving: ServingSettings | None = None
    mesh_axes: tuple[MeshAxis, ...] = Field(
        description="dense mesh, outermost first: pp, dp, cp, tp"
    )
    moe_mesh_axes: tuple[MeshAxis, ...] = Field(
        default=(), description="MoE view: pp, edp, ep, etp"
    )
    rank_to_device: tuple[int, ...]
    stages: tuple[StageLayers, ...]
    expert_placement: ExpertPlacement | None = None
    module_rules: tuple[ModuleRule, ...] = ()
    predicted: CostBreakdown | None = None
    estimate_options: EstimateOptions | None = Field(
        default=None,
        description="how the software runs where not the cost model's defaults (a training "
        "recipe's EP overlap, CUDA graphs, recompute modules, offloading, ...): the settings "
        "the plan and its alternatives were priced with and the exporters write; no calibration",
    )
    alternatives: tuple[Alternative, ...] = ()
    deployment: Deployment = Deployment()

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, value: int) -> int:
        from autoparallel.plan._validate import check_schema_version

        check_schema_version(value, upgraded=True)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ShardingPlan:
        from autoparallel.plan._validate import check_plan

        check_plan(self)
        return self

    def __hash__(self) -> int:
        return hash(self.to_json())

    @property
    def layout(self) -> Layout:
        """The ``Layout`` the plan was priced with (its config and serving settings)."""
        serving = None if self.serving is None else self.serving.serving_config()
        return Layout(config=self.config, serving=serving)

    @property
    def host_devices(self) -> int:
        """Devices one launched host runs: ``devices_per_host``, else a whole node."""
        return self.devices_per_host or self.devices_per_node

    @property
    def disaggregated(self) -> bool:
        """Whether the plan serves with its prefill and decode pools."""
        return self.deployment.kind == "disaggregated"

    def to_json(self, *, indent: int | None = 2) -> str:
        return self.model_dump_json(indent=indent)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.to_json() + "\n")
        return path
