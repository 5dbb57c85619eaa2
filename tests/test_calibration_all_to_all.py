"""Collectives are priced with operator fits of two parameters, an efficiency and a fixed cost per
call (the Hockney alpha-beta form): the all-to-all (expert dispatch and combine) on the NCCL
all-to-all tables of 4+ ranks, the all-reduce, all-gather and reduce-scatter on theirs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from cost_model._calibration_fits import nccl_seconds
from cost_model._calibration_tables import (
    ALL_TO_ALL_MIN_GPUS,
    HARDWARE,
    all_to_all_rows,
    collective_rows,
    nccl_rows,
)
from cost_model._options import Calibration, calibration_for
from cost_model._pricing import collective_time_s
from topology import get_preset

_AIC_SPEC = importlib.util.find_spec("aiconfigurator_core")
assert _AIC_SPEC is not None and _AIC_SPEC.submodule_search_locations, "pip install -e .[test]"
AIC = Path(next(iter(_AIC_SPEC.submodule_search_locations)))
MIB = float(1 << 20)


def _seconds(cluster, calibration, op, group, message):
    return collective_time_s(
        cluster=cluster,
        op=op,
        group_size=np.asarray(group, dtype=np.float64),
        ranks_per_node=np.asarray(group, dtype=np.float64),
        message_bytes=np.asarray(message, dtype=np.float64),
        calibration=calibration,
    )


def test_an_all_to_all_takes_its_own_efficiency_and_fixed_cost() -> None:
    cluster = get_preset("gb200-nvl72")
    group, message = np.array([1.0, 8.0, 32.0]), np.full(3, 256 * MIB)
    shared = Calibration(collective_efficiency=0.5)
    own = Calibration(
        collective_efficiency=0.5, all_to_all_efficiency=0.8, all_to_all_overhead_s=1e-5
    )
    topology = _seconds(cluster, Calibration(), "all_to_all", group, message)
    assert _seconds(cluster, shared, "all_to_all", group, message) == pytest.approx(topology / 0.5)
    expected = np.where(group > 1, topology / 0.8 + 1e-5, 0.0)
    assert _seconds(cluster, own, "all_to_all", group, message) == pytest.approx(expected)
    # the other collectives keep the shared efficiency and their own fixed cost per call
    reduce = _seconds(cluster, Calibration(), "all_reduce", group, message)
    assert _seconds(cluster, own, "all_reduce", group, message) == pytest.approx(reduce / 0.5)
    fixed = Calibration(collective_efficiency=0.5, collective_overhead_s=2e-5)
    expected = np.where(group > 1, reduce / 0.5 + 2e-5, 0.0)
    assert _seconds(cluster, fixed, "all_reduce", group, message) == pytest.approx(expected)


def _single_constant(cluster, rows) -> Calibration:
    """One efficiency for every collective and size: the log-mean of modelled / measured over
    every NCCL row from 1 MiB, the form the two-parameter fits replace."""
    modelled = nccl_seconds(rows, cluster=cluster, collective_efficiency=1.0)
    return Calibration(
        collective_efficiency=float(np.exp(np.mean(np.log(modelled / rows.seconds))))
    )


def _mean_ratio(cluster, calibration, rows, kept: np.ndarray) -> float:
    """Mean predicted / measured over the ``kept`` rows, each op priced as
    ``collective_time_s`` does."""
    c = rows.columns
    ratios = [
        _seconds(cluster, calibration, str(op), c["gpus"][where], c["bytes"][where])
        / rows.seconds[where]
        for op in np.unique(c["op"][kept])
        for where in [kept & (c["op"] == op)]
    ]
    return float(np.mean(np.concatenate(ratios)))


@pytest.mark.parametrize("key", ["GB200", "B200", "H100"])
def test_the_shipped_all_to_all_follows_the_measured_large_messages(key: str) -> None:
    """An expert layer moves hundreds of MiB per all-to-all: the shipped calibration prices the
    measured all-to-alls of at least 64 MiB (groups of 4+) within 12% on average, where one
    constant fitted on every op and size is more than 15% slow."""
    hardware = next(h for h in HARDWARE if h.key == key)
    cluster = get_preset(hardware.preset)
    rows = all_to_all_rows(nccl_rows(AIC, hardware))
    large = rows.columns["bytes"] >= 64 * MIB
    assert large.sum() >= 8 and rows.columns["gpus"].min() >= ALL_TO_ALL_MIN_GPUS
    group, message = rows.columns["gpus"][large], rows.columns["bytes"][large]
    measured = rows.seconds[large]
    calibration = calibration_for(cluster.device)
    assert calibration.all_to_all_efficiency is not None
    ratio = _seconds(cluster, calibration, "all_to_all", group, message) / measured
    assert abs(float(np.mean(ratio)) - 1.0) < 0.12
    shared = _single_constant(cluster, nccl_rows(AIC, hardware))
    shared_ratio = _seconds(cluster, shared, "all_to_all", group, message) / measured
    assert float(np.mean(shared_ratio)) > 1.15


@pytest.mark.parametrize("key", ["A100", "H100", "B200"])
def test_the_shipped_collectives_follow_the_measured_large_messages(key: str) -> None:
    """Tensor- and data-parallel collectives move tens to hundreds of MiB: with its fixed cost
    per call beside the bandwidth term, the shipped calibration prices the measured
    all-reduces, all-gathers and reduce-scatters of at least 64 MiB within 8% on average, where
    one constant fitted on every op and size from 1 MiB is more than 15% slow."""
    hardware = next(h for h in HARDWARE if h.key == key)
    cluster = get_preset(hardware.preset)
    rows = nccl_rows(AIC, hardware)
    collectives = collective_rows(rows)
    assert set(np.unique(collectives.columns["op"])) == {
        "all_reduce",
        "all_gather",
        "reduce_scatter",
    }
    large = collectives.columns["bytes"] >= 64 * MIB
    assert large.sum() >= 12
    calibration = calibration_for(cluster.device)
    assert calibration.collective_overhead_s > 0.0
    assert abs(_mean_ratio(cluster, calibration, collectives, large) - 1.0) < 0.08
    single = _single_constant(cluster, rows)
    assert _mean_ratio(cluster, single, collectives, large) > 1.15
