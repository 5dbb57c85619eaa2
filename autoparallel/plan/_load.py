"""``load_plan``: read, upgrade and validate a plan; every problem one ``PlanError`` line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from autoparallel.plan._schema import ShardingPlan
from autoparallel.plan._upgrade import upgrade_v1
from autoparallel.plan._validate import PlanError, check_schema_version

__all__ = ["load_plan", "plan_error"]


def load_plan(path_or_text: str | Path | dict[str, Any]) -> ShardingPlan:
    """Load and validate a plan from a path, a JSON string or a dict; version-1 documents are
    upgraded to version 2.

    Raises:
        PlanError: (a ``ValueError``) naming the field, its value and the rule broken: a missing
            or unreadable file, text that is not JSON, an unknown key, a schema_version that is
            not 1 or 2, a wrong type, or content that breaks a rule of the whole plan.
    """
    document = _document(path_or_text)
    if not isinstance(document, dict):
        raise PlanError(
            field="document",
            value=type(document).__name__,
            rule="a plan must be a JSON object",
        )
    if "schema_version" not in document:
        raise PlanError(
            field="schema_version",
            value="missing",
            rule="every plan names its schema version",
        )
    version = document["schema_version"]
    check_schema_version(version, upgraded=False)
    if version == 1:
        document = upgrade_v1(document)
    try:
        return ShardingPlan.model_validate(document)
    except ValidationError as error:
        raise plan_error(error) from None


def _document(source: str | Path | dict[str, Any]) -> Any:
    if isinstance(source, dict):
        return source
    text = str(source)
    where = "text"
    if not text.lstrip().startswith(("{", "[")):
        path = Path(source)
        if not path.is_file():
            rule = "is a folder, not a plan file" if path.is_dir() else "no such file"
            raise PlanError(field="path", value=str(path), rule=rule)
        try:
            text, where = path.read_text(), str(path)
        except (OSError, UnicodeDecodeError) as error:
            raise PlanError(
                field="path", value=str(path), rule=f"cannot be read: {error}"
            ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise PlanError(
            field="document",
            value=where,
            rule=f"is not valid JSON ({error.msg} at line {error.lineno} column {error.colno})",
        ) from None


def plan_error(error: ValidationError) -> PlanError:
    """The first problem of a pydantic ``ValidationError`` of a plan as one ``PlanError``."""
    first = error.errors()[0]
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, PlanError):
        return cause
    location = tuple(first["loc"])
    if first["type"] == "extra_forbidden":
        return PlanError(
            field=_dotted(location),
            value="unknown key",
            rule=f"valid keys there: {', '.join(_valid_keys(location))}",
        )
    if first["type"] == "missing":
        return PlanError(field=_dotted(location), value="missing", rule="is required")
    return PlanError(
        field=_dotted(location) or "document",
        value=_short_input(first.get("input")),
        rule=first["msg"],
    )


def _dotted(location: tuple) -> str:
    text = ""
    for part in location:
        text += (
            f"[{part}]"
            if isinstance(part, int)
            else (f".{part}" if text else str(part))
        )
    return text


def _short_input(value: Any) -> str:
    return type(value).__name__ if isinstance(value, (dict, list)) else repr(value)


def _valid_keys(location: tuple) -> list[str]:
    """The keys the model at ``location[:-1]`` accepts (a tagged union is followed by its tag)."""
    annotation: Any = ShardingPlan
    for part in location[:-1]:
        if isinstance(part, int):
            continue
        models = _models_in(annotation)
        tagged = [
            m
            for m in models
            if getattr(m.model_fields.get("kind"), "default", None) == part
        ]
        holding = [m for m in models if part in m.model_fields]
        annotation = (
            tagged[0]
            if tagged
            else (holding[0].model_fields[part].annotation if holding else None)
        )
    models = _models_in(annotation)
    return sorted(models[0].model_fields) if models else []


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models inside ``X``, ``X | None``, ``tuple[X, ...]`` or a union."""
    from typing import get_args

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [
        model for argument in get_args(annotation) for model in _models_in(argument)
    ]
