"""Two-batch overlap paired by stage: what expert-parallel traffic the other micro-batch hides.

SGLang's two-batch overlap (``srt/batch_overlap/operations_strategy.py``, DeepSeek-V3 and Qwen3
MoE layers) runs each micro-batch's layer as a list of operations cut into stages at yield points
and alternates the two micro-batches stage by stage. A launched all-to-all is in flight from its
launch (``op_dispatch_a`` / ``op_combine_a``) to its wait (``op_dispatch_b`` /
``op_combine_b``): over what the launching micro-batch still runs before its yield and the one
stage of the other micro-batch that runs next. Traffic longer than that holds the GPU idle for
the difference, however much compute the whole pass has.

* Decode (``_compute_moe_deepseek_blog_decode``, the second micro-batch two stages behind): the
  stages are [output of the previous layer, attention prepare], [attention core, gate, expert
  selection], [dispatch launch, shared experts], [dispatch wait, routed experts, combine launch],
  [combine wait]. A dispatch is in flight over the launching micro-batch's shared experts and the
  other's attention prepare (its projections), a combine over the other's attention core; nothing
  runs beside the routed experts.
* Prefill (``_compute_moe_deepseek_blog_prefill``, no delay): [attention, gate, selection,
  dispatch launch], [dispatch wait, routed experts, combine launch], [shared experts, combine wait,
  output] followed by the next layer's first stage. The first micro-batch's dispatch runs beside
  the second's attention, its combine beside the second's routed experts and its own shared
  experts; the second's dispatch beside the first's routed experts, its combine beside the first's
  shared experts and next attention and its own shared experts.

The attention block's projections (all of them, the output projection of the core stage
included) stand for the prepare stage, its core attention for the core stage. A layer's dispatch
and combine share its all-to-all time by their bytes per token (the dispatch's FP8 or BF16
elements, the combine's BF16), both moving the same tokens. The exposed traffic is this
pairing's, and no more is hidden than the whole pass's compute (the caller's bound).
DeepSeek's own inference system splits decode attention in two over a five-stage pipeline for a
seamless overlap (DeepSeek Open Infra Index, day 6): ``EstimateOptions.two_batch_stages`` off
keeps the whole-pass bound alone.
"""

from __future__ import annotations

import numpy as np

from cost_model import _inference_ops as ops
from cost_model._inference_setup import COMBINE_BYTES, _dispatch_bytes, _Setup


def stage_paired_ep_exposure(
    s: _Setup,
    micro: ops.Pass,
    ep_layer_s: np.ndarray,
    *,
    projections: np.ndarray,
    core: np.ndarray,
    moe: np.ndarray,
    shared: np.ndarray,
) -> np.ndarray:
    """Seconds of one MoE layer's all-to-all that no stage of the other micro-batch hides, for
    both micro-batches of a two-batch-overlapped pass at micro-batch ``micro``, (n,);
    ``ep_layer_s`` is one micro-batch's dispatch plus combine of that layer, ``projections``,
    ``core``, ``moe`` and ``shared`` its attention projections, core attention, MoE layer and
    that layer's router and shared experts, as the pass prices them."""
    dispatch_share = _dispatch_bytes(s) / (_dispatch_bytes(s) + COMBINE_BYTES)
    dispatch, combine = ep_layer_s * dispatch_share, ep_layer_s * (1.0 - dispatch_share)

    def excess(traffic: np.ndarray, cover: np.ndarray) -> np.ndarray:
        return np.maximum(traffic - cover, 0.0)

    if micro.decode:
        return 2.0 * (excess(dispatch, shared + projections) + excess(combine, core))
    routed = moe - shared
    attention = projections + core
    return (
        excess(dispatch, attention)
        + excess(combine, routed + shared)
        + excess(dispatch, routed)
        + excess(combine, 2.0 * shared + attention)
    )
