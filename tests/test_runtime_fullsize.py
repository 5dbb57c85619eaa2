"""Full-size ref-3t-moe on the meta device: parameter count, and a 1,024-rank plan applied with the
``fake`` process-group backend (one process, shapes only)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import autoparallel as ap
from cost_model import ParallelConfig

torch = pytest.importorskip("torch")

WORLD_SIZE = 1024
CONFIG = ParallelConfig(pp=8, dp=16, tp=8, ep=64, etp=2, sequence_parallel=True, zero_stage=0, pipeline_schedule="1f1b")
BYTES_PER_PARAMETER = 2  # bf16 weights


@pytest.fixture(scope="module")
def spec():
    return ap.get_model("ref-3t-moe")


@pytest.fixture(scope="module")
def plan(spec):
    from autoparallel.testing import plan_for_config

    return plan_for_config(spec, CONFIG)


@pytest.fixture(scope="module")
def global_shapes(spec):
    """Unsharded shape of every parameter, by FQN with layer and expert ids normalized."""
    from autoparallel.runtime import ReferenceMoETransformer

    small = spec.model_copy(update={"num_layers": spec.moe.num_dense_layers + 1})
    model = ReferenceMoETransformer(small, device="meta")
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def _global_name(name: str, spec) -> str:
    match = re.match(r"model\.layers\.(\d+)\.(.*)", name)
    if not match:
        return name
    layer = int(match.group(1))
    representative = layer if layer < spec.moe.num_dense_layers else spec.moe.num_dense_layers
    return f"model.layers.{representative}.{match.group(2)}"


def _expected_local_shape(name: str, shape: tuple[int, ...], config: ParallelConfig) -> tuple[int, ...]:
    """The plan's split of one weight: tp colwise -> dim 0, tp rowwise -> dim 1 (vocabulary on
    the embedding), expert TP -> the same over etp; everything else whole."""
    local = list(shape)
    colwise = (".q_b_proj.", ".kv_b_proj.", ".mlp.gate_proj.", ".mlp.up_proj.", "shared_experts.gate_proj.",
               "shared_experts.up_proj.", "lm_head.", "embed_tokens.")
    rowwise = (".o_proj.", ".mlp.down_proj.", "shared_experts.down_proj.")
    if ".experts." in name and "shared_experts" not in name:
        dim = 1 if ".down_proj." in name else 0
        local[dim] //= config.etp
    elif any(key in name for key in colwise):
        local[0] //= config.tp
    elif any(key in name for key in rowwise):
        local[1] //= config.tp
    return tuple(local)


def _predicted_weight_bytes(spec, plan, stage: int) -> float:
    from cost_model._common import STAGES, parameters_per_device
    from cost_model._table import configs_to_table

    parts = parameters_per_device(model=spec, table=configs_to_table([plan.config]))
    row = STAGES.index("first" if stage == 0 else "last" if stage == plan.config.pp - 1 else "middle")
    return float(sum(part[row, 0] for part in parts.values())) * BYTES_PER_PARAMETER


def _apply_on_rank(rank: int, spec, plan, model=None):
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from autoparallel.runtime import ReferenceMoETransformer, apply_plan

    dist.init_process_group("fake", rank=rank, world_size=WORLD_SIZE, store=FakeStore())
    try:
        if model is None:
            model = ReferenceMoETransformer(spec, device="meta")
        loss_fn = lambda logits, target: F.cross_entropy(logits.flatten(0, 1), target.flatten())  # noqa: E731
        applied = apply_plan(model, plan, loss_fn=loss_fn, num_micro_batches=8)
        shapes = {}
        for module in applied.modules:
            for name, parameter in module.named_parameters():
                local = parameter.to_local() if hasattr(parameter, "to_local") else parameter
                shapes[name] = (tuple(parameter.shape), tuple(local.shape))
        coordinates = {axis: applied.meshes.coordinate(axis) for axis in ("pp", "dp", "tp", "ep", "etp")}
        return shapes, coordinates
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_full_size_parameter_count_and_1024_rank_plan(spec, plan, global_shapes):
    from autoparallel.runtime import ReferenceMoETransformer

    full = ReferenceMoETransformer(spec, device="meta")
    assert sum(p.numel() for p in full.parameters()) == spec.num_parameters == 3_001_753_706_496

    # The first rank (first stage, reusing the counted model) and the last rank (last stage, other
    # dp/tp/ep/etp coordinates). Every rank of a stage holds the same shapes; which experts it
    # holds follows its ep coordinate, checked here against the plan's placement.
    for rank, model in ((0, full), (WORLD_SIZE - 1, None)):
        shapes, coordinates = _apply_on_rank(rank, spec, plan, model)
        stage = coordinates["pp"]
        chunk = next(s for s in plan.stages if s.stage == stage)
        layers = {int(m.group(1)) for name in shapes if (m := re.match(r"model\.layers\.(\d+)\.", name))}
        assert layers == set(range(chunk.start_layer, chunk.stop_layer))
        assert ("model.embed_tokens.weight" in shapes) == chunk.has_embedding
        assert ("lm_head.weight" in shapes) == chunk.has_lm_head
        held = {e for e, ranks in enumerate(plan.expert_placement.expert_to_ranks) if coordinates["ep"] in ranks}
        for layer in layers - set(range(spec.moe.num_dense_layers)):
            experts = {int(m.group(1)) for name in shapes if (m := re.match(rf"model\.layers\.{layer}\.mlp\.experts\.(\d+)\.", name))}
            assert experts == held and len(held) == spec.moe.num_routed_experts // CONFIG.ep
        local_elements = 0
        for name, (_, local_shape) in shapes.items():
            reference_shape = global_shapes[_global_name(name, spec)]
            assert local_shape == _expected_local_shape(name, reference_shape, CONFIG), name
            local_elements += int(np.prod(local_shape))
        predicted = _predicted_weight_bytes(spec, plan, stage)
        assert local_elements * BYTES_PER_PARAMETER == pytest.approx(predicted, rel=0.01), (rank, stage)
