"""Shared test configuration: GPU tests skip where no accelerator is present; plans found once
for the plan and export tests."""

from __future__ import annotations

import importlib.util

import pytest


def _has_cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(item.get_closest_marker("gpu") for item in items) and not _has_cuda():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


@pytest.fixture(scope="session")
def training_plan():
    """A searched training plan of Qwen3-235B-A22B on 64 H100s (ZeRO 1/3, every recompute policy)."""
    import optuna

    import autoparallel as ap
    from cost_model import Training
    from search import SearchBounds, SearchSettings

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    bounds = SearchBounds(zero_stages=(1, 3), recompute_policies=("none", "selective", "full"), max_micro_batch_size=2)
    workload = Training(sequence_length_tokens=4096, global_batch_sequences=256)
    cluster = ap.get_preset("dgx-h100", num_nodes=8)
    return ap.find_plan("qwen3-235b-a22b", cluster, workload, n_trials=40, settings=SearchSettings(bounds=bounds))


@pytest.fixture(scope="session")
def inference_plan():
    """A searched inference plan of DeepSeek-V3 on 128 H100s under a 50 ms TPOT."""
    import optuna

    import autoparallel as ap
    from cost_model import Inference

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    workload = Inference(prompt_tokens=2048, output_tokens=512, tpot_slo_s=0.05)
    return ap.find_plan("deepseek-v3", ap.get_preset("dgx-h100", num_nodes=16), workload, n_trials=40, seed=1)
