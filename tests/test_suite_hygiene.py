"""The test suite itself: marks that select what they say, nothing skipped for a missing file.

* A test that starts ranks (``run_ranks``, ``torch.distributed.run``/``torchrun``,
  ``start_processes``, ``multiprocessing``) directly or through a helper of its module carries
  the ``distributed`` mark. (The converse, a marked test that starts no process, is caught at
  run time by ``conftest.py``, which also sees ranks started inside library calls.)
* No test skips on an import: the packages tests import are hard or test-extra dependencies,
  installed wherever the suite runs.
* No test reads a path above the repository (a file there is absent in CI, and a check guarded
  by its existence is silently skipped there).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
TEST_FILES = sorted(TESTS.glob("test_*.py"))
LAUNCH_NAMES = {"run_ranks", "start_processes", "multiprocessing"}
LAUNCH_STRINGS = {"torch.distributed.run", "torchrun"}
ALLOWED_ABSOLUTE_PREFIXES = ("/tmp", "/dev/", "/proc")
PATH_OPENERS = {"Path", "PurePath", "open", "joinpath"}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (prose may name torchrun)."""
    found = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and node.body
        ):
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _launches_directly(function: ast.AST, docstrings: set[int]) -> bool:
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and node.id in LAUNCH_NAMES:
            return True
        if isinstance(node, ast.Attribute) and node.attr in LAUNCH_NAMES:
            return True
        if (
            isinstance(node, ast.Constant)
            and id(node) not in docstrings
            and node.value in LAUNCH_STRINGS
        ):
            return True
    return False


def _called_names(function: ast.AST) -> set[str]:
    return {node.id for node in ast.walk(function) if isinstance(node, ast.Name)}


def _is_distributed(decorators: list[ast.expr]) -> bool:
    return any("mark.distributed" in ast.unparse(decorator) for decorator in decorators)


def _tests_launching_without_mark(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = _docstrings(tree)
    module_marked = any(
        isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
        and "mark.distributed" in ast.unparse(node.value)
        for node in tree.body
    )
    helpers = {
        node.name: node
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    launching: dict[str, bool] = {}

    def launches(name: str, seen: frozenset[str] = frozenset()) -> bool:
        if name not in launching:
            node = helpers[name]
            callees = (_called_names(node) & helpers.keys()) - seen - {name}
            launching[name] = _launches_directly(node, docstrings) or any(
                launches(callee, seen | {name}) for callee in callees
            )
        return launching[name]

    tests = [
        (node, [])
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    for cls in (
        node
        for node in tree.body
        if isinstance(node, ast.ClassDef) and node.name.startswith("Test")
    ):
        tests += [
            (node, cls.decorator_list) for node in cls.body if isinstance(node, ast.FunctionDef)
        ]
    unmarked = []
    for node, class_decorators in tests:
        if (
            not node.name.startswith("test_")
            or module_marked
            or _is_distributed(node.decorator_list + class_decorators)
        ):
            continue
        callees = _called_names(node) & helpers.keys()
        if _launches_directly(node, docstrings) or any(launches(callee) for callee in callees):
            unmarked.append(f"{path.name}::{node.name}")
    return unmarked


def test_every_test_that_starts_ranks_is_marked_distributed() -> None:
    unmarked = [name for path in TEST_FILES for name in _tests_launching_without_mark(path)]
    assert not unmarked, f"start ranks but lack @pytest.mark.distributed: {unmarked}"


def test_the_mark_check_sees_through_helpers_and_ignores_prose(tmp_path: Path) -> None:
    """The checker itself: a helper's run_ranks counts, a docstring's "torchrun" does not."""
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "import pytest\n"
        "from autoparallel.testing import run_ranks\n"
        "def _go():\n    return run_ranks(print, 2)\n"
        "def test_via_helper():\n    _go()\n"
        "@pytest.mark.distributed\ndef test_marked():\n    _go()\n"
        'def test_prose():\n    """Reads a report torchrun wrote."""\n'
        'def test_command():\n    command = ["python", "-m", "torch.distributed.run"]\n'
    )
    assert _tests_launching_without_mark(sample) == [
        "test_sample.py::test_via_helper",
        "test_sample.py::test_command",
    ]


def _call_name(call: ast.Call) -> str:
    function = call.func
    return function.id if isinstance(function, ast.Name) else getattr(function, "attr", "")


def _skips_and_outside_paths(path: Path) -> list[str]:
    """importorskip calls, and paths that leave the repository: ``parents[k >= 2]`` or
    ``parents[...].parent`` of the test file, absolute or ``..`` paths given to ``Path``/``open``
    (other absolute strings in tests are values under test, e.g. a checkpoint folder in a plan)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        where = f"{path.name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute) and node.attr == "importorskip":
            found.append(f"{where} importorskip (import the package; add it to the test extras)")
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "parents"
        ):
            index = node.slice
            if (
                isinstance(index, ast.Constant)
                and isinstance(index.value, int)
                and index.value >= 2
            ):
                found.append(f"{where} parents[{index.value}] reaches above the repository")
        if isinstance(node, ast.Attribute) and node.attr == "parent":
            inner = node.value
            if (
                isinstance(inner, ast.Subscript)
                and isinstance(inner.value, ast.Attribute)
                and inner.value.attr == "parents"
            ):
                found.append(f"{where} parents[...].parent reaches above the repository")
        if isinstance(node, ast.Call) and _call_name(node) in PATH_OPENERS and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                text = first.value
                if text.startswith("/") and not text.startswith(ALLOWED_ABSOLUTE_PREFIXES):
                    found.append(f"{where} absolute path {text!r}")
                if text.startswith(".."):
                    found.append(f"{where} relative path {text!r} leaves the tests")
    return found


def test_no_test_skips_on_an_import_or_reads_outside_the_repository() -> None:
    problems = [problem for path in TEST_FILES for problem in _skips_and_outside_paths(path)]
    assert not problems, problems


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ('torch = pytest.importorskip("torch")\n', "importorskip"),
        (
            'REFERENCE = Path(__file__).resolve().parents[1].parent / "shared"\n',
            "above the repository",
        ),
        (
            'DATA = Path(__file__).resolve().parents[2] / "data"\n',
            "above the repository",
        ),
        ('DATA = Path("/work/shared/reference/hardware.json")\n', "absolute path"),
        ('DATA = open("../shared/reference/hardware.json")\n', "leaves the tests"),
    ],
)
def test_the_skip_check_catches_each_kind(tmp_path: Path, source: str, problem: str) -> None:
    sample = tmp_path / "test_sample.py"
    sample.write_text(source)
    found = _skips_and_outside_paths(sample)
    assert len(found) == 1 and problem in found[0], found
