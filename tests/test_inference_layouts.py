"""Inference prices rows alike in every column it reads once: the result equals pricing each row."""

from __future__ import annotations

import numpy as np

import cost_model._inference_setup as inference_setup
from autoparallel import get_model
from cost_model import Inference, estimate_inference_table, table_from_columns
from cost_model._inference_load import TRAINING_ONLY_COLUMNS
from cost_model._table import select_rows
from topology import get_preset

REF = get_model("ref-3t-moe")
H100_64 = get_preset("dgx-h100", num_nodes=8)
WITH_SLOS = Inference(prompt_tokens=4096, output_tokens=256, ttft_slo_s=2.0, tpot_slo_s=0.05)


def _table() -> dict[str, np.ndarray]:
    """Two layouts, each crossed with training switches inference ignores, plus a phase."""
    rows = 8
    return table_from_columns(
        dp=np.repeat([8, 4], 4),
        tp=np.repeat([8, 8], 4),
        pp=np.repeat([1, 2], 4),
        ep=np.repeat([64, 32], 4),
        recompute=np.tile(["none", "full"], rows // 2),
        zero_stage=np.tile([0, 0, 1, 1], 2),
        micro_batch_size=np.tile([1, 2, 1, 2], 2),
        phase=np.array([0, 0, 0, 0, 0, 0, 0, 2]),
    )


def _run(table, **extra):
    return estimate_inference_table(
        model=REF, cluster=H100_64, workload=WITH_SLOS, table=table, **extra
    )


def test_rows_alike_but_for_training_switches_price_as_each_row_alone() -> None:
    table = _table()
    prompts = np.array([4096, 4096, 1024, 4096, 4096, 4096, 4096, 4096])
    whole = _run(table, prompt_tokens=prompts)
    for row in range(8):
        alone = _run(select_rows(table, [row]), prompt_tokens=prompts[[row]])
        for name, value in alone.items():
            np.testing.assert_array_equal(whole[name][[row]], value, err_msg=name)


def test_inference_reads_no_training_only_column(monkeypatch) -> None:
    read: set[str] = set()

    class Recorded(dict):
        def __getitem__(self, name):
            read.add(name)
            return super().__getitem__(name)

    checked = inference_setup.checked_columns
    monkeypatch.setattr(
        inference_setup,
        "checked_columns",
        lambda table, workload: Recorded(checked(table, workload)),
    )
    _run(_table())
    assert "tp" in read and not read & TRAINING_ONLY_COLUMNS
