"""Two-batch overlap hides a micro-batch's all-to-all only behind the stage the other runs meanwhile."""

from __future__ import annotations

import numpy as np

from autoparallel import get_model
from cost_model import EstimateOptions, Inference, estimate_inference_table, table_from_columns
from cost_model._options import calibration_for
from topology import get_preset

DSV3 = get_model("deepseek-v3")
WORKLOAD = Inference(prompt_tokens=2000, output_tokens=1, weight_dtype="fp8", kv_dtype="bf16")


def _decode(inter_node_scale: float) -> dict:
    """LMSYS's decode pool: 9 H100 nodes, attention data parallel over 72 ranks, EP 72, 256
    sequences a rank, two-batch overlap."""
    cluster = get_preset("dgx-h100", num_nodes=9)
    network = cluster.inter_node
    cluster = cluster.model_copy(
        update={
            "inter_node": network.model_copy(
                update={"bandwidth_bytes_per_s": inter_node_scale * network.bandwidth_bytes_per_s}
            )
        }
    )
    table = table_from_columns(
        dp=72, ep=72, attention_data_parallel=True, batch_size=256, phase=2, two_batch_overlap=True
    )
    options = EstimateOptions(calibration=calibration_for(cluster.device))
    return estimate_inference_table(
        model=DSV3, cluster=cluster, workload=WORKLOAD, table=table, options=options
    )


def test_traffic_longer_than_the_other_micro_batchs_stage_is_exposed() -> None:
    columns = _decode(1.0)
    compute = columns["time.decode_compute"][0] + columns["time.decode_attention"][0]
    exposed, hidden = columns["time.decode_ep_comm"][0], columns["hidden.decode_ep_comm"][0]
    # the pass computes longer than its all-to-alls take, but a combine outlasts the attention
    # core it runs beside: that excess stays on the step
    assert compute > exposed + hidden
    assert 0.0 < exposed < 0.5 * (exposed + hidden)
    assert columns["step_time_s"][0] == np.float64(compute + exposed)


def test_a_network_fast_enough_for_every_stage_hides_all_of_it() -> None:
    columns = _decode(8.0)
    assert columns["time.decode_ep_comm"][0] == 0.0 and columns["hidden.decode_ep_comm"][0] > 0.0
