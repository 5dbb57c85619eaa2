"""Helpers to run multi-rank torch.distributed code in one test process (fork + gloo on 127.0.0.1)."""

from autoparallel.runtime import RankFailure, free_port, run_ranks
from autoparallel.testing._kernel_tables import deepseek_moe_row, import_synthetic_table
from autoparallel.testing._parity import (
    GRADIENT_TOLERANCE,
    PARAMETER_TOLERANCE,
    assert_parity,
    full_tensor,
    parameter_errors,
    reference_step,
    relative_error,
    worst_error,
)
from autoparallel.testing._plans import plan_for_config
from autoparallel.testing._routing import skew_routers
from autoparallel.testing._serving import serving_row
from autoparallel.testing._transformers import (
    TINY_SHAPE,
    TINY_TRANSFORMERS,
    tiny_transformers_model,
)

__all__ = [
    "TINY_SHAPE",
    "TINY_TRANSFORMERS",
    "tiny_transformers_model",
    "GRADIENT_TOLERANCE",
    "PARAMETER_TOLERANCE",
    "RankFailure",
    "assert_parity",
    "deepseek_moe_row",
    "free_port",
    "full_tensor",
    "import_synthetic_table",
    "parameter_errors",
    "plan_for_config",
    "reference_step",
    "relative_error",
    "run_ranks",
    "serving_row",
    "skew_routers",
    "worst_error",
]
