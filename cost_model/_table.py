"""A *config table*: many ``ParallelConfig`` rows as columns of numpy arrays.

The cost model is written once, over tables (a single config is a table of one), so that the
search can price hundreds of thousands of layouts per second without building pydantic objects.

Columns, one per ``ParallelConfig`` field (same names):

=========================== ========= =====================================================
column                      dtype     meaning
=========================== ========= =====================================================
``dp tp pp cp ep etp``      int64     degrees
``sequence_parallel``       bool      SP switch on the tp axis
``attention_data_parallel`` bool      attention data-parallel over the tp ranks (inference)
``zero_stage``              int64     0, 1, 2, 3 (3 = FSDP: parameters sharded too)
``pipeline_schedule``       int64     code in ``SCHEDULE_CODES``
``virtual_stages``          int64     model chunks per pipeline rank (interleaved 1F1B)
``micro_batch_size``        int64     sequences per micro-batch
``recompute``               int64     code in ``RECOMPUTE_CODES``
=========================== ========= =====================================================

Extra columns (any name not above) ride along untouched; the inference side adds e.g.
``batch_size``, ``num_redundant_experts`` and ``kv_dtype`` there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from cost_model._parallel import ParallelConfig

#: ``pipeline_schedule`` codes.
SCHEDULE_CODES: dict[str, int] = {"gpipe": 0, "1f1b": 1, "interleaved_1f1b": 2, "zero_bubble": 3}
#: ``recompute`` codes.
RECOMPUTE_CODES: dict[str, int] = {"none": 0, "selective": 1, "full": 2}

_INT_COLUMNS = (
    "dp",
    "tp",
    "pp",
    "cp",
    "ep",
    "etp",
    "zero_stage",
    "virtual_stages",
    "micro_batch_size",
)
_BOOL_COLUMNS = ("sequence_parallel", "attention_data_parallel")
_CODE_COLUMNS = {"pipeline_schedule": SCHEDULE_CODES, "recompute": RECOMPUTE_CODES}
#: The columns every table has, in ``ParallelConfig`` field order.
CONFIG_COLUMNS: tuple[str, ...] = tuple(ParallelConfig.model_fields)

ConfigTable = dict[str, np.ndarray]


def table_length(table: Mapping[str, np.ndarray]) -> int:
    """Number of rows; raises ``ValueError`` if the columns disagree or a config column is missing."""
    missing = [name for name in CONFIG_COLUMNS if name not in table]
    if missing:
        raise ValueError(
            f"config table is missing columns {missing}; a table needs {list(CONFIG_COLUMNS)}"
        )
    lengths = {
        name: np.shape(column)[0] if np.ndim(column) else -1 for name, column in table.items()
    }
    distinct = set(lengths.values())
    if len(distinct) != 1 or -1 in distinct:
        raise ValueError(
            f"config table columns must be 1-D arrays of one length; got lengths {lengths}"
        )
    return distinct.pop()


def configs_to_table(configs: Iterable[ParallelConfig], **extra_columns) -> ConfigTable:
    """Columns of ``configs`` (see the module docstring) plus ``extra_columns`` (same length)."""
    configs = list(configs)
    table: ConfigTable = {}
    for name in _INT_COLUMNS:
        table[name] = np.fromiter(
            (getattr(c, name) for c in configs), dtype=np.int64, count=len(configs)
        )
    for name in _BOOL_COLUMNS:
        table[name] = np.fromiter(
            (getattr(c, name) for c in configs), dtype=bool, count=len(configs)
        )
    for name, codes in _CODE_COLUMNS.items():
        table[name] = np.fromiter(
            (codes[getattr(c, name)] for c in configs), dtype=np.int64, count=len(configs)
        )
    table = {name: table[name] for name in CONFIG_COLUMNS}
    for name, values in extra_columns.items():
        table[name] = np.asarray(values)
    table_length(table)
    return table


def table_from_columns(length: int | None = None, **columns) -> ConfigTable:
    """A table from column arrays (or scalars, broadcast); missing config columns take the
    ``ParallelConfig`` defaults. String values of coded columns are converted to their codes.

    Values are not validated against a model here: use ``check_table`` for the rules.
    """
    arrays = {name: np.asarray(value) for name, value in columns.items()}
    if length is None:
        sizes = {a.shape[0] for a in arrays.values() if a.ndim}
        if len(sizes) > 1:
            raise ValueError(f"columns have different lengths {sorted(sizes)}")
        length = sizes.pop() if sizes else 1
    table: ConfigTable = {}
    for name, field in ParallelConfig.model_fields.items():
        value = arrays.pop(name, field.default)
        if name in _CODE_COLUMNS:
            value = _encode(name, value)
        dtype = bool if name in _BOOL_COLUMNS else np.int64
        table[name] = np.broadcast_to(np.asarray(value, dtype=dtype), (length,)).copy()
    for name, value in arrays.items():
        table[name] = (
            np.broadcast_to(value, (length,) + value.shape[1:]).copy() if value.ndim <= 1 else value
        )
    table_length(table)
    return table


def _encode(name: str, value) -> np.ndarray:
    codes = _CODE_COLUMNS[name]
    array = np.asarray(value)
    if array.dtype.kind in "US":
        unknown = set(np.unique(array).tolist()) - set(codes)
        if unknown:
            raise ValueError(f"{name} ({sorted(unknown)[0]!r}) must be one of {list(codes)}")
        return np.vectorize(codes.__getitem__, otypes=[np.int64])(array)
    return array


def table_row(table: Mapping[str, np.ndarray], index: int) -> ParallelConfig:
    """Row ``index`` as a ``ParallelConfig`` (extra columns are not part of it)."""
    values = {}
    for name in CONFIG_COLUMNS:
        value = table[name][index]
        if name in _CODE_COLUMNS:
            value = {code: label for label, code in _CODE_COLUMNS[name].items()}[int(value)]
        elif name in _BOOL_COLUMNS:
            value = bool(value)
        else:
            value = int(value)
        values[name] = value
    return ParallelConfig(**values)


def select_rows(table: Mapping[str, np.ndarray], rows) -> ConfigTable:
    """A new table of the given rows (an index array or a boolean mask), all columns kept."""
    return {name: np.asarray(column)[rows] for name, column in table.items()}
