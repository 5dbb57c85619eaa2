"""The report's PNG figures, drawn with matplotlib's Agg backend from the steps' results only
(every plotted number is one the report's JSON holds)."""

from __future__ import annotations

from pathlib import Path

from autoparallel.day0._run import Day0Context, StepSkipped

FIGURES = {
    "pareto": "pareto.png",
    "time": "time_breakdown.png",
    "memory": "memory_breakdown.png",
    "topology": "topology.png",
    "sweep": "context_sweep.png",
    "coverage": "coverage.png",
}
_STATUS_COLORS = {
    "native": "#2e7d32",
    "composite": "#1565c0",
    "fallback": "#ef6c00",
    "missing": "#c62828",
}
_DPI = 80


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=_DPI)
    _pyplot().close(figure)
    return path


def _plans(context: Day0Context) -> dict[str, dict]:
    return {
        kind: context.results[f"plan-{kind}"]
        for kind in ("training", "serving")
        if f"plan-{kind}" in context.results
    }


def _front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points no other point beats on both less memory and more tokens/s (sorted by memory)."""
    front, best = [], -1.0
    for memory, rate in sorted(points, key=lambda p: (p[0], -p[1])):
        if rate > best:
            front.append((memory, rate))
            best = rate
    return front


def pareto_figure(context: Day0Context, path: Path) -> Path | None:
    plans = _plans(context)
    if not plans:
        return None
    plt = _pyplot()
    figure, axes = plt.subplots(1, len(plans), figsize=(5 * len(plans), 3.6), squeeze=False)
    for axis, (kind, planned) in zip(axes[0], plans.items()):
        points = [
            (c["memory_per_device_bytes"] / 1e9, c["tokens_per_s_per_device"] or 0.0)
            for c in planned["candidates"]
        ]
        axis.scatter(*zip(*points), color="#90a4ae", label="layouts kept by the search")
        front = _front(points)
        axis.plot(*zip(*front), color="#1565c0", marker="o", label="Pareto front")
        axis.scatter(
            [points[0][0]],
            [points[0][1]],
            color="#c62828",
            marker="*",
            s=160,
            zorder=3,
            label="chosen",
        )
        axis.set(
            xlabel="memory per device (GB)",
            ylabel="tokens/s per device",
            title=f"{kind}: {planned['num_devices']} devices",
        )
        axis.legend(fontsize=7)
    return _save(figure, path)


def _stacked(
    context: Day0Context, path: Path, *, part: str, scale: float, unit: str
) -> Path | None:
    """One horizontal stacked bar per plan, each on its own axis (training and serving steps
    differ by orders of magnitude); memory bars carry the capacity as a black line."""
    plans = _plans(context)
    if not plans:
        return None
    plt = _pyplot()
    figure, axes = plt.subplots(len(plans), 1, figsize=(7.5, 1.3 + 1.1 * len(plans)), squeeze=False)
    colors = plt.get_cmap("tab20")
    for axis, (kind, planned) in zip(axes[:, 0], plans.items()):
        left = 0.0
        parts = sorted(planned["estimate"][part].items(), key=lambda item: -item[1])
        for index, (name, value) in enumerate(item for item in parts if item[1] > 0):
            axis.barh(0, value / scale, left=left, color=colors(index % 20), label=name)
            left += value / scale
        if part == "memory_bytes":
            capacity = planned["estimate"]["memory_capacity_bytes"] / scale
            axis.axvline(capacity, color="black", label="capacity")
        axis.set_yticks([0], [kind])
        axis.set_xlabel(unit)
        axis.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    title = "time per step by part" if part == "time_s" else "memory per device by part"
    axes[0, 0].set_title(title)
    return _save(figure, path)


def topology_figure(context: Day0Context, path: Path) -> Path | None:
    cluster = context.cluster
    shown = (
        cluster if cluster.num_devices >= 2 * cluster.devices_per_node else cluster.with_nodes(2)
    )
    if shown.num_devices > 64:
        shown = shown.with_nodes(max(1, 64 // shown.devices_per_node))
    matrix = shown.bandwidth_matrix() / 1e9
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(4.6, 3.8))
    image = axis.imshow(matrix, cmap="viridis")
    figure.colorbar(image, ax=axis, label="GB/s per direction")
    axis.set(
        xlabel="device",
        ylabel="device",
        title=f"{cluster.name}: {shown.num_nodes} nodes x {shown.devices_per_node} shown",
    )
    return _save(figure, path)


def sweep_figure(context: Day0Context, path: Path) -> Path | None:
    sweep = context.results.get("sweep")
    if sweep is None:
        return None
    rows = [row for row in sweep["rows"] if row["latency_s"] is not None]
    fits = [row for row in rows if row["feasible"]]
    spills = [row for row in rows if not row["feasible"]]
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(5.5, 3.6))
    axis.loglog(
        [r["lengths"] for r in fits],
        [r["latency_s"] for r in fits],
        marker="o",
        color="#1565c0",
        label="fits in memory",
    )
    if spills:
        axis.scatter(
            [r["lengths"] for r in spills],
            [r["latency_s"] for r in spills],
            marker="x",
            color="#90a4ae",
            label="does not fit",
        )
    if sweep["superlinear_length"]:
        axis.axvline(
            sweep["superlinear_length"],
            color="#c62828",
            linestyle="--",
            label=f"super-linear from {sweep['superlinear_length']:,} tokens",
        )
    axis.legend(fontsize=7)
    axis.set(
        xlabel="tokens",
        ylabel=f"{sweep['latency']} (s)",
        title=f"{sweep['plan']} plan: {sweep['layout']}",
    )
    axis.title.set_fontsize(8)
    return _save(figure, path)


def coverage_figure(context: Day0Context, path: Path) -> Path | None:
    coverage = context.results.get("coverage")
    if coverage is None:
        return None
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(7, 2.6))
    measures = [("flop", "FLOPs"), ("byte", "bytes"), ("count", "operators")]
    for row, (measure, _label) in enumerate(measures):
        left = 0.0
        for status, color in _STATUS_COLORS.items():
            share = coverage["shares"][measure][status]
            axis.barh(row, share * 100, left=left, color=color, label=status if row == 0 else None)
            left += share * 100
    axis.set_yticks(range(len(measures)), [label for _, label in measures])
    axis.set(
        xlabel="% of the model",
        xlim=(0, 100),
        title=f"operator coverage on {coverage['device']} ({coverage['dispatch_key']}), "
        f"{coverage['num_operators']} operators",
    )
    axis.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return _save(figure, path)


def step_figures(context: Day0Context, records) -> list[Path]:
    folder = context.folder / "figures"
    folder.mkdir(exist_ok=True)
    drawers = {
        "pareto": pareto_figure,
        "time": lambda c, p: _stacked(c, p, part="time_s", scale=1.0, unit="seconds"),
        "memory": lambda c, p: _stacked(c, p, part="memory_bytes", scale=1e9, unit="GB"),
        "topology": topology_figure,
        "sweep": sweep_figure,
        "coverage": coverage_figure,
    }
    drawn, missing = {}, {}
    for name, drawer in drawers.items():
        result = drawer(context, folder / FIGURES[name])
        if result is None:
            missing[name] = "its step did not run (see the steps table)"
        else:
            drawn[name] = str(Path("figures") / FIGURES[name])
    if not drawn:
        raise StepSkipped("nothing to draw")
    context.results["figures"] = {"drawn": drawn, "not_drawn": missing}
    return [context.folder / p for p in drawn.values()]
