"""Arguments shared by the commands that describe a job: model, cluster, training or serving."""

from __future__ import annotations

import argparse


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
    add_inter_node_argument(parser)
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp16", "fp8"), help="training precision")
    parser.add_argument(
        "--fp8-recipe", default="current", choices=("delayed", "current", "tensorwise", "rowwise", "blockwise", "mxfp8"),
        help="fp8 scaling recipe (with --precision fp8)",
    )
    parser.add_argument(
        "--fp8-bf16-layers", type=int, default=0, help="with fp8: keep this many layers at each end in bf16"
    )
    parser.add_argument("--gradient-dtype", default="fp32", choices=("fp32", "bf16"), help="main-gradient dtype")
    parser.add_argument(
        "--master-weights", default="fp32", choices=("fp32", "bf16"), help="optimizer master weights (bf16: none kept)"
    )


def add_inter_node_argument(parser: argparse.ArgumentParser) -> None:
    """``--inter-node-gbps``: override the cluster's scale-out bandwidth per device and direction."""
    parser.add_argument(
        "--inter-node-gbps", type=float, default=None,
        help="scale-out bandwidth per device and direction in Gb/s, replacing the cluster's (e.g. a slower fabric)",
    )


def inter_node_bytes_per_s(args: argparse.Namespace) -> float | None:
    """``--inter-node-gbps`` in bytes/s (None when not given); a non-positive value is an error."""
    if args.inter_node_gbps is None:
        return None
    if args.inter_node_gbps <= 0:
        raise ValueError(f"--inter-node-gbps ({args.inter_node_gbps}) must be > 0")
    return args.inter_node_gbps * 1e9 / 8.0


def with_network_override(cluster, args: argparse.Namespace):  # noqa: ANN001, ANN201 - topology.Cluster
    """``cluster`` with ``--inter-node-gbps`` applied, if given."""
    override = inter_node_bytes_per_s(args)
    return cluster if override is None else cluster.with_inter_node_bandwidth(override, source="--inter-node-gbps")


def training_options(args: argparse.Namespace) -> dict:
    """The ``Training`` fields the precision arguments set."""
    return {
        "precision": args.precision, "fp8_recipe": args.fp8_recipe, "gradient_dtype": args.gradient_dtype,
        "master_weights_fp32": args.master_weights == "fp32",
        "fp8_bf16_layers_at_start": args.fp8_bf16_layers, "fp8_bf16_layers_at_end": args.fp8_bf16_layers,
    }
