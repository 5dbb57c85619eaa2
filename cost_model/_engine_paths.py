"""Which MoE communication path a serving engine runs for a layout: pure functions of the
parallel degrees, shared by the cost model (which prices the path) and the exporters (which
launch it), so that the price and the launch cannot disagree.

They take ints or numpy arrays alike (the exporters pass one config, the cost model a table).
"""

from __future__ import annotations

import numpy as np


def instance_size(*, tp, ep, etp):
    """Ranks of one serving-engine instance per pipeline stage: ``max(tp, ep * etp)`` (the
    ``instance_size`` quantity of ``data/engine_rules.json``; SGLang's ``--tp-size``)."""
    return np.maximum(tp, np.multiply(ep, etp))


def attention_replicas(*, tp, ep, etp, attention_data_parallel):
    """Attention replicas in one instance: ``instance_size / attention_tp``, where attention runs
    over 1 rank under attention data parallel, else over tp (SGLang's ``--attn-dp-size``)."""
    attention_tp = np.where(attention_data_parallel, 1, tp)
    return instance_size(tp=tp, ep=ep, etp=etp) // attention_tp


def sglang_uses_deepep(*, tp, ep, etp):
    """Whether SGLang runs the layout's MoE layers through DeepEP (``--moe-a2a-backend deepep``):
    expert parallel over the whole instance, ``ep > 1`` and ``ep == instance_size``. DeepEP's
    dispatch runs over SGLang's TP group (``_get_deepep_comm_group`` in
    ``srt/layers/moe/fused_moe_triton/layer.py``), so an EP group narrower than the instance
    (etp > 1: MoE tp = tp-size / ep-size) keeps the default ``--moe-a2a-backend none``
    (``moe_a2a_backend`` in ``srt/arg_groups/fields/exec_.py``; read in SGLang 0.5.23), whose
    ``StandardDispatcher`` moves no tokens."""
    ep = np.asarray(ep)
    return (ep > 1) & (ep == instance_size(tp=tp, ep=ep, etp=etp))
