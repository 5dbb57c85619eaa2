"""The plan: ``ShardingPlan`` (schema version 2), its one constructor ``build_plan``, and
``load_plan``, which upgrades version-1 documents and validates the whole plan.

A plan is data; ``apply_plan`` and the exporters interpret it. Every rule a plan must keep is
checked when it is built or loaded, and a broken rule is one ``PlanError`` naming the field, its
value and the rule.
"""

from autoparallel.plan._build import PlanRecord, build_plan
from autoparallel.plan._load import load_plan
from autoparallel.plan._schema import (
    SCHEMA_VERSION,
    Alternative,
    Deployment,
    ExpertPlacement,
    MeshAxis,
    ModuleRule,
    ModuleStyle,
    Pool,
    Provenance,
    SearchRecord,
    ServingSettings,
    ShardingPlan,
    StageLayers,
)
from autoparallel.plan._validate import PlanError

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
