"""Model families beyond one attention kind per model: interleaved full and local layers
(gpt-oss, Step-3.7, Llama 4), Gated DeltaNet layers of their own shape (Qwen3.5, Qwen3-Next),
Mamba-2 layers with attention beside some of them (Nemotron-H),
DeepSeek Sparse Attention's indexer (DeepSeek-V3.2, GLM-5),
multimodal checkpoints parsed as their language model, and the refusals of what one layer
shape cannot describe. Every rule is checked against a brute-force sum over layers and
positions, and the catalog entries against their publishers' parameter counts."""

from __future__ import annotations

import numpy as np
import pytest

from autoparallel import get_model
from autoparallel._catalog import catalog_config
from cost_model import Inference, ModelSpec, estimate_inference_table, table_from_columns
from cost_model._inference_ops import kv_bytes_per_sequence_layer
from cost_model._pricing import mean_attended_tokens
from cost_model._serving_columns import PHASE_CODES
from cost_model._serving_precision import checkpoint_dtype, checkpoint_dtype_by_part
from topology import get_preset

GPT_OSS = get_model("gpt-oss-120b")
SCOUT = get_model("llama-4-scout")
DSV32 = get_model("deepseek-v3.2")
DSV3 = get_model("deepseek-v3")


def _per_layer_keys(model: ModelSpec, position: int) -> list[float]:
    """Keys a query at ``position`` (1-based) attends to in each layer, from the config's own
    layer list: full layers all of them, the others their window or chunk."""
    a = model.attention
    full_layers = round(a.full_layer_fraction * model.num_layers)
    keys = []
    for layer in range(model.num_layers):
        if layer < full_layers:
            keys.append(float(position))
        elif a.variant == "chunked":
            keys.append(float((position - 1) % a.window_tokens + 1))
        else:
            keys.append(float(min(position, a.window_tokens)))
    return keys


@pytest.mark.parametrize("model", [GPT_OSS, SCOUT], ids=["gpt-oss", "llama-4-scout"])
@pytest.mark.parametrize("sequence", [1, 100, 129, 4096, 8193, 20_000])
def test_mean_keys_of_interleaved_layers_match_a_sum_over_layers_and_positions(
    model: ModelSpec, sequence: int
) -> None:
    brute = np.mean([np.mean(_per_layer_keys(model, i)) for i in range(1, sequence + 1)])
    got = float(mean_attended_tokens(attention=model.attention, sequence_tokens=sequence))
    assert got == pytest.approx(brute, rel=1e-9)
    assert model.attention.attended_tokens(sequence) == pytest.approx(
        np.mean(_per_layer_keys(model, sequence))
    )


@pytest.mark.parametrize("model", [GPT_OSS, SCOUT], ids=["gpt-oss", "llama-4-scout"])
@pytest.mark.parametrize("context", [50, 128, 5000, 100_000])
def test_cache_of_interleaved_layers_keeps_only_the_window_of_local_layers(
    model: ModelSpec, context: int
) -> None:
    a = model.attention
    per_token_layer = model.kv_cache_elements_per_token_per_layer() * 2  # bf16
    full_layers = round(a.full_layer_fraction * model.num_layers)
    local_layers = model.num_layers - full_layers
    brute = per_token_layer * (full_layers * context + local_layers * min(context, a.window_tokens))
    assert model.kv_cache_bytes(context, "bf16") == pytest.approx(brute)
    # past the window, one more token grows the full layers' cache only
    assert model.kv_cache_bytes_per_token("bf16") == full_layers * per_token_layer
    vectorized = kv_bytes_per_sequence_layer(model, np.array([float(context)]), 2.0, block_tokens=1)
    assert model.num_layers * vectorized[0] == pytest.approx(brute)


def test_linear_layers_interleaved_with_full_ones_keep_a_state_plus_the_full_layers_cache() -> None:
    base = get_model("qwen3-30b-a3b")
    hybrid = base.model_copy(
        update={
            "attention": base.attention.model_copy(
                update={"variant": "linear", "full_layer_fraction": 0.25}
            )
        }
    )
    a = hybrid.attention
    state = a.num_heads * a.qk_head_dim * a.value_head_dim * 2
    per_token = hybrid.kv_cache_elements_per_token_per_layer() * 2
    for context in (1, 1000, 50_000):
        brute = 12 * per_token * context + 36 * state  # 48 layers, a quarter full
        assert hybrid.kv_cache_bytes(context, "bf16") == pytest.approx(brute)
        per_layer = kv_bytes_per_sequence_layer(hybrid, np.array([float(context)]), 2.0, 1)
        assert 48 * per_layer[0] == pytest.approx(brute)


def test_gpt_oss_is_parsed_with_its_published_shape_and_released_precision() -> None:
    a = GPT_OSS.attention
    assert (a.variant, a.window_tokens, a.full_layer_fraction) == ("sliding_window", 128, 0.5)
    assert GPT_OSS.moe is not None and (GPT_OSS.moe.num_routed_experts, GPT_OSS.moe.top_k) == (
        128,
        4,
    )
    # OpenAI, gpt-oss-120b & gpt-oss-20b model card (arXiv:2508.10925) Table 1: 116.83B total,
    # 5.13B active per token counted without the 0.58B embedding (the unembedding counted).
    assert GPT_OSS.num_parameters / 1e9 == pytest.approx(116.83, rel=1e-3)
    embedding = GPT_OSS.vocab_size * GPT_OSS.hidden_size
    assert (GPT_OSS.num_active_parameters - embedding) / 1e9 == pytest.approx(5.13, rel=0.01)
    # MXFP4 experts; attention, router, embedding and head kept in bf16 (modules_to_not_convert)
    config = catalog_config("gpt-oss-120b")
    assert checkpoint_dtype(config) == "fp4"
    assert checkpoint_dtype_by_part(config) == {
        "attention": "bf16",
        "router": "bf16",
        "embedding": "bf16",
        "lm_head": "bf16",
    }


def test_layer_types_text_and_wrong_lengths() -> None:
    config = dict(catalog_config("gpt-oss-120b"))
    as_text = {**config, "layer_types": str(config["layer_types"])}
    assert ModelSpec.from_hf_config(as_text).attention == GPT_OSS.attention
    with pytest.raises(ValueError, match="'layer_types' has 35 entries; 'num_hidden_layers' is 36"):
        ModelSpec.from_hf_config({**config, "layer_types": config["layer_types"][:-1]})
    with pytest.raises(ValueError, match="layer_types.*'linear_attention'"):
        ModelSpec.from_hf_config(
            {**config, "layer_types": ["linear_attention"] + config["layer_types"][1:]}
        )


def test_llama4_scout_chunks_three_layers_in_four_and_every_layer_is_moe() -> None:
    a = SCOUT.attention
    assert (a.variant, a.window_tokens, a.full_layer_fraction) == ("chunked", 8192, 0.25)
    assert SCOUT.moe is not None and SCOUT.moe.num_dense_layers == 0
    assert (SCOUT.moe.num_routed_experts, SCOUT.moe.top_k, SCOUT.moe.num_shared_experts) == (
        16,
        1,
        1,
    )
    # Meta's Llama 4 model card: 17B active parameters (109B total with the vision encoder)
    assert SCOUT.num_active_parameters / 1e9 == pytest.approx(17.0, rel=0.02)
    maverick = {
        **catalog_config("llama-4-scout"),
        "text_config": {
            **catalog_config("llama-4-scout")["text_config"],
            "interleave_moe_layer_step": 2,
        },
    }
    interleaved = ModelSpec.from_hf_config(maverick)
    assert interleaved.moe is not None and interleaved.moe.moe_layer_step == 2
    assert [interleaved.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    odd = {**maverick["text_config"], "moe_layers": [1, 2, 5]}
    with pytest.raises(ValueError, match="moe_layers.*pattern other than a leading block"):
        ModelSpec.from_hf_config({**maverick, "text_config": odd})


def test_maverick_alternates_dense_and_moe_layers_on_every_pipeline_stage() -> None:
    from cost_model._stages import stage_layout

    maverick = get_model("llama-4-maverick")
    # Meta's Llama 4 model card: 400B total, 17B active (the vision encoder included)
    assert maverick.num_parameters / 1e9 == pytest.approx(400.0, rel=0.01)
    assert maverick.num_moe_layers == maverick.num_dense_ffn_layers == 24
    layout = stage_layout(model=maverick, pp=np.array([4]), virtual_stages=np.array([1]))
    # 12 layers per rank, half of them MoE on every rank (not 24 dense layers on the first two)
    assert layout.layers[:, 0].tolist() == [12, 12, 12]
    assert layout.moe_layers[:, 0].tolist() == [6, 6, 6]


def test_megatron_export_writes_the_interleaved_moe_layer_pattern() -> None:
    from autoparallel.export._common import Recipe
    from autoparallel.export._megatron import _megatron_model

    recipe = Recipe(
        engine="megatron", version="0", model_path="x", model_known=False, devices_per_host=8
    )
    dropped: list[str] = []
    args = _megatron_model(get_model("llama-4-maverick"), recipe, [], dropped=dropped)
    freq = args[args.index("--moe-layer-freq") + 1]
    assert freq == "[" + ",".join(["0,1"] * 24) + "]"
    # the chunked attention it cannot build is reported, not silently replaced
    assert dropped and "attention variant 'chunked'" in dropped[0]
    clean: list[str] = []
    _megatron_model(get_model("deepseek-v3"), recipe, [], dropped=clean)
    assert clean == []


INDEXER_PARAMETERS = (
    1536 * 64 * 128  # wq_b from the 1536-wide query latent to 64 heads of 128
    + 7168 * 128  # wk
    + 2 * 128  # the key's LayerNorm
    + 7168 * 64  # weights_proj
)


def test_dsa_indexer_weights_and_cache_are_counted_per_layer() -> None:
    a = DSV32.attention
    assert (a.variant, a.topk_tokens, a.indexer_heads, a.indexer_head_dim) == (
        "sparse_topk",
        2048,
        64,
        128,
    )
    assert DSV32.num_parameters - DSV3.num_parameters == 61 * INDEXER_PARAMETERS
    # FP8 keys of 128 elements and one FP32 scale per 128 in every layer
    assert DSV32.kv_cache_bytes_per_token("bf16") - DSV3.kv_cache_bytes_per_token("bf16") == (
        61 * (128 + 4)
    )
    assert DSV32.kv_cache_bytes(100_000, "bf16") == pytest.approx(
        100_000 * DSV32.kv_cache_bytes_per_token("bf16")
    )


def test_dsa_attention_flops_add_the_indexer_over_the_whole_context() -> None:
    a = DSV32.attention
    per_key = 2 * a.num_heads * (a.qk_head_dim + a.value_head_dim)
    for context in (1000, 2048, 131_072):
        expected = 61 * (per_key * min(context, 2048) + 2 * 64 * 128 * context)
        assert DSV32.attention_flops_per_token(context) == pytest.approx(expected)


def _decode_attention_s(model: ModelSpec, context: int) -> float:
    cluster = get_preset("dgx-h200")
    table = table_from_columns(
        tp=8, ep=8, batch_size=16, phase=PHASE_CODES["decode"], attention_data_parallel=True
    )
    workload = Inference(prompt_tokens=context, output_tokens=256, weight_dtype="fp8")
    out = estimate_inference_table(model=model, cluster=cluster, workload=workload, table=table)
    return float(out["time.decode_attention"][0])


def test_dsa_decode_pays_the_indexer_scan_that_grows_with_context() -> None:
    no_indexer = DSV32.model_copy(
        update={
            "attention": DSV32.attention.model_copy(
                update={"indexer_heads": 0, "indexer_head_dim": 0}
            )
        }
    )
    short, long = _decode_attention_s(DSV32, 8192), _decode_attention_s(DSV32, 65_536)
    capped_short = _decode_attention_s(no_indexer, 8192)
    capped_long = _decode_attention_s(no_indexer, 65_536)
    # top-k alone reads the same 2048 keys at any context; the indexer reads every key's
    # 132 bytes, so the decode step's attention keeps growing
    assert capped_long == pytest.approx(capped_short, rel=0.02)
    assert long > short * 1.5
    assert long > capped_long * 1.2


@pytest.mark.parametrize(
    ("catalog", "wrapper", "text_type"),
    [
        ("kimi-k2", "kimi_k25", None),
        ("qwen3-30b-a3b", "qwen3_vl_moe", "qwen3_vl_moe_text"),
    ],
)
def test_multimodal_checkpoints_parse_as_their_language_model(
    catalog: str, wrapper: str, text_type: str | None
) -> None:
    text = dict(catalog_config(catalog))
    if text_type is not None:
        text["model_type"] = text_type
    else:
        text.pop("model_type")  # the wrapper's default text type applies
    parsed = ModelSpec.from_hf_config({"model_type": wrapper, "text_config": text}, name="x")
    # the same layers; the model class is the wrapper's (none given here), not the text model's
    shape = {"name", "architecture"}
    assert parsed.model_dump(exclude=shape) == get_model(catalog).model_dump(exclude=shape)
    assert parsed.architecture is None
    with pytest.raises(ValueError, match="'text_config'.*must be an object"):
        ModelSpec.from_hf_config({"model_type": wrapper})


@pytest.mark.parametrize(
    ("model_type", "reason"),
    [
        ("gemma4", "head sizes"),
        ("deepseek_v4", "compressed attention"),
    ],
)
def test_models_whose_layers_differ_in_shape_are_refused_by_name(
    model_type: str, reason: str
) -> None:
    with pytest.raises(ValueError, match=f"model_type \\('{model_type}'\\).*{reason}"):
        ModelSpec.from_hf_config({"model_type": model_type, "num_hidden_layers": 4})


def test_new_catalog_models_plan_a_serving_layout(tmp_path) -> None:
    from autoparallel.cli import main

    for name in ("gpt-oss-120b", "deepseek-v3.2"):
        plan = tmp_path / f"{name}.json"
        assert main(["plan", "--model", name, "--cluster", "dgx-h200", "--output", str(plan)]) == 0
        assert name in plan.read_text()


QWEN35 = get_model("qwen3.5-397b-a17b")


def test_qwen35_interleaves_gated_deltanet_layers_with_gated_full_attention() -> None:
    a = QWEN35.attention
    assert (a.variant, a.full_layer_fraction, a.output_gate) == ("linear", 0.25, True)
    assert (a.linear_key_heads, a.linear_value_heads) == (16, 64)
    # Qwen3.5 model card: 17B activated, printed to the billion
    assert abs(QWEN35.num_active_parameters / 1e9 - 17.0) < 0.5
    hidden = 4096
    deltanet = (
        hidden * (2 * 16 * 128 + 2 * 64 * 128 + 2 * 64)  # q, k, v, z, beta and alpha
        + (2 * 16 * 128 + 64 * 128) * 4  # the depthwise convolution over q, k, v
        + 2 * 64  # A_log, dt_bias
        + 128  # the gated RMSNorm of a value head
        + 64 * 128 * hidden  # out_proj
    )
    gated = (
        hidden * 32 * 256 * 2
        + 2 * hidden * 2 * 256
        + 32 * 256 * hidden  # q+gate, k, v, o
        + 2 * 256  # the query and key norms of a head (Qwen3NextAttention q_norm, k_norm)
    )
    assert a.qk_norm
    assert QWEN35.parameter_breakdown()["attention"] == 45 * deltanet + 15 * gated


def test_qwen35_cache_is_fifteen_full_layers_plus_a_fixed_state_per_linear_layer() -> None:
    per_token_layer = 2 * 2 * 256 * 2  # K and V of 2 KV heads of 256, bf16
    state = 64 * 128 * 128 + 3 * (2 * 16 * 128 + 64 * 128)  # S per value head + conv inputs
    assert QWEN35.kv_cache_bytes_per_token("bf16") == 15 * per_token_layer  # full layers only
    _check_cache(QWEN35, full=15, per_token=per_token_layer, linear=45, state=state)


def _check_cache(model: ModelSpec, *, full: int, per_token: int, linear: int, state: int) -> None:
    """The model's cache (bf16) and its vectorized per-layer mean against a sum over layers: the
    full layers' K and V of every token, a fixed state per linear layer."""
    for context in (1, 4096, 262_144):
        brute = full * per_token * context + linear * state * 2
        assert model.kv_cache_bytes(context, "bf16") == pytest.approx(brute)
        layer = kv_bytes_per_sequence_layer(model, np.array([float(context)]), 2.0, 1)
        assert model.num_layers * layer[0] == pytest.approx(brute)


def test_linear_heads_must_split_over_tensor_parallel_ranks() -> None:
    from cost_model import ParallelConfig
    from cost_model._rules import check_parallel_config

    check_parallel_config(ParallelConfig(tp=16, dp=1, ep=16), QWEN35)
    with pytest.raises(ValueError, match="num_attention_heads \\(32\\).*tp \\(64\\)"):
        check_parallel_config(ParallelConfig(tp=64, dp=1, ep=64), QWEN35)
    narrow = QWEN35.model_copy(
        update={"attention": QWEN35.attention.model_copy(update={"linear_key_heads": 8})}
    )
    with pytest.raises(ValueError, match="linear_num_key_heads \\(8\\).*tp \\(16\\)"):
        check_parallel_config(ParallelConfig(tp=16, dp=1, ep=16), narrow)


def test_only_the_full_quarter_of_qwen35_pays_for_a_long_context_at_decode() -> None:
    all_full = QWEN35.model_copy(update={"attention": QWEN35.attention.full_layers_only()})
    hybrid, full = _decode_attention_s(QWEN35, 131_072), _decode_attention_s(all_full, 131_072)
    # the 45 DeltaNet layers read a fixed state, not the context: about a quarter of the time
    assert 0.2 < hybrid / full < 0.35
    short = _decode_attention_s(QWEN35, 4096)
    assert hybrid > 5 * short  # the full layers still grow with the context


NANO = get_model("nemotron-3-nano-30b-a3b")


def test_nemotron_h_pairs_each_ffn_block_with_its_mamba_block_and_attention_beside_six() -> None:
    # "MEMEM*EMEMEM*E...": 23 layers of one Mamba-2 block and one MoE block, 6 of them with an
    # attention block between
    a = NANO.attention
    assert NANO.num_layers == 23 and round(a.full_layer_fraction * 23) == 6
    assert (a.linear_kind, a.linear_in_every_layer, a.linear_share) == ("mamba2", True, 1.0)
    assert NANO.ffn_activation == "relu2" and NANO.moe is not None and NANO.moe.top_k == 6
    # NVIDIA Nemotron 3 Nano model card: 31.6B total, 3.6B active with the embeddings
    assert NANO.num_parameters / 1e9 == pytest.approx(31.6, rel=0.005)
    assert NANO.num_active_parameters / 1e9 == pytest.approx(3.6, rel=0.02)
    hidden, heads, head_dim, groups, state = 2688, 64, 64, 8, 128
    inner, bc = heads * head_dim, groups * state
    mamba = (
        hidden * (2 * inner + 2 * bc + heads)  # in_proj: z, x, B, C, dt
        + (inner + 2 * bc) * (4 + 1)  # depthwise conv over x, B, C and its bias
        + 3 * heads  # A_log, D, dt_bias
        + inner  # gated RMSNorm
        + inner * hidden  # out_proj
    )
    attention = hidden * 32 * 128 * 2 + 2 * hidden * 2 * 128  # q and o, k and v of 2 KV heads
    assert NANO.parameter_breakdown()["attention"] == 23 * mamba + 6 * attention


def test_nemotron_h_cache_is_six_attention_layers_plus_a_state_per_mamba_layer() -> None:
    state = 64 * 128 * 64 + 3 * (64 * 64 + 2 * 8 * 128)  # SSM state + the conv's last inputs
    per_token = 2 * 2 * 128 * 2  # K and V of 2 KV heads of 128, bf16
    _check_cache(NANO, full=6, per_token=per_token, linear=23, state=state)


def test_nemotron_h_layouts_that_cannot_be_one_layer_shape_are_refused() -> None:
    config = dict(catalog_config("nemotron-3-nano-30b-a3b"))
    with pytest.raises(ValueError, match="moe_latent_size.*LatentMoE"):
        ModelSpec.from_hf_config({**config, "moe_latent_size": 1024})
    with pytest.raises(ValueError, match="hybrid_override_pattern.*one Mamba-2 block"):
        ModelSpec.from_hf_config({**config, "hybrid_override_pattern": "MME" * 4})
    with pytest.raises(ValueError, match="hybrid_override_pattern.*one Mamba-2 block"):
        ModelSpec.from_hf_config({**config, "hybrid_override_pattern": "MEM"})
    dense = ModelSpec.from_hf_config({**config, "hybrid_override_pattern": "M-M*-"})
    assert dense.moe is None and dense.num_layers == 2


def test_the_model_class_comes_from_the_config_and_a_bad_one_is_named() -> None:
    config = dict(catalog_config("gpt-oss-120b"))
    assert ModelSpec.from_hf_config(config).architecture == "GptOssForCausalLM"
    # the class names the checkpoint's code, not its shape: the fingerprint ignores it
    unnamed = ModelSpec.from_hf_config({k: v for k, v in config.items() if k != "architectures"})
    assert unnamed.architecture is None
    assert unnamed.fingerprint() == get_model("gpt-oss-120b").fingerprint()
    with pytest.raises(ValueError, match=r"'architectures' \(\[3\]\) must be a list"):
        ModelSpec.from_hf_config({**config, "architectures": [3]})


def test_qwen3_norms_its_query_and_key_heads_and_exports_them_to_megatron() -> None:
    """Qwen3's attention normalizes every query and key head before RoPE (two kernels and
    2 x head_dim weights a layer; Megatron-core ``--qk-layernorm``); Qwen2-MoE's does not. The
    reference runtime builds the norms for grouped-query attention and refuses them for MLA."""
    from autoparallel.runtime import ReferenceMoETransformer

    qwen3 = get_model("qwen3-30b-a3b")
    plain = qwen3.model_copy(
        update={"attention": qwen3.attention.model_copy(update={"qk_norm": False})}
    )
    assert qwen3.attention.qk_norm and not plain.attention.qk_norm
    layers = qwen3.num_layers
    extra = qwen3.parameter_breakdown()["attention"] - plain.parameter_breakdown()["attention"]
    assert extra == layers * 2 * qwen3.attention.head_dim
    qwen2 = ModelSpec.from_hf_config(
        {
            **catalog_config("qwen3-30b-a3b"),
            "model_type": "qwen2_moe",
            "shared_expert_intermediate_size": 768,
        }
    )
    assert not qwen2.attention.qk_norm
    from types import SimpleNamespace

    from cost_model._options import EstimateOptions
    from cost_model._training_ops import kernels_per_layer

    counts = [
        kernels_per_layer(SimpleNamespace(model=m, options=EstimateOptions()))
        for m in (qwen3, plain)
    ]
    assert counts[0][0] - counts[1][0] == 2 and counts[0][1] - counts[1][1] == 2
    # the reference transformer runs Qwen3's per-head norms (GQA), not MLA with them
    names = {name for name, _ in ReferenceMoETransformer(qwen3, device="meta").named_parameters()}
    assert "model.layers.0.self_attn.q_norm.weight" in names
    assert "model.layers.0.self_attn.k_norm.weight" in names
    mla = get_model("deepseek-v3")
    with_norms = mla.model_copy(
        update={"attention": mla.attention.model_copy(update={"qk_norm": True})}
    )
    with pytest.raises(ValueError, match=r"attention\.qk_norm \(True\) must be False for MLA"):
        ReferenceMoETransformer(with_norms, device="meta")
