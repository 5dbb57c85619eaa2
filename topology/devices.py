"""The device this process measures, on any torch backend (CUDA, MUSA, NPU, XPU, CPU): which
device and process-group backend, binding to ``LOCAL_RANK``, synchronizing, its name and memory.

One module shared by the cluster probe (``topology.probe``) and the operator profilers
(``profilers``). torch is imported inside each function, so ``import topology`` stays torch-free.

``torch.accelerator.current_accelerator()`` is ``None`` on a CPU-only machine; the device module
(``torch.get_device_module``) then is ``torch.cpu``, whose ``synchronize`` is a no-op. Kernels on
an accelerator run asynchronously, so every timed region is bracketed by ``synchronize_device``.
"""

from __future__ import annotations

import os
import platform
from typing import Any

__all__ = [
    "bind_local_device",
    "current_device",
    "device_and_backend",
    "device_memory_bytes",
    "device_name",
    "synchronize_device",
]


def current_device() -> Any:
    """The current accelerator device (cuda:0, npu:1, ...) or ``cpu`` (a ``torch.device``)."""
    import torch

    accelerator = torch.accelerator.current_accelerator() if hasattr(torch, "accelerator") else None
    if accelerator is None:
        return torch.device("cpu")
    return torch.device(accelerator.type, torch.accelerator.current_device_index())


def device_and_backend() -> tuple[Any, str]:
    """The device this rank measures and the default process-group backend for its type."""
    import torch.distributed as dist

    device = current_device()
    return device, dist.get_default_backend_for_device(device.type)


def bind_local_device() -> None:
    """Under torchrun, put this process on accelerator ``LOCAL_RANK`` (no-op on the CPU)."""
    import torch

    if hasattr(torch, "accelerator") and torch.accelerator.current_accelerator() is not None:
        torch.accelerator.set_device_index(int(os.environ.get("LOCAL_RANK", "0")))


def synchronize_device(device: Any) -> None:
    """Wait for the kernels queued on ``device`` where its module can (no-op on the CPU)."""
    import torch

    if device.type == "cpu":
        return
    sync = getattr(torch.get_device_module(device.type), "synchronize", None)
    if sync is not None:
        sync(device)


def device_name(device: Any) -> str:
    """The accelerator's product name, else the CPU model."""
    import torch

    if device.type != "cpu":
        module = torch.get_device_module(device.type)
        getter = getattr(module, "get_device_name", None)
        return str(getter(device)) if getter is not None else device.type
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def device_memory_bytes(device: Any, *, ranks_per_host: int = 1) -> float:
    """Memory of one device; on the CPU the host's physical memory shared by ``ranks_per_host`` ranks."""
    import torch

    if device.type == "cpu":
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) / max(
            ranks_per_host, 1
        )
    module = torch.get_device_module(device.type)
    if hasattr(module, "get_device_properties"):
        return float(module.get_device_properties(device).total_memory)
    return float(module.mem_get_info(device)[1])
