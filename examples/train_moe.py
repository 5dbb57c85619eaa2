"""Train the reference MoE transformer under a sharding plan; a template for your own script.

Make a training plan for the ranks you will launch, then start one process per rank:

    python -m autoparallel.cli plan --model tiny-moe --cluster cpu-loopback --training \\
        --sequence-length 16 --global-batch-tokens 128 --output plan.json
    torchrun --nproc-per-node 4 examples/train_moe.py --plan plan.json --steps 20

The batch is the plan's: ``global_batch_sequences`` sequences of ``sequence_length_tokens``
(the planner prices exactly this workload, so keep them as planned).

Every rank builds the same model from the plan's model name (or, with ``--transformers CONFIG``,
transformers' own model class from the ``config.json`` the plan was made from:
``autoparallel plan --model CONFIG ...``), ``apply_plan`` shards it (pipeline stages, tensor /
expert / context / data parallel, as the plan says), and the loop runs forward, backward,
the gradient sync the plan needs, and an AdamW step. Rank 0 prints the loss of every step.
The data is synthetic (a fixed set of random sequences the model learns to reproduce): replace
``synthetic_batch`` with your data loader, sliced by the rank's data-parallel coordinate
(and, under context parallel, by ``applied.shard_inputs`` into the rank's tokens of each sequence).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import autoparallel as ap
from autoparallel.runtime import ReferenceMoETransformer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--plan", required=True, help="training plan JSON written by `autoparallel plan`"
    )
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps (default 20)")
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (default 3e-3)")
    parser.add_argument(
        "--seed", type=int, default=0, help="weights and data seed, the same on every rank"
    )
    parser.add_argument(
        "--transformers",
        metavar="CONFIG",
        default=None,
        help="train transformers' model class of this config.json (or model folder), "
        "randomly initialised, instead of the reference MoE transformer",
    )
    return parser.parse_args(argv)


def build_model(plan: ap.ShardingPlan, args: argparse.Namespace) -> torch.nn.Module:
    """The whole model, the same weights on every rank (one seed), before sharding."""
    if args.transformers is None:
        model = ReferenceMoETransformer(plan.model)
        model.init_weights(seed=args.seed)
        return model
    import transformers  # load real weights with from_pretrained(args.transformers) instead

    config = transformers.AutoConfig.from_pretrained(args.transformers)
    torch.manual_seed(args.seed)
    return transformers.AutoModelForCausalLM.from_config(config)


def logits_of(output) -> torch.Tensor:
    """The logits of a forward: a tensor, or a transformers output's ``logits``."""
    return output if isinstance(output, torch.Tensor) else output.logits


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss of a (micro-)batch; the pipeline calls it once per micro-batch."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def synthetic_batch(
    *, plan: ap.ShardingPlan, vocab_size: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch the plan was made for: ``global_batch_sequences`` sequences of
    ``sequence_length_tokens + 1`` tokens, split into inputs and next-token targets."""
    job = plan.job
    shape = (int(job.global_batch_sequences), job.sequence_length_tokens + 1)
    tokens = torch.randint(0, vocab_size, shape, generator=torch.Generator().manual_seed(seed))
    return tokens[:, :-1], tokens[:, 1:]


def global_mean(value: torch.Tensor | None, device: torch.device) -> float:
    """Mean of ``value`` over the ranks that have one (the last pipeline stage holds the loss)."""
    total = torch.zeros(2, device=device)
    if value is not None:
        total[0], total[1] = value.detach().float(), 1.0
    dist.all_reduce(total)
    return float(total[0] / total[1])


def train(args: argparse.Namespace) -> list[float]:
    """Apply the plan and run ``args.steps`` optimizer steps; rank 0 prints each step's loss.
    Returns the global mean loss of every step."""
    plan = ap.load_plan(args.plan)
    if plan.job.kind != "training":
        raise SystemExit(f"{args.plan} is a {plan.job.kind} plan; make one with --training")
    spec = plan.model

    # The same weights on every rank: build whole, initialize from one seed, then shard.
    model = build_model(plan, args)
    applied = ap.apply_plan(model, plan, loss_fn=cross_entropy)
    device, pipeline = applied.device, applied.pipeline
    optimizer = torch.optim.AdamW(applied.parameters(), lr=args.lr)

    # Each data-parallel replica trains on its own slice of the global batch.
    inputs, targets = synthetic_batch(plan=plan, vocab_size=spec.vocab_size, seed=args.seed)
    replicas, replica = plan.config.dp, applied.meshes.coordinate("dp")
    inputs, targets = (t.chunk(replicas)[replica].to(device) for t in (inputs, targets))
    # Under context parallel (cp > 1) each rank keeps two chunks of every sequence (r and 2*cp-1-r).
    inputs, targets = applied.shard_inputs(inputs, targets)

    rank, losses = dist.get_rank(), []
    if rank == 0:
        print(
            f"plan {plan.config.model_dump(exclude_defaults=True)} on {plan.world_size} ranks, model {spec.name}"
        )
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        optimizer.zero_grad()
        if pipeline is not None:  # the schedule runs forward and backward of every micro-batch
            loss = pipeline.step(
                inputs if pipeline.is_first else None, targets=targets if pipeline.is_last else None
            ).loss
        else:
            loss = cross_entropy(logits_of(applied.module(inputs)), targets)
            loss.backward()
        applied.sync_gradients()  # expert gradients over edp, dense ones over dp, as the plan says
        optimizer.step()
        losses.append(global_mean(loss, device))
        if rank == 0:
            print(
                f"step {step:3d}  loss {losses[-1]:.4f}  {time.perf_counter() - start:.3f} s",
                flush=True,
            )
    return losses


def main() -> None:
    train(parse_args())
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
