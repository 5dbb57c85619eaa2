"""Which link each kind of training traffic crosses, and how the kinds share compute windows.

A collective whose group sits inside one node runs over the scale-up fabric (NVLink); one whose
group spans nodes is bounded by the scale-out NIC (its intra-node hops ride NVLink at a rate the
NIC sets). Traffic on different links overlaps the same compute concurrently; traffic on one
link shares its bandwidth, so one link's kinds take their time from the window in turn.

* Streams: with ``--overlap-grad-reduce`` Megatron-core's backward hook
  (``core/distributed/distributed_data_parallel.py`` -> ``register_grad_ready`` in
  ``core/distributed/param_and_grad_buffer.py``) calls ``_ParamAndGradBucketGroup.
  start_grad_sync`` as soon as a bucket's last gradient lands; it issues the bucket's
  reduce-scatter (distributed optimizer) or all-reduce under ``_coalescing_manager(...,
  async_ops=True)``, which ``ProcessGroupNCCL`` runs on the data-parallel group's own NCCL
  stream, and ``finish_grad_sync`` waits only at the end of the step. The last micro-batch's
  backward — its GEMMs and its tensor-parallel collectives, pipelined with ``--tp-comm-overlap``
  (Transformer Engine userbuffers, their own streams) or blocking without it — runs on beside
  them; the pipeline's ``batch_isend_irecv`` (``p2p_communication.py``) likewise.
* ``CUDA_DEVICE_MAX_CONNECTIONS=1``, which Megatron requires with tensor or context
  parallelism, serialises kernel *launch order* over one hardware queue so that a collective is
  scheduled before the GEMM it overlaps (Megatron-LM ``arguments.py``: "Using tensor model
  parallelism or context parallelism require setting the environment variable
  CUDA_DEVICE_MAX_CONNECTIONS to 1"); kernels already running on different streams still
  execute concurrently.
* SMs: each NCCL collective runs as its own kernel of one CTA per channel, each CTA on one SM
  (NCCL ``NCCL_MIN_NCHANNELS`` / ``NCCL_MAX_CTAS``), so concurrent collectives each take SMs
  from the compute beside them: the compute pays the measured slowdown
  (``_training_dp.contention_seconds``, ``data/overlap_contention.json``) for every hidden
  second of every kind. A second hidden behind the other link's blocking collective is charged
  the same (that collective's kernel loses the SMs instead; the measured figure is for compute
  kernels, so this is an approximation).
* Links: NVLink (intra-node) and the NIC (inter-node) are separate wires with separate
  bandwidth; two kinds on the same link split its bandwidth, so their hidden seconds add up
  within one window.

Not modelled: the NVLink hops of a NIC-bound collective (a ring spanning nodes also crosses
NVLink inside each node, at the NIC's rate, far below NVLink's); a link per NIC rail (all of a
node's scale-out traffic is one link).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from cost_model._training_context import TrainingContext

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
    """Free time of one micro-batch per link: NVLink and the NIC each start with the whole
    compute; a kind hides behind its own link's remainder and uses up only that link's share.
    The collectives a link exposes stall the compute stream, not the other link's stream: for
    traffic issued asynchronously on its own stream (the pipeline send/recv, the bucketed
    data-parallel collectives) those stalls are window too (``stream_window``)."""

    def __init__(self, compute: np.ndarray) -> None:
        self._free = {False: compute, True: compute}
        self._stalled = {False: np.zeros_like(compute), True: np.zeros_like(compute)}

    def free(self, on_nic: np.ndarray) -> np.ndarray:
        """Compute not yet hiding traffic on the link of each row (``on_nic`` (n,))."""
        return np.where(on_nic, self._free[True], self._free[False])

    def stream_window(self, on_nic: np.ndarray) -> np.ndarray:
        """Time a side stream on each row's link may run in: the compute its link left free
        and the stalls of the compute stream on exposed collectives of the other link."""
        return np.where(
            on_nic, self._free[True] + self._stalled[False], self._free[False] + self._stalled[True]
        )

    def take(self, hidden: np.ndarray, *, exposed: np.ndarray, on_nic: np.ndarray) -> None:
        """Record ``hidden`` and ``exposed`` seconds of traffic on each row's link."""
        self._free[True] = self._free[True] - np.where(on_nic, hidden, 0.0)
        self._free[False] = self._free[False] - np.where(on_nic, 0.0, hidden)
        self._stalled[True] = self._stalled[True] + np.where(on_nic, exposed, 0.0)
        self._stalled[False] = self._stalled[False] + np.where(on_nic, 0.0, exposed)
