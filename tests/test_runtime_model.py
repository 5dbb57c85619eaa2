"""The reference MoE transformer (one process): parameter counts equal ModelSpec's, HF names,
KV-cache decoding equals full recomputation, routing; and meshes from a plan (fake backend)."""

from __future__ import annotations

import pytest
import torch

import autoparallel as ap
from autoparallel.runtime import KVCache, ReferenceMoETransformer, tiny_reference_spec
from autoparallel.runtime._layers import MoEBlock, Router
from cost_model import ModelSpec, ParallelConfig


def _variants() -> list[ModelSpec]:
    mla = tiny_reference_spec()
    no_q_lora = mla.model_copy(
        update={"attention": mla.attention.model_copy(update={"q_lora_rank": 0})}
    )
    gated = tiny_reference_spec(attention="gqa")
    gated = gated.model_copy(
        update={"qkv_bias": True, "moe": gated.moe.model_copy(update={"shared_expert_gate": True})}
    )
    return [
        mla,
        no_q_lora,
        gated,
        tiny_reference_spec(tie_word_embeddings=True),
        tiny_reference_spec(num_dense_layers=0, num_shared_experts=0),
        tiny_reference_spec(num_shared_experts=2),
    ]


@pytest.mark.parametrize(
    "spec", _variants(), ids=lambda s: f"{s.attention.kind}-{s.fingerprint()[:6]}"
)
def test_parameter_count_equals_model_spec(spec):
    model = ReferenceMoETransformer(spec, device="meta")
    assert sum(p.numel() for p in model.parameters()) == spec.num_parameters


@pytest.mark.parametrize("name", ["tiny-moe", "deepseek-v3"])
def test_catalog_models_on_meta(name):
    spec = ap.get_model(name)
    if name != "tiny-moe":  # keep this test quick: fewer layers, same per-layer shapes
        spec = spec.model_copy(update={"num_layers": spec.moe.num_dense_layers + 1})
    model = ReferenceMoETransformer(spec, device="meta")
    assert sum(p.numel() for p in model.parameters()) == spec.num_parameters


def test_huggingface_deepseek_v3_names():
    spec = tiny_reference_spec(num_layers=2)
    names = {name for name, _ in ReferenceMoETransformer(spec, device="meta").named_parameters()}
    for expected in (
        "model.embed_tokens.weight",
        "model.norm.weight",
        "lm_head.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.self_attn.q_a_proj.weight",
        "model.layers.0.self_attn.q_a_layernorm.weight",
        "model.layers.0.self_attn.q_b_proj.weight",
        "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
        "model.layers.0.self_attn.kv_a_layernorm.weight",
        "model.layers.0.self_attn.kv_b_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.1.mlp.gate.weight",
        "model.layers.1.mlp.experts.7.down_proj.weight",
        "model.layers.1.mlp.shared_experts.up_proj.weight",
    ):
        assert expected in names


def test_unsupported_family_members_are_rejected():
    gpt = ap.get_model("megatron-gpt-1.7b")
    with pytest.raises(ValueError, match="ffn_activation"):
        ReferenceMoETransformer(gpt, device="meta")
    tiny = ap.get_model("tiny-moe")
    gated = tiny.model_copy(
        update={"attention": tiny.attention.model_copy(update={"output_gate": True})}
    )
    with pytest.raises(ValueError, match=r"attention.output_gate \(True\) must be False"):
        ReferenceMoETransformer(gated, device="meta")
    with pytest.raises(ValueError, match=r"attention.variant \('linear'\) must be 'full'"):
        ReferenceMoETransformer(ap.get_model("qwen3.5-397b-a17b"), device="meta")


@pytest.mark.parametrize("attention", ["mla", "gqa"])
@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
def test_cached_decoding_equals_full_forward(attention, scoring):
    spec = tiny_reference_spec(attention=attention, num_layers=3)
    model = ReferenceMoETransformer(spec, router_scoring=scoring)
    model.init_weights(seed=3)
    tokens = torch.randint(0, spec.vocab_size, (2, 10), generator=torch.Generator().manual_seed(0))
    full = model(tokens)
    cache = KVCache(capacity_tokens=10)
    pieces = [model(tokens[:, :6], cache)] + [
        model(tokens[:, i : i + 1], cache) for i in range(6, 10)
    ]
    incremental = torch.cat(pieces, dim=1)
    assert cache.length == 10
    assert (incremental - full).abs().max() <= 1e-5 * full.abs().max()
    with pytest.raises(ValueError, match="capacity_tokens"):
        model(tokens[:, :1], cache)


def test_causality_and_init_is_deterministic():
    spec = tiny_reference_spec(num_layers=2)
    first, second = ReferenceMoETransformer(spec), ReferenceMoETransformer(spec)
    first.init_weights(seed=5)
    second.init_weights(seed=5)
    for (name, a), (_, b) in zip(first.named_parameters(), second.named_parameters()):
        assert torch.equal(a, b), name
    tokens = torch.randint(0, spec.vocab_size, (1, 8))
    changed = tokens.clone()
    changed[0, 5] = (changed[0, 5] + 1) % spec.vocab_size
    a, b = first(tokens), first(changed)
    # Earlier positions do not see a later token (up to GEMM batching: an expert's batch changes).
    assert (a[:, :5] - b[:, :5]).abs().max() <= 1e-6 * a.abs().max()
    assert (a[:, 5:] - b[:, 5:]).abs().max() > 1e-3 * a.abs().max()


def test_router_top_k_and_sigmoid_normalization():
    router = Router(8, 6, top_k=2, scoring="sigmoid")
    torch.nn.init.normal_(router.weight)
    weights, ids = router(torch.randn(5, 8))
    assert ids.shape == (5, 2) and torch.allclose(weights.sum(-1), torch.ones(5))
    softmax = Router(8, 6, top_k=2, scoring="softmax")
    softmax.weight.data.copy_(router.weight.data)
    weights, same_ids = softmax(torch.randn(5, 8))
    assert (weights.sum(-1) < 1).all()
    with pytest.raises(ValueError, match="scoring"):
        Router(8, 6, top_k=2, scoring="relu")  # type: ignore[arg-type]


def test_moe_block_dispatcher_is_swappable():
    spec = tiny_reference_spec(num_layers=2)
    block = MoEBlock(spec, scoring="softmax")
    for parameter in block.parameters():
        torch.nn.init.normal_(parameter, std=0.1)
    x = torch.randn(2, 3, spec.hidden_size)
    calls = []

    def recording(tokens, weights, expert_ids, experts):
        calls.append((tokens.shape, expert_ids.shape, sorted(experts.keys(), key=int)))
        return torch.zeros_like(tokens)

    expected_shared = block.shared_experts(x)
    block.dispatcher = recording
    out = block(x)
    assert calls == [((6, spec.hidden_size), (6, spec.moe.top_k), [str(e) for e in range(8)])]
    assert torch.allclose(out, expected_shared)


def test_meshes_follow_rank_to_device_with_fake_backend():
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from autoparallel.runtime import build_meshes, default_device_type
    from autoparallel.testing import plan_for_config
    from topology._placement import placement_for_order

    spec = tiny_reference_spec(num_layers=2)
    plan = plan_for_config(spec, ParallelConfig(pp=2, dp=2, tp=2, ep=4, etp=1))
    # dp varies fastest over devices, then tp, then pp (a topology placement).
    order = tuple(int(r) for r in placement_for_order(sizes=(2, 2, 1, 2), order=(1, 3, 2, 0)))
    assert order == (0, 2, 1, 3, 4, 6, 5, 7)
    plan = plan.model_copy(update={"rank_to_device": order})
    assert default_device_type() == "cpu"
    dist.init_process_group("fake", rank=2, world_size=8, store=FakeStore())
    try:
        meshes = build_meshes(plan, device_type="cpu")
        expected = torch.tensor(order).view(2, 2, 1, 2)
        assert torch.equal(meshes.dense.mesh, expected)
        assert torch.equal(meshes.moe.mesh, expected.reshape(2, 1, 4, 1))
        assert meshes.dense.mesh_dim_names == ("pp", "dp", "cp", "tp")
        assert meshes.moe.mesh_dim_names == ("pp", "edp", "ep", "etp")
        # rank 2 sits at mesh position 1: pp 0, dp 0, tp 1; its ep group is {0, 2, 1, 3}
        assert {axis: meshes.coordinate(axis) for axis in ("pp", "dp", "tp", "ep")} == {
            "pp": 0,
            "dp": 0,
            "tp": 1,
            "ep": 2,
        }
        assert meshes.device == torch.device("cpu")
        with pytest.raises(ValueError, match=r"backend \('nccl'\) differs"):
            build_meshes(plan, backend="nccl")
        backwards = plan.model_copy(update={"rank_to_device": (1, 0, 2, 3, 4, 5, 6, 7)})
        with pytest.raises(ValueError, match=r"tp group \[1, 0\] out of increasing rank order"):
            build_meshes(backwards)
    finally:
        dist.destroy_process_group()
