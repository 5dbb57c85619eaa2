"""The layout rules over a config table agree with the rules over one config, and a table row
that breaks one is named with its rule instead of failing deep inside the cost model."""

from __future__ import annotations

import numpy as np
import pytest

from autoparallel import get_model
from cost_model import (
    Inference,
    ParallelConfig,
    Training,
    configs_to_table,
    estimate_table,
    table_from_columns,
)
from cost_model._rules import illegal_rows, row_rule_broken
from topology import get_preset

MODELS = (
    "deepseek-v3",  # MLA, MoE with leading dense layers
    "qwen3-235b-a22b",  # GQA with 4 KV heads, MoE
    "llama-3.1-405b",  # dense GQA
    "minimax-m2.5",  # GQA, 48 query and 8 KV heads: tp 6 divides neither way
    "qwen3.5-397b-a17b",  # Gated DeltaNet linear attention, MoE
    "nemotron-3-nano-30b-a3b",  # Mamba-2 mixers, MoE
)


def _random_table(rng: np.random.Generator, rows: int) -> dict[str, np.ndarray]:
    def pick(values):
        return rng.choice(np.asarray(values), size=rows)

    return table_from_columns(
        dp=pick([0, 1, 2, 3, 4, 8, 9, 16]),
        tp=pick([1, 2, 3, 4, 6, 8, 16, 64]),
        pp=pick([1, 2, 4, 8, 16, 64, 128]),
        cp=pick([1, 2]),
        ep=pick([1, 2, 3, 8, 16, 24, 64]),
        etp=pick([1, 2, 3, 4]),
        sequence_parallel=pick([False, True]),
        attention_data_parallel=pick([False, True]),
        pipeline_schedule=pick([0, 1, 2, 3]),
        virtual_stages=pick([1, 1, 2, 4]),
    )


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("expert_slots_fixed", [True, False])
def test_the_table_rules_are_the_config_rules(name: str, expert_slots_fixed: bool) -> None:
    """Row by row, the column rules reject exactly the rows ``check_parallel_config`` rejects."""
    model = get_model(name)
    table = _random_table(np.random.default_rng(len(name)), 400)
    mask = illegal_rows(table, model, expert_slots_fixed=expert_slots_fixed)
    scalar = np.array(
        [
            row_rule_broken(table, row, model, expert_slots_fixed=expert_slots_fixed) is not None
            for row in range(400)
        ]
    )
    assert 0 < scalar.sum() < 400  # both kinds of row are drawn
    assert np.array_equal(mask, scalar), np.flatnonzero(mask != scalar)[:5]


def test_a_training_row_that_breaks_a_rule_is_named_with_its_rule() -> None:
    """DeepSeek-V3 on one GB200 NVL72 domain, 9 data-parallel ranks over 8 pipeline stages with
    16-way expert parallelism: the expert groups do not tile the 9 ranks. The table used to fail
    deep in the collective pricing (``group_size (0.5625) must be >= 1``)."""
    model = get_model("deepseek-v3")
    legal = ParallelConfig(dp=9, pp=8, ep=1)
    broken = ParallelConfig.model_construct(**{**legal.model_dump(), "ep": 16})
    table = configs_to_table([legal, broken])
    workload = Training(sequence_length_tokens=4096, global_batch_tokens=4096 * 1152)
    cluster = get_preset("gb200-nvl72", num_nodes=1)
    with pytest.raises(ValueError, match=r"table row 1 .*dp\*cp\*tp \(9\).*ep\*etp \(16\)"):
        estimate_table(model, cluster, workload, table)
    columns = estimate_table(model, cluster, workload, configs_to_table([legal]))
    assert np.isfinite(columns["step_time_s"]).all()


def test_serving_rows_may_split_the_experts_unevenly_but_not_the_ranks() -> None:
    """256 routed experts over EP 24 is legal for serving (redundant slots make 11 per rank);
    EP 16 over 24 ranks is not."""
    model = get_model("deepseek-v3")
    cluster = get_preset("dgx-h200", num_nodes=3)
    workload = Inference(prompt_tokens=1024, output_tokens=256, weight_dtype="fp8")
    uneven = ParallelConfig(tp=8, dp=3, ep=24, attention_data_parallel=True)
    columns = estimate_table(model, cluster, workload, configs_to_table([uneven]))
    assert np.isfinite(columns["tpot_s"]).all()
    broken = ParallelConfig.model_construct(**{**uneven.model_dump(), "ep": 16})
    with pytest.raises(ValueError, match=r"table row 0 .*ep\*etp \(16\)"):
        estimate_table(model, cluster, workload, configs_to_table([broken]))
