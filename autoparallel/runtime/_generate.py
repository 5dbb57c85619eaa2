"""Greedy decoding with a KV cache, for the reference model whole or under an inference plan.

One prefill pass over the prompts fills the cache (MLA: compressed latent + RoPE key per token;
GQA: K and V of the local KV heads), then one decode pass per new token attends to the cache.
Under tensor parallel every rank sees whole logits (the LM head gathers them), so every rank
picks the same tokens; under attention data parallel each rank decodes its own prompts and all
ranks run the same number of steps (their MoE layers exchange tokens at every step).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from autoparallel.runtime._attention import KVCache

__all__ = ["Generation", "greedy_generate"]


@dataclass
class Generation:
    """New tokens (batch, max_new_tokens), the filled cache and the wall time of each phase."""

    tokens: torch.Tensor
    cache: KVCache
    prefill_s: float
    decode_s: float

    @property
    def decode_tokens_per_s(self) -> float:
        """New tokens per second after the first (batch included), this rank."""
        steps = self.tokens.shape[1] - 1
        return (
            self.tokens.shape[0] * steps / self.decode_s if steps > 0 and self.decode_s > 0 else 0.0
        )


def _synchronize(device: torch.device) -> None:
    if device.type not in ("cpu", "meta"):
        torch.get_device_module(device.type).synchronize()


@torch.no_grad()
def greedy_generate(module: nn.Module, prompts: torch.Tensor, *, max_new_tokens: int) -> Generation:
    """Generate ``max_new_tokens`` tokens after each prompt (batch, prompt_tokens), greedily.

    ``module(tokens, cache)`` must return logits (batch, tokens, vocab) and extend ``cache``, as
    ``ReferenceMoETransformer`` (whole or parallelized by ``apply_plan``) does. No early stop:
    every rank runs exactly ``max_new_tokens`` steps.
    """
    if max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens ({max_new_tokens}) must be > 0")
    if prompts.dim() != 2 or prompts.shape[1] == 0:
        raise ValueError(
            f"prompts shape ({tuple(prompts.shape)}) must be (batch, prompt_tokens > 0)"
        )
    # The last new token is never fed back, so the cache holds prompt + max_new_tokens - 1 tokens.
    cache = KVCache(capacity_tokens=prompts.shape[1] + max_new_tokens - 1)
    start = time.perf_counter()
    logits = module(prompts, cache)
    next_token = logits[:, -1].argmax(dim=-1, keepdim=True)
    _synchronize(prompts.device)
    prefill_s = time.perf_counter() - start
    generated = [next_token]
    start = time.perf_counter()
    for _ in range(max_new_tokens - 1):
        logits = module(next_token, cache)
        next_token = logits[:, -1].argmax(dim=-1, keepdim=True)
        generated.append(next_token)
    _synchronize(prompts.device)
    return Generation(
        tokens=torch.cat(generated, dim=1),
        cache=cache,
        prefill_s=prefill_s,
        decode_s=time.perf_counter() - start,
    )
