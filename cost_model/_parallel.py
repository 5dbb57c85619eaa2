"""``ParallelConfig``: degrees and switches of one parallel layout.

Axes (defined once, used everywhere): ``dp`` data, ``tp`` tensor, ``pp`` pipeline, ``cp``
context, ``ep`` expert, ``etp`` expert-tensor, ``edp`` expert-data; ``sp`` (sequence parallel)
is a switch on the tp axis.

MoE layers follow Megatron-core's *parallel folding*: attention and dense layers use the mesh
``pp x dp x cp x tp``; MoE layers re-view the same ranks of a pipeline stage as
``edp x ep x etp`` with ``edp * ep * etp == dp * cp * tp``.

``attention_data_parallel`` (inference): attention runs data-parallel across the tp ranks —
each holds whole attention weights and the KV cache of its own requests (SGLang's
``--enable-dp-attention``) — while MoE layers shard over the same ranks with ep/etp.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

PipelineSchedule = Literal["gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"]
RecomputePolicy = Literal["none", "selective", "full"]


class ParallelConfig(BaseModel):
    """Degrees and switches; frozen and hashable. ``validate_for`` checks it against a model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dp: int = Field(default=1, gt=0)
    tp: int = Field(default=1, gt=0)
    pp: int = Field(default=1, gt=0)
    cp: int = Field(default=1, gt=0)
    ep: int = Field(default=1, gt=0)
    etp: int = Field(default=1, gt=0)
    sequence_parallel: bool = False
    attention_data_parallel: bool = False
    zero_stage: Literal[0, 1, 2, 3] = 0
    pipeline_schedule: PipelineSchedule = "1f1b"
    virtual_stages: int = Field(default=1, gt=0)
    micro_batch_size: int = Field(default=1, gt=0)
    recompute: RecomputePolicy = "none"

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    @property
    def edp(self) -> int:
        """Expert-data-parallel degree: the rest of a stage's ranks after ep x etp."""
        return (self.dp * self.cp * self.tp) // (self.ep * self.etp)

    def num_micro_batches(self, global_batch_sequences: int) -> int:
        """Micro-batches per pipeline per step; raises if the batch does not divide."""
        per_replica = self.dp * self.micro_batch_size
        if global_batch_sequences % per_replica:
            raise ValueError(
                f"global_batch_sequences ({global_batch_sequences}) must be divisible by "
                f"dp * micro_batch_size ({self.dp} * {self.micro_batch_size} = {per_replica})"
            )
        return global_batch_sequences // per_replica

    def validate_for(
        self, model, world_size: int | None = None, *, num_redundant_experts: int = 0
    ) -> None:
        """Raise ``ValueError`` naming the first rule this config breaks for ``model`` (with
        ``num_redundant_experts`` extra expert slots over the ep ranks)."""
        from cost_model._rules import check_parallel_config

        check_parallel_config(self, model, world_size, num_redundant_experts=num_redundant_experts)
