"""MoE routing flags shared by ``plan`` and ``estimate``: a measured busiest-rank load
(``EstimateOptions.routing_imbalance``, training and serving) and serving traffic's expert-load
skew (``EstimateOptions.expert_load_skew``; default: the residual measured behind EPLB,
``cost_model._routing_skew``)."""

from __future__ import annotations

import argparse
from typing import Any

from autoparallel.cli._args import non_negative_float
from cost_model import eplb_skew

#: CLI destination -> ``EstimateOptions`` field.
_FIELDS = {"routing_imbalance": "routing_imbalance", "expert_load_skew": "expert_load_skew"}


def _at_least_one(text: str) -> float:
    value = float(text)
    if not value >= 1.0:
        raise argparse.ArgumentTypeError(f"({text}) must be >= 1 (the busiest rank over the mean)")
    return value


def add_routing_arguments(parser: argparse.ArgumentParser) -> None:
    """``--routing-imbalance`` and ``--expert-load-skew``."""
    group = parser.add_argument_group(
        "MoE routing", "how evenly routed tokens reach the expert-parallel ranks"
    )
    group.add_argument(
        "--routing-imbalance",
        type=_at_least_one,
        default=None,
        metavar="R",
        help="a measured routed load of the busiest expert rank over the mean (>= 1): the "
        "floor of the busiest rank's load, in place of the default skew of serving traffic "
        "(default: uniform routing's sampling excess and, in serving, --expert-load-skew)",
    )
    group.add_argument(
        "--expert-load-skew",
        type=non_negative_float,
        default=None,
        metavar="S",
        help="serving: the relative spread of the expert ranks' loads that the traffic leaves "
        f"beyond uniform routing's sampling (default: the residual measured behind EPLB, "
        f"{eplb_skew():.3f}, cost_model/data/expert_load_skew.json; 0: routing balanced as "
        "synthetic benchmarks make it)",
    )


def routing_flags_given(args: argparse.Namespace) -> list[str]:
    """The routing flags on the command line, as typed."""
    return [
        "--" + dest.replace("_", "-") for dest in _FIELDS if getattr(args, dest, None) is not None
    ]


def routing_options(args: argparse.Namespace, *, model) -> dict[str, Any]:
    """The ``EstimateOptions`` fields of the routing flags given (none: ``{}``); a serving
    ``--routing-imbalance`` without ``--expert-load-skew`` comes with a skew of 0 (the measured
    load holds it).

    Raises:
        ValueError: a flag for a model without MoE layers, or ``--expert-load-skew`` for a
            training run (whose routing is the recipe's: ``--routing-imbalance``, capacity).
    """
    given = {
        field: getattr(args, dest)
        for dest, field in _FIELDS.items()
        if getattr(args, dest, None) is not None
    }
    if given and model.moe is None:
        flags = routing_flags_given(args)
        verb = "needs" if len(flags) == 1 else "need"
        raise ValueError(f"{', '.join(flags)} {verb} a MoE model; {model.name} has no MoE layers")
    training = getattr(args, "training", True)
    if "expert_load_skew" in given and training:
        raise ValueError(
            f"--expert-load-skew ({given['expert_load_skew']}) prices serving traffic; a training "
            "run's busiest expert rank is --routing-imbalance (or the capacity factor)"
        )
    if "routing_imbalance" in given and not training:
        # a measured busiest-rank load holds the traffic's skew: no default skew on top
        given.setdefault("expert_load_skew", 0.0)
    return given
