"""Expert parallel on gloo ranks equals the single-process reference model.

Each case builds a plan for ``tiny-moe`` through the planner, applies it on forked gloo ranks
and checks, against one unsharded reference model fed the whole global batch: logits and loss,
every gradient within 1e-5 of the tensor's largest magnitude, and every parameter after one
AdamW step within 1e-4. A negative control (expert gradients left unsynchronised) must fail.

The rank-side harness (``check_case``) is shared with the pipeline tests.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import autoparallel as ap
from autoparallel._expert_placement import balanced_placement
from autoparallel.plan import ShardingPlan
from autoparallel.testing import full_tensor, plan_for_config, run_ranks
from cost_model import ParallelConfig, Training

GRAD_RTOL = 1e-5
PARAM_ATOL = 1e-4
SEQUENCE_TOKENS = 8
SEQUENCES_PER_RANK = 4
LEARNING_RATE = 1e-3


# --------------------------------------------------------------------------- plans
def make_plan(
    config: ParallelConfig,
    *,
    model: str = "tiny-moe",
    num_redundant_experts: int = 0,
    expert_load=None,
) -> ShardingPlan:
    """The plan the planner's builders write for ``config`` (``autoparallel.testing.plan_for_config``);
    with ``expert_load``, experts placed by the EPLB-style balancer with redundant replicas."""
    spec = ap.get_model(model)
    workload = Training(
        sequence_length_tokens=SEQUENCE_TOKENS,
        global_batch_sequences=SEQUENCES_PER_RANK * config.dp,
    )
    plan = plan_for_config(spec, config, workload=workload)
    if expert_load is None:
        return plan
    placement = balanced_placement(
        expert_load=expert_load, ep=config.ep, num_redundant_experts=num_redundant_experts
    )
    return plan.model_copy(update={"expert_placement": placement})


# --------------------------------------------------------------------------- rank side
def _batch(spec, plan):
    import torch

    generator = torch.Generator().manual_seed(1234)
    shape = (SEQUENCES_PER_RANK * plan.config.dp, SEQUENCE_TOKENS)
    ids = torch.randint(0, spec.vocab_size, shape, generator=generator)
    targets = torch.randint(0, spec.vocab_size, shape, generator=generator)
    return ids, targets


def _loss(logits, targets):
    import torch.nn.functional as F

    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def _reference_view(name: str, tensor, local, plan, meshes):
    """The part of a reference tensor this rank holds: expert-TP slices experts' projections."""
    if (
        ".experts." in name
        and ".shared" not in name
        and plan.config.etp > 1
        and local.shape != tensor.shape
    ):
        dim = 1 if ".down_proj." in name else 0
        return tensor.chunk(plan.config.etp, dim=dim)[meshes.coordinate("etp")]
    return tensor


def _relative(a, b) -> float:
    a, b = a.detach(), b.detach()
    scale = float(b.abs().max()) if b.numel() else 0.0
    return float((a - b).abs().max()) / scale if scale > 0 else float((a - b).abs().max())


def _apply(model, plan, options):
    """``apply_plan``; the negative control drops the expert-gradient sync from the step."""
    applied = ap.apply_plan(
        model,
        plan,
        loss_fn=_loss,
        device_type="cpu",
        num_micro_batches=SEQUENCES_PER_RANK // plan.config.micro_batch_size,
    )
    expert_parallel = applied.expert_parallel[0] if applied.expert_parallel else None
    if options.get("skip_expert_sync"):
        applied.expert_parallel = []
    return applied, expert_parallel


def check_case(rank: int, world_size: int, plan_json: str, options: dict, reference, model) -> dict:
    """Run one training step of the plan on this rank; return its worst errors vs the reference.

    ``reference`` and ``model`` are two identical fresh models built before the ranks forked
    (each rank mutates its own copy-on-write copies)."""
    import torch

    plan = ap.load_plan(plan_json)
    spec = reference.spec
    applied, expert_parallel = _apply(model, plan, options)
    meshes, modules, pipeline = applied.meshes, applied.modules, applied.pipeline
    ids, targets = _batch(spec, plan)
    start = meshes.coordinate("dp") * SEQUENCES_PER_RANK
    local_ids, local_targets = (
        ids[start : start + SEQUENCES_PER_RANK],
        targets[start : start + SEQUENCES_PER_RANK],
    )

    if pipeline is not None:
        logits, loss = pipeline.step(local_ids, targets=local_targets, return_outputs=True)[::-1]
    else:
        logits = modules[0](local_ids)
        loss = _loss(logits, local_targets)
        loss.backward()
    applied.sync_gradients()
    reference_logits = reference(ids)
    _loss(reference_logits, targets).backward()
    errors = {
        "logits": (0.0, ""),
        "loss": (0.0, ""),
        "grad": (0.0, ""),
        "param": (0.0, ""),
        "checked": 0,
    }
    if logits is not None:
        local_reference = reference_logits[start : start + SEQUENCES_PER_RANK]
        errors["logits"] = (_relative(full_tensor(logits), local_reference), "logits")
        errors["loss"] = (_relative(loss.detach(), _loss(local_reference, local_targets)), "loss")
    errors.update(_compare(modules, reference, plan, meshes, kind="grad"))
    torch.optim.AdamW(applied.parameters(), lr=LEARNING_RATE).step()
    torch.optim.AdamW(reference.parameters(), lr=LEARNING_RATE).step()
    errors.update(_compare(modules, reference, plan, meshes, kind="param"))
    errors["checked"] = sum(1 for m in modules for _ in m.parameters())
    errors["local_experts"] = expert_parallel.local_experts if expert_parallel else ()
    errors["received_tokens"] = (
        dict(expert_parallel.dispatcher.received_tokens) if expert_parallel else {}
    )
    errors["edp"] = meshes.coordinate("edp")
    errors["recv_buffers"] = _recv_buffers(pipeline)
    errors["kept_outputs"] = _kept_outputs(pipeline, local_ids, local_targets)
    return errors


def _recv_buffers(pipeline) -> dict | None:
    """The receive buffers torch's stages on this rank keep after a step: (chunk, micro-batches)
    with an input buffer, the same with an output-gradient buffer, and their element counts."""
    if pipeline is None:
        return None
    inputs, gradients, sizes = [], [], set()
    for stage in pipeline.stages:
        for kind, table in ((inputs, stage.args_recv_info), (gradients, stage.grad_recv_info)):
            for micro_batch, infos in table.items():
                buffers = [info.buffer for info in infos if info.buffer is not None]
                if buffers:
                    kind.append((stage.stage_index, micro_batch))
                    sizes.update(int(buffer.numel()) for buffer in buffers)
    return {
        "chunks": [stage.stage_index for stage in pipeline.stages],
        "inputs": inputs,
        "gradients": gradients,
        "sizes": sorted(sizes),
    }


def _kept_outputs(pipeline, ids, targets) -> tuple[int, int] | None:
    """Micro-batch outputs the last stage holds after the step that returned them, then after
    a plain training step (``Pipeline.step`` without ``return_outputs``); None off the last
    stage."""
    if pipeline is None:
        return None
    asked = sum(len(stage.output_chunks) for stage in pipeline.stages)
    pipeline.step(ids if pipeline.is_first else None, targets=targets if pipeline.is_last else None)
    plain = sum(len(stage.output_chunks) for stage in pipeline.stages)
    return (asked, plain) if pipeline.is_last else None


def _compare(modules, reference, plan, meshes, *, kind: str) -> dict:
    reference_parameters = dict(reference.named_parameters())
    worst_error, worst_name = 0.0, ""
    for module in modules:
        for name, parameter in module.named_parameters():
            if kind == "grad":
                if parameter.grad is None:
                    return {kind: (float("inf"), f"{name} has no gradient")}
                local = full_tensor(parameter.grad)
                expected = _reference_view(
                    name, reference_parameters[name].grad, local, plan, meshes
                )
                error = _relative(local, expected)
            else:
                local = full_tensor(parameter.detach())
                expected = _reference_view(
                    name, reference_parameters[name].detach(), local, plan, meshes
                )
                error = float((local - expected).abs().max())
            if error >= worst_error:
                worst_error, worst_name = error, name
    return {kind: (worst_error, worst_name)}


def worst(results: list[dict]) -> dict:
    """The worst (error, name) of each check over all ranks."""
    merged = {}
    for key in ("logits", "loss", "grad", "param"):
        merged[key] = max((r[key] for r in results), key=lambda item: item[0])
    merged["checked"] = min(r["checked"] for r in results)
    return merged


def fresh_models(plan):
    """Two identical models of the plan's model (the reference and the one to shard), built
    once in the parent instead of in every forked rank."""
    from autoparallel.runtime import ReferenceMoETransformer

    spec = ap.get_model(plan.provenance.model_name)
    models = ReferenceMoETransformer(spec), ReferenceMoETransformer(spec)
    for model in models:
        model.init_weights(seed=7)
    return models


# --------------------------------------------------------------------------- tests
def _run(plan, **options):
    args = (plan.to_json(), options, *fresh_models(plan))
    return run_ranks(check_case, plan.world_size, args=args, timeout_s=120)


def assert_equal_to_reference(results) -> None:
    failures = worst(results)
    assert failures["grad"][0] <= GRAD_RTOL, failures["grad"]
    assert failures["logits"][0] <= GRAD_RTOL, failures["logits"]
    assert failures["loss"][0] <= GRAD_RTOL, failures["loss"]
    assert failures["param"][0] <= PARAM_ATOL, failures["param"]
    assert failures["checked"] > 0


@pytest.mark.distributed
@pytest.mark.parametrize(
    "config",
    [
        pytest.param(ParallelConfig(dp=2, ep=2), id="ep2"),
        pytest.param(ParallelConfig(dp=4, ep=4), id="ep4"),
        pytest.param(ParallelConfig(dp=4, ep=2), id="dp4-edp2xep2"),
        pytest.param(ParallelConfig(dp=4, ep=2, etp=2), id="dp4-ep2xetp2"),
        pytest.param(ParallelConfig(tp=2, ep=2), id="tp2xep2"),
        pytest.param(ParallelConfig(dp=2, tp=2, ep=2, etp=2), id="dp2xtp2-ep2xetp2-folded"),
        pytest.param(ParallelConfig(tp=2, ep=2, sequence_parallel=True), id="tp2-sp-ep2"),
    ],
)
def test_expert_parallel_equals_reference(config: ParallelConfig) -> None:
    results = _run(make_plan(config))
    assert_equal_to_reference(results)
    # Each EP rank holds only its own experts (8 experts / ep).
    local = {tuple(r["local_experts"]) for r in results}
    assert len(local) == config.ep and all(len(experts) == 8 // config.ep for experts in local)


@pytest.mark.distributed
def test_replicated_experts_equal_reference() -> None:
    """Hot experts with replicas (EPLB placement): tokens split over replicas, gradients summed."""
    load = np.array([40.0, 1, 1, 1, 30, 1, 1, 1])
    plan = make_plan(ParallelConfig(dp=4, ep=2), num_redundant_experts=2, expert_load=load)
    results = _run(plan)
    assert_equal_to_reference(results)
    # Replicas split an expert's tokens round-robin: within one EP group, each sender's share to
    # two replicas differs by at most one token per MoE layer (3 layers, 2 senders).
    replicated = [
        (e, ranks)
        for e, ranks in enumerate(plan.expert_placement.expert_to_ranks)
        if len(ranks) > 1
    ]
    assert replicated
    for expert, ranks in replicated:
        for edp in (0, 1):
            holders = [
                r["received_tokens"][expert]
                for r in results
                if r["edp"] == edp and expert in r["local_experts"]
            ]
            assert len(holders) == len(ranks), (expert, holders)
            assert min(holders) > 0 and max(holders) - min(holders) <= 2 * 3, (expert, holders)


@pytest.mark.distributed
def test_negative_control_without_expert_gradient_sync_fails() -> None:
    """The same check catches a broken sync: expert gradients not summed over edp."""
    failures = worst(_run(make_plan(ParallelConfig(dp=4, ep=2)), skip_expert_sync=True))
    assert failures["grad"][0] > 100 * GRAD_RTOL, failures["grad"]
    assert ".experts." in failures["grad"][1]


def test_placement_that_does_not_fit_the_module_is_rejected() -> None:
    from autoparallel.plan import ExpertPlacement
    from autoparallel.runtime._expert_dispatch import expert_placement_for

    plan = make_plan(ParallelConfig(dp=2, ep=2))
    with pytest.raises(
        ValueError,
        match=r"expert_placement.num_experts \(8\) differs from the module's experts \(16\)",
    ):
        expert_placement_for(plan, num_experts=16)
    bad = ExpertPlacement(num_experts=8, ep=2, expert_to_ranks=((0,),) * 7 + ((2,),))
    with pytest.raises(
        ValueError, match=r"expert_to_ranks\[7\] \(\(2,\)\) must list EP ranks in \[0, 2\)"
    ):
        expert_placement_for(plan.model_copy(update={"expert_placement": bad}), num_experts=8)
    with pytest.raises(ValueError, match=r"expert_placement.ep \(2\) differs from config.ep \(4\)"):
        expert_placement_for(
            plan.model_copy(update={"config": ParallelConfig(dp=4, ep=4)}), num_experts=8
        )


def test_expert_tp_needs_divisible_projections() -> None:
    from torch import nn

    from autoparallel.runtime._expert_parallel import _shard_expert

    expert = nn.Module()
    expert.gate_proj = nn.Linear(4, 6, bias=False)
    with pytest.raises(
        ValueError, match=r"experts.0.gate_proj.weight dim 0 \(6\) must be divisible by etp \(4\)"
    ):
        _shard_expert(expert, name="experts.0", rank=0, parts=4)


def _few_tokens_case(rank: int, world_size: int, plan_json: str, block, tokens_per_replica) -> dict:
    import torch

    from autoparallel.runtime import build_meshes
    from autoparallel.runtime._expert_parallel import apply_expert_parallel

    plan = ap.load_plan(plan_json)
    meshes = build_meshes(plan, device_type="cpu")
    reference = copy.deepcopy(block)
    wrapper = torch.nn.ModuleDict({"mlp": block})
    expert_parallel = apply_expert_parallel(
        wrapper, plan=plan, moe_mesh=meshes.moe, dense_mesh=meshes.dense
    )
    count = tokens_per_replica[meshes.coordinate("dp")]
    x = torch.randn(
        1, count, block.gate.weight.shape[1], generator=torch.Generator().manual_seed(count)
    )
    x_local, x_reference = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = wrapper["mlp"](x_local)
    expected = reference(x_reference)
    out.square().sum().backward()
    expected.square().sum().backward()
    error = _relative(out, expected) if count else 0.0
    grad_error = _relative(x_local.grad, x_reference.grad) if count else 0.0
    return {
        "out": error,
        "grad": grad_error,
        "shape": tuple(out.shape),
        "experts": expert_parallel.local_experts,
    }


@pytest.mark.distributed
def test_ranks_with_few_or_no_tokens_take_part() -> None:
    """Decoding: one token on a tp pair leaves one rank of the split empty, and a replica may have
    no request at all; dispatch, expert TP and combine still match the local block."""
    import torch

    from autoparallel.runtime import MoEBlock

    plan = make_plan(ParallelConfig(dp=2, tp=2, ep=2, etp=2))
    block = MoEBlock(ap.get_model("tiny-moe"), scoring="softmax")
    generator = torch.Generator().manual_seed(0)
    for parameter in block.parameters():
        parameter.data.normal_(0, 0.1, generator=generator)
    for tokens in ((1, 0), (0, 3)):
        results = run_ranks(_few_tokens_case, 4, args=(plan.to_json(), block, tokens), timeout_s=60)
        assert (
            max(r["out"] for r in results) <= GRAD_RTOL
            and max(r["grad"] for r in results) <= GRAD_RTOL
        ), results
        assert [r["shape"][1] for r in results] == [tokens[0]] * 2 + [tokens[1]] * 2
