"""``import_config`` reads launch commands as people write them: each engine's aliases, short
flags and the abbreviations its documentation uses, with the engine's own implied settings."""

from __future__ import annotations

import pytest

from autoparallel.export import import_config
from autoparallel.export._import import flags


def test_vllm_short_flags_are_its_long_ones() -> None:
    short = import_config("vllm", "vllm serve deepseek-ai/DeepSeek-V3 -tp 8 -dp 2 -ep -pp 1")
    long = import_config(
        "vllm",
        "vllm serve deepseek-ai/DeepSeek-V3 --tensor-parallel-size 8 --data-parallel-size 2 "
        "--enable-expert-parallel",
    )
    assert short == long
    assert (short.tp, short.dp, short.ep, short.etp) == (8, 2, 16, 1)


def test_sglang_abbreviations_and_the_deepep_expert_parallel() -> None:
    """``--tp 16 --dp 16 --enable-dp-attention`` as SGLang's DeepSeek examples write it; with an
    all-to-all backend SGLang runs the experts over the whole instance (ep = tp)."""
    config = import_config(
        "sglang",
        "python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp 16 --dp 16 "
        "--enable-dp-attention --moe-a2a-backend deepep --nnodes 2 --node-rank 0",
    )
    assert (config.tp, config.ep, config.etp, config.attention_data_parallel) == (16, 16, 1, True)
    plain = import_config("sglang", "python -m sglang.launch_server --tensor-parallel-size 8")
    assert (plain.tp, plain.ep, plain.etp, plain.attention_data_parallel) == (8, 1, 8, False)


def test_trtllm_options_with_dashes_or_underscores() -> None:
    dashed = import_config("trtllm", "trtllm-serve m --tp-size 8 --ep-size 4 --pp-size 2")
    underscored = import_config("trtllm", "trtllm-serve m --tp_size 8 --ep_size 4 --pp_size 2")
    assert dashed == underscored and (dashed.tp, dashed.ep, dashed.etp, dashed.pp) == (8, 4, 2, 2)


def test_one_flag_under_two_names_must_agree_and_values_stay_values() -> None:
    with pytest.raises(ValueError, match="--tp-size and --tp disagree"):
        import_config("sglang", "python -m sglang.launch_server --tp 8 --tp-size 4")
    found = flags("run --offset -1 -tp 2 --scale -.5 --flag", short=True)
    assert found == {"--offset": "-1", "-tp": "2", "--scale": "-.5", "--flag": True}
    script = "#!/usr/bin/env bash\nset -euo pipefail\nvllm serve m \\\n    -tp 4 \\\n    -pp 2\n"
    assert "-euo" not in flags(script)  # a shell's options are not the engine's
    config = import_config("vllm", {"launch_vllm.sh": script})
    assert (config.tp, config.pp) == (4, 2)
