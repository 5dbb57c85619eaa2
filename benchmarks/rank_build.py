"""Seconds per rank to apply a 1,024-rank plan of full-size ref-3t-moe on the meta device.

Each rank (``fake`` process group, one process) either builds only its part of the model
(``build_for_rank``: its pipeline stage, its experts) and applies the plan, or -- the baseline,
the only path before parts existed -- builds the whole 3T model and lets ``apply_plan`` cut it.
Both are timed in this run on the same ranks; the rank path is also split into its phases
(build, meshes, tensor parallel, expert parallel, the rest). Figures are medians.

    python benchmarks/rank_build.py [--ranks 32] [--baseline-ranks 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch.distributed as dist
import torch.nn.functional as F
from torch.testing._internal.distributed.fake_pg import FakeStore

import autoparallel.runtime._apply as apply_module
from autoparallel import get_model
from autoparallel.runtime import ReferenceMoETransformer, apply_plan, build_for_rank
from autoparallel.testing import plan_for_config
from cost_model import ParallelConfig

WORLD_SIZE = 1024
CONFIG = ParallelConfig(
    pp=8, dp=16, tp=8, ep=64, etp=2, sequence_parallel=True, zero_stage=0, pipeline_schedule="1f1b"
)


def _loss(logits, target):
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


class _Phases:
    """Wall time of ``apply_plan``'s passes, by wrapping the module functions it calls."""

    NAMES = {
        "build_meshes": "meshes",
        "apply_tensor_parallel": "tensor parallel",
        "_parallelize": "tp + ep",
    }

    def __init__(self) -> None:
        self.seconds: dict[str, list[float]] = {}
        for function, label in self.NAMES.items():
            setattr(apply_module, function, self._timed(label, getattr(apply_module, function)))

    def _timed(self, label: str, function):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds.setdefault(label, []).append(time.perf_counter() - start)

        return timed


def _one_rank(spec, plan, rank: int, *, part: bool, phases: _Phases | None = None) -> float:
    dist.init_process_group("fake", rank=rank, world_size=WORLD_SIZE, store=FakeStore())
    try:
        start = time.perf_counter()
        if part:
            model = build_for_rank(spec, plan, rank=rank, device="meta")
        else:
            model = ReferenceMoETransformer(spec, device="meta")
        built = time.perf_counter()
        apply_plan(model, plan, loss_fn=_loss, num_micro_batches=8)
        if phases is not None:
            phases.seconds.setdefault("build", []).append(built - start)
        return time.perf_counter() - start
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--ranks", type=int, default=32, help="ranks timed on the rank path (spread over the world)"
    )
    parser.add_argument(
        "--baseline-ranks", type=int, default=2, help="ranks timed with the whole model"
    )
    args = parser.parse_args()
    spec = get_model("ref-3t-moe")
    plan = plan_for_config(spec, CONFIG)
    ranks = [round(i * (WORLD_SIZE - 1) / max(args.ranks - 1, 1)) for i in range(args.ranks)]
    _one_rank(spec, plan, ranks[0], part=True)  # warm-up: lazy imports, cached rule names
    phases = _Phases()
    part_seconds = [_one_rank(spec, plan, rank, part=True, phases=phases) for rank in ranks]
    baseline_ranks = [ranks[0], ranks[-1]][: args.baseline_ranks] or [ranks[0]]
    whole_seconds = [_one_rank(spec, plan, rank, part=False) for rank in baseline_ranks]
    part, whole = statistics.median(part_seconds), statistics.median(whole_seconds)
    print(f"rank part: {part:.3f} s per rank (median of {len(part_seconds)} ranks)")
    median = {label: statistics.median(values) for label, values in phases.seconds.items()}
    breakdown = {
        "build": median["build"],
        "meshes": median["meshes"],
        "tensor parallel": median["tensor parallel"],
        "expert parallel": median["tp + ep"] - median["tensor parallel"],
    }
    breakdown["rest"] = part - sum(breakdown.values())
    print(
        "  " + ", ".join(f"{label} {seconds * 1e3:.0f} ms" for label, seconds in breakdown.items())
    )
    print(f"whole model (baseline): {whole:.2f} s per rank (median of {len(whole_seconds)} ranks)")
    print(
        f"speed-up: {whole / part:.0f}x; all {WORLD_SIZE} ranks, one process: {part * WORLD_SIZE:.0f} s "
        f"(whole-model path: {whole * WORLD_SIZE / 60:.0f} min)"
    )


if __name__ == "__main__":
    main()
