"""The CLI as scripts and people meet it: one-line errors (exit 2) before any work, Ctrl-C, ``--json``
on every command that prints results, tables that fit 80 columns, unwrapped output in pipes."""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from autoparallel.cli import main

REPO = Path(__file__).resolve().parents[1]
SMALL_TRAINING = [
    "--model",
    "tiny-moe",
    "--cluster",
    "cpu-loopback",
    "--training",
    "--sequence-length",
    "16",
    "--global-batch-tokens",
    "128",
]


@pytest.fixture(scope="module")
def small_plan(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "plan.json"
    assert main(["plan", *SMALL_TRAINING, "--trials", "20", "--output", str(path), "--json"]) == 0
    return path


def _bad_invocations(tmp_path: Path) -> dict[str, list[str]]:
    (tmp_path / "folder").mkdir()
    (tmp_path / "not-json.json").write_text("not json")
    (tmp_path / "empty.json").write_text("{}")
    return {
        "tp 0": ["estimate", "--tp", "0"],
        "tp not an integer": ["estimate", "--tp", "two"],
        "nodes 0": ["estimate", "--nodes", "0"],
        "negative sequence": ["estimate", "--sequence-length", "-5"],
        "tp not dividing heads": ["estimate", "--tp", "3"],
        "workers 0": ["plan", "--workers", "0"],
        "workers -2": ["plan", "--workers", "-2"],
        "trials 0": ["plan", "--trials", "0"],
        "output in a missing folder": ["plan", "--output", str(tmp_path / "missing" / "plan.json")],
        "output is a folder": ["plan", "--output", str(tmp_path / "folder")],
        "storage not a URL": ["plan", "--storage", "study.db"],
        "sqlite in a missing folder": ["plan", "--storage", f"sqlite:///{tmp_path}/missing/s.db"],
        "negative SLO": ["plan", "--tpot-slo-ms", "-1"],
        "hit rate 1.5": ["plan", "--prefix-cache-hit-rate", "1.5"],
        "grace period within a heartbeat": ["plan", "--heartbeat-s", "5", "--grace-period-s", "5"],
        "missing cluster JSON": ["plan", "--cluster", str(tmp_path / "cluster.json")],
        "cluster JSON of the wrong shape": ["plan", "--cluster", str(tmp_path / "empty.json")],
        "unknown preset": ["clusters", "no-such-preset"],
        "unknown model": ["describe", "no-such-model"],
        "explain a missing file": ["explain", str(tmp_path / "missing.json")],
        "explain a folder": ["explain", str(tmp_path / "folder")],
        "explain not JSON": ["explain", str(tmp_path / "not-json.json")],
        "export a missing file": ["export", str(tmp_path / "missing.json"), "--format", "vllm"],
        "export into a file": [
            "export",
            str(tmp_path / "not-json.json"),
            "--format",
            "vllm",
            "--output-dir",
            str(tmp_path / "not-json.json"),
        ],
        "export an empty plan": ["export", str(tmp_path / "empty.json"), "--format", "vllm"],
        "validate an unknown table": ["validate", "--table", "no-such-table"],
        "profile into a missing folder": [
            "profile",
            "--output",
            str(tmp_path / "missing" / "p.json"),
        ],
        "stage-check a missing profile": [
            "stage-check",
            "--profile",
            str(tmp_path / "missing.json"),
        ],
        "probe report into a missing folder": [
            "probe",
            "--report",
            str(tmp_path / "missing" / "r.json"),
        ],
    }


def test_every_bad_argument_is_one_line_with_exit_2_before_any_work(tmp_path, capsys):
    for name, argv in _bad_invocations(tmp_path).items():
        with pytest.raises(SystemExit) as exited:
            code = main(argv)
            raise SystemExit(code)
        captured = capsys.readouterr()
        lines = [line for line in captured.err.splitlines() if line.strip()]
        assert exited.value.code == 2, name
        assert len(lines) == 1 and lines[0].startswith("error:"), (name, captured.err)
        assert "Traceback" not in captured.err and captured.out == "", name
    assert not (tmp_path / "missing").exists()


def test_a_missing_cluster_file_is_not_called_an_unknown_preset(tmp_path, capsys):
    assert main(["plan", "--cluster", str(tmp_path / "mine.json")]) == 2
    error = capsys.readouterr().err
    assert "no such file" in error and "preset" not in error


def _interrupted_plan(tmp_path: Path, *, prelude: str = "") -> tuple[int, str]:
    """Run ``autoparallel plan`` as a program (``main()`` reading ``sys.argv``) after
    ``prelude``, send it Ctrl-C once its study exists, and return its exit code and stderr."""
    arguments = [
        "autoparallel",
        "plan",
        "--training",
        "--cluster",
        "dgx-h200",
        "--nodes",
        "128",
        "--trials",
        "100000",
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
        "--output",
        str(tmp_path / "plan.json"),
    ]
    program = (
        f"{prelude}\nimport sys\nfrom autoparallel.cli import main\n"
        f"sys.argv = {arguments!r}\nsys.exit(main())\n"
    )
    environment = dict(os.environ, PYTHONPATH=str(REPO))
    # stderr goes to a file and the wait is for the process itself: a pipe's end of file also
    # waits for any process that inherited it, which is not what this checks.
    stderr_path = tmp_path / "stderr.txt"
    with stderr_path.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-c", program],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=environment,
            cwd=tmp_path,
            # a shell's background job ignores SIGINT and its children inherit that: restore
            # the default so that Python installs its KeyboardInterrupt handler in the child
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    deadline = time.monotonic() + 60
    while not (tmp_path / "s.db").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    process.send_signal(signal.SIGINT)
    try:
        code = process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    return code, stderr_path.read_text()


def test_ctrl_c_is_one_line_and_exit_130(tmp_path):
    code, error = _interrupted_plan(tmp_path)
    assert code == 130, error
    assert "Traceback" not in error
    assert [line for line in error.splitlines() if line.strip()][-1].startswith(
        "error: interrupted"
    )


def test_ctrl_c_exits_past_a_thread_that_would_keep_it_alive(tmp_path):
    """Optuna's per-trial heartbeat thread is not a daemon; an interrupt between its start and
    the ``with`` block that stops it leaves it running. The program still ends at once: here a
    thread that never ends stands for it (the interpreter would wait for it at exit forever)."""
    prelude = "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,)).start()"
    code, error = _interrupted_plan(tmp_path, prelude=prelude)
    assert code == 130, error
    assert "error: interrupted" in error


def test_json_on_every_command_that_prints_results(small_plan, capsys):
    commands = {
        "models": ["models", "--json"],
        "describe": ["describe", "tiny-moe", "--json"],
        "clusters": ["clusters", "cpu-loopback", "--json"],
        "estimate": [
            "estimate",
            "--model",
            "tiny-moe",
            "--cluster",
            "cpu-loopback",
            "--nodes",
            "1",
            "--tp",
            "1",
            "--pp",
            "1",
            "--ep",
            "1",
            "--sequence-length",
            "16",
            "--global-batch-tokens",
            "128",
            "--json",
        ],
        "validate": ["validate", "--table", "megatron_sc21_table1", "--json"],
        "explain": ["explain", str(small_plan), "--json"],
        "export": ["export", str(small_plan), "--format", "torchtitan", "--json"],
    }
    for name, argv in commands.items():
        assert main(argv) == 0, name
        document = json.loads(capsys.readouterr().out)
        assert document, name
    assert main(["models", "--json"]) == 0
    names = {row["name"] for row in json.loads(capsys.readouterr().out)}
    assert {"ref-3t-moe", "deepseek-v3", "tiny-moe"} <= names


def test_plan_json_is_the_written_plan(tmp_path, capsys):
    path = tmp_path / "plan.json"
    assert main(["plan", *SMALL_TRAINING, "--trials", "10", "--output", str(path), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["output"] == str(path)
    assert document["plan"] == json.loads(path.read_text())


def _render_at_80(module, call) -> str:
    console = Console(width=80, record=True, file=io.StringIO())
    module.console = console
    call()
    return console.export_text()


def test_tables_fit_80_columns_without_cutting_names_or_numbers(small_plan, monkeypatch):
    import autoparallel.cli._cost as cost
    import autoparallel.cli._models as models
    import autoparallel.cli._search as search
    import autoparallel.cli._topology as topology
    from autoparallel import load_plan
    from topology import list_presets

    for module in (cost, models, search, topology):
        monkeypatch.setattr(module, "console", module.console)
    plan = load_plan(small_plan)
    texts = {
        "models": _render_at_80(models, lambda: models._models(argparse.Namespace(json=False))),
        "describe": _render_at_80(
            models, lambda: models._describe(argparse.Namespace(json=False, model="ref-3t-moe"))
        ),
        "clusters": _render_at_80(
            topology,
            lambda: topology._clusters(
                argparse.Namespace(names=[], nodes=None, sources=False, json=False)
            ),
        ),
        "explain": _render_at_80(
            search, lambda: search._explain(argparse.Namespace(plan=str(small_plan), json=False))
        ),
        "estimate": _render_at_80(cost, lambda: cost._print_breakdown(plan.predicted)),
    }
    for name, text in texts.items():
        assert max(len(line.rstrip()) for line in text.splitlines()) <= 80, name
        assert "…" not in text, name
    words = set(texts["models"].split())
    assert {"megatron-h100-gpt-119b", "ref-3t-moe", "768+1/8", "3.00", "1024K"} <= words
    assert set(list_presets()) <= set(texts["clusters"].split())
    assert "2,250" in texts["clusters"].split()


def test_output_to_a_pipe_is_never_wrapped():
    environment = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="40")
    result = subprocess.run(
        [sys.executable, "-m", "autoparallel.cli", "clusters", "dgx-h100", "--sources"],
        capture_output=True,
        text=True,
        env=environment,
        check=True,
    )
    from topology import get_preset

    source = get_preset("dgx-h100").device.sources["peak_flops"]
    assert any(source in line for line in result.stdout.splitlines())


def test_mfu_never_exceeds_one_at_a_million_tokens(capsys):
    argv = [
        "estimate",
        "--model",
        "tiny-moe",
        "--cluster",
        "dgx-b200",
        "--nodes",
        "16",
        "--tp",
        "1",
        "--pp",
        "1",
        "--ep",
        "2",
        "--dp",
        "128",
        "--sequence-length",
        "1048576",
        "--global-batch-tokens",
        "536870912",
        "--json",
    ]
    assert main(argv) == 0
    assert 0 < json.loads(capsys.readouterr().out)["mfu"] < 1


def test_a_table_without_a_bound_gets_no_verdict(capsys):
    assert main(["validate", "--table", "dsv3_day6_by_prompt_cv"]) == 0
    overview = capsys.readouterr().out.split("Mean and max absolute error per table")[1]
    row = next(line for line in overview.splitlines() if "dsv3_day6_by_prompt_cv" in line)
    assert "no bound" in row and "yes" not in row


def test_an_unreachable_latency_slo_is_reported_in_seconds(capsys):
    argv = [
        "plan",
        "--model",
        "deepseek-v3",
        "--cluster",
        "dgx-h100",
        "--nodes",
        "4",
        "--tpot-slo-ms",
        "0.01",
        "--no-disaggregation",
        "--trials",
        "10",
        "--output",
        os.devnull,
    ]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert "TPOT" in error and "SLO" in error and " GB" not in error


def test_a_default_slo_no_layout_meets_is_named_as_the_default(capsys):
    """``plan`` holds serving layouts to a 50 ms p90 TPOT where the command line sets none: an
    error about it names it as that default and the flag that sets or drops it (a user who set
    no SLO read of one they never gave); an SLO the user gave is reported as given."""
    job = "--model llama-3.1-405b --cluster dgx-h200 --nodes 1 --prompt-tokens 4000"
    argv = ["plan", *job.split(), "--output-tokens", "1000", "--concurrency", "8"]
    argv += ["--no-disaggregation", "--trials", "10", "--output", os.devnull]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert "bottleneck tpot_slo" in error and "50 ms p90 TPOT SLO is plan's default" in error
    assert "--tpot-slo-ms 0: none" in error
    assert main([*argv, "--tpot-slo-ms", "50"]) == 2
    error = capsys.readouterr().err
    assert "bottleneck tpot_slo" in error and "default" not in error
    assert main([*argv, "--tpot-slo-ms", "0"]) == 0
    assert main(["plan", "--help"]) == 0
    assert "default 50 ms" in capsys.readouterr().out


def test_estimate_fills_the_pipeline_with_the_devices_a_given_dp_leaves(capsys):
    """A training layout given as tp and dp: the default pipeline degree takes the devices tp*dp
    leave (it took those tp alone left, and the estimate refused 'dp*cp*tp*pp (64) must be <=
    the cluster's devices (8)', a pp of 8 the user never set)."""
    job = "estimate --model megatron-h100-gpt-7.1b --cluster dgx-h100 --nodes 1 --training"
    job += " --sequence-length 4096 --global-batch-tokens 65536"
    argv = [*job.split(), "--json", "--tp", "2"]
    assert main([*argv, "--dp", "2"]) == 0
    config = json.loads(capsys.readouterr().out)["config"]
    assert (config["dp"], config["pp"]) == (2, 2)
    assert main(argv) == 0  # no dp: the pipeline takes what tp leaves (up to 16)
    config = json.loads(capsys.readouterr().out)["config"]
    assert (config["dp"], config["pp"]) == (1, 4)


def test_estimate_fits_the_default_tp_and_pp_to_the_axes_given(capsys):
    """tp defaults to 8 only where the devices the given dp, pp and cp leave hold it (``--dp 8``
    on one node was refused: 'dp*cp*tp*pp (64) must be <= the cluster's devices (8)'), and the
    default pipeline leaves each stage the devices a given ep*etp needs (``--tp 1 --ep 4`` on 32
    devices took pp 16, two ranks a stage, and was refused: 'dp*cp*tp (2) must be divisible by
    ep*etp (4)')."""
    serving = "estimate --model qwen3-30b-a3b --cluster dgx-h100 --inference --json".split()
    assert main([*serving, "--nodes", "1", "--dp", "8"]) == 0
    config = json.loads(capsys.readouterr().out)["config"]
    assert (config["dp"], config["tp"], config["pp"]) == (8, 1, 1)
    training = "estimate --model qwen3-30b-a3b --cluster dgx-h100 --training --json".split()
    training += ["--sequence-length", "4096", "--global-batch-tokens", str(4096 * 256)]
    assert main([*training, "--nodes", "4", "--tp", "1", "--ep", "4"]) == 0
    config = json.loads(capsys.readouterr().out)["config"]
    assert (config["tp"], config["pp"], config["dp"], config["ep"]) == (1, 8, 4, 4)


def test_estimate_without_ep_takes_one_for_a_dense_model_and_a_dividing_degree_for_moe(capsys):
    """A layout given as tp/pp only is valid as it stands: a dense model gets ep 1 (it was an
    error about an ep of 64 the user never set), an MoE model the largest ep dividing both its
    routed experts and the ranks of a stage; an ep given explicitly is still checked."""
    dense = ["estimate", "--model", "llama-3.1-405b", "--cluster", "dgx-h100", "--nodes", "64"]
    assert main([*dense, "--tp", "8", "--pp", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["ep"] == 1
    moe = ["estimate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--nodes", "2"]
    assert main([*moe, "--tp", "1", "--pp", "1", "--etp", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["ep"] == 16  # 128 experts, 16 ranks
    assert main([*moe, "--tp", "2", "--pp", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["ep"] == 8  # dp 4 x tp 2
    assert main([*moe, "--tp", "1", "--pp", "1", "--ep", "64"]) == 2
    assert "ep*etp (64)" in capsys.readouterr().err


def test_estimate_without_pp_fits_the_cluster_it_is_given(capsys):
    """A training layout given only as tp takes the largest pipeline degree up to 16 that the
    cluster holds (16 on 64 nodes, 1 on one node: it was an error about 128 devices the user
    never asked for); serving takes 1; a pp given explicitly is still checked."""
    job = ["estimate", "--model", "megatron-gpt-18b", "--cluster", "dgx-h100", "--json"]
    for nodes, pp in (("64", 16), ("1", 1), ("6", 6)):
        assert main([*job, "--nodes", nodes, "--tp", "8"]) == 0
        config = json.loads(capsys.readouterr().out)["config"]
        assert (config["pp"], config["dp"]) == (pp, int(nodes) * 8 // (8 * pp))
    serving = ["estimate", "--model", "deepseek-v3", "--cluster", "dgx-h200", "--nodes", "2"]
    serving += ["--inference", "--tp", "8", "--weight-dtype", "fp8", "--json"]
    assert main(serving) == 0
    assert json.loads(capsys.readouterr().out)["config"]["pp"] == 1
    assert main([*job, "--nodes", "1", "--tp", "8", "--pp", "2"]) == 2
    assert "must be <= the cluster's devices (8)" in capsys.readouterr().err
