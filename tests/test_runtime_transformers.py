"""Plans applied to ``transformers``' own models equal the unsharded model.

The modules are transformers 5's (``LlamaForCausalLM``, ``Qwen3ForCausalLM``,
``Qwen3MoeForCausalLM``, ``MixtralForCausalLM``, ``DeepseekV3ForCausalLM``,
``NemotronForCausalLM``, ...), tiny and randomly initialised, called as transformers calls them
(keyword inputs, positions and the causal mask made at the model from the embedding's output,
routed experts fused into 3-D weights). Each
rank's logits and every gradient (after ``sync_gradients``) are compared with one unsharded
copy of the same model on the same tokens; an expert's gradient with the slice of the fused
weight's gradient it came from.
"""

from __future__ import annotations

import copy
import json
import re

import pytest

from autoparallel.testing import run_ranks
from cost_model import ModelSpec, ParallelConfig

VOCAB = 128  # autoparallel.testing.TINY_SHAPE's
#: The cases' architectures (``autoparallel.testing.TINY_TRANSFORMERS``)
CASES = {
    "llama": "llama",
    "qwen3": "qwen3",
    "qwen3-moe": "qwen3_moe",
    "qwen2-moe": "qwen2_moe",
    "mixtral": "mixtral",
    "gpt-oss": "gpt_oss",
    "llama4": "llama4_text",
    "minimax-m2": "minimax_m2",
    "glm4-moe": "glm4_moe",
    "qwen3-next": "qwen3_next",
    "deepseek-v3": "deepseek_v3",
    "nemotron": "nemotron",
}
#: (case, parallel config) pairs run on 2 ranks: tensor parallel with and without sequence
#: parallel, expert parallel over data-parallel ranks and over tensor-parallel ones, expert TP
PLANS = [
    ("llama", {"tp": 2, "sequence_parallel": True}),
    ("qwen3", {"tp": 2}),
    ("qwen3-moe", {"dp": 2, "ep": 2}),
    ("qwen3-moe", {"tp": 2, "etp": 2, "sequence_parallel": True}),
    ("mixtral", {"tp": 2, "sequence_parallel": True}),
    ("qwen2-moe", {"tp": 2, "sequence_parallel": True}),  # a gated shared expert, flat tokens
    ("gpt-oss", {"dp": 2, "ep": 2}),  # biased experts, interleaved gate/up, clamped GLU
    ("gpt-oss", {"tp": 2, "ep": 2, "sequence_parallel": True}),  # attention sinks over tp
    ("llama4", {"tp": 2, "sequence_parallel": True}),  # every token through every expert
    ("llama4", {"dp": 2, "ep": 2}),
    ("minimax-m2", {"tp": 2, "sequence_parallel": True}),  # query/key norms over all heads
    ("glm4-moe", {"tp": 2, "ep": 2, "sequence_parallel": True}),  # biased GQA, DeepSeek's MoE
    ("qwen3-next", {"tp": 2, "ep": 2}),  # linear attention (whole on each rank) beside full
    ("deepseek-v3", {"tp": 2, "ep": 2}),
    ("deepseek-v3", {"tp": 2, "sequence_parallel": True}),
    ("nemotron", {"tp": 2, "sequence_parallel": True}),  # squared-ReLU MLP: no gate projection
]


def _build(case: str, layers: int | None = None):
    import torch

    from autoparallel.testing import TINY_TRANSFORMERS, tiny_transformers_model

    if layers is None:
        layers = 3 if case == "deepseek-v3" else 2  # one dense layer, then MoE layers
    model, config = tiny_transformers_model(CASES[case], layers=layers)
    # gpt-oss's sinks are in its eager attention only
    config._attn_implementation = "eager" if case == "gpt-oss" else "sdpa"
    with torch.no_grad():  # a routing bias of its own, so that group-limited routing is exercised
        for module in model.modules():
            if hasattr(module, "e_score_correction_bias"):
                module.e_score_correction_bias.normal_()
    architecture = TINY_TRANSFORMERS[CASES[case]][1]
    return model, {**config.to_dict(), "architectures": [architecture]}


def _applied(case: str, fields: dict, *, workload=None, layers: int | None = None, **apply):
    """(reference, model, applied): the case's model, a copy of it, and the copy under the plan
    of ``fields`` for the catalog's reading of the model's own ``config.json``."""
    import tempfile
    from pathlib import Path

    import autoparallel as ap
    from autoparallel.testing import plan_for_config
    from cost_model import ParallelConfig

    reference, config = _build(case, layers)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.json"
        path.write_text(json.dumps(config))
        spec = ap.get_model(str(path))
    plan = plan_for_config(spec, ParallelConfig(**fields), workload=workload)
    model = copy.deepcopy(reference)
    return reference, model, ap.apply_plan(model, plan, **apply)


def _fused_gradient(whole: dict, base: str, index: int, part: str, kind: str):
    """The gradient of expert ``index``'s ``part`` projection ``kind`` (weight, bias) within the
    fused weights of ``base``: gate rows then up rows (Qwen, Mixtral, DeepSeek), or gpt-oss's
    interleaved, transposed columns with their biases."""
    gate_up = whole[f"{base}.gate_up_proj"].grad[index]
    down = whole[f"{base}.down_proj"].grad[index]
    if f"{base}.gate_up_proj_bias" in whole:  # gpt-oss: [H, 2I] interleaved, down [I, H]
        if kind == "bias":
            gate_up = whole[f"{base}.gate_up_proj_bias"].grad[index]
            columns = {"gate": gate_up[::2], "up": gate_up[1::2]}
            return columns.get(part, whole[f"{base}.down_proj_bias"].grad[index])
        return {"gate": gate_up[:, ::2].T, "up": gate_up[:, 1::2].T, "down": down.T}[part]
    if down.shape[0] * 2 == gate_up.shape[1] and down.shape[1] == gate_up.shape[0]:
        gate_up, down = gate_up.T, down.T  # Llama 4's [H, 2I] and [I, H]
    width = gate_up.shape[0] // 2
    return {"gate": gate_up[:width], "up": gate_up[width:], "down": down}[part]


def _gradient_errors(model, reference) -> tuple[dict[str, float], int]:
    """Each parameter's largest gradient difference relative to the reference's largest, and
    how many parameters are split (DTensors or experts held per rank)."""
    from torch.distributed.tensor import DTensor

    whole = dict(reference.named_parameters())
    errors, split = {}, 0
    for name, parameter in model.named_parameters():
        grad = parameter.grad
        grad = grad.full_tensor() if isinstance(grad, DTensor) else grad
        split += isinstance(parameter, DTensor)
        expert = re.fullmatch(r"(.*\.experts)\.(\d+)\.(gate|up|down)_proj\.(weight|bias)", name)
        if expert is None:
            expected = whole[name].grad
            candidates = [expected]
        else:  # the slice of the fused weight it came from, or one etp part of it
            base, index, part, kind = expert.groups()
            expected = _fused_gradient(whole, base, int(index), part, kind)
            dim = 1 if part == "down" and kind == "weight" else 0
            candidates = expected.chunk(expected.shape[dim] // grad.shape[dim], dim=dim)
            split += 1
        scale = expected.abs().max().clamp_min(1e-12)
        errors[name] = min(float((grad - c).abs().max() / scale) for c in candidates)
    return errors, split


def _rank(rank: int, world_size: int, plans: list) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from torch.distributed.tensor import DTensor

    results = []
    tokens = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    for case, fields in plans:
        reference, model, applied = _applied(case, fields)
        expected = reference(tokens).logits
        F.cross_entropy(expected.flatten(0, 1), tokens.flatten()).backward()
        got = applied.module(tokens).logits
        got = got.full_tensor() if isinstance(got, DTensor) else got
        F.cross_entropy(got.flatten(0, 1), tokens.flatten()).backward()
        applied.sync_gradients()
        errors, split = _gradient_errors(model, reference)
        errors["logits"] = float((got - expected).abs().max() / expected.abs().max())
        results.append({"case": case, "fields": fields, "errors": errors, "split": split})
    return results


@pytest.mark.distributed
def test_transformers_models_equal_their_unsharded_selves() -> None:
    for results in run_ranks(_rank, 2, args=(PLANS,), timeout_s=240):
        for result in results:
            errors = result["errors"]
            worst = max(errors, key=errors.get)
            assert errors[worst] <= 1e-5, (result["case"], result["fields"], worst, errors[worst])
            assert result["split"] >= 6, result  # the plan split weights: it was applied


def test_fused_experts_with_weights_of_their_own_are_refused() -> None:
    """Fused experts holding weights the per-expert forms do not read (here a bias on
    Qwen3-MoE's gate/up weights, outside gpt-oss's layout) are not split: an error naming the
    module and the weight."""
    import torch

    from autoparallel.runtime._fused_experts import unfuse_experts

    model, _ = _build("qwen3-moe")
    experts = model.model.layers[0].mlp.experts
    experts.gate_up_proj_bias = torch.nn.Parameter(torch.zeros(4, 64))
    with pytest.raises(
        ValueError,
        match=r"model\.layers\.0\.mlp\.experts \(Qwen3MoeExperts\) holds \['gate_up_proj_bias'\]",
    ):
        unfuse_experts(model)


def test_a_fused_layout_the_experts_do_not_compute_is_refused() -> None:
    """The per-expert form is checked against the fused module: swapping the halves is caught."""
    import torch

    from autoparallel.runtime._fused_experts import unfuse_experts

    reference, _ = _build("qwen3-moe")
    experts = reference.model.layers[0].mlp.experts
    assert isinstance(experts, torch.nn.Module)
    original = type(experts).forward

    def up_then_gate(self, hidden_states, top_k_index, top_k_weights):
        half = self.gate_up_proj.shape[1] // 2
        swapped = torch.cat((self.gate_up_proj[:, half:], self.gate_up_proj[:, :half]), dim=1)
        saved = self.gate_up_proj.data
        self.gate_up_proj.data = swapped
        try:
            return original(self, hidden_states, top_k_index, top_k_weights)
        finally:
            self.gate_up_proj.data = saved

    experts.forward = up_then_gate.__get__(experts)
    with pytest.raises(ValueError, match="gate rows then up rows"):
        unfuse_experts(reference)


def test_a_config_saved_by_transformers_reads() -> None:
    """transformers 5 saves Qwen3-MoE's expert count as num_local_experts and the weights'
    dtype as dtype; the catalog's reading of the released config.json gives the same model."""
    import autoparallel as ap
    from cost_model._hf_config import parse_hf_config
    from cost_model._serving_precision import checkpoint_dtype

    released = ap.get_model("qwen3-30b-a3b")
    _, saved = _build("qwen3-moe")
    assert "num_experts" not in saved and saved["num_local_experts"] == 4
    assert parse_hf_config(saved, name="saved").moe.num_routed_experts == 4
    assert released.moe.num_routed_experts == 128
    assert checkpoint_dtype({"dtype": "float16"}) == "fp16"
    assert checkpoint_dtype({"torch_dtype": "float32", "dtype": "float16"}) == "fp32"


def _rebalanced_rank(rank: int, world_size: int) -> dict:
    import torch

    from autoparallel.plan import ExpertPlacement
    from autoparallel.runtime._rebalance import rebalance_experts

    reference, model, applied = _applied("qwen3-moe", {"dp": 2, "ep": 2})
    before = sorted(int(key) for key in model.model.layers[0].mlp.experts)
    # experts 0 and 1 on rank 0, 2 and 3 on rank 1 -> 0 and 2 on rank 0, 1 and 3 on rank 1
    moved = ExpertPlacement(num_experts=4, ep=2, expert_to_ranks=((0,), (1,), (0,), (1,)))
    rebalance_experts(applied.expert_parallel[0], placement=moved)
    after = sorted(int(key) for key in model.model.layers[0].mlp.experts)
    tokens = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1 + rank))
    with torch.no_grad():
        expected, got = reference(tokens).logits, applied.module(tokens).logits
    return {
        "before": before,
        "after": after,
        "error": float((got - expected).abs().max() / expected.abs().max()),
    }


@pytest.mark.distributed
def test_fused_experts_move_between_ranks_live() -> None:
    """A live re-placement (``Retuner``'s expert moves) of a transformers model's experts: each
    rank holds the experts the new placement names, and the model still computes its own output
    (each rank's tokens reach the experts where they now are)."""
    results = run_ranks(_rebalanced_rank, 2, timeout_s=120)
    assert [r["before"] for r in results] == [[0, 1], [2, 3]]
    assert [r["after"] for r in results] == [[0, 2], [1, 3]]
    for result in results:
        assert result["error"] <= 1e-5, result


def _pipelined_rank(rank: int, world_size: int, case: str, layers: int, fields: dict) -> dict:
    import torch
    import torch.nn.functional as F

    from cost_model import Training

    def loss_fn(logits, targets):
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    workload = Training(sequence_length_tokens=8, global_batch_sequences=4)
    reference, model, applied = _applied(
        case, fields, workload=workload, layers=layers, loss_fn=loss_fn, num_micro_batches=2
    )
    tokens = torch.randint(0, VOCAB, (4, 8), generator=torch.Generator().manual_seed(1))
    logits = reference(tokens).logits
    expected = torch.stack([loss_fn(logits[i : i + 2], tokens[i : i + 2]) for i in (0, 2)]).mean()
    expected.backward()
    step = applied.pipeline.step(tokens, targets=tokens)
    applied.sync_gradients()
    errors, split = _gradient_errors(model, reference)
    if step.loss is not None:  # the last stage's
        errors["loss"] = float((step.loss - expected).abs() / expected.abs())
    layers_held = sorted(int(key) for key in model.model.layers)
    return {"errors": errors, "split": split, "layers": layers_held, "last": step.loss is not None}


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("case", "layers", "fields", "world"),
    [
        ("qwen3-moe", 2, {"pp": 2, "pipeline_schedule": "1f1b"}, 2),
        (
            "qwen3",
            4,
            {
                "pp": 2,
                "tp": 2,
                "sequence_parallel": True,
                "virtual_stages": 2,
                "pipeline_schedule": "interleaved_1f1b",
            },
            4,
        ),
    ],
    ids=["qwen3-moe-pp2", "qwen3-pp2-interleaved-tp2-sp"],
)
def test_transformers_models_run_as_pipeline_stages(case, layers, fields, world) -> None:
    """A transformers causal LM cut into pipeline chunks (its own backbone forward on each,
    positions and mask from the whole sequence) trains as the unsharded model does: the mean
    micro-batch loss and every gradient."""
    results = run_ranks(_pipelined_rank, world, args=(case, layers, fields), timeout_s=240)
    held = {tuple(result["layers"]) for result in results}
    assert len(held) == 2 and sorted(i for h in held for i in h) == list(range(layers))
    assert sum(result["last"] for result in results) == world // 2
    for result in results:
        errors = result["errors"]
        worst = max(errors, key=errors.get)
        assert errors[worst] <= 1e-5, (case, fields, worst, errors[worst])


def _generating_rank(rank: int, world_size: int, plans: list) -> list[bool]:
    import torch

    from cost_model import Inference

    same = []
    prompts = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    greedy = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    for case, fields in plans:
        workload = Inference(prompt_tokens=8, output_tokens=8)
        reference, _, applied = _applied(case, fields, workload=workload)
        with torch.no_grad():
            expected = reference.generate(prompts, **greedy)
            got = applied.module.generate(prompts, **greedy)
        same.append(bool(torch.equal(expected, got)))
    return same


@pytest.mark.distributed
def test_transformers_generate_the_unsharded_models_tokens() -> None:
    """``generate`` (transformers' own loop and KV cache) on the applied models gives the greedy
    tokens of the unsharded ones: GQA heads and MLA heads split over tp, experts over ep, and
    attention data parallel beside experts over ep (the serving layout of DeepSeek's)."""
    plans = [
        ("qwen3", {"tp": 2}),
        ("qwen3-moe", {"dp": 2, "ep": 2}),
        ("deepseek-v3", {"tp": 2}),
        ("deepseek-v3", {"tp": 2, "attention_data_parallel": True, "ep": 2}),  # serving's layout
    ]
    for same in run_ranks(_generating_rank, 2, args=(plans,), timeout_s=240):
        assert same == [True] * len(plans)


def _context_rank(rank: int, world_size: int, plans: list) -> list[dict]:
    import torch
    import torch.nn.functional as F

    from cost_model import Training

    results = []
    tokens = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    workload = Training(sequence_length_tokens=8, global_batch_sequences=2)
    for case, fields in plans:
        reference, model, applied = _applied(case, fields, workload=workload)
        expected = reference(tokens).logits
        F.cross_entropy(expected.flatten(0, 1), tokens.flatten()).backward()
        local, targets = applied.shard_inputs(tokens, tokens)  # chunks r and 2*cp-1-r
        got = applied.module(local).logits
        F.cross_entropy(got.flatten(0, 1), targets.flatten()).backward()
        applied.sync_gradients()
        errors, _ = _gradient_errors(model, reference)
        whole = applied.gather_sequence(got)
        errors["logits"] = float((whole - expected).abs().max() / expected.abs().max())
        results.append({"case": case, "fields": fields, "errors": errors})
    return results


@pytest.mark.distributed
def test_transformers_models_split_their_sequences_over_cp() -> None:
    """Context parallel on transformers' attention (its attention function, global positions):
    GQA, MLA, and experts over the cp ranks, equal to the unsharded model."""
    plans = [
        ("qwen3", {"cp": 2}),
        ("deepseek-v3", {"cp": 2}),
        ("qwen3-moe", {"cp": 2, "ep": 2}),
    ]
    for results in run_ranks(_context_rank, 2, args=(plans,), timeout_s=240):
        for result in results:
            errors = result["errors"]
            worst = max(errors, key=errors.get)
            assert errors[worst] <= 1e-5, (result["case"], result["fields"], worst, errors[worst])


def test_context_parallel_refuses_sliding_window_attention() -> None:
    from autoparallel.runtime._transformers_context import apply_transformers_context
    from autoparallel.testing import tiny_transformers_model

    model, _ = tiny_transformers_model(
        "qwen3",
        layers=2,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=4,
        use_sliding_window=True,
    )
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn .* sliding window of 4"):
        apply_transformers_context([model], context=None)


def test_sequence_parallel_refuses_linear_attention_it_does_not_gather_for() -> None:
    """Qwen3-Next's linear-attention layers mix the sequence and stay whole on every rank: under
    sequence parallel they would read a shard only, so the plan is refused by name."""
    from autoparallel.runtime._apply import check_plan_fits
    from autoparallel.testing import plan_for_config

    model, config = _build("qwen3-next")
    spec = ModelSpec.from_hf_config(config)
    plan = plan_for_config(spec, ParallelConfig(tp=2, sequence_parallel=True))
    with pytest.raises(ValueError, match=r"model\.layers\.0\.linear_attn mixes the sequence"):
        check_plan_fits(model, plan)
