"""vLLM's -O2 all-reduce + RMSNorm fusion in the decode step's TP all-reduces."""

from __future__ import annotations

import numpy as np

from autoparallel import get_model
from cost_model import Inference, estimate_inference_table, table_from_columns
from cost_model._kernel_curves_comm import all_reduce_time_s
from cost_model._serving_columns import PHASE_CODES
from cost_model._serving_profile import serving_profile
from topology import get_preset

DSV3 = get_model("deepseek-v3")
B200 = get_preset("dgx-b200", num_nodes=1)


def _decode(version: str, batch: int) -> dict[str, np.ndarray]:
    workload = Inference(
        prompt_tokens=1024,
        output_tokens=1024,
        weight_dtype="fp8",
        serving_engine="vllm",
        serving_engine_version=version,
    )
    table = table_from_columns(tp=8, batch_size=batch, phase=PHASE_CODES["decode"])
    return estimate_inference_table(model=DSV3, cluster=B200, workload=workload, table=table)


def test_small_decode_all_reduces_run_fused_with_their_norms() -> None:
    # 4 tokens x 7168 x 2 bytes per rank: under vLLM's 1 MiB TP 8 limit
    fused, apart = _decode("0.17.0", 4), _decode("0.11.2", 4)
    assert serving_profile("vllm", "0.11.2").fused_allreduce_norm_max_bytes == {}
    kernel = all_reduce_time_s(
        device_name=B200.device.name, group=8.0, message_bytes=4 * 7168 * 2.0, engine="trtllm"
    )
    assert np.isclose(fused["time.decode_tp_comm"][0], 2 * DSV3.num_layers * float(kernel[0]))
    assert fused["time.decode_tp_comm"][0] < apart["time.decode_tp_comm"][0]
    # the residual add + RMSNorm after each all-reduce is no kernel of its own
    floor = serving_profile("vllm", "0.17.0").kernel_floor_s
    saved = apart["time.decode_compute"][0] - fused["time.decode_compute"][0]
    assert np.isclose(saved, 2 * DSV3.num_layers * floor)


def test_all_reduces_past_the_fusion_limit_run_apart() -> None:
    # 128 tokens x 7168 x 2 bytes = 1.75 MiB per rank: over the TP 8 limit
    fused, apart = _decode("0.17.0", 128), _decode("0.11.2", 128)
    assert fused["time.decode_tp_comm"][0] == apart["time.decode_tp_comm"][0]
    assert fused["time.decode_compute"][0] == apart["time.decode_compute"][0]
