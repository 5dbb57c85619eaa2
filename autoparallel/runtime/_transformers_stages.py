"""Pipeline chunks of a transformers causal LM (``LlamaForCausalLM``, ``Qwen3MoeForCausalLM``, ...).

A transformers model keeps its decoder layers in an ``nn.ModuleList`` that its backbone's forward
slices (``self.layers[: self.config.num_hidden_layers]``) after numbering the positions and
building the causal mask from ``inputs_embeds``, and its ``*ForCausalLM.forward`` needs the
embedding, the final norm and the LM head. ``keyed_layers`` re-holds the layers in a
``KeyedLayers`` (a ``ModuleDict`` keyed by layer id, so a chunk keeps the FQNs
``model.layers.7...`` and the cutting of ``_pipeline`` applies, that slices like the list);
``as_stage`` gives a cut chunk the forward a ``PipelineStage`` calls: token ids into the first
chunk's embedding, the previous chunk's hidden states (as ``inputs_embeds``, so the backbone's own
position and mask code runs on them) into the others, the LM head's logits out of the last. A
chunk without the final norm holds an ``nn.Identity`` in its place.
"""

from __future__ import annotations

import types

import torch
from torch import nn

__all__ = ["KeyedLayers", "as_stage", "is_transformers_causal_lm", "keyed_layers"]


class KeyedLayers(nn.ModuleDict):
    """Decoder layers keyed by layer id that also read as the list a transformers backbone
    iterates: ``layers[i:j]`` is the list of the held layers in id order."""

    def __getitem__(self, key):  # type: ignore[override]
        if isinstance(key, slice):
            return list(self.values())[key]
        return super().__getitem__(key)


def is_transformers_causal_lm(model: nn.Module) -> bool:
    """A transformers causal LM: a backbone ``model`` holding ``embed_tokens``, a ``rotary_emb``
    and decoder ``layers`` (a list, or ``KeyedLayers`` once re-held), and an ``lm_head``."""
    backbone = getattr(model, "model", None)
    return (
        backbone is not None
        and hasattr(backbone, "embed_tokens")
        and isinstance(getattr(backbone, "rotary_emb", None), nn.Module)
        and isinstance(getattr(backbone, "layers", None), (nn.ModuleList, KeyedLayers))
        and hasattr(model, "lm_head")
    )


def keyed_layers(model: nn.Module) -> None:
    """Hold a transformers causal LM's decoder list as ``KeyedLayers`` (the same modules)."""
    backbone = model.model
    if isinstance(backbone.layers, nn.ModuleList):
        backbone.layers = KeyedLayers({str(i): layer for i, layer in enumerate(backbone.layers)})


def as_stage(chunk: nn.Module) -> nn.Module:
    """Give a cut chunk of a transformers causal LM the forward a pipeline stage runs."""
    backbone = chunk.model
    if backbone.norm is None:  # a plain function, not a module: no rule may parallelize it
        del backbone.norm
        backbone.norm = _no_norm
    chunk.forward = types.MethodType(_stage_forward, chunk)
    return chunk


def _no_norm(hidden: torch.Tensor) -> torch.Tensor:
    """The final norm of a chunk that does not end the model: none."""
    return hidden


def _stage_forward(self: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    backbone = self.model
    given = "input_ids" if backbone.embed_tokens is not None else "inputs_embeds"
    hidden = backbone(**{given: inputs}, use_cache=False).last_hidden_state
    return hidden if self.lm_head is None else self.lm_head(hidden)
