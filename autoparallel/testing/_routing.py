"""Skewed routing for experiments with expert load (tests, benchmarks)."""

from __future__ import annotations

import numpy as np

from autoparallel._expert_placement import zipf_expert_load


def skew_routers(model, *, exponent: float) -> None:  # torch.nn.Module
    """Zipf-like routing: each router (``*.mlp.gate``) sees its input shifted along a direction
    that adds ``log(zipf popularity)`` to its logits; router weights x10 keep routing
    token-dependent. Mutates ``model`` (weights and a forward pre-hook on each router)."""
    import torch

    for name, module in model.named_modules():
        if name.endswith("mlp.gate"):
            with torch.no_grad():
                module.weight.mul_(10.0)
            weight = module.weight.detach().double()
            bias = torch.tensor(
                np.log(zipf_expert_load(num_experts=weight.shape[0], exponent=exponent))
            )
            shift = (weight.T @ torch.linalg.solve(weight @ weight.T, bias)).float()
            module.register_forward_pre_hook(lambda _module, args, shift=shift: (args[0] + shift,))
