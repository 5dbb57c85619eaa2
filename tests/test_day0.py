"""``autoparallel day0``: one report folder from a config.json and a cluster; resumable; bad
inputs stop it before any work."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import autoparallel as ap
from autoparallel._catalog import catalog_config
from autoparallel.cli import main
from autoparallel.day0._figures import FIGURES
from autoparallel.day0._report import SECTIONS
from autoparallel.day0._run import STEPS, Day0Options, check_inputs
from cost_model import Inference, Training
from cost_model._units import human_bytes, human_seconds
from topology import Cluster

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _config(folder: Path, name: str, **changes) -> Path:
    data = (
        {k: v for k, v in catalog_config(name).items() if not k.startswith("_")}
        | {"_name_or_path": name}
        | changes
    )
    path = folder / "config.json"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def deepseek_report(tmp_path_factory) -> Path:
    """DeepSeek-V3 on the cpu-loopback preset, every step, small search budget."""
    folder = tmp_path_factory.mktemp("day0")
    config = _config(folder / "model", "deepseek-v3")
    output = folder / "report"
    code = main(
        [
            "day0",
            str(config),
            "--cluster",
            "cpu-loopback",
            "--output-dir",
            str(output),
            "--trials",
            "60",  # the default: the layouts that hold DeepSeek-V3 in 4 GB ranks are few
        ]
    )
    assert code == 0
    return output


def _section(markdown: str, title: str) -> str:
    return markdown.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_report_folder_has_every_section_figure_and_file(deepseek_report):
    markdown = (deepseek_report / "report.md").read_text()
    for title in SECTIONS:
        assert f"\n## {title}\n" in markdown
    report = json.loads((deepseek_report / "report.json").read_text())
    assert list(report["steps"]) == list(STEPS)
    statuses = {name: step["status"] for name, step in report["steps"].items()}
    assert set(statuses.values()) == {"done"}, (
        statuses
    )  # on a CPU with cpu-loopback every step can run
    for name in FIGURES.values():
        path = deepseek_report / "figures" / name
        assert path.read_bytes()[:8] == PNG_MAGIC, name
        assert f"(figures/{name})" in markdown
    for name in (
        "plan-training.json",
        "plan-serving.json",
        "cluster.json",
        "coverage.json",
        "stages.json",
    ):
        assert (deepseek_report / name).is_file()
    launch = sorted(
        p.relative_to(deepseek_report).as_posix()
        for p in (deepseek_report / "launch").rglob("*")
        if p.is_file()
    )
    assert launch and all(f"`{p}`" in markdown for p in launch)
    assert "tp2 and pp2 not run: 1 local cpu device" in _section(markdown, "Staged checks")
    # Each plan says how far the model was from the published runs of its regime.
    assert "error bar of the step time: the published runs like this one" in markdown
    assert "error bar of the peak memory: the published runs like this one" in markdown
    assert "error bar of the TTFT: the published runs like this one" in markdown


def _estimate(folder: Path, kind: str, planned: dict):
    plan = ap.load_plan(folder / planned["plan_file"])
    cluster = Cluster.load(folder / planned["cluster_file"])
    workload_type = Training if kind == "training" else Inference
    workload = workload_type.model_validate(planned["workload"])
    model = ap.get_model("deepseek-v3")
    return (
        ap.estimate(model, cluster, workload, plan.config, **planned["serving_options"]),
        plan,
        cluster,
    )


@pytest.mark.parametrize("kind", ["training", "serving"])
def test_the_report_numbers_equal_estimate_on_the_same_plan(deepseek_report, kind):
    report = json.loads((deepseek_report / "report.json").read_text())
    planned = report["results"][f"plan-{kind}"]
    cost, plan, cluster = _estimate(deepseek_report, kind, planned)
    recorded = planned["estimate"]
    for field in (
        "step_time_s",
        "memory_per_device_bytes",
        "tokens_per_s_per_device",
        "ttft_s",
        "tpot_s",
        "mfu",
    ):
        expected = getattr(cost, field)
        assert recorded[field] == (
            pytest.approx(expected, rel=1e-12) if expected is not None else None
        ), field
    assert cluster.num_devices == plan.world_size == planned["num_devices"]
    section = _section((deepseek_report / "report.md").read_text(), f"{kind.capitalize()} plan")
    assert f"step time: {human_seconds(cost.step_time_s)}" in section
    assert f"memory per device: {human_bytes(cost.memory_per_device_bytes)}" in section
    if kind == "serving":
        assert (
            f"TTFT: {human_seconds(cost.ttft_s)}" in section
            and f"TPOT: {human_seconds(cost.tpot_s)}" in section
        )
    # the cluster was grown to the size the plan needs, and the report says why
    assert planned["tried"] and "Why" in section
    # a size below the smallest fitting one the planner reported is not searched again, and
    # that smallest size is where the plan was found (a whole search it would repeat)
    smallest = [
        int(entry["why_not"].split("at least ")[1].split(" devices")[0])
        for entry in planned["tried"]
        if "smallest fitting size: at least" in entry["why_not"]
    ]
    for entry in planned["tried"]:
        if entry["why_not"].startswith("below the smallest fitting size found"):
            assert smallest and entry["devices"] < max(smallest) <= cluster.num_devices


def test_the_sweep_and_coverage_sections_report_their_findings(deepseek_report):
    report = json.loads((deepseek_report / "report.json").read_text())
    sweep = report["results"]["sweep"]
    assert (
        sweep["lengths"][0] == 4096
        and sweep["lengths"][-1] <= ap.get_model("deepseek-v3").max_context_tokens
    )
    exponents = [
        row["scaling_exponent"] for row in sweep["rows"][1:] if row["scaling_exponent"] is not None
    ]
    if sweep["superlinear_length"] is not None:
        index = sweep["lengths"].index(sweep["superlinear_length"])
        assert sweep["rows"][index]["scaling_exponent"] > sweep["threshold"]
    elif sum(row["feasible"] for row in sweep["rows"]) >= 2:
        assert exponents and max(exponents) <= sweep["threshold"]
    else:  # too few lengths fit to measure an exponent: the report says so
        assert not exponents
        assert "so no scaling exponent is measured" in _section(
            (deepseek_report / "report.md").read_text(), "Long-context sweep"
        )
    coverage = report["results"]["coverage"]
    assert coverage["device"] == "cpu"
    recorded = json.loads((deepseek_report / "coverage.json").read_text())["operators"]
    assert "aten::sigmoid" in {
        o["name"] for o in recorded
    }  # DeepSeek-V3's router scores by sigmoid
    assert sum(coverage["shares"]["flop"].values()) == pytest.approx(1.0)
    markdown = (deepseek_report / "report.md").read_text()
    native = coverage["shares"]["flop"]["native"]
    assert f"| native | {native:.1%} |" in _section(markdown, "Operator coverage")


def test_a_failed_step_keeps_earlier_files_and_resume_finishes_the_run(tmp_path, capsys):
    config = _config(tmp_path / "model", "tiny-moe")
    output = tmp_path / "report"
    output.mkdir()
    (output / "figures").write_text(
        "a file where the figures folder goes"
    )  # makes the figures step fail
    arguments = [
        "day0",
        str(config),
        "--cluster",
        "cpu-loopback",
        "--output-dir",
        str(output),
        "--trials",
        "4",
        "--serving",
        "--no-stages",
        "--no-coverage",
    ]
    assert main(arguments) == 1
    assert "step figures failed" in capsys.readouterr().err
    state = json.loads((output / "day0-state.json").read_text())
    assert (
        state["steps"]["figures"]["status"] == "failed"
        and state["steps"]["sweep"]["status"] == "done"
    )
    assert state["steps"]["plan-training"]["status"] == "skipped"
    plan_text = (output / "plan-serving.json").read_text()
    assert not (output / "report.md").exists()

    (output / "figures").unlink()
    assert main([*arguments, "--resume"]) == 0
    out = capsys.readouterr().out
    assert len(re.findall(r"resumed", out)) == STEPS.index("figures")
    assert "done figures" in out.replace("  ", " ")
    assert (output / "plan-serving.json").read_text() == plan_text  # not searched again
    markdown = (output / "report.md").read_text()
    assert "*skipped*: turned off (--no-coverage)" in _section(markdown, "Operator coverage")
    assert "*skipped*: not asked for" in _section(markdown, "Training plan")


def test_resume_refuses_a_folder_of_a_run_with_other_inputs(tmp_path):
    config = _config(tmp_path / "model", "tiny-moe")
    output = tmp_path / "report"
    base = [
        "day0",
        str(config),
        "--cluster",
        "cpu-loopback",
        "--output-dir",
        str(output),
        "--serving",
        "--no-stages",
        "--no-coverage",
        "--trials",
        "4",
    ]
    assert main(base) == 0
    assert main([*base[:-1], "5", "--resume"]) == 2


def _options(tmp_path: Path, config: Path, **changes) -> Day0Options:
    return Day0Options(
        config_path=config, cluster="cpu-loopback", output_dir=tmp_path / "out", **changes
    )


def test_an_unsupported_model_type_is_a_one_line_error_before_any_work(tmp_path):
    config = _config(tmp_path / "model", "deepseek-v3", model_type="mamba2")
    with pytest.raises(ValueError, match=r"model_type \('mamba2'\) is not supported") as error:
        check_inputs(_options(tmp_path, config))
    assert "\n" not in str(error.value)
    assert (
        main(
            [
                "day0",
                str(config),
                "--cluster",
                "cpu-loopback",
                "--output-dir",
                str(tmp_path / "out"),
            ]
        )
        == 2
    )
    assert not (tmp_path / "out").exists()


def test_a_probe_file_from_another_cluster_is_refused(tmp_path):
    config = _config(tmp_path / "model", "tiny-moe")
    cluster = ap.get_preset("dgx-h100")
    probed = cluster.model_copy(
        update={"provenance": "measured: probe run h100-rack (nccl, 8 ranks)"}
    )
    probe_file = tmp_path / "cluster.json"
    probed.save(probe_file)
    with pytest.raises(
        ValueError, match=r"probed on another cluster: its devices are 'cuda'"
    ) as error:
        check_inputs(
            Day0Options(config_path=config, cluster=str(probe_file), output_dir=tmp_path / "out")
        )
    assert "\n" not in str(error.value)
    assert (
        main(
            [
                "day0",
                str(config),
                "--cluster",
                str(probe_file),
                "--output-dir",
                str(tmp_path / "out"),
            ]
        )
        == 2
    )
    assert not (tmp_path / "out").exists()
    # a probe measured here is accepted, and so is a preset of other devices (planning only)
    here = ap.get_preset("cpu-loopback").model_copy(
        update={"provenance": "measured: probe run local (gloo, 4 ranks)"}
    )
    here.save(probe_file)
    assert (
        check_inputs(
            Day0Options(config_path=config, cluster=str(probe_file), output_dir=tmp_path / "out")
        ).cluster
        == here
    )
    assert check_inputs(
        Day0Options(config_path=config, cluster="dgx-h100", output_dir=tmp_path / "out")
    )


def test_a_device_type_not_present_and_bad_names_are_refused(tmp_path):
    import torch

    config = _config(tmp_path / "model", "tiny-moe")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"device \('cuda'\) is not present"):
            check_inputs(_options(tmp_path, config, device="cuda"))
    with pytest.raises(ValueError, match=r"cluster \('nowhere'\) must be a preset"):
        check_inputs(
            Day0Options(config_path=config, cluster="nowhere", output_dir=tmp_path / "out")
        )
    with pytest.raises(ValueError, match=r"engine \('ollama'\) must be one of"):
        check_inputs(_options(tmp_path, config, engine="ollama"))
    with pytest.raises(ValueError, match="must be an existing HuggingFace config.json"):
        check_inputs(_options(tmp_path, tmp_path / "missing.json"))


@pytest.mark.distributed
def test_probe_ranks_measures_this_machine_under_torchrun_and_plans_on_it(tmp_path):
    config = _config(tmp_path / "model", "tiny-moe")
    output = tmp_path / "report"
    arguments = ["day0", str(config), "--cluster", "cpu-loopback", "--probe-ranks", "2"]
    arguments += ["--output-dir", str(output), "--serving", "--no-stages", "--no-coverage"]
    assert main([*arguments, "--trials", "4"]) == 0
    probed = Cluster.load(output / "probe-cluster.json")
    assert probed.provenance.startswith("measured:") and probed.num_devices == 2
    assert Cluster.load(output / "cluster.json") == probed
    report = json.loads((output / "report.json").read_text())
    assert report["results"]["cluster"]["source"] == "probe"
    planned = Cluster.load(output / report["results"]["plan-serving"]["cluster_file"])
    assert planned.device == probed.device  # the plan was priced on the measured devices
    assert "under torchrun on 2 local ranks" in _section(
        (output / "report.md").read_text(), "Cluster"
    )


def test_probe_ranks_needs_a_preset_of_this_machine(tmp_path):
    config = _config(tmp_path / "model", "tiny-moe")
    with pytest.raises(
        ValueError, match=r"probe_ranks \(2\) measures this machine's 'cpu' devices"
    ):
        check_inputs(
            Day0Options(config_path=config, cluster="dgx-h100", output_dir=tmp_path, probe_ranks=2)
        )
    with pytest.raises(ValueError, match=r"probe_ranks \(1\) must be 0"):
        check_inputs(
            Day0Options(
                config_path=config, cluster="cpu-loopback", output_dir=tmp_path, probe_ranks=1
            )
        )
