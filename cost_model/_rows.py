"""Rows alike in every argument of a table, priced once per group and scattered back.

Large tables repeat the same values (a mesh crossed with switches a formula ignores, the same
group size and message over many layouts). ``distinct_rows`` finds one representative row per
distinct tuple of values; ``RowPartition`` (one per table) remembers the groupings found by
earlier calls so later calls on alike rows skip the search; ``evaluate`` prices a per-row
function on the representatives only. Every grouping is checked exactly against its rows before
it is used, so the results equal pricing every row.
"""

from __future__ import annotations

import dataclasses

import numpy as np

_DISTINCT_MIN_SIZE = 4096


def distinct_rows(values, *, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(first, inverse)``: one representative row of each distinct tuple of ``values`` (1-d
    arrays of ``size`` numbers) and, for every row, the index of its representative, so that
    ``value[first][inverse]`` equals ``value`` for each of them (NaN equal to NaN).

    Each tuple is hashed into one int64 (wrapping arithmetic) and the distinct keys found by
    sorting; a hash collision is caught by checking every value against its representative and
    falls back to every row its own representative.
    """
    if not values:
        return np.zeros(1, dtype=np.int64), np.zeros(size, dtype=np.int64)
    if any(value.dtype.kind not in "biuf" for value in values):
        return np.arange(size), np.arange(size)
    key = np.zeros(size, dtype=np.int64)
    for value in values:
        if value.dtype.kind == "f":
            bits = value.astype(np.float64).view(np.int64)
        else:
            bits = value.astype(np.int64)
        key = key * np.int64(0x9E3779B1) + bits
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    if not all(_alike(value, first, inverse) for value in values):
        first, inverse = np.arange(size), np.arange(size)
    return first, inverse


def _alike(value: np.ndarray, first: np.ndarray, inverse: np.ndarray, step: int = 1) -> bool:
    """``value`` equals its representative's value on every row (NaN equal to NaN); with
    ``step`` > 1, on every ``step``-th row only (a cheap first look that rejects most misfits)."""
    rows = inverse[::step]
    # gather through whichever index array is shorter (np.take: faster than [] here)
    if first.size < rows.size:
        represented = np.take(np.take(value, first), rows)
    else:
        represented = np.take(value, np.take(first, rows))
    value = value[::step]
    same = represented == value
    if same.all():
        return True
    return value.dtype.kind == "f" and bool(
        (same | (np.isnan(represented) & np.isnan(value))).all()
    )


#: Rows apart in the first look of ``RowPartition.grouping`` at whether inputs fit a grouping.
_GLANCE_STEP = 67


class RowPartition:
    """Groups of alike rows of one table, remembered across the calls that price it.

    Calls on one table mostly vary with a few columns (group sizes, ranks per node, tokens),
    so a grouping found once serves the next calls of the same kind: checking that a call's
    inputs are alike on it costs one gather and compare per input, not a sort. A few
    groupings are kept (inputs of different kinds repeat on different rows), and each call site
    tries the one it used last first. Exact: a grouping is used only where every input equals
    its group's representative.
    """

    def __init__(self, size: int) -> None:
        self.size = size  # rows of the table
        self._groupings: list[tuple[np.ndarray, np.ndarray]] = []
        self._last: dict[str, int] = {}

    def grouping(
        self, values, *, size: int, site: str = ""
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """``(first, inverse)`` as ``distinct_rows`` returns them for ``values``, or a coarser
        one under which they are alike too; None where the rows hardly repeat (more than half
        of them distinct), so that pricing every row costs less than grouping them."""
        order = sorted(
            range(len(self._groupings)),
            key=lambda index: (index != self._last.get(site), len(self._groupings[index][0])),
        )
        for index in order:
            first, inverse = self._groupings[index]
            if inverse.size != size or not all(
                _alike(value, first, inverse, _GLANCE_STEP) for value in values
            ):
                continue
            if 2 * first.size > size:  # too fine to use: every row is priced, no check needed
                self._last[site] = index
                return None
            if all(_alike(value, first, inverse) for value in values):
                self._last[site] = index
                return first, inverse
        first, inverse = distinct_rows(values, size=size)
        if len(self._groupings) >= _GROUPINGS_KEPT:  # forget the finest
            finest = max(range(len(self._groupings)), key=lambda i: len(self._groupings[i][0]))
            del self._groupings[finest]
            self._last = {
                key: index - (index > finest)
                for key, index in self._last.items()
                if index != finest
            }
        self._groupings.append((first, inverse))
        self._last[site] = len(self._groupings) - 1
        return None if 2 * first.size > size else (first, inverse)

    def evaluate(self, function, /, **arguments):
        """``function(**arguments)`` computed on one row of each group alike in every array
        argument, scattered back to all rows. ``function`` must price each row from that row's
        values alone (element-wise); it may return None (then so does this). Arrays (numpy) of
        one value per row are the row arguments, and so are dataclasses whose array fields hold
        one value or one row of values per row (picked field by field); scalars and objects pass
        through. An array of another shape, a list or tuple, a small table and rows that hardly
        repeat make it call ``function`` on all rows. A tuple of results is scattered item by
        item."""
        if self.size < _DISTINCT_MIN_SIZE:
            return function(**arguments)
        columns, records, checked = {}, {}, []
        for name, value in arguments.items():
            if isinstance(value, (list, tuple)):
                return function(**arguments)
            if isinstance(value, np.ndarray) and value.ndim > 0:
                if value.shape != (self.size,):
                    return function(**arguments)
                columns[name] = value
                checked.append(value)
            elif dataclasses.is_dataclass(value) and not isinstance(value, type):
                fields = self._row_fields(value)
                if fields is None:
                    return function(**arguments)
                records[name] = (value, fields)
                for field in fields.values():  # each column of a (rows, k) field
                    checked.extend(field.T if field.ndim == 2 else [field])
        if not checked:
            return function(**arguments)
        site = getattr(function, "__qualname__", getattr(function, "func", function).__name__)
        found = self.grouping(checked, size=self.size, site=site)
        if found is None:
            return function(**arguments)
        first, inverse = found
        picked = {name: value[first] for name, value in columns.items()}
        for name, (record, fields) in records.items():
            picked[name] = dataclasses.replace(
                record, **{field: value[first] for field, value in fields.items()}
            )
        result = function(**{**arguments, **picked})
        if isinstance(result, tuple):
            return tuple(_scattered(value, inverse) for value in result)
        return None if result is None else _scattered(result, inverse)

    def _row_fields(self, record) -> dict[str, np.ndarray] | None:
        """The fields of a dataclass argument that hold one value (or one row of values) per
        row; None where a field is an array of another length or rank."""
        fields = {}
        for field in dataclasses.fields(record):
            value = getattr(record, field.name)
            if isinstance(value, np.ndarray) and value.ndim > 0:
                if value.shape[0] != self.size or value.ndim > 2:
                    return None
                fields[field.name] = value
            elif isinstance(value, (list, tuple, dict)):
                return None
        return fields


#: Groupings a ``RowPartition`` keeps (the coarsest; a new one past this replaces the finest).
_GROUPINGS_KEPT = 6


def _scattered(value, inverse: np.ndarray):
    """Per-group results back on every row (the last axis is the group axis)."""
    return value if np.ndim(value) == 0 else np.take(np.asarray(value), inverse, axis=-1)
