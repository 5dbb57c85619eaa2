"""Which experts a measured MoE table's tokens reached: the collectors' routing, replayed.

The aiconfigurator collectors time a fused MoE layer on synthetic router logits. With the
``balanced`` distribution (``collector/helper.py`` ``balanced_logits``) token ``t`` favours ``top_k``
"hot" experts spaced ``stride = ceil(experts / top_k)`` apart:
``(t + j * stride) % experts`` once there are at least ``stride`` tokens, else
``floor((t * stride / tokens + j * stride) % experts)``; a plain top-k routing picks exactly those,
``tokens * top_k`` assignments spread evenly over the experts.

Two collectors route those logits through DeepSeek-V3's group-limited top-k instead (the model's
``n_group`` 8 groups of 32 experts, of which ``topk_group`` 4 are kept per token, by the sum of
each group's two best scores): SGLang builds the model's own ``TopK`` layer for the DeepSeek-V3
cases (``collector/sglang/collect_moe.py`` ``_benchmark_framework_quantized_moe``, ``use_grouped_topk``
from ``collector/cases/models/DeepseekV3ForCausalLM_cases.yaml``: ``sglang_moe_num_expert_group``
8, ``sglang_moe_topk_group`` 4) and vLLM its grouped top-k for the ``deepseek_v3`` model type
(``collector/vllm/collect_moe.py``), and TensorRT-LLM's min-latency kernel runs DeepSeek-V3's
gate on every shape it times (``collector/trtllm/collect_moe.py``: "all use deepseek setting",
``n_group = 8``, ``topk_group = 4``; kernel source ``moe_torch_flow_min_latency``). Balanced
logits put one hot expert in each group, so every group scores the same, the same four groups
win for every token (ties go to the lower index), and each token's other four picks are the
same lowest-index experts of those groups: the layer reads at most half of the experts' weights,
and four experts take every token. Priced as balanced work, such a table's latencies beat the
roofline (on B200, 13-14 TB/s of weights streamed against 8 TB/s of HBM); priced as the work the
routing made, they sit at the bandwidth the same kernels reach on the shapes the routing leaves
alone (Kimi-K2's 384 experts in one group, Qwen3's without groups: 6-7 TB/s on B200).

``rank0_load`` replays the routing and returns what the first expert-parallel rank (experts
``[0, experts / ep)``, the rank the collectors time) received.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

#: DeepSeek-V3's group-limited routing (``config.json``: n_group 8, topk_group 4).
DEEPSEEK_V3_GROUPING = (8, 4)
#: Expert shapes (hidden, expert FFN width, routed experts, top-k) whose SGLang and vLLM cases
#: use the model's grouped routing: DeepSeek-V3's.
GROUPED_SHAPES = {(7168, 2048, 256, 8): DEEPSEEK_V3_GROUPING}
#: TensorRT-LLM's kernel source that routes every shape with DeepSeek-V3's gate.
MIN_LATENCY_SOURCE = "moe_torch_flow_min_latency"


def balanced_hot_experts(tokens: int, experts: int, top_k: int) -> np.ndarray:
    """(tokens, top_k) hot experts of the collectors' ``balanced_logits``."""
    stride = math.ceil(experts / top_k)
    t = np.arange(tokens)[:, None]
    j = np.arange(top_k)[None, :]
    if tokens >= stride:
        return (t + j * stride) % experts
    return np.floor((t * stride / tokens + j * stride) % experts).astype(np.int64)


def routed_experts(
    tokens: int, experts: int, top_k: int, grouping: tuple[int, int] | None
) -> np.ndarray:
    """(tokens, top_k) experts each token is routed to: the hot ones under plain top-k, else the
    group-limited top-k of ``grouping = (n_group, topk_group)`` over the same logits (every hot
    expert scores above every other; ties go to the lower index)."""
    hot = balanced_hot_experts(tokens, experts, top_k)
    if grouping is None:
        return hot
    groups, kept = grouping
    size = experts // groups
    score = np.zeros((tokens, experts))
    np.put_along_axis(score, hot, 1.0, axis=1)
    best_two = -np.sort(-score.reshape(tokens, groups, size), axis=2)[:, :, : min(2, size)]
    chosen = np.argsort(-best_two.sum(axis=2), axis=1, kind="stable")[:, :kept]
    allowed = np.zeros((tokens, groups), dtype=bool)
    np.put_along_axis(allowed, chosen, True, axis=1)
    masked = np.where(np.repeat(allowed, size, axis=1), score, -np.inf)
    return np.argsort(-masked, axis=1, kind="stable")[:, :top_k]


@lru_cache(maxsize=4096)
def rank0_load(
    tokens: int, experts: int, top_k: int, ep: int, grouping: tuple[int, int] | None
) -> tuple[int, int]:
    """(assignments, distinct experts) the first of ``ep`` expert-parallel ranks receives when
    ``tokens`` balanced tokens are routed as the collector routes them. Token ``t``'s experts
    depend on ``t`` modulo the stride alone once there are a stride of tokens (the hot set
    ``{t mod stride + m * stride}``), so one stride of tokens is replayed and counted."""
    stride = math.ceil(experts / top_k)
    local = experts // ep
    if tokens < stride or experts % top_k:
        picked = routed_experts(tokens, experts, top_k, grouping)
        mine = picked[picked < local]
        return int(mine.size), int(np.unique(mine).size)
    picked = routed_experts(stride, experts, top_k, grouping)
    copies = np.full(stride, tokens // stride)
    copies[: tokens % stride] += 1
    mine = picked < local
    assignments = int((mine.sum(axis=1) * copies).sum())
    touched = int(np.unique(picked[mine]).size)
    return assignments, touched
