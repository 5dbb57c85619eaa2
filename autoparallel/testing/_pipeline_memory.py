"""Live memory of a torchtitan-style training step on real torch code: FSDP2 stages (bf16
parameters gathered from the first forward to the step's end, fp32 gradient reduction) under a
``torch.distributed.pipelining`` schedule with full activation checkpointing and an eager fp32
cross entropy, on forked gloo ranks.

Each rank profiles one step (after a warm-up step) with ``torch.profiler``'s memory timeline and
returns the peak of the bytes its tensors hold, by the profiler's categories: the memory the
cost model's ``_memory.stage_memory`` prices per pipeline rank (weights, gradients, optimizer
states, activations and the pipeline's buffers), without an allocator's fragmentation (the CPU
allocator returns what it frees). ``model_config`` is the same architecture as a HuggingFace
``config.json``, for the cost model's side of the comparison.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from typing import Any

#: The architecture of the measured model (a small Llama: GQA, SwiGLU, untied embeddings).
VOCAB, HIDDEN, HEADS, KV_HEADS, FFN = 8192, 512, 8, 2, 1536
SEQUENCE, MICRO_BATCH = 512, 2


def model_config(layers: int) -> dict[str, Any]:
    """The measured model as a HuggingFace ``config.json``."""
    return {
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "intermediate_size": FFN,
        "num_hidden_layers": layers,
        "vocab_size": VOCAB,
        "tie_word_embeddings": False,
        "max_position_embeddings": 4 * SEQUENCE,
    }


def llama_block(hidden: int, heads: int, kv_heads: int, ffn: int):
    """One torchtitan Llama block (9dec370 ``TransformerBlock``): RMSNorm, separate Q/K/V
    projections, K/V heads repeated for SDPA (``repeat_kv``), causal attention, output
    projection, RMSNorm and a SwiGLU FFN (``w2(silu(w1(x)) * w3(x))``), with residual adds."""
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            head_dim = hidden // heads
            self.attention_norm, self.ffn_norm = nn.RMSNorm(hidden), nn.RMSNorm(hidden)
            self.wq = nn.Linear(hidden, hidden, bias=False)
            self.wk = nn.Linear(hidden, head_dim * kv_heads, bias=False)
            self.wv = nn.Linear(hidden, head_dim * kv_heads, bias=False)
            self.wo = nn.Linear(hidden, hidden, bias=False)
            self.w1 = nn.Linear(hidden, ffn, bias=False)
            self.w3 = nn.Linear(hidden, ffn, bias=False)
            self.w2 = nn.Linear(ffn, hidden, bias=False)

        def forward(self, x):
            b, s, _ = x.shape
            h = self.attention_norm(x)
            q = self.wq(h).view(b, s, heads, -1).transpose(1, 2)
            k = self.wk(h).view(b, s, kv_heads, -1).repeat_interleave(heads // kv_heads, dim=2)
            v = self.wv(h).view(b, s, kv_heads, -1).repeat_interleave(heads // kv_heads, dim=2)
            out = F.scaled_dot_product_attention(
                q, k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
            x = x + self.wo(out.transpose(1, 2).reshape(b, s, hidden))
            h = self.ffn_norm(x)
            return x + self.w2(F.silu(self.w1(h)) * self.w3(h))

    return Block()


def _modules():
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, layers: int) -> None:
            super().__init__()
            self.tok_embeddings = nn.Embedding(VOCAB, HIDDEN)
            self.layers = nn.ModuleDict(
                {str(i): llama_block(HIDDEN, HEADS, KV_HEADS, FFN) for i in range(layers)}
            )
            self.norm = nn.RMSNorm(HIDDEN)
            self.output = nn.Linear(HIDDEN, VOCAB, bias=False)

        def forward(self, tokens):
            h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
            for layer in self.layers.values():
                h = layer(h)
            h = self.norm(h) if self.norm is not None else h
            return self.output(h) if self.output is not None else h

    return Model


def _loss(pred, labels):
    import torch.nn.functional as F

    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


def _stage_part(whole, *, stage_id: int, stages_total: int, per_stage: int, mesh):
    """The model chunk of pipeline stage ``stage_id`` as torchtitan builds it: its layers each
    checkpointed whole and FSDP2-sharded, the chunk too, none resharded after forward (torchtitan
    under pipeline parallelism)."""
    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
    )
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    part = copy.deepcopy(whole)
    keep = range(stage_id * per_stage, (stage_id + 1) * per_stage)
    for name in list(part.layers.keys()):
        if int(name) not in keep:
            del part.layers[name]
    if stage_id != 0:
        part.tok_embeddings = None
    if stage_id != stages_total - 1:
        part.norm = part.output = None
    for name, block in list(part.layers.items()):
        wrapped = checkpoint_wrapper(
            block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, preserve_rng_state=False
        )
        part.layers[name] = wrapped
        fully_shard(wrapped, mesh=mesh["dp"], mp_policy=policy, reshard_after_forward=False)
    fully_shard(part, mesh=mesh["dp"], mp_policy=policy, reshard_after_forward=False)
    return part


def _profiled_peak(step) -> dict[str, Any]:
    """Run ``step`` under torch.profiler's memory profiling; the peak of the live bytes its
    memory timeline reports and their split by category at the peak."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    with profile(
        activities=activities, profile_memory=True, record_shapes=True, with_stack=True
    ) as prof:
        step()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "timeline.json")
        prof.export_memory_timeline(path, device="cpu")
        _, sizes = json.loads(open(path).read())
    totals = [sum(row) for row in sizes]
    peak = max(range(len(totals)), key=totals.__getitem__)
    return {"peak_bytes": float(totals[peak]), "at_peak": [float(v) for v in sizes[peak]]}


def measure_rank(rank: int, world_size: int, schedule: str, layers: int, micro_batches: int):
    """One rank of the measured step (``run_ranks`` target): ``schedule`` ``1f1b`` (one stage per
    rank) or ``interleaved_1f1b`` (two); returns the rank's peak live bytes and their split by
    the profiler's categories at the peak, over the step after a warm-up step."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import Schedule1F1B, ScheduleInterleaved1F1B

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world_size, 1), mesh_dim_names=("pp", "dp"))
    torch.manual_seed(0)
    whole = _modules()(layers)
    per_rank = 2 if schedule == "interleaved_1f1b" else 1
    stages_total = world_size * per_rank
    if layers % stages_total:
        raise ValueError(f"layers ({layers}) must divide into the {stages_total} stages")
    parts = [
        _stage_part(
            whole,
            stage_id=stage_id,
            stages_total=stages_total,
            per_stage=layers // stages_total,
            mesh=mesh,
        )
        for stage_id in (rank + s * world_size for s in range(per_rank))
    ]
    group, cpu = mesh["pp"].get_group(), torch.device("cpu")
    stages = [
        PipelineStage(part, rank + s * world_size, stages_total, cpu, group=group)
        for s, part in enumerate(parts)
    ]
    if per_rank == 2:
        runner = ScheduleInterleaved1F1B(stages, n_microbatches=micro_batches, loss_fn=_loss)
    else:
        runner = Schedule1F1B(stages[0], n_microbatches=micro_batches, loss_fn=_loss)
    optimizer = torch.optim.AdamW([p for part in parts for p in part.parameters()], lr=1e-4)
    generator = torch.Generator().manual_seed(1)
    shape = (MICRO_BATCH * micro_batches, SEQUENCE)
    tokens = torch.randint(0, VOCAB, shape, generator=generator)
    labels = torch.randint(0, VOCAB, shape, generator=generator)
    first, last = rank == 0, rank == world_size - 1

    def step() -> None:
        if first:
            runner.step(tokens, target=labels if last else None, losses=[] if last else None)
        elif last:
            runner.step(target=labels, losses=[])
        else:
            runner.step()
        optimizer.step()
        optimizer.zero_grad()

    step()
    result = _profiled_peak(step)
    dist.barrier()
    return result
