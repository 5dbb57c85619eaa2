"""``run_day0``: the Day-0 steps in order, each recorded in a state file so a rerun resumes.

Steps: describe, coverage, cluster (probe file or preset), plan-training, plan-serving, export,
stages, sweep, figures, report. A step either finishes (``done``), cannot run here and says why
(``skipped``), or raises (``failed``: the state is saved, earlier files stay, the run stops and
``resume=True`` starts again at that step). Inputs are checked before any step runs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cost_model import ModelSpec
from search import shared_fit_verdicts
from topology import Cluster

logger = logging.getLogger(__name__)

STEPS: tuple[str, ...] = (
    "describe",
    "coverage",
    "cluster",
    "plan-training",
    "plan-serving",
    "export",
    "stages",
    "sweep",
    "figures",
    "report",
)
STATE_FILE = "day0-state.json"
SERVING_ENGINES = ("vllm", "sglang", "trtllm")
TRAINING_ENGINES = ("megatron", "torchtitan", "deepspeed")
DEFAULT_ENGINES = {"serving": "vllm", "training": "megatron"}


@dataclass(frozen=True)
class Day0Options:
    """What to plan and how much work to spend. ``training``/``serving`` both False means both."""

    config_path: Path
    cluster: str
    output_dir: Path
    engine: str | None = None
    training: bool = False
    serving: bool = False
    device: str | None = None
    nodes: int | None = None
    probe_ranks: int = 0
    trials: int = 60
    coverage: bool = True
    stages: bool = True
    sequence_length: int = 4096
    global_batch_tokens: int = 16 * 2**20
    prompt_tokens: int = 4096
    output_tokens: int = 1024
    ttft_slo_s: float | None = 5.0
    tpot_slo_s: float | None = 0.05
    seed: int = 0

    @property
    def kinds(self) -> tuple[str, ...]:
        if not (self.training or self.serving):
            return ("training", "serving")
        return tuple(
            kind
            for kind, wanted in (("training", self.training), ("serving", self.serving))
            if wanted
        )

    def fingerprint(self) -> str:
        """Hash of the inputs a resumed run must share (the config's content, not its path)."""
        data = {
            k: str(v) for k, v in asdict(self).items() if k not in ("output_dir", "config_path")
        }
        data["config"] = hashlib.sha256(Path(self.config_path).read_bytes()).hexdigest()
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class StepRecord:
    status: str = "pending"  # pending | done | skipped | failed
    reason: str = ""
    elapsed_s: float = 0.0
    files: list[str] = field(default_factory=list)


@dataclass
class Day0Context:
    """What the steps share: the inputs, the resolved model and cluster, and earlier results."""

    options: Day0Options
    model: ModelSpec
    cluster: Cluster
    local_device: str
    coverage_device: str
    results: dict[str, Any] = field(default_factory=dict)

    @property
    def folder(self) -> Path:
        return self.options.output_dir


class StepSkipped(Exception):
    """Raised by a step that cannot run here; the message says why."""


# ---------------------------------------------------------------------------- input checks
def check_inputs(options: Day0Options) -> Day0Context:
    """Resolve and check every input before any work; one ``ValueError`` line per problem."""
    from autoparallel.day0._coverage import dispatch_key_for, local_device

    _require_matplotlib()
    model = _load_model(options.config_path)
    local = local_device()
    device = options.device or local
    dispatch_key_for(device)  # raises: device type not present
    cluster = _load_cluster(options.cluster, local_device=local)
    if options.engine is not None and options.engine not in SERVING_ENGINES + TRAINING_ENGINES:
        raise ValueError(
            f"engine ({options.engine!r}) must be one of {list(SERVING_ENGINES + TRAINING_ENGINES)}"
        )
    if options.trials < 1:
        raise ValueError(f"trials ({options.trials}) must be >= 1")
    if options.nodes is not None and options.nodes < 1:
        raise ValueError(f"nodes ({options.nodes}) must be >= 1")
    _check_probe(options, cluster=cluster, local_device=local)
    return Day0Context(
        options=options, model=model, cluster=cluster, local_device=local, coverage_device=device
    )


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401 - only whether it is installed
    except ImportError as error:
        raise ValueError(
            "matplotlib is not installed: day0 draws its figures with it; "
            "pip install 'moe-autoparallel[report]'"
        ) from error


def _load_model(config_path: Path) -> ModelSpec:
    path = Path(config_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(
            f"config ({str(config_path)!r}) must be an existing HuggingFace config.json file"
        )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"config ({str(path)!r}) is not valid JSON: {error}") from error
    return ModelSpec.from_hf_config(
        data, name=str(data.get("_name_or_path") or path.parent.name or "model")
    )


def _load_cluster(text: str, *, local_device: str) -> Cluster:
    """A preset name, or a Cluster JSON (``autoparallel probe`` output) measured on this machine's
    device type."""
    from topology import get_preset, list_presets

    if not text.endswith(".json"):
        if text not in list_presets():
            raise ValueError(
                f"cluster ({text!r}) must be a preset ({', '.join(list_presets())}) "
                "or a probe .json file"
            )
        return get_preset(text)
    path = Path(text)
    if not path.is_file():
        raise ValueError(f"cluster ({text!r}) is not an existing probe file")
    cluster = Cluster.model_validate_json(path.read_text())
    measured_on = cluster.device.resolved_device_type
    if cluster.provenance.startswith("measured") and measured_on != local_device:
        raise ValueError(
            f"cluster ({text!r}) was probed on another cluster: its devices are {measured_on!r} "
            f"({cluster.device.name}), this machine has {local_device!r}; probe this cluster "
            "or pass a preset"
        )
    return cluster


def _check_probe(options: Day0Options, *, cluster: Cluster, local_device: str) -> None:
    if options.probe_ranks == 0:
        return
    if options.probe_ranks < 2:
        raise ValueError(f"probe_ranks ({options.probe_ranks}) must be 0 (no probe) or >= 2")
    if options.cluster.endswith(".json"):
        raise ValueError(
            f"probe_ranks ({options.probe_ranks}) measures this machine; pass a preset, "
            f"not {options.cluster!r}"
        )
    device_type = cluster.device.resolved_device_type
    if device_type != local_device:
        raise ValueError(
            f"probe_ranks ({options.probe_ranks}) measures this machine's {local_device!r} "
            f"devices; the preset {options.cluster!r} describes {device_type!r} devices"
        )


# ---------------------------------------------------------------------------- state
def _state_path(options: Day0Options) -> Path:
    return options.output_dir / STATE_FILE


def load_state(options: Day0Options) -> tuple[dict[str, StepRecord], dict[str, Any]]:
    """Records and results of an earlier run with the same inputs (``resume``), else fresh ones."""
    records = {name: StepRecord() for name in STEPS}
    path = _state_path(options)
    if not path.is_file():
        return records, {}
    state = json.loads(path.read_text())
    if state.get("fingerprint") != options.fingerprint():
        raise ValueError(
            f"output_dir ({str(options.output_dir)!r}) holds a run with other inputs; "
            "use another folder or drop --resume"
        )
    for name, record in state.get("steps", {}).items():
        if name in records:
            records[name] = StepRecord(**record)
    return records, state.get("results", {})


def save_state(
    options: Day0Options, records: dict[str, StepRecord], results: dict[str, Any]
) -> Path:
    path = _state_path(options)
    state = {
        "fingerprint": options.fingerprint(),
        "steps": {n: asdict(r) for n, r in records.items()},
        "results": results,
    }
    path.write_text(json.dumps(state, indent=1, default=_json_default) + "\n")
    return path


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


# ---------------------------------------------------------------------------- the run
Progress = Callable[[str, StepRecord], None]


def run_day0(
    options: Day0Options, *, resume: bool = False, progress: Progress | None = None
) -> dict[str, StepRecord]:
    """Run (or resume) every step; returns the step records. Raises ``ValueError`` for bad
    inputs before any step, and re-raises a failing step's error after saving the state."""
    context = check_inputs(options)
    options.output_dir.mkdir(parents=True, exist_ok=True)
    if resume:
        records, context.results = load_state(options)
        if records["cluster"].status == "done":  # later steps plan on the cluster that step chose
            context.cluster = Cluster.load(options.output_dir / context.results["cluster"]["file"])
    else:
        records = {name: StepRecord() for name in STEPS}
    say = progress or (lambda name, record: None)
    with shared_fit_verdicts():  # the plan steps search one model at several sizes
        _run_steps(context, records, say)
    return records


def _run_steps(context, records: dict[str, StepRecord], say: Progress) -> None:
    from autoparallel.day0 import _steps

    for name in STEPS:
        record = records[name]
        if record.status in ("done", "skipped"):
            say(
                name,
                StepRecord(
                    status="resumed",
                    reason=f"{record.status} in an earlier run",
                    files=record.files,
                ),
            )
            continue
        say(name, StepRecord(status="running"))
        records[name] = _run_step(
            name, getattr(_steps, "step_" + name.replace("-", "_")), context, records
        )
        save_state(context.options, records, context.results)
        say(name, records[name])
        if records[name].status == "failed":
            raise Day0StepError(name, records[name].reason)


class Day0StepError(RuntimeError):
    def __init__(self, step: str, reason: str) -> None:
        self.step = step
        super().__init__(f"step {step} failed: {reason} (fix it and rerun with --resume)")


def _run_step(
    name: str, function, context: Day0Context, records: dict[str, StepRecord]
) -> StepRecord:
    start = time.perf_counter()
    try:
        files = function(context, records) or []
    except StepSkipped as skipped:
        return StepRecord(
            status="skipped", reason=str(skipped), elapsed_s=time.perf_counter() - start
        )
    except Exception as error:
        logger.exception("day0 step %s failed", name)
        return StepRecord(
            status="failed",
            reason=f"{type(error).__name__}: {error}",
            elapsed_s=time.perf_counter() - start,
        )
    return StepRecord(
        status="done", elapsed_s=time.perf_counter() - start, files=[str(f) for f in files]
    )
