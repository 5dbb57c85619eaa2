"""The search space holds exactly the legal layouts: checked against a naive enumeration filtered
by the scalar rules of ``cost_model._rules``, and row by row on large spaces."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

import autoparallel as ap
from cost_model import (
    Inference,
    ParallelConfig,
    Training,
    check_parallel_config,
    check_sequence_fits,
)
from search import SearchBounds, SearchSpace
from search._space import config_from_row, cross, divisors, row_extras

TINY_TRAINING = Training(sequence_length_tokens=64, global_batch_sequences=8)


def _naive_training_layouts(
    model, world: int, workload: Training, bounds: SearchBounds, devices_per_node: int
) -> set:
    """Every combination of every field, kept when the scalar rules accept it (the slow way)."""
    legal = set()
    for tp, pp, cp, ep, etp in itertools.product(divisors(world), repeat=5):
        if world % (tp * pp * cp) or tp > devices_per_node or etp > devices_per_node:
            continue
        dp = world // (tp * pp * cp)
        for sp, zero, (schedule, virtual), micro, recompute in itertools.product(
            (False, True),
            bounds.zero_stages,
            [(s, 1) for s in ("gpipe", "1f1b", "zero_bubble")]
            + [("interleaved_1f1b", v) for v in bounds.virtual_stage_choices],
            (1, 2, 4, 8),
            bounds.recompute_policies,
        ):
            if pp == 1 and schedule != "1f1b":
                continue  # the space keeps one canonical schedule when there is no pipeline
            config = ParallelConfig(
                dp=dp,
                tp=tp,
                pp=pp,
                cp=cp,
                ep=ep,
                etp=etp,
                sequence_parallel=sp,
                zero_stage=zero,
                pipeline_schedule=schedule,
                virtual_stages=virtual,
                micro_batch_size=micro,
                recompute=recompute,
            )
            try:
                check_parallel_config(config, model, world)
                check_sequence_fits(config, workload.sequence_length_tokens)
                config.num_micro_batches(workload.global_batch_sequences)
            except ValueError:
                continue
            legal.add(config)
    return legal


def _space_configs(space: SearchSpace) -> list[ParallelConfig]:
    configs = []
    for table in space.iter_chunks(max_rows=5_000):
        configs += [config_from_row(table, i) for i in range(len(table["dp"]))]
    return configs


def test_space_equals_naive_enumeration_of_legal_layouts() -> None:
    model = ap.get_model("tiny-moe")
    bounds = SearchBounds(
        max_micro_batch_size=8, zero_stages=(0, 3), recompute_policies=("none", "full")
    )
    space = SearchSpace(
        model=model, workload=TINY_TRAINING, world_size=8, devices_per_node=4, bounds=bounds
    )
    configs = _space_configs(space)
    assert len(configs) == len(set(configs)) == space.size  # no duplicates, size is the row count
    assert set(configs) == _naive_training_layouts(
        model, 8, TINY_TRAINING, bounds, devices_per_node=4
    )


def test_inference_space_rows_are_legal_and_canonical() -> None:
    model = ap.get_model("tiny-moe")
    workload = Inference(prompt_tokens=32, output_tokens=8)
    space = SearchSpace(model=model, workload=workload, world_size=8, devices_per_node=8)
    mesh = space.mesh
    assert not np.any(
        mesh["attention_data_parallel"] & (mesh["tp"] == 1)
    )  # attention-DP needs tp > 1
    assert np.any(mesh["attention_data_parallel"])
    table = space.expand(np.arange(space.num_meshes))
    for index in range(len(table["dp"])):
        config = config_from_row(table, index)
        check_parallel_config(config, model, 8)
        assert config.pipeline_schedule == "1f1b" and config.zero_stage == 0
        extras = row_extras(table, index)
        assert extras["kv_dtype"] in ("bf16", "fp8")
        assert extras["num_redundant_experts"] % config.ep == 0


@pytest.mark.parametrize("world", [1024, 4096, 16384])
def test_reference_model_space_is_legal_and_fast(world: int) -> None:
    model = ap.get_model("ref-3t-moe")
    workload = Training(sequence_length_tokens=4096, global_batch_tokens=16 * 2**20)
    start = time.perf_counter()
    space = SearchSpace(model=model, workload=workload, world_size=world, devices_per_node=8)
    size = space.size
    elapsed = time.perf_counter() - start
    print(
        f"{world} cards: {space.num_meshes} meshes, {size:,} layouts, enumerated in {elapsed:.2f} s"
    )
    assert size > 1_000_000 and elapsed < 15
    assert set(space.mesh["ep"].tolist()) <= set(divisors(768))
    rng = np.random.default_rng(world)
    table = space.expand(rng.choice(space.num_meshes, size=20, replace=False))
    for index in rng.choice(len(table["dp"]), size=200):
        config = config_from_row(table, int(index))
        check_parallel_config(config, model, world)
        check_sequence_fits(config, workload.sequence_length_tokens)
        config.num_micro_batches(workload.global_batch_sequences)
        assert config.ep * config.etp * config.edp == config.dp * config.cp * config.tp


def test_prime_world_size_keeps_only_what_divides() -> None:
    model = ap.get_model("tiny-moe")  # 4 heads, 4 layers, 8 experts: 7 divides none of them
    workload = Training(sequence_length_tokens=64, global_batch_sequences=14)
    space = SearchSpace(model=model, workload=workload, world_size=7, devices_per_node=8)
    assert set(space.mesh["tp"].tolist()) == {1} and set(space.mesh["pp"].tolist()) == {1}
    assert set(space.mesh["ep"].tolist()) == {1} and set(space.mesh["dp"].tolist()) == {7}
    # 8 sequences do not split over 7 replicas: no layout at all
    assert (
        SearchSpace(model=model, workload=TINY_TRAINING, world_size=7, devices_per_node=8).size == 0
    )


def test_helpers() -> None:
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    with pytest.raises(ValueError, match="n \\(0\\) must be > 0"):
        divisors(0)
    table = cross({"a": np.array([1, 2])}, {"b": np.array([3, 4, 5])})
    assert list(zip(table["a"], table["b"])) == [(1, 3), (1, 4), (1, 5), (2, 3), (2, 4), (2, 5)]
    with pytest.raises(ValueError, match="world_size"):
        SearchSpace(
            model=ap.get_model("tiny-moe"), workload=TINY_TRAINING, world_size=0, devices_per_node=8
        )
