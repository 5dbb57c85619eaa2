"""Kernel launches of one inference pass: the per-kernel floor every pass pays, the kernels a
measured operator latency already holds, and the host time of a pass run without a CUDA graph.

Every pass, prefill and decode alike, pays the serving engine's per-kernel floor for each kernel
it runs (``_kernels_per_pass``; ``data/serving_profiles.json``): CUDA graphs remove the CPU launch,
not the GPU's launch-to-launch gap and wave tail; two overlapped micro-batches pay it once.
Kernels timed by an operator table (``_inference_compute``, ``_inference_comm._tp_all_reduce``)
pay no floor on top (``_measured_kernels_per_pass``).
A pass the engine runs without a CUDA graph by default (``ServingProfile.prefill_graphs``,
``graph_max_tokens``, ``_Setup.prefill_graph_tokens``: SGLang's extend batches before 0.5.10 and
where it turns its prefill graphs off, TensorRT-LLM's context phase, vLLM batches above its
largest captured size) launches each kernel from the host, so it takes at least its kernels
times the host seconds per eager kernel (``eager_pass_host_s``; the host runs ahead of the GPU
asynchronously, so the larger of the two is the pass; the wait is charged to compute).
"""

from __future__ import annotations

import numpy as np

from cost_model import _inference_ops as ops
from cost_model._inference_comm import (
    _all_reduce_measured,
    _expert_collectives,
    _sequence_parallel_moe,
    _sglang_dp_gathers,
)
from cost_model._inference_compute import (
    _context_attention_measured,
    _decode_attention_measured,
    _fused_prefill_moe,
    _gemm_table_dtype,
)
from cost_model._inference_module import MODULE_KERNELS, module_rows
from cost_model._inference_setup import _part_dtype, _Setup
from cost_model._kernel_curves_attention import mla_bmm_time_s, mla_efficiency
from cost_model._kernel_curves_gemm import gemm_efficiency
from cost_model._kernel_curves_moe import grouped_gemm_efficiency

#: Kernels of an MoE block inside the fused MoE layer the operator tables time (top-k, permute,
#: the grouped GEMMs, activation, un-permute: ``_training_ops.kernels_per_layer``'s 8 less the router
#: GEMM, which the tables take as input and ``_router_time`` prices as a GEMM).
_FUSED_MOE_KERNELS = 7.0


def _measured_kernels_per_pass(s: _Setup, *, decode: bool) -> np.ndarray | float:
    """Kernels of a pass whose time is a measured operator latency, where ``_kernel_curves``
    covers the device: the dense GEMMs (``_inference_compute._gemms``: attention projections,
    dense FFN, shared experts), in decode also the fused MoE layer and MLA attention. The table's
    latency already holds their launch-to-launch gaps, ramps and tails, so they pay no floor on
    top."""
    key = f"_measured_kernels_per_pass_{decode}"  # the same for every pass of one setup
    if key not in s.__dict__:
        s.__dict__[key] = _count_measured_kernels(s, decode=decode)
    return s.__dict__[key]


def _count_measured_kernels(s: _Setup, *, decode: bool) -> np.ndarray | float:
    lay, model, device = s.layout, s.model, s.hardware
    kernels: np.ndarray | float = 0.0

    # whether ``_inference_compute._gemms`` times the part's GEMMs from a table
    def curves(part: str) -> bool:
        dtype = _gemm_table_dtype(s, _part_dtype(s, part))
        return (
            gemm_efficiency(device_name=device.name, dtype=dtype, m=1.0, n=1.0, k=1.0) is not None
        )

    gemm_curves = curves("attention")
    if gemm_curves:
        kernels = lay.layers * float(len(ops.attention_projections(model)))
    if curves("dense_ffn"):
        kernels = kernels + lay.dense_layers * float(len(ops.ffn_projections(model, 1)))
    if model.moe is not None and model.moe.num_shared_experts and curves("shared_experts"):
        kernels = kernels + lay.moe_layers * float(len(ops.ffn_projections(model, 1)))
    if (
        model.moe is not None
        and gemm_efficiency(
            device_name=device.name, dtype=s.workload.activation_dtype, m=1.0, n=1.0, k=1.0
        )
        is not None
    ):
        kernels = kernels + lay.moe_layers * float(len(ops.router_projections(model)))
    if (
        decode
        and model.moe is not None
        and grouped_gemm_efficiency(
            device_name=device.name,
            dtype=_part_dtype(s, "routed_experts"),
            tokens_per_expert=1.0,
            experts_per_device=1.0,
        )
        is not None
    ):
        kernels = kernels + lay.moe_layers * _FUSED_MOE_KERNELS
    if not decode and model.moe is not None:  # the prefill rows that run the fused MoE op
        kernels = kernels + lay.moe_layers * _FUSED_MOE_KERNELS * _fused_prefill_moe(
            s, decode=False
        )
    if (
        decode
        and model.attention.kind == "mla"
        and not gemm_curves
        and mla_bmm_time_s(device_name=device.name, tokens=1.0, heads=1.0) is not None
    ):
        kernels = kernels + lay.layers * 1.0  # kv_b_proj, run as the measured batched GEMMs
    if (
        decode
        and model.attention.kind == "mla"
        and mla_efficiency(kind="mla_decode", device_name=device.name, tokens=1.0) is not None
    ):
        kernels = kernels + lay.layers * 1.0  # the one fused attention kernel
    if _context_attention_measured(s, decode=decode):
        kernels = kernels + lay.layers * 1.0
    if decode:  # the one decode attention kernel, where its KV dtype is measured
        kernels = kernels + lay.layers * _decode_attention_measured(s).astype(np.float64)
    # the two TP all-reduces per layer, where measured (``_inference_comm._tp_all_reduce``);
    # the scatter and gather of a sequence-parallel MoE layer, or SGLang's gather and return in
    # place of a MoE layer's FFN all-reduce, are modelled collectives
    # (``_inference_comm._comm_times``)
    all_reduces = 2.0 * (lay.layers - lay.moe_layers * _sequence_parallel_moe(s))
    all_reduces = all_reduces - lay.moe_layers * _sglang_dp_gathers(s)
    kernels = kernels + all_reduces * (_all_reduce_measured(s) & ~s.attention_dp)
    if not decode:  # a measured prefill attention module holds its block's kernels
        held = lay.layers * (float(len(ops.attention_projections(model))) * gemm_curves)
        held = held + lay.layers * float(_context_attention_measured(s, decode=False))
        kernels = kernels + np.where(module_rows(s), lay.layers * MODULE_KERNELS - held, 0.0)
    return kernels


def _kernels_per_pass(s: _Setup) -> np.ndarray:
    """Kernels one pass runs on each pipeline rank, (3, n): each layer's compute kernels
    (``_training_ops.kernels_per_layer``) and its collectives (TP all-reduces after attention and
    FFN, or the attention-DP gather/scatter of a dense FFN; EP dispatch and combine). Each pays
    the engine's per-kernel floor, in prefill and decode alike: a CUDA graph removes the CPU
    launch, not the GPU's launch-to-launch gap and wave tail (``data/serving_profiles.json``).
    Run eagerly, each is one host launch (``eager_pass_host_s``). The count matches an engine's
    eager forward for a dense GQA layer (SGLang ``models/llama.py``, read in 0.5.23: fused
    add-norm, QKV GEMM, RoPE, attention with its KV-cache store, output GEMM, all-reduce, fused
    add-norm, gate-up GEMM, SiLU-and-mul, down GEMM, all-reduce: 12 kernels against 12 here) and
    is a lower bound for MLA + MoE layers, where the engine also launches per-GEMM fp8
    activation quantization and MoE alignment kernels and dispatches view and split ops that
    launch none (``models/deepseek_common/attention_forward_methods/forward_mha.py``)."""
    if "_kernels_per_pass" in s.__dict__:  # the same for every pass of one setup
        return s.__dict__["_kernels_per_pass"]
    lay, tp = s.layout, s.column("tp")
    kernels = lay.dense_layers * s.kernels_per_layer[0] + lay.moe_layers * s.kernels_per_layer[1]
    tp_calls = np.where(s.attention_dp, 2.0 * lay.dense_layers, 2.0 * lay.layers) * (tp > 1)
    # SGLang's MoE gather and return, in place of an FFN all-reduce
    # (``_inference_comm._comm_times``)
    replaced = np.where(s.attention_dp | (tp == 1), 0.0, 1.0)
    tp_calls = tp_calls + lay.moe_layers * _sglang_dp_gathers(s) * (2.0 - replaced)
    ep_calls = 2.0 * lay.moe_layers * _expert_collectives(s)
    s.__dict__["_kernels_per_pass"] = kernels + tp_calls + ep_calls
    return s.__dict__["_kernels_per_pass"]


#: Host seconds per eager op of ``autoparallel profile``'s tiny inference block on an x86 DGX-class
#: host (Intel Xeon driving one H200, torch 2.11: 11.0-16.9 us over three profiles, median 11.9,
#: ``benchmarks/results/profile_h200.json``), rounded: the host the engines' defaults describe.
REFERENCE_EAGER_OP_HOST_S = 1.2e-5


def eager_kernel_host_s(s: _Setup) -> float:
    """Host seconds to launch one kernel of a pass run without a CUDA graph: the serving
    engine's default (``ServingProfile.eager_kernel_host_s``, cited in its data; an x86 DGX
    host's, with the engine's Python module code around each kernel) scaled by the host at hand:
    the device profile's measured eager dispatch time (``autoparallel profile``) over the same
    measurement on an x86 DGX-class host (``REFERENCE_EAGER_OP_HOST_S``) where it has one, else
    the device's ``host_op_time_factor`` (a Grace host takes twice as long). The profile times a
    plain PyTorch block, not the engine's modules, so it gives the host's speed, not the engine's
    cost per kernel."""
    measured = getattr(s.hardware, "eager_op_host_s", None)
    if measured is not None:
        return s.profile.eager_kernel_host_s * float(measured) / REFERENCE_EAGER_OP_HOST_S
    return s.profile.eager_kernel_host_s * float(getattr(s.hardware, "host_op_time_factor", 1.0))


def eager_pass_host_s(s: _Setup) -> np.ndarray:
    """Host seconds to launch one pass's kernels eagerly, (n,): the kernels of the rank that
    launches the most (``_kernels_per_pass``; two overlapped micro-batches launch theirs each)
    times ``eager_kernel_host_s``, on each of the ``pp`` micro-batches in flight. The host runs
    ahead of the GPU, so an eager pass takes the larger of this and its GPU time
    (``_serving_replica.IterationCost``)."""
    kernels = np.max(_kernels_per_pass(s), axis=0) * np.where(s.two_batch, 2.0, 1.0)
    return s.column("pp") * kernels * eager_kernel_host_s(s)


def _host_bound(s: _Setup, exposed: dict[str, np.ndarray], eager) -> dict[str, np.ndarray]:
    """``exposed`` parts of a pass with the launch time an eager pass waits beyond its GPU time
    (``eager_pass_host_s``) added to its compute part, where ``eager``."""
    shortfall = np.maximum(eager_pass_host_s(s) - sum(exposed.values()), 0.0)
    return {**exposed, "compute": exposed["compute"] + np.where(eager, shortfall, 0.0)}


def pass_runs_eagerly(s: _Setup, p: ops.Pass) -> np.ndarray:
    """Whether the engine runs pass ``p`` without a CUDA graph by default, (n,): a decode pass of
    more tokens per forward than its largest graph (``_Setup.graph_tokens``), a prefill pass of
    more than its largest prompt-carrying graph (``_Setup.prefill_graph_tokens``; 0 where it
    graphs decode only)."""
    tokens = p.batch * p.new_tokens  # per attention replica, the batch one forward holds
    return tokens > (s.graph_tokens if p.decode else s.prefill_graph_tokens)
