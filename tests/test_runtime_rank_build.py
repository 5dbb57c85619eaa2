"""A model built for one rank (``build_for_rank``: its pipeline stage, its experts) is a real path.

Under gloo it trains exactly like the whole model cut by ``apply_plan`` (same logits, loss,
gradients and parameters after AdamW, both equal to the single-process reference), and a part
that is not the rank's own is rejected with a ``ValueError`` naming the difference.
"""

from __future__ import annotations

import pytest
from test_runtime_ep import (
    assert_equal_to_reference,
    check_case,
    fresh_models,
    make_plan,
)

import autoparallel as ap
from autoparallel.testing import run_ranks
from cost_model import ParallelConfig

KEYS = ("logits", "loss", "grad", "param", "checked", "local_experts")


def _rank_built_case(rank: int, world_size: int, plan_json: str, reference) -> dict:
    from autoparallel.runtime import build_for_rank

    plan = ap.load_plan(plan_json)
    model = build_for_rank(reference.spec, plan, rank=rank)
    model.init_weights(seed=7)  # fresh_models' seed: the same values as the whole model's
    result = check_case(rank, world_size, plan_json, {}, reference, model)
    result["built_parameters"] = sum(p.numel() for p in model.parameters())
    return result


@pytest.mark.distributed
@pytest.mark.parametrize(
    "config",
    [
        pytest.param(ParallelConfig(pp=2), id="pp2"),
        pytest.param(ParallelConfig(dp=2, ep=2), id="ep2"),
        pytest.param(ParallelConfig(pp=2, dp=2, ep=2), id="pp2xdp2-ep2"),
        pytest.param(
            ParallelConfig(
                pp=2, tp=2, ep=2, pipeline_schedule="interleaved_1f1b", virtual_stages=2
            ),
            id="pp2-interleaved-tp2xep2",
        ),
    ],
)
def test_rank_built_model_trains_like_the_whole_model(config: ParallelConfig) -> None:
    plan = make_plan(config)
    reference, whole = fresh_models(plan)
    whole_results = run_ranks(
        check_case, plan.world_size, args=(plan.to_json(), {}, reference, whole), timeout_s=120
    )
    built_results = run_ranks(
        _rank_built_case, plan.world_size, args=(plan.to_json(), reference), timeout_s=120
    )
    assert_equal_to_reference(built_results)
    # Same computation as the whole model cut by apply_plan, to the last bit.
    assert [{k: r[k] for k in KEYS} for r in built_results] == [
        {k: r[k] for k in KEYS} for r in whole_results
    ]
    total = sum(p.numel() for p in reference.parameters())
    assert all(r["built_parameters"] < total for r in built_results)


def _meta_part_case(rank: int, world_size: int, plan_json: str, whole) -> dict:
    """The launch path of a large model: the rank's part on meta, apply, to_empty, init_weights."""
    import torch

    from autoparallel.runtime import build_for_rank

    plan = ap.load_plan(plan_json)
    model = build_for_rank(whole.spec, plan, rank=rank, device="meta")
    applied = ap.apply_plan(
        model, plan, loss_fn=lambda logits, target: logits.sum(), device_type="cpu"
    )
    model.to_empty(device="cpu")
    model.init_weights(seed=7)
    expected = dict(whole.named_parameters())
    parameters = [(name, p) for module in applied.modules for name, p in module.named_parameters()]
    equal = all(torch.equal(parameter, expected[name]) for name, parameter in parameters)
    return {"names": [name for name, _ in parameters], "equal": equal}


@pytest.mark.distributed
def test_meta_part_materializes_the_whole_models_values() -> None:
    plan = make_plan(ParallelConfig(pp=2, dp=2, ep=2))
    _, whole = fresh_models(plan)
    results = run_ranks(
        _meta_part_case, plan.world_size, args=(plan.to_json(), whole), timeout_s=120
    )
    assert all(r["equal"] for r in results)
    held = {name for r in results for name in r["names"]}
    assert held == {name for name, _ in whole.named_parameters()}
    assert all(len(r["names"]) < len(held) for r in results)


def test_parts_follow_the_plan() -> None:
    from autoparallel.runtime import ReferenceMoETransformer, build_for_rank, rank_parts

    plan = make_plan(ParallelConfig(pp=2, dp=2, ep=2))
    spec = ap.get_model("tiny-moe")
    whole = dict(ReferenceMoETransformer(spec, device="meta").named_parameters())
    seen = set()
    for rank in range(plan.world_size):
        parts = rank_parts(plan, rank=rank)
        model = build_for_rank(spec, plan, rank=rank, device="meta")
        chunk = next(s for s in plan.stages if s.stage == parts.pp_rank)
        assert parts.layers == tuple(range(chunk.start_layer, chunk.stop_layer))
        assert [int(k) for k in model.model.layers] == list(parts.layers)
        assert (model.model.embed_tokens is not None) == parts.embedding == chunk.has_embedding
        assert (
            (model.lm_head is not None)
            == (model.model.norm is not None)
            == parts.lm_head
            == chunk.has_lm_head
        )
        placement = plan.expert_placement.expert_to_ranks
        expected_experts = tuple(e for e, ranks in enumerate(placement) if parts.ep_rank in ranks)
        assert parts.experts == expected_experts and len(expected_experts) == 4
        for layer in model.model.layers.values():
            if hasattr(layer.mlp, "experts"):
                assert [int(k) for k in layer.mlp.experts] == list(expected_experts)
                assert layer.mlp.num_experts == 8
        for name, parameter in model.named_parameters():
            assert parameter.shape == whole[name].shape, name
            seen.add(name)
    assert seen == set(whole)  # together the ranks hold the whole model


def test_part_weights_equal_the_whole_models() -> None:
    import torch

    from autoparallel.runtime import ReferenceMoETransformer

    spec = ap.get_model("tiny-moe")
    whole = ReferenceMoETransformer(spec)
    whole.init_weights(seed=3)
    part = ReferenceMoETransformer(spec, layers=[2, 3], experts=[1, 6], embedding=False)
    part.init_weights(seed=3)
    expected = dict(whole.named_parameters())
    for name, parameter in part.named_parameters():
        assert torch.equal(parameter, expected[name]), name


def test_a_part_of_another_rank_is_rejected(monkeypatch) -> None:
    from autoparallel.runtime import (
        ReferenceMoETransformer,
        build_for_rank,
        check_plan_fits,
        tiny_reference_spec,
    )

    plan = make_plan(ParallelConfig(pp=2, dp=2, ep=2))
    spec = ap.get_model("tiny-moe")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    check_plan_fits(build_for_rank(spec, plan, rank=3, device="meta"), plan)
    mismatch = r"differs from what the plan gives rank 3: layers: missing \[2, 3\], extra \[0, 1\]"
    with pytest.raises(ValueError, match=mismatch):
        check_plan_fits(build_for_rank(spec, plan, rank=0, device="meta"), plan)
    with pytest.raises(
        ValueError,
        match=r"model.layers.2.mlp.experts: missing \[4, 5, 6, 7\], extra \[0, 1, 2, 3\]",
    ):
        check_plan_fits(build_for_rank(spec, plan, rank=2, device="meta"), plan)
    monkeypatch.delenv("RANK")  # no rank known: the part must be some rank's
    check_plan_fits(build_for_rank(spec, plan, rank=1, device="meta"), plan)
    with pytest.raises(ValueError, match="holds what the plan gives no rank"):
        check_plan_fits(
            ReferenceMoETransformer(spec, layers=[1, 2], lm_head=False, device="meta"), plan
        )
    other = tiny_reference_spec(num_layers=4, hidden_size=128)
    with pytest.raises(ValueError, match="fingerprint .* the plan is for another model"):
        build_for_rank(other, plan, rank=0)
    with pytest.raises(ValueError, match=r"rank \(4\) must be in \[0, world_size = 4\)"):
        build_for_rank(spec, plan, rank=4)


def test_pipeline_and_expert_passes_check_a_part() -> None:
    from torch import nn

    from autoparallel.runtime import ReferenceMoETransformer, build_for_rank
    from autoparallel.runtime._expert_parallel import _local_container
    from autoparallel.runtime._pipeline import split_stage_modules

    plan = make_plan(ParallelConfig(pp=2))
    spec = ap.get_model("tiny-moe")
    part = build_for_rank(spec, plan, rank=1, device="meta")
    ((chunk, module),) = split_stage_modules(part, plan=plan, pp_rank=1)
    assert module is part and chunk.has_lm_head and list(part.model.layers) == ["2", "3"]
    with pytest.raises(
        ValueError, match=r"holds layers \[2, 3\]; the plan gives pipeline rank 0 layers \[0, 1\]"
    ):
        split_stage_modules(build_for_rank(spec, plan, rank=1, device="meta"), plan=plan, pp_rank=0)
    no_head = ReferenceMoETransformer(
        spec, layers=[2, 3], embedding=False, lm_head=False, device="meta"
    )
    with pytest.raises(
        ValueError, match=r"module lacks lm_head; the plan's chunks of pipeline rank 1 include it"
    ):
        split_stage_modules(no_head, plan=plan, pp_rank=1)
    interleaved = make_plan(
        ParallelConfig(pp=2, pipeline_schedule="interleaved_1f1b", virtual_stages=2)
    )
    part = build_for_rank(spec, interleaved, rank=0, device="meta")
    assert (
        list(part.model.layers) == ["0", "2"]
        and part.model.embed_tokens is not None
        and part.lm_head is None
    )
    (first, first_module), (second, second_module) = split_stage_modules(
        part, plan=interleaved, pp_rank=0
    )
    assert [first.chunk, second.chunk] == [0, 2]
    assert list(first_module.model.layers) == ["0"] and list(second_module.model.layers) == ["2"]
    assert second_module.model.embed_tokens is None
    container = nn.ModuleDict({str(e): nn.Linear(2, 2) for e in (0, 1, 5)})
    mismatch = r"holds experts \[0, 1, 5\]; .* are \[0, 1, 2\] \(missing \[2\], extra \[5\]\)"
    with pytest.raises(ValueError, match=mismatch):
        _local_container(container, (0, 1, 2), name="model.layers.1.mlp.experts", num_experts=8)


def test_constructor_rejects_ids_outside_the_model() -> None:
    from autoparallel.runtime import ReferenceMoETransformer, tiny_reference_spec

    spec = tiny_reference_spec()
    with pytest.raises(ValueError, match=r"layers \(\[4\]\) must be ids in \[0, 4\)"):
        ReferenceMoETransformer(spec, layers=[0, 4], device="meta")
    with pytest.raises(ValueError, match=r"experts \(\[8, 9\]\) must be ids in \[0, 8\)"):
        ReferenceMoETransformer(spec, experts=[1, 8, 9], device="meta")
    tied = tiny_reference_spec(tie_word_embeddings=True)
    with pytest.raises(
        ValueError, match=r"embedding \(True\) and lm_head \(False\) must be built together"
    ):
        ReferenceMoETransformer(tied, lm_head=False, device="meta")
