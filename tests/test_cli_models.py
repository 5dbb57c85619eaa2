"""`autoparallel models` and `autoparallel describe` print the catalog's figures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "COLUMNS": "200",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run(
        [sys.executable, "-m", "autoparallel.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )


def test_describe_reference_model() -> None:
    result = run_cli("describe", "ref-3t-moe")
    assert result.returncode == 0, result.stderr
    total_row = next(line for line in result.stdout.splitlines() if "total" in line and "T" in line)
    assert "3.00 T" in total_row and "56.3 B" in total_row
    assert "92,160" in result.stdout
    assert "96.6 GB" in result.stdout


def test_models_lists_every_catalog_entry() -> None:
    import autoparallel as ap

    result = run_cli("models")
    assert result.returncode == 0, result.stderr
    for name in ap.list_models():
        assert name in result.stdout


def test_describe_accepts_a_config_path_and_rejects_unknown_names(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(
        '{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,'
        ' "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 512}'
    )
    assert run_cli("describe", str(config)).returncode == 0
    bad = run_cli("describe", "no-such-model")
    assert bad.returncode == 2
    assert "ref-3t-moe" in bad.stderr and "Traceback" not in bad.stderr


def test_describe_takes_model_as_an_option_and_suggests_close_names() -> None:
    by_option = run_cli("describe", "--model", "mixtral-8x7b", "--json")
    assert by_option.returncode == 0, by_option.stderr
    assert by_option.stdout == run_cli("describe", "mixtral-8x7b", "--json").stdout
    assert run_cli("describe", "qwen3-8b", "--model", "qwen3-32b").returncode == 2
    typo = run_cli("describe", "--model", "Llama-3.1-70B")
    assert typo.returncode == 2
    assert "did you mean 'llama-3.1-70b'?" in typo.stderr and "Traceback" not in typo.stderr
    far = run_cli("describe", "--model", "gpt-4")
    assert far.returncode == 2 and "did you mean" not in far.stderr
