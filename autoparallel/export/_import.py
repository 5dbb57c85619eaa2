"""``import_config``: an engine's launch arguments or config back into a ``ParallelConfig``, so a
user can price the layout they run today (``autoparallel import-config``).

Flags are read with the engine's own names (see ``_serving.py`` / ``_training.py``). Serving
layouts come back in the canonical form the search uses: attention data parallel when attention
is split one way over an instance of more than one rank (then ``tp`` is the instance size).
What a format does not hold is taken from keywords: DeepSpeed keeps pipeline stages and expert
parallel in model code, so ``pp`` and ``ep`` are arguments there.
"""

from __future__ import annotations

import json
import re
import shlex

from cost_model import ParallelConfig


def import_config(
    engine: str, files: dict[str, str] | str, *, pp: int = 1, ep: int = 1
) -> ParallelConfig:
    """The layout of ``engine``'s launch files (name -> text) or of one command line (a string).

    Raises ValueError naming the flag when a value is missing or not a number.
    """
    files = {"command.sh": files} if isinstance(files, str) else files
    readers = {
        "vllm": _vllm,
        "sglang": _sglang,
        "trtllm": _trtllm,
        "megatron": _megatron,
        "torchtitan": _torchtitan,
    }
    if engine == "deepspeed":
        return _deepspeed(files, pp=pp, ep=ep)
    if engine not in readers:
        raise ValueError(f"engine ({engine!r}) must be one of {[*readers, 'deepspeed']}")
    return readers[engine](files)


def layout_key(config: ParallelConfig, *, engine: str, moe: bool = True) -> tuple:
    """What of a layout ``engine``'s launch arguments hold, in comparable form: for serving, the
    instance shape (size, attention tp, pp, ep, etp); for training, the degrees, micro-batch,
    sharding (only meaningful with more than one data-parallel rank), recompute, sequence parallel
    and pipeline chunks. DeepSpeed checkpoints whole layers, so its recompute is on or off. A dense
    model (``moe=False``) has no expert axes to compare."""
    if not moe:
        config = config.model_copy(update={"ep": 1, "etp": 1})
    if engine in ("vllm", "sglang", "trtllm"):
        instance = max(config.tp, config.ep * config.etp)
        attention_tp = 1 if config.attention_data_parallel else config.tp
        return (instance, attention_tp, config.pp, config.ep, config.etp)
    zero = config.zero_stage if config.dp * config.cp > 1 else 0
    recompute = config.recompute != "none" if engine == "deepspeed" else config.recompute
    sequence_parallel = config.sequence_parallel and config.tp > 1 and engine != "deepspeed"
    return (
        config.dp,
        config.tp,
        config.pp,
        config.cp,
        config.ep,
        config.etp if config.ep > 1 else 1,
        zero,
        config.micro_batch_size,
        recompute,
        sequence_parallel,
        config.virtual_stages,
    )


def _is_flag(word: str) -> bool:
    """``--name`` or a short ``-tp`` (not a negative number)."""
    return word.startswith("-") and len(word) > 1 and not word[1].isdigit() and word[1] != "."


def flags(text: str, *, short: bool = False) -> dict[str, str | bool]:
    """``--flag value`` pairs of a shell command (line continuations and comments removed); with
    ``short``, single-dash ones too (``-tp 4``; only for the engine's own command line, where a
    shell's ``set -euo`` is not)."""
    lines = [
        line
        for line in text.replace("\\\n", " ").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]

    def is_flag(word: str) -> bool:
        return word.startswith("--") or (short and _is_flag(word))

    words = [w for line in lines for w in shlex.split(line) if "=" not in w or is_flag(w)]
    found: dict[str, str | bool] = {}
    for index, word in enumerate(words):
        if is_flag(word):
            if "=" in word:
                name, value = word.split("=", 1)
                found[name] = value
                continue
            following = words[index + 1] if index + 1 < len(words) else "--"
            found[word] = True if is_flag(following) else following
    return found


#: Every name an engine's parser takes for the flags read here, the canonical one first: vLLM's
#: short aliases (``vllm/engine/arg_utils.py``: ``-tp``, ``-pp``, ``-dp``, ``-ep``), SGLang's
#: long aliases and the abbreviations its documentation launches with (``server_args.py``
#: ``--tensor-parallel-size`` / ``--tp-size``, argparse's unique-prefix ``--tp``; likewise dp, ep
#: and pp), TensorRT-LLM's ``trtllm-serve`` options as spelled with underscores or dashes.
FLAG_ALIASES: dict[str, tuple[str, ...]] = {
    "--tensor-parallel-size": ("--tensor-parallel-size", "-tp"),
    "--pipeline-parallel-size": ("--pipeline-parallel-size", "-pp"),
    "--data-parallel-size": ("--data-parallel-size", "-dp"),
    "--enable-expert-parallel": ("--enable-expert-parallel", "-ep"),
    "--tp-size": ("--tp-size", "--tensor-parallel-size", "--tp"),
    "--dp-size": ("--dp-size", "--data-parallel-size", "--dp"),
    "--ep-size": ("--ep-size", "--expert-parallel-size", "--ep"),
    "--pp-size": ("--pp-size", "--pipeline-parallel-size", "--pp"),
    "--tp_size": ("--tp_size", "--tp-size"),
    "--ep_size": ("--ep_size", "--ep-size"),
    "--pp_size": ("--pp_size", "--pp-size"),
}


def _aliased(found: dict[str, str | bool], name: str) -> str | bool | None:
    """The value ``found`` holds for ``name`` under any of its aliases (``FLAG_ALIASES``); a
    flag given twice under two names must agree."""
    values = {alias: found[alias] for alias in FLAG_ALIASES.get(name, (name,)) if alias in found}
    if len(set(map(str, values.values()))) > 1:
        raise ValueError(f"{' and '.join(values)} disagree ({list(values.values())}); give one")
    return next(iter(values.values()), None)


def _number(found: dict[str, str | bool], name: str, default: int) -> int:
    value = _aliased(found, name)
    value = default if value is None else value
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} ({value!r}) must be an integer") from None


def _launch(files: dict[str, str], marker: str) -> dict[str, str | bool]:
    """The ``--flags`` of the first file that runs ``marker`` (a script may set them in variables
    on other lines), and the short single-dash ones of the command line itself (continuations
    joined)."""
    for text in files.values():
        if marker not in text:
            continue
        found = flags(text)
        for line in text.replace("\\\n", " ").splitlines():
            if marker in line and not line.lstrip().startswith("#"):
                found.update(flags(line, short=True))
                break
        return found
    raise ValueError(f"no launch command containing {marker!r} among {list(files)}")


def _serving(
    *, instance: int, attention_tp: int, pp: int, ep: int, etp: int, instances: int = 1
) -> ParallelConfig:
    adp = attention_tp == 1 and instance > 1
    tp = instance if adp else attention_tp
    return ParallelConfig(
        tp=tp,
        pp=pp,
        dp=instances * instance // tp,
        ep=ep,
        etp=etp,
        attention_data_parallel=adp,
    )


def _vllm(files: dict[str, str]) -> ParallelConfig:
    found = _launch(files, "vllm serve")
    attention_tp, replicas = (
        _number(found, "--tensor-parallel-size", 1),
        _number(found, "--data-parallel-size", 1),
    )
    instance = attention_tp * replicas
    ep, etp = (instance, 1) if _aliased(found, "--enable-expert-parallel") else (1, instance)
    return _serving(
        instance=instance,
        attention_tp=attention_tp,
        pp=_number(found, "--pipeline-parallel-size", 1),
        ep=ep,
        etp=etp,
    )


def _sglang(files: dict[str, str]) -> ParallelConfig:
    found = _launch(files, "sglang.launch_server")
    instance, ep = _number(found, "--tp-size", 1), _number(found, "--ep-size", 1)
    # an all-to-all backend runs the experts over the whole instance: SGLang sets ep-size to
    # tp-size with it (``data/engine_rules.json`` "sglang-tbo-needs-a2a"; the older
    # --enable-deepep-moe alike)
    backend = str(found.get("--moe-a2a-backend", "none"))
    if (backend not in ("none", "True")) or found.get("--enable-deepep-moe"):
        ep = instance
    replicas = _number(found, "--attn-dp-size", 1)
    if found.get("--enable-dp-attention"):
        replicas = _number(found, "--dp-size", 1)
    return _serving(
        instance=instance,
        attention_tp=instance // replicas,
        pp=_number(found, "--pp-size", 1),
        ep=ep,
        etp=instance // ep,
    )


def _trtllm(files: dict[str, str]) -> ParallelConfig:
    found = _launch(files, "trtllm-serve")
    instance, ep = _number(found, "--tp_size", 1), _number(found, "--ep_size", 1)
    options = "\n".join(text for name, text in files.items() if name.endswith((".yaml", ".yml")))
    attention_dp = re.search(r"^enable_attention_dp:\s*true", options, re.MULTILINE) is not None
    return _serving(
        instance=instance,
        attention_tp=1 if attention_dp else instance,
        pp=_number(found, "--pp_size", 1),
        ep=ep,
        etp=instance // ep,
    )


def _world(found: dict[str, str | bool]) -> int:
    return _number(found, "--nnodes", 1) * _number(found, "--nproc-per-node", 1)


def _megatron(files: dict[str, str]) -> ParallelConfig:
    found = _launch(files, "pretrain_gpt.py")
    tp, pp, cp = (
        _number(found, name, 1)
        for name in (
            "--tensor-model-parallel-size",
            "--pipeline-model-parallel-size",
            "--context-parallel-size",
        )
    )
    virtual = 1
    if "--pipeline-model-parallel-layout" in found:
        virtual = max(1, str(found["--pipeline-model-parallel-layout"]).count("|") + 1) // pp
    zero = (
        3
        if found.get("--use-torch-fsdp2")
        else 1
        if found.get("--use-distributed-optimizer")
        else 0
    )
    recompute = str(found.get("--recompute-granularity", "none"))
    return ParallelConfig(
        tp=tp,
        pp=pp,
        cp=cp,
        dp=_world(found) // (tp * pp * cp),
        ep=_number(found, "--expert-model-parallel-size", 1),
        etp=_number(found, "--expert-tensor-parallel-size", tp),
        sequence_parallel=bool(found.get("--sequence-parallel")),
        zero_stage=zero,
        pipeline_schedule="interleaved_1f1b" if virtual > 1 else "1f1b",
        virtual_stages=virtual,
        micro_batch_size=_number(found, "--micro-batch-size", 1),
        recompute=recompute,
    )


def _torchtitan(files: dict[str, str]) -> ParallelConfig:
    found = _launch(files, "torchtitan.train")
    if "--job.config_file" in found:
        raise ValueError(
            "torchtitan TOML jobs (0.2.x) are read as exported; import the 0.3 command line"
        )

    def get(name: str, default: int) -> int:
        return _number(found, f"--parallelism.{name}", default)

    replicate, shard = (
        get("data_parallel_replicate_degree", 1),
        get("data_parallel_shard_degree", 1),
    )
    pp, cp = get("pipeline_parallel_degree", 1), get("context_parallel_degree", 1)
    # torchtitan shards over dp_shard x cp; "default" resolves to never with PP (its fsdp.py)
    policy = str(found.get("--parallelism.fsdp_reshard_after_forward", "default"))
    keeps = policy == "never" or (policy == "default" and pp > 1)
    zero = 0 if shard * cp == 1 else 2 if keeps else 3
    parts = _titan_parts(files)
    virtual = max(1, len(parts) // pp) if parts else 1
    schedule = {
        "GPipe": "gpipe",
        "1F1B": "1f1b",
        "Interleaved1F1B": "interleaved_1f1b",
    }[str(found.get("--parallelism.pipeline_parallel_schedule", "1F1B"))]
    tp = get("tensor_parallel_degree", 1)
    return ParallelConfig(
        tp=tp,
        pp=pp,
        cp=cp,
        dp=replicate * shard,
        ep=get("expert_parallel_degree", 1),
        etp=1,
        sequence_parallel=tp > 1 and "--parallelism.no-enable_sequence_parallel" not in found,
        zero_stage=zero,
        pipeline_schedule=schedule,
        virtual_stages=virtual,
        micro_batch_size=get("pipeline_parallel_microbatch_size", 1),
        recompute=_titan_recompute(files),
    )


def _titan_parts(files: dict[str, str]) -> list[list[str]]:
    """The words after ``--parallelism.module_fqns_per_model_part``, each a comma-joined part."""
    text = "\n".join(
        text
        for name, text in files.items()
        if "torchtitan.train" in text and not name.endswith(".md")
    )
    text = text.replace("\\\n", " ")
    words = shlex.split(
        "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    )
    if "--parallelism.module_fqns_per_model_part" not in words:
        return []
    parts = []
    for word in words[words.index("--parallelism.module_fqns_per_model_part") + 1 :]:
        if word.startswith("--") or ":" in word:
            break
        parts.append(word.split(","))
    return parts


def _titan_recompute(files: dict[str, str]) -> str:
    scripts = "\n".join(text for name, text in files.items() if not name.endswith(".md"))
    found = re.search(r"activation-checkpoint:(none|selective|full)", scripts)
    return found.group(1) if found else "none"


def _deepspeed(files: dict[str, str], *, pp: int, ep: int) -> ParallelConfig:
    config = next(
        (json.loads(text) for name, text in files.items() if name.endswith(".json")),
        None,
    )
    if config is None:
        raise ValueError(f"no DeepSpeed config (.json) among {list(files)}")
    world = (
        _world(_launch(files, "--deepspeed_config"))
        if any("--deepspeed_config" in t for t in files.values())
        else None
    )
    tp = int(config.get("tensor_parallel", {}).get("autotp_size", 1))
    micro, steps = (
        int(config["train_micro_batch_size_per_gpu"]),
        int(config.get("gradient_accumulation_steps", 1)),
    )
    dp = world // (tp * pp) if world else int(config["train_batch_size"]) // (micro * steps)
    recompute = "full" if "activation_checkpointing" in config else "none"
    return ParallelConfig(
        tp=tp,
        pp=pp,
        dp=dp,
        ep=ep,
        zero_stage=int(config["zero_optimization"]["stage"]),
        micro_batch_size=micro,
        recompute=recompute,
    )
