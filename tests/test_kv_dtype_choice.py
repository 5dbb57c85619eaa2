"""The KV-cache dtype a serving search tries: the one the workload names (``Inference(kv_dtype=...)``,
``plan --kv-dtype``) and only it; left unnamed, the workload's default and fp8."""

from __future__ import annotations

import pytest

import autoparallel as ap
from autoparallel.cli import main
from autoparallel.runtime._recovery import job_from_plan
from cost_model import Inference
from search import SearchBounds, SearchSpace, lean_bounds
from search._space import kv_dtype_choices

PLAN = [
    "plan",
    "--model",
    "qwen3-30b-a3b",
    "--cluster",
    "dgx-h100",
    "--nodes",
    "1",
    "--prompt-tokens",
    "2000",
    "--output-tokens",
    "500",
    "--concurrency",
    "64",
    "--no-disaggregation",
]


def _space(workload: Inference, bounds: SearchBounds | None = None) -> SearchSpace:
    model = ap.get_model("qwen3-30b-a3b")
    return SearchSpace(
        model=model,
        workload=workload,
        world_size=8,
        devices_per_node=8,
        bounds=bounds or SearchBounds(),
    )


def test_a_named_kv_dtype_is_the_only_one_searched() -> None:
    unnamed = Inference(prompt_tokens=2000, output_tokens=500)
    assert kv_dtype_choices(_space(unnamed)) == ["bf16", "fp8"]
    named = Inference(prompt_tokens=2000, output_tokens=500, kv_dtype="bf16")
    assert kv_dtype_choices(_space(named)) == ["bf16"]
    bounded = _space(named, SearchBounds(kv_dtypes=("fp8",)))
    assert kv_dtype_choices(bounded) == ["fp8"]  # explicit bounds win
    assert lean_bounds(None, named).kv_dtypes == ("bf16",)
    assert lean_bounds(None, unnamed).kv_dtypes == ("fp8",)


@pytest.mark.parametrize("given,expected", [(None, "fp8"), ("bf16", "bf16")])
def test_plan_keeps_the_kv_dtype_it_was_given(tmp_path, capsys, given, expected) -> None:
    output = tmp_path / "plan.json"
    extra = ["--kv-dtype", given] if given else []
    assert main([*PLAN, *extra, "--output", str(output)]) == 0
    capsys.readouterr()
    plan = ap.load_plan(output)
    # unnamed, the search prefers the fp8 cache (twice the requests per byte)
    assert plan.serving.kv_dtype == expected
    _, _, workload = job_from_plan(plan, model=None, cluster=None, workload=None)
    assert workload.kv_dtype == expected  # a recovery re-plans the cache the plan runs
