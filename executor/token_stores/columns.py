"""Parquet and JSONL files with a ``list<int>`` token column (``input_ids``, ``tokens``), read with pyarrow.

A row is a document; ``tokens_field`` names the column (default: ``input_ids``, else ``tokens``), a list of
integers (``list``/``large_list`` of int8..uint64); its value type is the store's dtype (JSON: int64). A null
list or a null id is refused with its row.

What is read when: neither format has a per-row token index, so opening reads the token column once to take
each list's length (Parquet: that column only, a row group at a time; JSONL: the whole file, parsed, kept).
``read(a, b)`` reads the Parquet row groups holding rows ``a .. b-1`` (that column only; remotely through
range reads of exactly those column chunks) and slices the rows out.

Worked example: a Parquet file of row groups of 3 and 2 rows, ``input_ids`` lists of 4, 3, 6 | 2, 5 ids →
counts ``[4, 3, 6, 2, 5]``; ``read(2, 4)`` reads both row groups and returns 6 + 2 ids.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from zephon.errors import DatasetError
from zephon.executor.token_stores.files import Blob, LocalBlob, StoreFiles
from zephon.executor.token_stores.store import CountedPart
from zephon.storage.jsonl import decompress
from zephon.storage.seekable import SeekableSpans

__all__ = ["ColumnPart", "column_parts"]

DEFAULT_FIELDS = ("input_ids", "tokens")


class _BlobFile(SeekableSpans):
    """A remote blob as a seekable file for pyarrow (each read a range request)."""

    def __init__(self, blob: Blob) -> None:
        super().__init__()
        self._blob = blob

    def size(self) -> int:
        return self._blob.size

    def span(self, start: int, end: int) -> bytes:
        return bytes(self._blob.read(start, end))


def _field(blob: Blob, schema: pa.Schema, wanted: str | None) -> tuple[str, np.dtype]:
    names = [wanted] if wanted else [n for n in DEFAULT_FIELDS if n in schema.names][:1]
    if not names or names[0] not in schema.names:
        raise DatasetError(
            f"{blob.name} must have a token column {wanted or ' or '.join(DEFAULT_FIELDS)!r}, got columns "
            f"{schema.names} — pass tokens_field= naming the list<int> column"
        )
    kind = schema.field(names[0]).type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_integer(kind.value_type):
        raise DatasetError(
            f"token column {names[0]!r} of {blob.name} must be a list of integers, got {kind} — pass tokens_field= "
            "naming the list<int> column (a text column is a raw dataset, not a token store)"
        )
    return names[0], np.dtype(kind.value_type.to_pandas_dtype())


def _lengths(blob: Blob, field: str, column: pa.ChunkedArray, first_row: int, *, jsonl: bool = False) -> np.ndarray:
    lengths = pc.list_value_length(column)
    if lengths.null_count:
        row = first_row + int(np.flatnonzero(lengths.is_null().to_numpy(zero_copy_only=False))[0])
        missing = " (null, or a line without that key)" if jsonl else ""
        raise DatasetError(
            f"token column {field!r} of {blob.name} must hold a list of ids in every row, got none at row {row}"
            f"{missing} — drop or fix that row"
        )
    if pc.list_flatten(column).null_count:  # (the chunks combined only to name the row)
        ids = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        flat = pc.list_flatten(ids)
        at = int(np.flatnonzero(flat.is_null().to_numpy(zero_copy_only=False))[0])
        row = int(pc.list_parent_indices(ids)[at].as_py())
        offsets = ids.offsets
        k = at - (offsets[row].as_py() - offsets[0].as_py())
        raise DatasetError(
            f"token column {field!r} of {blob.name} must hold integer ids only, got a null at row {first_row + row} "
            f"(id {k}) — drop or fix that row"
        )
    return lengths.to_numpy(zero_copy_only=False).astype(np.int64)


class ColumnPart(CountedPart):
    """One Parquet or JSONL file with a token column (see the module docstring)."""

    def __init__(self, blob: Blob, fmt: str, tokens_field: str | None) -> None:
        #: The file (its ``format``: parquet, jsonl, jsonl.gz, jsonl.zst); its other columns are metadata that a
        #: selection reads (``zephon.planner.selection.stores``).
        self.name, self.blob, self.format = blob.name, blob, fmt
        self._table: pa.Table | None = None
        if fmt == "parquet":
            self._file = pq.ParquetFile(blob.path if isinstance(blob, LocalBlob) else _BlobFile(blob))
            self.field, self.dtype = _field(blob, self._file.schema_arrow, tokens_field)
            meta = self._file.metadata
            rows = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
            self.group_starts = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
            counts = [
                _lengths(blob, self.field, self._file.read_row_group(g, columns=[self.field])[self.field], int(s))
                for g, s in enumerate(self.group_starts[:-1])
            ]
            self.counts = np.concatenate(counts) if counts else np.zeros(0, np.int64)
        else:
            try:
                text = decompress(bytes(blob.read(0, blob.size)), fmt)
                table = pajson.read_json(pa.BufferReader(text)) if text.strip() else pa.table({})
            except (ValueError, pa.ArrowInvalid) as exc:
                raise DatasetError(f"{blob.name} must be JSON lines, got {str(exc)[:160]} — fix the file") from None
            self.field, self.dtype = _field(blob, table.schema, tokens_field)
            self._table = table.select([self.field])
            self.counts = _lengths(blob, self.field, self._table[self.field], 0, jsonl=True)
            self.group_starts = np.asarray([0, len(self.counts)], np.int64)

    def read(self, start: int, stop: int) -> np.ndarray:
        if stop == start:
            return np.zeros(0, self.dtype)
        if self._table is not None:
            rows, first = self._table[self.field], 0
        else:
            lo = int(np.searchsorted(self.group_starts, start, side="right")) - 1
            hi = int(np.searchsorted(self.group_starts, stop, side="left"))
            rows = self._file.read_row_groups(list(range(lo, hi)), columns=[self.field])[self.field]
            first = int(self.group_starts[lo])
        values = pc.list_flatten(rows.slice(start - first, stop - start))
        return values.to_numpy().astype(self.dtype, copy=False)

    def read_loss(self, start: int, stop: int) -> None:
        return None

    def read_texts(self, start: int, stop: int) -> list[str]:
        raise AssertionError("a token column holds ids")  # pragma: no cover


COLUMN_SUFFIXES = {".parquet": "parquet", ".jsonl": "jsonl", ".jsonl.gz": "jsonl.gz", ".jsonl.zst": "jsonl.zst"}


def column_fmt(name: str) -> str | None:
    for suffix, fmt in COLUMN_SUFFIXES.items():
        if name.endswith(suffix):
            return fmt
    return None


def column_parts(files: StoreFiles, fmt: str, tokens_field: str | None) -> list[ColumnPart]:
    """The path's file, else every file of ``fmt`` (``parquet`` or ``jsonl``) under the folder it names."""
    if "" in files.files and column_fmt(files.path):
        chosen = [("", column_fmt(files.path) or "")]
    else:
        chosen = [(s, column_fmt(s) or "") for s in sorted(files.files) if s.startswith("/") and column_fmt(s)]
        chosen = [(s, f) for s, f in chosen if f.split(".")[0] == fmt]
    if not chosen:
        raise DatasetError(
            f"token store {files.path!r} must be a {fmt} file or a folder of them, got none — fix the path"
        )
    parts = [ColumnPart(files.files[s], f, tokens_field) for s, f in chosen]
    if len({str(p.dtype) for p in parts}) > 1:
        raise DatasetError(
            f"token store {files.path!r} must hold one id type, got {sorted({str(p.dtype) for p in parts})} across "
            "its files — cast the token columns to one type"
        )
    return parts
