"""Host seconds of Megatron-core's MoE layer: its router, dropless alltoall token dispatcher and
combine, timed where the device work is negligible so that the wall time is the host's.

``cost_model._training_host`` prices the host side of a Megatron-core MoE layer from operator
counts (``data/framework_profiles.json`` ``host_ops``, counted from the code) times the host
seconds per eager operator; the counts leave out the Python around each operator. This runs the
code itself: a stack of ``--layers`` MoE layers built from megatron-core's own module spec (its
local, non-Transformer-Engine backend: ``SequentialMLP`` experts, one Python loop over the local
experts, which Transformer Engine's ``GroupedLinear`` replaces by one C++ call), on one device,
expert parallelism 1 (the alltoall dispatcher then permutes locally but keeps its per-layer
device-to-host sync of the token counts), at a vanishing size (``--hidden`` 128, ``--tokens``
256), forward and forward + backward, for each local expert count in ``--experts``. Per layer:
the median wall seconds of forward and of forward + backward (synchronized at the end of the
stack only), and their slope in the local expert count (the per-expert Python of
``SequentialMLP``) and intercept (router, dispatcher, combine: what a grouped-GEMM expert module
leaves). The baseline in the same run is one eager ``torch.add`` launch (``--layers`` x 64 of
them), the host's speed.

Needs megatron-core (``pip install megatron-core``, or its source on ``PYTHONPATH``) and torch;
runs on CUDA, else on the CPU (gloo).

    python benchmarks/megatron_moe_host_check.py [--experts 4 8 16 32] [--output PATH]
    python benchmarks/megatron_moe_host_check.py --append benchmarks/results/megatron_moe_host_h200.json

``benchmarks/results/megatron_moe_host_h200.json`` holds two runs on H200 machines (the second a
repeat, ``--append``); its ``fit`` is over both and prices ``HostOpCounts.moe_routing_op_host_s``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _init() -> torch.device:
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=1, expert_model_parallel_size=1
    )
    if cuda:
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(0)
    return torch.device("cuda" if cuda else "cpu")


def _layers(*, experts: int, hidden: int, count: int, device: torch.device):
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.transformer.moe import moe_utils

    # megatron-core 0.16 reads this Transformer Engine symbol in its router GEMM without
    # defining it where Transformer Engine is absent: None selects its torch path.
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=count,
        hidden_size=hidden,
        num_attention_heads=4,
        num_moe_experts=experts,
        moe_router_topk=min(8, experts),
        moe_ffn_hidden_size=hidden,
        moe_token_dispatcher_type="alltoall",
        moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=1e-3,
        moe_grouped_gemm=False,
        add_bias_linear=False,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        bf16=device.type == "cuda",
        params_dtype=torch.bfloat16 if device.type == "cuda" else torch.float32,
        use_cpu_initialization=device.type != "cuda",
    )
    spec = get_moe_module_spec(use_te=False, num_experts=experts, moe_grouped_gemm=False)
    layers = torch.nn.ModuleList(
        build_module(spec, config=config, layer_number=i + 1) for i in range(count)
    )
    return layers.to(device), config.params_dtype


def _timed(fn, *, device: torch.device, repeats: int) -> float:
    samples = []
    for _ in range(repeats + 2):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples[2:])


def _per_layer(layers, x: torch.Tensor, *, repeats: int) -> dict[str, float]:
    """Median wall seconds per layer of the stack's forward and forward + backward."""

    def forward(grad: bool) -> torch.Tensor:
        h = x.detach().requires_grad_(grad)
        for layer in layers:
            h = layer(h)[0]
        return h

    def forward_only() -> None:
        with torch.no_grad():
            forward(False)

    def forward_backward() -> None:
        forward(True).float().sum().backward()
        layers.zero_grad(set_to_none=True)

    return {
        "forward_s": _timed(forward_only, device=x.device, repeats=repeats) / len(layers),
        "forward_backward_s": _timed(forward_backward, device=x.device, repeats=repeats)
        / len(layers),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument(
        "--append", type=Path, default=None, help="add this run to a saved result and refit"
    )
    args = parser.parse_args()
    device = _init()
    a, b = torch.ones(1, device=device), torch.ones(1, device=device)
    launches = args.layers * 64

    def eager_adds() -> None:
        for _ in range(launches):
            torch.add(a, b)

    op_s = _timed(eager_adds, device=device, repeats=args.repeats) / launches
    rows = []
    for experts in args.experts:
        layers, dtype = _layers(
            experts=experts, hidden=args.hidden, count=args.layers, device=device
        )
        x = torch.randn(args.tokens, 1, args.hidden, device=device, dtype=dtype)
        row = {"local_experts": experts, **_per_layer(layers, x, repeats=args.repeats)}
        rows.append(row)
        print(
            f"{experts:3d} local experts: forward {row['forward_s'] * 1e3:6.3f} ms, forward + "
            f"backward {row['forward_backward_s'] * 1e3:6.3f} ms per MoE layer "
            f"({row['forward_backward_s'] / op_s:.0f} eager op launches of {op_s * 1e6:.1f} us)",
            flush=True,
        )
    fit = fit_runs([rows])
    for key, line in fit.items():
        print(
            f"{key}: {line['intercept_s'] * 1e3:.3f} ms + {line['per_local_expert_s'] * 1e6:.1f} "
            f"us per local expert (intercept = {line['intercept_s'] / op_s:.0f} eager op launches)"
        )
    import megatron.core

    report = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "megatron_core": getattr(megatron.core, "__version__", "unknown"),
        "method": __doc__.strip().splitlines()[0],
        "hidden": args.hidden,
        "tokens": args.tokens,
        "layers": args.layers,
        "eager_op_s": op_s,
        "rows": rows,
        "fit": fit,
    }
    if args.append is not None:  # a repeat run of the same settings: refit over all runs
        saved = json.loads(args.append.read_text())
        saved.setdefault("repeat_runs", []).append(rows)
        saved["fit"] = fit_runs([saved["rows"], *saved["repeat_runs"]])
        args.append.write_text(json.dumps(saved, indent=1) + "\n")
        print(f"added a run to {args.append}; fit over {1 + len(saved['repeat_runs'])} runs")
    elif args.output is not None:
        args.output.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.output}")
    dist.destroy_process_group()


def fit_runs(runs: list[list[dict]]) -> dict:
    """Intercept and slope in the local expert count of each timing, fitted to the geometric mean
    of the runs at each expert count (host timings on a shared machine vary by 10-30% between
    runs at the same count)."""
    import numpy as np

    experts = np.array([r["local_experts"] for r in runs[0]], dtype=float)
    fit = {}
    for key in ("forward_s", "forward_backward_s"):
        times = np.exp(np.mean(np.log([[r[key] for r in run] for run in runs]), axis=0))
        slope, intercept = np.polyfit(experts, times, 1)
        fit[key] = {"per_local_expert_s": float(slope), "intercept_s": float(intercept)}
    return fit


if __name__ == "__main__":
    main()
