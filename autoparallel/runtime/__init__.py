"""The torch side of autoparallel: the reference MoE transformer, device meshes and ``apply_plan``.

Importing this package imports torch; ``import autoparallel`` does not (it resolves
``autoparallel.apply_plan`` here on first use).
"""

from autoparallel.runtime._apply import AppliedPlan, apply_plan, check_plan_fits
from autoparallel.runtime._attention import KVCache
from autoparallel.runtime._generate import Generation, greedy_generate
from autoparallel.runtime._layers import LocalDispatcher, MoEBlock, RMSNorm, TokenDispatcher
from autoparallel.runtime._mesh import Meshes, build_meshes, default_device_type
from autoparallel.runtime._model import ReferenceMoETransformer, tiny_reference_spec
from autoparallel.runtime._rank_build import RankParts, build_for_rank, rank_parts
from autoparallel.runtime._ranks import RankFailure, free_port, run_ranks

__all__ = [
    "AppliedPlan",
    "Generation",
    "KVCache",
    "RMSNorm",
    "LocalDispatcher",
    "Meshes",
    "MoEBlock",
    "RankFailure",
    "RankParts",
    "ReferenceMoETransformer",
    "TokenDispatcher",
    "apply_plan",
    "build_for_rank",
    "build_meshes",
    "check_plan_fits",
    "default_device_type",
    "free_port",
    "greedy_generate",
    "rank_parts",
    "run_ranks",
    "tiny_reference_spec",
]
