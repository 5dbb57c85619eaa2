"""The layout ``autoparallel estimate`` prices where the command line leaves an axis out: a
degree that makes the given layout valid on the given cluster as it stands."""

from __future__ import annotations

__all__ = [
    "DEFAULT_TP",
    "DEFAULT_TRAINING_PP",
    "default_ep",
    "default_pp",
    "default_tp",
    "estimate_config",
]

#: The pipeline degree a training estimate takes on a large cluster when none is given.
DEFAULT_TRAINING_PP = 16
#: The tensor-parallel degree an estimate takes when none is given and the devices allow it.
DEFAULT_TP = 8


def default_tp(
    *, num_devices: int, devices_per_node: int, cp: int, dp: int | None, pp: int | None
) -> int:
    """The tensor-parallel degree when none is given: ``DEFAULT_TP`` (one 8-device node), at
    most the node's devices and the devices the given cp, dp and pp leave, a divisor of those,
    so a layout given as dp or pp alone fits the cluster as it stands (``--dp 8`` on one node:
    tp 1, where 8 asked for 64 devices)."""
    room = max(num_devices // (cp * (dp or 1) * (pp or 1)), 1)
    limit = min(DEFAULT_TP, devices_per_node, room)
    return max(t for t in range(1, limit + 1) if room % t == 0)


def default_ep(model, *, stage_devices: int, etp: int) -> int:
    """The expert-parallel degree when none is given: 1 for a dense model; for an MoE model the
    largest that divides both its routed experts and ``stage_devices / etp`` (the ranks a
    pipeline stage's experts spread over: Megatron-core's ``expert_model_parallel_size``
    divides dp*cp*tp / etp), so a layout given only as tp/pp/dp is valid as it stands."""
    if model.moe is None:
        return 1
    ranks = max(stage_devices // etp, 1)
    experts = model.moe.num_routed_experts
    return max(ep for ep in range(1, ranks + 1) if ranks % ep == 0 and experts % ep == 0)


def default_pp(
    *,
    num_devices: int,
    tp: int,
    cp: int,
    training: bool,
    dp: int | None = None,
    experts: int | None = None,
) -> int:
    """The pipeline degree when none is given: 1 for serving; for training the largest divisor
    of the devices left after tp*cp (and a given ``dp``) that is at most ``DEFAULT_TRAINING_PP``
    and, without a given dp, leaves each stage a multiple of ``experts`` devices (the given ep*etp:
    the ranks a stage's experts spread over), so a layout given only as tp, or with dp or ep,
    fits the cluster as it stands (16 stages on a large cluster, 1 on one node; 1 where tp*cp*dp
    already fills it)."""
    if not training:
        return 1
    stages = max(num_devices // (tp * cp * (dp or 1)), 1)
    fitting = [
        p
        for p in range(1, min(stages, DEFAULT_TRAINING_PP) + 1)
        if stages % p == 0
        and (dp is not None or (num_devices // (tp * cp * p)) % (experts or 1) == 0)
    ]
    return max(fitting, default=1)


def estimate_config(args, cluster, model):
    """The layout ``autoparallel estimate`` prices: the axes the command line gives, the rest
    from ``default_tp``, ``default_pp``, the devices left (dp) and ``default_ep``."""
    from cost_model import ParallelConfig

    num_devices = cluster.num_devices
    tp = args.tp or default_tp(
        num_devices=num_devices,
        devices_per_node=cluster.devices_per_node,
        cp=args.cp,
        dp=args.dp,
        pp=args.pp,
    )
    pp = args.pp or default_pp(
        num_devices=num_devices,
        tp=tp,
        cp=args.cp,
        training=args.training,
        dp=args.dp,
        experts=(args.ep or 1) * args.etp,
    )
    dp = args.dp or max(1, num_devices // (tp * pp * args.cp))
    ep = args.ep
    if ep is None:
        ep = default_ep(model, stage_devices=dp * args.cp * tp, etp=args.etp)
    return ParallelConfig(
        dp=dp,
        tp=tp,
        pp=pp,
        cp=args.cp,
        ep=ep,
        etp=args.etp,
        sequence_parallel=args.sequence_parallel and tp > 1,
        attention_data_parallel=args.attention_data_parallel,
        zero_stage=args.zero_stage,
        pipeline_schedule=args.schedule,
        virtual_stages=args.virtual_stages,
        micro_batch_size=args.micro_batch_size,
        recompute=args.recompute,
    )
