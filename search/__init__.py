"""Search over legal parallel layouts with Optuna (ask/tell), plus an exhaustive vectorized baseline.
Never imports torch.

* ``SearchSpace``: every legal layout of (model, world size, workload) as numpy tables.
* ``find_plan``: the Optuna study (TPE by default, NSGA-II for Pareto fronts, brute force when
  the space is small), with memory/SLO violations as constraints and resumable storages.
* ``exhaustive_search``: the baseline that prices the whole space, for regret.
* ``find_disaggregated``: the best prefill and decode units and their rate-matched device split.

A study kept in a storage (``storage="sqlite:///study.db"``) resumes after a crash and can be
shared by several workers; Optuna Dashboard opens it: ``optuna-dashboard sqlite:///study.db``
(``pip install 'moe-autoparallel[dashboard]'``). Each trial's user attribute ``result`` holds the
priced layout, its metrics and violations.
"""

from search._candidate import Candidate, SearchResult, layout_at
from search._disaggregation import DisaggregatedResult, find_disaggregated
from search._engines import (
    LayoutContext,
    engine_data,
    engine_info,
    engine_search_settings,
    resolve_version,
    rules_for,
    version_key,
    violated_rules,
)
from search._exhaustive import ExhaustiveResult, exhaustive_search, regret
from search._feasibility import lean_bounds, shared_fit_verdicts, smallest_feasible_devices
from search._interrupts import raise_if_interrupted, remembered_interrupts
from search._objective import METRICS, Objective, resolve_objective, simulate_top_k
from search._space import SearchBounds, SearchSpace, config_from_row, row_extras, select
from search._storage import database_url, open_storage
from search._study import find_plan
from search._study_job import StudyJob, load_study_job
from search._study_problem import SearchSettings
from search._workers import run_workers

__all__ = [
    "Candidate",
    "DisaggregatedResult",
    "ExhaustiveResult",
    "METRICS",
    "Objective",
    "SearchBounds",
    "SearchResult",
    "SearchSettings",
    "SearchSpace",
    "StudyJob",
    "database_url",
    "exhaustive_search",
    "lean_bounds",
    "raise_if_interrupted",
    "remembered_interrupts",
    "find_disaggregated",
    "find_plan",
    "load_study_job",
    "open_storage",
    "regret",
    "resolve_objective",
    # Engine rules, table rows and the planner's building blocks.
    "LayoutContext",
    "config_from_row",
    "engine_data",
    "engine_info",
    "engine_search_settings",
    "layout_at",
    "resolve_version",
    "row_extras",
    "rules_for",
    "run_workers",
    "select",
    "simulate_top_k",
    "shared_fit_verdicts",
    "smallest_feasible_devices",
    "version_key",
    "violated_rules",
]
