"""The error bar of an estimate: how far the model was from published runs like it.

Every published training run is held out of the calibration (``_cross_validation``); its signed
error is shipped beside the calibration (``data/calibration.json`` ``held_out.per_run``, written
by ``benchmarks/calibrate_operators.py`` and checked against the current prediction by a test),
each with the regime it ran in: the GPU generation, whether the model has MoE layers, and the
parallel dimensions it used (``parallelism_of``). Serving estimates read the public serving
measurements the same way (``serving_error_bands``).

``training_error_band`` takes the runs of the estimate's own regime, widening it one key at a time
until at least ``MIN_RUNS`` runs share it: generation, MoE and parallelism; generation and MoE;
MoE and parallelism; MoE; every run. Over those runs it reports the bias (mean speed error:
> 0, the model was too fast), the mean |error|, and the 10th to 90th percentile of the speed
errors, which scales the estimate's step time into the range the published step times of such
runs fell in relative to their predictions: ``step x (1 + p10) .. step x (1 + p90)``. An
empirical band of held-out runs, not a confidence interval of a fitted model: nothing is fitted
to the runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

__all__ = [
    "GENERATIONS",
    "MIN_RUNS",
    "ErrorBand",
    "generation_of",
    "memory_error_band",
    "parallelism_of",
    "serving_error_bands",
    "training_error_band",
]

#: The fewest held-out runs a regime needs before its errors make the band.
MIN_RUNS = 3

#: GPU generation of each validation hardware type (the device-name patterns of
#: ``_validation.DEVICE_PATTERNS``): the runs an estimate on that generation is compared with.
GENERATIONS = {
    "A100": "Ampere",
    "H100": "Hopper",
    "H200": "Hopper",
    "H800": "Hopper",
    "B200": "Blackwell",
    "GB200": "Blackwell",
    "GB300": "Blackwell",
}
_DEVICE_GENERATIONS = (
    ("GB200", "Blackwell"),
    ("GB300", "Blackwell"),
    ("B200", "Blackwell"),
    ("B300", "Blackwell"),
    ("H100", "Hopper"),
    ("H200", "Hopper"),
    ("H800", "Hopper"),
    ("H20", "Hopper"),
    ("A100", "Ampere"),
    ("A800", "Ampere"),
    ("MI300", "CDNA3"),
    ("MI325", "CDNA3"),
    ("MI355", "CDNA4"),
)


@dataclass(frozen=True)
class ErrorBand:
    """Held-out errors of the published runs in an estimate's regime (``scope``)."""

    scope: str
    count: int
    sources: int
    bias: float
    mean_abs_error: float
    low: float  # 10th percentile of the speed errors
    high: float  # 90th percentile

    def time_range_s(self, predicted_s: float) -> tuple[float, float]:
        """The published times of such runs relative to their predictions, scaled to this one:
        predicted x (1 + p10) to predicted x (1 + p90)."""
        return self.scaled_range(predicted_s)

    def scaled_range(self, predicted: float) -> tuple[float, float]:
        """``predicted`` (seconds, bytes) x (1 + p10) to x (1 + p90)."""
        return predicted * (1.0 + self.low), predicted * (1.0 + self.high)


def generation_of(device_name: str) -> str | None:
    """The GPU generation a device name belongs to, or None for one no published run covers."""
    for marker, generation in _DEVICE_GENERATIONS:
        if marker in device_name:
            return generation
    return None


@lru_cache(maxsize=1)
def _held_out_runs() -> tuple[dict, ...]:
    text = (resources.files("cost_model") / "data" / "calibration.json").read_text()
    return tuple(json.loads(text).get("held_out", {}).get("per_run", []))


def parallelism_of(config) -> str:
    """The parallel dimensions a layout uses (``tp+pp+cp+ep``, ``zero3`` for sharded
    parameters; ``dp`` alone when it uses none)."""
    parts = [name for name in ("tp", "pp", "cp", "ep") if getattr(config, name) > 1]
    if config.zero_stage == 3:
        parts.append("zero3")
    return "+".join(parts) or "dp"


def training_error_band(model, cluster, config) -> ErrorBand | None:
    """The band of the published runs in the regime of ``model`` on ``cluster`` with layout
    ``config`` (module docstring); None where no run has been validated."""
    runs = _held_out_runs()
    if not runs:
        return None
    generation = generation_of(cluster.device.name)
    moe = model.moe is not None
    parallelism = parallelism_of(config)
    kind = "MoE" if moe else "dense"
    levels: list[tuple[str, tuple[str | None, str | None]]] = []
    if generation is not None:  # a device no published run covers skips the generation levels
        levels += [
            (f"{generation}, {kind}, {parallelism}", (generation, parallelism)),
            (f"{generation}, {kind}", (generation, None)),
        ]
    levels += [(f"{kind}, {parallelism}", (None, parallelism)), (kind, (None, None))]
    for scope, (gen, par) in levels:
        chosen = [run for run in runs if _match(run, gen, moe, par)]
        if len(chosen) >= MIN_RUNS:
            return _band(scope, chosen)
    return _band("every published run", list(runs)) if len(runs) >= MIN_RUNS else None


def _match(run: dict, generation: str | None, moe: bool, parallelism: str | None) -> bool:
    if run["moe"] != moe:
        return False
    if generation is not None and run["generation"] != generation:
        return False
    return parallelism is None or run["parallelism"] == parallelism


def _band(scope: str, runs: list[dict], *, key: str = "speed_error") -> ErrorBand:
    errors = np.array([run[key] for run in runs], dtype=np.float64)
    return ErrorBand(
        scope=scope,
        count=int(errors.size),
        sources=len({run["source"] for run in runs}),
        bias=float(errors.mean()),
        mean_abs_error=float(np.abs(errors).mean()),
        low=float(np.percentile(errors, 10)),
        high=float(np.percentile(errors, 90)),
    )


# ---------------------------------------------------------------------------- serving
def _release_label(version: str) -> str:
    """A serving profile's releases without its remark: ``"1.0-1.1 (PyTorch backend)"`` ->
    ``"1.0-1.1"``."""
    return version.split(" (", 1)[0]


@lru_cache(maxsize=1)
def _serving_held_out() -> tuple[dict, ...]:
    text = (resources.files("cost_model") / "data" / "serving_held_out.json").read_text()
    return tuple(json.loads(text)["rows"])


def _nearest_releases(engine: str, release: str) -> list[str]:
    """The engine's other release groups (``ServingProfile.version``) nearest ``release`` first,
    the newer of two equally near first: the measurements of the engine as close as the rows go
    to the software the estimate prices."""
    from cost_model._serving_profile import engine_profiles

    ordered = [profile.version for profile in engine_profiles(engine)]
    here = ordered.index(release)
    others = [index for index in range(len(ordered)) if index != here]
    return [ordered[i] for i in sorted(others, key=lambda i: (abs(i - here), -i))]


def serving_error_bands(
    model, cluster, *, engine: str, deployment: str, version: str | None = None
) -> dict[str, ErrorBand]:
    """Per latency metric (``TTFT``, ``TPOT``), the band of the public serving measurements of
    the regime of ``model`` served by ``engine`` (at release ``version``; None: its current
    releases) on ``cluster`` (``deployment``: colocated or disaggregated), from
    ``data/serving_held_out.json`` (every row of ``data/serving_validation.json``, none a fit
    input; written by ``benchmarks/serving_held_out.py`` and checked against the current
    prediction by a test). Errors as for training: measured time / predicted time - 1 (> 0: the
    model was optimistic). The regime widens one key at a time until ``MIN_RUNS`` rows share
    it: the engine's release group (the ``ServingProfile`` that priced the rows), generation,
    MoE and deployment; that release group and MoE; the engine's other release groups, nearest
    first, with generation, MoE and deployment, then MoE and deployment; then across releases,
    engine, generation, MoE and deployment; engine, generation and MoE; engine and MoE; engine;
    MoE; every row. A band from other releases names those its rows ran, one from other
    deployments those."""
    from cost_model._serving_profile import serving_profile

    release = serving_profile(engine, version).version
    regime = {
        "engine": engine,
        "release": release,
        "generation": generation_of(cluster.device.name),
        "moe": model.moe is not None,
        "deployment": deployment,
    }
    bands = {}
    for metric in ("TTFT", "TPOT"):
        rows = [row for row in _serving_held_out() if row["metric"] == metric]
        for scope, keys in _serving_levels(regime):
            chosen = [row for row in rows if all(row.get(k) == v for k, v in keys.items())]
            if len(chosen) >= MIN_RUNS:
                bands[metric] = _band(
                    _named_scope(scope, keys, chosen, deployment), chosen, key="time_error"
                )
                break
    return bands


def _serving_levels(regime: dict) -> list[tuple[str, dict]]:
    """(scope, keys) of the regimes ``serving_error_bands`` tries, narrowest first."""
    engine, release, generation = regime["engine"], regime["release"], regime["generation"]
    moe, deployment = regime["moe"], regime["deployment"]
    kind = "MoE" if moe else "dense"
    label = _release_label(release)
    levels: list[tuple[str, dict]] = []
    if generation is not None:
        levels.append((f"{engine} {label}, {generation}, {kind}, {deployment}", dict(regime)))
    levels.append((f"{engine} {label}, {kind}", {"engine": engine, "release": release, "moe": moe}))
    for other in _nearest_releases(engine, release):  # engine versions weigh more than GPUs
        ran = f"measured on {engine} {_release_label(other)}"
        keys = {"engine": engine, "release": other, "moe": moe, "deployment": deployment}
        if generation is not None:
            levels.append(
                (
                    f"{engine}, {generation}, {kind}, {deployment}, {ran}",
                    keys | {"generation": generation},
                )
            )
        levels.append((f"{engine}, {kind}, {deployment}, {ran}", keys))
    if generation is not None:
        across = {"engine": engine, "generation": generation, "moe": moe}
        levels += [
            (f"{engine}, {generation}, {kind}, {deployment}", across | {"deployment": deployment}),
            (f"{engine}, {generation}, {kind}", across),
        ]
    return levels + [
        (f"{engine}, {kind}", {"engine": engine, "moe": moe}),
        (engine, {"engine": engine}),
        (kind, {"moe": moe}),
        ("every public run", {}),
    ]


def _named_scope(scope: str, keys: dict, chosen: list[dict], deployment: str) -> str:
    """``scope`` naming the releases its rows ran where it spans releases, and their
    deployments where those are not ``deployment``."""
    if "release" not in keys:
        releases = sorted({f"{row['engine']} {_release_label(row['release'])}" for row in chosen})
        scope = f"{scope}, measured on {', '.join(releases)}"
    deployments = sorted({row["deployment"] for row in chosen})
    if "deployment" not in keys and deployments != [deployment]:
        scope = f"{scope}, {' and '.join(deployments)} deployments"
    return scope


# ---------------------------------------------------------------------------- peak memory
@lru_cache(maxsize=1)
def _memory_runs() -> tuple[dict, ...]:
    """Each published peak-memory run: its parallel dimensions, whether it pipelines, its
    framework and the model's error (published / predicted - 1), estimated now (20-odd runs)."""
    from cost_model._validation import GIB, peak_memory_bytes
    from cost_model._validation_cases import peak_memory_cases

    runs = []
    for case, published in peak_memory_cases():
        predicted = peak_memory_bytes(case)[0] / GIB
        runs.append(
            {
                "run": case.run,
                "table": case.table,
                "parallelism": parallelism_of(case.config),
                "zero3": case.config.zero_stage == 3,
                "pipelined": case.config.pp > 1,
                "framework": case.workload.framework,
                # one benchmark file per device: the 2024-12 H100 tables, Trainy's H200 runs
                "source": case.table.split("_peak_memory")[0],
                "memory_error": published / predicted - 1.0,
            }
        )
    return tuple(runs)


def memory_error_band(config) -> ErrorBand | None:
    """The band of the published peak-memory runs in the regime of layout ``config`` (module
    docstring): its parallel dimensions; then its ZeRO-3 class and whether it pipelines; then
    its ZeRO-3 class; then every run. The scope names the frameworks those runs used (the
    published peaks are torchtitan's FSDP2 runs); None without runs."""
    runs = _memory_runs()
    zero3, pipelined = config.zero_stage == 3, config.pp > 1
    sharding = "ZeRO-3/FSDP" if zero3 else "ZeRO-0/1/2"
    levels = [
        (parallelism_of(config), lambda r: r["parallelism"] == parallelism_of(config)),
        (
            f"{sharding}, {'pipelined' if pipelined else 'no pipeline'}",
            lambda r: r["zero3"] == zero3 and r["pipelined"] == pipelined,
        ),
        (sharding, lambda r: r["zero3"] == zero3),
        ("every run with a published peak", lambda r: True),
    ]
    for scope, keep in levels:
        chosen = [run for run in runs if keep(run)]
        if len(chosen) >= MIN_RUNS:
            frameworks = sorted({str(run["framework"]) for run in chosen})
            return _band(f"{scope}; {', '.join(frameworks)} runs", chosen, key="memory_error")
    return None
