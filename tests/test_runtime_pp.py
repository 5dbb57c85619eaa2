"""Pipeline parallel on gloo ranks equals the single-process reference model.

Stages come from the plan's stage -> layer map (uneven splits included), the schedule is the one
the plan names. The rank-side harness is ``test_runtime_ep.check_case``.
"""

from __future__ import annotations

import pytest
from test_runtime_ep import (
    SEQUENCE_TOKENS,
    SEQUENCES_PER_RANK,
    assert_equal_to_reference,
    check_case,
    fresh_models,
    make_plan,
)

import autoparallel as ap
from autoparallel.testing import run_ranks
from cost_model import ParallelConfig


def _run(plan, **options):
    args = (plan.to_json(), options, *fresh_models(plan))
    return run_ranks(check_case, plan.world_size, args=args, timeout_s=120)


@pytest.mark.distributed
@pytest.mark.parametrize(
    "config",
    [
        pytest.param(ParallelConfig(pp=2, pipeline_schedule="1f1b"), id="pp2-1f1b"),
        pytest.param(
            ParallelConfig(pp=2, pipeline_schedule="gpipe", micro_batch_size=2), id="pp2-gpipe"
        ),
        pytest.param(
            ParallelConfig(
                pp=2, tp=2, ep=2, pipeline_schedule="interleaved_1f1b", virtual_stages=2
            ),
            id="pp2-interleaved-tp2xep2",
        ),
        pytest.param(ParallelConfig(pp=2, pipeline_schedule="zero_bubble"), id="pp2-zero-bubble"),
        pytest.param(ParallelConfig(pp=2, dp=2, ep=2), id="pp2xep2"),
        pytest.param(ParallelConfig(pp=2, tp=2), id="pp2xtp2"),
    ],
)
def test_pipeline_equals_reference(config: ParallelConfig) -> None:
    plan = make_plan(config)
    assert len(plan.stages) == config.pp * config.virtual_stages
    results = _run(plan)
    assert_equal_to_reference(results)
    # The last stage keeps its micro-batches' logits only for the step asked to return them.
    kept = [r["kept_outputs"] for r in results if r["kept_outputs"] is not None]
    micro_batches = plan.config.num_micro_batches(SEQUENCES_PER_RANK * config.dp)
    assert kept and all(k == (micro_batches, 0) for k in kept), (kept, micro_batches)
    _assert_receive_buffers(plan, results, micro_batches)


def _assert_receive_buffers(plan, results, micro_batches: int) -> None:
    """What ``cost_model._memory.pipeline_buffer_bytes`` counts: each chunk but the model's first
    keeps an input buffer per micro-batch, each but the last an output-gradient buffer, each the
    micro-batch's hidden states (a sequence shard under sequence parallelism)."""
    config = plan.config
    last = config.pp * config.virtual_stages - 1
    hidden = ap.get_model(plan.provenance.model_name).hidden_size
    size = config.micro_batch_size * SEQUENCE_TOKENS * hidden
    size //= config.tp if config.sequence_parallel else 1
    for result in results:
        buffers = result["recv_buffers"]
        chunks = buffers["chunks"]
        per_micro_batch = range(micro_batches)
        assert buffers["inputs"] == [(c, m) for c in chunks if c != 0 for m in per_micro_batch]
        assert buffers["gradients"] == [
            (c, m) for c in chunks if c != last for m in per_micro_batch
        ]
        assert buffers["sizes"] == [size], (buffers["sizes"], size)


def test_uneven_stages_follow_the_plan() -> None:
    """tiny-moe's 4 layers on 3 chunks: the middle chunk holds two layers, each end one."""
    import autoparallel as ap
    from autoparallel.runtime import ReferenceMoETransformer
    from autoparallel.runtime._pipeline import split_stage_modules

    plan = make_plan(ParallelConfig(pp=3))
    spec = ap.get_model("tiny-moe")
    layers = []
    for pp_rank in range(3):
        model = ReferenceMoETransformer(spec, device="meta")
        ((chunk, module),) = split_stage_modules(model, plan=plan, pp_rank=pp_rank)
        layers.append(list(module.model.layers))
        assert (module.model.embed_tokens is not None) == chunk.has_embedding == (pp_rank == 0)
        assert (
            (module.lm_head is not None)
            == (module.model.norm is not None)
            == chunk.has_lm_head
            == (pp_rank == 2)
        )
    assert layers == [["0"], ["1", "2"], ["3"]]


def test_interleaved_chunks_share_the_model_and_drop_other_ranks_layers() -> None:
    import autoparallel as ap
    from autoparallel.runtime import ReferenceMoETransformer
    from autoparallel.runtime._pipeline import split_stage_modules

    plan = make_plan(ParallelConfig(pp=2, pipeline_schedule="interleaved_1f1b", virtual_stages=2))
    model = ReferenceMoETransformer(ap.get_model("tiny-moe"), device="meta")
    first, second = split_stage_modules(model, plan=plan, pp_rank=0)
    assert [first[0].chunk, second[0].chunk] == [0, 2]
    assert list(first[1].model.layers) == ["0"] and list(second[1].model.layers) == ["2"]
    assert first[1].model.layers["0"] is model.model.layers["0"]
    assert (
        list(model.model.layers) == ["0", "2"]
        and model.lm_head is None
        and model.model.embed_tokens is not None
    )


def test_plan_for_another_layer_count_is_rejected() -> None:
    from autoparallel.runtime import ReferenceMoETransformer, tiny_reference_spec
    from autoparallel.runtime._pipeline import split_stage_modules

    plan = make_plan(ParallelConfig(pp=2))
    model = ReferenceMoETransformer(tiny_reference_spec(num_layers=6), device="meta")
    with pytest.raises(ValueError, match=r"module has 6 layers; the plan's stages cover 4"):
        split_stage_modules(model, plan=plan, pp_rank=0)


def test_schedule_and_layout_errors_name_the_rule() -> None:
    from autoparallel.runtime import ReferenceMoETransformer, tiny_reference_spec
    from autoparallel.runtime._pipeline import (
        build_pipeline,
        num_micro_batches_for,
        split_stage_modules,
    )

    tied = ReferenceMoETransformer(tiny_reference_spec(tie_word_embeddings=True), device="meta")
    with pytest.raises(ValueError, match=r"tied embeddings .* not supported with pp > 1"):
        split_stage_modules(tied, plan=make_plan(ParallelConfig(pp=2)), pp_rank=0)
    from autoparallel import get_model
    from autoparallel.testing import plan_for_config

    plan = plan_for_config(
        get_model("tiny-moe"), ParallelConfig(pp=2, micro_batch_size=3)
    )  # a batch of 12
    with pytest.raises(
        ValueError, match=r"local_batch_sequences \(4\) must be divisible by micro_batch_size \(3\)"
    ):
        num_micro_batches_for(plan, local_batch_sequences=4)
    interleaved = make_plan(
        ParallelConfig(pp=2, pipeline_schedule="interleaved_1f1b", virtual_stages=2)
    )
    assert (
        num_micro_batches_for(interleaved) == 4
    )  # the plan's batch: 4 sequences / (dp 1 * micro-batch 1)
    with pytest.raises(ValueError, match=r"num_micro_batches \(3\) must be divisible by pp \(2\)"):
        build_pipeline(
            [], plan=interleaved, pp_group=None, device=None, loss_fn=None, num_micro_batches=3
        )
    with pytest.raises(
        ValueError, match=r"pipeline_schedule \('1f1b'\) runs one chunk per rank; this rank has 2"
    ):
        build_pipeline(
            [(None, None)] * 2,
            plan=plan,
            pp_group=None,
            device=None,
            loss_fn=None,
            num_micro_batches=4,
        )
