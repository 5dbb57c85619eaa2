"""The parallel axes, named once: the ``Axis`` enum, the dense and MoE mesh orders, and
``describe_layout``, the one short text of a layout (``tp8·pp4·ep32·dp2``).

Axes: ``dp`` data, ``tp`` tensor, ``pp`` pipeline, ``cp`` context, ``ep`` expert, ``etp``
expert-tensor, ``edp`` expert-data. Mesh orders are outermost first, Megatron's rank order
(``rank = tp_i + tp * (cp_i + cp * (dp_i + dp * pp_i))``); MoE layers re-view a stage's ranks as
``edp x ep x etp`` (Megatron-core *parallel folding*).
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cost_model._parallel import ParallelConfig

__all__ = [
    "ALL_AXES",
    "DENSE_MESH_ORDER",
    "MOE_MESH_ORDER",
    "Axis",
    "axis_degrees",
    "describe_layout",
]


class Axis(str, Enum):
    """A parallel axis; its value is the ``ParallelConfig`` attribute holding its degree."""

    DP = "dp"
    TP = "tp"
    PP = "pp"
    CP = "cp"
    EP = "ep"
    ETP = "etp"
    EDP = "edp"

    def __str__(self) -> str:
        return self.value


#: Dense (attention and dense FFN) mesh, outermost first.
DENSE_MESH_ORDER: tuple[Axis, ...] = (Axis.PP, Axis.DP, Axis.CP, Axis.TP)
#: MoE view of the same ranks, outermost first: etp innermost.
MOE_MESH_ORDER: tuple[Axis, ...] = (Axis.PP, Axis.EDP, Axis.EP, Axis.ETP)
#: Every axis, in the order ``ParallelConfig`` lists its degrees (edp derived last).
ALL_AXES: tuple[Axis, ...] = (
    Axis.DP,
    Axis.TP,
    Axis.PP,
    Axis.CP,
    Axis.EP,
    Axis.ETP,
    Axis.EDP,
)
#: The order ``describe_layout`` writes the degrees in (the engines' habit: tp, pp, then the rest).
_DESCRIBE_ORDER: tuple[Axis, ...] = (
    Axis.TP,
    Axis.PP,
    Axis.CP,
    Axis.EP,
    Axis.ETP,
    Axis.DP,
)


def axis_degrees(
    config: ParallelConfig, axes: tuple[Axis, ...]
) -> tuple[tuple[str, int], ...]:
    """``(name, degree)`` of each of ``axes`` in ``config``, e.g. for a mesh."""
    return tuple((axis.value, int(getattr(config, axis.value))) for axis in axes)


def describe_layout(config: ParallelConfig, *, separator: str = "·") -> str:
    """The short text of a layout: degrees above 1 as ``tp8·pp4·ep32·dp2`` (``dp1`` when all are
    1), then ``attn-dp`` and ``sp`` when those switches are on."""
    words = [
        f"{axis.value}{degree}"
        for axis in _DESCRIBE_ORDER
        if (degree := getattr(config, axis.value)) > 1
    ]
    words = words or ["dp1"]
    words += ["attn-dp"] if config.attention_data_parallel else []
    words += ["sp"] if config.sequence_parallel else []
    return separator.join(words)
