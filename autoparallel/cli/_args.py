"""Arguments shared by the commands that describe a job: model, cluster, training or serving."""

from __future__ import annotations

import argparse

SERVING_DTYPES = ("bf16", "fp16", "fp8", "fp4", "int8", "int4")


def add_job_arguments(parser: argparse.ArgumentParser, *, cluster: str, nodes: int | None, training: bool) -> None:
    """``--model``, ``--cluster``, ``--nodes``, ``--training``/``--inference`` and the workload sizes;
    ``training`` picks the default kind of job."""
    parser.add_argument("--model", default="ref-3t-moe", help="catalog name or path to a HuggingFace config.json")
    parser.add_argument("--cluster", default=cluster, help="preset name or a Cluster JSON (e.g. a probe result)")
    parser.add_argument("--nodes", type=int, default=nodes, help="scale the cluster to this many nodes")
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--training", dest="training", action="store_true", help="a training job" + (" (default)" if training else ""))
    kind.add_argument("--inference", dest="training", action="store_false", help="serving" + ("" if training else " (default)"))
    parser.set_defaults(training=training)
    parser.add_argument("--sequence-length", type=int, default=4096, help="training sequence length")
    parser.add_argument("--global-batch-tokens", type=int, default=16 * 2**20, help="training tokens per step")
    parser.add_argument("--prompt-tokens", type=int, default=4096)
    parser.add_argument("--output-tokens", type=int, default=1024)
    parser.add_argument(
        "--prompt-tokens-cv", type=float, default=0.0,
        help="spread of prompt lengths across requests (std / mean); prefill attention is priced at E[P^2]/E[P]",
    )
    parser.add_argument(
        "--output-tokens-cv", type=float, default=0.0, help="spread of output lengths across requests (std / mean)"
    )
    parser.add_argument("--prefix-cache-hit-rate", type=float, default=0.0, help="share of prompt tokens served from the KV cache")
    parser.add_argument(
        "--weight-dtype", default=None, choices=SERVING_DTYPES,
        help="serving: weight precision (default: the checkpoint's, from the catalog / config.json)",
    )
    parser.add_argument("--kv-dtype", default=None, choices=SERVING_DTYPES, help="serving: KV-cache precision (default bf16)")


def serving_precision(args: argparse.Namespace) -> dict[str, str]:
    """``weight_dtype`` / ``kv_dtype`` of an inference workload: the flags, else the checkpoint's
    released dtype for the weights (``autoparallel._catalog.checkpoint_dtype``)."""
    from autoparallel._catalog import checkpoint_dtype

    precision = {"weight_dtype": args.weight_dtype or checkpoint_dtype(args.model)}
    return precision | ({"kv_dtype": args.kv_dtype} if args.kv_dtype else {})

