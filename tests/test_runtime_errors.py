"""Plan/module mismatches raise ValueError naming what differs, before any collective.

The single-process checks run with no process group at all: a collective (or a process-group
init from the environment) would fail with a different error than the one asserted.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

from autoparallel.plan import ModuleRule
from autoparallel.runtime import (
    ReferenceMoETransformer,
    apply_plan,
    tiny_reference_spec,
)
from autoparallel.testing import plan_for_config, run_ranks
from cost_model import Inference, ParallelConfig


@pytest.fixture()
def spec():
    return tiny_reference_spec(num_layers=2)


@pytest.fixture()
def no_process_group(monkeypatch):
    assert not dist.is_initialized()
    for name in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


def _model(spec):
    return ReferenceMoETransformer(spec, device="meta")


def test_launched_world_differs(spec, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    plan = plan_for_config(spec, ParallelConfig(tp=2, dp=2))
    with pytest.raises(
        ValueError, match=r"plan world_size \(4\) differs from the launched world size \(2\)"
    ):
        apply_plan(_model(spec), plan)
    assert not dist.is_initialized()


def test_plan_for_another_model(spec, no_process_group):
    plan = plan_for_config(tiny_reference_spec(num_layers=2, hidden_size=128), ParallelConfig(tp=2))
    with pytest.raises(ValueError, match="fingerprint .* differs from the plan's"):
        apply_plan(_model(spec), plan)


def test_layer_and_expert_counts_differ_without_a_spec(spec, no_process_group):
    plan = plan_for_config(tiny_reference_spec(num_layers=3), ParallelConfig(tp=2))
    model = _model(spec)
    del model.spec  # a user's module carries no ModelSpec: counts are compared instead
    with pytest.raises(ValueError, match="module has 2 layers; the plan's stages cover 3 layers"):
        apply_plan(model, plan)
    plan = plan_for_config(
        tiny_reference_spec(num_layers=2, num_experts=16), ParallelConfig(tp=2, ep=2)
    )
    with pytest.raises(ValueError, match=r"hold \[8\] experts; the plan's expert placement has 16"):
        apply_plan(model, plan)


def test_rule_matching_no_module(spec, no_process_group):
    plan = plan_for_config(spec, ParallelConfig(tp=2))
    plan = plan.model_copy(
        update={
            "module_rules": plan.module_rules
            + (ModuleRule(pattern="*.block_sparse_moe.gate", style="replicate"),)
        }
    )
    with pytest.raises(
        ValueError,
        match=r"module rule '\*\.block_sparse_moe\.gate' \(replicate over tp\) matches no module",
    ):
        apply_plan(_model(spec), plan)


def test_unsupported_and_conflicting(spec, no_process_group):
    # Context parallel trains (tests/test_runtime_cp.py); generating under it is refused.
    serving = Inference(prompt_tokens=16, output_tokens=16, concurrency=1)
    plan = plan_for_config(spec, ParallelConfig(tp=2, cp=2), workload=serving)
    with pytest.raises(ValueError, match=r"cp \(2\) must be 1 for an inference plan"):
        apply_plan(_model(spec), plan)
    plan = plan_for_config(spec, ParallelConfig(tp=2))
    conflicting = plan.module_rules + (ModuleRule(pattern="*.o_proj", style="colwise"),)
    with pytest.raises(ValueError, match="matches rules of different styles"):
        apply_plan(_model(spec), plan.model_copy(update={"module_rules": conflicting}))
    bad_layout = plan.model_copy(update={"rank_to_device": (0, 0)})
    with pytest.raises(ValueError, match="rank_to_device"):
        apply_plan(_model(spec), bad_layout)


def _apply_twice(rank: int, world_size: int) -> str:
    spec = tiny_reference_spec(num_layers=2)
    model = ReferenceMoETransformer(spec)
    model.init_weights(seed=0)
    plan = plan_for_config(spec, ParallelConfig(tp=2))
    apply_plan(model, plan)
    try:
        apply_plan(model, plan)
    except ValueError as error:
        return str(error)
    return "no error"


def _apply_wrong_world(rank: int, world_size: int) -> str:
    spec = tiny_reference_spec(num_layers=2)
    plan = plan_for_config(spec, ParallelConfig(tp=2, dp=2))
    try:
        apply_plan(ReferenceMoETransformer(spec, device="meta"), plan)
    except ValueError as error:
        return str(error)
    return "no error"


@pytest.mark.distributed
def test_applying_twice_and_wrong_world_under_gloo():
    twice = run_ranks(_apply_twice, 2, timeout_s=60)
    assert all("already applied" in message for message in twice)
    wrong = run_ranks(_apply_wrong_world, 2, timeout_s=60)
    assert all(
        "plan world_size (4) differs from the launched world size (2)" in message
        for message in wrong
    )
