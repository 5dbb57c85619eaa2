"""Config evaluations per second of the vectorized cost model, against one config at a time.

ref-3t-moe on 1024 cards (dgx-h200 x 128 nodes): every legal mesh (tp, pp, cp, dp, ep) crossed
with recompute, ZeRO stage, micro-batch size, sequence parallel and pipeline schedule gives
distinct configs; ``estimate_table`` prices all of them at once (training, then inference), and
the baseline prices a random sample of the same rows one by one (a table of one row each, the
path ``cost_model.estimate`` takes). Figures are medians of ``--repeats`` runs in this process.
Inference is priced twice: fully loaded, then with a TTFT and a TPOT SLO set (each layout then
scans the concurrencies its cache holds for the largest whose p90 TTFT/TPOT meet them).

Inference reads none of the training switches, so those rows hold far fewer distinct inference
layouts (mesh x virtual stages; the count is printed), and the cost model prices each distinct
inference layout once (``_inference_load.TRAINING_ONLY_COLUMNS``) and the collectives and
kernel-curve lookups once per group of alike rows. The ``distinct`` line prices the same table
with ``num_redundant_experts`` numbered within each inference layout, so that every row is a
distinct inference layout (SLOs set): the figure for a table with no repeated layout.

The serving simulator (``cost_model._simulator``) then serves 10 minutes of Poisson traffic at
50 requests/s (512-token prompts, 128-token outputs) on one plan (DeepSeek-V3, fp8, TP8 on one
dgx-h200 node), against a budget of 2 s on one core.

    python benchmarks/cost_model_speed.py [--rows N] [--repeats 3] [--sample 200]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoparallel import get_model
from cost_model import Inference, ParallelConfig, Training, estimate_table, table_from_columns
from cost_model._table import select_rows
from topology import get_preset

TARGET_ROWS_PER_S = 100_000
SIMULATOR_BUDGET_S = 2.0


def legal_meshes(model, world: int) -> list[tuple[int, int, int, int, int]]:
    meshes = []
    for tp, pp, cp in itertools.product([1, 2, 4, 8], [1, 2, 4, 8, 16], [1, 2, 4]):
        dp, rest = divmod(world, tp * pp * cp)
        if rest:
            continue
        for ep in [1, 2, 4, 8, 16, 32, 64, 128, 256]:
            try:
                ParallelConfig(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep).validate_for(model, world)
            except ValueError:
                continue
            meshes.append((dp, tp, pp, cp, ep))
    return meshes


def config_table(model, world: int, rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    switches = list(
        itertools.product(
            ["none", "selective", "full"],
            [0, 1, 2, 3],
            [1, 2, 4],
            [False, True],
            [
                ("1f1b", 1),
                ("gpipe", 1),
                ("zero_bubble", 1),
                ("interleaved_1f1b", 2),
                ("interleaved_1f1b", 4),
            ],
        )
    )
    combos = [
        (mesh, switch)
        for mesh in legal_meshes(model, world)
        for switch in switches
        if not (switch[3] and mesh[1] == 1) and not (switch[4][1] > 1 and mesh[2] == 1)
    ]
    picks = (
        np.random.default_rng(seed).permutation(len(combos))[:rows]
        if rows <= len(combos)
        else (np.random.default_rng(seed).integers(0, len(combos), rows))
    )
    chosen = [combos[i] for i in picks]
    mesh = np.array([c[0] for c in chosen])
    return table_from_columns(
        dp=mesh[:, 0],
        tp=mesh[:, 1],
        pp=mesh[:, 2],
        cp=mesh[:, 3],
        ep=mesh[:, 4],
        recompute=np.array([c[1][0] for c in chosen]),
        zero_stage=np.array([c[1][1] for c in chosen]),
        micro_batch_size=np.array([c[1][2] for c in chosen]),
        sequence_parallel=np.array([c[1][3] for c in chosen]),
        pipeline_schedule=np.array([c[1][4][0] for c in chosen]),
        virtual_stages=np.array([c[1][4][1] for c in chosen]),
    ), len(combos)


def distinct_for_inference(table: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
    """``table`` with ``num_redundant_experts`` = the row's rank among the rows of its inference
    layout (dp, tp, pp, cp, ep, virtual stages), so that no two rows price alike; and the number
    of inference layouts ``table`` held."""
    key = np.stack([table[name] for name in ("dp", "tp", "pp", "cp", "ep", "virtual_stages")], 1)
    layouts, layout = np.unique(key, axis=0, return_inverse=True)
    layout = layout.reshape(-1)
    order = np.argsort(layout, kind="stable")
    rank = np.empty(layout.size, dtype=np.int64)
    rank[order] = np.arange(layout.size) - np.searchsorted(layout[order], layout[order])
    return {**table, "num_redundant_experts": rank}, len(layouts)


def median_seconds(fn, repeats: int) -> tuple[float, float]:
    """Median wall-clock and CPU seconds of ``fn`` (CPU time: other processes on a shared
    machine stretch the wall clock, not the work this process does)."""
    wall, cpu = [], []
    for _ in range(repeats):
        started, started_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    return statistics.median(wall), statistics.median(cpu)


def measure(label: str, model, cluster, workload, table, *, repeats: int, sample: int) -> None:
    rows = len(table["dp"])
    batch_wall, batch_cpu = median_seconds(
        lambda: estimate_table(model, cluster, workload, table), repeats
    )
    indices = np.random.default_rng(1).choice(rows, size=min(sample, rows), replace=False)
    singles = [select_rows(table, [int(i)]) for i in indices]
    single_wall, single_cpu = median_seconds(
        lambda: [estimate_table(model, cluster, workload, one) for one in singles], repeats
    )
    for clock, batch_s, single_s in (
        ("wall", batch_wall, single_wall),
        ("cpu", batch_cpu, single_cpu),
    ):
        batch_rate, single_rate = rows / batch_s, len(singles) / single_s
        verdict = "meets" if batch_rate >= TARGET_ROWS_PER_S else "BELOW"
        print(
            f"{label:9s} [{clock:4s}] {rows:7d} rows in {batch_s:6.2f} s = {batch_rate:8.0f} configs/s "
            f"({verdict} {TARGET_ROWS_PER_S:,}); one at a time {single_rate:6.0f} configs/s; "
            f"ratio {batch_rate / single_rate:5.0f}x"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows", type=int, default=0, help="rows to price (default: every distinct legal config)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sample", type=int, default=200)
    args = parser.parse_args()
    model = get_model("ref-3t-moe")
    cluster = get_preset("dgx-h200", num_nodes=128)
    _, distinct = config_table(model, cluster.num_devices, 1)
    rows = args.rows or distinct
    table, _ = config_table(model, cluster.num_devices, rows)
    distinct_table, layouts = distinct_for_inference(table)
    print(
        f"ref-3t-moe on {cluster.num_devices} x {cluster.device.name}; {distinct:,} distinct legal configs, {rows:,} rows "
        f"({layouts:,} distinct inference layouts among them)"
    )
    training = Training(sequence_length_tokens=4096, global_batch_tokens=4096 * 4096)
    inference = Inference(prompt_tokens=4096, output_tokens=1024)
    with_slos = inference.model_copy(update={"ttft_slo_s": 2.0, "tpot_slo_s": 0.05})
    measure("training", model, cluster, training, table, repeats=args.repeats, sample=args.sample)
    measure("inference", model, cluster, inference, table, repeats=args.repeats, sample=args.sample)
    measure("infer+SLO", model, cluster, with_slos, table, repeats=args.repeats, sample=args.sample)
    measure(
        "distinct",
        model,
        cluster,
        with_slos,
        distinct_table,
        repeats=args.repeats,
        sample=args.sample,
    )
    measure_simulator(repeats=args.repeats)
    return 0


def measure_simulator(*, repeats: int) -> None:
    """Seconds the simulator takes for 10 minutes of traffic at 50 requests/s on one plan."""
    from cost_model import ServingConfig, configs_to_table
    from cost_model._inference_load import serving_inputs
    from cost_model._simulator import simulate

    model, cluster = get_model("deepseek-v3"), get_preset("dgx-h200", num_nodes=1)
    workload = Inference(
        prompt_tokens=512, output_tokens=128, weight_dtype="fp8", request_rate_per_s=50.0
    )
    table = configs_to_table(
        [ParallelConfig(tp=8, ep=8)], **ServingConfig().columns(workload=workload)
    )
    cost, policy, _ = serving_inputs(model=model, cluster=cluster, workload=workload, table=table)
    runs = []
    wall, cpu = median_seconds(
        lambda: runs.append(
            simulate(cost=cost, policy=policy, request_rate_per_s=50.0, duration_s=600.0)
        ),
        repeats,
    )
    figures = runs[-1].summary()
    for clock, seconds in (("wall", wall), ("cpu", cpu)):
        verdict = "meets" if seconds <= SIMULATOR_BUDGET_S else "ABOVE"
        print(
            f"simulator [{clock:4s}] 600 s at 50 requests/s ({runs[-1].iterations:,} iterations, "
            f"{runs[-1].ttft_s.size:,} requests measured) in {seconds:5.2f} s ({verdict} {SIMULATOR_BUDGET_S:g} s; "
            f"ratio {SIMULATOR_BUDGET_S / seconds:5.1f}x under budget); simulated TTFT {figures['ttft_mean_s'] * 1e3:.0f} ms, "
            f"TPOT {figures['tpot_mean_s'] * 1e3:.1f} ms"
        )


if __name__ == "__main__":
    sys.exit(main())
