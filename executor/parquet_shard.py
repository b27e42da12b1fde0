"""Reading the text column of one Parquet shard, a row group at a time.

``ParquetShard`` opens a shard and checks it before any row is used — a shard that changed since planning is
refused, never read: the planned row count (footer), the footer fingerprint when the reader asks for it (the
last 8 bytes and the footer are read again: a few KB, no data page), and that the text column exists and
holds strings. Only the text column is decoded, one row group at a time and each row group once: its values
stay in ``values`` (converted to Python once), so gathering texts is a list lookup.

In range mode (``StoreOptions(remote_read="range")``) the file is a pinned object read by range requests
(``zephon.storage.objects.range_file``): the text column's chunks of the row groups to decode are fetched
concurrently first, then decoded from memory and dropped.

A row group that cannot be decoded is a corrupt shard (``DatasetError``); a null text is a bad document,
handed to the reader's ``BadDocuments`` policy.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zephon.errors import DatasetError, one_line
from zephon.executor.bad_documents import FIELD_HINT, BadDocuments
from zephon.plan.records import ShardRef
from zephon.storage.objects.range_file import RangeFile
from zephon.storage.scan import parquet_fingerprint

_ARROW_ERRORS = (OSError, ValueError, pa.ArrowException)


class ParquetShard:
    """One open Parquet shard: its file, row group starts, and the texts of the row groups decoded so far.

    State: ``values`` (the text of every row of the decoded row groups, None elsewhere), ``decoded`` (per row
    group: already in ``values``) and ``nulls`` (a decoded row group holds a null: rows must be checked one by
    one).
    """

    __slots__ = ("_columns", "_documents", "decoded", "file", "nulls", "ranges", "ref", "rg_starts", "values")

    def __init__(
        self, ref: ShardRef, path: str | RangeFile, documents: BadDocuments, *, check_fingerprint: bool
    ) -> None:
        """Open ``path`` (the shard ``ref``, its cached copy, or a pinned object read by ranges) and check it;
        ``check_fingerprint``: compare the footer with the planned fingerprint too."""
        self.ref = ref
        #: Range mode: the object, whose row groups are fetched ahead of decoding (``zephon.storage.objects``).
        self.ranges = path if isinstance(path, RangeFile) else None
        self._documents = documents
        field = documents.field
        where = f"dataset {ref.dataset!r}: shard {ref.uri}"
        try:
            if isinstance(path, RangeFile):
                self.file = pq.ParquetFile(path, metadata=path.metadata)
            else:
                self.file = pq.ParquetFile(path)
            actual = parquet_fingerprint(path)[1] if check_fingerprint and isinstance(path, str) else None
        except _ARROW_ERRORS as exc:
            raise DatasetError(
                f"{where} must be a readable Parquet file, got {one_line(exc)} — restore it from its source or re-plan"
            ) from exc
        meta = self.file.metadata
        if meta.num_rows != ref.rows:
            raise DatasetError(
                f"{where} changed since planning: rows must be {ref.rows}, got {meta.num_rows} — restore the "
                "planned data or re-plan"
            )
        if actual is not None and actual != ref.fingerprint:
            raise DatasetError(
                f"{where} changed since planning: its Parquet footer (row groups, offsets, statistics) must match "
                f"fingerprint {ref.fingerprint}, got {actual} — restore the planned data or re-plan"
            )
        schema = self.file.schema_arrow
        #: Record mode (``documents.convert``, chat): the columns read, each row handed over as a dict.
        self._columns: list[str] | None = None
        convert = documents.convert
        if convert is not None:
            missing = [c for c in convert.required if c not in schema.names]
            if missing:
                raise DatasetError(
                    f"{where} must have the columns {list(convert.required)}, got columns {schema.names} — choose "
                    "the chat layout and field that match the data (tokenize_chat(layout=..., field=...))"
                )
            wanted = schema.names if convert.columns is None else convert.columns
            self._columns = [c for c in wanted if c in schema.names]
        elif field not in schema.names:
            raise DatasetError(
                f"{where} must have the column {field!r}, got columns {schema.names} — choose one of them as the "
                f"text field: {FIELD_HINT}"
            )
        kind = schema.field(field).type if self._columns is None else pa.string()
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind)):
            raise DatasetError(
                f"{where} column {field!r} must hold strings, got {kind} — choose a text column as the text field "
                f"({FIELD_HINT}), or convert the column to strings"
            )
        counts = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        self.rg_starts: np.ndarray = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        self.values: list[object] = []
        self.decoded: np.ndarray | None = None
        self.nulls = False

    def row_group(self, g: int) -> pa.Array:
        """The text column of row group ``g``; a row group that cannot be decoded is a corrupt shard."""
        try:
            if self._columns is not None:  # record mode: one struct per row
                table = self.file.read_row_group(g, columns=self._columns)
                return pa.StructArray.from_arrays([c.combine_chunks() for c in table.columns], names=self._columns)
            return self.file.read_row_group(g, columns=[self._documents.field]).column(0).combine_chunks()
        except _ARROW_ERRORS as exc:
            first, end = int(self.rg_starts[g]), int(self.rg_starts[g + 1])
            raise DatasetError(
                f"dataset {self.ref.dataset!r}: shard {self.ref.uri} row group {g} (rows {first}-{end - 1}) must "
                f"decode, got {type(exc).__name__}: {one_line(exc)} — the file is corrupt: restore it from its "
                "source or re-export it, then re-plan"
            ) from exc

    def decode(self, rows: np.ndarray) -> None:
        """Decode the row groups holding ``rows`` that are not yet in ``values``."""
        starts = self.rg_starts
        if self.decoded is None:
            self.decoded = np.zeros(len(starts) - 1, dtype=bool)
            self.values = [None] * int(starts[-1])
        groups = np.searchsorted(starts, rows, side="right") - 1
        todo = np.unique(groups[~self.decoded[groups]]).tolist()
        if self.ranges is not None and todo:
            for column_name in self._columns or [self._documents.field]:  # concurrent GETs, before decoding
                self.ranges.fetch_row_groups(column_name, todo)
        try:
            for g in todo:
                column = self.row_group(g)
                self.values[int(starts[g]) : int(starts[g + 1])] = column.to_pylist()
                self.nulls |= column.null_count > 0 or pa.types.is_null(column.type) or self._columns is not None
                self.decoded[g] = True
        finally:
            if self.ranges is not None:
                self.ranges.release()

    def read(self, rows: np.ndarray) -> list[str | None]:
        """Texts of ``rows``, each checked (a shard with nulls), row group by row group."""
        self.decode(rows)
        groups = np.searchsorted(self.rg_starts, rows, side="right") - 1
        out: list[str | None] = [None] * len(rows)
        for g in np.unique(groups).tolist():
            idx = np.flatnonzero(groups == g)
            for i, row in zip(idx.tolist(), rows[idx].tolist(), strict=True):
                out[i] = self._documents.text(self.ref, row, self.values[row])
        return out

    def iter_texts(self) -> Iterator[list[str | None]]:
        """Every text in row order, one row group at a time, checked; nothing is kept in ``values``."""
        for g in range(self.file.metadata.num_row_groups):
            column = self.row_group(g)
            first = int(self.rg_starts[g])
            yield [self._documents.text(self.ref, first + i, v) for i, v in enumerate(column.to_pylist())]
