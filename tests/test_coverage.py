"""Operator coverage: the reference module's ATen operators classified for a device backend.

The PrivateUse1 cases run in a subprocess: renaming the PrivateUse1 backend is process-global
and cannot be undone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from autoparallel.cli import main
from autoparallel.day0 import operator_coverage
from autoparallel.day0._coverage import count_bytes, count_flops, dispatch_key_for, small_width_spec

ROOT = Path(__file__).resolve().parents[1]

_PRIVATEUSE1_SCRIPT = textwrap.dedent(
    """
    import json, sys, types
    import torch

    torch.utils.rename_privateuse1_backend("testdev")
    device_module = types.ModuleType("testdev")
    device_module.is_available = lambda: False
    torch._register_device_module("testdev", device_module)
    from autoparallel.day0._coverage import dispatch_key_for
    try:
        dispatch_key_for("testdev")
        absent = ""
    except ValueError as error:
        absent = str(error)
    library = torch.library.Library("aten", "IMPL", "PrivateUse1")
    for name in ("mm", "add.Tensor", "mul.Tensor"):
        library.impl(name, lambda *args, **kwargs: None)
    from autoparallel.day0 import operator_coverage

    report = operator_coverage("tiny-moe", device="testdev")
    fallback = torch.library.Library("_", "IMPL", "PrivateUse1")
    fallback.fallback(lambda op, *args, **kwargs: None)
    with_fallback = operator_coverage("tiny-moe", device="testdev")
    json.dump({"absent": absent, "plain": report.model_dump(mode="json"),
               "with_fallback": with_fallback.model_dump(mode="json")}, sys.stdout)
    """
)


@pytest.fixture(scope="module")
def privateuse1_reports() -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", _PRIVATEUSE1_SCRIPT],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _status(report: dict) -> dict[str, str]:
    return {operator["name"]: operator["status"] for operator in report["operators"]}


def test_a_privateuse1_backend_reports_its_kernels_native_and_the_rest_composite_or_missing(
    privateuse1_reports,
):
    report = privateuse1_reports["plain"]
    status = _status(report)
    assert report["dispatch_key"] == "PrivateUse1" and report["device"] == "testdev"
    assert {name for name, s in status.items() if s == "native"} == {
        "aten::mm",
        "aten::add.Tensor",
        "aten::mul.Tensor",
    }
    reasons = {operator["name"]: operator["reason"] for operator in report["operators"]}
    # a CompositeExplicitAutograd kernel that only calls registered kernels is composite ...
    assert (
        status["aten::mul.Scalar"] == "composite"
        and "aten::mul.Tensor" in reasons["aten::mul.Scalar"]
    )
    # ... and so is a torch._decomp decomposition into registered kernels (x**2 -> x * x)
    assert status["aten::pow.Tensor_Scalar"] == "composite"
    assert "decomposition into aten::mul.Tensor" in reasons["aten::pow.Tensor_Scalar"]
    # ... one that needs an operator the backend lacks is not (t -> transpose -> as_strided)
    assert (
        status["aten::t"] == "missing"
        and "needs aten::transpose.int (missing)" in reasons["aten::t"]
    )
    # kernels the backend lacks with no usable decomposition are missing (no fallback registered)
    assert status["aten::bmm"] == "missing" and status["aten::topk"] == "missing"
    assert "fallback" not in status.values()
    assert sum(o["flop_share"] for o in report["operators"]) == pytest.approx(1.0, abs=1e-9)
    assert sum(o["byte_share"] for o in report["operators"]) == pytest.approx(1.0, abs=1e-9)
    mm = next(o for o in report["operators"] if o["name"] == "aten::mm")
    assert mm["flop_share"] > 0.5 and set(mm["phases"]) == {"training", "prefill", "decode"}


def test_a_backend_fallback_turns_missing_operators_into_fallbacks(privateuse1_reports):
    plain, fallback = (
        _status(privateuse1_reports["plain"]),
        _status(privateuse1_reports["with_fallback"]),
    )
    assert privateuse1_reports["with_fallback"]["has_fallback"] is True
    missing = {name for name, s in plain.items() if s == "missing"}
    assert missing and {fallback[name] for name in missing} == {"fallback"}
    assert {n for n, s in plain.items() if s != "missing"} == {
        n for n, s in fallback.items() if s != "fallback"
    }


def test_a_privateuse1_name_with_no_kernels_is_not_present(privateuse1_reports):
    assert (
        "testdev" in privateuse1_reports["absent"]
        and "not present" in privateuse1_reports["absent"]
    )


def test_cpu_coverage_records_every_path_and_its_shares_sum_to_one():
    import autoparallel as ap

    assert ap.operator_coverage is operator_coverage
    report = operator_coverage("tiny-moe", device="cpu")
    phases = {phase for operator in report.operators for phase in operator.phases}
    assert phases == {"training", "prefill", "decode"}
    names = set(report.by_status("native"))
    assert {"aten::mm", "aten::bmm", "aten::topk", "aten::index_add"} <= names
    assert "aten::nll_loss_backward" in names  # backward ran
    assert not report.by_status("missing")
    assert sum(report.share_by_status(measure="flop").values()) == pytest.approx(1.0)
    assert all(not name.startswith("profiler::") for name in (o.name for o in report.operators))


def test_flops_are_counted_from_shapes():
    a, b = torch.ones(4, 8), torch.ones(8, 16)
    out = torch.ops.aten.mm.default(a, b)
    assert count_flops(torch.ops.aten.mm.default, (a, b), {}, out) == 2 * 4 * 8 * 16
    summed = torch.ops.aten.add.Tensor(a, a)
    assert count_flops(torch.ops.aten.add.Tensor, (a, a), {}, summed) == 32
    assert count_flops(torch.ops.aten.view.default, (a, [32]), {}, a.view(32)) == 0
    lists = ([a, b],)
    assert count_flops(torch.ops.aten._foreach_sqrt.default, lists, {}, [a, b]) == 32 + 128


def test_bytes_are_what_a_call_reads_and_writes():
    a = torch.ones(4, 8)  # 128 bytes in fp32
    summed = torch.ops.aten.add.Tensor(a, a)
    assert count_bytes(torch.ops.aten.add.Tensor, (a, a), {}, summed) == 3 * 128
    assert count_bytes(torch.ops.aten._unsafe_view.default, (a, [32]), {}, a.view(32)) == 0
    zeros = torch.ops.aten.zeros_like.default(a)
    assert count_bytes(torch.ops.aten.zeros_like.default, (a,), {}, zeros) == 128


def test_the_small_width_copy_keeps_the_model_family():
    from autoparallel import get_model

    spec = get_model("deepseek-v3")
    small = small_width_spec(spec)
    assert small.attention.kind == "mla" and small.hidden_size == 64
    assert (
        small.moe.num_shared_experts == spec.moe.num_shared_experts
        and small.moe.num_dense_layers == 1
    )
    assert small.num_layers == 2 and small.num_parameters < 1e6


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the error where no CUDA device is present"
)
def test_a_device_that_is_not_present_is_a_one_line_error():
    with pytest.raises(ValueError, match=r"device \('cuda'\) is not present") as error:
        dispatch_key_for("cuda")
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match=r"device \('musa'\) is not present"):
        dispatch_key_for("musa")
    with pytest.raises(ValueError, match="must be one of"):
        dispatch_key_for("abacus")
    assert main(["coverage", "tiny-moe", "--device", "cuda"]) == 2


def test_the_coverage_command_writes_its_report(tmp_path, capsys):
    output = tmp_path / "coverage.json"
    assert main(["coverage", "tiny-moe", "--device", "cpu", "-o", str(output)]) == 0
    data = json.loads(output.read_text())
    assert data["dispatch_key"] == "CPU" and len(data["operators"]) > 20
    assert "FLOP share: native" in capsys.readouterr().out
