"""Context parallel for transformers' attention modules (``LlamaAttention``, ``DeepseekV3Attention``, ...).

transformers routes every attention module through a function it looks up by the config's
``_attn_implementation`` (``AttentionInterface``); context parallel registers its own,
``autoparallel_context``: it all-gathers the keys and values of this rank's tokens over the cp
group (autograd-aware, ``ContextParallel.gather``: the backward reduce-scatters their gradients)
and attends with the causal mask drawn from the tokens' global positions, as the reference
model's attention does (``_context_parallel``). The backbone numbers a rank's tokens by their
global positions (``position_ids``, given to its rotary embedding), unless the caller passes
its own, and builds no mask (the attention draws it). MLA attends with its expanded keys and
values (transformers expands them before the attention function), more bytes than the latent the
reference model gathers. Sliding-window attention is refused: its window is not drawn here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["IMPLEMENTATION", "apply_transformers_context", "transformers_attention"]

#: The attention implementation name registered with transformers.
IMPLEMENTATION = "autoparallel_context"


def transformers_attention(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """transformers attention modules of ``module``: a causal attention with the config whose
    ``_attn_implementation`` picks its attention function."""
    from autoparallel.runtime._tensor_parallel import walk_modules

    return [
        (name, sub)
        for name, sub in walk_modules(module)
        if hasattr(getattr(sub, "config", None), "_attn_implementation")
        and getattr(sub, "is_causal", False) is True
        and hasattr(sub, "scaling")
        and hasattr(sub, "layer_idx")
    ]


def apply_transformers_context(modules: list[nn.Module], context) -> int:
    """Make every transformers attention module of ``modules`` attend over ``context``'s cp
    group and every backbone number its tokens globally; returns the attention modules set."""
    _register()
    count = 0
    for module in modules:
        for name, attention in transformers_attention(module):
            if getattr(attention, "sliding_window", None):
                raise ValueError(
                    f"{name} ({type(attention).__name__}) attends within a sliding window of "
                    f"{attention.sliding_window} tokens; context parallel draws full causal masks"
                )
            attention.sequence_context = context
            attention.config._attn_implementation = IMPLEMENTATION
            count += 1
        for _, backbone in _backbones(module):
            backbone.register_forward_pre_hook(_global_positions_hook(context), with_kwargs=True)
    return count


def _backbones(module: nn.Module) -> list[tuple[str, nn.Module]]:
    from autoparallel.runtime._tensor_parallel import walk_modules

    return [
        (name, sub)
        for name, sub in walk_modules(module)
        if isinstance(getattr(sub, "rotary_emb", None), nn.Module) and hasattr(sub, "layers")
    ]


def _global_positions_hook(context):
    """Forward pre-hook of a backbone: ``position_ids`` are the global positions of this rank's
    tokens (``ContextParallel.positions``) unless given."""

    def hook(_module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if kwargs.get("position_ids") is not None:
            return args, kwargs
        tokens = kwargs.get("input_ids")
        if tokens is None:
            tokens = kwargs.get("inputs_embeds")
        if tokens is None and args:
            tokens = args[0]
        if tokens is None:
            return args, kwargs
        positions = context.positions(tokens.shape[1], device=tokens.device)
        return args, {**kwargs, "position_ids": positions.unsqueeze(0).expand(tokens.shape[0], -1)}

    return hook


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(IMPLEMENTATION, _context_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, _no_mask)


def _no_mask(*_args, **_kwargs) -> None:
    """The backbone's mask for this implementation: none (the attention draws its own)."""
    return None


def _context_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **_kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention of this rank's queries ``[B, H, S_local, D]`` to every key of the sequence."""
    context = module.sequence_context
    keys, values = context.gather(key.transpose(1, 2), value.transpose(1, 2))
    keys, values = keys.transpose(1, 2), values.transpose(1, 2)
    groups = query.shape[1] // keys.shape[1]
    if groups > 1:  # grouped-query attention: each KV head serves ``groups`` query heads
        keys = keys.repeat_interleave(groups, dim=1)
        values = values.repeat_interleave(groups, dim=1)
    local = query.shape[2]
    queries_at = context.positions(local, device=query.device)
    keys_at = context.key_positions(local, device=query.device)
    visible = keys_at.unsqueeze(0) <= queries_at.unsqueeze(1)
    out = F.scaled_dot_product_attention(
        query,
        keys,
        values,
        attn_mask=visible,
        dropout_p=dropout if module.training else 0.0,
        scale=scaling,
    )
    return out.transpose(1, 2).contiguous(), None
