"""Online re-tuning, torch-free: the data a running job reports (``MeasuredStep``) and the
``RetunePolicy`` that turns a window of them into a ``RetuneDecision`` priced by the cost model.

``autoparallel.Retuner`` (in ``autoparallel.runtime``) wraps a policy for a torch job: it shares
windows and decisions between ranks and applies live changes to the modules.
"""

from autoparallel.retune._policy import RetunePolicy
from autoparallel.retune._types import (
    ChangeKind,
    MeasuredStep,
    RetuneCalibration,
    RetuneCandidate,
    RetuneDecision,
    RetuneSettings,
    WindowSummary,
    change_kind,
    describe_plan,
    summarize,
)

__all__ = [
    "ChangeKind",
    "MeasuredStep",
    "RetuneCalibration",
    "RetuneCandidate",
    "RetuneDecision",
    "RetunePolicy",
    "RetuneSettings",
    "WindowSummary",
    "change_kind",
    "describe_plan",
    "summarize",
]
