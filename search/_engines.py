"""What each engine runs, as a search constraint: ``SearchBounds.engine`` keeps only the layouts
that engine (at ``SearchBounds.engine_version``) accepts and can express.

The rules are data (``cost_model/data/engine_rules.json``): each has an engine, a version range,
a kind (``refused``: the engine's own checks reject it; ``inexpressible``: the engine has no
option for it), a condition over the layout, a message and a source. A condition is a small
Python-syntax expression (``zero_stage == 3 and pp > 1``) over the config-table columns and a
few derived quantities; it is evaluated over whole numpy tables at once, so the search filters
every switch combination of a mesh in one pass, and a single plan is a table of one row.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from cost_model import RECOMPUTE_CODES, SCHEDULE_CODES, ParallelConfig

_RULES_PATH = Path(__file__).resolve().parents[1] / "cost_model" / "data" / "engine_rules.json"
_CODES = {"pipeline_schedule": SCHEDULE_CODES, "recompute": RECOMPUTE_CODES}
_DEFAULTS = {
    name: _CODES[name][field.default] if name in _CODES else field.default
    for name, field in ParallelConfig.model_fields.items()
}


@dataclass(frozen=True)
class EngineRule:
    """One thing an engine refuses or cannot express, for versions in ``[since, until)``."""

    id: str
    engine: str
    kind: str
    when: str
    message: str
    source: str
    since: str | None = None
    until: str | None = None

    def applies_to(self, version: str) -> bool:
        key = version_key(version)
        return (self.since is None or key >= version_key(self.since)) and (
            self.until is None or key < version_key(self.until)
        )


@dataclass(frozen=True)
class LayoutContext:
    """Facts about the job a rule may read beside the layout columns."""

    num_layers: int
    moe: bool
    training: bool


def version_key(version: str) -> tuple[int, ...]:
    """``"0.5.23"`` -> ``(0, 5, 23)``; raises ValueError naming the value if it is not dotted numbers."""
    try:
        return tuple(int(part) for part in version.split("."))
    except ValueError:
        raise ValueError(
            f"engine version ({version!r}) must be dotted numbers such as 0.5.23"
        ) from None


@lru_cache(maxsize=1)
def engine_data() -> dict[str, Any]:
    return json.loads(_RULES_PATH.read_text())


def engine_names() -> tuple[str, ...]:
    return tuple(engine_data()["engines"])


def engine_info(engine: str) -> dict[str, Any]:
    engines = engine_data()["engines"]
    if engine not in engines:
        raise ValueError(f"engine ({engine!r}) must be one of {list(engines)}")
    return engines[engine]


def resolve_version(engine: str, version: str | None) -> str:
    """``version`` checked against the versions the rules cover; ``None`` -> the current release."""
    info = engine_info(engine)
    if version is None:
        return info["current"]
    version_key(version)
    if version not in info["versions"]:
        raise ValueError(
            f"engine_version ({version!r}) of {engine} must be one of {info['versions']} (the versions whose rules are recorded)"
        )
    return version


def rules_for(engine: str, version: str | None = None) -> tuple[EngineRule, ...]:
    version = resolve_version(engine, version)
    rules = (EngineRule(**row) for row in engine_data()["rules"] if row["engine"] == engine)
    return tuple(rule for rule in rules if rule.applies_to(version))


def violated_rules(
    table: Mapping[str, np.ndarray],
    *,
    context: LayoutContext,
    engine: str,
    version: str | None = None,
) -> dict[str, np.ndarray]:
    """Rule id -> boolean column, True on the rows that rule rejects."""
    names = _names(table, context)
    return {
        rule.id: np.broadcast_to(_evaluate(rule.when, names), (_length(table),))
        for rule in rules_for(engine, version)
    }


def allowed_rows(
    table: Mapping[str, np.ndarray],
    *,
    context: LayoutContext,
    engine: str,
    version: str | None = None,
) -> np.ndarray:
    """True on the rows of ``table`` that no rule of ``engine`` rejects."""
    allowed = np.ones(_length(table), dtype=bool)
    for rejected in violated_rules(table, context=context, engine=engine, version=version).values():
        allowed &= ~rejected
    return allowed


def restrict_switches(
    space: Any, index: int, switches: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """The switch rows of mesh ``index`` of ``space`` that ``space.bounds.engine`` runs (all when no engine)."""
    engine = getattr(space.bounds, "engine", None)
    if engine is None:
        return switches
    mesh_row = {name: column[index : index + 1] for name, column in space.mesh.items()}
    key = tuple(int(column[0]) for column in mesh_row.values()) + (id(switches),)

    def build() -> dict[str, np.ndarray]:
        length = _length(switches)
        full = {**{k: np.repeat(v, length) for k, v in mesh_row.items()}, **switches}
        context = LayoutContext(
            num_layers=space.model.num_layers,
            moe=space.model.moe is not None,
            training=space.is_training,
        )
        keep = allowed_rows(
            full, context=context, engine=engine, version=space.bounds.engine_version
        )
        return {name: column[keep] for name, column in switches.items()}

    return space.memo("engine", key, build)


# ---------------------------------------------------------------------------- expressions
def _length(table: Mapping[str, np.ndarray]) -> int:
    return len(next(iter(table.values())))


def _names(table: Mapping[str, np.ndarray], context: LayoutContext) -> dict[str, Any]:
    length = _length(table)

    def column(name: str, default: Any) -> np.ndarray:
        return np.asarray(table[name]) if name in table else np.full(length, default)

    names: dict[str, Any] = {name: column(name, _DEFAULTS[name]) for name in _DEFAULTS}
    names.update({name: np.asarray(values) for name, values in table.items()})
    names["two_batch_overlap"] = column("two_batch_overlap", False).astype(bool)
    names["num_redundant_experts"] = column("num_redundant_experts", 0)
    tp, ep, etp = names["tp"], names["ep"], names["etp"]
    names["instance_size"] = np.maximum(tp, ep * etp)
    names["attention_tp"] = np.where(names["attention_data_parallel"].astype(bool), 1, tp)
    names["attention_replicas"] = names["instance_size"] // names["attention_tp"]
    names["num_chunks"] = names["pp"] * names["virtual_stages"]
    names["num_layers"] = context.num_layers
    names["uneven_pipeline"] = (context.num_layers % names["num_chunks"]) != 0
    names["moe"], names["training"] = context.moe, context.training
    return names


def _evaluate(expression: str, names: Mapping[str, Any]) -> np.ndarray:
    return np.asarray(_Evaluator(names).visit(ast.parse(expression, mode="eval").body), dtype=bool)


class _Evaluator(ast.NodeVisitor):
    """Vectorized evaluation of the rule grammar: names, numbers, strings of coded columns,
    ``and or not``, comparisons (``in`` a tuple), ``+ - * // %``."""

    _ARITHMETIC: ClassVar[dict] = {
        ast.Add: np.add,
        ast.Sub: np.subtract,
        ast.Mult: np.multiply,
        ast.FloorDiv: np.floor_divide,
        ast.Mod: np.mod,
    }
    _COMPARE: ClassVar[dict] = {
        ast.Eq: np.equal,
        ast.NotEq: np.not_equal,
        ast.Lt: np.less,
        ast.LtE: np.less_equal,
        ast.Gt: np.greater,
        ast.GtE: np.greater_equal,
    }

    def __init__(self, names: Mapping[str, Any]) -> None:
        self.names = names

    def generic_visit(self, node: ast.AST) -> Any:
        raise ValueError(
            f"engine rule syntax ({ast.unparse(node)!r}) is not part of the rule grammar"
        )

    def visit_Name(self, node: ast.Name) -> Any:
        if node.id not in self.names:
            raise ValueError(f"engine rule name ({node.id!r}) must be one of {sorted(self.names)}")
        return self.names[node.id]

    def visit_Constant(self, node: ast.Constant) -> Any:
        return node.value

    def visit_BoolOp(self, node: ast.BoolOp) -> Any:
        values = [np.asarray(self.visit(v), dtype=bool) for v in node.values]
        combine = np.logical_and if isinstance(node.op, ast.And) else np.logical_or
        result = values[0]
        for value in values[1:]:
            result = combine(result, value)
        return result

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Any:
        if isinstance(node.op, ast.Not):
            return np.logical_not(np.asarray(self.visit(node.operand), dtype=bool))
        return self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        operation = self._ARITHMETIC.get(type(node.op))
        if operation is None:
            return self.generic_visit(node)
        return operation(self.visit(node.left), self.visit(node.right))

    def visit_Compare(self, node: ast.Compare) -> Any:
        result, left, left_node = True, self.visit(node.left), node.left
        for operator, right_node in zip(node.ops, node.comparators):
            result = np.logical_and(result, self._compare(operator, left, left_node, right_node))
            if not isinstance(right_node, ast.Tuple):
                left, left_node = self.visit(right_node), right_node
        return result

    def _compare(
        self, operator: ast.cmpop, left: Any, left_node: ast.AST, right_node: ast.AST
    ) -> Any:
        codes = _CODES.get(left_node.id) if isinstance(left_node, ast.Name) else None
        if isinstance(operator, (ast.In, ast.NotIn)):
            if not isinstance(right_node, ast.Tuple):
                return self.generic_visit(right_node)
            values = [self._coded(codes, self.visit(element)) for element in right_node.elts]
            found = np.isin(left, values)
            return found if isinstance(operator, ast.In) else ~found
        compare = self._COMPARE.get(type(operator))
        if compare is None:
            return self.generic_visit(right_node)
        return compare(left, self._coded(codes, self.visit(right_node)))

    @staticmethod
    def _coded(codes: dict[str, int] | None, value: Any) -> Any:
        if codes is not None and isinstance(value, str):
            if value not in codes:
                raise ValueError(f"engine rule value ({value!r}) must be one of {list(codes)}")
            return codes[value]
        return value


def engine_search_settings(
    settings: Any, *, engine: str, version: str | None, workload: Any
) -> Any:
    """``settings`` (a ``SearchSettings`` or None) whose bounds keep only what ``engine`` runs.

    Raises ValueError when the engine's role (training or serving) is not the workload's kind.
    """
    from search._study_problem import SearchSettings

    version = resolve_version(engine, version)
    role, kind = engine_info(engine)["role"], getattr(workload, "kind", None)
    if (role == "training") != (kind == "training"):
        raise ValueError(f"engine ({engine!r}) is a {role} engine; the workload is {kind}")
    settings = settings or SearchSettings()
    bounds = settings.bounds.model_copy(update={"engine": engine, "engine_version": version})
    return settings.model_copy(update={"bounds": bounds})
