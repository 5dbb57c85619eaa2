"""The JSON Schema of ``ShardingPlan``, shipped as ``sharding_plan.schema.json``.

The file is generated from the pydantic model (``plan_json_schema``) and kept in the package so
that tools in any language can validate a plan; a test checks it matches the model. Regenerate it
with ``python -m autoparallel.schema`` (``--stdout`` prints it instead) after changing ``autoparallel/plan/``.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "SCHEMA_FILE",
    "load_schema",
    "plan_json_schema",
    "schema_text",
    "validate_plan_document",
    "write_schema",
]

SCHEMA_FILE = "sharding_plan.schema.json"


def plan_json_schema() -> dict[str, Any]:
    """The schema generated from ``ShardingPlan`` (unknown keys rejected, version bounded)."""
    from autoparallel.plan import SCHEMA_VERSION, ShardingPlan

    schema = ShardingPlan.model_json_schema(mode="validation")
    # a version-1 document is upgraded by ``load_plan``; this schema describes version 2 only
    schema["properties"]["schema_version"].update(minimum=SCHEMA_VERSION, maximum=SCHEMA_VERSION)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://moe-autoparallel/schema/sharding_plan/v{SCHEMA_VERSION}.json",
        **schema,
    }


def load_schema() -> dict[str, Any]:
    """The shipped schema file."""
    return json.loads((resources.files("autoparallel.schema") / SCHEMA_FILE).read_text())


def schema_text() -> str:
    """The schema as the shipped file holds it."""
    return json.dumps(plan_json_schema(), indent=2, sort_keys=True) + "\n"


def write_schema(path: str | Path | None = None) -> Path:
    target = Path(path) if path is not None else Path(__file__).with_name(SCHEMA_FILE)
    target.write_text(schema_text())
    return target


def validate_plan_document(document: dict[str, Any]) -> None:
    """Validate a plan dict against the shipped schema with ``jsonschema`` (a test extra).

    Raises ``ValueError`` naming the failing path and rule.
    """
    try:
        import jsonschema
    except ImportError as error:  # pragma: no cover - jsonschema ships with the test extra
        raise ValueError(
            "validating against the JSON Schema needs jsonschema: pip install 'moe-autoparallel[test]'"
        ) from error
    validator = jsonschema.Draft202012Validator(load_schema())
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.path) or "(root)"
        raise ValueError(f"plan does not match the schema at {where}: {first.message}")
