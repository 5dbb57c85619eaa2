"""Operator coverage: which ATen operators a model dispatches, and how a device backend runs each.

The reference module is built for a small-width copy of the model's spec (same attention kind,
dense and MoE layers, shared experts, router scoring: the same operator set at toy sizes) and
run on the CPU under a ``TorchDispatchMode`` through four paths: a training step (forward,
backward, a multi-tensor AdamW update as on accelerators), a prefill pass and decode steps
with the KV cache. Every operator
overload seen there is classified for the target device's dispatch key with the dispatcher's own
registration tables (``torch._C._dispatch_has_kernel_for_dispatch_key`` and friends):

* ``native`` — a kernel is registered for the key itself (CUDA, XPU, PrivateUse1, ...);
* ``composite`` — no kernel for the key, but the operator decomposes into operators that run: a
  ``CompositeImplicitAutograd`` / ``CompositeExplicitAutograd`` kernel or a decomposition in
  ``torch._decomp.decomposition_table``, whose operators (traced on a recorded call) are all
  native or composite themselves;
* ``fallback`` — neither, but the backend registered a boxed fallback (out-of-tree backends
  such as torch_npu and torch_musa route unsupported operators to the CPU this way);
* ``missing`` — none of these: the model fails on this operator.

Out-of-tree backends (MUSA, Ascend NPU, ...) plug in through ``PrivateUse1``; the device name is
whatever ``torch.utils.rename_privateuse1_backend`` set. FLOPs are counted per call from shapes:
matrix products, attention and convolutions with ``torch.utils.flop_counter``'s formulas
(2·M·N·K per product), element-wise operators (``_foreach_`` lists included) one FLOP per
output element, reductions one per input element; bytes are the tensor bytes each call reads and
writes (views move none, factories only write their output). Shares
are of the small-width copy's totals over every path, so they sum to 1 by construction.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from cost_model import ModelSpec

logger = logging.getLogger(__name__)

Status = Literal["native", "composite", "fallback", "missing"]
STATUSES: tuple[str, ...] = ("native", "composite", "fallback", "missing")
PHASES: tuple[str, ...] = ("training", "prefill", "decode")
#: In-tree dispatch keys by torch device type; out-of-tree devices use PrivateUse1.
IN_TREE_KEYS = {
    "cpu": "CPU",
    "cuda": "CUDA",
    "xpu": "XPU",
    "mps": "MPS",
    "hpu": "HPU",
    "mtia": "MTIA",
}
#: Device names the command accepts besides the in-tree ones (registered through PrivateUse1).
OUT_OF_TREE_DEVICES = ("musa", "npu", "privateuseone")
#: Kernels the dispatcher runs for any backend by calling other operators. (Structured kernels'
#: ``CompositeExplicitAutogradNonFunctional`` entries need the backend's own out= kernel: not here.)
_COMPOSITE_KEYS = ("CompositeImplicitAutograd", "CompositeExplicitAutograd")
#: Reductions and normalizations priced at one FLOP per input element.
#: Operators returning an alias of their input (no data moved) that the schema does not mark a view.
_ALIASING = frozenset({"_unsafe_view", "alias", "lift_fresh", "detach", "_reshape_alias"})
#: Operators that only write their output.
_FACTORIES = frozenset(
    {"empty", "empty_strided", "zeros", "ones", "full", "arange", "scalar_tensor"}
)
_REDUCTIONS = frozenset(
    {
        "sum",
        "mean",
        "amax",
        "amin",
        "max",
        "min",
        "_softmax",
        "_log_softmax",
        "_softmax_backward_data",
        "_log_softmax_backward_data",
        "topk",
        "sort",
        "argmax",
        "norm",
        "linalg_vector_norm",
        "var_mean",
        "cumsum",
        "nll_loss_forward",
        "nll_loss_backward",
        "_fused_rms_norm",
        "_fused_rms_norm_backward",
    }
)


class OperatorCoverage(BaseModel):
    """One operator overload (``aten::mm``, ``aten::add.Tensor``): how the backend runs it and
    what it costs in the model (calls, FLOPs, bytes over every path)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    status: Status
    reason: str
    phases: tuple[str, ...]
    calls: int
    flops: float
    bytes: float
    flop_share: float
    byte_share: float


class CoverageReport(BaseModel):
    """Operators of a model on one device backend, most FLOPs first."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_name: str
    device: str
    dispatch_key: str
    has_fallback: bool
    traced_spec: dict
    operators: tuple[OperatorCoverage, ...]

    def share_by_status(
        self, *, measure: Literal["flop", "byte", "count"] = "flop"
    ) -> dict[str, float]:
        """Share of the model's FLOPs (``flop``), bytes (``byte``) or operators (``count``) per
        status."""
        shares = dict.fromkeys(STATUSES, 0.0)
        for operator in self.operators:
            value = {
                "flop": operator.flop_share,
                "byte": operator.byte_share,
                "count": 1.0 / len(self.operators),
            }
            shares[operator.status] += value[measure]
        return shares

    def by_status(self, status: str) -> list[str]:
        return [operator.name for operator in self.operators if operator.status == status]

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.model_dump_json(indent=1) + "\n")
        return path


# ---------------------------------------------------------------------------- devices
def dispatch_key_for(device: str) -> str:
    """The dispatch key whose kernels run on ``device``; raises if the device is not present."""
    import torch

    privateuse1_name = torch._C._get_privateuse1_backend_name()
    if device in (privateuse1_name, "privateuseone"):
        if not _privateuse1_registered():
            raise ValueError(
                f"device ({device!r}) is not present: no ATen kernel is registered for PrivateUse1 "
                f"(import the backend's extension, e.g. torch_musa or torch_npu, first)"
            )
        return "PrivateUse1"
    if device in OUT_OF_TREE_DEVICES:
        raise ValueError(
            f"device ({device!r}) is not present: the PrivateUse1 backend is named "
            f"{privateuse1_name!r} "
            f"(import the backend's extension, e.g. torch_{device}, first)"
        )
    if device not in IN_TREE_KEYS:
        valid = sorted({*IN_TREE_KEYS, *OUT_OF_TREE_DEVICES, privateuse1_name})
        raise ValueError(f"device ({device!r}) must be one of {valid}")
    if device != "cpu" and not _in_tree_available(device):
        raise ValueError(
            f"device ({device!r}) is not present: torch.{device}.is_available() is False "
            "on this machine"
        )
    return IN_TREE_KEYS[device]


def _privateuse1_registered() -> bool:
    import torch

    return any(
        name.startswith("aten::")
        for name in torch._C._dispatch_get_registrations_for_dispatch_key("PrivateUse1")
    )


def _in_tree_available(device: str) -> bool:
    import torch

    module = getattr(torch, device, None)
    return bool(module is not None and hasattr(module, "is_available") and module.is_available())


def local_device() -> str:
    """The accelerator's device type on this machine, else ``cpu``."""
    import torch

    accelerator = torch.accelerator.current_accelerator(check_available=True)
    return "cpu" if accelerator is None else accelerator.type


# ---------------------------------------------------------------------------- classification
_ORDER = {status: index for index, status in enumerate(STATUSES)}
DECOMPOSITION = "torch._decomp decomposition"
_MAX_DEPTH = 4


class _Classifier:
    """Classifies operators for one dispatch key; a decomposition counts as ``composite`` only if
    every operator it runs (traced on the recorded call) is itself native or composite."""

    def __init__(self, *, dispatch_key: str, samples: dict) -> None:
        import torch
        from torch._decomp import decomposition_table

        self.dispatch_key = dispatch_key
        self.samples = samples
        self.decompositions = decomposition_table
        self.has_fallback = torch._C._dispatch_has_backend_fallback(
            getattr(torch._C.DispatchKey, dispatch_key)
        )
        self.known: dict = {}

    def __call__(self, func, *, depth: int = 0) -> tuple[str, str]:
        if func not in self.known:
            self.known[func] = (
                "missing",
                "decomposes into itself",
            )  # a cycle guard while resolving
            self.known[func] = self._resolve(func, depth)
        return self.known[func]

    def _resolve(self, func, depth: int) -> tuple[str, str]:
        import torch

        key = self.dispatch_key
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), key):
            return "native", f"kernel registered for {key}"
        if func.namespace == "prims":  # eager prims run ATen outside what a trace can see
            return "missing", f"prims operator with no {key} kernel"
        blocked = ""
        for route in self._routes(func):
            parts = self._traced(func, route) if depth < _MAX_DEPTH else None
            if parts is None:  # not traceable here: a composite kernel still runs on any backend
                if route != DECOMPOSITION:
                    return "composite", f"{route} kernel (its operators not traced)"
                continue
            statuses = {part: self(part, depth=depth + 1)[0] for part in parts}
            worst = max(statuses.values(), key=_ORDER.__getitem__, default="native")
            if _ORDER[worst] <= _ORDER["composite"]:
                names = ", ".join(sorted(part.name() for part in parts)) or "no other operator"
                return "composite", f"{route} into {names}"
            needs = sorted(
                f"{p.name()} ({status})" for p, status in statuses.items() if status == worst
            )
            blocked += f"; its {route} needs {', '.join(needs)}"
        if self.has_fallback:
            return "fallback", f"boxed fallback registered for {key} (runs elsewhere){blocked}"
        return "missing", f"no {key} kernel, no runnable composite, no fallback{blocked}"

    def _routes(self, func) -> list[str]:
        """Ways ``func`` can run without a kernel of its own: composite kernels, a decomposition."""
        import torch

        has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
        routes = [key for key in _COMPOSITE_KEYS if has_kernel(func.name(), key)]
        return routes + ([DECOMPOSITION] if func in self.decompositions else [])

    def _traced(self, func, route: str) -> set | None:
        """Operators ``route`` runs for the recorded call of ``func`` (None: it cannot run here)."""
        import torch

        if func not in self.samples:
            return None
        args, kwargs = _copied(self.samples[func])
        recorder = _recorder(namespaces=("aten", "prims"))
        try:
            with recorder:
                if route == DECOMPOSITION:
                    self.decompositions[func](*args, **kwargs)
                else:  # run that kernel itself, whatever kernel the CPU would pick
                    keys = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, route))
                    func.redispatch(keys, *args, **kwargs)
        except Exception as error:  # a route that cannot run is not usable
            logger.info("%s of %s did not run: %s", route, func.name(), error)
            return None
        self.samples.update({k: v for k, v in recorder.samples.items() if k not in self.samples})
        return set(recorder.tallies)


# ---------------------------------------------------------------------------- recording
@dataclass
class _Tally:
    calls: int = 0
    flops: float = 0.0
    bytes: float = 0.0
    phases: set[str] = field(default_factory=set)


def _tensor_bytes(values) -> float:
    import torch
    from torch.utils._pytree import tree_leaves

    return float(
        sum(
            t.numel() * t.element_size() for t in tree_leaves(values) if isinstance(t, torch.Tensor)
        )
    )


def _numel(values) -> int:
    import torch
    from torch.utils._pytree import tree_leaves

    return sum(
        t.numel()
        for t in tree_leaves(values)
        if isinstance(t, torch.Tensor) and t.is_floating_point()
    )


def count_flops(func, args, kwargs, out) -> float:
    """FLOPs of one call (module docstring)."""
    import torch
    from torch.utils.flop_counter import flop_registry

    packet = func._overloadpacket
    if packet in flop_registry:
        return float(flop_registry[packet](*args, **kwargs, out_val=out))
    if _aliases(func):
        return 0.0
    if torch.Tag.pointwise in func.tags:
        return float(_numel(out))
    if packet.__name__.startswith("_foreach_"):  # element-wise over a list of tensors
        return float(_numel(args[0]))
    if packet.__name__ in _REDUCTIONS:
        return float(max((_numel(arg) for arg in args), default=0))
    return 0.0


def count_bytes(func, args, kwargs, out) -> float:
    """Tensor bytes one call reads and writes: none for a view, only the output for a factory."""
    if _aliases(func):
        return 0.0
    name = func._overloadpacket.__name__
    if name in _FACTORIES or name.endswith("_like") or name.startswith("new_"):
        return _tensor_bytes(out)
    return _tensor_bytes((args, kwargs)) + _tensor_bytes(out)


def _aliases(func) -> bool:
    return func.is_view or func._overloadpacket.__name__ in _ALIASING


def _copied(values):
    import torch
    from torch.utils._pytree import tree_map

    return tree_map(lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v, values)


def _recorder(*, namespaces: tuple[str, ...] = ("aten",)):
    """A dispatch mode tallying the operators of ``namespaces`` (the model's: ATen; inside a
    decomposition also ``prims``, which a backend must run too)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.namespaces = namespaces
            self.phase = "training"
            self.tallies: dict = {}
            self.samples: dict = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if func.namespace not in self.namespaces:  # profiler markers are not operators
                return out
            if func not in self.samples:  # one call kept (copied) to trace its decomposition later
                self.samples[func] = _copied((args, kwargs))
            tally = self.tallies.setdefault(func, _Tally())
            tally.calls += 1
            tally.phases.add(self.phase)
            tally.flops += count_flops(func, args, kwargs, out)
            tally.bytes += count_bytes(func, args, kwargs, out)
            return out

    return Recorder()


# ---------------------------------------------------------------------------- the model
def small_width_spec(spec: ModelSpec) -> ModelSpec:
    """A toy-size copy of ``spec`` with its operator set: same attention kind (MLA, GQA; MHA runs
    as GQA with one query head per KV head), one dense layer if it has leading dense layers, one
    MoE layer with 8 experts (top-k at most 4), its shared experts, gates and tied embeddings."""
    hidden, heads = 64, 4
    attention = spec.attention
    if attention.kind == "mla":
        head = hidden // heads
        attention = attention.model_copy(
            update={
                "num_heads": heads,
                "num_kv_heads": heads,
                "head_dim": head + head // 2,
                "q_lora_rank": hidden // 2 if attention.q_lora_rank else 0,
                "kv_lora_rank": hidden // 4,
                "qk_nope_head_dim": head,
                "qk_rope_head_dim": head // 2,
                "v_head_dim": head,
            }
        )
    else:
        kv_heads = heads if attention.num_kv_heads == attention.num_heads else heads // 2
        attention = attention.model_copy(
            update={"num_heads": heads, "num_kv_heads": kv_heads, "head_dim": hidden // heads}
        )
    update = {
        "name": f"{spec.name}-small-width",
        "hidden_size": hidden,
        "vocab_size": 256,
        "ffn_hidden_size": 2 * hidden,
        "attention": attention,
        "max_context_tokens": 256,
        "num_layers": 1,
    }
    if spec.moe is not None:
        moe = spec.moe
        dense = min(1, moe.num_dense_layers)
        update["moe"] = moe.model_copy(
            update={
                "num_routed_experts": 8,
                "top_k": min(moe.top_k, 4),
                "expert_ffn_hidden_size": hidden // 2,
                "num_dense_layers": dense,
                "shared_expert_ffn_hidden_size": hidden // 2
                if moe.shared_expert_ffn_hidden_size
                else None,
            }
        )
        update["num_layers"] = dense + 1
    return spec.model_copy(update=update)


def router_scoring(model: str | Path | ModelSpec) -> str:
    """``sigmoid`` when the model's config says ``scoring_func: sigmoid`` (DeepSeek-V3), else
    ``softmax``."""
    from autoparallel._catalog import catalog_config, list_models

    if isinstance(model, ModelSpec):
        return "softmax"
    text = str(model)
    if text in list_models():
        data = catalog_config(text)
    else:
        path = Path(text)
        path = path / "config.json" if path.is_dir() else path
        data = json.loads(path.read_text()) if path.exists() else {}
    return "sigmoid" if data.get("scoring_func") == "sigmoid" else "softmax"


def _run_paths(module, recorder, *, tokens: int, seed: int) -> None:
    import torch

    from autoparallel.runtime import KVCache

    generator = torch.Generator().manual_seed(seed)
    vocab = module.spec.vocab_size
    ids = torch.randint(vocab, (2, tokens), generator=generator)
    # foreach: the multi-tensor kernels AdamW picks on accelerators (cuda, xpu, PrivateUse1)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3, foreach=True)
    with recorder:
        recorder.phase = "training"
        logits = module(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            recorder.phase = "prefill"
            cache = KVCache(capacity_tokens=tokens + 2)
            next_ids = module(ids, cache)[:, -1:].argmax(dim=-1)
            recorder.phase = "decode"
            for _ in range(2):
                next_ids = module(next_ids, cache)[:, -1:].argmax(dim=-1)


def operator_coverage(
    model: ModelSpec | str | Path,
    *,
    device: str = "cpu",
    scoring: Literal["softmax", "sigmoid"] | None = None,
    tokens: int = 16,
    seed: int = 0,
) -> CoverageReport:
    """Record the operators of ``model`` 's reference module and classify them for ``device``.

    ``model``: a ``ModelSpec``, a catalog name or a HuggingFace ``config.json`` path. ``device``:
    a torch device type present on this machine (``cpu``, ``cuda``, ``xpu``, ...) or the name of
    the PrivateUse1 backend (``musa``, ``npu``, or whatever ``rename_privateuse1_backend`` set).
    The module runs on the CPU (the target backend need not run it: the dispatcher's tables say
    how it would); ``tokens`` is the training/prefill sequence length. ``scoring`` is the
    router's (default: ``sigmoid`` where the config says ``scoring_func: sigmoid``, else
    ``softmax``; a ``ModelSpec`` carries no scoring). Nothing is mutated.

    Raises:
        ValueError: the device is not present, or the model is outside the reference family.
    """
    from autoparallel._catalog import get_model

    dispatch_key = dispatch_key_for(device)
    spec = model if isinstance(model, ModelSpec) else get_model(model)
    small = small_width_spec(spec)
    scoring = scoring or router_scoring(model)
    recorder = _trace(small, scoring=scoring, tokens=tokens, seed=seed)
    return _report(
        spec=spec, small=small, device=device, dispatch_key=dispatch_key, recorder=recorder
    )


def _trace(small: ModelSpec, *, scoring: str, tokens: int, seed: int) -> dict:
    import torch

    from autoparallel.runtime import ReferenceMoETransformer

    torch.manual_seed(seed)
    module = ReferenceMoETransformer(small, router_scoring=scoring)
    module.init_weights(seed=seed)
    recorder = _recorder()
    _run_paths(module, recorder, tokens=tokens, seed=seed)
    return recorder


def _report(
    *, spec: ModelSpec, small: ModelSpec, device: str, dispatch_key: str, recorder
) -> CoverageReport:
    tallies = recorder.tallies
    classify = _Classifier(dispatch_key=dispatch_key, samples=recorder.samples)
    total_flops = sum(t.flops for t in tallies.values())
    total_bytes = sum(t.bytes for t in tallies.values())
    rows = []
    for func, tally in tallies.items():
        status, reason = classify(func)
        rows.append(
            OperatorCoverage(
                name=func.name(),
                status=status,
                reason=reason,
                phases=tuple(p for p in PHASES if p in tally.phases),
                calls=tally.calls,
                flops=tally.flops,
                bytes=tally.bytes,
                flop_share=tally.flops / total_flops,
                byte_share=tally.bytes / total_bytes,
            )
        )
    rows.sort(key=lambda row: (-row.flop_share, -row.byte_share, row.name))
    return CoverageReport(
        model_name=spec.name,
        device=device,
        dispatch_key=dispatch_key,
        has_fallback=classify.has_fallback,
        traced_spec=small.model_dump(mode="json"),
        operators=tuple(rows),
    )
