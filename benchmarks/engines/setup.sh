#!/usr/bin/env bash
# Builds one virtual environment per engine, each with CPU torch, so that check_exports.py can
# hand every export to the engine's own argument parser or config loader.
#
#   bash benchmarks/engines/setup.sh [ENGINE ...]     # default: all of them
#
# Venvs go to $ENGINES_VENV_DIR/<engine> (default ~/.cache/autoparallel/engine-venvs, outside the
# source tree). Versions are the releases the exports are stamped for
# (cost_model/data/engine_rules.json "current").
#
# How each engine is installed, and why:
# - deepspeed:   pip, with DS_BUILD_OPS=0 (no CUDA extension is compiled; DeepSpeedConfig is pure Python).
# - torchtitan:  pip, plus torchao/triton/rich that its model config registries import.
# - megatron:    megatron-core from pip (no deps: its extras pull CUDA builds) + the Megatron-LM
#                repository's megatron/training package at tag core_v<version>, which holds the
#                training argument parser (arguments.py). Set MEGATRON_LM_SRC to a Megatron-LM git
#                checkout (default: clone it).
# - sglang:      pip --no-deps (its deps pull CUDA kernels) + the packages srt/server_args.py imports.
# - vllm:        pip --no-deps (the wheel is CUDA-built; only its Python argument parsing is used)
#                + the packages vllm/engine/arg_utils.py imports.
set -euo pipefail
VENVS="${ENGINES_VENV_DIR:-$HOME/.cache/autoparallel/engine-venvs}"
PYTHON="${PYTHON:-python3}"
TORCH="torch==2.13.0"
mkdir -p "$VENVS"

venv() {  # venv NAME -> path of its python, with CPU torch installed
    local dir="$VENVS/$1"
    [ -x "$dir/bin/python" ] || "$PYTHON" -m venv "$dir"
    "$dir/bin/pip" install -q --upgrade pip >/dev/null
    "$dir/bin/pip" install -q "$TORCH"  # the CPU wheel (a local find-links wheel where pip has one)
    echo "$dir/bin/python"
}

setup_deepspeed() {
    local py; py="$(venv deepspeed)"
    DS_BUILD_OPS=0 "$py" -m pip install -q "deepspeed==${DEEPSPEED_VERSION:-0.19.8}"
}

setup_torchtitan() {
    local py; py="$(venv torchtitan)"
    "$py" -m pip install -q "torchtitan==${TORCHTITAN_VERSION:-0.3.0}"
    # imported by its model registries (float8 converters, kernels); nothing is run on a GPU
    "$py" -m pip install -q ${TORCHTITAN_DEPS:-torchao triton rich}
}

setup_megatron() {
    local version="${MEGATRON_VERSION:-0.16.1}" py src
    py="$(venv megatron)"
    "$py" -m pip install -q --no-deps "megatron-core==$version"
    # regex (megatron/training tokenizers) and triton (imported at module level by
    # megatron.core batch_invariant_kernels, which megatron/training/initialize.py imports)
    "$py" -m pip install -q numpy packaging pyyaml einops six pydantic regex triton
    src="${MEGATRON_LM_SRC:-$VENVS/Megatron-LM}"
    [ -d "$src" ] || git clone -q --filter=blob:none https://github.com/NVIDIA/Megatron-LM "$src"
    local target="$VENVS/megatron/megatron-lm-training"
    rm -rf "$target" && mkdir -p "$target"
    git -C "$src" archive "core_v$version" megatron/training megatron/legacy megatron/post_training megatron/rl | tar -x -C "$target"
    echo "$target" > "$("$py" -c 'import site; print(site.getsitepackages()[0])')/megatron_training.pth"
}

setup_sglang() {
    local py; py="$(venv sglang)"
    "$py" -m pip install -q --no-deps "sglang==${SGLANG_VERSION:-0.5.23}"
    "$py" -m pip install -q ${SGLANG_DEPS:-requests orjson psutil pydantic numpy packaging transformers fastapi uvicorn aiohttp pyzmq uvloop pybase64 triton pillow msgspec ipython}
}

setup_vllm() {
    local py; py="$(venv vllm)"
    "$py" -m pip install -q --no-deps "vllm==${VLLM_VERSION:-0.33.0}"
    "$py" -m pip install -q ${VLLM_DEPS:-transformers pydantic msgspec cloudpickle psutil pyzmq regex cachetools sentencepiece tokenizers protobuf fastapi uvicorn prometheus_client openai aiohttp requests tqdm blake3 pybase64 cbor2 gguf numpy
        openai-harmony pillow py-cpuinfo partial-json-parser xgrammar llguidance watchfiles orjson uvloop}
}

for engine in "${@:-deepspeed torchtitan megatron sglang vllm}"; do
    for name in $engine; do
        echo "== $name"
        "setup_$name"
    done
done
