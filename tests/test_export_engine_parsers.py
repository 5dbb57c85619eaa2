"""The ``engines`` tier: exports handed to each engine's own parser (venvs built by
``benchmarks/engines/setup.sh``); every value the engine resolved must equal the plan's.
Skipped, with the reason, for an engine whose venv is not installed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "check_exports", ROOT / "benchmarks" / "engines" / "check_exports.py"
)
check_exports = importlib.util.module_from_spec(_spec)
sys.modules["check_exports"] = check_exports  # dataclasses resolve their module by name
_spec.loader.exec_module(check_exports)

pytestmark = pytest.mark.engines
CASES = [
    ("megatron", 3),
    ("megatron", 12),  # a recipe's EP overlap, CUDA graphs, DeepEP, recompute modules and layers
    ("megatron", 14),  # fp8 with bf16 end layers, bf16 gradient reduction and optimizer moments
    ("torchtitan", 3),
    ("torchtitan", 13),  # a model with torchtitan's own config: the shape it builds is checked
    ("deepspeed", 2),
    ("sglang", 6),
    ("vllm", 6),
    ("trtllm", 6),
]


@pytest.mark.parametrize("engine,plan_index", CASES)
def test_engine_accepts_the_export_and_resolves_the_plan(
    engine: str, plan_index: int, tmp_path: Path
) -> None:
    if engine != "trtllm" and not (check_exports.VENVS / engine / "bin" / "python").exists():
        pytest.skip(f"{engine} is not installed (bash benchmarks/engines/setup.sh {engine})")
    answers = check_exports.check(check_exports.PLANS[plan_index], engine, tmp_path)
    assert answers
    for answer in answers:
        assert answer["accepted"], answer["error"]
        assert answer["expected"] and not answer["mismatches"], answer["mismatches"]
