"""Apply the 1,024-rank plan of full-size ref-3t-moe on EVERY rank (meta device, ``fake`` process
group) and check each rank's shapes, layers, experts and weight bytes against the plan — the
all-ranks sweep of ``tests/test_runtime_fullsize.py``, whose test checks a sample of ranks.
Prints the wall time per rank and the sampled test's share of the sweep (same run).

    python benchmarks/rank_sweep.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import test_runtime_fullsize as fullsize


def main() -> None:
    from autoparallel import get_model
    from autoparallel.testing import plan_for_config

    spec = get_model("ref-3t-moe")
    plan = plan_for_config(spec, fullsize.CONFIG)
    every = list(range(fullsize.WORLD_SIZE))
    start = time.perf_counter()
    results = fullsize.apply_on_ranks_in_parallel(every, spec, plan)
    fullsize.check_rank_results(results, every, spec, plan)
    elapsed = time.perf_counter() - start
    sample = len(fullsize.sampled_ranks())
    print(
        f"all {len(every)} ranks checked in {elapsed:.1f} s ({elapsed / len(every) * 1e3:.0f} ms per rank); "
        f"the test's sample is {sample} ranks, {sample / len(every):.1%} of the sweep"
    )


if __name__ == "__main__":
    main()
