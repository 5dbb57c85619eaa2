"""``report.md`` and ``report.json``: what each step decided and why, each number with its
source."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from autoparallel.day0._run import STEPS, Day0Context, StepRecord, _json_default
from cost_model import human_bytes, human_count, human_seconds

SECTIONS = (
    "Summary",
    "Steps",
    "Model",
    "Operator coverage",
    "Cluster",
    "Training plan",
    "Serving plan",
    "Engine launch files",
    "Staged checks",
    "Long-context sweep",
    "Figures",
)


def _skipped(records: dict[str, StepRecord], step: str) -> str:
    record = records[step]
    return f"*{record.status}*: {record.reason or 'see the steps table'}\n"


def _model(context: Day0Context, records) -> str:
    d = context.results.get("describe")
    if d is None:
        return _skipped(records, "describe")
    source = f"`ModelSpec.from_hf_config({context.options.config_path.name})`"
    total, active = human_count(d["num_parameters"]), human_count(d["num_active_parameters"])
    kv_bytes, flops = d["kv_cache_bytes_per_token_bf16"], d["forward_flops_per_token_4k"]
    return (
        f"{d['model_name']}: {d['num_layers']} layers, hidden {d['hidden_size']:,}, "
        f"{d['attention'].upper()} attention, {d['num_routed_experts']} routed experts "
        f"top-{d['top_k']} ({source}).\n\n"
        f"- parameters: {total} total, {active} active per token\n"
        f"- weights in bf16: {human_bytes(d['weight_bytes_bf16'])}; KV cache {kv_bytes:,.0f} bytes "
        f"per token (bf16)\n- forward FLOPs per token at 4,096 context: {flops:.3e}\n"
        f"- context: {d['max_context_tokens']:,} tokens\n"
    )


def _coverage(context: Day0Context, records) -> str:
    c = context.results.get("coverage")
    if c is None:
        return _skipped(records, "coverage")
    flop, byte = c["shares"]["flop"], c["shares"]["byte"]
    lines = [
        (
            f"{c['num_operators']} ATen operators recorded (training step, prefill, decode of the "
            f"reference module at small width), classified for `{c['device']}` (dispatch key "
            f"{c['dispatch_key']}; `ap.operator_coverage`, file {c['file']}). Shares are of the "
            "small-width copy's FLOPs and bytes, counted per call from shapes.\n"
        ),
        "| status | FLOP share | byte share |",
        "|---|---:|---:|",
        *[f"| {s} | {flop[s]:.1%} | {byte[s]:.1%} |" for s in flop],
        "",
        "Operators that are not native, by FLOP share:",
        "",
        "| operator | status | FLOPs | bytes | why |",
        "|---|---|---:|---:|---|",
        *[_operator_row(o) for o in c["not_native"][:15]],
    ]
    if len(c["not_native"]) > 15:
        lines.append(f"\n... and {len(c['not_native']) - 15} more in {c['file']}.")
    return "\n".join(lines) + "\n"


def _operator_row(o: dict) -> str:
    shares = f"{o['flop_share']:.2%} | {o['byte_share']:.2%}"
    return f"| `{o['name']}` | {o['status']} | {shares} | {o['reason']} |"


def _cluster(context: Day0Context, records) -> str:
    c = context.results.get("cluster")
    if c is None:
        return _skipped(records, "cluster")
    uncertain = (
        f" Values the source marks uncertain: {', '.join(c['uncertain'])}."
        if c["uncertain"]
        else ""
    )
    return (
        f"{c['name']} ({c['source']}): {c['num_nodes']} x {c['devices_per_node']} {c['device']} "
        f"({c['device_type']}), {human_bytes(c['memory_per_device_bytes'])} per device "
        f"(provenance: {c['provenance']}).{uncertain}\n\n"
        f"Probe: {c['probe']}.\n"
    )


def _plan(context: Day0Context, records, kind: str) -> str:
    p = context.results.get(f"plan-{kind}")
    if p is None:
        return _skipped(records, f"plan-{kind}")
    e, source = p["estimate"], f"`ap.estimate` on {p['plan_file']} with {p['cluster_file']}"
    search = p["search"]
    lines = [
        (
            f"Chosen layout: **{p['layout']}** on {p['num_devices']:,} devices "
            f"({p['num_nodes']:,} nodes): ranked first by `ap.find_plan` "
            f"({search.get('method', '?')}, {search.get('rows_evaluated', 0):,} layouts priced of "
            f"{search.get('space_size', 0):,}; trial budget {context.options.trials})."
        ),
        "",
    ]
    if p["tried"]:
        lines.append(
            f"Why {p['num_devices']:,} devices: the smallest size tried on which a layout fits; "
            "sizes "
            "start at the given cluster, then powers of two of nodes from the memory lower bound "
            "(weights for serving, 18 bytes per parameter for training, Korthikanti et al. 2022):"
        )
    for tried in p["tried"]:
        lines.append(f"- {tried['devices']:,} devices: no layout fits — {tried['why_not']}")
    if p["slo_note"]:
        lines.append(f"- {p['slo_note']}")
    if "deployment" in search:
        why = search.get("disaggregation", "it serves more output tokens/s per device")
        lines += ["", f"Deployment: {search['deployment']} prefill and decode ({why})."]
    lines += ["", f"Predicted ({source}):", ""]
    figures = [
        ("step time", human_seconds(e["step_time_s"])),
        (
            "memory per device",
            (
                f"{human_bytes(e['memory_per_device_bytes'])} of "
                f"{human_bytes(e['memory_capacity_bytes'])}"
            ),
        ),
        (
            "tokens/s per device",
            f"{e['tokens_per_s_per_device']:,.2f}" if e["tokens_per_s_per_device"] else "-",
        ),
        ("bottleneck", e["bottleneck"]),
    ]
    if kind == "training":
        figures.insert(1, ("MFU", f"{e['mfu']:.1%}" if e["mfu"] is not None else "-"))
    else:
        figures[1:1] = [("TTFT", human_seconds(e["ttft_s"])), ("TPOT", human_seconds(e["tpot_s"]))]
    lines += [f"- {name}: {value}" for name, value in figures]
    for figure, band in p.get("error_bar", {}).items():
        lines.append(
            f"- error bar of the {figure}: the published runs like this one ({band['scope']}; "
            f"{band['count']} held out, none fitted) took {1 + band['low']:.2f}-"
            f"{1 + band['high']:.2f}x their predicted {figure} (10th-90th percentile; mean "
            f"{band['bias']:+.0%})"
        )
    lines += [
        "",
        "| # | layout | tokens/s/device | memory/device | bottleneck |",
        "|---:|---|---:|---:|---|",
    ]
    lines += [
        f"| {c['rank']} | {c['layout']} | {(c['tokens_per_s_per_device'] or 0):,.2f} | "
        f"{human_bytes(c['memory_per_device_bytes'])} | {c['bottleneck']} |"
        for c in p["candidates"]
    ]
    return "\n".join(lines) + "\n"


def _exports(context: Day0Context, records) -> str:
    exports = context.results.get("export")
    if exports is None:
        return _skipped(records, "export")
    lines = []
    for kind, x in exports.items():
        lines.append(
            f"- {kind}, {x['engine']} (`autoparallel.export.export_plan`): "
            + ", ".join(f"`{f}`" for f in x["files"])
        )
        lines += [f"  - dropped: {item}" for item in x["dropped"]]
    return "\n".join(lines) + "\n"


def _stages(context: Day0Context, records) -> str:
    s = context.results.get("stages")
    if s is None:
        return (
            _skipped(records, "stages")
            + "\ntp2 and pp2: not run (the staged checks did not run).\n"
        )
    lines = [
        (
            "Measured on this machine with a small reference-family model "
            f"(`profilers.run_stages`, {s['file']}):"
        ),
        "",
        "| stage | what | predicted | measured | error | within tolerance |",
        "|---|---|---:|---:|---:|---|",
    ]
    lines += [
        f"| {r['stage']} | {r['name']} | "
        f"{human_seconds(r['calibrated_time_s'] or r['predicted_time_s'])} | "
        f"{human_seconds(r['measured_time_s'])} | {r['time_error']:+.0%} | "
        f"{'yes' if r['passed'] else 'no'} |"
        for r in s["rows"]
    ]
    return "\n".join(lines) + f"\n\n{s['multi_device']}.\n"


def _sweep(context: Day0Context, records) -> str:
    s = context.results.get("sweep")
    if s is None:
        return _skipped(records, "sweep")
    point = s["superlinear_length"]
    fitting = [row["lengths"] for row in s["rows"] if row["feasible"]]
    if point:
        verdict = f"latency turns super-linear (local exponent > {s['threshold']}) at **{point:,} tokens**"
    elif len(fitting) < 2:
        verdict = (
            f"only {len(fitting)} of the {len(s['rows'])} lengths fits in memory on this plan's devices, "
            "so no scaling exponent is measured"
        )
    else:
        verdict = (
            f"latency stays below exponent {s['threshold']} up to {int(max(fitting)):,} tokens, "
            "the longest length that fits"
        )
    lines = [
        (
            f"{s['plan']} plan ({s['layout']}), {s['latency']}, `cost_model.sequence_sweep`: "
            f"{verdict}."
        ),
        "",
        "| tokens | latency | exponent | memory/device | fits |",
        "|---:|---:|---:|---:|---|",
    ]
    for r in s["rows"]:
        latency = human_seconds(r["latency_s"]) if r["latency_s"] is not None else "-"
        exponent = f"{r['scaling_exponent']:.2f}" if r["scaling_exponent"] is not None else "-"
        lines.append(
            f"| {r['lengths']:,} | {latency} | {exponent} | "
            f"{human_bytes(r['memory_per_device_bytes'])} | "
            f"{'yes' if r['feasible'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def _figures(context: Day0Context, records) -> str:
    f = context.results.get("figures")
    if f is None:
        return _skipped(records, "figures")
    lines = [f"![{name}]({path})" for name, path in f["drawn"].items()]
    lines += [f"- {name}: not drawn, {why}" for name, why in f["not_drawn"].items()]
    return "\n\n".join(lines) + "\n"


def _summary(context: Day0Context, records) -> str:
    lines = []
    for kind in ("training", "serving"):
        p = context.results.get(f"plan-{kind}")
        if p is not None:
            lines.append(
                f"- {kind}: **{p['layout']}** on {p['num_devices']:,} devices, "
                f"bottleneck {p['estimate']['bottleneck']}"
            )
    c = context.results.get("coverage")
    if c is not None:
        native = c["shares"]["flop"]["native"]
        lines.append(
            f"- operators on {c['device']}: {native:.1%} of FLOPs run natively, "
            f"{len(c['not_native'])} operators are not native"
        )
    s = context.results.get("sweep")
    if s is not None:
        lines.append(
            f"- long context: super-linear from {s['superlinear_length']:,} tokens"
            if s["superlinear_length"]
            else "- long context: no super-linear point in the sweep"
        )
    skipped = [n for n, r in records.items() if r.status == "skipped"]
    lines.append(f"- skipped here: {', '.join(skipped) if skipped else 'none'}")
    return "\n".join(lines) + "\n"


def _steps_table(records: dict[str, StepRecord]) -> str:
    lines = ["| step | status | seconds | note |", "|---|---|---:|---|"]
    lines += [
        f"| {name} | {r.status} | {r.elapsed_s:.1f} | {r.reason} |" for name, r in records.items()
    ]
    return "\n".join(lines) + "\n"


def render_markdown(context: Day0Context, records: dict[str, StepRecord]) -> str:
    bodies = {
        "Summary": _summary,
        "Steps": lambda c, r: _steps_table(r),
        "Model": _model,
        "Operator coverage": _coverage,
        "Cluster": _cluster,
        "Training plan": lambda c, r: _plan(c, r, "training"),
        "Serving plan": lambda c, r: _plan(c, r, "serving"),
        "Engine launch files": _exports,
        "Staged checks": _stages,
        "Long-context sweep": _sweep,
        "Figures": _figures,
    }
    title = f"# Day-0 report: {context.model.name} on {context.cluster.name}\n\n"
    return title + "\n".join(f"## {name}\n\n{bodies[name](context, records)}" for name in SECTIONS)


def step_report(context: Day0Context, records) -> list[Path]:
    final = {
        name: (StepRecord(status="done") if name == "report" else records[name]) for name in STEPS
    }
    markdown = context.folder / "report.md"
    markdown.write_text(render_markdown(context, final))
    document = {
        "inputs": {k: str(v) for k, v in asdict(context.options).items()},
        "sections": list(SECTIONS),
        "steps": {name: asdict(record) for name, record in final.items()},
        "results": context.results,
    }
    path = context.folder / "report.json"
    path.write_text(json.dumps(document, indent=1, default=_json_default) + "\n")
    return [markdown, path]
