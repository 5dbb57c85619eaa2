"""``calibrate``: fit the few global efficiency parameters of a ``Calibration`` by least squares.

Two sources of truth:

* **step measurements** (``StepMeasurement``): measured seconds of a whole step or of some of
  its parts (``compute``, ``optimizer``, ...) for a (model, workload, config). The residual of a
  row is ``log(predicted / measured)`` — relative error, so a 10 ms and a 10 s row weigh alike —
  and the parameters are fitted by Levenberg-Marquardt (Marquardt, SIAM J. Appl. Math. 1963)
  with a finite-difference Jacobian, efficiencies in log space and every parameter clipped to
  the bounds ``Calibration`` accepts.
* **a hardware profile** (``topology.HardwareProfile``): the GEMM, element-wise and collective
  curves of the device fix the constant matmul and memory efficiencies of a spec *without* the
  profile attached, and the collective efficiency of its cluster: the least-squares fit of a
  constant to log-rates is their mean (large calls only: the constant models the plateau).

Both report the error of every row before and after. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from cost_model._model_spec import ModelSpec
from cost_model._options import Calibration
from cost_model._parallel import ParallelConfig
from cost_model._workload import Training

_STRICT = ConfigDict(extra="forbid", frozen=True)
#: Fittable ``Calibration`` fields: (lower, upper, fitted in log space).
FITTABLE: dict[str, tuple[float, float, bool]] = {
    "matmul_efficiency": (1e-4, 1.0, True),
    "memory_bandwidth_efficiency": (1e-4, 1.0, True),
    "attention_efficiency": (1e-4, 1.0, True),
    "collective_efficiency": (1e-3, 2.0, True),
    "kernel_overhead_s": (0.0, 1e-3, False),
}
DEFAULT_PARAMETERS = ("matmul_efficiency", "memory_bandwidth_efficiency")


class StepMeasurement(BaseModel):
    """Measured seconds of ``parts`` of one training step (``("step",)``: the whole step).

    ``parts`` are ``CostBreakdown.time_s`` keys (compute, optimizer, tp_comm, bubble, ...).
    ``options`` are ``EstimateOptions`` fields the run matches (e.g. ``flash_attention``).
    """

    model_config = _STRICT

    label: str
    model: ModelSpec
    workload: Training
    config: ParallelConfig
    parts: tuple[str, ...] = ("step",)
    measured_s: float = Field(gt=0)
    options: dict[str, object] = Field(default_factory=dict)


class CalibrationRow(BaseModel):
    model_config = _STRICT

    label: str
    measured: float = Field(gt=0)
    predicted_before: float = Field(gt=0)
    predicted_after: float = Field(gt=0)

    @property
    def error_before(self) -> float:
        return self.predicted_before / self.measured - 1.0

    @property
    def error_after(self) -> float:
        return self.predicted_after / self.measured - 1.0

    @property
    def log_error_before(self) -> float:
        return math.log(self.predicted_before / self.measured)

    @property
    def log_error_after(self) -> float:
        return math.log(self.predicted_after / self.measured)


class CalibrationResult(BaseModel):
    """The fitted ``calibration`` and each row's prediction before and after the fit."""

    model_config = _STRICT

    calibration: Calibration
    parameters: tuple[str, ...]
    rows: tuple[CalibrationRow, ...]

    @property
    def rms_log_error_before(self) -> float:
        """Root mean square of log(predicted / measured) over the rows, before the fit."""
        return _rms([row.log_error_before for row in self.rows])

    @property
    def rms_log_error_after(self) -> float:
        return _rms([row.log_error_after for row in self.rows])


def _rms(values: Sequence[float]) -> float:
    return math.sqrt(sum(v * v for v in values) / len(values)) if values else 0.0


def _check_parameters(parameters: Sequence[str]) -> tuple[str, ...]:
    if not parameters:
        raise ValueError("parameters (()) must name at least one Calibration field")
    for name in parameters:
        if name not in FITTABLE:
            raise ValueError(f"parameters entry ({name!r}) must be one of {sorted(FITTABLE)}")
    return tuple(parameters)


def calibrate(
    *,
    cluster,  # topology.Cluster
    measurements: Sequence[StepMeasurement] = (),
    profile=None,  # topology.HardwareProfile
    parameters: Sequence[str] | None = None,
    initial: Calibration | None = None,
    max_iterations: int = 40,
) -> CalibrationResult:
    """Fit ``parameters`` of a ``Calibration`` for ``cluster``'s device.

    Give ``measurements`` (step rows, see the module docstring) or ``profile`` (curves), not both.
    Fitting starts from ``initial``, else from a neutral calibration whose per-kernel cost is the
    device's measured launch cost (``HardwareSpec.kernel_overhead_s``, from its profile).
    Raises ``ValueError`` for an unknown parameter, fewer rows than parameters, or no data.
    """
    if (not measurements) == (profile is None):
        raise ValueError("give measurements or profile (exactly one of them)")
    if profile is not None:
        return _calibrate_from_profile(cluster=cluster, profile=profile, parameters=parameters)
    names = _check_parameters(parameters or DEFAULT_PARAMETERS)
    if len(measurements) < len(names):
        raise ValueError(
            f"measurements ({len(measurements)} rows) must be >= parameters ({len(names)}: {list(names)})"
        )
    start = initial or Calibration(
        device_pattern=f"^{_escape(cluster.device.name)}$",
        kernel_overhead_s=min(
            float(getattr(cluster.device, "kernel_overhead_s", 0.0)),
            FITTABLE["kernel_overhead_s"][1],
        ),
    )
    x0 = np.array([_to_free(name, _current(start, name, cluster.device)) for name in names])

    def residuals(x: np.ndarray) -> np.ndarray:
        return _residuals(cluster, measurements, _with(start, names, x))

    x = _levenberg_marquardt(residuals, x0, names=names, max_iterations=max_iterations)
    fitted = _with(start, names, x)
    before, after = (
        _predictions(cluster, measurements, start),
        _predictions(cluster, measurements, fitted),
    )
    rows = tuple(
        CalibrationRow(label=m.label, measured=m.measured_s, predicted_before=b, predicted_after=a)
        for m, b, a in zip(measurements, before, after)
    )
    fit = {
        "rows": len(rows),
        "parameters": list(names),
        "method": "Levenberg-Marquardt on log(predicted/measured)",
        "rms_log_error_before": _rms([r.log_error_before for r in rows]),
        "rms_log_error_after": _rms([r.log_error_after for r in rows]),
    }
    return CalibrationResult(
        calibration=fitted.model_copy(update={"fit": fit}), parameters=names, rows=rows
    )


def _escape(text: str) -> str:
    import re

    return re.escape(text)


def _current(calibration: Calibration, name: str, hardware) -> float:
    value = getattr(calibration, name)
    if value is not None:
        return float(value)
    return {
        "matmul_efficiency": hardware.matmul_efficiency,
        "attention_efficiency": hardware.matmul_efficiency,
        "memory_bandwidth_efficiency": hardware.memory_bandwidth_efficiency,
    }[name]


def _to_free(name: str, value: float) -> float:
    low, high, log = FITTABLE[name]
    value = min(max(value, low), high)
    return math.log(value) if log else value


def _from_free(name: str, free: float) -> float:
    low, high, log = FITTABLE[name]
    value = math.exp(free) if log else free
    return min(max(value, low), high)


def _with(calibration: Calibration, names: Sequence[str], x: np.ndarray) -> Calibration:
    return calibration.model_copy(
        update={name: _from_free(name, float(v)) for name, v in zip(names, x)}
    )


def _predictions(
    cluster, measurements: Sequence[StepMeasurement], calibration: Calibration
) -> list[float]:
    from cost_model._estimate import estimate

    values = []
    for row in measurements:
        breakdown = estimate(
            row.model, cluster, row.workload, row.config, calibration=calibration, **row.options
        )
        values.append(
            breakdown.step_time_s
            if row.parts == ("step",)
            else sum(breakdown.time_s[part] for part in row.parts)
        )
    return values


def _residuals(cluster, measurements, calibration: Calibration) -> np.ndarray:
    predicted = np.asarray(_predictions(cluster, measurements, calibration))
    measured = np.asarray([row.measured_s for row in measurements])
    return np.log(np.maximum(predicted, 1e-30) / measured)


def _levenberg_marquardt(
    residuals, x0: np.ndarray, *, names: Sequence[str], max_iterations: int
) -> np.ndarray:
    """Minimize ||residuals(x)||^2; a step that leaves a parameter's bounds is clipped back."""
    x, damping = _clip(names, x0.copy()), 1e-3
    r = residuals(x)
    for _ in range(max_iterations):
        jacobian = _jacobian(residuals, x, r, names=names)
        gradient = jacobian.T @ r
        normal = jacobian.T @ jacobian
        improved = False
        while damping < 1e8:
            step = np.linalg.solve(normal + damping * np.diag(np.diag(normal) + 1e-12), -gradient)
            candidate = _clip(names, x + step)
            r_candidate = residuals(candidate)
            if r_candidate @ r_candidate < r @ r - 1e-15:
                x, r, damping, improved = candidate, r_candidate, max(damping / 10.0, 1e-9), True
                break
            damping *= 10.0
        if not improved or np.max(np.abs(step)) < 1e-8:
            break
    return x


def _clip(names: Sequence[str], x: np.ndarray) -> np.ndarray:
    return np.array([_to_free(name, _from_free(name, float(v))) for name, v in zip(names, x)])


def _jacobian(residuals, x: np.ndarray, r: np.ndarray, *, names: Sequence[str]) -> np.ndarray:
    columns = []
    for index, name in enumerate(names):
        delta = 1e-4 if FITTABLE[name][2] else 1e-7
        if _from_free(name, float(x[index]) + delta) == _from_free(name, float(x[index])):
            delta = -delta  # at the upper bound: a one-sided difference into the interior
        shifted = x.copy()
        shifted[index] += delta
        columns.append((residuals(shifted) - r) / delta)
    return np.stack(columns, axis=1)


def _plateau(curve) -> tuple[np.ndarray, np.ndarray]:  # topology.MeasuredCurve
    """Work and rate of the larger half of a curve's points."""
    work, rates = np.asarray(curve.work), np.asarray(curve.rates_per_s)
    keep = work >= np.median(work)
    return work[keep], rates[keep]


def _calibrate_from_profile(
    *, cluster, profile, parameters: Sequence[str] | None
) -> CalibrationResult:
    """Constant efficiencies of ``cluster.device`` (its profile ignored) that best fit the curves."""
    names = _check_parameters(
        parameters or ("matmul_efficiency", "memory_bandwidth_efficiency", "collective_efficiency")
    )
    unsupported = set(names) - {
        "matmul_efficiency",
        "memory_bandwidth_efficiency",
        "collective_efficiency",
    }
    if unsupported:
        raise ValueError(
            f"parameters {sorted(unsupported)} cannot be fitted from a profile; use step measurements"
        )
    device = cluster.device.model_copy(update={"profile": None})
    bare = cluster.model_copy(update={"device": device})
    fitted: dict[str, float] = {}
    rows: list[CalibrationRow] = []
    if "matmul_efficiency" in names:
        fitted["matmul_efficiency"], gemm_rows = _gemm_fit(device, profile)
        rows += gemm_rows
    if "memory_bandwidth_efficiency" in names:
        fitted["memory_bandwidth_efficiency"], memory_rows = _memory_fit(device, profile)
        rows += memory_rows
    if "collective_efficiency" in names and profile.collectives:
        fitted["collective_efficiency"], collective_rows = _collective_fit(bare, profile)
        rows += collective_rows
    result_rows = tuple(rows)
    fit = {
        "rows": len(result_rows),
        "parameters": sorted(fitted),
        "source": profile.provenance,
        "rms_log_error_before": _rms([r.log_error_before for r in result_rows]),
        "rms_log_error_after": _rms([r.log_error_after for r in result_rows]),
        "method": "mean of log rate / peak",
    }
    calibration = Calibration.model_validate(
        {"device_pattern": f"^{_escape(device.name)}$", "fit": fit, **fitted}
    )
    return CalibrationResult(
        calibration=calibration, parameters=tuple(sorted(fitted)), rows=result_rows
    )


def _gemm_fit(device, profile) -> tuple[float, list[CalibrationRow]]:
    """Matmul efficiency from the GEMM plateau of the training dtype (bf16, else fp16, fp32)."""
    dtype = next(
        (d for d in ("bf16", "fp16", "fp32") if d in profile.gemm and d in device.peak_flops), None
    )
    if dtype is None:
        raise ValueError(
            f"profile gemm dtypes ({sorted(profile.gemm)}) share none with peak_flops ({sorted(device.peak_flops)})"
        )
    work, rates = _plateau(profile.gemm[dtype])
    peak = device.peak_flops_for(dtype)
    efficiency = _log_mean_fit(rates / peak, high=1.0)
    return efficiency, _rate_rows(
        f"gemm {dtype}", work, rates, peak * device.matmul_efficiency, peak * efficiency
    )


def _memory_fit(device, profile) -> tuple[float, list[CalibrationRow]]:
    work, rates = _plateau(profile.memory)
    peak = device.memory_bandwidth_bytes_per_s
    efficiency = _log_mean_fit(rates / peak, high=1.0)
    return efficiency, _rate_rows(
        "memory", work, rates, peak * device.memory_bandwidth_efficiency, peak * efficiency
    )


def _log_mean_fit(ratios: np.ndarray, *, high: float) -> float:
    return float(min(math.exp(float(np.mean(np.log(ratios)))), high))


def _rate_rows(
    label: str, work, rates, rate_before: float, rate_after: float
) -> list[CalibrationRow]:
    return [
        CalibrationRow(
            label=f"{label} {w:.3g}",
            measured=w / r,
            predicted_before=w / rate_before,
            predicted_after=w / rate_after,
        )
        for w, r in zip(work, rates)
    ]


def _collective_fit(cluster, profile) -> tuple[float, list[CalibrationRow]]:
    """``collective_efficiency`` divides collective times: the log-mean of predicted / measured."""
    cases = []
    for op, by_size in profile.collectives.items():
        for size, curve in by_size.items():
            if size > cluster.num_devices:
                continue
            local = min(size, cluster.devices_per_node)
            for nbytes, seconds in zip(curve.work, curve.seconds):
                predicted = float(
                    cluster.collective_time(
                        op, group_size=size, ranks_per_node=local, message_bytes=nbytes
                    )
                )
                cases.append((f"{op} n={size} {nbytes:.3g} B", seconds, predicted))
    if not cases:
        return 1.0, []
    low, high, _ = FITTABLE["collective_efficiency"]
    efficiency = min(
        max(math.exp(float(np.mean([math.log(p / s) for _, s, p in cases]))), low), high
    )
    rows = [
        CalibrationRow(label=label, measured=s, predicted_before=p, predicted_after=p / efficiency)
        for label, s, p in cases
    ]
    return efficiency, rows
