"""``ShardingPlan``: the exported, versioned JSON document. Data only; ``apply_plan`` interprets it.

The plan round-trips through JSON exactly (``ShardingPlan.model_validate_json(plan.to_json())
== plan``), is frozen and hashable, and rejects unknown keys and newer schema versions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from cost_model import CostBreakdown, ParallelConfig

SCHEMA_VERSION = 1

_STRICT = ConfigDict(extra="forbid", frozen=True)

ModuleStyle = Literal["colwise", "rowwise", "sequence", "replicate", "expert"]


class Provenance(BaseModel):
    """Where the plan came from: library version, model/cluster fingerprints, job, search settings."""

    model_config = _STRICT

    library_version: str
    model_name: str
    model_fingerprint: str
    cluster_name: str
    cluster_fingerprint: str
    workload: dict[str, Any]
    search: dict[str, Any] = Field(default_factory=dict)
    created_at: str = ""


class MeshAxis(BaseModel):
    model_config = _STRICT

    name: str
    size: int = Field(gt=0)


class StageLayers(BaseModel):
    """Pipeline chunk ``chunk`` (= stage for 1 virtual stage) holds layers ``[start_layer, stop_layer)``.

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
    """Inference settings a plan was priced with (absent for training plans)."""

    model_config = _STRICT

    batch_size: int = Field(gt=0, description="sequences in flight per attention replica")
    kv_dtype: str = "bf16"
    num_redundant_experts: int = Field(default=0, ge=0)
    two_batch_overlap: bool = False


class Alternative(BaseModel):
    model_config = _STRICT

    config: ParallelConfig
    predicted: CostBreakdown
    reason_lost: str = ""
    serving: ServingSettings | None = None


class PhasePlan(BaseModel):
    """One device pool of a disaggregated inference plan (prefill or decode)."""

    model_config = _STRICT

    phase: Literal["prefill", "decode"]
    num_devices: int = Field(gt=0)
    config: ParallelConfig
    predicted: CostBreakdown | None = None


class ShardingPlan(BaseModel):
    """How to split one model on one cluster for one workload."""

    model_config = _STRICT

    schema_version: int = SCHEMA_VERSION
    provenance: Provenance
    world_size: int = Field(gt=0)
    config: ParallelConfig
    mesh_axes: tuple[MeshAxis, ...] = Field(description="dense mesh, outermost first: pp, dp, cp, tp")
    moe_mesh_axes: tuple[MeshAxis, ...] = Field(default=(), description="MoE view: pp, edp, ep, etp")
    rank_to_device: tuple[int, ...]
    stages: tuple[StageLayers, ...]
    expert_placement: ExpertPlacement | None = None
    module_rules: tuple[ModuleRule, ...] = ()
    predicted: CostBreakdown | None = None
    alternatives: tuple[Alternative, ...] = ()
    disaggregation: tuple[PhasePlan, ...] = ()
    serving: ServingSettings | None = None

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, value: int) -> int:
        if value > SCHEMA_VERSION:
            raise ValueError(
                f"schema_version ({value}) is newer than this library supports ({SCHEMA_VERSION}); "
                "upgrade moe-autoparallel to read this plan"
            )
        return value

    def __hash__(self) -> int:
        return hash(self.to_json())

    def to_json(self, *, indent: int | None = 2) -> str:
        return self.model_dump_json(indent=indent)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.to_json() + "\n")
        return path


def load_plan(path_or_text: str | Path | dict[str, Any]) -> ShardingPlan:
    """Load and validate a plan from a path, a JSON string or a dict.

    Raises ``ValueError`` (pydantic ``ValidationError``) naming unknown keys, bad values or a
    newer ``schema_version``.
    """
    if isinstance(path_or_text, dict):
        data = path_or_text
    else:
        text = str(path_or_text)
        if not text.lstrip().startswith("{"):
            text = Path(path_or_text).read_text()
        data = json.loads(text)
    version = data.get("schema_version", SCHEMA_VERSION) if isinstance(data, dict) else SCHEMA_VERSION
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise ValueError(
            f"schema_version ({version}) is newer than this library supports ({SCHEMA_VERSION}); "
            "upgrade moe-autoparallel to read this plan"
        )
    try:
        return ShardingPlan.model_validate(data)
    except ValidationError as error:
        unknown = [e for e in error.errors() if e["type"] == "extra_forbidden"]
        if not unknown:
            raise
        raise ValueError(_unknown_key_message(unknown[0]["loc"])) from None


def _unknown_key_message(location: tuple) -> str:
    """"unknown key 'x' at provenance; valid keys: ..." for the first unknown key of a plan."""
    model: Any = ShardingPlan
    for part in location[:-1]:
        if isinstance(part, int) or model is None:
            continue
        annotation = model.model_fields[part].annotation if part in getattr(model, "model_fields", {}) else None
        model = _model_in(annotation)
    where = ".".join(str(p) for p in location[:-1]) or "the top level"
    valid = sorted(model.model_fields) if model is not None else []
    return f"unknown key {location[-1]!r} at {where} of the plan; valid keys there: {', '.join(valid)}"


def _model_in(annotation: Any) -> Any:
    """The pydantic model inside ``X``, ``X | None`` or ``tuple[X, ...]``, else None."""
    from typing import get_args

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in get_args(annotation):
        found = _model_in(argument)
        if found is not None:
            return found
    return None
