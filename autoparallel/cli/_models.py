"""``autoparallel models`` and ``autoparallel describe``."""

from __future__ import annotations

import argparse

from rich.table import Table

from autoparallel._catalog import DEFAULT_MODEL, get_model, list_models
from autoparallel.cli._render import console
from cost_model import ModelSpec
from cost_model._units import human_bytes, human_count


def register(subparsers) -> None:  # noqa: ANN001
    models = subparsers.add_parser("models", help="list the model catalog")
    models.set_defaults(func=_models)
    describe = subparsers.add_parser("describe", help="parameters, bytes, FLOPs and KV cache of a model")
    describe.add_argument("model", nargs="?", default=DEFAULT_MODEL, help="catalog name or path to config.json")
    describe.set_defaults(func=_describe)


def _attention_label(model: ModelSpec) -> str:
    a = model.attention
    label = {"mla": f"MLA kv{a.kv_lora_rank}", "gqa": f"GQA {a.num_heads}/{a.num_kv_heads}", "mha": f"MHA {a.num_heads}"}[a.kind]
    return label if a.variant == "full" else f"{label} {a.variant}"


def _models(args: argparse.Namespace) -> int:
    table = Table(title="Model catalog")
    for column in ("name", "total params", "active params", "layers", "experts", "attention", "context"):
        table.add_column(column, justify="left" if column in ("name", "attention") else "right")
    for name in list_models():
        model = get_model(name)
        experts = "-" if model.moe is None else f"{model.moe.num_routed_experts}+{model.moe.num_shared_experts} top-{model.moe.top_k}"
        table.add_row(
            name,
            human_count(model.num_parameters),
            human_count(model.num_active_parameters),
            str(model.num_layers),
            experts,
            _attention_label(model),
            f"{model.max_context_tokens:,}",
        )
    console.print(table)
    return 0


def _describe(args: argparse.Namespace) -> int:
    model = get_model(args.model)
    total, active = model.parameter_breakdown(), model.active_parameter_breakdown()
    params = Table(title=f"{model.name}: parameters by component")
    for column in ("component", "total", "active per token"):
        params.add_column(column, justify="right" if column != "component" else "left")
    for part in total:
        params.add_row(part, human_count(total[part]), human_count(active[part]))
    params.add_row("[bold]total", f"[bold]{human_count(model.num_parameters)}", f"[bold]{human_count(model.num_active_parameters)}")
    console.print(params)

    sizes = Table(title="Weights and KV cache")
    for column in ("dtype", "weight bytes", "KV bytes / token", f"KV bytes @ {model.max_context_tokens:,} tokens"):
        sizes.add_column(column, justify="right")
    for dtype in ("bf16", "fp8", "int8", "int4"):
        sizes.add_row(
            dtype,
            human_bytes(model.weight_bytes(dtype)),
            f"{model.kv_cache_bytes_per_token(dtype):,.0f}",
            human_bytes(model.kv_cache_bytes(model.max_context_tokens, dtype)),
        )
    console.print(sizes)
    flops = Table(title="Forward FLOPs per token")
    flops.add_column("context tokens", justify="right")
    flops.add_column("FLOPs / token", justify="right")
    for context in (4096, 32768, 131072, model.max_context_tokens):
        if context <= model.max_context_tokens:
            flops.add_row(f"{context:,}", f"{model.forward_flops_per_token(context):.3e}")
    console.print(flops)
    return 0
