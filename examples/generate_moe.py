"""Generate tokens with the reference MoE transformer under an inference plan; a template.

Make an inference plan for the ranks you will launch, then start one process per rank:

    python -m autoparallel.cli plan --model tiny-moe --cluster cpu-loopback --inference \\
        --no-disaggregation --prompt-tokens 16 --output-tokens 16 --ttft-slo-s 0 --tpot-slo-ms 0 \\
        --output plan.json
    torchrun --nproc-per-node 4 examples/generate_moe.py --plan plan.json --batch-size 4

Prompt and output lengths default to the plan's workload and the prompts per replica to the
plan's batch size (the largest the planner found to fit: pass ``--batch-size`` for a quick run).
The example serves prefill and decode on the same ranks (``--no-disaggregation``); a plan with
separate prefill and decode pools would launch each pool with its own ``Pool`` (``plan.deployment.pools``).

Every rank builds the same model, ``apply_plan`` shards it (tensor parallel or attention data
parallel for attention, expert parallel for the experts, as the plan says) and each replica
decodes its own prompts greedily with a KV cache. Rank 0 prints the throughput in tokens/s.
``--compare-reference`` also decodes each rank's prompts with the whole, unsharded model and
says whether the tokens are identical (a check worth keeping when you adapt this to your model).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

import autoparallel as ap
from autoparallel.runtime import ReferenceMoETransformer, greedy_generate


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--plan", required=True, help="inference plan JSON written by `autoparallel plan`"
    )
    parser.add_argument(
        "--prompt-tokens", type=int, help="prompt length (default: the plan's workload)"
    )
    parser.add_argument(
        "--new-tokens", type=int, help="tokens to generate (default: the plan's workload)"
    )
    parser.add_argument(
        "--batch-size", type=int, help="prompts per replica (default: the plan's batch size)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="weights and prompts seed, the same on every rank"
    )
    parser.add_argument(
        "--compare-reference", action="store_true", help="check the tokens against the whole model"
    )
    return parser.parse_args(argv)


def replica_index(plan: ap.ShardingPlan, applied) -> tuple[int, int]:  # AppliedPlan
    """(this rank's request replica, number of replicas): data-parallel replicas, each split
    further over tp when attention runs data-parallel (every tp rank then has its own requests)."""
    config, meshes = plan.config, applied.meshes
    index, count = meshes.coordinate("dp"), config.dp
    if config.attention_data_parallel:
        index, count = index * config.tp + meshes.coordinate("tp"), count * config.tp
    return index, count


def generate(args: argparse.Namespace) -> dict:
    """Apply the plan, decode this rank's prompts and return what ``main`` prints (rank 0's
    view: throughput over the slowest rank, rank 0's tokens, the reference check)."""
    plan = ap.load_plan(args.plan)
    workload = plan.job
    if workload.kind != "inference":
        raise SystemExit(f"{args.plan} is a {workload.kind} plan; make one with --inference")
    if plan.config.pp > 1:
        raise SystemExit(
            f"this example decodes without a pipeline; the plan has pp = {plan.config.pp}"
        )
    prompt_tokens = args.prompt_tokens or workload.prompt_tokens
    new_tokens = args.new_tokens or workload.output_tokens
    batch_size = args.batch_size or (plan.serving.batch_size if plan.serving else 1)
    spec = plan.model

    model = ReferenceMoETransformer(spec)
    model.init_weights(seed=args.seed)
    reference = ReferenceMoETransformer(spec) if args.compare_reference else None
    if reference is not None:
        reference.load_state_dict(model.state_dict())
    applied = ap.apply_plan(model, plan)
    model.eval()

    # All replicas' prompts come from one seed; each replica takes its own rows.
    index, replicas = replica_index(plan, applied)
    generator = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(
        0, spec.vocab_size, (replicas * batch_size, prompt_tokens), generator=generator
    )
    local_prompts = prompts[index * batch_size : (index + 1) * batch_size].to(applied.device)

    generation = greedy_generate(applied.module, local_prompts, max_new_tokens=new_tokens)

    # Throughput: every replica's new tokens over the slowest rank's wall time.
    elapsed = torch.tensor([generation.prefill_s + generation.decode_s, generation.decode_s])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    summary = {
        "config": plan.config.model_dump(exclude_defaults=True),
        "world_size": plan.world_size,
        "model": spec.name,
        "replicas": replicas,
        "batch_size": batch_size,
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "prefill_s": generation.prefill_s,
        "kv_cache_bytes": generation.cache.num_bytes(),
        "tokens_per_s": replicas * batch_size * new_tokens / float(elapsed[0]),
        "decode_tokens_per_s": replicas
        * batch_size
        * (new_tokens - 1)
        / max(float(elapsed[1]), 1e-9),
        "tokens": generation.tokens.cpu(),
        "reference_identical": None,
    }
    if reference is not None:
        expected = greedy_generate(
            reference.eval(), local_prompts.cpu(), max_new_tokens=new_tokens
        ).tokens
        summary["reference_identical"] = torch.equal(expected, generation.tokens.cpu())
    return summary


def main() -> None:
    summary = generate(parse_args())
    if dist.get_rank() == 0:
        print(
            f"plan {summary['config']} on {summary['world_size']} ranks, model {summary['model']}"
        )
        print(
            f"{summary['replicas']} replicas x {summary['batch_size']} prompts x {summary['prompt_tokens']} "
            f"tokens -> {summary['new_tokens']} new tokens each"
        )
        print(
            f"prefill {summary['prefill_s'] * 1e3:.1f} ms, KV cache {summary['kv_cache_bytes']} bytes on rank 0"
        )
        print(
            f"throughput {summary['tokens_per_s']:.1f} tokens/s (decode {summary['decode_tokens_per_s']:.1f} tokens/s)"
        )
        print(f"rank 0 tokens: {summary['tokens'][0].tolist()}")
        if summary["reference_identical"] is not None:
            print(
                f"reference tokens identical: {'yes' if summary['reference_identical'] else 'NO'}"
            )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
