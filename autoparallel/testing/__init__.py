"""Helpers to run multi-rank torch.distributed code in one test process (fork + gloo on 127.0.0.1)."""

from autoparallel.testing._multirank import RankFailure, free_port, run_ranks

__all__ = ["RankFailure", "free_port", "run_ranks"]
