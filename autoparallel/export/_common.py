"""What every exporter shares: the ``Export`` document, the recipe context (engine version, model
identity, node counts), the serving vocabulary, and the plain-text rendering of commands."""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field

from autoparallel.plan import ServingSettings, ShardingPlan
from cost_model import ParallelConfig, Training
from search import (
    LayoutContext,
    engine_data,
    engine_info,
    resolve_version,
    rules_for,
    violated_rules,
)

FORMATS = ("vllm", "sglang", "trtllm", "megatron", "torchtitan", "deepspeed")
MODEL_PATH_PLACEHOLDER = "${MODEL_PATH}"


@dataclass(frozen=True)
class Export:
    """``files`` maps a file name to its content (launch script, config, README note);
    ``dropped`` says what of the plan the format cannot express; ``notes`` what the user must know."""

    format: str
    files: dict[str, str]
    dropped: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())
    engine_version: str = ""

    def render(self) -> str:
        """Every file, then the dropped items and notes, as plain text (never wrapped)."""
        parts = [f"# {name}\n{content}" for name, content in self.files.items()]
        parts += [f"# dropped: {item}" for item in self.dropped]
        parts += [f"# note: {item}" for item in self.notes]
        return "\n".join(parts) + "\n"


@dataclass(frozen=True)
class Recipe:
    """What a recipe needs beside the layout: engine version, model identity, host shape.

    A launcher's "node" is one host (``ShardingPlan.host_devices``): a whole node of the plan's
    cluster, or one compute tray of a rack-scale NVLink domain (4 GPUs of a GB200 NVL72)."""

    engine: str
    version: str
    model_path: str
    model_known: bool
    devices_per_host: int

    def nodes(self, num_devices: int) -> int:
        """Hosts that ``num_devices`` occupy, rounded up (a partly used host is still a host)."""
        return max(1, math.ceil(num_devices / self.devices_per_host))

    def processes_per_node(self, num_devices: int) -> int:
        return min(num_devices, self.devices_per_host)


def recipe(
    plan: ShardingPlan, *, engine: str, version: str | None, model_path: str | None
) -> Recipe:
    version = resolve_version(engine, version)
    known = engine_data()["model_ids"].get(plan.model.name)
    path = model_path or known or MODEL_PATH_PLACEHOLDER
    return Recipe(
        engine=engine,
        version=version,
        model_path=path,
        model_known=model_path is not None or known is not None,
        devices_per_host=plan.host_devices,
    )


def layout_context(plan: ShardingPlan) -> LayoutContext:
    return LayoutContext(
        num_layers=plan.model.num_layers,
        moe=plan.model.moe is not None,
        training=isinstance(plan.job, Training),
    )


def rule_violations(
    plan: ShardingPlan,
    config: ParallelConfig,
    *,
    engine: str,
    version: str | None = None,
    serving: ServingSettings | None = None,
) -> list[str]:
    """Messages of the rules of ``engine`` that ``config`` with ``serving`` (default: the plan's) breaks."""
    from cost_model import configs_to_table

    serving = serving or plan.serving
    table = configs_to_table(
        [config], two_batch_overlap=[bool(serving and serving.two_batch_overlap)]
    )
    verdicts = violated_rules(table, context=layout_context(plan), engine=engine, version=version)
    rules = {rule.id: rule for rule in rules_for(engine, version)}
    return [
        f"{rules[rid].message} [{rid}: {rules[rid].source}]"
        for rid, hit in verdicts.items()
        if bool(hit[0])
    ]


def runnable_engines(plan: ShardingPlan) -> dict[str, list[str]]:
    """Engine -> the rules (current release) its layout breaks; an empty list means it runs the plan."""
    return {engine: rule_violations(plan, plan.config, engine=engine) for engine in FORMATS}


def engine_role(engine: str) -> str:
    return engine_info(engine)["role"]


# ---------------------------------------------------------------------------- serving vocabulary
@dataclass(frozen=True)
class Serving:
    """The serving-engine view of a layout (see the package docstring)."""

    instance_size: int
    attention_tp: int
    attention_replicas: int
    num_instances: int
    batch_size: int
    kv_dtype: str
    num_redundant_experts: int
    two_batch_overlap: bool
    all_to_all_backend: str = "auto"  # DeepEP "normal" / "low_latency", or the engine's choice


def serving_view(
    plan: ShardingPlan,
    config: ParallelConfig,
    num_devices: int,
    serving: ServingSettings | None,
) -> Serving:
    attention_tp = 1 if config.attention_data_parallel else config.tp
    instance = max(config.tp, config.ep * config.etp)
    return Serving(
        instance_size=instance,
        attention_tp=attention_tp,
        attention_replicas=instance // attention_tp,
        num_instances=max(1, num_devices // (config.pp * instance)),
        batch_size=serving.batch_size if serving else config.micro_batch_size,
        kv_dtype=serving.kv_dtype if serving else "bf16",
        num_redundant_experts=serving.num_redundant_experts if serving else 0,
        two_batch_overlap=serving.two_batch_overlap if serving else False,
        all_to_all_backend=serving.all_to_all_backend if serving else "auto",
    )


def training_only(config: ParallelConfig) -> list[str]:
    """Training settings a serving engine has no flag for."""
    dropped = []
    if config.zero_stage:
        dropped.append(
            f"zero_stage {config.zero_stage} (a training setting; serving holds no optimizer state)"
        )
    if config.recompute != "none":
        dropped.append(f"recompute {config.recompute!r} (a training setting)")
    if config.pp > 1 and (config.pipeline_schedule != "1f1b" or config.virtual_stages > 1):
        dropped.append(
            f"pipeline_schedule {config.pipeline_schedule!r} x{config.virtual_stages} (serving engines run their own pipeline)"
        )
    if config.cp > 1:
        dropped.append(f"cp {config.cp} (context parallel is not a serving option of this engine)")
    return dropped


def stage_sizes(plan: ShardingPlan) -> list[int]:
    return [s.stop_layer - s.start_layer for s in sorted(plan.stages, key=lambda s: s.chunk)]


def uneven(plan: ShardingPlan) -> bool:
    return len(set(stage_sizes(plan))) > 1


# ---------------------------------------------------------------------------- text
def command(words: list[str], *, env: dict[str, str] | None = None) -> str:
    """One ``--flag value`` per line, joined with backslash-newlines (plain text: a terminal never
    wraps it into a broken script); ``${VAR}`` placeholders stay unquoted for the shell."""
    groups: list[list[str]] = [[]]
    for word in words:
        if word.startswith("--") and groups[-1]:
            groups.append([])
        groups[-1].append(word)
    prefix = " ".join(f"{k}={_quote(v)}" for k, v in (env or {}).items())
    lines = [" ".join(_quote(w) for w in group) for group in groups]
    if prefix:
        lines[0] = f"{prefix} {lines[0]}"
    return " \\\n    ".join(lines) + "\n"


def _quote(word: str) -> str:
    if word.startswith("${") and word.endswith("}") or word.startswith("${") and ":" in word:
        return f'"{word}"' if " " in word else word
    return shlex.quote(word)


def script(body: str, *, header: list[str]) -> str:
    lines = [
        "#!/usr/bin/env bash",
        *[f"# {line}" for line in header],
        "set -euo pipefail",
        body.rstrip("\n"),
    ]
    return "\n".join(lines) + "\n"


def readme(
    *,
    title: str,
    recipe: Recipe,
    steps: list[str],
    dropped: list[str],
    notes: list[str],
    layout: str,
) -> str:
    """The note file of an export: what it is, how to launch it, what it drops."""
    lines = [
        f"# {title}",
        "",
        f"Engine: {recipe.engine} {recipe.version}. Layout: {layout}.",
        f"Model: {recipe.model_path}",
    ]
    if not recipe.model_known:
        lines.append(
            "Set MODEL_PATH to the checkpoint folder (or hub id) of this model before launching."
        )
    lines += ["", "## Launch", ""] + [
        f"{index}. {step}" for index, step in enumerate(steps, start=1)
    ]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in notes]
    lines += ["", "## Not expressed by this engine", ""] + (
        [f"- {item}" for item in dropped] or ["- nothing"]
    )
    return "\n".join(lines) + "\n"


def describe(config: ParallelConfig) -> str:
    words = [
        f"tp{config.tp}",
        f"pp{config.pp}",
        f"dp{config.dp}",
        f"cp{config.cp}",
        f"ep{config.ep}",
        f"etp{config.etp}",
    ]
    words += ["attn-dp"] if config.attention_data_parallel else []
    words += ["sp"] if config.sequence_parallel else []
    return " ".join(words)
