"""SGLang's expert-parallel traffic follows the path its export launches: DeepEP only where
``--moe-a2a-backend deepep`` is exported (ep == instance size), else no token movement inside an
attention replica and a gather / return over the TP group under attention data parallel."""

from __future__ import annotations

import shlex

import numpy as np
import pytest

from autoparallel import get_model
from autoparallel.export import export_plan
from autoparallel.plan import build_plan
from cost_model import (
    EstimateOptions,
    Inference,
    Layout,
    ParallelConfig,
    calibration_for,
    configs_to_table,
    estimate_inference_table,
    table_from_columns,
)
from cost_model._inference_comm import (
    SGLANG_DP_ALL_REDUCE_MAX_BYTES,
    _sglang_deepep,
    _sglang_dp_gathers,
)
from cost_model._inference_setup import _setup
from cost_model._pricing import collective_time_s
from cost_model._serving_columns import A2A_BACKEND_CODES, PHASE_CODES
from topology import get_preset

DSV3 = get_model("deepseek-v3")
B200 = get_preset("dgx-b200", num_nodes=1)
H200 = get_preset("dgx-h200", num_nodes=1)
MOE_LAYERS = DSV3.num_layers - DSV3.num_dense_ffn_layers
BATCH = 32


def _workload(engine: str) -> Inference:
    return Inference(
        prompt_tokens=1024, output_tokens=1024, weight_dtype="fp8", serving_engine=engine
    )


def _run(
    engine: str, *, phase: str = "decode", backend: str = "auto", batch: int = BATCH, **layout
) -> dict[str, np.ndarray]:
    table = table_from_columns(
        batch_size=batch,
        phase=PHASE_CODES[phase],
        a2a_backend=A2A_BACKEND_CODES[backend],
        **layout,
    )
    return estimate_inference_table(
        model=DSV3, cluster=B200, workload=_workload(engine), table=table
    )


def _seconds(out: dict[str, np.ndarray], part: str, phase: str = "decode") -> float:
    return float(out[f"time.{phase}_{part}"][0] + out.get(f"hidden.{phase}_{part}", [0.0])[0])


def _collective(op: str, message: float, group: float = 8.0) -> float:
    return float(
        collective_time_s(
            cluster=B200,
            op=op,
            group_size=group,
            ranks_per_node=group,
            message_bytes=message,
            calibration=calibration_for(B200.device),
        )
    )


def test_sglang_tp8_ep4_moves_no_tokens_and_sums_by_the_tp_all_reduce() -> None:
    # --tp-size 8 --ep-size 4 --moe-a2a-backend none: every rank holds the replica's tokens,
    # runs its local experts on them, and the layer's TP all-reduce sums the outputs
    for phase in ("decode", "prefill"):
        split = _run("sglang", phase=phase, tp=8, ep=4, etp=2)
        sliced = _run("sglang", phase=phase, tp=8, ep=1, etp=8)
        assert _seconds(split, "ep_comm", phase) == 0.0
        assert _seconds(split, "tp_comm", phase) == _seconds(sliced, "tp_comm", phase) > 0.0


def test_sglang_ep_spanning_the_instance_pays_deepep() -> None:
    # ep == tp-size: --moe-a2a-backend deepep, low-latency kernels in decode
    for layout in ({"tp": 8, "ep": 8}, {"dp": 8, "ep": 8}):
        sglang = _seconds(_run("sglang", **layout), "ep_comm")
        deepep = _seconds(_run("trtllm", **layout), "ep_comm")  # DeepEP for every ep row
        assert sglang > 0.0 and np.isclose(sglang, deepep, rtol=1e-12)
    named = _run("vllm", backend="low_latency", dp=8, ep=8)  # vLLM's DeepEP backend
    assert np.isclose(_seconds(_run("sglang", dp=8, ep=8), "ep_comm"), _seconds(named, "ep_comm"))


@pytest.mark.parametrize("ep,etp", [(4, 2), (1, 8)])
def test_sglang_attention_dp_without_deepep_gathers_and_returns_over_the_tp_group(
    ep: int, etp: int
) -> None:
    # --tp-size 8 --attn-dp-size 8 --moe-a2a-backend none: every layer gathers the 8 replicas'
    # BF16 hidden states over the TP group and returns the summed outputs (the MoE layers and
    # the tp-sharded dense FFN alike, in the batch's one padding mode); attention adds none
    layout = {"tp": 8, "ep": ep, "etp": etp, "attention_data_parallel": True}
    gathered = 8 * BATCH * DSV3.hidden_size * 2.0

    def tp_seconds(phase: str = "decode", batch: int = BATCH) -> float:
        out = _run("sglang", phase=phase, batch=batch, **layout)
        assert _seconds(out, "ep_comm", phase) == 0.0
        return _seconds(out, "tp_comm", phase)

    # decode, small buffer (SUM_LEN): an all-reduce to gather, one to sum and return
    expected = DSV3.num_layers * 2.0 * _collective("all_reduce", gathered)
    assert np.isclose(tp_seconds(), expected, rtol=1e-9)
    # prefill: extend batches are SUM_LEN too
    expected = DSV3.num_layers * 2.0 * _collective("all_reduce", gathered * 1024)
    assert np.isclose(tp_seconds("prefill"), expected, rtol=1e-9)
    # decode past the custom all-reduce's 16 MiB (MAX_LEN): all-gather and reduce-scatter
    big = gathered * 1024 / BATCH
    assert big > SGLANG_DP_ALL_REDUCE_MAX_BYTES
    expected = DSV3.num_layers * (
        _collective("all_gather", big) + _collective("reduce_scatter", big)
    )
    assert np.isclose(tp_seconds(batch=1024), expected, rtol=1e-9)


def test_sglang_deepep_attention_dp_dense_layers_follow_the_padding_mode() -> None:
    # --tp-size 8 --attn-dp-size 8 --moe-a2a-backend deepep: only the dense layers gather over
    # the TP group. An extend batch is SUM_LEN (all-reduces of the zero-padded buffer); a decode
    # batch skips the custom all-reduce shortcut under an a2a backend and an even one is MAX_LEN
    layout = {"tp": 8, "ep": 8, "etp": 1, "attention_data_parallel": True}
    dense = DSV3.num_dense_ffn_layers
    gathered = 8 * BATCH * DSV3.hidden_size * 2.0
    prefill = _run("sglang", phase="prefill", **layout)
    expected = dense * 2.0 * _collective("all_reduce", gathered * 1024)
    assert np.isclose(_seconds(prefill, "tp_comm", "prefill"), expected, rtol=1e-9)
    decode = _run("sglang", **layout)
    expected = dense * (
        _collective("all_gather", gathered) + _collective("reduce_scatter", gathered)
    )
    assert np.isclose(_seconds(decode, "tp_comm"), expected, rtol=1e-9)


def test_vllm_attention_dp_dense_layers_keep_all_gather_and_reduce_scatter() -> None:
    layout = {"tp": 8, "ep": 8, "etp": 1, "attention_data_parallel": True}
    gathered = 8 * BATCH * DSV3.hidden_size * 2.0
    out = _run("vllm", phase="prefill", **layout)
    message = gathered * 1024
    expected = DSV3.num_dense_ffn_layers * (
        _collective("all_gather", message) + _collective("reduce_scatter", message)
    )
    assert np.isclose(_seconds(out, "tp_comm", "prefill"), expected, rtol=1e-9)


def _exported_flags(config: ParallelConfig) -> dict[str, str]:
    """The SGLang launch flags of ``config``'s plan (unpriced: only its layout matters here)."""
    job = _workload("sglang")
    plan = build_plan(
        model=DSV3, cluster=H200, job=job, layout=Layout(config=config), predicted=None
    )
    text = export_plan(plan, format="sglang").files["launch_sglang_colocated.sh"]
    words = shlex.split(text.replace("\\\n", " "))
    return {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}


def test_priced_sglang_path_is_the_exported_backend() -> None:
    configs = [
        ParallelConfig(tp=8, ep=8),
        ParallelConfig(tp=8, ep=4, etp=2),
        ParallelConfig(tp=8, ep=8, attention_data_parallel=True),
        ParallelConfig(tp=8, ep=4, etp=2, attention_data_parallel=True),
        ParallelConfig(tp=8, ep=1, etp=8, attention_data_parallel=True),
        ParallelConfig(tp=4, dp=2, ep=8),
        ParallelConfig(tp=2, dp=4, ep=4, etp=2),
    ]
    exported = [_exported_flags(config) for config in configs]
    s = _setup(
        model=DSV3,
        cluster=H200,
        workload=_workload("sglang"),
        table=configs_to_table(configs),
        options=EstimateOptions(),
    )
    deepep = [flags.get("--moe-a2a-backend") == "deepep" for flags in exported]
    gathers = [not d and "--attn-dp-size" in flags for d, flags in zip(deepep, exported)]
    assert deepep == [True, False, True, False, False, True, False]
    assert gathers == [False, False, False, True, True, False, True]
    assert _sglang_deepep(s).tolist() == deepep
    assert _sglang_dp_gathers(s).tolist() == gathers
