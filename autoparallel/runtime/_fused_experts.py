"""Fused expert weights (transformers 5) as per-expert modules, so expert parallel can place them.

transformers 5 stores a MoE block's routed experts as one module of 3-D weights,
``gate_up_proj`` ``[E, 2I, H]`` (the gate projection's rows, then the up projection's) and
``down_proj`` ``[E, H, I]``, called as ``experts(hidden_states, top_k_index, top_k_weights)``
by every sparse block (``modeling_qwen3_moe.py`` ``Qwen3MoeExperts``, ``modeling_mixtral.py``,
``modeling_qwen2_moe.py``, ``modeling_deepseek_v3.py``); the released checkpoints keep one
``experts.E.{gate_proj, up_proj, down_proj}`` per expert, which transformers fuses on load.

``unfuse_experts`` replaces each such module by a ``DispatchedExperts``: a ``ModuleDict`` of
per-expert FFNs keyed by global expert id (parameter names as in the checkpoint files) whose
forward keeps the fused module's signature and sends the tokens through the block's expert
dispatcher (``_expert_dispatch.AllToAllDispatcher``) once expert parallel gives it one. The
routing stays the model's own: its router picks the experts and weights, whatever its rule.
gpt-oss's experts (``GptOssExperts``: ``gate_up_proj [E, H, 2I]`` with the gate and up columns
interleaved, ``down_proj [E, I, H]``, a bias on each, a clamped GLU) become
``ClampedGluExpertFFN``s. Llama 4's (``Llama4TextExperts``, the weights transposed for its
``bmm``) are called with every token for every expert, scaled by its score; its block gets a
forward that sends each token to its chosen experts only (``_routed_forward``). Each
replacement is checked on a few tokens against the fused module it replaces (the layout and
the activation); a fused module with other weights is an error, not a silent approximation.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

__all__ = [
    "DispatchedExperts",
    "ClampedGluExpertFFN",
    "ExpertFFN",
    "is_fused_experts",
    "takes_routing",
    "unfuse_experts",
]

#: Tokens of the check that a replacement computes what the fused module did.
_CHECK_TOKENS = 4
#: The layouts the per-expert forms read, as the check's error names them.
_HALVES = "gate_up_proj's gate rows then up rows with down_proj after act_fn(gate) * up"
_CLAMPED_GLU = (
    "gpt-oss's interleaved gate and up columns of gate_up_proj [E, H, 2I] with their biases, "
    "the clamped GLU and down_proj [E, I, H]"
)


def is_fused_experts(module: nn.Module) -> bool:
    """Whether ``module`` holds routed experts as transformers 5's 3-D ``gate_up_proj`` /
    ``down_proj`` weights."""
    gate_up = getattr(module, "gate_up_proj", None)
    down = getattr(module, "down_proj", None)
    return (
        isinstance(gate_up, nn.Parameter)
        and isinstance(down, nn.Parameter)
        and gate_up.dim() == 3
        and down.dim() == 3
    )


class ExpertFFN(nn.Module):
    """One routed expert: ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``."""

    def __init__(self, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, act_fn) -> None:
        super().__init__()
        requires_grad = gate.requires_grad
        self.gate_proj = _linear(gate, requires_grad)
        self.up_proj = _linear(up, requires_grad)
        self.down_proj = _linear(down, requires_grad)
        self.act_fn = act_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class ClampedGluExpertFFN(nn.Module):
    """One gpt-oss expert (transformers ``GptOssExperts._apply_gate``): biased projections,
    the gate clamped above at ``limit``, the up projection to ``[-limit, limit]``, and
    ``down_proj((up + 1) * gate * sigmoid(alpha * gate))``."""

    def __init__(self, gate, up, down, *, biases, alpha: float, limit: float) -> None:
        super().__init__()
        requires_grad = gate.requires_grad
        self.gate_proj = _linear(gate, requires_grad, bias=biases[0])
        self.up_proj = _linear(up, requires_grad, bias=biases[1])
        self.down_proj = _linear(down, requires_grad, bias=biases[2])
        self.alpha, self.limit = alpha, limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate_proj(x).clamp(max=self.limit)
        up = self.up_proj(x).clamp(min=-self.limit, max=self.limit)
        return self.down_proj((up + 1) * gate * torch.sigmoid(gate * self.alpha))


def _linear(
    weight: torch.Tensor, requires_grad: bool, *, bias: torch.Tensor | None = None
) -> nn.Linear:
    out_features, in_features = weight.shape
    linear = nn.Linear(in_features, out_features, bias=bias is not None, device="meta")
    linear.weight = nn.Parameter(weight.detach().clone(), requires_grad=requires_grad)
    if bias is not None:
        linear.bias = nn.Parameter(bias.detach().clone(), requires_grad=requires_grad)
    return linear


class DispatchedExperts(nn.ModuleDict):
    """Routed experts keyed by global expert id, called as the fused module was:
    ``(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k]) -> [T, H]``, the weighted
    sum of each token's experts. With a ``dispatcher`` (expert parallel sets one) the tokens go
    through it; without one every expert is local and computed here."""

    dispatcher = None

    def forward(  # type: ignore[override]
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        weights = top_k_weights.to(hidden_states.dtype)
        if self.dispatcher is not None:
            return self.dispatcher(hidden_states, weights, top_k_index, self)
        out = torch.zeros_like(hidden_states)
        for key, expert in self.items():
            rows, slots = torch.where(top_k_index == int(key))
            if rows.numel():
                out.index_add_(0, rows, expert(hidden_states[rows]) * weights[rows, slots, None])
        return out

    def with_experts(self, experts: dict[str, nn.Module]) -> DispatchedExperts:
        """The same kind of container over ``experts``, keeping the dispatcher."""
        container = DispatchedExperts(experts)
        container.dispatcher = self.dispatcher
        return container


def unfuse_experts(model: nn.Module, *, dense_routing_only: bool = False) -> list[str]:
    """Replace every fused routed-expert module of ``model`` (``*.experts``, see
    ``is_fused_experts``) by a ``DispatchedExperts`` of the same experts; returns their names.
    A block that runs every token through every expert (Llama 4, ``reroutes_densely``) gets a
    forward that sends each token to its chosen experts only. ``dense_routing_only``: those
    blocks only (tensor parallel needs their forward, not the others' experts split).

    Raises ``ValueError`` naming the module when it holds weights other than ``gate_up_proj``
    and ``down_proj``, when their shapes disagree, or when the per-expert form does not
    reproduce its output on a few tokens (another layout of the fused halves)."""
    fused = [
        (name, module)
        for name, module in model.named_modules()
        if name.rpartition(".")[2] == "experts" and is_fused_experts(module)
    ]
    done = []
    for name, module in fused:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        dense = not takes_routing(module)
        if dense and not reroutes_densely(parent):
            raise ValueError(
                f"{name} ({type(module).__name__}) is called with every token for every expert, "
                f"and its block ({type(parent).__name__}) has no router this can route with"
            )
        if dense_routing_only and not dense:
            continue
        setattr(parent, child, _unfused(name, module))
        if dense:
            parent.forward = _routed_forward(parent)
        done.append(name)
    return done


def reroutes_densely(block: nn.Module) -> bool:
    """A Llama 4 MoE block (transformers ``Llama4TextMoe``): a ``router`` returning each
    token's expert scores (the chosen ones' sigmoids, 0 elsewhere) and logits, ``top_k``, a
    ``shared_expert``; it scales each token by its score before the expert and adds every
    expert's output."""
    return (
        isinstance(getattr(block, "router", None), nn.Module)
        and isinstance(getattr(block, "top_k", None), int)
        and isinstance(getattr(block, "shared_expert", None), nn.Module)
    )


def _routed_forward(block: nn.Module):
    """Llama 4's MoE forward with each token sent to its ``top_k`` experts only: the token scaled
    by its score (the unchosen experts' are 0 and their outputs, biasless, 0), the experts'
    outputs summed, the shared expert's added (out of place)."""

    def forward(hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])
        scores, logits = block.router(tokens)
        weights, chosen = scores.topk(block.top_k, dim=-1)
        scaled = (tokens.unsqueeze(1) * weights.unsqueeze(-1).to(tokens.dtype)).flatten(0, 1)
        ones = torch.ones(scaled.shape[0], 1, dtype=tokens.dtype, device=tokens.device)
        routed = block.experts(scaled, chosen.reshape(-1, 1), ones)
        routed = routed.view(tokens.shape[0], block.top_k, -1).sum(dim=1)
        return block.shared_expert(tokens) + routed, logits

    return forward


def takes_routing(module: nn.Module) -> bool:
    """Whether a fused experts module is called with the routing (``hidden_states,
    top_k_index, top_k_weights``), as every sparse block above calls it; Llama 4's
    (``Llama4TextExperts``) is called with every token repeated for every expert, already
    scaled by its score, which expert parallel cannot dispatch."""
    try:
        parameters = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False
    return len(parameters) >= 3


def _unfused(name: str, module: nn.Module) -> DispatchedExperts:
    if _is_clamped_glu(module):
        replacement = _clamped_glu_experts(module)
        if not module.gate_up_proj.is_meta:
            experts, hidden = module.gate_up_proj.shape[:2]
            _check_same(
                name, module, replacement, experts=experts, hidden=hidden, layout=_CLAMPED_GLU
            )
        return replacement
    others = sorted(
        n for n, _ in module.named_parameters() if n not in ("gate_up_proj", "down_proj")
    )
    if others:
        raise ValueError(
            f"{name} ({type(module).__name__}) holds {others} beside gate_up_proj and down_proj; "
            "expert parallel splits only fused experts of gate/up halves and a down projection"
        )
    gate_up, down = module.gate_up_proj, module.down_proj
    experts = gate_up.shape[0]
    # [E, 2I, H] and [E, H, I] (Qwen, Mixtral, DeepSeek), or transposed (Llama 4's bmm layout)
    transposed = down.shape[1] * 2 == gate_up.shape[2] and down.shape[2] == gate_up.shape[1]
    if transposed:
        gate_up, down = gate_up.transpose(1, 2), down.transpose(1, 2)
    double, hidden = gate_up.shape[1:]
    if double % 2 or down.shape != (experts, hidden, double // 2):
        raise ValueError(
            f"{name}: gate_up_proj {tuple(module.gate_up_proj.shape)} and down_proj "
            f"{tuple(module.down_proj.shape)} must be [E, 2I, H] and [E, H, I], or transposed"
        )
    act_fn = getattr(module, "act_fn", None)
    if act_fn is None:
        raise ValueError(f"{name} ({type(module).__name__}) has no act_fn")
    width = double // 2
    replacement = DispatchedExperts(
        {
            str(e): ExpertFFN(gate_up[e, :width], gate_up[e, width:], down[e], act_fn)
            for e in range(experts)
        }
    )
    if not gate_up.is_meta:
        _check_same(name, module, replacement, experts=experts, hidden=hidden)
    return replacement


def _is_clamped_glu(module: nn.Module) -> bool:
    """gpt-oss's fused experts: ``gate_up_proj [E, H, 2I]`` with the gate and up columns
    interleaved, ``down_proj [E, I, H]``, a bias on each, ``alpha`` and ``limit``."""
    return all(
        isinstance(getattr(module, name, None), nn.Parameter)
        for name in ("gate_up_proj_bias", "down_proj_bias")
    ) and all(isinstance(getattr(module, name, None), (int, float)) for name in ("alpha", "limit"))


def _clamped_glu_experts(module: nn.Module) -> DispatchedExperts:
    gate_up, down = module.gate_up_proj, module.down_proj  # [E, H, 2I], [E, I, H]
    gate_up_bias, down_bias = module.gate_up_proj_bias, module.down_proj_bias
    return DispatchedExperts(
        {
            str(e): ClampedGluExpertFFN(
                gate_up[e, :, ::2].T,
                gate_up[e, :, 1::2].T,
                down[e].T,
                biases=(gate_up_bias[e, ::2], gate_up_bias[e, 1::2], down_bias[e]),
                alpha=float(module.alpha),
                limit=float(module.limit),
            )
            for e in range(gate_up.shape[0])
        }
    )


@torch.no_grad()
def _check_same(
    name: str,
    fused: nn.Module,
    unfused: DispatchedExperts,
    *,
    experts: int,
    hidden: int,
    layout: str = _HALVES,
) -> None:
    """The per-expert form computes what the fused module did, on a few tokens of each of the
    first and the last expert."""
    reference = fused.gate_up_proj
    generator = torch.Generator(device="cpu").manual_seed(0)
    tokens = torch.randn(_CHECK_TOKENS, hidden, generator=generator).to(reference)
    for expert in {0, experts - 1}:
        index = torch.full((_CHECK_TOKENS, 1), expert, dtype=torch.long, device=reference.device)
        weights = torch.ones(_CHECK_TOKENS, 1, dtype=reference.dtype, device=reference.device)
        if takes_routing(fused):
            expected = fused(tokens, index, weights)
        else:  # every expert's tokens stacked, as Llama 4's block feeds them
            stacked = tokens.new_zeros(experts, _CHECK_TOKENS, hidden)
            stacked[expert] = tokens
            expected = fused(stacked.flatten(0, 1)).view(experts, _CHECK_TOKENS, -1)[expert]
        got = unfused(tokens, index, weights)
        scale = expected.abs().max().clamp_min(torch.finfo(expected.dtype).tiny)
        if not (got - expected).abs().max() <= 1e-3 * scale:
            raise ValueError(
                f"{name} ({type(fused).__name__}): its experts are not {layout}; expert parallel "
                "cannot split this layout"
            )
