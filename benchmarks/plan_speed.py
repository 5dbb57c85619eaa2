"""Wall time of the main job, ``autoparallel plan`` on the built-in defaults, run as a user runs it.

Each repeat starts a fresh interpreter in an empty folder (imports, the search, the serving
simulator's check of the chosen plan, writing plan.json) and, as the baseline measured in the
same run, a fresh interpreter that only imports the command-line module: the ratio is the
search's cost in units of the start-up a user pays anyway, which a noisy shared machine moves far
less than either figure alone. Figures are medians of ``--repeats`` runs. Target: the plan within
30 s on two cores (the README quotes the usual figure).

    python benchmarks/plan_speed.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 30.0


def _seconds(arguments: list[str]) -> float:
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="160")
    with tempfile.TemporaryDirectory(prefix="autoparallel-plan-speed-") as folder:
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, *arguments], cwd=folder, env=env, capture_output=True, text=True
        )
        elapsed = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(arguments)} failed:\n{done.stderr}")
        if arguments[-1] == "plan" and not (Path(folder) / "plan.json").exists():
            raise SystemExit("autoparallel plan wrote no plan.json")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    plan, startup = [], []
    for _ in range(args.repeats):
        startup.append(_seconds(["-c", "import autoparallel.cli"]))
        plan.append(_seconds(["-m", "autoparallel.cli", "plan"]))
    plan_s, startup_s = statistics.median(plan), statistics.median(startup)
    print(f"autoparallel plan (defaults): {plan_s:.1f} s median of {args.repeats}")
    print(f"baseline, start-up only (import autoparallel.cli): {startup_s:.1f} s")
    print(f"ratio plan / start-up: {plan_s / startup_s:.1f}x")
    verdict = "within" if plan_s <= TARGET_S else "over"
    print(f"target <= {TARGET_S:.0f} s: {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
