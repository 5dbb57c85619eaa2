"""Arguments shared by the commands that describe a job: model, cluster, training or serving."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path


def _number(
    kind: type, *, minimum: float, inclusive: bool, maximum: float | None = None
) -> Callable[[str], float]:
    rule = f"{'>=' if inclusive else '>'} {minimum:g}" + (
        f" and < {maximum:g}" if maximum is not None else ""
    )

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {'an integer' if kind is int else 'a number'}"
            ) from None
        too_small = value < minimum if inclusive else value <= minimum
        if too_small or (maximum is not None and value >= maximum):
            raise argparse.ArgumentTypeError(f"{text} must be {rule}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


positive_int = _number(int, minimum=0, inclusive=False)
non_negative_int = _number(int, minimum=0, inclusive=True)
positive_float = _number(float, minimum=0.0, inclusive=False)
non_negative_float = _number(float, minimum=0.0, inclusive=True)
fraction = _number(float, minimum=0.0, inclusive=True, maximum=1.0)


def output_file(text: str) -> Path:
    """A file path to write: its folder must exist and be writable, and it must not be a folder.
    Checked when the arguments are parsed, so a long search never ends on a bad path."""
    path = Path(text)
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file name")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"folder {str(folder)!r} of {text} does not exist")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"folder {str(folder)!r} of {text} is not writable")
    return path


def output_folder(text: str) -> Path:
    """A folder to write into: created if missing, but its parent must exist and it must not be a file."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder")
    parent = path.parent if str(path.parent) else Path(".")
    if not path.exists() and not parent.is_dir():
        raise argparse.ArgumentTypeError(f"parent folder {str(parent)!r} of {text} does not exist")
    return path


def input_file(text: str) -> Path:
    """An existing file to read (not a folder)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    return path


SERVING_DTYPES = ("bf16", "fp16", "fp8", "fp4", "int8", "int4")


def add_job_arguments(
    parser: argparse.ArgumentParser, *, cluster: str, nodes: int | None, training: bool
) -> None:
    """``--model``, ``--cluster``, ``--nodes``, ``--training``/``--inference`` and the workload sizes;
    ``training`` picks the default kind of job."""
    _add_job_kind(parser, cluster=cluster, nodes=nodes, training=training)
    _add_workload_sizes(parser)
    _add_serving_dtypes(parser)
    add_inter_node_argument(parser)
    _add_hardware_profile(parser)
    _add_training_precision(parser)


def _add_job_kind(
    parser: argparse.ArgumentParser, *, cluster: str, nodes: int | None, training: bool
) -> None:
    """``--model``, ``--cluster``, ``--nodes`` and ``--training``/``--inference``."""
    parser.add_argument(
        "--model", default="ref-3t-moe", help="catalog name or path to a HuggingFace config.json"
    )
    parser.add_argument(
        "--cluster", default=cluster, help="preset name or a Cluster JSON (e.g. a probe result)"
    )
    parser.add_argument(
        "--nodes", type=positive_int, default=nodes, help="scale the cluster to this many nodes"
    )
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument(
        "--training",
        dest="training",
        action="store_true",
        help="a training job" + (" (default)" if training else ""),
    )
    kind.add_argument(
        "--inference",
        dest="training",
        action="store_false",
        help="serving" + ("" if training else " (default)"),
    )
    parser.set_defaults(training=training)


def _add_workload_sizes(parser: argparse.ArgumentParser) -> None:
    """Training sequence and batch, serving prompt and output lengths and their spreads."""
    parser.add_argument(
        "--sequence-length", type=positive_int, default=4096, help="training sequence length"
    )
    parser.add_argument(
        "--global-batch-tokens",
        type=positive_int,
        default=16 * 2**20,
        help="training tokens per step",
    )
    parser.add_argument("--prompt-tokens", type=positive_int, default=4096)
    parser.add_argument("--output-tokens", type=positive_int, default=1024)
    parser.add_argument(
        "--prompt-tokens-cv",
        type=non_negative_float,
        default=0.0,
        help="spread of prompt lengths across requests (std / mean); prefill attention is priced at E[P^2]/E[P]",
    )
    parser.add_argument(
        "--output-tokens-cv",
        type=non_negative_float,
        default=0.0,
        help="spread of output lengths across requests (std / mean)",
    )
    parser.add_argument(
        "--prefix-cache-hit-rate",
        type=fraction,
        default=0.0,
        help="share of prompt tokens served from the KV cache",
    )


def _add_serving_dtypes(parser: argparse.ArgumentParser) -> None:
    """Serving weight dtype (whole model or per part) and KV-cache dtype."""
    parser.add_argument(
        "--weight-dtype",
        default=None,
        choices=SERVING_DTYPES,
        help="serving: weight precision (default: the checkpoint's, from the catalog / config.json)",
    )
    parser.add_argument(
        "--weight-dtype-part",
        action="append",
        default=None,
        metavar="PART=DTYPE",
        type=weight_dtype_part,
        help="serving: the weight dtype of one part (attention, dense_ffn, routed_experts, "
        "shared_experts, router, embedding, lm_head), repeatable (default: the checkpoint's "
        "quantization_config when the weight dtype is the checkpoint's, else --weight-dtype)",
    )
    parser.add_argument(
        "--kv-dtype",
        default=None,
        choices=SERVING_DTYPES,
        help="serving: KV-cache precision, the only one searched (default: the search tries "
        "bf16 and fp8)",
    )


def _add_training_precision(parser: argparse.ArgumentParser) -> None:
    """Training precision, fp8 recipe, gradient and master-weight dtypes."""
    parser.add_argument(
        "--precision",
        default=None,
        choices=("bf16", "fp16", "fp8"),
        help="training precision (default bf16); serving: the weight dtype, as --weight-dtype",
    )
    parser.add_argument(
        "--fp8-recipe",
        default="current",
        choices=("delayed", "current", "tensorwise", "rowwise", "blockwise", "mxfp8"),
        help="fp8 scaling recipe (with --precision fp8)",
    )
    parser.add_argument(
        "--fp8-bf16-layers",
        type=non_negative_int,
        default=0,
        help="with fp8: keep this many layers at each end in bf16",
    )
    parser.add_argument(
        "--gradient-dtype", default="fp32", choices=("fp32", "bf16"), help="main-gradient dtype"
    )
    parser.add_argument(
        "--master-weights",
        default="fp32",
        choices=("fp32", "bf16"),
        help="optimizer master weights (bf16: none kept)",
    )
    parser.add_argument(
        "--optimizer-state-dtype",
        default="fp32",
        choices=("fp32", "bf16"),
        help="dtype of the optimizer's moments (bf16: DeepSeek-V3's AdamW, Megatron-core "
        "--exp-avg-dtype/--exp-avg-sq-dtype bf16)",
    )


def add_inter_node_argument(parser: argparse.ArgumentParser) -> None:
    """``--inter-node-gbps``: override the cluster's scale-out bandwidth per device and direction;
    ``--memory-fraction``: plan with a share of each device's memory."""
    parser.add_argument(
        "--inter-node-gbps",
        type=positive_float,
        default=None,
        help="scale-out bandwidth per device and direction in Gb/s, replacing the cluster's (e.g. a slower fabric)",
    )
    parser.add_argument(
        "--memory-fraction",
        type=positive_float,
        default=None,
        metavar="F",
        help="price as if each device had F (0 < F <= 1) of its memory: a margin for the "
        "allocator and the memory error bar (e.g. 0.9)",
    )


def _add_hardware_profile(parser: argparse.ArgumentParser) -> None:
    """``--hardware-profile``: measured curves of the cluster's device (``autoparallel profile``)."""
    parser.add_argument(
        "--hardware-profile",
        type=input_file,
        default=None,
        metavar="PATH",
        help="hardware profile JSON measured on this cluster's device (autoparallel profile): "
        "GEMM, attention, memory, optimizer and host costs from its curves instead of the preset's "
        "constants (the preset keeps its peaks, memory and network)",
    )
    parser.add_argument(
        "--force-profile",
        action="store_true",
        help="accept a hardware profile measured on another device type than the cluster's",
    )


def inter_node_bytes_per_s(args: argparse.Namespace) -> float | None:
    """``--inter-node-gbps`` in bytes/s (None when not given); a non-positive value is an error."""
    if args.inter_node_gbps is None:
        return None
    if args.inter_node_gbps <= 0:
        raise ValueError(f"--inter-node-gbps ({args.inter_node_gbps}) must be > 0")
    return args.inter_node_gbps * 1e9 / 8.0


def with_network_override(cluster, args: argparse.Namespace):  # topology.Cluster
    """``cluster`` with ``--inter-node-gbps``, ``--memory-fraction`` and ``--hardware-profile``
    applied, if given."""
    override = inter_node_bytes_per_s(args)
    if override is not None:
        cluster = cluster.with_inter_node_bandwidth(override, source="--inter-node-gbps")
    fraction = getattr(args, "memory_fraction", None)
    if fraction is not None:
        if fraction > 1.0:
            raise ValueError(f"--memory-fraction ({fraction}) must be in (0, 1]")
        cluster = cluster.with_memory_fraction(fraction, source="--memory-fraction")
    path = getattr(args, "hardware_profile", None)
    if path is None:
        return cluster
    from topology import load_hardware_profile

    try:
        profile = load_hardware_profile(path)
    except ValueError as error:
        raise ValueError(f"--hardware-profile ({path}): {error}") from None
    target = cluster.device.resolved_device_type
    if profile.device_type != target and not args.force_profile:
        raise ValueError(
            f"--hardware-profile ({path}) was measured on a {profile.device_type!r} device "
            f"({profile.device_name}); the cluster's device ({cluster.device.name}) is "
            f"{target!r}: a profile must be measured on the device it prices (--force-profile "
            "uses it anyway)"
        )
    device = cluster.device.with_profile(profile, force=True)
    return cluster.model_copy(update={"device": device})


def training_options(args: argparse.Namespace) -> dict:
    """The ``Training`` fields the precision arguments set."""
    return {
        "precision": args.precision or "bf16",
        "fp8_recipe": args.fp8_recipe,
        "gradient_dtype": args.gradient_dtype,
        "master_weights_fp32": args.master_weights == "fp32",
        "optimizer_state_dtype": args.optimizer_state_dtype,
        "fp8_bf16_layers_at_start": args.fp8_bf16_layers,
        "fp8_bf16_layers_at_end": args.fp8_bf16_layers,
    }


def weight_dtype_part(text: str) -> tuple[str, str]:
    """``PART=DTYPE`` of ``--weight-dtype-part``: a part of ``cost_model.WEIGHT_PARTS`` and a
    serving dtype."""
    from cost_model import WEIGHT_PARTS

    part, _, dtype = text.partition("=")
    if part not in WEIGHT_PARTS:
        raise argparse.ArgumentTypeError(
            f"part ({part!r}) of {text!r} must be one of {', '.join(WEIGHT_PARTS)}"
        )
    if dtype not in SERVING_DTYPES:
        raise argparse.ArgumentTypeError(
            f"dtype ({dtype!r}) of {text!r} must be one of {', '.join(SERVING_DTYPES)}"
        )
    return part, dtype


def serving_precision(args: argparse.Namespace) -> dict:
    """``weight_dtype`` / ``weight_dtype_by_part`` / ``kv_dtype`` of an inference workload:
    ``--weight-dtype`` (or ``--precision``, which must agree with it), else the checkpoint's
    released dtype (``autoparallel._catalog.checkpoint_dtype``). Served in that dtype, the
    checkpoint keeps the parts its ``quantization_config`` leaves wider (``checkpoint_dtype_by_part``)
    and its FP8 weight scaling (``checkpoint_fp8_scaling``); ``--weight-dtype-part`` overrides
    single parts."""
    from autoparallel._catalog import (
        checkpoint_dtype,
        checkpoint_dtype_by_part,
        checkpoint_fp8_scaling,
    )

    given = getattr(args, "precision", None)
    if given and args.weight_dtype and given != args.weight_dtype:
        raise ValueError(
            f"--precision ({given}) and --weight-dtype ({args.weight_dtype}) must agree for --inference"
        )
    released = checkpoint_dtype(args.model)
    precision: dict = {"weight_dtype": args.weight_dtype or given or released}
    # the checkpoint as released keeps its wider parts; another dtype re-quantizes it uniformly
    by_part = checkpoint_dtype_by_part(args.model) if precision["weight_dtype"] == released else {}
    by_part |= dict(getattr(args, "weight_dtype_part", None) or ())
    if by_part:
        precision["weight_dtype_by_part"] = by_part
    scaling = checkpoint_fp8_scaling(args.model) if precision["weight_dtype"] == released else None
    if scaling is not None:
        precision["fp8_scaling"] = scaling
    return precision | ({"kv_dtype": args.kv_dtype} if args.kv_dtype else {})


def storage_url(text: str) -> str:
    """An Optuna storage: ``sqlite:///FILE`` (its folder must exist), ``journal:FILE`` or another
    RDB URL (``postgresql://user@host:port/db``, ``mysql://...``)."""
    if text.startswith("journal:") or text.endswith((".log", ".journal")):
        path = Path(text.removeprefix("journal:").removeprefix("///"))
    elif text.startswith("sqlite:///"):
        path = Path(text[len("sqlite:///") :])
    elif "://" in text and text.split("://", 1)[0] and text.split("://", 1)[1]:
        return text
    else:
        raise argparse.ArgumentTypeError(
            f"{text!r} must be sqlite:///FILE, journal:FILE or an RDB URL such as postgresql://user@host:5432/db"
        )
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir() or not folder.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: {path} must be a file in an existing folder")
    return text
