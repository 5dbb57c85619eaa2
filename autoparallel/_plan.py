"""Former home of the plan schema, kept so that ``from autoparallel._plan import ...`` keeps
working; the plan lives in ``autoparallel.plan``."""

from autoparallel.plan import (
    SCHEMA_VERSION,
    Alternative,
    Deployment,
    ExpertPlacement,
    MeshAxis,
    ModuleRule,
    ModuleStyle,
    PlanError,
    PlanRecord,
    Pool,
    Provenance,
    SearchRecord,
    ServingSettings,
    ShardingPlan,
    StageLayers,
    build_plan,
    load_plan,
)

__all__ = [
    "SCHEMA_VERSION",
    "Alternative",
    "Deployment",
    "ExpertPlacement",
    "MeshAxis",
    "ModuleRule",
    "ModuleStyle",
    "PlanError",
    "PlanRecord",
    "Pool",
    "Provenance",
    "SearchRecord",
    "ServingSettings",
    "ShardingPlan",
    "StageLayers",
    "build_plan",
    "load_plan",
]
