"""Communication fits from aiconfigurator-core's ``comm/*`` tables.

The serving engines' tensor-parallel all-reduce (``comm/*/custom_allreduce_perf.parquet``:
latency by message size and GPU count, kept as measured but for single glitched samples,
``_custom_allreduce_curves``, ``replace_latency_spikes``), and
DeepEP's low-latency dispatch and combine (``wideep_deepep_ll_perf.parquet``: a fixed latency
plus the slower tier's bytes over its preset bandwidth times a fitted efficiency,
``fit_deepep_low_latency``) and normal (node-deduplicating, high-throughput) dispatch and combine
(``wideep_deepep_normal_perf.parquet``, the same form plus a latency per remote node, the notify
step's count exchange, and an RDMA efficiency per measured node count, DeepEP's configuration per
EP size: ``fit_deepep_normal``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from autoparallel._kernel_import_tables import DEVICES, _latest_tables, _read, measured_by
from cost_model import (
    ALL_REDUCE_MESSAGE_BYTES,
    expert_all_to_all_bytes,
    rdma_efficiency_at_nodes,
)
from topology import get_preset

#: aiconfigurator device folders whose custom all-reduce tables are imported -> preset: the
#: kernel-curve devices and the A100 and GB300, whose all-reduce tables the package also ships.
ALLREDUCE_DEVICES = {**DEVICES, "a100_sxm": "dgx-a100", "gb300": "gb300-nvl72"}
#: Rows of each engine's table that time the kernel the engine runs in a serving pass: vLLM's
#: and SGLang's collectors time ``tensor_model_parallel_all_reduce`` (the engine's own choice per
#: size: its custom one-/two-shot kernel over NVLink peer memory below its size limit, 8 MiB by
#: default, NCCL above) inside a CUDA graph ("graph") and eagerly ("eager": each call adds the
#: collector's input copy and the host dispatch, not operator time); TensorRT-LLM's times its
#: ``AllReduce`` op with the AUTO strategy (one-shot / two-shot / NCCL by size) in a CUDA graph
#: (aiconfigurator ``collector/collect_all_reduce.py``). The graph rows are the operator.
ALLREDUCE_KERNELS = {
    "vllm": ("vLLM", "vLLM_custom_graph"),
    "sglang": ("SGLang", "SGLang_CustomAllReduce_graph"),
    "trtllm": ("TRTLLM", "TRTLLM"),
}


def _custom_allreduce_curves(root: Path, device: str, engine: str) -> list[dict]:
    """Latency of one tensor-parallel all-reduce at each size of ``ALL_REDUCE_MESSAGE_BYTES``, for
    each GPU count measured at all of them, from the newest
    ``comm/<engine>/<version>/custom_allreduce_perf.parquet`` whose rows are the engine's own (a
    folder may hold another engine's table: those rows are skipped). BF16 messages; the table's
    ``message_size`` counts elements (aiconfigurator's ops pass hidden x tokens)."""
    hardware = get_preset(ALLREDUCE_DEVICES[device]).device
    framework, kernel = ALLREDUCE_KERNELS[engine]
    grid = [int(b) for b in ALL_REDUCE_MESSAGE_BYTES]
    for path in _latest_tables(root, device, "comm", engine, "custom_allreduce_perf.parquet"):
        by_gpus: dict[int, dict[int, float]] = {}
        for row in _read(path):
            if (
                row["framework"] != framework
                or row["kernel_source"] != kernel
                or row["op_name"] != "all_reduce"
                or row["allreduce_dtype"] != "bfloat16"
            ):
                continue
            sizes = by_gpus.setdefault(int(row["num_gpus"]), {})
            size = 2 * int(row["message_size"])
            sizes[size] = min(sizes.get(size, np.inf), float(row["latency"]) * 1e-3)
        complete = {gpus: s for gpus, s in by_gpus.items() if all(b in s for b in grid)}
        if not complete:
            continue
        latency_us, glitches = {}, {}
        for gpus, sizes in sorted(complete.items()):
            kept, replaced = replace_latency_spikes([sizes[b] * 1e6 for b in grid])
            latency_us[str(gpus)] = [float(f"{value:.4g}") for value in kept]
            if replaced:
                glitches[str(gpus)] = [grid[index] for index in replaced]
        curve = {
            **measured_by(hardware.name, engine, path),
            "dtype": "bf16",
            "kernel_source": kernel,
            "file": str(path.relative_to(root.parent)),
            "latency_us_by_gpus": latency_us,
        }
        if glitches:
            curve["spikes_replaced_bytes_by_gpus"] = glitches
        return [curve]
    return []


def replace_latency_spikes(latency: list[float]) -> tuple[list[float], list[int]]:
    """The latencies of one all-reduce table along its message sizes (each twice the last), with
    every single-point spike replaced by the geometric mean of its neighbours, and the indices
    replaced. A spike is a point more than twice as slow as both neighbours: the next message,
    twice as large, moves twice the bytes through the same kernel, so at most doubles the time
    of a bandwidth-bound point and leaves a latency-bound one flat; a point that took more than
    twice the larger message's time is one glitched sample (aiconfigurator's H100 SGLang table:
    38.08 us at 1 KiB over 8 GPUs between 3.32 and 3.53 us; its A100 vLLM table: 14.85 us at
    4 KiB between 5.62 and 6.32 us), not the kernel's latency at that size."""
    values = list(latency)
    replaced = [
        index
        for index in range(1, len(values) - 1)
        if values[index] > 2.0 * max(values[index - 1], values[index + 1])
    ]
    for index in replaced:
        values[index] = float(np.sqrt(latency[index - 1] * latency[index + 1]))
    return values, replaced


#: DeepEP low-latency tables measured on 1-8 nodes of 8 GPUs (hidden 7168, top-8 of 256 experts).
DEEPEP_LOW_LATENCY_TABLE = "h200_sxm/comm/sglang/0.5.6.post2/wideep_deepep_ll_perf.parquet"
_DEEPEP_GRID = {
    "latency_s": np.linspace(0.0, 40e-6, 81),
    "nvlink_efficiency": np.linspace(0.05, 1.0, 96),
    "rdma_efficiency": np.linspace(0.05, 1.2, 116),
}


def _deepep_table_points(
    rows: list[dict], *, direction: str, node_dedup: bool, seconds, keep=lambda row: True
) -> np.ndarray:
    """(nodes, intra bytes, inter bytes, seconds) per DeepSeek-V3-shaped row (hidden 7168, top-8
    of 256 experts) that ``keep`` accepts, the bytes as the cost model counts them
    (``cost_model._kernel_curves_comm.expert_all_to_all_bytes``: FP8 dispatch, BF16 combine),
    ``seconds(row)`` the measured time."""
    element = {"dispatch": 1.0, "combine": 2.0}[direction]
    points = []
    for row in rows:
        if (row["hidden_size"], row["num_topk"], row["num_experts"]) != (7168, 8, 256):
            continue
        if not keep(row):
            continue
        nodes = int(row["node_num"])
        intra, inter = expert_all_to_all_bytes(
            rank_tokens=float(row["num_token"]),
            hidden_size=7168,
            element_bytes=element,
            copies=8.0,
            ep=8.0 * nodes,
            local=8.0,
            node_dedup=node_dedup,
        )
        points.append((nodes, float(intra), float(inter), seconds(row)))
    return np.array(points)


def _deepep_points(rows: list[dict], *, direction: str) -> np.ndarray:
    """The low-latency table's points (``_deepep_table_points``): every copy crosses RDMA."""
    return _deepep_table_points(
        rows,
        direction=direction,
        node_dedup=False,
        seconds=lambda row: float(row[f"{direction}_avg_t_us"]) * 1e-6,
    )


def _fit_deepep(
    points: np.ndarray, hardware_links, grid: dict = _DEEPEP_GRID
) -> tuple[np.ndarray, np.ndarray]:
    """Grid least squares on log(predicted / measured) of ``deepep_low_latency_s`` over ``grid``
    (latency, NVLink efficiency, RDMA efficiency); returns the parameters and the relative
    errors. The grid is searched one latency at a time (bounded memory); the first minimum in
    grid order wins."""
    intra_bw, inter_bw = hardware_links
    names = list(grid)
    efficiencies = np.stack(np.meshgrid(grid[names[1]], grid[names[2]], indexing="ij"), -1).reshape(
        -1, 2
    )
    transfer = np.maximum(
        points[None, :, 1] / (intra_bw * efficiencies[:, :1]),
        points[None, :, 2] / (inter_bw * efficiencies[:, 1:2]),
    )
    best, best_loss = np.zeros(3), np.inf
    for latency in grid[names[0]]:
        loss = (np.log((latency + transfer) / points[None, :, 3]) ** 2).sum(axis=1)
        index = int(np.argmin(loss))
        if loss[index] < best_loss:
            best_loss, best = loss[index], np.array([latency, *efficiencies[index]])
    fitted = best[0] + np.maximum(
        points[:, 1] / (intra_bw * best[1]), points[:, 2] / (inter_bw * best[2])
    )
    return best, fitted / points[:, 3] - 1.0


def _deepep_seconds(params: np.ndarray, points: np.ndarray, links) -> np.ndarray:
    """Low-latency form: latency + max(NVLink bytes / (peak x eff), RDMA bytes / (peak x eff))."""
    return params[0] + np.maximum(
        points[:, 1] / (links[0] * params[1]), points[:, 2] / (links[1] * params[2])
    )


def _fit_record(points: np.ndarray, links, grid: dict) -> dict:
    """The fitted parameters of one direction (``_fit_deepep`` over ``grid``) with its points,
    mean / max relative error and the mean error on each multi-node count when it is held out of
    the fit (the single-node points alone fix the NVLink term, so they are always kept)."""
    best, errors = _fit_deepep(points, links, grid)
    held_out = {}
    for nodes in (2, 4, 8):
        kept, out = points[points[:, 0] != nodes], points[points[:, 0] == nodes]
        params, _ = _fit_deepep(kept, links, grid)
        predicted = _deepep_seconds(params, out, links)
        held_out[str(nodes)] = round(float(np.mean(np.abs(predicted / out[:, 3] - 1.0))), 3)
    return {
        **{
            name: round(float(value), 9 if name.endswith("_s") else 3)
            for name, value in zip(grid, best)
        },
        "points": len(points),
        "mean_abs_error": round(float(np.mean(np.abs(errors))), 3),
        "max_abs_error": round(float(np.max(np.abs(errors))), 3),
        "held_out_node_count_mean_abs_error": held_out,
    }


def fit_deepep_low_latency(root: Path) -> dict:
    """DeepEP low-latency dispatch / combine: a fixed latency plus the slower tier's bytes over
    its preset peak bandwidth times a fitted efficiency, fitted on the H200 operator table; with
    each multi-node count held out in turn (the single-node points alone fix the NVLink term)."""
    path = root / "systems" / "data" / DEEPEP_LOW_LATENCY_TABLE
    if not path.exists():
        return {}
    cluster = get_preset("dgx-h200")
    links = (
        cluster.intra_node.bandwidth_bytes_per_s,
        cluster.inter_node.bandwidth_bytes_per_s,
    )
    rows = _read(path)
    fits = {
        direction: _fit_record(_deepep_points(rows, direction=direction), links, _DEEPEP_GRID)
        for direction in ("dispatch", "combine")
    }
    return {
        "file": f"aiconfigurator_core/systems/data/{DEEPEP_LOW_LATENCY_TABLE}",
        "preset": "dgx-h200",
        **fits,
    }


#: DeepEP normal-kernel tables measured on 1, 2, 4 and 8 nodes of 8 GPUs (hidden 7168, top-8 of
#: 256 experts, 1-131072 tokens per rank, 4-24 SMs). The H200 folder ships the same numbers
#: (its multi-node rows relabelled "NVIDIA H200", the single-node ones "NVIDIA H100"): one H100
#: measurement, so one fit on the table that names it throughout, with the H100 preset's peaks.
DEEPEP_NORMAL_TABLE = "h100_sxm/comm/sglang/0.5.6.post2/wideep_deepep_normal_perf.parquet"
DEEPEP_NORMAL_PRESET = "dgx-h100"
#: SMs of the rows fitted: DeepEP's ``Buffer.num_sms`` default (20, ``deep_ep/buffers/legacy.py``),
#: which SGLang keeps unless ``--deepep-config`` names others (``DeepEPConfig`` in
#: ``python/sglang/srt/layers/moe/token_dispatcher/deepep.py``); the single-node rows hold only it.
DEEPEP_NORMAL_SMS = 20
#: The normal kernels' grid: a fixed latency (the one-node kernel, about 37 us measured) and a
#: latency per remote node (the notify step's count exchange with each other node's RDMA rank and
#: that node's RDMA setup: 31 / 57 / 69 us of notify alone at 2 / 4 / 8 nodes and 128 tokens), in
#: one step so that each node count's latency falls on one lattice (``_fit_deepep_normal``).
_DEEPEP_NORMAL_GRID = {
    "latency_s": np.linspace(0.0, 100e-6, 101),
    "latency_per_remote_node_s": np.linspace(0.0, 40e-6, 41),
    "nvlink_efficiency": np.linspace(0.05, 1.5, 146),
    "rdma_efficiency": np.linspace(0.05, 1.5, 146),
}


def _normal_seconds(
    params: np.ndarray, rdma_by_nodes: dict, points: np.ndarray, links
) -> np.ndarray:
    """Normal form: latency + latency per remote node x (nodes - 1) + the slower tier, the RDMA
    efficiency that of each point's node count (``rdma_efficiency_at_nodes``)."""
    rdma = rdma_efficiency_at_nodes(points[:, 0], rdma_by_nodes)
    return (
        params[0]
        + params[1] * (points[:, 0] - 1.0)
        + np.maximum(points[:, 1] / (links[0] * params[2]), points[:, 2] / (links[1] * rdma))
    )


def _node_count_losses(
    group: np.ndarray, links, efficiencies: np.ndarray, levels: np.ndarray
) -> np.ndarray:
    """Sum of squared log(predicted / measured) over the points of one node count, at each
    latency in ``levels`` (rows) and each efficiency pair (columns)."""
    transfer = np.maximum(
        group[None, :, 1] / (links[0] * efficiencies[:, :1]),
        group[None, :, 2] / (links[1] * efficiencies[:, 1:2]),
    )
    return np.stack(
        [(np.log((level + transfer) / group[None, :, 3]) ** 2).sum(axis=1) for level in levels]
    )


def _fit_deepep_normal(
    points: np.ndarray, links, grid: dict = _DEEPEP_NORMAL_GRID
) -> tuple[np.ndarray, dict[str, float]]:
    """Grid least squares on log(predicted / measured) of ``_normal_seconds`` over ``grid``: one
    latency, latency per remote node and NVLink efficiency for the table, one RDMA efficiency per
    multi-node count (DeepEP's configuration per rank count, ``deepep_normal_s``). Returns
    (latency, latency per remote node, NVLink efficiency) and the RDMA efficiency by node count.
    Both latency axes start at 0 in one step, so a node count's latency is a multiple of that
    step: each node count's loss is tabulated once per multiple (``_node_count_losses``), its best
    RDMA efficiency taken at each (latency, NVLink efficiency), and summed per (per-node latency,
    latency) pair; the first minimum in (per-node latency, latency, NVLink efficiency) order
    wins."""
    names = list(grid)
    step = grid[names[0]][1]
    assert grid[names[0]][0] == grid[names[1]][0] == 0.0
    assert np.allclose(np.diff(grid[names[0]]), step) and np.allclose(np.diff(grid[names[1]]), step)
    nvlink, rdma = grid[names[2]], grid[names[3]]
    efficiencies = np.stack(np.meshgrid(nvlink, rdma, indexing="ij"), -1).reshape(-1, 2)
    num_latencies, num_slopes = len(grid[names[0]]), len(grid[names[1]])
    losses, choices = {}, {}
    for nodes in np.unique(points[:, 0]):
        levels = step * np.arange(num_latencies + (num_slopes - 1) * (int(nodes) - 1))
        table = _node_count_losses(points[points[:, 0] == nodes], links, efficiencies, levels)
        table = table.reshape(len(levels), len(nvlink), len(rdma))
        losses[nodes], choices[nodes] = table.min(axis=2), table.argmin(axis=2)
    best, best_loss, best_rdma = np.zeros(3), np.inf, {}
    for slope in range(num_slopes):
        rows = {nodes: slope * (int(nodes) - 1) + np.arange(num_latencies) for nodes in losses}
        total = sum(loss[rows[nodes]] for nodes, loss in losses.items())
        latency, link = np.unravel_index(int(np.argmin(total)), total.shape)
        if total[latency, link] < best_loss:
            best_loss = total[latency, link]
            best = np.array([step * latency, step * slope, nvlink[link]])
            best_rdma = {
                str(int(nodes)): float(rdma[choices[nodes][rows[nodes][latency], link]])
                for nodes in losses
                if nodes > 1
            }
    return best, best_rdma


def _normal_fit_record(points: np.ndarray, links, grid: dict = _DEEPEP_NORMAL_GRID) -> dict:
    """The fitted parameters of one direction (``_fit_deepep_normal``) with its points, the mean
    and max relative error, the mean error per node count, and the mean error on each multi-node
    count when it is held out of the fit and priced with the RDMA efficiency the other counts
    give it (``rdma_efficiency_at_nodes``: interpolated between, or held from, the nearest)."""
    best, rdma_by_nodes = _fit_deepep_normal(points, links, grid)
    errors = _normal_seconds(best, rdma_by_nodes, points, links) / points[:, 3] - 1.0
    held_out = {}
    for nodes in (2, 4, 8):
        kept, out = points[points[:, 0] != nodes], points[points[:, 0] == nodes]
        params, rdma = _fit_deepep_normal(kept, links, grid)
        predicted = _normal_seconds(params, rdma, out, links)
        held_out[str(nodes)] = round(float(np.mean(np.abs(predicted / out[:, 3] - 1.0))), 3)
    return {
        **{
            name: round(float(value), 9 if name.endswith("_s") else 3)
            for name, value in zip(grid, best)
        },
        "rdma_efficiency_by_nodes": {
            nodes: round(value, 3) for nodes, value in rdma_by_nodes.items()
        },
        "points": len(points),
        "mean_abs_error": round(float(np.mean(np.abs(errors))), 3),
        "max_abs_error": round(float(np.max(np.abs(errors))), 3),
        "mean_abs_error_by_nodes": {
            str(int(nodes)): round(float(np.mean(np.abs(errors[points[:, 0] == nodes]))), 3)
            for nodes in np.unique(points[:, 0])
        },
        "held_out_node_count_mean_abs_error": held_out,
    }


def _deepep_normal_points(rows: list[dict], *, direction: str) -> np.ndarray:
    """(nodes, intra bytes, inter bytes, seconds) per row at ``DEEPEP_NORMAL_SMS``, the bytes as
    the cost model counts a normal kernel's (``expert_all_to_all_bytes`` with ``node_dedup``): FP8
    dispatch (SGLang quantizes DeepSeek's tokens per 128-element group before
    ``Buffer.dispatch``, ``_DeepEPDispatcherImplNormal.dispatch_a``), BF16 combine. The time is
    the transmit kernel plus its notify step (the layout exchange that precedes a multi-node
    dispatch or combine; zero on one node)."""
    return _deepep_table_points(
        rows,
        direction=direction,
        node_dedup=True,
        seconds=lambda row: (
            (float(row[f"{direction}_transmit_us"]) + float(row[f"{direction}_notify_us"])) * 1e-6
        ),
        keep=lambda row: row[f"{direction}_sms"] == DEEPEP_NORMAL_SMS,
    )


def fit_deepep_normal(root: Path) -> dict:
    """DeepEP normal (node-deduplicating) dispatch / combine: a fixed latency, plus a latency per
    remote node (the notify step's count exchange with each other node, ``internode.cu``
    ``notify_dispatch``), plus the slower tier's bytes over its preset peak bandwidth times a
    fitted efficiency, fitted on the H100 operator table at the engine's SM count, the RDMA
    efficiency once per measured node count; with each multi-node count held out in turn. The
    table's per-byte RDMA rate moves with the node count (at 131072 tokens, 37 / 46 / 22 GB/s on
    2 / 4 / 8 nodes on the bytes counted) where the low-latency kernels' reaches about 44 GB/s at
    every count over the same fabric: DeepEP chunks its RDMA and NVLink buffers by a
    configuration per rank count (``deep_ep/buffer.py`` ``Buffer.get_dispatch_config`` /
    ``get_combine_config``: one ``Config`` per EP size, 16, 32 and 64 ranks differing in the
    tokens per RDMA chunk), so one efficiency for every count left a 17-23% mean error at 4 nodes
    (the one count the others do not predict, and the usual EP 32 prefill unit)."""
    path = root / "systems" / "data" / DEEPEP_NORMAL_TABLE
    if not path.exists():
        return {}
    cluster = get_preset(DEEPEP_NORMAL_PRESET)
    links = (
        cluster.intra_node.bandwidth_bytes_per_s,
        cluster.inter_node.bandwidth_bytes_per_s,
    )
    rows = _read(path)
    fits = {
        direction: _normal_fit_record(_deepep_normal_points(rows, direction=direction), links)
        for direction in ("dispatch", "combine")
    }
    return {
        "file": f"aiconfigurator_core/systems/data/{DEEPEP_NORMAL_TABLE}",
        "preset": DEEPEP_NORMAL_PRESET,
        "sms": DEEPEP_NORMAL_SMS,
        **fits,
    }
