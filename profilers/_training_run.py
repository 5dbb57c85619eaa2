"""Measured training steps of the reference MoE model, alone or under ``apply_plan``, set up as
the cost model assumes a training job runs.

Mixed precision follows Megatron-LM (the cost model's memory accounting, Korthikanti et al.
2022, Fig. 1: 18 bytes per parameter): bf16 weights; fp32 main gradients that each bf16
gradient is added into as soon as backward produces it (a post-accumulate hook, so the bf16
gradient is freed at once); fp32 master weights with Adam's two fp32 moments; the updated master
is copied back into the bf16 weight.
"""

from __future__ import annotations

from functools import partial
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from cost_model import ModelSpec, ParallelConfig, Training
from profilers._step import StepProfiler, StepReport

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


class TrainingSetup(BaseModel):
    """A small reference-family model and the batch it trains on (per data-parallel replica)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hidden_size: int = Field(default=256, gt=0)
    num_layers: int = Field(default=4, gt=0)
    num_experts: int = Field(default=8, gt=0)
    top_k: int = Field(default=2, gt=0)
    vocab_size: int = Field(default=1024, gt=0)
    sequence_tokens: int = Field(default=256, gt=0)
    batch_sequences: int = Field(default=4, gt=0)
    steps: int = Field(
        default=5, gt=0, description="timed steps (after warmup_steps), then one profiled step"
    )
    warmup_steps: int = Field(default=2, ge=1)
    precision: Literal["bf16"] = "bf16"
    learning_rate: float = Field(default=1e-4, gt=0)
    seed: int = 0

    def spec(self) -> ModelSpec:
        from autoparallel.runtime import tiny_reference_spec

        return tiny_reference_spec(
            hidden_size=self.hidden_size,
            num_layers=self.num_layers,
            num_experts=self.num_experts,
            top_k=self.top_k,
            vocab_size=self.vocab_size,
        )

    def workload(self, config: ParallelConfig) -> Training:
        return Training(
            sequence_length_tokens=self.sequence_tokens,
            global_batch_sequences=self.batch_sequences * config.dp,
            precision=self.precision,
            optimizer="adam",
            master_weights_fp32=True,
        )


class MasterWeightAdam:
    """AdamW over fp32 master copies of low-precision parameters (module docstring).

    Gradients accumulate into ``main_grads`` during backward; ``step()`` updates the masters,
    copies them into the parameters and zeroes the main gradients (kept allocated, as
    Megatron's contiguous gradient buffer is).
    """

    def __init__(self, parameters, *, learning_rate: float) -> None:
        self.parameters = [p for p in parameters if p.requires_grad]
        self.masters = [p.detach().float().clone() for p in self.parameters]
        for master in self.masters:
            master.grad = torch.zeros_like(master)
        self._hooks = [
            parameter.register_post_accumulate_grad_hook(partial(_into_main_grad, master))
            for parameter, master in zip(self.parameters, self.masters)
        ]
        self.optimizer = torch.optim.AdamW(self.masters, lr=learning_rate, foreach=False)

    @torch.no_grad()
    def step(self) -> None:
        self.optimizer.step()
        for parameter, master in zip(self.parameters, self.masters):
            parameter.copy_(master)
            master.grad.zero_()


def _into_main_grad(master: torch.Tensor, parameter: torch.Tensor) -> None:
    with torch.no_grad():
        master.grad.add_(parameter.grad)
    parameter.grad = None


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1)
    )


def _batch(setup: TrainingSetup, spec: ModelSpec) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(setup.seed + 1)
    shape = (setup.batch_sequences, setup.sequence_tokens)
    return (
        torch.randint(0, spec.vocab_size, shape, generator=generator),
        torch.randint(0, spec.vocab_size, shape, generator=generator),
    )


def build_model(setup: TrainingSetup) -> nn.Module:
    from autoparallel.runtime import ReferenceMoETransformer

    model = ReferenceMoETransformer(setup.spec(), dtype=TORCH_DTYPES[setup.precision])
    model.init_weights(seed=setup.seed)
    return model


def measure_training(setup: TrainingSetup, *, plan=None) -> StepReport:  # ShardingPlan
    """Train ``setup`` for warm-up, timed and one profiled step on this rank; return its report.

    With ``plan``, the model goes through ``autoparallel.apply_plan`` first (call inside a
    launched world of ``plan.world_size`` ranks). Gradient synchronisation across data-parallel
    or expert-parallel replicas is not part of this harness: ``plan`` must have dp = ep = etp = 1.
    """
    if plan is not None and (plan.config.dp, plan.config.ep, plan.config.etp) != (1, 1, 1):
        raise ValueError(
            f"plan dp/ep/etp ({plan.config.dp}/{plan.config.ep}/{plan.config.etp}) must be 1/1/1 here"
        )
    model = build_model(setup)
    ids, targets = _batch(setup, model.spec)
    modules, step_fn = [model], None
    if plan is not None:
        from autoparallel.runtime import apply_plan

        config = plan.config
        micro_batches = setup.batch_sequences // config.micro_batch_size
        applied = apply_plan(
            model, plan, loss_fn=_loss, num_micro_batches=micro_batches, device_type="cpu"
        )
        modules = applied.modules
        if applied.pipeline is not None:
            step_fn = partial(_pipeline_step, applied.pipeline, ids, targets)
    optimizer = MasterWeightAdam(
        [p for m in modules for p in m.parameters()], learning_rate=setup.learning_rate
    )
    profiler = StepProfiler(modules=modules, optimizers=[optimizer.optimizer])
    step_fn = step_fn or partial(_plain_step, modules[0], ids, targets)
    for _ in range(setup.warmup_steps):
        _one_step(step_fn, optimizer, profiler, timed=False)
    for _ in range(setup.steps):
        _one_step(step_fn, optimizer, profiler, timed=True)
    with profiler.profiled_step():
        _run_phases(step_fn, optimizer, profiler)
    profiler.close()
    return profiler.report()


def _plain_step(model: nn.Module, ids, targets, profiler: StepProfiler) -> None:
    with profiler.phase("forward"):
        loss = _loss(model(ids), targets)
    with profiler.phase("backward"):
        loss.backward()


def _pipeline_step(pipeline, ids, targets, profiler: StepProfiler) -> None:
    with profiler.phase("forward_backward"):
        pipeline.step(
            ids if pipeline.is_first else None, targets=targets if pipeline.is_last else None
        )


def _run_phases(step_fn, optimizer: MasterWeightAdam, profiler: StepProfiler) -> None:
    step_fn(profiler)
    with profiler.phase("optimizer"):
        optimizer.step()


def _one_step(step_fn, optimizer: MasterWeightAdam, profiler: StepProfiler, *, timed: bool) -> None:
    if not timed:
        scratch = StepProfiler(modules=[], device=profiler.device)
        _run_phases(step_fn, optimizer, scratch)
        return
    with profiler.step():
        _run_phases(step_fn, optimizer, profiler)
