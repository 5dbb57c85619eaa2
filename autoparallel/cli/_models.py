"""``autoparallel models`` and ``autoparallel describe``."""

from __future__ import annotations

import argparse

from autoparallel._catalog import DEFAULT_MODEL, get_model, list_models
from autoparallel.cli._render import add_json_flag, console, fit_words, print_json
from autoparallel.cli._render import table as table_of
from cost_model import ModelSpec, human_bytes, human_count


def register(subparsers) -> None:
    models = subparsers.add_parser("models", help="list the model catalog")
    add_json_flag(models)
    models.set_defaults(func=_models)
    describe = subparsers.add_parser(
        "describe", help="parameters, bytes, FLOPs and KV cache of a model"
    )
    describe.add_argument(
        "model", nargs="?", default=None, help="catalog name or path to config.json"
    )
    describe.add_argument(
        "--model",
        dest="model_option",
        metavar="MODEL",
        default=None,
        help="the same, as the other commands take it",
    )
    add_json_flag(describe)
    describe.set_defaults(func=_describe)


def _attention_label(model: ModelSpec) -> str:
    a = model.attention
    label = {
        "mla": f"MLA kv{a.kv_lora_rank}",
        "gqa": f"GQA {a.num_heads}/{a.num_kv_heads}",
        "mha": f"MHA {a.num_heads}",
    }[a.kind]
    if a.variant == "full":
        return label
    short = {"sliding_window": "SWA", "chunked": "chunk", "sparse_topk": "DSA", "linear": "lin"}
    return f"{label} {short[a.variant]}"  # the extents are in ``describe``


def _models(args: argparse.Namespace) -> int:
    if args.json:
        print_json([_model_summary(get_model(name)) for name in list_models()])
        return 0
    table = table_of(
        "Model catalog",
        {
            "name": "text",
            "params": "number",
            "active": "number",
            "layers": "number",
            "experts": "text",
            "attention": "text",
            "context": "number",
        },
    )
    table.caption = (
        "experts: routed+shared/top-k; attention: SWA sliding window, chunk chunked, DSA sparse "
        "top-k, lin linear layers (extents: describe); context: longest sequence in K = 1,024 "
        "tokens"
    )
    table.columns[5].max_width = 9  # a variant wraps under the kind: the table keeps 80 columns
    for name in list_models():
        model = get_model(name)
        experts = (
            "-"
            if model.moe is None
            else f"{model.moe.num_routed_experts}+{model.moe.num_shared_experts}/{model.moe.top_k}"
        )
        table.add_row(
            name,
            human_count(model.num_parameters),
            human_count(model.num_active_parameters),
            str(model.num_layers),
            experts,
            _attention_label(model),
            f"{model.max_context_tokens / 1024:.0f}K",
        )
    console.print(fit_words(table))
    return 0


def _model_summary(model: ModelSpec) -> dict:
    moe = model.moe
    return {
        "name": model.name,
        "num_parameters": model.num_parameters,
        "num_active_parameters": model.num_active_parameters,
        "num_layers": model.num_layers,
        "num_routed_experts": None if moe is None else moe.num_routed_experts,
        "num_shared_experts": None if moe is None else moe.num_shared_experts,
        "top_k": None if moe is None else moe.top_k,
        "attention": _attention_label(model),
        "max_context_tokens": model.max_context_tokens,
    }


def _attention_extent(model: ModelSpec) -> str:
    """Which keys a query attends to, in words (``describe``)."""
    a = model.attention
    local = {
        "full": "every earlier token",
        "sliding_window": f"the last {a.window_tokens} tokens",
        "chunked": f"the tokens of its own chunk of {a.window_tokens}",
        "sparse_topk": f"the {a.topk_tokens} tokens its indexer picks",
        "linear": "a fixed-size recurrent state",
    }[a.variant]  # each variant's extent is set (AttentionSpec validation)
    text = f"a query attends to {local}"
    if a.full_layer_fraction:
        text += (
            f" in {1 - a.full_layer_fraction:.0%} of the layers, every earlier token in the rest"
        )
    if a.indexer_heads:
        text += (
            f"; the indexer ({a.indexer_heads} heads of {a.indexer_head_dim}) scores every "
            "earlier token"
        )
    return text


def _description(model: ModelSpec) -> dict:
    contexts = [
        c for c in (4096, 32768, 131072, model.max_context_tokens) if c <= model.max_context_tokens
    ]
    return {
        **_model_summary(model),
        "attention_extent": _attention_extent(model),
        "parameters": model.parameter_breakdown(),
        "active_parameters": model.active_parameter_breakdown(),
        "by_dtype": {
            dtype: {
                "weight_bytes": model.weight_bytes(dtype),
                "kv_cache_bytes_per_token": model.kv_cache_bytes_per_token(dtype),
                "kv_cache_bytes_at_max_context": model.kv_cache_bytes(
                    model.max_context_tokens, dtype
                ),
            }
            for dtype in ("bf16", "fp8", "int8", "int4")
        },
        "forward_flops_per_token": {str(c): model.forward_flops_per_token(c) for c in contexts},
    }


def _describe(args: argparse.Namespace) -> int:
    option = getattr(args, "model_option", None)
    if args.model is not None and option is not None and args.model != option:
        raise ValueError(
            f"describe: model given twice ({args.model!r} and --model {option!r}); give one"
        )
    model = get_model(args.model or option or DEFAULT_MODEL)
    if args.json:
        print_json(_description(model))
        return 0
    total, active = model.parameter_breakdown(), model.active_parameter_breakdown()
    params = table_of(
        f"{model.name}: parameters by component",
        {"component": "text", "total": "number", "active per token": "number"},
    )
    for part in total:
        params.add_row(part, human_count(total[part]), human_count(active[part]))
    params.add_row(
        "[bold]total",
        f"[bold]{human_count(model.num_parameters)}",
        f"[bold]{human_count(model.num_active_parameters)}",
    )
    console.print(fit_words(params))
    console.print(f"attention: {_attention_label(model)}: {_attention_extent(model)}")

    sizes = table_of(
        "Weights and KV cache",
        {
            "dtype": "text",
            "weights": "number",
            "KV / token": "number",
            f"KV @ {model.max_context_tokens:,}": "number",
        },
    )
    for dtype in ("bf16", "fp8", "int8", "int4"):
        sizes.add_row(
            dtype,
            human_bytes(model.weight_bytes(dtype)),
            f"{model.kv_cache_bytes_per_token(dtype):,.0f}",
            human_bytes(model.kv_cache_bytes(model.max_context_tokens, dtype)),
        )
    console.print(fit_words(sizes))
    flops = table_of(
        "Forward FLOPs per token", {"context tokens": "number", "FLOPs / token": "number"}
    )
    for context in (4096, 32768, 131072, model.max_context_tokens):
        if context <= model.max_context_tokens:
            flops.add_row(f"{context:,}", f"{model.forward_flops_per_token(context):.3e}")
    console.print(flops)
    return 0
