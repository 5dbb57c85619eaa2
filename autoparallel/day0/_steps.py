"""The Day-0 steps. Each takes the shared context and the step records, stores what later steps
and the report need in ``context.results[step]`` (JSON only), returns the files it wrote, and
raises ``StepSkipped`` with the reason when it cannot run here.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from autoparallel.day0._figures import step_figures
from autoparallel.day0._report import step_report
from autoparallel.day0._run import DEFAULT_ENGINES, SERVING_ENGINES, Day0Context, StepSkipped
from topology import Cluster

__all__ = [
    "step_cluster",
    "step_coverage",
    "step_describe",
    "step_export",
    "step_figures",
    "step_plan_serving",
    "step_plan_training",
    "step_report",
    "step_stages",
    "step_sweep",
]

#: Bytes per parameter of mixed-precision Adam training (bf16 weights and gradients, fp32 master
#: weights and two moments): Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
#: Transformer Models", Fig. 1 — the lower bound the cluster sizing starts from.
TRAINING_BYTES_PER_PARAMETER = 18
MAX_SIZING_ATTEMPTS = 12


# ---------------------------------------------------------------------------- describe
def step_describe(context: Day0Context, records) -> list[Path]:
    model = context.model
    context.results["describe"] = {
        "model_name": model.name,
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "attention": model.attention.kind,
        "num_routed_experts": model.moe.num_routed_experts if model.moe else 0,
        "top_k": model.moe.top_k if model.moe else 0,
        "num_parameters": model.num_parameters,
        "num_active_parameters": model.num_active_parameters,
        "weight_bytes_bf16": model.weight_bytes("bf16"),
        "kv_cache_bytes_per_token_bf16": model.kv_cache_bytes_per_token("bf16"),
        "forward_flops_per_token_4k": model.forward_flops_per_token(4096),
        "max_context_tokens": model.max_context_tokens,
        "spec": model.model_dump(mode="json"),
    }
    return []


# ---------------------------------------------------------------------------- coverage
def step_coverage(context: Day0Context, records) -> list[Path]:
    from autoparallel.day0._coverage import operator_coverage, router_scoring

    if not context.options.coverage:
        raise StepSkipped("turned off (--no-coverage)")
    try:
        report = operator_coverage(
            context.model,
            device=context.coverage_device,
            scoring=router_scoring(context.options.config_path),
        )
    except ValueError as error:  # the reference module does not implement this model family
        raise StepSkipped(f"the reference module cannot run this model: {error}") from error
    path = report.save(context.folder / "coverage.json")
    shares = {
        measure: report.share_by_status(measure=measure) for measure in ("flop", "byte", "count")
    }
    context.results["coverage"] = {
        "device": report.device,
        "dispatch_key": report.dispatch_key,
        "num_operators": len(report.operators),
        "shares": shares,
        "file": path.name,
        "not_native": [
            {
                "name": o.name,
                "status": o.status,
                "flop_share": o.flop_share,
                "byte_share": o.byte_share,
                "reason": o.reason,
            }
            for o in report.operators
            if o.status != "native"
        ],
        "top": [
            {
                "name": o.name,
                "status": o.status,
                "flop_share": o.flop_share,
                "byte_share": o.byte_share,
            }
            for o in report.operators[:10]
        ],
    }
    return [path]


# ---------------------------------------------------------------------------- cluster
PROBE_TIMEOUT_S = 600.0


def probe_under_torchrun(*, num_ranks: int, preset: str, output: Path) -> Path:
    """Run ``autoparallel probe`` on ``num_ranks`` local ranks (``torch.distributed.run``) with
    ``preset`` supplying the peaks and the scale-out tier; returns the cluster JSON it wrote."""
    import os
    import subprocess
    import sys

    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={num_ranks}", "-m", "autoparallel.cli", "probe",
        "--output", str(output), "--preset", preset,
    ]  # fmt: skip
    environment = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=environment,
        timeout=PROBE_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0 or not output.is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"the probe under torchrun exited {done.returncode}: {' / '.join(tail)}")
    return output


def _probe_note(context: Day0Context, measured: bool) -> str:
    if context.options.probe_ranks:
        return (
            f"ran `autoparallel probe` under torchrun on {context.options.probe_ranks} local ranks "
            f"(peaks and scale-out tier from the preset {context.options.cluster!r})"
        )
    if measured:
        return "used the probe file given"
    return (
        f"not run: the preset {context.cluster.name!r} was given; to measure this cluster pass "
        "--probe-ranks N, or run `torchrun --nproc-per-node N -m autoparallel.cli probe` and pass "
        "--cluster cluster.json"
    )


def step_cluster(context: Day0Context, records) -> list[Path]:
    files = []
    if context.options.probe_ranks:
        probed = probe_under_torchrun(
            num_ranks=context.options.probe_ranks,
            preset=context.options.cluster,
            output=context.folder / "probe-cluster.json",
        )
        context.cluster = Cluster.load(probed)
        files.append(probed)
    cluster = context.cluster
    path = cluster.save(context.folder / "cluster.json")
    measured = cluster.provenance.startswith("measured")
    context.results["cluster"] = {
        "name": cluster.name,
        "source": "probe" if measured else "preset",
        "provenance": cluster.provenance,
        "device": cluster.device.name,
        "device_type": cluster.device.resolved_device_type,
        "num_nodes": cluster.num_nodes,
        "devices_per_node": cluster.devices_per_node,
        "memory_per_device_bytes": cluster.memory_per_device_bytes,
        "uncertain": list(cluster.device.uncertain),
        "file": path.name,
        "probe": _probe_note(context, measured),
    }
    return [*files, path]


# ---------------------------------------------------------------------------- plans
def _workload(context: Day0Context, kind: str, *, with_slos: bool = True):
    from cost_model import Inference, Training

    options = context.options
    if kind == "training":
        return Training(
            sequence_length_tokens=options.sequence_length,
            global_batch_tokens=options.global_batch_tokens,
        )
    return Inference(
        prompt_tokens=options.prompt_tokens,
        output_tokens=options.output_tokens,
        ttft_slo_s=options.ttft_slo_s if with_slos else None,
        tpot_slo_s=options.tpot_slo_s if with_slos else None,
    )


def _lower_bound_nodes(context: Day0Context, kind: str) -> int:
    """Nodes whose memory holds the weights (serving) or the 18 bytes per parameter of training."""
    model, cluster = context.model, context.cluster
    needed = (
        model.num_parameters * TRAINING_BYTES_PER_PARAMETER
        if kind == "training"
        else model.weight_bytes("bf16")
    )
    nodes = math.ceil(needed / (cluster.memory_per_device_bytes * cluster.devices_per_node))
    return 2 ** math.ceil(math.log2(max(nodes, 1)))


def _sizes(context: Day0Context, kind: str) -> list[int]:
    """Node counts to try: the one asked for, else the given size, then powers of two from the
    memory lower bound."""
    if context.options.nodes is not None:
        return [context.options.nodes]
    start = max(_lower_bound_nodes(context, kind), context.cluster.num_nodes)
    return [context.cluster.num_nodes] + [
        start * 2**k for k in range(MAX_SIZING_ATTEMPTS) if start * 2**k > context.cluster.num_nodes
    ]


def _search(context: Day0Context, kind: str, *, with_slos: bool):
    import autoparallel as ap
    from cost_model import InfeasiblePlanError

    tried = []
    workload = _workload(context, kind, with_slos=with_slos)
    smallest = 0  # the fewest devices a failed search said any layout needs
    for nodes in _sizes(context, kind):
        cluster = (
            context.cluster
            if nodes == context.cluster.num_nodes
            else context.cluster.with_nodes(nodes)
        )
        if cluster.num_devices < smallest:
            # The planner's own search for the smallest fitting size ruled it out already.
            tried.append(
                {
                    "nodes": nodes,
                    "devices": cluster.num_devices,
                    "why_not": f"below the smallest fitting size found, {smallest} devices",
                }
            )
            continue
        try:
            plan = ap.find_plan(
                context.model,
                cluster,
                workload,
                n_trials=context.options.trials,
                seed=context.options.seed,
            )
        except InfeasiblePlanError as error:
            tried.append({"nodes": nodes, "devices": cluster.num_devices, "why_not": str(error)})
            if error.part != "memory" and nodes > context.cluster.num_nodes:
                break  # an SLO binds, not memory: the planner finds no size of this cluster
            smallest = max(smallest, error.smallest_devices or 0)
            continue
        return plan, cluster, workload, tried
    return None, None, workload, tried


def _plan(context: Day0Context, kind: str) -> list[Path]:
    import autoparallel as ap

    if kind not in context.options.kinds:
        raise StepSkipped(f"not asked for (pass --{kind} or neither flag)")
    plan, cluster, workload, tried = _search(context, kind, with_slos=True)
    slo_note = ""
    if plan is None and kind == "serving":
        slo_note = (
            f"no size tried (up to {tried[-1]['devices']:,} devices) meets the SLOs "
            f"(TTFT <= {context.options.ttft_slo_s} s, TPOT <= {context.options.tpot_slo_s} s) "
            f"on {context.cluster.device.name}; planned without SLOs"
        )
        plan, cluster, workload, more = _search(context, kind, with_slos=False)
        tried += more
    if plan is None:
        # No size up to the search limit holds a layout: the report states what does not fit
        # and by how much (the planner's infeasibility message) and the other steps go on.
        raise StepSkipped(
            f"no {kind} layout fits up to {tried[-1]['devices']:,} devices: {tried[-1]['why_not']}"
        )
    plan_path = plan.save(context.folder / f"plan-{kind}.json")
    cluster_path = cluster.save(context.folder / f"cluster-{kind}.json")
    options = _serving_options(plan)
    cost = ap.estimate(context.model, cluster, workload, plan.config, **options)
    context.results[f"plan-{kind}"] = {
        "plan_file": plan_path.name,
        "cluster_file": cluster_path.name,
        "workload": workload.model_dump(mode="json"),
        "num_nodes": cluster.num_nodes,
        "num_devices": cluster.num_devices,
        "tried": tried,
        "slo_note": slo_note,
        "config": plan.config.model_dump(mode="json"),
        "serving_options": options,
        "layout": _layout(plan),
        "estimate": cost.model_dump(mode="json"),
        "error_bar": _error_bar(context.model, cluster, workload, plan),
        "search": _search_summary(plan),
        "candidates": [_candidate(plan.config, plan.predicted, plan.serving, rank=1)]
        + [
            _candidate(a.config, a.predicted, a.serving, rank=i + 2)
            for i, a in enumerate(plan.alternatives)
        ],
    }
    return [plan_path, cluster_path]


def _error_bar(model, cluster, workload, plan) -> dict:
    """Per figure (the step time and the peak memory; TTFT and TPOT), the held-out errors of the
    published runs of the plan's regime (``cost_model.training_error_band``,
    ``memory_error_band`` / ``serving_error_bands``)."""
    from dataclasses import asdict

    from cost_model import memory_error_band, serving_error_bands, training_error_band

    if workload.kind == "training":
        bands = {
            "step time": training_error_band(model, cluster, plan.config),
            "peak memory": memory_error_band(plan.config),
        }
        return {figure: asdict(band) for figure, band in bands.items() if band is not None}
    bands = serving_error_bands(
        model,
        cluster,
        engine=workload.serving_engine,
        deployment=plan.deployment.kind,
        version=workload.serving_engine_version,
    )
    return {metric: asdict(band) for metric, band in bands.items()}


def _serving_options(plan) -> dict:
    return {} if plan.serving is None else plan.serving.serving_config().model_dump(mode="json")


def _search_summary(plan) -> dict:
    """The search record's scalars, and the deployment when a prefill/decode split was priced."""
    record = plan.provenance.search
    values = {} if record is None else record.model_dump(mode="json")
    summary = {k: v for k, v in values.items() if isinstance(v, (int, float, str))}
    deployment = plan.deployment
    if deployment.pools or deployment.note:
        summary["deployment"] = deployment.kind
        if deployment.note:
            summary["disaggregation"] = deployment.note
    return summary


def _layout(plan) -> str:
    return layout_label(plan.config, plan.serving)


def layout_label(config, serving=None) -> str:
    """``tp8 pp4 dp2 ep16 etp1`` and the switches that are on."""
    words = [
        f"{axis}{getattr(config, axis)}"
        for axis in ("tp", "pp", "dp", "cp", "ep", "etp")
        if axis not in ("cp",) or getattr(config, axis) > 1
    ]
    words += ["attn-dp"] if config.attention_data_parallel else []
    words += ["sp"] if config.sequence_parallel else []
    if serving is None:
        words += [
            f"zero{config.zero_stage}",
            config.pipeline_schedule,
            f"mb{config.micro_batch_size}",
        ]
        words += [f"recompute={config.recompute}"] if config.recompute != "none" else []
    else:
        words += [f"batch{serving.batch_size}", f"kv-{serving.kv_dtype}"]
    return " ".join(words)


def _candidate(config, cost, serving, *, rank: int) -> dict:
    return {
        "rank": rank,
        "layout": layout_label(config, serving),
        "step_time_s": cost.step_time_s,
        "tokens_per_s_per_device": cost.tokens_per_s_per_device,
        "memory_per_device_bytes": cost.memory_per_device_bytes,
        "ttft_s": cost.ttft_s,
        "tpot_s": cost.tpot_s,
        "bottleneck": cost.bottleneck,
    }


def step_plan_training(context: Day0Context, records) -> list[Path]:
    return _plan(context, "training")


def step_plan_serving(context: Day0Context, records) -> list[Path]:
    return _plan(context, "serving")


# ---------------------------------------------------------------------------- exports
def _engine(context: Day0Context, kind: str) -> str:
    engine = context.options.engine
    if engine is None:
        return DEFAULT_ENGINES[kind]
    return engine if (engine in SERVING_ENGINES) == (kind == "serving") else DEFAULT_ENGINES[kind]


def step_export(context: Day0Context, records) -> list[Path]:
    from autoparallel import load_plan
    from autoparallel.export import export_plan

    files, exports = [], {}
    for kind in ("training", "serving"):
        planned = context.results.get(f"plan-{kind}")
        if planned is None:
            continue
        engine = _engine(context, kind)
        result = export_plan(
            load_plan(context.folder / planned["plan_file"]),
            format=engine,
            model_path=context.model.name,
        )
        folder = context.folder / "launch" / f"{kind}-{engine}"
        folder.mkdir(parents=True, exist_ok=True)
        for name, content in result.files.items():
            (folder / name).write_text(content)
            files.append(folder / name)
        exports[kind] = {
            "engine": engine,
            "files": [str(Path("launch") / f"{kind}-{engine}" / n) for n in result.files],
            "dropped": list(result.dropped),
            "notes": list(result.notes),
        }
    if not exports:
        raise StepSkipped("no plan to export")
    context.results["export"] = exports
    return files


# ---------------------------------------------------------------------------- staged checks
def _local_device_count(device: str) -> int:
    import torch

    if device == "cpu":
        return 1
    module = getattr(torch, device, None)
    return (
        int(module.device_count()) if module is not None and hasattr(module, "device_count") else 1
    )


def step_stages(context: Day0Context, records) -> list[Path]:
    """op, layer and one-device stages of a small reference-family model on this machine against
    ``estimate`` on the cluster's device (``profilers._stages``); tp2 and pp2 with >= 2 devices."""
    if not context.options.stages:
        raise StepSkipped("turned off (--no-stages)")
    target = context.cluster.device.resolved_device_type
    if target != context.local_device:
        raise StepSkipped(
            f"the cluster's devices ({target}) are not on this machine ({context.local_device})"
        )
    from cost_model import ParallelConfig
    from profilers import TrainingSetup, run_stages

    setup = TrainingSetup(
        hidden_size=128,
        num_layers=2,
        num_experts=4,
        vocab_size=512,
        sequence_tokens=32,
        batch_sequences=2,
        steps=2,
        warmup_steps=1,
        seed=context.options.seed,
    )
    count = _local_device_count(context.local_device)
    configs = ()
    multi_note = (
        f"tp2 and pp2 not run: {count} local {context.local_device} device (they need >= 2)"
    )
    if count >= 2:
        configs = (
            ParallelConfig(tp=2, micro_batch_size=setup.batch_sequences),
            ParallelConfig(pp=2, micro_batch_size=1),
        )
        multi_note = f"tp2 and pp2 run on {count} local devices"
    report = run_stages(setup=setup, cluster=context.cluster, configs=configs)
    path = context.folder / "stages.json"
    path.write_text(report.model_dump_json(indent=1) + "\n")
    context.results["stages"] = {
        "file": path.name,
        "multi_device": multi_note,
        "setup": setup.model_dump(mode="json"),
        "rows": [
            {
                "stage": s.stage,
                "name": s.name,
                "reference": s.reference,
                "predicted_time_s": s.predicted_time_s,
                "calibrated_time_s": s.calibrated_time_s,
                "measured_time_s": s.measured_time_s,
                "time_error": s.time_error,
                "passed": s.passed,
            }
            for s in report.stages
        ],
    }
    return [path]


# ---------------------------------------------------------------------------- long-context sweep
def sweep_lengths(model) -> list[int]:
    """4K, 8K, ... up to 1M tokens, kept within the model's context (at least two lengths)."""
    from cost_model import DEFAULT_LENGTHS

    inside = [length for length in DEFAULT_LENGTHS if length <= model.max_context_tokens]
    return inside if len(inside) >= 2 else list(DEFAULT_LENGTHS[:2])


def step_sweep(context: Day0Context, records) -> list[Path]:
    from autoparallel import load_plan
    from cost_model import sequence_sweep

    kind = next((k for k in ("serving", "training") if f"plan-{k}" in context.results), None)
    if kind is None:
        raise StepSkipped("no plan to sweep")
    planned = context.results[f"plan-{kind}"]
    plan = load_plan(context.folder / planned["plan_file"])
    cluster = Cluster.load(context.folder / planned["cluster_file"])
    workload = _workload(context, kind, with_slos=False)
    lengths = sweep_lengths(context.model)
    sweep = sequence_sweep(context.model, cluster, workload, plan.config, lengths=lengths)
    rows = [
        {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in row.items()}
        for row in sweep.rows()
    ]
    context.results["sweep"] = {
        "plan": kind,
        "layout": planned["layout"],
        "lengths": lengths,
        "rows": rows,
        "threshold": sweep.threshold,
        "superlinear_length": sweep.superlinear_length,
        "latency": "time to first token of one prompt per replica"
        if kind == "serving"
        else "step time per sequence",
    }
    return []
