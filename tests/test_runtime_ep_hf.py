"""Expert parallel on a user module with HuggingFace Mixtral / Qwen-MoE names and routing.

The module below is written the way HuggingFace's ``modeling_mixtral.py`` (per-expert modules)
lays a sparse block out: ``block_sparse_moe.gate`` (Linear router), ``block_sparse_moe.experts.E``
with ``w1`` (gate), ``w3`` (up), ``w2`` (down), ``top_k``, a forward that loops over experts and
returns ``(hidden, router_logits)``. Expert parallel must reproduce its outputs and gradients.
"""

from __future__ import annotations

import copy

import pytest
from test_runtime_ep import GRAD_RTOL, make_plan

from autoparallel.testing import run_ranks
from cost_model import ParallelConfig

HIDDEN, FFN, EXPERTS, TOP_K, TOKENS = 16, 8, 8, 2, 24


def _module(norm_topk_prob: bool | None):
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Expert(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w1 = nn.Linear(HIDDEN, FFN, bias=False)
            self.w3 = nn.Linear(HIDDEN, FFN, bias=False)
            self.w2 = nn.Linear(FFN, HIDDEN, bias=False)

        def forward(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class SparseBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.top_k = TOP_K
            if norm_topk_prob is not None:
                self.norm_topk_prob = norm_topk_prob
            self.gate = nn.Linear(HIDDEN, EXPERTS, bias=False)
            self.experts = nn.ModuleList(Expert() for _ in range(EXPERTS))

        def forward(self, hidden_states):
            tokens = hidden_states.reshape(-1, HIDDEN)
            router_logits = self.gate(tokens)
            weights, selected = F.softmax(router_logits, dim=1, dtype=torch.float).topk(
                self.top_k, dim=-1
            )
            if getattr(self, "norm_topk_prob", True):
                weights = weights / weights.sum(dim=-1, keepdim=True)
            out = torch.zeros_like(tokens)
            for index, expert in enumerate(self.experts):
                token, slot = torch.where(selected == index)
                out = out.index_add(0, token, expert(tokens[token]) * weights[token, slot, None])
            return out.view_as(hidden_states), router_logits

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block_sparse_moe = SparseBlock()

        def forward(self, h):
            out, _ = self.block_sparse_moe(h)
            return h + out

    torch.manual_seed(3)
    return nn.Sequential(Layer(), Layer())


def _case(rank: int, world_size: int, plan_json: str, norm_topk_prob) -> dict:
    import torch

    import autoparallel as ap
    from autoparallel.runtime import build_meshes
    from autoparallel.runtime._expert_parallel import apply_expert_parallel

    plan = ap.load_plan(plan_json)
    reference = _module(norm_topk_prob)
    model = copy.deepcopy(reference)
    meshes = build_meshes(plan, device_type="cpu")
    expert_parallel = apply_expert_parallel(
        model, plan=plan, moe_mesh=meshes.moe, dense_mesh=meshes.dense
    )
    x = torch.randn(2, TOKENS // 2, HIDDEN, generator=torch.Generator().manual_seed(5))
    out, logits = model[0].block_sparse_moe(x)
    reference_out, reference_logits = reference[0].block_sparse_moe(x)
    model(x).square().mean().backward()
    reference(x).square().mean().backward()
    expert_parallel.sync_gradients()
    references = dict(reference.named_parameters())
    worst = max(
        float(
            (p.grad - _slice(name, references[name].grad, p, plan, meshes)).abs().max()
            / references[name].grad.abs().max()
        )
        for name, p in model.named_parameters()
    )
    return {
        "out": float((out - reference_out).abs().max() / reference_out.abs().max()),
        "logits": float((logits - reference_logits).abs().max()),
        "grad": worst,
        "names": sorted(name for name, _ in model.named_parameters()),
    }


def _slice(name, tensor, local, plan, meshes):
    if local.shape == tensor.shape:
        return tensor
    return tensor.chunk(plan.config.etp, dim=1 if name.endswith("w2.weight") else 0)[
        meshes.coordinate("etp")
    ]


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("config", "norm_topk_prob"),
    [
        pytest.param(ParallelConfig(tp=2, ep=2), None, id="mixtral-tp2-ep2"),
        pytest.param(
            ParallelConfig(tp=4, ep=2, etp=2), False, id="qwen3-unnormalized-tp4-ep2xetp2"
        ),
    ],
)
def test_huggingface_named_block_equals_its_own_forward(
    config: ParallelConfig, norm_topk_prob
) -> None:
    import autoparallel.runtime  # noqa: F401 - imported once here, not in every forked rank

    plan = make_plan(config).model_copy(update={"module_rules": ()})
    results = run_ranks(
        _case, config.world_size, args=(plan.to_json(), norm_topk_prob), timeout_s=120
    )
    for result in results:
        assert (
            result["out"] <= GRAD_RTOL and result["logits"] <= 1e-6 and result["grad"] <= GRAD_RTOL
        ), result
    # Each EP rank keeps its experts only: the HF names stay (block_sparse_moe.experts.E.w1...).
    held = {
        name.split(".experts.")[1].split(".")[0]
        for name in results[0]["names"]
        if ".experts." in name
    }
    assert len(held) == EXPERTS // config.ep


def test_block_without_dispatcher_or_topk_routing_is_rejected() -> None:
    from torch import nn

    from autoparallel.runtime._expert_parallel import _route_through_dispatcher

    block = nn.Module()
    block.experts = nn.ModuleList([nn.Linear(2, 2)])
    with pytest.raises(
        ValueError, match=r"MoE block 'layers.0.mlp' \(Module\) has no 'dispatcher' attribute"
    ):
        _route_through_dispatcher(block, name="layers.0.mlp")
