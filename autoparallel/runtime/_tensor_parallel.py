"""Tensor and sequence parallel from a plan's module rules, with DTensor's ``parallelize_module``.

Placements follow Megatron-LM (Shoeybi et al. 2019, arXiv:1909.08053 sec. 3; sequence parallel:
Korthikanti et al. 2022, arXiv:2205.05198 sec. 4.2.2) as torchtitan writes them:

* ``colwise`` Linear: weight ``Shard(0)``, input replicated, output split by features (local).
  On ``lm_head`` the output is gathered (``Replicate``) so callers see whole logits.
* ``rowwise`` Linear: weight ``Shard(1)``, partial outputs summed (all-reduce; with sequence
  parallel a reduce-scatter to ``Shard(1)``). On an embedding the vocabulary is split.
* ``sequence`` norm: runs on the sequence shard (``SequenceParallel``); ``sequence`` attention or
  dense FFN block: all-gathers the sequence at its input. An MoE block keeps its tokens sharded
  (each tp rank routes its own tokens); its shared experts gather them, and the replicated
  weights it applies to sharded tokens (router, expert-data-parallel experts) get their
  gradients summed over tp.
* ``replicate``: whole module on every rank; nothing to do.

MLA's RoPE key is shared by all heads, so with heads split its gradient is a partial sum on each
rank: ``Attention.shared_key_hook`` becomes an identity whose backward all-reduces over tp.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from fnmatch import translate

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from autoparallel.plan import ModuleRule, ShardingPlan
from autoparallel.runtime._fused_experts import is_fused_experts

__all__ = [
    "SelectKVHeads",
    "SumGradientOverGroup",
    "TensorParallel",
    "apply_tensor_parallel",
    "iter_module_names",
    "match_rules",
    "walk_modules",
]

logger = logging.getLogger(__name__)


def walk_modules(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """(FQN, module) of ``module`` and all its submodules ("" for the root), depth first.

    A plain walk over ``_modules``: ``named_modules`` costs ~5x more on a 3T model's 260k modules.
    """
    found: list[tuple[str, nn.Module]] = []
    stack: list[tuple[str, nn.Module]] = [("", module)]
    while stack:
        prefix, current = stack.pop()
        found.append((prefix, current))
        children = [
            (f"{prefix}.{key}" if prefix else key, child)
            for key, child in current._modules.items()
            if child is not None
        ]
        stack.extend(reversed(children))
    return found


def iter_module_names(module: nn.Module) -> list[str]:
    """FQNs of ``module`` and all its submodules, depth first (see ``walk_modules``)."""
    return [name for name, _ in walk_modules(module)]


_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)")


def match_rules(
    module: nn.Module, rules: Iterable[ModuleRule], *, names: list[str] | None = None
) -> dict[ModuleRule, list[str]]:
    """FQNs of ``module``'s submodules each rule's pattern matches (``fnmatch``, case-sensitive).

    Raises ``ValueError`` naming a module that two rules of different styles on one mesh axis match.
    When no pattern holds a digit or a ``?``/``[``, FQNs that differ only in layer or expert ids
    match alike, so each distinct shape of name is matched once (a 3T model has 260k modules).
    """
    rules = list(rules)
    compiled = [(rule, re.compile(translate(rule.pattern))) for rule in rules]
    matches: dict[ModuleRule, list[str]] = {rule: [] for rule in rules}
    cacheable = not any(ch.isdigit() or ch in "?[" for rule in rules for ch in rule.pattern)
    seen: dict[str, list[ModuleRule]] = {}
    for name in iter_module_names(module) if names is None else names:
        key = _INDEX.sub("#", name) if cacheable else name
        hits = seen.get(key)
        if hits is None:
            hits = [rule for rule, regex in compiled if regex.match(name)]
            styles = {(rule.mesh_axis, rule.style) for rule in hits}
            if len({axis for axis, _ in styles}) < len(styles):
                raise ValueError(
                    f"module {name!r} matches rules of different styles: {sorted(styles)}"
                )
            if cacheable:
                seen[key] = hits
        for rule in hits:
            matches[rule].append(name)
    return matches


def _is_moe_block(module: nn.Module) -> bool:
    """A block of routed experts: one with a dispatcher (the reference model), or a HuggingFace
    sparse block whose ``experts`` are per-expert modules or transformers 5's fused weights."""
    experts = getattr(module, "experts", None)
    if experts is None:
        return False
    return (
        hasattr(module, "dispatcher")
        or isinstance(experts, (nn.ModuleList, nn.ModuleDict))
        or is_fused_experts(experts)
    )


def _is_block(module: nn.Module) -> bool:
    """A block (attention, MLP, MoE) rather than a norm: it holds a Linear, routed experts, or
    submodules with weights of their own (a norm holds only its own weight)."""
    return (
        any(isinstance(child, nn.Linear) for child in module.modules())
        or _is_moe_block(module)
        or any(any(True for _ in child.parameters()) for child in module.children())
    )


def _style(
    module: nn.Module, rule: ModuleRule, *, name: str, sequence_parallel: bool
) -> ParallelStyle | None:
    """The DTensor style a colwise/rowwise rule, or a sequence rule on a norm, gives one module."""
    seq = Shard(1) if sequence_parallel else Replicate()
    if rule.style == "colwise":
        if name == "lm_head" or name.endswith(".lm_head"):
            return ColwiseParallel(input_layouts=seq, output_layouts=Replicate())
        return ColwiseParallel()
    if rule.style == "rowwise":
        if isinstance(module, nn.Embedding):
            return RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
        return RowwiseParallel(output_layouts=seq)
    if rule.style == "sequence" and not _is_block(module):
        return SequenceParallel()
    return None


def _as_sequence_shard(tensor: torch.Tensor, mesh: DeviceMesh) -> DTensor:
    return (
        tensor
        if isinstance(tensor, DTensor)
        else DTensor.from_local(tensor, mesh, [Shard(1)], run_check=False)
    )


def _on_hidden_states(transform):
    """A kwargs-aware forward pre-hook applying ``transform`` to the block's hidden states: its
    first positional input, or its ``hidden_states`` keyword (transformers 5 calls its attention
    and MLP blocks with keywords only)."""

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:
            return (transform(args[0]), *args[1:]), kwargs
        if "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": transform(kwargs["hidden_states"])}
        raise ValueError(
            f"{type(module).__name__} was called with no positional input and no 'hidden_states' "
            "keyword; sequence parallel cannot find its sequence-sharded input"
        )

    return hook


def _gather_sequence_hook(mesh: DeviceMesh):
    """Forward pre-hook: the hidden states, a sequence shard, become the whole (local) sequence."""
    return _on_hidden_states(
        lambda tensor: _as_sequence_shard(tensor, mesh).redistribute(mesh, [Replicate()]).to_local()
    )


def _local_shard_hook(mesh: DeviceMesh):
    """Forward pre-hook: the hidden states stay this rank's sequence shard, as a plain tensor."""
    return _on_hidden_states(lambda tensor: _as_sequence_shard(tensor, mesh).to_local())


class _SumOverGroup(torch.autograd.Function):
    """Identity forward; backward all-reduces (sums) the gradient over ``group``."""

    @staticmethod
    def forward(ctx, tensor, group):  # autograd API
        ctx.group = group
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _SumColumnsOverGroup(torch.autograd.Function):
    """Identity forward; backward all-reduces (sums) the gradient's last-dim columns from
    ``start`` on over ``group``, the others as they are."""

    @staticmethod
    def forward(ctx, tensor, group, start):  # autograd API
        ctx.group, ctx.start = group, start
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        shared = grad[..., ctx.start :].contiguous()
        dist.all_reduce(shared, group=ctx.group)
        return torch.cat((grad[..., : ctx.start], shared), dim=-1), None, None


def _is_huggingface_mla(module: nn.Module) -> bool:
    """A HuggingFace DeepSeek-V2/V3-style MLA attention (``modeling_deepseek_v3.py``): the
    latent and the RoPE key from one ``kv_a_proj_with_mqa``, the latent first."""
    return isinstance(getattr(module, "kv_a_proj_with_mqa", None), nn.Module) and isinstance(
        getattr(module, "kv_lora_rank", None), int
    )


def _sum_output_columns_hook(group, *, start: int):
    """Forward hook: the module's output, whose columns from ``start`` on get their gradient
    summed over ``group``."""

    def hook(_module: nn.Module, _args: tuple, output: torch.Tensor) -> torch.Tensor:
        local = output.to_local() if isinstance(output, DTensor) else output
        return _SumColumnsOverGroup.apply(local, group, start)

    return hook


class SumGradientOverGroup:
    """Callable ``tensor -> tensor``: identity whose backward sums the gradient over ``group``."""

    def __init__(self, group) -> None:  # a ProcessGroup
        self.group = group

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        return _SumOverGroup.apply(tensor, self.group)


@dataclass
class TensorParallel:
    """What ``apply_tensor_parallel`` did: parallelized FQNs and the weights whose gradients
    ``sync_gradients`` sums over tp (replicated weights applied to sequence-sharded tokens)."""

    tp_mesh: DeviceMesh
    parallelized: list[str]
    summed_parameters: list[tuple[nn.Module, str]] = field(default_factory=list)

    def sync_gradients(self) -> None:
        """Sum the gradients of ``summed_parameters`` over tp; call after backward. A parameter
        this rank's tokens did not reach (an expert none of them chose) joins with zeros, so
        every rank reduces the same tensors."""
        grads = []
        for owner, name in self.summed_parameters:
            parameter = owner.get_parameter(name)
            if not parameter.requires_grad:
                continue
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
            grad = parameter.grad
            grads.append(grad.to_local() if isinstance(grad, DTensor) else grad)
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.tp_mesh.get_group())
        for grad, piece in zip(grads, flat.split([g.numel() for g in grads])):
            grad.copy_(piece.view_as(grad))


class SelectKVHeads:
    """``(k, v) -> (k, v)`` keeping the KV heads ``[start, stop)`` this rank's query heads read,
    for tp a multiple of the KV heads (K/V projections whole on every rank, as Megatron-LM
    replicates them). Backward sums the whole K/V gradient over tp, since each rank fills
    only its heads' part."""

    def __init__(self, *, group, start: int, stop: int) -> None:  # a ProcessGroup
        self.group, self.start, self.stop = group, start, stop

    def __call__(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = _SumOverGroup.apply(k, self.group), _SumOverGroup.apply(v, self.group)
        return k[:, :, self.start : self.stop], v[:, :, self.start : self.stop]


def _replicated_kv_attention(module: nn.Module, matches: dict[ModuleRule, list[str]]) -> list[str]:
    """Attention modules whose K/V projections a rule keeps whole while heads are tp-split."""
    names = []
    for rule, matched in matches.items():
        if rule.style == "replicate" and rule.pattern.endswith(("k_proj", "v_proj")):
            names += [name.rpartition(".")[0] for name in matched]
    for name in sorted(set(names)):
        if not hasattr(module.get_submodule(name), "kv_heads_hook"):
            raise ValueError(
                f"module {name!r} ({type(module.get_submodule(name)).__name__}) keeps K/V heads whole under tp "
                "(tp > num_key_value_heads) but has no kv_heads_hook to pick its heads; use tp <= num_key_value_heads"
            )
    return sorted(set(names))


def _select_kv_heads(module: nn.Module, names: list[str], tp_mesh: DeviceMesh) -> None:
    tp, tp_rank = tp_mesh.size(), tp_mesh.get_local_rank()
    for name in names:
        attention = module.get_submodule(name)
        kv_heads = attention.attention.num_kv_heads
        if tp % kv_heads:
            raise ValueError(
                f"tp ({tp}) must be a multiple of num_key_value_heads ({kv_heads}) at {name!r}"
            )
        head = tp_rank // (tp // kv_heads)
        attention.kv_heads_hook = SelectKVHeads(
            group=tp_mesh.get_group(), start=head, stop=head + 1
        )


def _gather_tokens(module: nn.Module, mesh: DeviceMesh) -> None:
    """Hooks making a token-wise module that runs on this rank's sequence shard run tensor
    parallel on every rank's tokens: its input, ``[batch, tokens, hidden]`` or the flattened
    ``[tokens, hidden]`` an MoE block passes (Qwen2-MoE's shared expert), is gathered over tp
    along the tokens, and its output (the row-parallel projection's reduce-scatter: this rank's
    tokens, in the order gathered) gets the input's shape back."""
    flat: list[bool] = []

    def as_sequence(tensor: torch.Tensor) -> torch.Tensor:
        flat.append(tensor.dim() == 2)
        tensor = tensor.unsqueeze(0) if flat[-1] else tensor
        return _as_sequence_shard(tensor, mesh).redistribute(mesh, [Replicate()]).to_local()

    def restore(_module: nn.Module, _args: tuple, _kwargs: dict, output: torch.Tensor):
        return output.squeeze(0) if flat.pop() else output

    module.register_forward_pre_hook(_on_hidden_states(as_sequence), with_kwargs=True)
    module.register_forward_hook(restore, with_kwargs=True)


#: Names of an MoE block's shared-expert MLP (DeepSeek; Qwen2-MoE).
_SHARED_EXPERTS = ("shared_experts", "shared_expert")


def _sequence_blocks(
    module: nn.Module,
    plan: ShardingPlan,
    blocks: list[str],
    mesh: DeviceMesh,
    result: TensorParallel,
) -> None:
    """Gather/keep-sharded pre-hooks on blocks under sequence parallel; MoE blocks' replicated
    weights join ``result.summed_parameters``. An MoE block routes its own sequence shard; its
    tensor-parallel shared expert (``shared_experts``, DeepSeek; ``shared_expert``, Qwen2-MoE)
    gathers the whole sequence first, as a dense MLP does."""
    expert_parallel = plan.config.ep > 1 or plan.config.etp > 1
    for name in blocks:
        block = module.get_submodule(name)
        if not _is_moe_block(block):
            block.register_forward_pre_hook(_gather_sequence_hook(mesh), with_kwargs=True)
            continue
        block.register_forward_pre_hook(_local_shard_hook(mesh), with_kwargs=True)
        shared = [n for n in _SHARED_EXPERTS if isinstance(getattr(block, n, None), nn.Module)]
        for shared_name in shared:
            _gather_tokens(getattr(block, shared_name), mesh)
        for parameter_name, _ in block.named_parameters():
            if parameter_name.split(".", 1)[0] in shared:
                continue
            if expert_parallel and parameter_name.startswith("experts."):
                continue
            result.summed_parameters.append((block, parameter_name))


def _normalizes_whole_projection(attention: nn.Module, norm: str, projection: str) -> bool:
    """A query/key norm over the whole projection (every head's features at once, MiniMax-M2's
    ``q_norm`` of ``num_heads * head_dim``) rather than over each head (Qwen3's, ``head_dim``)."""
    weight = getattr(getattr(attention, norm), "weight", None)
    linear = getattr(attention, projection)
    return isinstance(weight, torch.Tensor) and weight.numel() == linear.weight.shape[0] > 0


class _SumOverGroupBothWays(torch.autograd.Function):
    """All-reduce (sum) over ``group`` forward, and the gradient likewise backward: a sum every
    rank's output depends on."""

    @staticmethod
    def forward(ctx, tensor, group):  # autograd API
        ctx.group = group
        total = tensor.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def _row_sharded(parameter: nn.Parameter, mesh: DeviceMesh, *, what: str) -> nn.Parameter:
    """``parameter`` (the same on every rank) as a DTensor parameter holding this tp rank's
    block of its first dimension, as a column-parallel projection holds its output rows."""
    rows = parameter.shape[0]
    if rows % mesh.size():
        raise ValueError(f"{what} ({rows}) must be divisible by tp ({mesh.size()})")
    local = parameter.detach().chunk(mesh.size())[mesh.get_local_rank()].clone()
    return nn.Parameter(
        DTensor.from_local(local, mesh, [Shard(0)], run_check=False),
        requires_grad=parameter.requires_grad,
    )


def _split_full_width_norm(norm: nn.Module, mesh: DeviceMesh) -> None:
    """An RMSNorm over a whole column-split projection (the features of every head): its weight
    is sharded like the projection's output, and its mean square is the sum over the tp ranks of
    their features' squares over the whole width (the statistic the unsplit norm takes)."""
    width = norm.weight.shape[0]
    norm.weight = _row_sharded(norm.weight, mesh, what="a query/key norm's width")
    eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)) or 1e-6)
    group = mesh.get_group()

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        dtype = hidden_states.dtype
        features = hidden_states.to(torch.float32)
        squares = _SumOverGroupBothWays.apply(features.pow(2).sum(-1, keepdim=True), group)
        normalized = features * torch.rsqrt(squares / width + eps)
        return norm.weight.to_local() * normalized.to(dtype)

    norm.forward = forward


def _split_attention_sinks(
    module: nn.Module, styles: dict[str, ParallelStyle], mesh: DeviceMesh
) -> None:
    """gpt-oss's learned attention sink per head (``sinks``, ``[heads]``) follows its heads over
    tp: the parameter becomes a DTensor sharded like the query projection's output rows, and
    each call of the attention reads this rank's heads' sinks as a plain tensor (the attention
    function concatenates them with its local scores); the gradient reaches the shard."""
    for name, attention in walk_modules(module):
        sinks = getattr(attention, "sinks", None)
        query = f"{name}.q_proj" if name else "q_proj"
        if not isinstance(sinks, nn.Parameter) or query not in styles:
            continue
        attention.sinks = _row_sharded(sinks, mesh, what=f"{name}.sinks (heads)")
        attention.register_forward_pre_hook(_local_sinks, with_kwargs=True)
        attention.register_forward_hook(_drop_local_sinks, with_kwargs=True)


def _local_sinks(module: nn.Module, args: tuple, kwargs: dict) -> None:
    # an instance attribute is found before the registered parameter (nn.Module.__getattr__)
    module.__dict__["sinks"] = module._parameters["sinks"].to_local()


def _drop_local_sinks(module: nn.Module, args: tuple, kwargs: dict, output):
    module.__dict__.pop("sinks", None)
    return output


def _positions_at_the_model(
    module: nn.Module, styles: dict[str, ParallelStyle], mesh: DeviceMesh
) -> None:
    """Sequence parallel for a model that derives its positions from the embedding's output
    (transformers: ``LlamaModel.forward`` numbers the tokens of ``inputs_embeds`` and runs its
    ``rotary_emb`` and causal mask on them before the layers): its embedding hands the whole
    sequence to the model, and the first layer takes this rank's part of it, so positions and
    mask cover every token (Megatron-LM sec. 4.2.2's scatter, moved past the model's own
    position code). The scatter's backward gathers the gradient, so the embedding's is whole. A
    later pipeline chunk (no embedding) gathers the shards its predecessor sent the same way."""
    for name, holder in walk_modules(module):
        embedding = f"{name}.embed_tokens" if name else "embed_tokens"
        layers = getattr(holder, "layers", None)
        if (
            not isinstance(getattr(holder, "rotary_emb", None), nn.Module)
            or not isinstance(layers, (nn.ModuleList, nn.ModuleDict))
            or not len(layers)
        ):
            continue
        if embedding in styles:
            styles[embedding] = RowwiseParallel(
                input_layouts=Replicate(), output_layouts=Replicate()
            )
        elif getattr(holder, "embed_tokens", False) is None:
            # a later pipeline chunk: the previous chunk's sequence shards, gathered
            holder.register_forward_pre_hook(_gather_inputs_embeds_hook(mesh), with_kwargs=True)
        else:
            continue
        first = layers[0] if isinstance(layers, nn.ModuleList) else next(iter(layers.values()))
        first.register_forward_pre_hook(
            _on_hidden_states(
                lambda tensor: (
                    DTensor.from_local(tensor, mesh, [Replicate()], run_check=False)
                    .redistribute(mesh, [Shard(1)])
                    .to_local()
                )
            ),
            with_kwargs=True,
        )


def _gather_inputs_embeds_hook(mesh: DeviceMesh):
    """Forward pre-hook of a backbone called with ``inputs_embeds``: this rank's sequence shard
    becomes the whole sequence."""

    def hook(_module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        shard = kwargs.get("inputs_embeds")
        if shard is None:
            return args, kwargs
        whole = _as_sequence_shard(shard, mesh).redistribute(mesh, [Replicate()]).to_local()
        return args, {**kwargs, "inputs_embeds": whole}

    return hook


def apply_tensor_parallel(
    module: nn.Module,
    *,
    plan: ShardingPlan,
    tp_mesh: DeviceMesh,
    matches: dict[ModuleRule, list[str]],
) -> TensorParallel:
    """Apply the plan's tp-axis colwise/rowwise/sequence rules to ``module`` in place.

    ``matches`` is ``match_rules``'s result on ``module``. MLA attention whose heads are split
    gets a ``shared_key_hook`` summing the RoPE key's gradient over tp; GQA attention with
    replicated K/V projections (tp > KV heads) gets a ``kv_heads_hook`` picking its KV head.
    """
    sequence_parallel = plan.config.sequence_parallel
    replicated_kv = _replicated_kv_attention(module, matches)
    styles: dict[str, ParallelStyle] = {}
    blocks: list[str] = []
    for rule, names in matches.items():
        if rule.mesh_axis != "tp":
            continue
        for name in names:
            submodule = module.get_submodule(name)
            style = _style(submodule, rule, name=name, sequence_parallel=sequence_parallel)
            if style is not None:
                styles[name] = style
            elif rule.style == "sequence":
                blocks.append(name)
    result = TensorParallel(tp_mesh=tp_mesh, parallelized=sorted(set(styles) | set(blocks)))
    group = tp_mesh.get_group()
    replicated = set(replicated_kv)
    full_width_norms: list[nn.Module] = []
    for name, submodule in walk_modules(module):
        attention = getattr(submodule, "attention", None)
        if hasattr(submodule, "shared_key_hook") and getattr(attention, "kind", None) == "mla":
            if f"{name}.kv_b_proj" in styles:
                submodule.shared_key_hook = SumGradientOverGroup(group)
        elif _is_huggingface_mla(submodule) and f"{name}.kv_b_proj" in styles:
            # the RoPE key, the last qk_rope_head_dim outputs of kv_a_proj_with_mqa, is shared
            # by every head: each rank's heads give part of its gradient
            submodule.kv_a_proj_with_mqa.register_forward_hook(
                _sum_output_columns_hook(group, start=int(submodule.kv_lora_rank))
            )
        # Per-head query/key norms (Qwen3) are whole on every rank but see only its heads: their
        # gradients are summed over tp, the key norm's only where the K/V heads are split (with
        # K/V whole, the kv-heads hook already sums the keys' gradient before the norm sees it).
        for norm, projection in (("q_norm", "q_proj"), ("k_norm", "k_proj")):
            if (
                isinstance(getattr(submodule, norm, None), nn.Module)
                and f"{name}.{projection}" in styles
                and not (norm == "k_norm" and name in replicated)
            ):
                if _normalizes_whole_projection(submodule, norm, projection):
                    full_width_norms.append(submodule.get_submodule(norm))
                else:
                    result.summed_parameters.append((submodule.get_submodule(norm), "weight"))
    if sequence_parallel:
        _positions_at_the_model(module, styles, tp_mesh)
    for name, style in styles.items():
        parallelize_module(module.get_submodule(name), tp_mesh, style)
    for norm in full_width_norms:
        _split_full_width_norm(norm, tp_mesh)
    _split_attention_sinks(module, styles, tp_mesh)
    _select_kv_heads(module, replicated_kv, tp_mesh)
    _sequence_blocks(module, plan, blocks, tp_mesh, result)
    logger.info("tensor parallel: %d modules over tp=%d", len(result.parallelized), tp_mesh.size())
    return result
