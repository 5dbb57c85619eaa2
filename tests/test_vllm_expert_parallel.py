"""vLLM's expert-parallel traffic: all-gather / reduce-scatter across attention replicas only."""

from __future__ import annotations

import numpy as np

from autoparallel import get_model
from cost_model import Inference, calibration_for, estimate_inference_table, table_from_columns
from cost_model._pricing import collective_time_s
from cost_model._serving_columns import A2A_BACKEND_CODES, PHASE_CODES
from topology import get_preset

DSV3 = get_model("deepseek-v3")
B200 = get_preset("dgx-b200", num_nodes=1)
MOE_LAYERS = DSV3.num_layers - DSV3.num_dense_ffn_layers
BATCH = 32


def _run(engine: str, *, backend: str = "auto", **layout) -> dict[str, np.ndarray]:
    workload = Inference(
        prompt_tokens=1024, output_tokens=1024, weight_dtype="fp8", serving_engine=engine
    )
    table = table_from_columns(
        batch_size=BATCH,
        phase=PHASE_CODES["decode"],
        a2a_backend=A2A_BACKEND_CODES[backend],
        **layout,
    )
    return estimate_inference_table(model=DSV3, cluster=B200, workload=workload, table=table)


def _ep_seconds(out: dict[str, np.ndarray], phase: str = "decode") -> float:
    return float(out[f"time.{phase}_ep_comm"][0] + out[f"hidden.{phase}_ep_comm"][0])


def test_vllm_tensor_parallel_experts_split_by_ep_send_no_expert_traffic() -> None:
    # --tensor-parallel-size 8 --enable-expert-parallel: one attention replica, tokens already
    # on every rank; the MoE output is summed by the layer's TP all-reduce, as with ep=1
    split = _run("vllm", tp=8, ep=8)
    sliced = _run("vllm", tp=8, ep=1, etp=8)
    assert _ep_seconds(split) == 0.0
    assert split["time.decode_tp_comm"][0] == sliced["time.decode_tp_comm"][0] > 0.0
    assert _ep_seconds(_run("vllm", backend="low_latency", tp=8, ep=8)) == 0.0
    assert _ep_seconds(_run("sglang", tp=8, ep=8)) > 0.0  # DeepEP pricing, unchanged


def test_vllm_data_parallel_experts_gather_tokens_and_scatter_outputs() -> None:
    # --data-parallel-size 8 --enable-expert-parallel: every rank all-gathers the group's FP8
    # tokens (with top-k ids and weights) and reduce-scatters BF16 outputs, per MoE layer
    out = _run("vllm", dp=8, ep=8)
    tokens = 8 * BATCH
    gathered = tokens * (DSV3.hidden_size * 1.0 + DSV3.moe.top_k * 8.0)
    timed = {
        op: collective_time_s(
            cluster=B200,
            op=op,
            group_size=8.0,
            ranks_per_node=8.0,
            message_bytes=message,
            calibration=calibration_for(B200.device),
        )
        for op, message in (
            ("all_gather", gathered),
            ("reduce_scatter", tokens * DSV3.hidden_size * 2.0),
        )
    }
    expected = MOE_LAYERS * (float(timed["all_gather"]) + float(timed["reduce_scatter"]))
    assert np.isclose(_ep_seconds(out), expected, rtol=1e-9)
    assert _ep_seconds(out) != _ep_seconds(_run("sglang", dp=8, ep=8))


def test_vllm_named_deepep_backend_prices_deepep_across_replicas() -> None:
    deepep = _run("vllm", backend="low_latency", dp=8, ep=8)
    assert np.isclose(
        _ep_seconds(deepep), _ep_seconds(_run("sglang", backend="low_latency", dp=8, ep=8))
    )


def test_vllm_tensor_parallel_replicas_scatter_and_gather_around_their_moe_layers() -> None:
    # --data-parallel-size 2 --tensor-parallel-size 4 --enable-expert-parallel: each MoE layer
    # reduce-scatters attention's output over the 4 tp ranks and all-gathers the MoE output back
    out = _run("vllm", dp=2, tp=4, ep=8)
    message = BATCH * DSV3.hidden_size * 2.0
    scatter_gather = sum(
        float(
            collective_time_s(
                cluster=B200,
                op=op,
                group_size=4.0,
                ranks_per_node=4.0,
                message_bytes=message,
                calibration=calibration_for(B200.device),
            )
        )
        for op in ("reduce_scatter", "all_gather")
    )
    replicated = _run("vllm", tp=4, ep=4)  # the same replica, experts inside it: all-reduces
    dense_layers = DSV3.num_layers - MOE_LAYERS
    all_reduce = replicated["time.decode_tp_comm"][0] / (2 * DSV3.num_layers)
    expected = 2 * dense_layers * all_reduce + MOE_LAYERS * scatter_gather
    assert np.isclose(out["time.decode_tp_comm"][0], expected, rtol=1e-9)
    sglang = _run("sglang", dp=2, tp=4, ep=8)["time.decode_tp_comm"][0]
    assert np.isclose(sglang, _run("sglang", tp=4, ep=4)["time.decode_tp_comm"][0])


def _kernels(engine: str, configs) -> list[float]:
    from cost_model import EstimateOptions, configs_to_table
    from cost_model._inference_kernels import _kernels_per_pass
    from cost_model._inference_setup import _setup

    workload = Inference(
        prompt_tokens=1024, output_tokens=1024, weight_dtype="fp8", serving_engine=engine
    )
    s = _setup(
        model=DSV3,
        cluster=B200,
        workload=workload,
        table=configs_to_table(configs),
        options=EstimateOptions(),
    )
    return np.max(_kernels_per_pass(s), axis=0).tolist()


def test_expert_kernel_count_follows_the_priced_path() -> None:
    # an EP group inside one attention replica launches no dispatch / combine kernels in vLLM
    # (``use_all2all_kernels`` false) nor in SGLang without DeepEP; across replicas (vLLM) or
    # over the whole instance (SGLang's DeepEP) each MoE layer launches two
    from cost_model import ParallelConfig

    configs = [
        ParallelConfig(tp=8, ep=1, etp=8),
        ParallelConfig(tp=8, ep=8),
        ParallelConfig(tp=8, ep=4, etp=2),
    ]
    vllm = _kernels("vllm", configs)
    assert vllm[0] == vllm[1] == vllm[2]
    spanning = _kernels("vllm", [ParallelConfig(dp=8, ep=8), ParallelConfig(dp=8, ep=1)])
    assert spanning[0] - spanning[1] == 2.0 * MOE_LAYERS
    sglang = _kernels("sglang", configs)
    assert sglang[0] == sglang[2]
    assert sglang[1] - sglang[0] == 2.0 * MOE_LAYERS  # DeepEP: ep == instance size
