"""Helpers to run multi-rank torch.distributed code in one test process (fork + gloo on 127.0.0.1)."""

from autoparallel.testing._multirank import RankFailure, free_port, run_ranks
from autoparallel.testing._plans import plan_for_config
from autoparallel.testing._routing import skew_routers

__all__ = ["RankFailure", "free_port", "plan_for_config", "run_ranks", "skew_routers"]
