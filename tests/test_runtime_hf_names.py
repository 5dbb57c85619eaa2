"""A user's own module with HuggingFace llama names is parallelized by the same plan rules.

The module below is written the way ``transformers``' ``modeling_llama.py`` is (names, ModuleList
of layers, ``view(..., -1, head_dim)``), not with this library's reference model.
"""

from __future__ import annotations

import copy

import pytest

from autoparallel.testing import run_ranks

pytestmark = pytest.mark.distributed

HIDDEN, HEADS, KV_HEADS, FFN, VOCAB, LAYERS = 64, 4, 2, 128, 128, 2


def _llama_spec():
    from cost_model import AttentionSpec, ModelSpec

    attention = AttentionSpec(
        kind="gqa", num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HIDDEN // HEADS
    )
    return ModelSpec(
        name="user-llama",
        num_layers=LAYERS,
        hidden_size=HIDDEN,
        vocab_size=VOCAB,
        ffn_hidden_size=FFN,
        attention=attention,
        max_context_tokens=64,
    )


def _user_llama():
    import torch
    import torch.nn.functional as F
    from torch import nn

    head_dim = HIDDEN // HEADS

    class LlamaAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(HIDDEN, HEADS * head_dim, bias=False)
            self.k_proj = nn.Linear(HIDDEN, KV_HEADS * head_dim, bias=False)
            self.v_proj = nn.Linear(HIDDEN, KV_HEADS * head_dim, bias=False)
            self.o_proj = nn.Linear(HEADS * head_dim, HIDDEN, bias=False)

        def forward(self, hidden_states):
            shape = (*hidden_states.shape[:2], -1, head_dim)
            q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
            k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
            v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o_proj(out.transpose(1, 2).reshape(*hidden_states.shape[:2], -1))

    class LlamaMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(HIDDEN, FFN, bias=False)
            self.up_proj = nn.Linear(HIDDEN, FFN, bias=False)
            self.down_proj = nn.Linear(FFN, HIDDEN, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class LlamaDecoderLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = nn.RMSNorm(HIDDEN, eps=1e-6)
            self.self_attn = LlamaAttention()
            self.post_attention_layernorm = nn.RMSNorm(HIDDEN, eps=1e-6)
            self.mlp = LlamaMLP()

        def forward(self, h):
            h = h + self.self_attn(self.input_layernorm(h))
            return h + self.mlp(self.post_attention_layernorm(h))

    class LlamaModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
            self.layers = nn.ModuleList(LlamaDecoderLayer() for _ in range(LAYERS))
            self.norm = nn.RMSNorm(HIDDEN, eps=1e-6)

        def forward(self, input_ids):
            h = self.embed_tokens(input_ids)
            for layer in self.layers:
                h = layer(h)
            return self.norm(h)

    class LlamaForCausalLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = LlamaModel()
            self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

        def forward(self, input_ids):
            return self.lm_head(self.model(input_ids))

    torch.manual_seed(0)
    return LlamaForCausalLM()


def _user_module_rank(rank: int, world_size: int, config_fields: dict) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.distributed.tensor import DTensor

    import autoparallel as ap
    from autoparallel.testing import plan_for_config
    from cost_model import ParallelConfig

    reference = _user_llama()
    model = copy.deepcopy(reference)
    plan = plan_for_config(_llama_spec(), ParallelConfig(**config_fields))
    applied = ap.apply_plan(model, plan)
    tokens = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    expected = reference(tokens)
    F.cross_entropy(expected.flatten(0, 1), tokens.flatten()).backward()
    got = applied.module(tokens)
    F.cross_entropy(got.flatten(0, 1), tokens.flatten()).backward()
    applied.sync_gradients()
    errors = {"logits": float((got - expected).abs().max() / expected.abs().max())}
    sharded = 0
    for (name, parameter), (_, original) in zip(
        model.named_parameters(), reference.named_parameters()
    ):
        grad = (
            parameter.grad.full_tensor() if isinstance(parameter.grad, DTensor) else parameter.grad
        )
        errors[name] = float((grad - original.grad).abs().max() / original.grad.abs().max())
        sharded += isinstance(parameter, DTensor)
    return {"errors": errors, "sharded": sharded}


@pytest.mark.parametrize(
    "config_fields", [{"tp": 2}, {"tp": 2, "sequence_parallel": True}], ids=["tp2", "tp2-sp"]
)
def test_user_llama_module_equals_unsharded(config_fields):
    results = run_ranks(_user_module_rank, 2, args=(config_fields,), timeout_s=90)
    for result in results:
        assert result["sharded"] >= 7 * LAYERS  # q/k/v/o, gate/up/down of every layer are DTensors
        worst = max(result["errors"], key=result["errors"].get)
        assert result["errors"][worst] <= 1e-5, (worst, result["errors"][worst])
