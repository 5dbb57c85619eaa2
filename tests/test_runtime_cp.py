"""Context parallel training equals the single-process reference: cp2 (MLA, GQA), cp2 x tp2,
cp2 x ep2, dp2 x cp2 under FSDP, pp2 x cp2; a causal mask on local positions fails the same check.

Every rank builds the same reference model, applies a plan made by the plan API
(``autoparallel.testing.plan_for_config``), takes its data-parallel slice of the batch and its
cp tokens of every sequence (``AppliedPlan.shard_inputs``), runs one training step and compares
logits (gathered in global token order), the loss (averaged over cp), every gradient and every
parameter after one AdamW step with the reference run on the whole batch.
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

SEQUENCE_TOKENS = 16
SEQUENCES_PER_DP_RANK = 2


def _break_positions(applied) -> None:
    """Negative control: the causal mask and RoPE use each rank's LOCAL token positions."""
    import torch

    from autoparallel.runtime._context_parallel import ContextParallel

    class LocalPositions(ContextParallel):
        def positions(self, local_tokens, *, device=None):
            return torch.arange(local_tokens, device=device)

        def key_positions(self, local_tokens, *, device=None):
            return torch.arange(local_tokens, device=device).repeat(self.size)

    context = applied.context_parallel
    broken = LocalPositions(group=context.group, rank=context.rank, size=context.size)
    for module in applied.modules:
        for submodule in module.modules():
            if getattr(submodule, "sequence_context", None) is not None:
                submodule.sequence_context = broken


def _step(applied, tokens, targets, loss_fn):
    """One training step on this rank's tokens; (logits, loss) or (None, None) off the last stage."""
    import torch

    pipeline = applied.pipeline
    if pipeline is None:
        logits = applied.module(tokens)
        loss = loss_fn(logits, targets)
        loss.backward()
    elif pipeline.is_first:
        logits, loss = pipeline.schedule.step(tokens), None
    else:
        losses: list = []
        logits = pipeline.schedule.step(target=targets, losses=losses)
        loss = torch.stack(losses).mean()
    applied.sync_gradients()
    torch.optim.AdamW(applied.parameters(), lr=1e-3).step()
    return (logits, loss) if pipeline is None or pipeline.is_last else (None, None)


def _cp_rank(
    rank: int, world_size: int, config_fields: dict, spec_fields: dict, broken: bool
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
    shape = (SEQUENCES_PER_DP_RANK * config.dp, SEQUENCE_TOKENS)
    tokens = torch.randint(0, spec.vocab_size, shape, generator=generator)
    targets = torch.randint(0, spec.vocab_size, shape, generator=generator)

    def loss_fn(logits, target):
        return F.cross_entropy(logits.flatten(0, 1), target.flatten())

    applied = apply_plan(
        model, plan, loss_fn=loss_fn, num_micro_batches=2 if config.pp > 1 else None
    )
    if broken:
        _break_positions(applied)
    dp_index = applied.meshes.coordinate("dp")
    local = slice(dp_index * SEQUENCES_PER_DP_RANK, (dp_index + 1) * SEQUENCES_PER_DP_RANK)
    local_tokens, local_targets = applied.shard_inputs(tokens[local], targets[local])
    reference_logits, reference_grads = reference_step(reference, tokens, targets)

    logits, loss = _step(applied, local_tokens, local_targets, loss_fn)

    reference_loss = F.cross_entropy(
        reference_logits[local].flatten(0, 1), targets[local].flatten()
    )
    errors = {}
    if logits is not None:  # the last pipeline stage (every rank without pipeline parallel)
        errors["logits"] = relative_error(
            applied.gather_sequence(full_tensor(logits)), reference_logits[local]
        )
        errors["loss"] = relative_error(applied.context_parallel.average(loss), reference_loss)
    errors.update(parameter_errors(applied.modules, reference, reference_grads))
    return {"errors": errors, "local_tokens": int(local_tokens.shape[1])}


def _run(
    config_fields: dict, *, spec_fields: dict | None = None, broken: bool = False
) -> list[dict]:
    from cost_model import ParallelConfig

    world = ParallelConfig(**config_fields).world_size
    return run_ranks(
        _cp_rank, world, args=(config_fields, spec_fields or {}, broken), timeout_s=120
    )


def _assert_parity(results: list[dict], *, cp: int) -> None:
    assert all(result["local_tokens"] == SEQUENCE_TOKENS // cp for result in results)
    assert all(sum(key.startswith("grad:") for key in result["errors"]) > 10 for result in results)
    assert_parity(results)


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("config_fields", "spec_fields"),
    [
        pytest.param({"cp": 2}, {}, id="cp2-mla"),
        pytest.param({"cp": 2}, {"attention": "gqa"}, id="cp2-gqa"),
        pytest.param({"cp": 2, "tp": 2}, {}, id="cp2xtp2"),
        pytest.param({"cp": 2, "ep": 2}, {}, id="cp2xep2"),
        pytest.param({"dp": 2, "cp": 2, "zero_stage": 2}, {"attention": "gqa"}, id="fsdp-dp2xcp2"),
        pytest.param({"pp": 2, "cp": 2}, {}, id="pp2xcp2"),
    ],
)
def test_context_parallel_step_equals_reference(config_fields, spec_fields):
    _assert_parity(_run(config_fields, spec_fields=spec_fields), cp=config_fields["cp"])


@pytest.mark.distributed
def test_local_positions_fail_the_same_check():
    """Negative control: a causal mask (and RoPE) on local token positions breaks parity."""
    results = _run({"cp": 2}, broken=True)
    value, key = worst_error(results, "logits")
    assert value > GRADIENT_TOLERANCE * 100, (key, value)
    with pytest.raises(AssertionError):
        _assert_parity(results, cp=2)


def _train_example_rank(rank: int, world_size: int, plan_path: str) -> list[float]:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "train_moe.py"
    spec = importlib.util.spec_from_file_location("example_train_moe_cp", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example.train(example.parse_args(["--plan", plan_path, "--steps", "6"]))


@pytest.mark.distributed
def test_train_example_runs_a_cp2_plan(tmp_path):
    """``examples/train_moe.py``'s loop under a cp2 x ep2 plan: every rank sees the same global
    loss (mean over the cp ranks' local-token losses), and it falls."""
    import autoparallel as ap
    from autoparallel.testing import plan_for_config
    from cost_model import ParallelConfig, Training

    workload = Training(sequence_length_tokens=16, global_batch_sequences=4)
    plan = plan_for_config(ap.get_model("tiny-moe"), ParallelConfig(cp=2, ep=2), workload=workload)
    results = run_ranks(
        _train_example_rank, 2, args=(str(plan.save(tmp_path / "plan.json")),), timeout_s=120
    )
    assert results[0] == pytest.approx(results[1], rel=1e-6)
    losses = results[0]
    assert len(losses) == 6 and losses[-1] < 0.9 * losses[0], losses


# ----------------------------------------------------------------------------- single process
def test_zigzag_chunks_cover_the_sequence_and_balance_causal_work():
    import torch

    from autoparallel.runtime._context_parallel import zigzag_positions

    for cp in (1, 2, 4):
        parts = [zigzag_positions(sequence_tokens=32, cp=cp, rank=r) for r in range(cp)]
        assert torch.equal(torch.cat(parts).sort().values, torch.arange(32))
        work = {int((part + 1).sum()) for part in parts}  # keys each rank's queries see, causally
        assert len(work) == 1, (cp, work)
    assert zigzag_positions(sequence_tokens=8, cp=2, rank=0).tolist() == [0, 1, 6, 7]
    assert zigzag_positions(sequence_tokens=8, cp=2, rank=1).tolist() == [2, 3, 4, 5]


def test_sequence_length_not_a_multiple_of_2cp_is_rejected():
    import torch

    from autoparallel.runtime import ReferenceMoETransformer, check_plan_fits, tiny_reference_spec
    from autoparallel.runtime._context_parallel import ContextParallel
    from autoparallel.testing import plan_for_config
    from cost_model import ParallelConfig, Training

    context = ContextParallel(group=None, rank=0, size=2)
    with pytest.raises(
        ValueError, match=r"input sequence length \(6\) must be a positive multiple of 2\*cp \(4\)"
    ):
        context.shard(torch.zeros(1, 6, dtype=torch.long))
    spec = tiny_reference_spec(num_layers=2)
    workload = Training(sequence_length_tokens=6, global_batch_sequences=2)
    with pytest.raises(
        ValueError,
        match=r"plan config \(cp2\): sequence_length_tokens \(6\) must be divisible by 2\*cp \(4\)",
    ):
        plan_for_config(spec, ParallelConfig(cp=2), workload=workload)  # the plan itself refuses it
    valid = plan_for_config(
        spec,
        ParallelConfig(cp=2),
        workload=Training(sequence_length_tokens=8, global_batch_sequences=2),
    )
    plan = valid.model_copy(
        update={"job": workload}
    )  # edited after validation: the runtime checks again
    with pytest.raises(ValueError, match=r"job.sequence_length_tokens \(6\).*2\*cp \(4\)"):
        check_plan_fits(ReferenceMoETransformer(spec, device="meta"), plan)


def test_generation_under_context_parallel_is_a_clear_error():
    from autoparallel.runtime import (
        KVCache,
        ReferenceMoETransformer,
        check_plan_fits,
        tiny_reference_spec,
    )
    from autoparallel.runtime._attention import Attention
    from autoparallel.runtime._context_parallel import ContextParallel
    from autoparallel.testing import plan_for_config
    from cost_model import Inference, ParallelConfig

    spec = tiny_reference_spec(num_layers=2)
    inference = Inference(prompt_tokens=16, output_tokens=16, concurrency=1)
    plan = plan_for_config(spec, ParallelConfig(cp=2), workload=inference)
    with pytest.raises(ValueError, match=r"cp \(2\) must be 1 for an inference plan"):
        check_plan_fits(ReferenceMoETransformer(spec, device="meta"), plan)
    model = ReferenceMoETransformer(spec)
    model.init_weights(seed=0)
    for module in model.modules():
        if isinstance(module, Attention):
            module.sequence_context = ContextParallel(group=None, rank=0, size=2)
    import torch

    with pytest.raises(ValueError, match=r"KV cache is not supported under context parallel"):
        model(torch.zeros(1, 4, dtype=torch.long), KVCache(capacity_tokens=8))


def test_module_without_context_attention_is_rejected():
    from torch import nn

    from autoparallel.runtime._context_parallel import check_context_parallel_module

    with pytest.raises(
        ValueError, match=r"cp \(2\) > 1 needs attention modules .*Sequential has none"
    ):
        check_context_parallel_module(nn.Sequential(nn.Linear(2, 2)), cp=2)
    check_context_parallel_module(nn.Sequential(nn.Linear(2, 2)), cp=1)


def test_fsdp_over_dp_x_cp_needs_increasing_ranks():
    """FSDP shards over dp x cp flattened: a placement out of rank order there is refused."""
    from autoparallel.runtime import tiny_reference_spec
    from autoparallel.runtime._mesh import mesh_rank_layout
    from autoparallel.testing import plan_for_config
    from cost_model import ParallelConfig

    spec = tiny_reference_spec(num_layers=2)
    for zero_stage in (0, 2):
        plan = plan_for_config(spec, ParallelConfig(dp=2, cp=2, zero_stage=zero_stage))
        swapped = plan.model_copy(
            update={"rank_to_device": (0, 2, 1, 3)}
        )  # dp and cp each still increase
        if zero_stage == 0:
            assert mesh_rank_layout(swapped).flatten().tolist() == [0, 2, 1, 3]
        else:
            with pytest.raises(ValueError, match=r"dp x cp group out of increasing rank order"):
                mesh_rank_layout(swapped)
