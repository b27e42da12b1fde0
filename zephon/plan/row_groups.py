"""The row groups of a plan's samples files as one numbered sequence, each file's footer read only when needed.

A plan's samples are one file, or parts (``zephon.plan.format.samples_part``) that the writer cuts alike: every
part holds as many rows as the first, in the same row groups, the last part a prefix of them (its last group
maybe shorter). So the first part's footer gives every group's first row by arithmetic, and a reader that seeks
opens only the part it reads (``zephon.plan.bundle``: a part is checked when its footer is first read, here also
against the shape the first part gives it).

Invariant: ``first_row[i]`` is the plan position of row group ``i``'s first row; ``first_row[-1]`` the rows of all
files; group ``i`` is group ``i mod G`` of file ``i div G`` (G: the first file's groups) when there are parts.

Worked example, parts of 8 rows in groups of 3, 3, 2 and 19 rows in all: files of 8, 8 and 3 rows; G = 3; the
first part's group starts 0, 3, 6 (end 8) give ``first_row`` = 0 3 6 | 8 11 14 | 16 19 (7 groups), and group 6
(position 16..18) is group 0 of part 2 — found by arithmetic, with parts 0 and 2's footers read, not part 1's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zephon.errors import PlanFormatError
from zephon.plan.bundle import DAMAGED, CheckedFile

__all__ = ["RowGroups"]


class RowGroups:
    """The row groups of ``files`` (consecutive, in plan order), numbered from 0 across files."""

    def __init__(self, files: Sequence[CheckedFile]) -> None:
        self._files = list(files)
        self._readers: dict[int, pq.ParquetFile] = {}
        if len(self._files) <= 1:
            meta = self._files[0].metadata if self._files else None
            counts = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] if meta is not None else []
            self._per_file = len(counts)
            self.first_row = np.concatenate(([0], np.cumsum(counts, dtype=np.int64))).astype(np.int64)
        else:  # parts: the first part's groups, repeated, the last part a prefix of them
            meta = self._files[0].metadata
            counts = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
            starts = np.concatenate(([0], np.cumsum(counts, dtype=np.int64)))
            part_rows = int(starts[-1])
            self._per_file = len(counts)
            firsts = []
            for k, f in enumerate(self._files):
                local = starts[:-1][starts[:-1] < f.rows]
                firsts.append(k * part_rows + local)
            total = sum(f.rows for f in self._files)
            self.first_row = np.concatenate([*firsts, [total]]).astype(np.int64)
        self._mins: dict[tuple[int, str], int] = {}

    @property
    def count(self) -> int:
        """Row groups in all files."""
        return len(self.first_row) - 1

    @property
    def num_rows(self) -> int:
        return int(self.first_row[-1])

    def locate(self, i: int) -> tuple[int, int]:
        """(file, row group in that file) of row group ``i``."""
        return divmod(i, self._per_file) if len(self._files) > 1 else (0, i)

    def group_of(self, positions: np.ndarray) -> np.ndarray:
        """The row group holding each of ``positions``."""
        return np.searchsorted(self.first_row, positions, side="right") - 1

    def _reader(self, f: int) -> pq.ParquetFile:
        reader = self._readers.get(f)
        if reader is None:
            file = self._files[f]
            reader = self._readers[f] = file.open()
            if f and len(self._files) > 1:
                self._check_shape(f, reader.metadata)
        return reader

    def _check_shape(self, f: int, meta: pq.FileMetaData) -> None:
        """Part ``f`` must have the row groups ``first_row`` gives it (the writer cuts every part alike)."""
        lo = f * self._per_file
        want = np.diff(self.first_row[lo : min(lo + self._per_file, self.count) + 1]).tolist()
        got = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        if got != want:
            raise PlanFormatError(
                f"{self._files[f].path} must have row groups of {want[:3]}... rows as the first part, got "
                f"{got[:3]}... ({len(got)} groups) — {DAMAGED}"
            )

    def read(self, i: int, columns: list[str]) -> pa.Table:
        """Row group ``i``, ``columns`` only."""
        f, g = self.locate(i)
        return self._files[f].read_row_group(self._reader(f), g, columns)

    def minimum(self, i: int, column: str) -> int:
        """The minimum of ``column`` in row group ``i``, from its file's footer statistics (no data read)."""
        hit = self._mins.get((i, column))
        if hit is not None:
            return hit
        f, g = self.locate(i)
        reader = self._reader(f)
        stats = reader.metadata.row_group(g).column(reader.schema_arrow.get_field_index(column)).statistics
        if stats is None or not stats.has_min_max:
            raise PlanFormatError(
                f"{self._files[f].path} row group {g} must have min/max statistics on {column!r}, got none — re-plan "
                "with this Zephon version"
            )
        self._mins[(i, column)] = value = int(stats.min)
        return value

    def last_at_most(self, column: str, value: int) -> int:
        """The last row group whose first ``column`` value (its minimum: the column is sorted) is ≤ ``value``, or
        0: a binary search over the groups' statistics, opening only the footers it probes (log2 of the groups)."""
        lo, hi = 0, self.count  # invariant: groups < lo start ≤ value; groups ≥ hi start > value
        while lo < hi:
            mid = (lo + hi) // 2
            if self.minimum(mid, column) <= value:
                lo = mid + 1
            else:
                hi = mid
        return max(lo - 1, 0)
