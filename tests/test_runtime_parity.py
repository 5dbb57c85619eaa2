"""Sharded training equals the single-process reference: tp2, pp2 x tp2, pp2 x dp2 x tp2, sp, FSDP.

Every rank builds the same reference model (same seed), applies a plan made by the plan API
(``autoparallel.testing.plan_for_config``) to a copy, runs one training step on its share of the
batch, and compares logits, loss, every gradient and every parameter after one AdamW step with
the reference run on the whole batch.
"""

from __future__ import annotations

import copy

import pytest

from autoparallel.testing import (
    GRADIENT_TOLERANCE,
    assert_parity,
    full_tensor,
    parameter_errors,
    reference_step,
    relative_error,
    run_ranks,
    worst_error,
)

pytestmark = pytest.mark.distributed

SEQUENCE_TOKENS = 8
SEQUENCES_PER_DP_RANK = 4


def _sharded_step(applied, tokens, targets, *, broken: str | None):
    """One step under the plan; returns (logits or None, loss or None) of this rank."""
    import torch
    import torch.nn.functional as F

    if applied.pipeline is None:
        logits = applied.module(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
    else:
        losses: list = []
        pipeline = applied.pipeline
        if pipeline.is_first:
            logits = pipeline.schedule.step(tokens)
        else:
            logits = pipeline.schedule.step(target=targets, losses=losses)
        loss = torch.stack(losses).mean() if losses else None
        logits = logits if pipeline.is_last else None
    if broken != "skip_sync":
        applied.sync_gradients()
    torch.optim.AdamW(applied.parameters(), lr=1e-3).step()
    return logits, loss


def _break(applied, broken: str | None) -> None:
    if broken == "shared_key":  # drop the tp sum of MLA's shared RoPE-key gradient
        from autoparallel.runtime._attention import Attention, _identity

        for module in applied.modules:
            for submodule in module.modules():
                if isinstance(submodule, Attention):
                    submodule.shared_key_hook = _identity


def _parity_rank(
    rank: int, world_size: int, config_fields: dict, spec_fields: dict, broken: str | None
) -> dict:
    import torch
    import torch.nn.functional as F

    from autoparallel.runtime import ReferenceMoETransformer, apply_plan, tiny_reference_spec
    from autoparallel.testing import plan_for_config
    from cost_model import ParallelConfig

    spec = tiny_reference_spec(**{"num_layers": 2, **spec_fields})  # one dense + one MoE layer
    config = ParallelConfig(**config_fields)
    plan = plan_for_config(spec, config)
    reference = ReferenceMoETransformer(spec)
    reference.init_weights(seed=0)
    model = copy.deepcopy(reference)
    generator = torch.Generator().manual_seed(1)
    batch = SEQUENCES_PER_DP_RANK * config.dp
    tokens = torch.randint(0, spec.vocab_size, (batch, SEQUENCE_TOKENS), generator=generator)
    targets = torch.randint(0, spec.vocab_size, (batch, SEQUENCE_TOKENS), generator=generator)

    def loss_fn(logits, target):
        return F.cross_entropy(logits.flatten(0, 1), target.flatten())

    applied = apply_plan(
        model, plan, loss_fn=loss_fn, num_micro_batches=2 if config.pp > 1 else None
    )
    _break(applied, broken)
    dp_index = applied.meshes.coordinate("dp")
    local = slice(dp_index * SEQUENCES_PER_DP_RANK, (dp_index + 1) * SEQUENCES_PER_DP_RANK)
    reference_logits, reference_grads = reference_step(reference, tokens, targets)
    logits, loss = _sharded_step(applied, tokens[local], targets[local], broken=broken)

    errors: dict[str, float] = {}
    if logits is not None:
        errors["logits"] = relative_error(full_tensor(logits), reference_logits[local])
        reference_loss = F.cross_entropy(
            reference_logits[local].flatten(0, 1), targets[local].flatten()
        )
        errors["loss"] = relative_error(loss.reshape(()), reference_loss)
    errors.update(parameter_errors(applied.modules, reference, reference_grads))
    return {"errors": errors, "num_parameters": sum(key.startswith("param:") for key in errors)}


def _run(
    config_fields: dict, *, spec_fields: dict | None = None, broken: str | None = None
) -> list[dict]:
    from cost_model import ParallelConfig

    world = ParallelConfig(**config_fields).world_size
    return run_ranks(
        _parity_rank, world, args=(config_fields, spec_fields or {}, broken), timeout_s=150
    )


def _assert_parity(results: list[dict]) -> None:
    assert all(result["num_parameters"] > 0 for result in results)
    assert_parity(results)


@pytest.mark.parametrize(
    "config_fields",
    [
        pytest.param({"tp": 2}, id="tp2"),
        pytest.param({"tp": 2, "sequence_parallel": True}, id="tp2-sp"),
        pytest.param({"tp": 2, "ep": 2, "sequence_parallel": True}, id="tp2-sp-ep2"),
        pytest.param({"pp": 2, "tp": 2}, id="pp2xtp2"),
        pytest.param(
            {"pp": 2, "tp": 2, "sequence_parallel": True, "pipeline_schedule": "gpipe"},
            id="pp2xtp2-sp",
        ),
        pytest.param({"pp": 2, "dp": 2, "tp": 2}, id="pp2xdp2xtp2"),
        pytest.param({"dp": 2, "tp": 2, "zero_stage": 3}, id="fsdp2xtp2"),
        pytest.param({"dp": 2, "ep": 2, "zero_stage": 2}, id="fsdp2xep2"),
    ],
)
def test_sharded_training_step_equals_reference(config_fields):
    _assert_parity(_run(config_fields))


@pytest.mark.parametrize("num_kv_heads", [2, 1], ids=["kv-heads-split", "kv-heads-replicated"])
def test_gqa_tp2_equals_reference(num_kv_heads):
    _assert_parity(_run({"tp": 2}, spec_fields={"attention": "gqa", "num_kv_heads": num_kv_heads}))


@pytest.mark.parametrize("num_kv_heads", [2, 1], ids=["kv-heads-split", "kv-heads-replicated"])
def test_qwen3_query_key_norms_under_tp2_equal_reference(num_kv_heads):
    """Qwen3's per-head query and key norms: whole on every rank, each rank's gradient from its
    own heads, summed over tp (the key norm's only where the K/V heads are split)."""
    spec = {"attention": "gqa", "num_kv_heads": num_kv_heads, "qk_norm": True}
    _assert_parity(_run({"tp": 2}, spec_fields=spec))


def test_unsummed_query_key_norm_gradients_fail_the_same_check():
    """Negative control: without the tp sum the query/key norms' gradients are one rank's heads."""
    results = _run(
        {"tp": 2},
        spec_fields={"attention": "gqa", "num_kv_heads": 2, "qk_norm": True},
        broken="skip_sync",
    )
    value, key = worst_error(results, "grad:")
    assert "norm" in key and value > GRADIENT_TOLERANCE * 100, (key, value)


def test_broken_sync_fails_the_same_check():
    """Negative control: without the tp sum of MLA's shared RoPE-key gradient the check fails."""
    results = _run({"tp": 2}, broken="shared_key")
    value, key = worst_error(results, "grad:")
    assert value > GRADIENT_TOLERANCE * 100, (key, value)
    with pytest.raises(AssertionError):
        _assert_parity(results)


def test_interleaved_pipeline_with_tensor_parallel_equals_reference():
    """Two chunks per pipeline rank: tensor parallel applies to each chunk module."""
    config = {"pp": 2, "tp": 2, "virtual_stages": 2, "pipeline_schedule": "interleaved_1f1b"}
    _assert_parity(_run(config, spec_fields={"num_layers": 4}))


def _meta_init_rank(rank: int, world_size: int, config_fields: dict) -> float:
    """Build on meta, apply the plan, materialize, init: every local weight equals the whole
    model's initialized weight (sliced where sharded). Returns the largest difference."""
    from autoparallel.runtime import ReferenceMoETransformer, apply_plan, tiny_reference_spec
    from autoparallel.testing import plan_for_config
    from cost_model import ParallelConfig

    spec = tiny_reference_spec(num_layers=2)
    reference = ReferenceMoETransformer(spec)
    reference.init_weights(seed=4)
    model = ReferenceMoETransformer(spec, device="meta")
    applied = apply_plan(model, plan_for_config(spec, ParallelConfig(**config_fields)))
    model.to_empty(device="cpu")
    model.init_weights(seed=4)
    whole = dict(reference.named_parameters())
    worst = 0.0
    for name, parameter in applied.module.named_parameters():
        worst = max(
            worst, float((full_tensor(parameter.detach()) - whole[name].detach()).abs().max())
        )
    return worst


def test_init_after_apply_on_meta_equals_whole_init():
    config = {"dp": 2, "tp": 2, "ep": 2, "zero_stage": 3}
    assert run_ranks(_meta_init_rank, 4, args=(config,), timeout_s=120) == [0.0] * 4
