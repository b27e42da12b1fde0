"""Reading a selected dataset's shard through the compact copy its plan holds (``materialize_selections``).

A plan written with ``materialize_selections`` holds, per shard of a dataset with a selection, a copy of the rows
it reads from that shard (``zephon.plan.format``: ``COPIES_FILE``, ``COPIES_DIR``; written by
``zephon.planner.copies``). ``CopiedShard`` stands in for the source shard: asked for source rows, it
reads the copy rows that hold them. The copy's row ``i`` is source row ``source_rows[i]`` (its
``COPY_ROW_COLUMN``, read once when the copy is opened: 8 bytes a row), so source row ``r`` is copy row
``searchsorted(source_rows, r)``.

Checked when a copy is opened, like a local shard: it exists with the size, rows and footer fingerprint recorded
in ``COPIES_FILE`` (sealed in the plan's integrity record), and its source rows are sorted and distinct. A row
the plan asks for that the copy lacks is an error naming both files, never a wrong document.

Errors about a document name the source shard and row (what ``zephon show`` and provenance name); errors about the
file name the copy. The source shard is never opened.

Example: the copy of shard 3 holds source rows [2, 7, 950]; ``read([950, 2])`` decodes the copy's row groups
holding copy rows 2 and 0 and returns the texts of source rows 950 and 2.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

from zephon.errors import DatasetError, one_line
from zephon.executor.read.bad_documents import BadDocuments
from zephon.executor.read.parquet import ParquetShard
from zephon.plan.format import COPY_ROW_COLUMN
from zephon.plan.records import ShardRef

__all__ = ["CopiedShard"]

_REPLAN = "restore the plan bundle's selected/ directory, or re-plan"


class CopiedShard:
    """Source shard ``source`` read through its copy ``copy`` (see the module docstring)."""

    __slots__ = ("_documents", "copy", "shard", "source", "source_rows")

    def __init__(self, source: ShardRef, copy: ShardRef, documents: BadDocuments) -> None:
        self.source = source
        self.copy = copy
        self._documents = documents
        where = f"dataset {source.dataset!r}: the copy {copy.uri} of shard {source.uri}"
        try:
            size = os.path.getsize(copy.uri)
        except OSError as exc:
            raise DatasetError(f"{where} must exist as planned, got {exc.strerror} — {_REPLAN}") from exc
        if size != copy.bytes:
            raise DatasetError(f"{where} must be {copy.bytes} bytes as planned, got {size} — {_REPLAN}")
        self.shard = ParquetShard(copy, copy.uri, documents, check_fingerprint=True)
        try:
            column = self.shard.file.read(columns=[COPY_ROW_COLUMN], use_threads=False).column(0)
        except (OSError, ValueError, KeyError, pa.ArrowException) as exc:
            raise DatasetError(f"{where} must hold {COPY_ROW_COLUMN}, got {one_line(exc)} — {_REPLAN}") from exc
        rows = column.to_numpy().astype(np.int64)
        if len(rows) and (np.any(np.diff(rows) <= 0) or rows[0] < 0 or rows[-1] >= source.rows):
            raise DatasetError(f"{where} must hold sorted distinct rows of the shard, got others — {_REPLAN}")
        self.source_rows = rows

    def read(self, rows: np.ndarray) -> list[object]:
        """Texts of source ``rows`` in the order given (None: a skipped bad document)."""
        at = np.searchsorted(self.source_rows, rows)
        inside = at < len(self.source_rows)
        found = np.zeros(len(rows), bool)
        found[inside] = self.source_rows[at[inside]] == rows[inside]
        if not found.all():
            bad = int(rows[~found][0])
            raise DatasetError(
                f"dataset {self.source.dataset!r}: row {bad} of shard {self.source.uri} must be in its copy "
                f"{self.copy.uri}, got a copy without it — {_REPLAN}"
            )
        values = self.shard.values(at)
        if not self.shard.nulls:
            return values
        text, ref = self._documents.text, self.source
        return [text(ref, row, v) for row, v in zip(rows.tolist(), values, strict=True)]

    def close(self) -> None:
        self.shard.close()
