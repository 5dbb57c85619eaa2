"""Write ``cost_model/data/serving_held_out.json``: every public serving measurement of
``cost_model/data/serving_validation.json`` (none a fit input) with the model's error and the
regime it ran in (engine, GPU generation, MoE or dense, deployment), which
``cost_model.serving_error_bands`` reads as the error bar of a serving estimate.

Run after any change to serving pricing or to the validation rows (about 15 s); a test checks
the file against the current prediction:

    python benchmarks/serving_held_out.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cost_model._serving_validation import held_out_serving_rows

OUTPUT = Path(__file__).resolve().parents[1] / "cost_model" / "data" / "serving_held_out.json"

ABOUT = (
    "Every public serving measurement of serving_validation.json priced by the current model "
    "(validation only, never fitted): row id, source, engine, GPU generation, MoE or dense, "
    "deployment, metric (TTFT or TPOT) and time_error = measured / predicted - 1 (> 0: the model "
    "was optimistic). Written by benchmarks/serving_held_out.py; cost_model.serving_error_bands "
    "reads it as the error bar of a serving estimate."
)


def main() -> int:
    rows = held_out_serving_rows()
    OUTPUT.write_text(json.dumps({"about": ABOUT, "rows": rows}, indent=1) + "\n")
    print(f"wrote {len(rows)} rows to {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
