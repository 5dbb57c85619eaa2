"""The job a study searches (model, cluster, workload, objective, bounds), kept in the study.

A study in a shared storage is joined by workers on other machines by name. Each study records
its job as user attributes when it is created: ``job_fingerprint`` (short hashes and the readable
values that identify the problem) and ``job`` (the full model, cluster and workload JSON, so that
the plan can be written from the finished study without retyping the job). A worker whose job has
a different fingerprint is refused, naming each difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cost_model import Inference, ModelSpec, Training
from search._space import SearchBounds
from topology import Cluster

if TYPE_CHECKING:  # optuna is imported on first use (search._lazy); the checker sees the module
    import optuna
else:
    from search._lazy import optuna

_FINGERPRINT = "job_fingerprint"
_JOB = "job"


@dataclass(frozen=True)
class StudyJob:
    """What a study searches, rebuilt from its attributes (``load_study_job``)."""

    study_name: str
    model: ModelSpec
    cluster: Cluster
    workload: Training | Inference
    objective: tuple[str, ...]
    bounds: SearchBounds
    coordinates: str
    num_complete_trials: int


def job_fingerprint(*, model, cluster, workload, objective, settings) -> dict[str, Any]:
    """The values two workers must share to search one study (readable where short)."""
    return {
        "model": f"{model.name} ({model.fingerprint()})",
        "cluster": f"{cluster.name}, {cluster.num_devices} devices ({cluster.fingerprint()})",
        "workload": workload.model_dump(mode="json"),
        "objective": list(objective.names),
        "bounds": settings.bounds.model_dump(mode="json"),
        "coordinates": settings.coordinates,
    }


def job_record(*, model, cluster, workload) -> dict[str, Any]:
    return {
        "model": model.model_dump(mode="json"),
        "cluster": cluster.model_dump(mode="json"),
        "workload": workload.model_dump(mode="json"),
        "kind": workload.kind,
    }


def check_or_record_job(
    study: optuna.Study, *, fingerprint: dict[str, Any], record: dict[str, Any]
) -> None:
    """Record the job in a new study; in an existing one, refuse a different job. (Workers that
    start together create the study under ``creation_lock``, so the first one records the job
    before any other reads it; SQLite has no such lock and is shared by one machine's workers.)"""
    stored = study.user_attrs.get(_FINGERPRINT)
    if stored is None:
        study.set_user_attr(_FINGERPRINT, fingerprint)
        study.set_user_attr(_JOB, record)
        return
    differences = [
        f"{key} {_short(stored.get(key))} (in the study) vs {_short(fingerprint[key])} (this worker)"
        for key in fingerprint
        if stored.get(key) != fingerprint[key]
    ]
    if differences:
        raise ValueError(
            f"study {study.study_name!r} searches a different job; refusing to join it: "
            + "; ".join(differences)
        )


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={v}" for k, v in sorted(value.items())) + "}"
    return str(value)


def load_study_job(
    *, storage: str | optuna.storages.BaseStorage, study_name: str | None
) -> StudyJob:
    """The job of the study ``study_name`` in ``storage`` (the only study there when None)."""
    from search._storage import open_storage

    opened = open_storage(storage, heartbeat_interval_s=None)
    if opened is None:
        raise ValueError("storage (None) must name the database that holds the study")
    names = [
        summary.study_name
        for summary in optuna.get_all_study_summaries(opened, include_best_trial=False)
    ]
    if study_name is None:
        if len(names) != 1:
            raise ValueError(
                f"study (None) must be named: the storage holds {len(names)} studies {names}"
            )
        study_name = names[0]
    if study_name not in names:
        raise ValueError(f"study ({study_name!r}) is not in the storage; it holds {names}")
    study = optuna.load_study(study_name=study_name, storage=opened)
    record, fingerprint = study.user_attrs.get(_JOB), study.user_attrs.get(_FINGERPRINT)
    if record is None or fingerprint is None:
        raise ValueError(
            f"study ({study_name!r}) holds no job record: it was not created by autoparallel's search"
        )
    workload_type = Training if record["kind"] == "training" else Inference
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    return StudyJob(
        study_name=study_name,
        model=ModelSpec.model_validate(record["model"]),
        cluster=Cluster.model_validate(record["cluster"]),
        workload=workload_type.model_validate(record["workload"]),
        objective=tuple(fingerprint["objective"]),
        bounds=SearchBounds.model_validate(fingerprint["bounds"]),
        coordinates=fingerprint["coordinates"],
        num_complete_trials=len(complete),
    )
