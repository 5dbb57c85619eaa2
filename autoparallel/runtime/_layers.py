"""Linear, RMSNorm, SwiGLU feed-forward and MoE layers of the reference MoE transformer.

Module names follow HuggingFace's DeepSeek-V3 implementation (``modeling_deepseek_v3.py``)::

    model.layers.N.mlp.{gate_proj, up_proj, down_proj}                         (leading dense layers)
    model.layers.N.mlp.gate                                                    (router)
    model.layers.N.mlp.experts.E.{gate_proj, up_proj, down_proj}               (E = global expert id)
    model.layers.N.mlp.shared_experts.{gate_proj, up_proj, down_proj}

``mlp.experts`` is a ``ModuleDict`` keyed by the global expert id, so expert parallelism can drop
experts without renaming any parameter. ``_Linear`` skips the init at construction;
``ReferenceMoETransformer.init_weights`` initializes every weight.

Formulas: RMSNorm, Zhang & Sennrich (arXiv:1910.07467); SwiGLU, Shazeer (arXiv:2002.05202);
top-k routing with softmax (DeepSeek-V2, arXiv:2405.04434) or sigmoid scores (DeepSeek-V3,
arXiv:2412.19437 sec. 2.1.2).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from cost_model import ModelSpec, MoESpec

__all__ = [
    "FeedForward",
    "LocalDispatcher",
    "MoEBlock",
    "RMSNorm",
    "Router",
    "RouterScoring",
    "TokenDispatcher",
]


RouterScoring = Literal["softmax", "sigmoid"]


class _Linear(nn.Linear):
    """``nn.Linear`` without the init at construction (a 3T model on the meta device builds in
    seconds); ``ReferenceMoETransformer.init_weights`` initializes every weight.

    Sets the attributes ``nn.Linear.__init__`` sets, registering the parameters directly rather
    than through ``Module.__setattr__``: a 3T model has ~180k of these, a rank's part ~500.
    """

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None
    ) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        kw = dict(device=device, dtype=dtype)
        self._parameters["weight"] = nn.Parameter(torch.empty((out_features, in_features), **kw))
        self._parameters["bias"] = nn.Parameter(torch.empty(out_features, **kw)) if bias else None

    def reset_parameters(self) -> None:
        return None


def _linear(
    in_features: int, out_features: int, *, bias: bool = False, device=None, dtype=None
) -> nn.Linear:
    return _Linear(in_features, out_features, bias=bias, device=device, dtype=dtype)


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight``, computed in fp32 (Zhang & Sennrich 2019)."""

    def __init__(self, width: int, *, eps: float = 1e-6, device=None, dtype=None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


class FeedForward(nn.Module):
    """SwiGLU FFN: ``down_proj(silu(gate_proj(x)) * up_proj(x))`` (Shazeer 2020)."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int, *, device=None, dtype=None) -> None:
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.gate_proj = _linear(hidden_size, ffn_hidden_size, **kw)
        self.up_proj = _linear(hidden_size, ffn_hidden_size, **kw)
        self.down_proj = _linear(ffn_hidden_size, hidden_size, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Linear):
    """Top-k router (``mlp.gate``): scores = softmax or sigmoid of ``x @ weight.T``.

    Returns (weights, expert ids), each (tokens, top_k). Sigmoid scores are renormalized over
    the chosen experts (DeepSeek-V3 sec. 2.1.2); softmax scores are used as they are (DeepSeek-V2).
    """

    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        *,
        top_k: int,
        scoring: RouterScoring,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(hidden_size, num_experts, bias=False, device=device, dtype=dtype)
        if scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"router scoring ({scoring!r}) must be 'softmax' or 'sigmoid'")
        self.top_k = top_k
        self.scoring = scoring

    def reset_parameters(self) -> None:
        return None

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(tokens.float(), self.weight.float())
        scores = logits.softmax(dim=-1) if self.scoring == "softmax" else logits.sigmoid()
        weights, expert_ids = scores.topk(self.top_k, dim=-1)
        if self.scoring == "sigmoid":
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.type_as(tokens), expert_ids


class TokenDispatcher(Protocol):
    """Sends each token to its top-k experts and combines their outputs, weighted.

    ``tokens`` (T, hidden), ``weights`` and ``expert_ids`` (T, top_k) with global expert ids,
    ``experts`` maps ``str(global id)`` -> expert module (only the experts this rank holds).
    Returns (T, hidden). Expert parallelism replaces ``MoEBlock.dispatcher`` with an all-to-all
    implementation of this protocol.
    """

    def __call__(
        self,
        tokens: torch.Tensor,
        weights: torch.Tensor,
        expert_ids: torch.Tensor,
        experts: nn.ModuleDict,
    ) -> torch.Tensor: ...


class LocalDispatcher:
    """Every expert is on this rank: gather each expert's tokens, run it, scatter-add back.

    Every expert runs, even on zero tokens, so every expert weight gets a (possibly zero)
    gradient and gradient synchronization sees the same tensors on every rank.
    """

    def __call__(
        self,
        tokens: torch.Tensor,
        weights: torch.Tensor,
        expert_ids: torch.Tensor,
        experts: nn.ModuleDict,
    ) -> torch.Tensor:
        out = torch.zeros_like(tokens)
        for key, expert in experts.items():
            token_index, slot = torch.where(expert_ids == int(key))
            expert_out = expert(tokens[token_index]) * weights[token_index, slot, None]
            out = out.index_add(0, token_index, expert_out)
        return out


class MoEBlock(nn.Module):
    """Routed experts (``experts``, a ``ModuleDict`` keyed by global expert id), shared experts
    and the router ``gate``. ``dispatcher`` moves tokens to experts (``LocalDispatcher`` here).

    ``experts`` (global ids) builds only those routed experts, as an expert-parallel rank holds
    them; ``num_experts`` stays the model's count (the router scores all of them).
    """

    def __init__(
        self,
        spec: ModelSpec,
        *,
        scoring: RouterScoring,
        experts: Iterable[int] | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        moe: MoESpec = spec.moe
        h, kw = spec.hidden_size, dict(device=device, dtype=dtype)
        self.num_experts = moe.num_routed_experts
        self.gate = Router(h, moe.num_routed_experts, top_k=moe.top_k, scoring=scoring, **kw)
        held = _held_ids(experts, moe.num_routed_experts, field="experts")
        self.experts = nn.ModuleDict(
            {str(e): FeedForward(h, moe.expert_ffn_hidden_size, **kw) for e in held}
        )
        self.shared_experts = None
        if moe.num_shared_experts:
            self.shared_experts = FeedForward(h, moe.num_shared_experts * moe.shared_ffn_size, **kw)
        self.shared_expert_gate = _linear(h, 1, **kw) if moe.shared_expert_gate else None
        self.dispatcher: TokenDispatcher = LocalDispatcher()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        weights, expert_ids = self.gate(tokens)
        out = self.dispatcher(tokens, weights, expert_ids, self.experts).view_as(x)
        if self.shared_experts is not None:
            shared = self.shared_experts(x)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return out


def _held_ids(ids: Iterable[int] | None, count: int, *, field: str) -> tuple[int, ...]:
    """``ids`` sorted (all of ``range(count)`` when ``None``); each must lie in ``[0, count)``."""
    if ids is None:
        return tuple(range(count))
    held = tuple(sorted(set(ids)))
    outside = [i for i in held if not 0 <= i < count]
    if outside:
        raise ValueError(f"{field} ({outside}) must be ids in [0, {count})")
    return held
