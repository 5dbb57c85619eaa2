"""An operator table faster than the roofline of the work it states is not imported."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from topology import get_preset


def _decode_attention_table(folder: Path, *, efficiency: float) -> None:
    """A100 decode-attention rows (8 query heads on 1 KV head, bf16 cache) at ``efficiency`` of
    the importer's roofline: the score and value FLOPs at the bf16 peak, the cache read at HBM."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    hardware = get_preset("dgx-a100").device
    rows = []
    for batch in (1, 4):
        for length in (64, 256, 1024, 4096):
            ideal = max(
                batch * length * 4.0 * 8 * 128 / hardware.peak_flops_for("bf16"),
                batch * length * 1 * 2.0 * 128 * 2.0 / hardware.memory_bandwidth_bytes_per_s,
            )
            rows.append(
                {
                    "batch_size": batch,
                    "isl": length - 1,
                    "step": 1,
                    "num_heads": 8,
                    "num_key_value_heads": 1,
                    "head_dim": 128,
                    "window_size": 0,
                    "beam_width": 1,
                    "attn_dtype": "bfloat16",
                    "kv_cache_dtype": "bfloat16",
                    "kernel_source": "torch_flow",
                    "latency": ideal / efficiency * 1e3,
                }
            )
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), folder / "generation_attention_perf.parquet")


def test_a_decode_attention_table_faster_than_its_roofline_is_passed_over(tmp_path: Path) -> None:
    from autoparallel._kernel_import import import_aiconfigurator

    engine = tmp_path / "aiconfigurator_core" / "systems" / "data" / "a100_sxm" / "attention"
    # the newest table reads the stated cache at 1.5x the HBM bandwidth: it timed other work
    _decode_attention_table(engine / "trtllm" / "2.0.0", efficiency=1.5)
    _decode_attention_table(engine / "trtllm" / "1.0.0", efficiency=0.6)
    (curve,) = import_aiconfigurator(tmp_path, version="test")["decode_attention"]
    assert (curve["engine"], curve["engine_version"]) == ("trtllm", "1.0.0")
    for row in curve["efficiency_by_group_units"]["8"].values():
        np.testing.assert_allclose(row[:7], 0.6, rtol=1e-2)  # 64 .. 4096 keys, measured


def test_no_table_beyond_its_roofline_leaves_no_curve(tmp_path: Path) -> None:
    from autoparallel._kernel_import import import_aiconfigurator

    engine = tmp_path / "aiconfigurator_core" / "systems" / "data" / "a100_sxm" / "attention"
    _decode_attention_table(engine / "trtllm" / "1.0.0", efficiency=1.5)
    assert import_aiconfigurator(tmp_path, version="test")["decode_attention"] == []


def test_no_shipped_decode_attention_curve_sits_at_the_roofline() -> None:
    """Every imported decode-attention table reads its cache below the HBM bandwidth (0.91-0.96x
    at best); the one that read it faster (TensorRT-LLM 1.0.0 on A100, clipped at 1.0 over 156
    points) is not shipped."""
    from cost_model._kernel_curves import kernel_curves

    curves = kernel_curves()["decode_attention"]
    assert {(c["device"], c["engine"]) for c in curves} >= {
        ("NVIDIA A100 SXM 80GB", "sglang"),
        ("NVIDIA A100 SXM 80GB", "vllm"),
    }
    for curve in curves:
        best = max(
            max(values)
            for rows in curve["efficiency_by_group_units"].values()
            for values in rows.values()
        )
        assert best < 0.99, (curve["device"], curve["engine"], curve["engine_version"], best)
