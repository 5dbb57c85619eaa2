"""Communication of one inference pass on each pipeline rank: TP, EP, CP and PP traffic, in seconds.

A TP all-reduce (prefill and decode) over NVLink-connected ranks of one node takes the serving
engine's measured latency for its message size and GPU count
(``_kernel_curves_comm.all_reduce_time_s``:
its custom all-reduce kernel, NCCL above its size limit, timed in a CUDA graph) where a table
covers the device, BF16 activations and that GPU count; elsewhere the topology's collective model.
An all-reduce the engine fuses with the residual add and RMSNorm after it (vLLM's -O2
AllReduceFusionPass, ``ServingProfile.fused_allreduce_norm_max_bytes``) takes the table of the
fused kernel's family and launches no norm kernel (``_fused_allreduce_norm``). Expert-parallel
traffic follows the engine's default path (``_expert_comm``): DeepEP's all-to-all (its
low-latency and normal kernels each at their latency and bandwidths fitted on DeepEP's measured
kernels), or vLLM's
all-gather / reduce-scatter across attention replicas and none inside one; SGLang runs DeepEP
only where its export launches it (``_engine_paths.sglang_uses_deepep``: ep = the instance) and
otherwise moves no tokens inside an attention replica, gathering over the instance under
attention data parallel (``_sglang_dp_gather_scatter``, TP traffic).
"""

from __future__ import annotations

import numpy as np

from cost_model import _inference_ops as ops
from cost_model._engine_paths import attention_replicas, instance_size, sglang_uses_deepep
from cost_model._inference_setup import (
    COMBINE_BYTES,
    _dispatch_bytes,
    _part_dtype,
    _Setup,
    _tokens,
    busiest_rank_load_factor,
)
from cost_model._kernel_curves_comm import (
    all_reduce_time_s,
    deepep_low_latency_s,
    deepep_normal_s,
    expert_all_to_all_bytes,
)
from cost_model._pricing import collective_time_s
from cost_model._serving_columns import A2A_BACKEND_CODES
from cost_model._units import dtype_bytes


def _collective(s: _Setup, op: str, axis: str, group, message) -> np.ndarray:
    local = np.minimum(s.group_local[axis], group)
    return collective_time_s(
        cluster=s.cluster,
        op=op,
        group_size=group,
        ranks_per_node=local,
        message_bytes=message,
        calibration=s.calibration,
        rows=s.rows,
    )


def _all_reduce_measured(s: _Setup) -> np.ndarray:
    """Rows whose TP all-reduce takes a measured latency (``_tp_all_reduce``), (n,) bool: tp > 1
    within one node, BF16-sized activations, and a table for the device at that GPU count."""
    if "_all_reduce_measured" not in s.__dict__:
        tp = s.column("tp")
        covered = (tp > 1) & (s.group_local["tp"] >= tp)
        measured = None
        if dtype_bytes(s.workload.activation_dtype) == 2.0 and np.any(covered):
            measured = all_reduce_time_s(
                device_name=s.hardware.name, group=tp, message_bytes=1.0, engine=s.profile.engine
            )
        s.__dict__["_all_reduce_measured"] = (
            np.zeros(tp.shape, dtype=bool) if measured is None else covered & ~np.isnan(measured)
        )
    return s.__dict__["_all_reduce_measured"]


#: The imported all-reduce table of the kernel family behind FlashInfer's ``allreduce_fusion``,
#: which vLLM's AllReduceFusionPass calls: TensorRT-LLM's all-reduce(-fusion) kernels, which
#: FlashInfer ported (aiconfigurator times TensorRT-LLM's ``AllReduce``, AUTO strategy, in a CUDA
#: graph; ``collector/collect_all_reduce.py``). vLLM's own table times its unfused custom
#: all-reduce (aiconfigurator ``sdk/models/deepseek.py``: "collect_all_reduce.py benchmarks
#: vLLM's native allreduce").
FUSED_ALLREDUCE_TABLE = "trtllm"


def _fused_allreduce_norm(s: _Setup, message) -> np.ndarray:
    """Rows whose TP all-reduce of ``message`` bytes per rank runs fused with the residual add
    and RMSNorm after it, (n,) bool: the engine fuses all-reduces of that size at that tp
    (``ServingProfile.fused_allreduce_norm_max_bytes``: vLLM's -O2 AllReduceFusionPass) and the
    all-reduce is a measured one (``_all_reduce_measured``)."""
    tp = s.column("tp")
    limit = np.zeros_like(tp)
    for size, max_bytes in s.profile.fused_allreduce_norm_max_bytes.items():
        limit = np.where(tp == size, max_bytes, limit)
    return _all_reduce_measured(s) & ~s.attention_dp & (np.asarray(message) <= limit)


def _fused_norm_kernels(s: _Setup, p: ops.Pass) -> np.ndarray:
    """Kernels a pass does not launch because its all-reduces absorb them, (3, n): the residual
    add + RMSNorm after each of a layer's two TP all-reduces (``_fused_allreduce_norm``)."""
    attention_tokens, _ = _tokens(s, p)
    message = attention_tokens * s.model.hidden_size * dtype_bytes(s.workload.activation_dtype)
    lay = s.layout  # sequence-parallel MoE layers have no all-reduce (``_sequence_parallel_moe``)
    all_reducing = lay.layers - lay.moe_layers * _sequence_parallel_moe(s)
    return 2.0 * all_reducing * _fused_allreduce_norm(s, message)


def _tp_all_reduce(s: _Setup, message) -> np.ndarray:
    """One TP all-reduce of ``message`` bytes per rank, (n,) seconds: the serving engine's
    measured latency where ``_all_reduce_measured``, which holds the kernel (it pays no
    per-kernel floor on top: ``_inference_kernels._measured_kernels_per_pass``); else the
    collective model. An
    all-reduce the engine fuses with the norm after it (``_fused_allreduce_norm``) takes the
    latency of the fused kernel's family (``FUSED_ALLREDUCE_TABLE``) where that table measured
    the group size."""
    tp, measured_rows = s.column("tp"), _all_reduce_measured(s)
    modelled = None
    if not np.all(measured_rows):
        modelled = _collective(s, "all_reduce", "tp", tp, message)
    if not np.any(measured_rows):
        assert modelled is not None
        return modelled
    message = np.broadcast_to(np.asarray(message, dtype=np.float64), tp.shape)

    def table(engine: str) -> np.ndarray:
        return s.rows.evaluate(
            all_reduce_time_s,
            device_name=s.hardware.name,
            group=tp,
            message_bytes=message,
            engine=engine,
        )

    measured = table(s.profile.engine)
    fused = _fused_allreduce_norm(s, message)
    if np.any(fused):
        kernel = table(FUSED_ALLREDUCE_TABLE)
        measured = np.where(fused & ~np.isnan(kernel), kernel, measured)
    return measured if modelled is None else np.where(measured_rows, measured, modelled)


def _real_traffic_excess(s: _Setup, rank_tokens: np.ndarray) -> np.ndarray:
    """The busiest expert rank's load under real traffic over its load under uniform routing,
    (n,) (``busiest_rank_load_factor``): the busiest rank receives (dispatch) and returns
    (combine) its routed excess and the kernel ends with its transfers, while DeepEP's measured
    kernels, the fits' inputs, ran uniform random routing."""
    return busiest_rank_load_factor(s, rank_tokens) / busiest_rank_load_factor(
        s, rank_tokens, real_traffic=False
    )


def _busiest_rank_bytes(
    s: _Setup, rank_tokens: np.ndarray, element_bytes: float, *, node_dedup, excess: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(NVLink, RDMA) bytes of one dispatch or combine on the busiest expert rank, (n,) each:
    ``_kernel_curves_comm.expert_all_to_all_bytes`` of the mean rank times ``excess``
    (``_real_traffic_excess``)."""
    assert s.model.moe is not None
    ep = s.column("ep")
    intra_bytes, inter_bytes = s.rows.evaluate(
        expert_all_to_all_bytes,
        rank_tokens=rank_tokens,
        hidden_size=s.model.hidden_size,
        element_bytes=element_bytes,
        copies=s.model.moe.top_k * s.column("etp"),
        ep=ep,
        local=np.minimum(s.group_local["ep"], ep),
        node_dedup=node_dedup,
    )
    return intra_bytes * excess, inter_bytes * excess


def _expert_all_to_all(
    s: _Setup,
    rank_tokens: np.ndarray,
    element_bytes: float,
    *,
    node_dedup,
    direction: str,
    excess: np.ndarray,
) -> np.ndarray:
    """One MoE dispatch (or combine) as DeepEP runs it: every rank writes straight to its peers,
    NVLink and RDMA at once, so the time is the slower tier's bytes over its bandwidth plus one
    latency (DeepEP README; not the n-1 rounds of a pairwise all-to-all); the bytes per tier are
    the busiest rank's (``_busiest_rank_bytes``). Low-latency kernels (``node_dedup`` False) take
    the latency and tier efficiencies fitted on DeepEP's measured low-latency kernels
    (``_kernel_curves_comm.deepep_low_latency_s``), normal kernels those fitted on its measured
    normal kernels (``_kernel_curves_comm.deepep_normal_s``); without a shipped fit, a kernel is
    priced by the topology as point-to-point transfers on each tier over the calibrated
    collective efficiency."""
    ep = s.column("ep")
    local = np.minimum(s.group_local["ep"], ep)
    intra_bytes, inter_bytes = _busiest_rank_bytes(
        s, rank_tokens, element_bytes, node_dedup=node_dedup, excess=excess
    )
    remote = ep > local

    def point_to_point(ranks_per_node, message) -> np.ndarray:
        return collective_time_s(
            cluster=s.cluster,
            op="send_recv",
            group_size=2.0,
            ranks_per_node=ranks_per_node,
            message_bytes=message,
            calibration=s.calibration,
            rows=s.rows,
        )

    inter_bytes_remote = np.where(remote, inter_bytes, 0.0)
    low_latency = deepep_low_latency_s(
        direction=direction,
        intra_bytes=intra_bytes,
        inter_bytes=inter_bytes_remote,
        cluster=s.cluster,
    )
    normal = deepep_normal_s(
        direction=direction,
        intra_bytes=intra_bytes,
        inter_bytes=inter_bytes_remote,
        nodes=ep / local,
        cluster=s.cluster,
    )
    dedup = np.broadcast_to(np.asarray(node_dedup, dtype=bool), np.shape(ep))
    unfitted = (low_latency is None and not dedup.all()) or (normal is None and dedup.any())
    seconds = (
        np.maximum(
            point_to_point(2.0, intra_bytes),
            np.where(remote, point_to_point(1.0, inter_bytes), 0.0),
        )
        if unfitted
        else np.zeros(np.shape(ep))
    )
    for measured, kernel_rows in ((low_latency, ~dedup), (normal, dedup)):
        if measured is not None:
            seconds = np.where(kernel_rows, measured, seconds)
    return np.where(ep > 1, seconds, 0.0)


def _deepep_expert_comm(s: _Setup, rank_tokens: np.ndarray, *, decode: bool) -> np.ndarray:
    """DeepEP's dispatch and combine of one MoE layer, (n,) seconds: ``normal`` kernels for a
    prefill pass and ``low_latency`` ones for a decode step unless the ``a2a_backend`` column
    names one."""
    backend = np.asarray(s.table["a2a_backend"], dtype=np.int64)
    normal = np.where(
        backend == A2A_BACKEND_CODES["auto"], not decode, backend == A2A_BACKEND_CODES["normal"]
    )
    # NVFP4 experts take an FP8 dispatch as well (DeepEP dispatches FP8 or BF16 tokens).
    fp4 = _part_dtype(s, "routed_experts") == "fp4"
    dispatch_bytes = 1.0 if fp4 else _dispatch_bytes(s)
    excess = _real_traffic_excess(s, rank_tokens)  # the same tokens both ways
    dispatch = _expert_all_to_all(
        s, rank_tokens, dispatch_bytes, node_dedup=normal, direction="dispatch", excess=excess
    )
    combine = _expert_all_to_all(
        s, rank_tokens, COMBINE_BYTES, node_dedup=normal, direction="combine", excess=excess
    )
    return dispatch + combine


def _gathered_token_bytes(s: _Setup) -> float:
    """Bytes per token that vLLM's all-gather dispatch moves: the hidden state quantized for the
    experts before the collective (``prepare_finalize/naive_dp_ep.py``
    ``_quantize_and_setup_dispatch``; NVFP4: 4-bit elements plus one FP8 scale per 16-element
    block, gathered unswizzled; FP8 experts: one byte per element, their per-block scales left
    out) and the router's top-k ids and weights (int32 and float32, gathered alongside)."""
    assert s.model.moe is not None
    fp4 = _part_dtype(s, "routed_experts") == "fp4"
    element = 0.5 + 1.0 / 16.0 if fp4 else _dispatch_bytes(s)
    return s.model.hidden_size * element + s.model.moe.top_k * (4.0 + 4.0)


def _experts_span_replicas(s: _Setup) -> np.ndarray:
    """Rows whose expert group (ep x etp ranks) reaches past one attention replica (cp x the
    attention shard), (n,) bool: in vLLM, data parallelism under expert parallelism."""
    return s.column("ep") * s.column("etp") > s.column("cp") * s.shard


def _sequence_parallel_moe(s: _Setup) -> np.ndarray:
    """Rows whose MoE layers vLLM runs sequence-parallel, (n,) bool: expert parallelism across
    attention replicas (data parallel > 1) with tp > 1 and no pipeline
    (``ParallelConfig.use_sequence_parallel_moe``; DeepSeek's decoder layer also requires
    pipeline size 1, ``models/deepseek_v2.py``; read in vLLM 0.33.0). Each tp rank sends its
    1/tp of the replica's tokens to the experts: attention's output is reduce-scattered over the
    tp group instead of all-reduced, and the MoE output all-gathered back
    (``DeepseekV2DecoderLayer.forward``), two collectives in place of the layer's two
    all-reduces."""
    if s.profile.engine != "vllm" or s.model.moe is None:
        return np.zeros(s.shard.shape, dtype=bool)
    return (
        _experts_span_replicas(s)
        & (s.column("ep") > 1)
        & (s.column("tp") > 1)
        & ~s.attention_dp
        & (s.column("pp") == 1)
    )


def _gather_scatter_expert_comm(s: _Setup, rank_tokens: np.ndarray) -> np.ndarray:
    """vLLM's default expert-parallel traffic of one MoE layer, (n,) seconds: an all-gather of
    every EP rank's tokens over the EP group before the experts and a reduce-scatter of their
    BF16 outputs after (``--all2all-backend allgather_reducescatter``, the default of
    ``vllm/config/parallel.py`` ``ParallelConfig.all2all_backend``; ``AgRsAll2AllManager.dispatch``
    / ``.combine`` in ``vllm/distributed/device_communicators/all2all.py``; read in vLLM 0.33.0;
    already the default when vLLM PR #33728 of 2026-02 removed the broadcast-based ``naive``
    backend). vLLM only takes this path when the EP group spans several attention replicas
    (``FusedMoEParallelConfig.use_all2all_kernels``: data parallel > 1): with the experts split
    over the ranks of one tensor-parallel replica every rank already holds all its tokens, runs
    its local experts on them and the layer's TP all-reduce sums the outputs
    (``runner/moe_runner.py`` ``_maybe_reduce_final_output``), which ``tp_comm`` prices."""
    ep = s.column("ep")
    gathered = rank_tokens * ep  # the EP group's tokens, which every rank receives
    gather = _collective(s, "all_gather", "ep", ep, gathered * _gathered_token_bytes(s))
    scatter = _collective(
        s, "reduce_scatter", "ep", ep, gathered * s.model.hidden_size * COMBINE_BYTES
    )
    return np.where(_experts_span_replicas(s) & (ep > 1), gather + scatter, 0.0)


#: The largest gathered decode buffer SGLang gathers and combines with two all-reduces: its
#: custom all-reduce's workspace cap, ``SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB`` = 16 MiB by
#: default (``srt/environ.py``; ``CustomAllReduceV2.max_size`` in
#: ``srt/distributed/device_communicators/custom_all_reduce_v2.py``, which the tuned per-world-size
#: workspaces of Hopper and Blackwell do not lower; read in SGLang 0.5.23).
SGLANG_DP_ALL_REDUCE_MAX_BYTES = 16.0 * 2**20


def _sglang_deepep(s: _Setup) -> np.ndarray:
    """Rows SGLang runs through DeepEP, (n,) bool: the predicate its export launches
    ``--moe-a2a-backend deepep`` by (``_engine_paths.sglang_uses_deepep``)."""
    return sglang_uses_deepep(tp=s.column("tp"), ep=s.column("ep"), etp=s.column("etp"))


def _sglang_dp_gathers(s: _Setup) -> np.ndarray:
    """Rows whose MoE layers SGLang runs on the tokens of every attention replica of the
    instance, (n,) bool: attention data parallel (``--attn-dp-size`` > 1) without DeepEP. The
    default ``--moe-a2a-backend none`` (``StandardDispatcher``) moves no tokens, so the layer's
    input is gathered over the TP group before the experts (``dp_gather_partial`` in
    ``srt/layers/dp_attention.py``) and brought back after (``layer_boundary/exit.py``)."""
    if "_sglang_dp_gathers" in s.__dict__:  # the same for every pass of one setup
        return s.__dict__["_sglang_dp_gathers"]
    gathers = np.zeros(s.shard.shape, dtype=bool)
    if s.profile.engine == "sglang" and s.model.moe is not None:
        replicas = attention_replicas(
            tp=s.column("tp"),
            ep=s.column("ep"),
            etp=s.column("etp"),
            attention_data_parallel=s.attention_dp,
        )
        gathers = (replicas > 1) & ~_sglang_deepep(s)
    s.__dict__["_sglang_dp_gathers"] = gathers
    return gathers


def _sglang_dp_gather_return(s: _Setup, gathered: np.ndarray, group, *, decode: bool) -> np.ndarray:
    """SGLang's gather of one layer's FFN input over ``group`` ranks under attention data
    parallel and the return of its summed output, (n,) seconds, for a ``gathered`` buffer of
    bytes. Every layer of a forward follows the batch's padding mode
    (``DpPaddingMode.get_dp_padding_mode``, ``srt/layers/dp_attention.py``, read in SGLang
    0.5.23): an extend (prefill) batch over several replicas is ``SUM_LEN``, and so is a decode
    batch whose gathered buffer fits the custom all-reduce without an a2a MoE backend
    (``_decode_sum_len_fits_custom_all_reduce``: ``--moe-a2a-backend none``, one NVLink node,
    ``SGLANG_DP_ALL_REDUCE_MAX_BYTES``): the gather is an all-reduce of the zero-padded buffer
    (``_dp_gather_via_all_reduce``) and the return an all-reduce and a local slice
    (``all_reduce_to_dp_local``, as ``_select_dp_reduce_scatter`` in
    ``srt/layers/layer_boundary/exit.py`` picks no reduce-scatter outside ``MAX_LEN``). Any
    other even decode batch is ``MAX_LEN`` (the cost-based choice, ``sum_len * 2 >= max_len *
    width``): an all-gather (``_dp_gather_via_all_gather``) and a reduce-scatter
    (``dp_reduce_scatter_tensor``). Both move hidden states in the activation dtype (the FP8
    gather is opt-in: ``SGLANG_ENABLE_DP_GATHER_FP8``, off by default)."""
    one_node = group <= s.cluster.devices_per_node

    def collective(op: str) -> np.ndarray:
        return collective_time_s(
            cluster=s.cluster,
            op=op,
            group_size=group,
            ranks_per_node=np.minimum(group, s.cluster.devices_per_node),
            message_bytes=gathered,
            calibration=s.calibration,
            rows=s.rows,
        )

    all_reduces = 2.0 * collective("all_reduce")
    fits = one_node & (gathered <= SGLANG_DP_ALL_REDUCE_MAX_BYTES) & ~_sglang_deepep(s)
    sum_len = (not decode) | fits
    if np.all(sum_len):
        return all_reduces
    return np.where(sum_len, all_reduces, collective("all_gather") + collective("reduce_scatter"))


def _sglang_dp_gather_scatter(s: _Setup, rank_tokens: np.ndarray, *, decode: bool) -> np.ndarray:
    """SGLang's gather of one MoE layer's input over the instance (its TP group) and the
    return of the summed expert outputs, (n,) seconds, on ``_sglang_dp_gathers`` rows; the sum
    over the EP and MoE-tp ranks rides on the return. The collectives follow SGLang's padding
    mode (``_sglang_dp_gather_return``)."""
    instance = instance_size(tp=s.column("tp"), ep=s.column("ep"), etp=s.column("etp"))
    gathered = (
        rank_tokens * instance * s.model.hidden_size * dtype_bytes(s.workload.activation_dtype)
    )
    return _sglang_dp_gather_return(s, gathered, instance, decode=decode)


def _sglang_expert_comm(s: _Setup, rank_tokens: np.ndarray, *, decode: bool) -> np.ndarray:
    """SGLang's EP traffic of one MoE layer, (n,) seconds, on the path its export launches:
    DeepEP where ``_sglang_deepep``; else none. Under ``--moe-a2a-backend none`` each rank of
    an attention replica holds all its tokens and maps their top-k ids to its local experts
    (``StandardDispatcher.dispatch``, ``srt/layers/moe/token_dispatcher/standard.py``), and one
    all-reduce over the TP group sums the EP and MoE-tp partial outputs
    (``post_experts_all_reduce``, ``srt/layers/moe/utils.py``: one TP all-reduce when the MoE
    data-parallel size is 1): the layer's FFN all-reduce, or under attention data parallel the
    gather and return of ``_sglang_dp_gather_scatter``, both TP-group traffic (``_comm_times``)."""
    deepep = _sglang_deepep(s)
    if not np.any(deepep):
        return np.zeros(deepep.shape)
    return np.where(deepep, _deepep_expert_comm(s, rank_tokens, decode=decode), 0.0)


def _expert_collectives(s: _Setup) -> np.ndarray:
    """Rows whose MoE layers launch an EP dispatch and combine, (n,) bool, the rows
    ``_expert_comm`` prices traffic on: SGLang's DeepEP rows (``_sglang_expert_comm``); vLLM's
    expert-parallel rows whose experts span attention replicas, as vLLM launches its all2all
    kernels only with data parallel > 1 (``FusedMoEParallelConfig.use_all2all_kernels``,
    ``model_executor/layers/fused_moe/config.py``; read in vLLM 0.33.0) and inside one replica
    launches none (``_gather_scatter_expert_comm``); every expert-parallel row of the other
    engines."""
    if s.profile.engine == "sglang":
        return _sglang_deepep(s)
    if s.profile.engine == "vllm":
        return _experts_span_replicas(s) & (s.column("ep") > 1)
    return s.column("ep") > 1


def _expert_comm(s: _Setup, rank_tokens: np.ndarray, *, decode: bool) -> np.ndarray:
    """EP traffic of one MoE layer, (n,) seconds, on the serving engine's default path:
    vLLM's all-gather / reduce-scatter (``_gather_scatter_expert_comm``) unless the
    ``a2a_backend`` column names DeepEP kernels (vLLM's ``deepep_high_throughput`` /
    ``deepep_low_latency`` backends, which it too uses only across attention replicas);
    SGLang's DeepEP or gather / return (``_sglang_expert_comm``); DeepEP for the other engines
    (``_deepep_expert_comm``)."""
    if s.profile.engine == "sglang":
        return _sglang_expert_comm(s, rank_tokens, decode=decode)
    deepep = _deepep_expert_comm(s, rank_tokens, decode=decode)
    if s.profile.engine != "vllm":
        return deepep
    auto = np.asarray(s.table["a2a_backend"], dtype=np.int64) == A2A_BACKEND_CODES["auto"]
    priced = np.where(auto, _gather_scatter_expert_comm(s, rank_tokens), deepep)
    return np.where(_expert_collectives(s), priced, 0.0)


def _comm_times(s: _Setup, p: ops.Pass) -> dict[str, np.ndarray]:
    """TP, EP, CP and PP traffic of one pass on each pipeline rank, (3, n) seconds.

    TP attention all-reduces after attention and after the FFN of every layer (Megatron); under
    attention-DP only the tp-sharded dense FFN gathers its tokens and scatters them back (in
    SGLang by the batch's padding mode, ``_sglang_dp_gather_return``). SGLang's MoE layers
    without DeepEP gather and return over the instance under attention data parallel
    (``_sglang_dp_gather_scatter``), in place of their FFN all-reduce.
    """
    model, lay = s.model, s.layout
    act, h = dtype_bytes(s.workload.activation_dtype), model.hidden_size
    tp, cp = s.column("tp"), s.column("cp")
    attention_tokens, rank_tokens = _tokens(s, p)
    zero = np.zeros(lay.layers.shape)
    tp_time = all_reduce = zero
    if np.any((tp > 1) & ~s.attention_dp):
        all_reduce = _tp_all_reduce(s, attention_tokens * h * act)
        tp_time = np.where(s.attention_dp, 0.0, 2 * lay.layers * all_reduce)
        sequence_parallel = _sequence_parallel_moe(s)
        if np.any(sequence_parallel):  # MoE layers scatter and gather instead of all-reducing
            message = attention_tokens * h * act
            scatter_gather = _collective(s, "reduce_scatter", "tp", tp, message) + _collective(
                s, "all_gather", "tp", tp, message
            )
            split = 2 * lay.dense_layers * all_reduce + lay.moe_layers * scatter_gather
            tp_time = np.where(sequence_parallel, split, tp_time)
    if np.any((tp > 1) & s.attention_dp) and model.num_dense_ffn_layers:
        gathered = attention_tokens * tp * h * act
        if s.profile.engine == "sglang":  # the batch's padding mode, as in its MoE layers
            # (the dense FFN is tp-sharded unless ``--moe-dense-tp-size 1``:
            # ``is_dense_ffn_fully_dp``, ``srt/layers/layer_boundary/layout.py``)
            gather_scatter = _sglang_dp_gather_return(s, gathered, tp, decode=p.decode)
        else:
            gather = _collective(s, "all_gather", "tp", tp, gathered)
            gather_scatter = gather + _collective(s, "reduce_scatter", "tp", tp, gathered)
        tp_time = np.where(s.attention_dp, lay.dense_layers * gather_scatter, tp_time)
    gathers = _sglang_dp_gathers(s)
    if np.any(gathers):  # SGLang's MoE layers gather and return over the instance instead of
        # all-reducing their FFN output; attention's own all-reduce stays
        moe = _sglang_dp_gather_scatter(s, rank_tokens, decode=p.decode)
        moe = moe - np.where(s.attention_dp | (tp == 1), 0.0, all_reduce)
        tp_time = np.where(gathers, tp_time + lay.moe_layers * moe, tp_time)
    ep_time = zero
    if model.moe is not None and np.any(_expert_collectives(s)):
        ep_time = lay.moe_layers * _expert_comm(s, rank_tokens, decode=p.decode)
    cp_time = zero
    if (
        np.any(cp > 1) and p.decode
    ):  # merge the partial softmax results of each sequence's cp shards
        cp_time = lay.layers * _collective(s, "all_gather", "cp", cp, p.batch * h * act)
    elif np.any(cp > 1):  # ring attention: each cp rank's new-token KV visits the others
        kv_chunk = (
            p.batch
            * p.new_tokens
            / cp
            * model.kv_cache_elements_per_token_per_layer()
            * s.kv_element_bytes
        )
        cp_time = (
            lay.layers * (cp - 1) * _collective(s, "send_recv", "cp", np.minimum(cp, 2.0), kv_chunk)
        )
    pp_time = zero
    if np.any(s.column("pp") > 1):
        pp_time = zero + _collective(
            s, "send_recv", "pp", np.minimum(s.column("pp"), 2.0), rank_tokens * h * act
        )
    return {"tp_comm": tp_time, "ep_comm": ep_time, "cp_comm": cp_time, "pp_comm": pp_time}
