"""Search benchmark: Optuna study vs the exhaustive vectorized baseline on ref-3t-moe.

For training and inference on 1,024 / 4,096 / 16,384 H200s (preset ``dgx-h200``) it prints the
space size, the exhaustive time, the median Optuna time over the seeds and their ratio (the
baseline measured in the same run; wall time and this process's CPU time, since the wall clock
of a shared machine also counts other people's work), and the regret of the Optuna plan against the exhaustive
optimum over 10 seeds (median and worst). Targets: median regret <= 1 % and Optuna <= 10 s at
4,096 cards.

    PYTHONPATH=. python benchmarks/search.py [--seeds 10] [--cards 1024 4096 16384] [--trials 250]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path and its name would shadow the
# ``search`` package: put the repository root there instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [str(_HERE.parent)] + [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import optuna
from rich.console import Console
from rich.table import Table

import autoparallel as ap
from cost_model import Inference, Training
from search import exhaustive_search, find_plan, regret

WORKLOADS = {
    "training": Training(sequence_length_tokens=4096, global_batch_tokens=16 * 2**20),
    "inference": Inference(prompt_tokens=4096, output_tokens=1024, ttft_slo_s=5.0, tpot_slo_s=0.05),
}


def run_case(*, kind: str, cards: int, seeds: int, trials: int) -> dict:
    model = ap.get_model("ref-3t-moe")
    cluster = ap.get_preset("dgx-h200", num_nodes=cards // 8)
    workload = WORKLOADS[kind]
    cpu_start = time.process_time()
    optimum = exhaustive_search(model, cluster, workload)
    exhaustive_cpu_s = time.process_time() - cpu_start
    times, cpu_times, regrets = [], [], []
    for seed in range(seeds):
        start, cpu_start = time.perf_counter(), time.process_time()
        result = find_plan(model, cluster, workload, n_trials=trials, seed=seed)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
        regrets.append(regret(result.best, optimum.best, result.objective))
    median_time, median_cpu = statistics.median(times), statistics.median(cpu_times)
    return {
        "kind": kind,
        "cards": cards,
        "space_size": optimum.space_size,
        "num_meshes": result.num_meshes,
        "feasible": optimum.num_feasible,
        "trials": trials,
        "trials_run": result.num_trials,
        "rows_priced": result.rows_evaluated,
        "exhaustive_s": optimum.elapsed_s,
        "optuna_median_s": median_time,
        "exhaustive_cpu_s": exhaustive_cpu_s,
        "optuna_median_cpu_s": median_cpu,
        "ratio": optimum.elapsed_s / median_time,
        "cpu_ratio": exhaustive_cpu_s / median_cpu,
        "regret_median": statistics.median(regrets),
        "regret_max": max(regrets),
        "seeds": seeds,
        "method": result.method,
        "objective": optimum.objective.columns[0],
        "optimum": optimum.best.metrics[optimum.objective.columns[0]],
    }


def render(rows: list[dict]) -> Table:
    table = Table(title="ref-3t-moe search: Optuna vs exhaustive (dgx-h200)")
    for column in (
        "workload",
        "cards",
        "layouts",
        "meshes",
        "feasible",
        "method",
        "trials",
        "exhaustive wall (cpu)",
        "Optuna median wall (cpu)",
        "exhaustive / Optuna wall (cpu)",
        "regret median",
        "regret max",
    ):
        table.add_column(column, justify="left" if column == "workload" else "right")
    for r in rows:
        table.add_row(
            r["kind"],
            f"{r['cards']:,}",
            f"{r['space_size']:,}",
            f"{r['num_meshes']:,}",
            f"{r['feasible']:,}",
            r["method"],
            f"{r['trials_run']}",
            f"{r['exhaustive_s']:.1f} s ({r['exhaustive_cpu_s']:.1f} s)",
            f"{r['optuna_median_s']:.2f} s ({r['optuna_median_cpu_s']:.2f} s)",
            f"{r['ratio']:.1f}x ({r['cpu_ratio']:.1f}x)",
            f"{r['regret_median']:.2%}",
            f"{r['regret_max']:.2%}",
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--cards", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--trials", type=int, default=250)
    parser.add_argument("--kinds", nargs="+", default=["training", "inference"])
    parser.add_argument(
        "--output", type=Path, default=Path(__file__).with_name("results") / "search.json"
    )
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    console = Console(width=160)
    rows = []
    for kind in args.kinds:
        for cards in args.cards:
            rows.append(run_case(kind=kind, cards=cards, seeds=args.seeds, trials=args.trials))
            console.print(f"{kind} {cards}: done", highlight=False)
    console.print(render(rows))
    target = [r for r in rows if r["cards"] == 4096]
    for r in target:
        verdict = "meets" if r["regret_median"] <= 0.01 and r["optuna_median_s"] <= 10 else "MISSES"
        console.print(
            f"4,096 cards {r['kind']}: median regret {r['regret_median']:.2%} (target <= 1%), "
            f"Optuna {r['optuna_median_s']:.2f} s wall, {r['optuna_median_cpu_s']:.2f} s cpu (target <= 10 s): {verdict} the target"
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
