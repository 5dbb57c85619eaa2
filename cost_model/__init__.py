"""Analytical cost model: time and memory of a parallel layout of a transformer. Never imports torch."""

from cost_model._axes import (
    ALL_AXES,
    DENSE_MESH_ORDER,
    MOE_MESH_ORDER,
    Axis,
    axis_degrees,
    describe_layout,
)
from cost_model._breakdown import CostBreakdown, InfeasiblePlanError
from cost_model._calibrate import CalibrationResult, StepMeasurement, calibrate
from cost_model._common import Calibration, EstimateOptions
from cost_model._estimate import estimate, estimate_table
from cost_model._inference import estimate_inference_table
from cost_model._inference_validation import (
    ValidationRow,
    validate_dsv3_day6,
    validate_dsv3_profile,
)
from cost_model._layout import Layout
from cost_model._model_spec import AttentionSpec, ModelSpec, MoESpec
from cost_model._parallel import ParallelConfig, PipelineSchedule
from cost_model._rules import check_parallel_config, check_sequence_fits, split_layers
from cost_model._serving import DisaggregatedSplit, PoolConfig, disaggregated_split
from cost_model._serving_columns import ServingConfig
from cost_model._serving_load import ServingProfile, serving_profile
from cost_model._serving_validation import validate_serving
from cost_model._simulator import SimulationResult, simulate, simulate_layout
from cost_model._sweep import SequenceSweep, sequence_sweep
from cost_model._table import configs_to_table, table_from_columns, table_length, table_row
from cost_model._units import DTYPE_BYTES, dtype_bytes
from cost_model._workload import Inference, Training, Workload

__all__ = [
    "ALL_AXES",
    "Axis",
    "DENSE_MESH_ORDER",
    "Layout",
    "MOE_MESH_ORDER",
    "axis_degrees",
    "describe_layout",
    "AttentionSpec",
    "Calibration",
    "CalibrationResult",
    "CostBreakdown",
    "DTYPE_BYTES",
    "DisaggregatedSplit",
    "EstimateOptions",
    "InfeasiblePlanError",
    "Inference",
    "MoESpec",
    "ModelSpec",
    "ParallelConfig",
    "PipelineSchedule",
    "PoolConfig",
    "SequenceSweep",
    "StepMeasurement",
    "ServingConfig",
    "ServingProfile",
    "SimulationResult",
    "Training",
    "ValidationRow",
    "Workload",
    "calibrate",
    "check_parallel_config",
    "check_sequence_fits",
    "configs_to_table",
    "disaggregated_split",
    "dtype_bytes",
    "estimate",
    "estimate_inference_table",
    "estimate_table",
    "sequence_sweep",
    "serving_profile",
    "simulate",
    "simulate_layout",
    "split_layers",
    "table_from_columns",
    "table_length",
    "table_row",
    "validate_dsv3_day6",
    "validate_dsv3_profile",
    "validate_serving",
]
