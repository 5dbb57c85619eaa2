"""Probe one device (matmul FLOP/s by dtype, memory copy bandwidth) and save the report by device name.

    python benchmarks/probe_device.py                 # the accelerator torch sees, else the CPU
    python benchmarks/probe_device.py --preset dgx-h200 --dims 4096 8192

Runs ``topology.probe`` as a one-rank job (no torchrun needed) once per matmul size, prints each
measured rate with its ratio to the preset's datasheet peak (the baseline), and writes
``benchmarks/results/probe_<device>.json`` (every run's ``ProbeReport``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

from autoparallel.runtime import free_port
from topology import ProbeSettings, get_preset, list_presets, probe

RESULTS = Path(__file__).resolve().parent / "results"
PRESET_BY_NAME = (
    ("H200", "dgx-h200"),
    ("H100", "dgx-h100"),
    ("H800", "hgx-h800"),
    ("A100", "dgx-a100"),
    ("B200", "dgx-b200"),
    ("GB200", "gb200-nvl72"),
    ("MI300X", "mi300x"),
)


def _preset_for(device_name: str) -> str:
    for fragment, preset in PRESET_BY_NAME:
        if fragment in device_name:
            return preset
    return "cpu-loopback"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--preset",
        choices=list_presets(),
        default=None,
        help="peaks to compare with (default: by device name)",
    )
    parser.add_argument(
        "--dims",
        type=int,
        nargs="+",
        default=None,
        help="matmul sizes (default 2048 4096 8192, CPU 256 512)",
    )
    parser.add_argument("--copy-bytes", type=int, default=None)
    args = parser.parse_args()
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
    )
    from topology.devices import device_and_backend, device_name

    device, _backend = device_and_backend()
    name = device_name(device)
    base = get_preset(args.preset or _preset_for(name))
    dims = args.dims or ((256, 512) if device.type == "cpu" else (2048, 4096, 8192))
    reports = []
    print(f"device {name}; peaks from preset {base.name}")
    for dim in dims:
        settings = ProbeSettings(
            matmul_dim=dim, copy_bytes=args.copy_bytes, run_name=f"{device.type}-{dim}"
        )
        report = probe(settings=settings, base=base)
        reports.append(json.loads(report.model_dump_json()))
        for row in report.compute:
            dtype = row.kind.removeprefix("matmul_")
            peak = (
                base.device.peak_flops.get(dtype)
                if row.kind.startswith("matmul_")
                else base.device.memory_bandwidth_bytes_per_s
            )
            unit, scale = ("TFLOP/s", 1e12) if row.kind.startswith("matmul_") else ("GB/s", 1e9)
            ratio = f"{row.rate_per_s / peak:.3f} of peak" if peak else "no preset peak"
            print(
                f"  {row.kind:12s} dim {dim:6d}: {row.rate_per_s / scale:10.2f} {unit} ({ratio}), spread {row.spread:.2f}"
            )
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"probe_{re.sub(r'[^A-Za-z0-9]+', '-', name).strip('-').lower()}.json"
    path.write_text(
        json.dumps({"device": name, "preset": base.name, "reports": reports}, indent=1) + "\n"
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
