"""Communication curves: DeepEP expert dispatch and combine, tensor-parallel all-reduces.

DeepEP's kernels (DeepSeek's expert-parallel communication library) are priced from the bytes
one rank sends over NVLink and RDMA (``expert_all_to_all_bytes``: low-latency kernels send
every copy straight to its rank, the DeepEP README; normal kernels send a token once per
distinct remote node and forward it over NVLink, ``internode.cu`` ``dispatch``) and the fits
of ``kernel_curves.json``: ``deepep_low_latency`` (NVIDIA's H200 operator table, 1-8 nodes) and
``deepep_normal`` (its H100 one, 20 SMs, with an RDMA efficiency per measured node count), a
fixed latency plus the slower tier's bytes over its preset peak times a fitted efficiency. They are not NCCL collectives, so the
training-fitted collective efficiency does not apply.

Tensor-parallel all-reduces (``custom_allreduce``) are kept as measured latencies, not
efficiencies: by serving engine, GPU count and message size, each engine's own kernels (vLLM's and
SGLang's custom one-/two-shot all-reduce over NVLink peer memory, NCCL above their size limit;
TensorRT-LLM's AllReduce, AUTO strategy) inside a CUDA graph (``all_reduce_time_s``). A decode
all-reduce of one token's hidden state takes ~7 us on 8 A100s where NCCL's ring model says ~70.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from cost_model._kernel_curves import _engine_curves, kernel_curves


def expert_all_to_all_bytes(
    *,
    rank_tokens,
    hidden_size: int,
    element_bytes: float,
    copies,
    ep,
    local,
    node_dedup,
) -> tuple[np.ndarray, np.ndarray]:
    """(NVLink, RDMA) bytes one rank sends in a DeepEP dispatch or combine. Each of its tokens goes
    to ``copies`` expert ranks (top-k x etp), uniform over the ``ep`` ranks of ``ep / local``
    nodes. "Low-latency" kernels send every copy straight to its rank (DeepEP README).

    "Normal" kernels (``node_dedup``) send a token once per distinct remote node, to the rank of
    the same local index there, which forwards it over NVLink once per distinct destination rank
    of its node (``internode.cu`` ``dispatch``: kRDMASender, then kRDMAAndNVLForwarder; on one
    node ``intranode.cu`` sends once per distinct rank). Each rank so forwards the tokens of
    ``nodes`` source ranks (its own included) to the ``local - 1`` other ranks of its node, each
    reached by a token with probability 1 - (1 - 1/ep)^copies."""
    ep, local = np.asarray(ep, dtype=np.float64), np.asarray(local, dtype=np.float64)
    nodes = ep / local
    token_bytes = np.asarray(rank_tokens, dtype=np.float64) * hidden_size * element_bytes
    forwarded = nodes * (local - 1.0) * (1.0 - np.power(1.0 - 1.0 / ep, copies))
    intra = token_bytes * np.where(node_dedup, forwarded, copies * (local - 1.0) / ep)
    remote_copies = copies * (ep - local) / ep
    distinct_nodes = (nodes - 1.0) * (1.0 - np.power(1.0 - 1.0 / nodes, copies))
    remote_copies = np.where(node_dedup, np.minimum(remote_copies, distinct_nodes), remote_copies)
    return intra, token_bytes * remote_copies


def deepep_low_latency_s(*, direction: str, intra_bytes, inter_bytes, cluster) -> np.ndarray | None:
    """DeepEP low-latency ``direction`` (dispatch or combine) of one layer: the fitted fixed
    latency plus the slower tier's bytes over its preset peak bandwidth times the fitted
    efficiency (``kernel_curves.json`` ``deepep_low_latency``: fitted on NVIDIA's H200 operator
    table, 1-8 nodes, and assumed to carry to other NVLink/RDMA fabrics as fractions of their
    peaks); None when the shipped curves hold no fit. The training-fitted collective efficiency
    does not apply: these are not NCCL collectives."""
    return _deepep_fitted_s(
        key="deepep_low_latency",
        direction=direction,
        intra_bytes=intra_bytes,
        inter_bytes=inter_bytes,
        cluster=cluster,
    )


def deepep_normal_s(
    *, direction: str, intra_bytes, inter_bytes, nodes, cluster
) -> np.ndarray | None:
    """DeepEP normal (node-deduplicating, high-throughput) ``direction`` of one layer over an EP
    group spanning ``nodes`` nodes, the bytes of ``expert_all_to_all_bytes`` with ``node_dedup``:
    a fixed latency plus a latency per remote node plus the slower tier's bytes over its preset
    peak bandwidth times the fitted efficiency (``kernel_curves.json`` ``deepep_normal``: fitted
    on NVIDIA's H100 operator table, 1-8 nodes, 20 SMs: DeepEP's and SGLang's default). The
    per-node latency is the notify step, which exchanges token counts with every other node's
    RDMA rank before a multi-node transfer (``internode.cu`` ``notify_dispatch``), and the RDMA
    setup of each destination node. The RDMA efficiency is the one fitted at each measured node
    count (``rdma_efficiency_at_nodes``): DeepEP runs each EP size with its own chunking of the
    RDMA and NVLink buffers (``Buffer.get_dispatch_config`` / ``get_combine_config``, one
    ``Config`` per rank count), and the table's per-byte RDMA rate moves with it (46 GB/s at
    4 nodes, 37 at 2, 22 at 8 at its largest token count) while the low-latency kernels reach
    about 44 GB/s over the same fabric at every node count. None when the shipped curves hold no
    fit. Not an NCCL collective, so the NCCL-fitted collective efficiency does not apply."""
    fit = kernel_curves().get("deepep_normal")
    if not fit:
        return None
    params = fit[direction]
    nodes = np.asarray(nodes, dtype=np.float64)
    remote_nodes = np.maximum(nodes - 1.0, 0.0)
    latency_s = params["latency_s"] + params["latency_per_remote_node_s"] * remote_nodes
    rdma = rdma_efficiency_at_nodes(nodes, params["rdma_efficiency_by_nodes"])
    return latency_s + _slower_tier_s(
        params={**params, "rdma_efficiency": rdma},
        intra_bytes=intra_bytes,
        inter_bytes=inter_bytes,
        cluster=cluster,
    )


def rdma_efficiency_at_nodes(nodes, by_nodes: dict[str, float]) -> np.ndarray:
    """The RDMA efficiency of DeepEP's normal kernels over ``nodes`` nodes from the ones fitted
    at the measured node counts ``by_nodes`` (node count -> efficiency): linear in log2(nodes)
    between two measured counts, the nearest measured one's beyond them (no measurement says how
    DeepEP's configurations of other rank counts run)."""
    counts = sorted(by_nodes, key=float)
    return np.interp(
        np.log2(np.maximum(np.asarray(nodes, dtype=np.float64), 1.0)),
        np.log2([float(c) for c in counts]),
        [by_nodes[c] for c in counts],
    )


def _deepep_fitted_s(*, key: str, direction: str, intra_bytes, inter_bytes, cluster):
    """Fixed latency + max(NVLink bytes / (peak x efficiency), RDMA bytes / (peak x efficiency))
    with the ``key`` fit of ``kernel_curves.json``; None without one."""
    fit = kernel_curves().get(key)
    if not fit:
        return None
    params = fit[direction]
    return params["latency_s"] + _slower_tier_s(
        params=params, intra_bytes=intra_bytes, inter_bytes=inter_bytes, cluster=cluster
    )


def _slower_tier_s(*, params: dict, intra_bytes, inter_bytes, cluster) -> np.ndarray:
    """max(NVLink bytes / (peak x efficiency), RDMA bytes / (peak x efficiency)): DeepEP drives
    both tiers at once, so the slower one sets the transfer time."""
    nvlink = cluster.intra_node.bandwidth_bytes_per_s * params["nvlink_efficiency"]
    rdma = cluster.inter_node.bandwidth_bytes_per_s * params["rdma_efficiency"]
    return np.maximum(np.asarray(intra_bytes) / nvlink, np.asarray(inter_bytes) / rdma)


# ------------------------------------------------------------------ tensor-parallel all-reduce
#: Message sizes of the all-reduce tables: 256 B .. 1 GiB by powers of two (aiconfigurator measures
#: 128 .. 2^29 BF16 elements).
ALL_REDUCE_MESSAGE_BYTES = np.exp2(np.arange(8.0, 31.0))


@lru_cache(maxsize=64)
def _all_reduce_table(device_name: str, engine: str | None, gpus: int) -> np.ndarray | None:
    """Log seconds of one all-reduce over ``gpus`` ranks on ``ALL_REDUCE_MESSAGE_BYTES``
    (``custom_allreduce`` curves): the serving engine's own table where it measured the device at
    that GPU count, else the fastest measured at each size; None without one. No device aliases:
    an H800's NVLink is narrower than the H100's whose kernels it shares."""
    curves = _engine_curves(
        [
            c
            for c in kernel_curves().get("custom_allreduce", ())
            if c["device"] == device_name and str(gpus) in c["latency_us_by_gpus"]
        ],
        engine,
    )
    if not curves:
        return None
    latency_us = np.min([c["latency_us_by_gpus"][str(gpus)] for c in curves], axis=0)
    return np.log(latency_us * 1e-6)


def all_reduce_time_s(*, device_name: str, group, message_bytes, engine: str | None = None):
    """Measured seconds of one tensor-parallel all-reduce of ``message_bytes`` (BF16) per rank
    over ``group`` NVLink-connected ranks, as the serving ``engine`` runs it (its custom one-/two-
    shot kernel below its size limit, NCCL above: the tables time the engine's own dispatch,
    ``autoparallel._kernel_import_comm.ALLREDUCE_KERNELS``); NaN on rows whose group size no table
    measured, None where no table covers the device. Linear in log(size) and log(latency)
    between measured sizes, held below the smallest (the kernel's fixed latency) and linear in
    the bytes beyond the largest (bandwidth-bound)."""
    if not any(c["device"] == device_name for c in kernel_curves().get("custom_allreduce", ())):
        return None
    group, message = np.broadcast_arrays(
        np.atleast_1d(np.asarray(group, dtype=np.float64)),
        np.atleast_1d(np.asarray(message_bytes, dtype=np.float64)),
    )
    seconds = np.full(group.shape, np.nan)
    for gpus in np.unique(group):
        table = _all_reduce_table(device_name, engine, int(gpus))
        if table is None or gpus != int(gpus):
            continue
        grid, log_s = np.log(ALL_REDUCE_MESSAGE_BYTES), table
        rows = group == gpus
        where = np.log(np.maximum(message[rows], 1.0))
        inside = np.exp(np.interp(where, grid, log_s))
        beyond = np.exp(log_s[-1] + np.maximum(where - grid[-1], 0.0))  # t_last * bytes / b_last
        seconds[rows] = np.where(where > grid[-1], beyond, inside)
    return seconds
