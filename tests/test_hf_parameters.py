"""The reader's parameter count of a config equals that of transformers' own model of it.

Each supported architecture transformers implements is built tiny from its config class
(``autoparallel.testing.TINY_TRANSFORMERS``: random weights, no download), and
``ModelSpec.from_hf_config`` of the same config must count exactly its parameters: the weights
the cost model prices are the weights the model has.
"""

from __future__ import annotations

import warnings

import pytest

from autoparallel.testing import TINY_TRANSFORMERS, tiny_transformers_model
from cost_model import ModelSpec

#: What the reader leaves out, by design (parameters per model of the tiny configs): gpt-oss's
#: attention sinks, one scalar per head and layer (``_hf_hybrid._gpt_oss``); MiniMax-M2's and
#: OLMo 2's query and key norms over all heads' features (``AttentionSpec``: "other shapes, not
#: read"); Gemma's and GLM-4's third and fourth norm of each layer (``_hf_hybrid._gemma``,
#: ``_hf_config._glm4``).
UNCOUNTED = {
    "gpt_oss": lambda config: config.num_attention_heads * config.num_hidden_layers,
    "minimax_m2": lambda config: (
        (config.num_attention_heads + config.num_key_value_heads)
        * config.head_dim
        * config.num_hidden_layers
    ),
    # Gemma's norms before and after the MLP beside the two ``ModelSpec`` counts
    "gemma2": lambda config: 2 * config.hidden_size * config.num_hidden_layers,
    "gemma3_text": lambda config: 2 * config.hidden_size * config.num_hidden_layers,
    # GLM-4's norms after the attention and the MLP (``_hf_config._glm4``)
    "glm4": lambda config: 2 * config.hidden_size * config.num_hidden_layers,
    # OLMo 2's query and key norms over all heads' features (``_hf_config._olmo2``)
    "olmo2": lambda config: (
        (config.num_attention_heads + config.num_key_value_heads)
        * (config.hidden_size // config.num_attention_heads)
        * config.num_hidden_layers
    ),
}


@pytest.mark.parametrize("model_type", sorted(TINY_TRANSFORMERS))
def test_the_reader_counts_the_models_own_parameters(model_type: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, config = tiny_transformers_model(model_type, layers=4)
    actual = sum(parameter.numel() for parameter in model.parameters())
    architecture = TINY_TRANSFORMERS[model_type][1]
    spec = ModelSpec.from_hf_config({**config.to_dict(), "architectures": [architecture]})
    uncounted = UNCOUNTED.get(model_type, lambda _: 0)(config)
    assert spec.num_parameters == actual - uncounted
