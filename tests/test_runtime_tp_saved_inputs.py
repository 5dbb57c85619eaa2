"""What a column-parallel linear keeps for its weight gradient under the runtime's DTensor plan.

The cost model prices the column-parallel GEMMs' saved input under sequence parallelism as the
gathered whole sequence where tensor parallel is a DTensor plan
(``FrameworkProfile.tp_saves_gathered_input``; True for ``autoparallel.apply_plan``), and as the
sequence shard under Megatron-core, which gathers it again in backward. A linear keeps the
tensor it was called with (``F.linear``'s autograd saves its input), so this checks what the
runtime calls them with, on two gloo ranks: at tp 2 with sequence parallel each norm of
``tiny-moe`` runs on its sequence shard and every linear reading the model width (the MLA
down-projections, the dense FFN's gate and up projections) on the whole gathered sequence.
"""

from __future__ import annotations

import pytest
from test_runtime_ep import SEQUENCE_TOKENS, SEQUENCES_PER_RANK, fresh_models, make_plan

import autoparallel as ap
from autoparallel.testing import run_ranks
from cost_model import ParallelConfig

#: Linears fed the layer's normed hidden states (column-parallel or replicated down-projections).
WIDTH_READERS = ("q_a_proj", "kv_a_proj_with_mqa", "mlp.gate_proj", "mlp.up_proj")


def _input_sizes(rank: int, world_size: int, plan_json: str, model) -> dict[str, list[int]]:
    import torch

    plan = ap.load_plan(plan_json)
    applied = ap.apply_plan(model, plan, device_type="cpu")
    ids = torch.randint(
        0,
        model.spec.vocab_size,
        (SEQUENCES_PER_RANK, SEQUENCE_TOKENS),
        generator=torch.Generator().manual_seed(0),
    )
    sizes: dict[str, list[int]] = {"norm": [], "linear": []}

    def record(kind: str):
        def hook(_module, args) -> None:
            tensor = args[0]
            local = getattr(tensor, "_local_tensor", tensor)
            sizes[kind].append(int(local.numel()))

        return hook

    for name, module in applied.modules[0].named_modules():
        if name.endswith("input_layernorm") or name.endswith("post_attention_layernorm"):
            module.register_forward_pre_hook(record("norm"))
        elif name.endswith(WIDTH_READERS) and ".experts." not in name:
            module.register_forward_pre_hook(record("linear"))
    applied.modules[0](ids)
    return sizes


@pytest.mark.distributed
def test_a_sequence_parallel_layer_feeds_its_linears_the_gathered_sequence() -> None:
    plan = make_plan(ParallelConfig(tp=2, sequence_parallel=True))
    _, model = fresh_models(plan)
    whole = SEQUENCES_PER_RANK * SEQUENCE_TOKENS * model.spec.hidden_size
    results = run_ranks(_input_sizes, 2, args=(plan.to_json(), model), timeout_s=120)
    for sizes in results:
        layers = model.spec.num_layers
        assert len(sizes["norm"]) == 2 * layers and set(sizes["norm"]) == {whole // 2}, sizes
        # two MLA down-projections per layer, the dense first layer's gate and up projections
        assert len(sizes["linear"]) == 2 * layers + 2 and set(sizes["linear"]) == {whole}, sizes
