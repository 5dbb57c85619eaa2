"""The example scripts run under plans ``autoparallel plan`` makes for the 4-rank ``cpu-loopback`` cluster.

``examples/train_moe.py`` runs under torchrun (``python -m torch.distributed.run``), 10 steps, on
the reference MoE and on transformers' Qwen3-MoE class, and its loss must fall (by a fifth; it falls by a third in 10 steps); ``examples/generate_moe.py``'s
``generate`` runs on forked gloo ranks and must reproduce the whole model's greedy tokens.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import autoparallel as ap
from autoparallel.testing import run_ranks

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
STEPS = 10

pytestmark = pytest.mark.distributed


def _plan(arguments: list[str], path: Path, model: str = "tiny-moe") -> Path:
    """Run ``python -m autoparallel.cli plan --model tiny-moe --cluster cpu-loopback ...``."""
    command = [
        sys.executable,
        "-m",
        "autoparallel.cli",
        "plan",
        "--model",
        model,
        "--cluster",
        "cpu-loopback",
        "--trials",
        "40",
        "--seed",
        "0",
        "--output",
        str(path),
        *arguments,
    ]
    done = subprocess.run(command, env=_environment(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert ap.load_plan(path).world_size == 4
    return path


def _environment() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", COLUMNS="120")


def _load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _transformers_config(folder: Path) -> Path:
    """A small Qwen3-MoE ``config.json`` as transformers saves it (``save_pretrained``)."""
    import transformers

    transformers.Qwen3MoeConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
    ).save_pretrained(folder)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("model", ["reference", "transformers"])
def test_train_example_loss_falls_under_torchrun(tmp_path: Path, model: str) -> None:
    """The reference MoE, and transformers' Qwen3-MoE class planned from its saved config.json
    (``--transformers``), train under the plan ``autoparallel plan`` makes for them."""
    training = ["--training", "--sequence-length", "16", "--global-batch-tokens", "128"]
    extra: list[str] = []
    if model == "transformers":
        config = _transformers_config(tmp_path / "qwen3-moe")
        plan = _plan(training, tmp_path / "plan.json", model=str(config))
        extra = ["--transformers", str(config)]
    else:
        plan = _plan(training, tmp_path / "plan.json")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "4",
        str(EXAMPLES / "train_moe.py"),
        "--plan",
        str(plan),
        "--steps",
        str(STEPS),
        *extra,
    ]
    done = subprocess.run(
        command, cwd=tmp_path, env=_environment(), capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    losses = [
        float(value)
        for value in re.findall(r"^step +\d+ +loss ([0-9.]+)", done.stdout, re.MULTILINE)
    ]
    assert len(losses) == STEPS, done.stdout
    assert losses[-1] < 0.8 * losses[0], losses
    assert all(later < earlier for earlier, later in zip(losses[:5], losses[1:6])), losses


def _generate(rank: int, world_size: int, plan_path: str) -> dict:
    example = _load_example("generate_moe")
    arguments = [
        "--plan",
        plan_path,
        "--compare-reference",
        "--batch-size",
        "2",
        "--new-tokens",
        "8",
    ]
    summary = example.generate(example.parse_args(arguments))
    summary["tokens"] = summary["tokens"].tolist()
    return summary


def test_generate_example_matches_whole_model(tmp_path: Path) -> None:
    inference = [
        "--inference",
        "--no-disaggregation",
        "--prompt-tokens",
        "16",
        "--output-tokens",
        "16",
        "--ttft-slo-s",
        "0",
        "--tpot-slo-ms",
        "0",
    ]
    plan = _plan(inference, tmp_path / "plan.json")
    results = run_ranks(_generate, 4, args=(str(plan),), timeout_s=180)
    assert all(summary["reference_identical"] for summary in results)
    assert results[0]["tokens_per_s"] > 0 and len(results[0]["tokens"][0]) == 8
    assert results[0]["kv_cache_bytes"] > 0
