"""``Layout``: one parallel layout as the search proposes it — degrees and switches
(``ParallelConfig``) plus, for inference, the serving settings it is priced with
(``ServingConfig``). Frozen and hashable."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from cost_model._axes import describe_layout
from cost_model._parallel import ParallelConfig
from cost_model._serving_columns import ServingConfig

__all__ = ["Layout"]


class Layout(BaseModel):
    """``config`` and, for inference, ``serving`` (None for training)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    config: ParallelConfig
    serving: ServingConfig | None = None

    def describe(self) -> str:
        """``describe_layout`` of the config, then the serving batch when there is one."""
        text = describe_layout(self.config)
        if self.serving is not None and self.serving.batch_size:
            text += f"·batch{self.serving.batch_size}"
        return text

    def estimate_options(self) -> dict[str, object]:
        """The serving settings as ``cost_model.estimate`` keywords (empty for training)."""
        if self.serving is None:
            return {}
        return self.serving.model_dump(exclude_none=True)
