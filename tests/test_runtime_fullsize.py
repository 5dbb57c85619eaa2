"""Full-size ref-3t-moe on the meta device: parameter count, and a 1,024-rank plan applied on every
rank with the ``fake`` process-group backend (shapes only).

Each rank builds only its own part of the model (``build_for_rank``: its pipeline stage, its
experts), as a real launch does, then ``apply_plan`` shards it; every local parameter shape is
compared with the plan's split and the rank's weight bytes with the cost model's. The ranks are
shared between two forked worker processes.
"""

from __future__ import annotations

import functools
import gc
import math
import multiprocessing
import os
import re

import pytest
import torch

import autoparallel as ap
from cost_model import ParallelConfig

WORLD_SIZE = 1024
CONFIG = ParallelConfig(
    pp=8, dp=16, tp=8, ep=64, etp=2, sequence_parallel=True, zero_stage=0, pipeline_schedule="1f1b"
)
BYTES_PER_PARAMETER = 2  # bf16 weights
WORKERS = 2
TIMEOUT_S = 900


@pytest.fixture(scope="module")
def spec():
    return ap.get_model("ref-3t-moe")


@pytest.fixture(scope="module")
def plan(spec):
    from autoparallel.testing import plan_for_config

    return plan_for_config(spec, CONFIG)


def _global_shapes(spec) -> dict[str, tuple[int, ...]]:
    """Unsharded shape of every parameter, by FQN with layer and expert ids normalized."""
    from autoparallel.runtime import ReferenceMoETransformer

    small = spec.model_copy(update={"num_layers": spec.moe.num_dense_layers + 1})
    model = ReferenceMoETransformer(small, experts=[0], device="meta")
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def _global_name(name: str, spec) -> str:
    match = re.match(r"model\.layers\.(\d+)\.(.*)", name)
    if not match:
        return name
    layer = int(match.group(1))
    representative = layer if layer < spec.moe.num_dense_layers else spec.moe.num_dense_layers
    name = f"model.layers.{representative}.{match.group(2)}"
    return re.sub(r"\.experts\.\d+\.", ".experts.0.", name)


def _expected_local_shape(
    name: str, shape: tuple[int, ...], config: ParallelConfig
) -> tuple[int, ...]:
    """The plan's split of one weight: tp colwise -> dim 0, tp rowwise -> dim 1 (vocabulary on
    the embedding), expert TP -> the same over etp; everything else whole."""
    local = list(shape)
    colwise = (
        ".q_b_proj.",
        ".kv_b_proj.",
        ".mlp.gate_proj.",
        ".mlp.up_proj.",
        "shared_experts.gate_proj.",
        "shared_experts.up_proj.",
        "lm_head.",
        "embed_tokens.",
    )
    rowwise = (".o_proj.", ".mlp.down_proj.", "shared_experts.down_proj.")
    if ".experts." in name and "shared_experts" not in name:
        dim = 1 if ".down_proj." in name else 0
        local[dim] //= config.etp
    elif any(key in name for key in colwise):
        local[0] //= config.tp
    elif any(key in name for key in rowwise):
        local[1] //= config.tp
    return tuple(local)


def _predicted_weight_bytes(spec, plan) -> dict[int, float]:
    """The cost model's weight bytes per device, by pipeline stage."""
    from cost_model._stages import STAGES, parameters_per_device
    from cost_model._table import configs_to_table

    parts = parameters_per_device(model=spec, table=configs_to_table([plan.config]))

    def row(stage: int) -> int:
        return STAGES.index(
            "first" if stage == 0 else "last" if stage == plan.config.pp - 1 else "middle"
        )

    return {
        stage: float(sum(part[row(stage), 0] for part in parts.values())) * BYTES_PER_PARAMETER
        for stage in range(plan.config.pp)
    }


def _apply_on_rank(rank: int, spec, plan, expected_shape) -> dict:
    """Build rank ``rank``'s part, apply the plan under a fake process group, and check every
    local parameter shape against the plan's split; returns what the parent asserts on."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from autoparallel.runtime import apply_plan, build_for_rank

    dist.init_process_group("fake", rank=rank, world_size=WORLD_SIZE, store=FakeStore())
    try:
        model = build_for_rank(spec, plan, rank=rank, device="meta")

        def loss_fn(logits, target):
            return F.cross_entropy(logits.flatten(0, 1), target.flatten())

        applied = apply_plan(model, plan, loss_fn=loss_fn, num_micro_batches=8)
        mismatches, local_elements, experts, names = [], 0, {}, []
        for name, parameter in applied.module.named_parameters():
            local = tuple(
                (parameter.to_local() if hasattr(parameter, "to_local") else parameter).shape
            )
            if local != expected_shape(name):
                mismatches.append((name, local, expected_shape(name)))
            local_elements += math.prod(local)
            names.append(name)
            if match := re.match(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.", name):
                experts.setdefault(int(match.group(1)), set()).add(int(match.group(2)))
        pp, dp, _, tp = applied.meshes.dense.get_coordinate()
        _, _, ep, etp = applied.meshes.moe.get_coordinate()
        return {
            "rank": rank,
            "coordinates": {"pp": pp, "dp": dp, "tp": tp, "ep": ep, "etp": etp},
            "layers": {
                int(m.group(1))
                for name in names
                if (m := re.match(r"model\.layers\.(\d+)\.", name))
            },
            "embedding": "model.embed_tokens.weight" in names,
            "lm_head": "lm_head.weight" in names,
            "experts": experts,
            "mismatches": mismatches,
            "local_elements": local_elements,
            "pipeline_stage": applied.pipeline.stages[0].stage_index,
        }
    finally:
        dist.destroy_process_group()


def _apply_on_ranks(ranks: list[int], spec, plan, global_shapes) -> list[dict]:
    """One worker's ranks. Cyclic garbage collection runs every 32 ranks instead of whenever its
    thresholds trip (each rank makes ~3,000 process groups; automatic passes cost ~15%)."""

    @functools.cache  # ranks of one stage share names
    def expected_shape(name: str) -> tuple[int, ...]:
        return _expected_local_shape(name, global_shapes[_global_name(name, spec)], plan.config)

    torch.set_num_threads(1)
    gc.freeze()
    gc.disable()
    results = []
    for index, rank in enumerate(ranks):
        results.append(_apply_on_rank(rank, spec, plan, expected_shape))
        if index % 32 == 31:
            gc.collect()
    return results


@pytest.mark.slow
def test_full_size_parameter_count(spec):
    from autoparallel.runtime import ReferenceMoETransformer

    full = ReferenceMoETransformer(spec, device="meta")
    assert sum(p.numel() for p in full.parameters()) == spec.num_parameters == 3_001_753_706_496


def sampled_ranks() -> list[int]:
    """8 ranks of every pipeline stage (each stage holds 128 consecutive ranks), spread so that
    every tp index and 64 different ep coordinates occur, plus the first and last rank. The sweep
    over all 1,024 ranks is ``benchmarks/rank_sweep.py``."""
    per_stage = WORLD_SIZE // CONFIG.pp
    ranks = {
        stage * per_stage + (17 * k + 2 * stage) % per_stage
        for stage in range(CONFIG.pp)
        for k in range(8)
    }
    return sorted(ranks | {0, WORLD_SIZE - 1})


def apply_on_ranks_in_parallel(ranks: list[int], spec, plan) -> list[dict]:
    global_shapes = _global_shapes(spec)
    workers = max(1, min(WORKERS, os.cpu_count() or 1))
    shares = [ranks[worker::workers] for worker in range(workers)]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        pending = pool.starmap_async(
            _apply_on_ranks, [(share, spec, plan, global_shapes) for share in shares]
        )
        return [result for share in pending.get(timeout=TIMEOUT_S) for result in share]


@pytest.mark.slow
@pytest.mark.distributed  # two forked worker processes share the ranks
def test_1024_rank_plan_applied_on_sampled_ranks(spec, plan):
    ranks = sampled_ranks()
    results = apply_on_ranks_in_parallel(ranks, spec, plan)
    check_rank_results(results, ranks, spec, plan)
    tp_indices = {r["coordinates"]["tp"] for r in results}
    assert tp_indices == set(range(CONFIG.tp)) and {r["coordinates"]["pp"] for r in results} == set(
        range(CONFIG.pp)
    )


def check_rank_results(results: list[dict], ranks: list[int], spec, plan) -> None:
    assert sorted(r["rank"] for r in results) == sorted(ranks)

    predicted = _predicted_weight_bytes(spec, plan)
    placement = plan.expert_placement.expert_to_ranks
    seen_coordinates = set()
    for result in results:
        rank, coordinates = result["rank"], result["coordinates"]
        assert result["mismatches"] == [], (rank, result["mismatches"][:3])
        stage = coordinates["pp"]
        chunk = next(s for s in plan.stages if s.stage == stage)
        assert result["pipeline_stage"] == chunk.chunk
        assert result["layers"] == set(range(chunk.start_layer, chunk.stop_layer)), rank
        assert (
            result["embedding"] == chunk.has_embedding and result["lm_head"] == chunk.has_lm_head
        ), rank
        held = {e for e, ranks in enumerate(placement) if coordinates["ep"] in ranks}
        assert len(held) == spec.moe.num_routed_experts // CONFIG.ep
        moe_layers = result["layers"] - set(range(spec.moe.num_dense_layers))
        assert set(result["experts"]) == moe_layers and all(
            e == held for e in result["experts"].values()
        ), rank
        weight_bytes = result["local_elements"] * BYTES_PER_PARAMETER
        assert weight_bytes == pytest.approx(predicted[stage], rel=0.01), (rank, stage)
        seen_coordinates.add(tuple(coordinates.values()))
    # Every rank sat at its own place in the (pp, dp, tp, ep, etp) grid.
    assert len(seen_coordinates) == len(ranks)
