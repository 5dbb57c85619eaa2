"""The torch side of autoparallel: the reference MoE transformer and ``apply_plan``.

Importing this package imports torch; ``import autoparallel`` does not (it resolves
``autoparallel.apply_plan`` here on first use).
"""

from autoparallel.runtime._model import (
    KVCache,
    LocalDispatcher,
    MoEBlock,
    ReferenceMoETransformer,
    TokenDispatcher,
    tiny_reference_spec,
)

__all__ = [
    "KVCache",
    "LocalDispatcher",
    "MoEBlock",
    "ReferenceMoETransformer",
    "TokenDispatcher",
    "tiny_reference_spec",
]
