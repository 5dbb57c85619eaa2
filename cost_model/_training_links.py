"""Which link each kind of training traffic crosses, and how the kinds share compute windows.

A collective whose group sits inside one node runs over the scale-up fabric (NVLink); one whose
group spans nodes is bounded by the scale-out NIC (its intra-node hops ride NVLink at a rate the
NIC sets). Traffic on different links overlaps the same compute concurrently; traffic on one
link shares its bandwidth, so one link's kinds take their time from the window in turn.

* Streams: Megatron-core's ``--overlap-grad-reduce`` launches each gradient bucket's
  all-reduce / reduce-scatter asynchronously as the bucket's last gradient is produced
  (``core/distributed/param_and_grad_buffer.py``, ``_ParamAndGradBucketGroup.start_grad_sync``:
  ``torch.distributed`` collectives with ``async_op=True``, run on the data-parallel process
  group's own NCCL stream; ``distributed_data_parallel.py`` registers the backward hooks and
  ``finish_grad_sync`` waits only at the end of the step). The last micro-batch's backward —
  its GEMMs and its tensor-parallel collectives, pipelined with ``--tp-comm-overlap`` (Transformer
  Engine userbuffers, their own streams) or blocking without it — runs on beside them.
* ``CUDA_DEVICE_MAX_CONNECTIONS=1``, which Megatron requires with sequence parallel / TP
  overlap, serialises kernel *launch order* over one hardware queue so that a collective is
  scheduled before the GEMM it overlaps (Megatron-LM ``arguments.py``); kernels already
  running on different streams still execute concurrently.
* SMs: each NCCL collective runs as its own kernel of one CTA per channel, each CTA on one SM
  (NCCL ``NCCL_MIN_NCHANNELS`` / ``NCCL_MAX_CTAS``), so concurrent collectives each take SMs
  from the compute beside them: the compute pays the measured slowdown
  (``_training_dp.contention_seconds``, ``data/overlap_contention.json``) for every hidden
  second of every kind.
* Links: NVLink (intra-node) and the NIC (inter-node) are separate wires with separate
  bandwidth; two kinds on the same link split its bandwidth, so their hidden seconds add up
  within one window.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from cost_model._training import TrainingContext

__all__ = ["LinkWindows", "crosses_nodes"]


def crosses_nodes(ctx: TrainingContext, kind: str) -> np.ndarray:
    """(n,) True where the group of ``kind`` (``tp_comm``, ``ep_comm``, ``cp_comm``,
    ``pp_comm``, ``dp_comm``) spans nodes, i.e. its traffic is bound by the NIC. Data-parallel
    traffic crosses nodes where the dense (dp x cp) or the expert (edp) reduction group does."""
    local, column = ctx.local, ctx.column
    if kind == "dp_comm":
        dp_cp = column("dp") * column("cp")
        edp = dp_cp * column("tp") / (column("ep") * column("etp"))
        return (local["dp_cp"] < dp_cp) | (local["edp"] < edp)
    axis = kind.removesuffix("_comm")
    return np.asarray(local[axis] < column(axis))


class LinkWindows:
    """Free compute of one window per link: NVLink and NIC each start with the whole compute;
    a kind hides behind its own link's remainder and uses up only that link's share."""

    def __init__(self, compute: np.ndarray) -> None:
        self._free = {False: compute, True: compute}

    def free(self, on_nic: np.ndarray) -> np.ndarray:
        """Compute not yet hiding traffic on the link of each row (``on_nic`` (n,))."""
        return np.where(on_nic, self._free[True], self._free[False])

    def take(self, hidden: np.ndarray, *, on_nic: np.ndarray) -> None:
        """Record ``hidden`` seconds of traffic on each row's link."""
        self._free[True] = self._free[True] - np.where(on_nic, hidden, 0.0)
        self._free[False] = self._free[False] - np.where(on_nic, 0.0, hidden)
