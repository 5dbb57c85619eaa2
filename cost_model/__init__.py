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
from cost_model._cross_validation import GROUPINGS as VALIDATION_GROUPINGS
from cost_model._cross_validation import error_summary, grouped_errors, leave_one_source_out
from cost_model._engine_paths import sglang_uses_deepep
from cost_model._error_band import (
    ErrorBand,
    memory_error_band,
    serving_error_bands,
    training_error_band,
)
from cost_model._estimate import breakdown_from_row, estimate, estimate_table
from cost_model._frameworks import framework_names, framework_profile
from cost_model._inference_load import (
    POOL_SLO_QUANTILE,
    estimate_inference_table,
    serving_inputs,
)
from cost_model._inference_ops import attention_flops_per_key, routed_bytes_per_assignment
from cost_model._inference_validation import (
    ValidationRow,
    validate_dsv3_day6,
    validate_dsv3_profile,
)
from cost_model._kernel_curves import matmul_dtype_of, matmul_dtype_on
from cost_model._kernel_curves_attention import MLA_CURVE_HEADS, mla_decode_ideal_s
from cost_model._kernel_curves_comm import (
    ALL_REDUCE_MESSAGE_BYTES,
    expert_all_to_all_bytes,
    rdma_efficiency_at_nodes,
)
from cost_model._kernel_curves_gemm import GEMM_M_GRID, GEMM_NK_GRID, gemm_ideal_s
from cost_model._kernel_curves_module import module_shape
from cost_model._kernel_curves_moe import (
    GROUPED_GEMM_SHAPE,
    TOKENS_PER_EXPERT_GRID,
    grouped_gemm_ideal_s,
)
from cost_model._layout import Layout
from cost_model._model_spec import AttentionSpec, ModelSpec, MoESpec
from cost_model._options import Calibration, EstimateOptions, calibration_for
from cost_model._parallel import ParallelConfig, PipelineSchedule
from cost_model._pricing import op_time_s
from cost_model._routing_skew import eplb_skew
from cost_model._rules import (
    check_parallel_config,
    check_sequence_fits,
    minimum_redundant_experts,
    split_layers,
)
from cost_model._serving import (
    DisaggregatedSplit,
    PoolConfig,
    disaggregated_split,
    pool_curve,
    pool_unit_rate,
    unit_workload,
)
from cost_model._serving_columns import KV_DTYPE_CODES, PHASE_CODES, ServingConfig
from cost_model._serving_pool_load import PassCurve, pass_curve
from cost_model._serving_precision import (
    checkpoint_dtype,
    checkpoint_dtype_by_part,
    checkpoint_fp8_scaling,
)
from cost_model._serving_profile import ServingProfile, serving_profile
from cost_model._serving_validation import (
    serving_validation_data,
    summarize_serving,
    summarize_serving_by_source,
    validate_serving,
)
from cost_model._simulator import SimulationResult, simulate
from cost_model._simulator_layout import simulate_layout, slo_concurrency
from cost_model._simulator_pools import PoolsSimulation, PoolUnit, simulate_pools, slo_rate
from cost_model._sweep import DEFAULT_LENGTHS, SequenceSweep, sequence_sweep
from cost_model._table import (
    RECOMPUTE_CODES,
    SCHEDULE_CODES,
    configs_to_table,
    table_from_columns,
    table_length,
    table_row,
)
from cost_model._units import (
    DTYPE_BYTES,
    Dtype,
    dtype_bytes,
    human_bytes,
    human_count,
    human_seconds,
)
from cost_model._validation import TOLERANCES, run_case, summarize, validate_published
from cost_model._validation_cases import training_cases
from cost_model._workload import WEIGHT_PARTS, Inference, Training, Workload

__all__ = [
    "POOL_SLO_QUANTILE",
    "ErrorBand",
    "serving_error_bands",
    "training_error_band",
    "memory_error_band",
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
    "WEIGHT_PARTS",
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
    "PoolsSimulation",
    "PoolUnit",
    "Training",
    "ValidationRow",
    "Workload",
    "calibrate",
    "check_parallel_config",
    "check_sequence_fits",
    "configs_to_table",
    "disaggregated_split",
    "PassCurve",
    "pass_curve",
    "pool_curve",
    "pool_unit_rate",
    "unit_workload",
    "dtype_bytes",
    "eplb_skew",
    "estimate",
    "estimate_inference_table",
    "estimate_table",
    "sequence_sweep",
    "serving_inputs",
    "serving_profile",
    "simulate",
    "simulate_layout",
    "simulate_pools",
    "sglang_uses_deepep",
    "split_layers",
    "table_from_columns",
    "table_length",
    "table_row",
    "validate_dsv3_day6",
    "validate_dsv3_profile",
    "validate_serving",
    # Units, codes, validation and kernel-curve helpers the other packages and the CLI use.
    "DEFAULT_LENGTHS",
    "Dtype",
    "GROUPED_GEMM_SHAPE",
    "MLA_CURVE_HEADS",
    "KV_DTYPE_CODES",
    "PHASE_CODES",
    "RECOMPUTE_CODES",
    "SCHEDULE_CODES",
    "ALL_REDUCE_MESSAGE_BYTES",
    "GEMM_M_GRID",
    "GEMM_NK_GRID",
    "TOKENS_PER_EXPERT_GRID",
    "TOLERANCES",
    "attention_flops_per_key",
    "breakdown_from_row",
    "calibration_for",
    "checkpoint_dtype",
    "checkpoint_dtype_by_part",
    "checkpoint_fp8_scaling",
    "VALIDATION_GROUPINGS",
    "error_summary",
    "grouped_errors",
    "expert_all_to_all_bytes",
    "rdma_efficiency_at_nodes",
    "framework_names",
    "framework_profile",
    "grouped_gemm_ideal_s",
    "human_bytes",
    "human_count",
    "human_seconds",
    "leave_one_source_out",
    "matmul_dtype_of",
    "matmul_dtype_on",
    "minimum_redundant_experts",
    "gemm_ideal_s",
    "mla_decode_ideal_s",
    "module_shape",
    "op_time_s",
    "routed_bytes_per_assignment",
    "run_case",
    "serving_validation_data",
    "slo_concurrency",
    "slo_rate",
    "summarize",
    "summarize_serving",
    "summarize_serving_by_source",
    "training_cases",
    "validate_published",
]
