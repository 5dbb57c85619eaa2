"""The search space: every legal parallel layout of one (model, cluster, workload), as numpy tables.

A layout is split in two levels:

* the **mesh** — the degrees ``tp, pp, cp, ep, etp`` (``dp`` follows from the world size) and,
  for inference, ``attention_data_parallel``. The Optuna study samples these;
* the **switches** — sequence parallel, ZeRO stage, pipeline schedule and virtual stages,
  micro-batch size and recompute (training); batch size, KV dtype, redundant experts and
  two-batch overlap (inference). For each mesh every legal switch combination is priced at once
  with the vectorized cost model (a vectorized inner sweep), so one trial is one mesh.

The prefill/decode device split of a disaggregated deployment is a space of its own: one such
space per pool (``SearchBounds.phase``) and unit size, combined in ``search._disaggregation``.

Legality comes from ``cost_model._rules`` only: each rule is applied to the distinct values of
the fields it reads (a few hundred scalar checks), never re-implemented here. Combinations that
are legal but equivalent (a pipeline schedule when ``pp == 1``, attention-DP when ``tp == 1``) are
kept once, in a canonical form.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from cost_model import (
    RECOMPUTE_CODES,
    SCHEDULE_CODES,
    Inference,
    ModelSpec,
    ParallelConfig,
    PipelineSchedule,
    Training,
    check_parallel_config,
    check_sequence_fits,
    minimum_redundant_experts,
    table_from_columns,
    table_row,
)
from search._engines import restrict_switches

Table = dict[str, np.ndarray]

MESH_AXES = ("tp", "pp", "cp", "ep", "etp")
"""Axes the study samples; ``dp`` is derived as ``world / (tp * pp * cp)``."""

PIPELINE_SCHEDULES: tuple[PipelineSchedule, ...] = ("gpipe", "1f1b", "zero_bubble")


class SearchBounds(BaseModel):
    """Practical limits that keep the space to layouts people run; each is a documented choice,
    not a legality rule. ``None`` means "no limit" (or, for ``max_tp_degree``, the node size)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tp_degree: int | None = Field(default=None, gt=0, description="default: devices per node")
    max_etp_degree: int | None = Field(default=None, gt=0, description="default: devices per node")
    max_cp_degree: int | None = Field(
        default=None, gt=0, description="default: 1 for inference, none for training"
    )
    max_micro_batch_size: int = Field(default=8, gt=0)
    virtual_stage_choices: tuple[int, ...] = (2, 4)
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    recompute_policies: tuple[str, ...] = ("none", "selective", "full")
    max_batch_size: int = Field(
        default=1024, gt=0, description="inference: sequences per attention replica"
    )
    batch_size_sweep: bool = Field(
        default=False,
        description="inference: also try every power-of-two batch up to max_batch_size; otherwise only 0, "
        "which the cost model resolves to the largest batch memory and the SLOs allow",
    )
    kv_dtypes: tuple[str, ...] | None = Field(
        default=None,
        description="default: the workload's kv_dtype where it names one, else it and fp8",
    )
    redundant_expert_multiples: tuple[int, ...] = Field(
        default=(0, 1), description="x ep redundant slots"
    )
    two_batch_overlap: bool = Field(
        default=True, description="inference: also try two-batch overlap"
    )
    phase: Literal["both", "prefill", "decode"] = Field(
        default="both",
        description="inference: colocated serving, or one pool of a disaggregated deployment",
    )
    engine: str | None = Field(
        default=None, description="keep only layouts this engine runs (search._engines)"
    )
    engine_version: str | None = Field(
        default=None, description="default: the engine's current release"
    )


# ---------------------------------------------------------------------------- integer helpers
def divisors(n: int) -> list[int]:
    """All positive divisors of ``n``, ascending."""
    if n <= 0:
        raise ValueError(f"n ({n}) must be > 0")
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def powers_of_two_up_to(limit: int) -> list[int]:
    return [1 << k for k in range(limit.bit_length()) if (1 << k) <= limit]


def cross(left: Table, right: Table) -> Table:
    """Cartesian product of two tables (every left row with every right row)."""
    n_left, n_right = _rows(left), _rows(right)
    out = {name: np.repeat(column, n_right) for name, column in left.items()}
    out.update({name: np.tile(column, n_left) for name, column in right.items()})
    return out


def select(table: Table, mask: np.ndarray) -> Table:
    return {name: column[mask] for name, column in table.items()}


def _rows(table: Table) -> int:
    return len(next(iter(table.values()))) if table else 0


def legal_by_rule(table: Table, fields: tuple[str, ...], check: Callable[..., None]) -> np.ndarray:
    """Apply the scalar rule ``check(**row)`` once per distinct value of ``fields``; True where it passes."""
    if not _rows(table):
        return np.zeros(0, dtype=bool)
    keys = np.stack([table[f].astype(np.int64) for f in fields], axis=1)
    unique, inverse = np.unique(keys, axis=0, return_inverse=True)
    verdicts = np.empty(len(unique), dtype=bool)
    for index, row in enumerate(unique):
        try:
            check(**{f: int(v) for f, v in zip(fields, row)})
            verdicts[index] = True
        except ValueError:
            verdicts[index] = False
    return verdicts[inverse.reshape(-1)]


# ---------------------------------------------------------------------------- the space
class SearchSpace:
    """Every legal layout of ``model`` on ``world_size`` devices for ``workload``.

    ``mesh`` is the table of legal meshes (columns ``dp tp pp cp ep etp attention_data_parallel``);
    ``expand(mesh_rows)`` gives the full config table of those meshes (one row per legal switch
    combination); ``size`` counts every legal layout.
    """

    def __init__(
        self,
        *,
        model: ModelSpec,
        workload: Training | Inference,
        world_size: int,
        devices_per_node: int,
        bounds: SearchBounds | None = None,
    ) -> None:
        if world_size <= 0:
            raise ValueError(f"world_size ({world_size}) must be > 0")
        self.model, self.workload, self.world_size = model, workload, world_size
        self.devices_per_node = devices_per_node
        self.bounds = bounds or SearchBounds()
        self.is_training = isinstance(workload, Training)
        self._switch_cache: dict[tuple, Table] = {}
        self._memo: dict[str, dict] = {}
        self.mesh = _enumerate_meshes(self)
        #: Data-parallel degrees of the meshes that pass the model's rules, before the switches
        #: (``empty_space_reason`` names the blocker from them).
        self.rule_legal_dp = sorted(set(self.mesh["dp"].tolist()))
        self._rule_legal_meshes = dict(self.mesh)
        # A mesh none of whose switch combinations is legal (e.g. no micro-batch size divides the
        # batch per replica) holds no layout: drop it. A mesh's count depends on its row's
        # values only, so the survivors keep theirs.
        counts = self._count_switches()
        self.mesh = select(self.mesh, counts > 0)
        self._switch_counts = counts[counts > 0]
        self.axis_choices = {
            axis: sorted(set(self.mesh[axis].tolist()))
            for axis in (*MESH_AXES, "attention_data_parallel")
        }

    @property
    def training(self) -> Training:
        """The workload, where the caller has checked ``is_training``."""
        assert isinstance(self.workload, Training), "a training switch asked of a serving space"
        return self.workload

    @property
    def inference(self) -> Inference:
        """The workload, where the caller has checked ``not is_training``."""
        assert isinstance(self.workload, Inference), "a serving switch asked of a training space"
        return self.workload

    # -- sizes
    @property
    def num_meshes(self) -> int:
        return _rows(self.mesh)

    def switch_counts(self) -> np.ndarray:
        """Legal switch combinations of each mesh row (a copy: counted once, at construction)."""
        return self._switch_counts.copy()

    def _count_switches(self) -> np.ndarray:
        """Legal switch combinations of each row of the current ``mesh``."""
        if getattr(self.bounds, "engine", None) is not None or not self.num_meshes:
            return np.array(
                [_rows(self._switches_for(i)) for i in range(self.num_meshes)], dtype=np.int64
            )
        # Without an engine a row's switches depend on its key degrees only: count once per key.
        keys = np.stack([self.mesh[name].astype(np.int64) for name in self._switch_key], axis=1)
        unique, inverse = np.unique(keys, axis=0, return_inverse=True)
        per_key = [_rows(self._switch_table(tuple(int(v) for v in row))) for row in unique]
        return np.array(per_key, dtype=np.int64)[inverse.reshape(-1)]

    @property
    def size(self) -> int:
        return int(self.switch_counts().sum())

    # -- tables
    def expand(self, mesh_rows) -> Table:
        """Full config table of the given mesh rows; column ``mesh_index`` says which row each came from."""
        indices = np.atleast_1d(np.asarray(mesh_rows, dtype=np.int64))
        if not len(indices):
            return table_from_columns(None)
        # Each mesh row crossed with its own switch rows, built column by column: the rows of
        # mesh i repeated once per switch row, the switch tables stacked in the same order.
        switches = [self._switches_for(int(index)) for index in indices]
        counts = np.array([_rows(table) for table in switches], dtype=np.int64)
        out = {name: np.repeat(column[indices], counts) for name, column in self.mesh.items()}
        out.update(
            {name: np.concatenate([table[name] for table in switches]) for name in switches[0]}
        )
        out["mesh_index"] = np.repeat(indices, counts)
        return table_from_columns(None, **out)

    def iter_chunks(self, *, max_rows: int = 200_000) -> Iterator[Table]:
        """The whole space, in tables of at most about ``max_rows`` rows."""
        counts = self.switch_counts()
        start = 0
        while start < self.num_meshes:
            stop, rows = start, 0
            while stop < self.num_meshes and (rows == 0 or rows + counts[stop] <= max_rows):
                rows += counts[stop]
                stop += 1
            yield self.expand(np.arange(start, stop))
            start = stop

    def axis_values(self, axis: str) -> list[int]:
        """Degrees of ``axis`` within the bounds that divide the world size (before the model's rules)."""
        return _axis_values(self, axis)

    def find_mesh(self, **degrees: int | bool) -> int | None:
        """Index of the mesh with these values (missing axes: any), or None if it is not legal."""
        mask = np.ones(self.num_meshes, dtype=bool)
        for name, value in degrees.items():
            mask &= self.mesh[name] == value
        hits = np.flatnonzero(mask)
        return int(hits[0]) if len(hits) else None

    @property
    def _switch_key(self) -> tuple[str, ...]:
        """The mesh degrees a row's switch combinations depend on."""
        return ("dp", "tp", "pp", "cp") if self.is_training else ("tp", "pp", "ep")

    def _switch_table(self, key: tuple[int, ...]) -> Table:
        """Switch combinations of the meshes with degrees ``key`` (of ``_switch_key``), built once."""
        if key not in self._switch_cache:
            build = _training_switches if self.is_training else _inference_switches
            self._switch_cache[key] = build(self, **dict(zip(self._switch_key, key)))
        return self._switch_cache[key]

    def _switches_for(self, index: int) -> Table:
        """Legal switch combinations of mesh ``index`` (they depend on a few degrees only)."""
        key = tuple(int(self.mesh[name][index]) for name in self._switch_key)
        return restrict_switches(self, index, self._switch_table(key))

    def memo(self, name: str, key: tuple, build: Callable[[], object]):
        """Per-space memo of small rule results (legal pipeline options of a pp, ...)."""
        cache = self._memo.setdefault(name, {})
        if key not in cache:
            cache[key] = build()
        return cache[key]


def config_from_row(table: Table, index: int) -> ParallelConfig:
    """The ``ParallelConfig`` of row ``index`` of a config table (extra columns ignored)."""
    return table_row(table, index)


def row_extras(table: Table, index: int) -> dict:
    """Non-``ParallelConfig`` columns of row ``index`` (batch size, KV dtype, redundant experts...)."""
    skip = set(ParallelConfig.model_fields) | {"mesh_index"}
    extras = {
        k: (v[index].item() if hasattr(v[index], "item") else v[index])
        for k, v in table.items()
        if k not in skip
    }
    if "kv_dtype" in extras:
        from cost_model import KV_DTYPE_CODES, PHASE_CODES

        extras["kv_dtype"] = {code: name for name, code in KV_DTYPE_CODES.items()}[
            int(extras["kv_dtype"])
        ]
        extras["phase"] = {code: name for name, code in PHASE_CODES.items()}[
            int(extras.get("phase", 0))
        ]
    return extras


# ---------------------------------------------------------------------------- empty spaces
def factorization(n: int) -> str:
    """``1000`` -> ``"2^3·5^3"`` (``"1"`` for 1)."""
    factors: dict[int, int] = {}
    divisor = 2
    while divisor * divisor <= n:
        while n % divisor == 0:
            factors[divisor] = factors.get(divisor, 0) + 1
            n //= divisor
        divisor += 1
    if n > 1:
        factors[n] = factors.get(n, 0) + 1
    return "·".join(f"{p}^{e}" if e > 1 else str(p) for p, e in sorted(factors.items())) or "1"


def empty_space_reason(space: SearchSpace) -> str:
    """Why ``space`` holds no layout, with the numbers: for training, usually that every mesh the
    model's rules allow leaves the data-parallel degree a factor the global batch lacks."""
    world = space.world_size
    head = f"no legal layout of {space.model.name} on {world} devices ({factorization(world)})"
    if not space.rule_legal_dp:
        return f"{head}: every mesh breaks a rule of cost_model._rules (heads, experts, layers against the world size)"
    if not space.is_training:
        return f"{head}: no serving setting (batch, KV dtype, redundant experts) is legal on any of its meshes"
    batch = space.training.sequences_per_step
    meshes = space._rule_legal_meshes
    missing = meshes["dp"] // np.gcd(meshes["dp"], batch)
    closest = int(np.argmin(missing))
    tp, pp, cp, dp = (int(meshes[a][closest]) for a in ("tp", "pp", "cp", "dp"))
    if missing[closest] == 1:
        return f"{head}: no micro-batch size up to {space.bounds.max_micro_batch_size} divides the batch per replica"
    factor = int(missing[closest])
    return (
        f"{head}: the global batch of {batch} sequences ({factorization(batch)}) must split evenly over dp, "
        f"and every mesh the model allows leaves dp a factor {factorization(factor)} the batch lacks "
        f"(closest: tp{tp} pp{pp} cp{cp} leaves dp {dp}; tp is at most {max(space.axis_values('tp'))}, "
        f"pp at most {space.model.num_layers} stages, cp must divide the {space.training.sequence_length_tokens}-token sequence); "
        f"use a global batch that is a multiple of {int(np.lcm(batch, factor))} sequences, or fewer devices"
    )


# ---------------------------------------------------------------------------- meshes
def _axis_values(space: SearchSpace, axis: str) -> list[int]:
    bounds, world = space.bounds, space.world_size
    limit = {
        "tp": bounds.max_tp_degree or space.devices_per_node,
        "etp": bounds.max_etp_degree or space.devices_per_node,
        "cp": bounds.max_cp_degree or (world if space.is_training else 1),
    }.get(axis, world)
    return [d for d in divisors(world) if d <= limit]


def _enumerate_meshes(space: SearchSpace) -> Table:
    world = space.world_size
    table: Table = {"tp": np.array(_axis_values(space, "tp"), dtype=np.int64)}
    table = cross(table, {"pp": np.array(_axis_values(space, "pp"), dtype=np.int64)})
    table = select(table, world % (table["tp"] * table["pp"]) == 0)
    table = cross(table, {"cp": np.array(_axis_values(space, "cp"), dtype=np.int64)})
    table = select(table, world % (table["tp"] * table["pp"] * table["cp"]) == 0)
    table["dp"] = world // (table["tp"] * table["pp"] * table["cp"])
    attention_choices = np.array([False] if space.is_training else [False, True])
    table = cross(table, {"attention_data_parallel": attention_choices})
    # attention-DP is the same layout as plain TP when tp == 1: keep one canonical form.
    table = select(table, ~(table["attention_data_parallel"] & (table["tp"] == 1)))
    table = _add_expert_axes(space, table)
    table = select(table, _mesh_legal(space, table))
    order = np.lexsort(
        [table[a] for a in ("etp", "ep", "attention_data_parallel", "cp", "pp", "tp")]
    )
    return {name: column[order] for name, column in table.items()}


def _add_expert_axes(space: SearchSpace, table: Table) -> Table:
    if space.model.moe is None:
        table["ep"] = np.ones(_rows(table), dtype=np.int64)
        table["etp"] = np.ones(_rows(table), dtype=np.int64)
        return table
    experts = {"ep": np.array(_axis_values(space, "ep"), dtype=np.int64)}
    experts = cross(experts, {"etp": np.array(_axis_values(space, "etp"), dtype=np.int64)})
    table = cross(table, experts)
    stage_ranks = table["dp"] * table["cp"] * table["tp"]
    return select(table, stage_ranks % (table["ep"] * table["etp"]) == 0)


def _mesh_legal(space: SearchSpace, table: Table) -> np.ndarray:
    model = space.model
    table = dict(table, stage_ranks=table["dp"] * table["cp"] * table["tp"])
    legal = legal_by_rule(
        table,
        ("tp", "attention_data_parallel"),
        lambda tp, attention_data_parallel: check_parallel_config(
            ParallelConfig(tp=tp, attention_data_parallel=bool(attention_data_parallel)), model
        ),
    )
    legal &= legal_by_rule(
        table, ("pp",), lambda pp: check_parallel_config(ParallelConfig(pp=pp), model)
    )
    legal &= legal_by_rule(
        table,
        ("stage_ranks", "ep", "etp"),
        lambda stage_ranks, ep, etp: check_parallel_config(
            ParallelConfig(dp=stage_ranks, ep=ep, etp=etp),
            model,
            num_redundant_experts=0
            if space.is_training
            else None,  # serving: EPLB slots fill the ranks
        ),
    )
    sequence = (
        space.training.sequence_length_tokens
        if space.is_training
        else space.inference.prompt_tokens
    )
    legal &= legal_by_rule(
        table, ("cp",), lambda cp: check_sequence_fits(ParallelConfig(cp=cp), sequence)
    )
    return legal


# ---------------------------------------------------------------------------- switches
def _column(name: str, values: list, dtype=None) -> Table:
    return {name: np.array(values, dtype=dtype)}


def _pipeline_options(space: SearchSpace, pp: int) -> Table:
    """(schedule, virtual_stages) pairs legal for ``pp``; with pp == 1 the schedule is moot: keep 1f1b."""
    if pp == 1:
        return {
            "pipeline_schedule": np.array([SCHEDULE_CODES["1f1b"]]),
            "virtual_stages": np.array([1], dtype=np.int64),
        }
    schedules: list[PipelineSchedule] = list(PIPELINE_SCHEDULES) + ["interleaved_1f1b"] * len(
        space.bounds.virtual_stage_choices
    )
    stages = [1] * len(PIPELINE_SCHEDULES) + list(space.bounds.virtual_stage_choices)
    keep = []
    for schedule, virtual in zip(schedules, stages):
        try:
            check_parallel_config(
                ParallelConfig(pp=pp, pipeline_schedule=schedule, virtual_stages=virtual),
                space.model,
            )
            keep.append((schedule, virtual))
        except ValueError:
            pass
    return {
        "pipeline_schedule": np.array([SCHEDULE_CODES[s] for s, _ in keep], dtype=np.int64),
        "virtual_stages": np.array([v for _, v in keep], dtype=np.int64),
    }


def _sequence_parallel_choices(space: SearchSpace, tp: int, cp: int) -> list[bool]:
    choices = []
    for sp in (False, True):
        try:
            config = ParallelConfig(tp=tp, cp=cp, sequence_parallel=sp)
            check_parallel_config(config, space.model)
            check_sequence_fits(config, space.training.sequence_length_tokens)
            choices.append(sp)
        except ValueError:
            pass
    return choices


def _micro_batch_choices(space: SearchSpace, dp: int) -> list[int]:
    sizes = []
    for size in powers_of_two_up_to(space.bounds.max_micro_batch_size):
        try:
            ParallelConfig(dp=dp, micro_batch_size=size).num_micro_batches(
                space.training.sequences_per_step
            )
            sizes.append(size)
        except ValueError:
            pass
    return sizes


def _training_switches(space: SearchSpace, *, dp: int, tp: int, pp: int, cp: int) -> Table:
    bounds = space.bounds
    sp_choices = space.memo("sp", (tp, cp), lambda: _sequence_parallel_choices(space, tp, cp))
    micro_batches = space.memo("micro_batch", (dp,), lambda: _micro_batch_choices(space, dp))
    table = _column("sequence_parallel", sp_choices, bool)
    table = cross(table, _column("zero_stage", list(bounds.zero_stages), np.int64))
    table = cross(table, space.memo("pipeline", (pp,), lambda: _pipeline_options(space, pp)))
    table = cross(table, _column("micro_batch_size", micro_batches, np.int64))
    return cross(
        table,
        _column("recompute", [RECOMPUTE_CODES[p] for p in bounds.recompute_policies], np.int64),
    )


def kv_dtype_choices(space: SearchSpace) -> list[str]:
    """KV-cache dtypes the search tries: ``SearchBounds.kv_dtypes`` where given, else the one
    the workload names (``Inference(kv_dtype=...)``, ``--kv-dtype``), else the workload's default
    and fp8 (every engine's fp8 KV cache)."""
    if space.bounds.kv_dtypes is not None:
        return list(space.bounds.kv_dtypes)
    if "kv_dtype" in space.inference.model_fields_set:
        return [space.inference.kv_dtype]
    return sorted(
        {space.inference.kv_dtype, "fp8"},
        key=["fp32", "bf16", "fp16", "fp8", "fp4", "int8", "int4"].index,
    )


def _inference_switches(space: SearchSpace, *, tp: int, pp: int, ep: int) -> Table:
    """Batch size per attention replica (0 = the largest that memory and the SLOs allow, or what a
    fixed ``concurrency`` needs), KV dtype (cost-model codes), redundant experts, two-batch overlap."""
    from cost_model import KV_DTYPE_CODES

    bounds, workload = space.bounds, space.inference
    sweep = bounds.batch_size_sweep and workload.concurrency is None
    batches = [0] + powers_of_two_up_to(bounds.max_batch_size) if sweep else [0]
    table = _column("batch_size", batches, np.int64)
    table = cross(
        table, _column("kv_dtype", [KV_DTYPE_CODES[d] for d in kv_dtype_choices(space)], np.int64)
    )
    redundant = [0]
    if (
        ep > 1 and space.model.moe is not None
    ):  # the fewest slots that fill every rank, plus whole rounds
        fewest = minimum_redundant_experts(num_experts=space.model.moe.num_routed_experts, ep=ep)
        redundant = sorted({fewest + m * ep for m in bounds.redundant_expert_multiples})
    table = cross(table, _column("num_redundant_experts", redundant, np.int64))
    from cost_model import PHASE_CODES

    overlap = [False, True] if bounds.two_batch_overlap and (tp > 1 or ep > 1) else [False]
    table = cross(table, _column("two_batch_overlap", overlap, bool))
    return cross(table, _column("phase", [PHASE_CODES[bounds.phase]], np.int64))
