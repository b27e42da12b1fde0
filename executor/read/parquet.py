"""Reading the text column of one Parquet shard, a row group at a time.

``ParquetShard`` opens a shard and checks it before any row is used — a shard that changed since planning is
refused, never read: the planned row count (footer), the footer fingerprint when the reader asks for it (the
last 8 bytes and the footer are read again: a few KB, no data page), and that the text column exists and
holds strings. Only the text column is decoded, one row group at a time and each row group once: it stays an
Arrow array in ``groups`` while the shard is open, and only the rows asked for become Python strings (``read``:
one ``take`` per row group). Memory: an open shard holds its decoded text once, as UTF-8 bytes — Python
strings of the same rows take as much for ASCII text and 2-4× for text with one non-Latin-1 character (its
whole string widens), plus ~57 bytes per row, and they were kept alongside the rows' own copies handed out
(docs/performance.md, Memory).

Local shards decode on the process's decode pool (``zephon.executor.read.decode_pool``): the row groups a read
needs decode several at once, each on one pool thread, and are taken in row-group order. pyarrow's
``ParquetFile`` is used by the thread that opened it; any other thread opens its own handle on the file, with
the footer already parsed (~30 µs). Local files are read without pyarrow's pre-buffering, which
copies each column chunk once more before decompressing it (~20 % of decoding time, measured on snappy text).

In range mode (``StoreOptions(remote_read="range")``) the file is a pinned object read by range requests
(``zephon.storage.objects.range_file``): the text column's chunks of the row groups to decode are fetched
concurrently first, then decoded from memory on the reader's thread, one at a time, and dropped.

A row group that cannot be decoded is a corrupt shard (``DatasetError``); a null text is a bad document,
handed to the reader's ``BadDocuments`` policy.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zephon.errors import DatasetError, ZephonError, one_line
from zephon.executor.read.arrow_values import python_values
from zephon.executor.read.bad_documents import FIELD_HINT, BadDocuments, nested_hint
from zephon.executor.read.decode_pool import decode_pool
from zephon.executor.read.memory_release import release_now_and_then
from zephon.executor.read.shared_groups import SharedRowGroups
from zephon.executor.read.spill import Spill
from zephon.plan.format import COPY_ROW_COLUMN
from zephon.plan.records import ShardRef
from zephon.storage.objects.range_file import RangeFile
from zephon.storage.scan import parquet_fingerprint

_ARROW_ERRORS = (OSError, ValueError, pa.ArrowException)


#: View columns (Arrow's ``string_view`` / ``binary_view``, what Polars and DuckDB may hand pyarrow to write) as the
#: offset layout Arrow's ``take`` has kernels for (pyarrow 26 has none for views): the same values. Top-level
#: columns only: pyarrow 26 cannot write a nested view ("Slicing not implemented for StringView") and Polars writes
#: nested strings as ``large_string``, so no Parquet file holds one.
_VIEWS = {pa.string_view(): pa.large_string(), pa.binary_view(): pa.large_binary()}


def as_strings(column: pa.Array) -> pa.Array:
    """A column as the reader takes rows from it: a dictionary of strings (what pandas writes for a ``category``
    column) decoded, a view column cast to its offset layout (``_VIEWS``), anything else as it is."""
    if isinstance(column, pa.DictionaryArray):
        column = column.dictionary_decode()
    view = _VIEWS.get(column.type)
    return column.cast(view) if view is not None else column


class ParquetShard:
    """One open Parquet shard: its file, row group starts, and the texts of the row groups decoded so far.

    State: ``groups`` (per row group: its decoded text column, None until decoded) and ``nulls`` (a decoded row
    group holds a null, records are read, or a value read was not UTF-8: rows must be checked one by one).
    """

    __slots__ = (
        "_columns", "_documents", "_owner", "_path", "file", "groups", "nulls", "ranges", "ref", "rg_starts", "share",
        "spill",
    )  # fmt: skip

    def __init__(
        self,
        ref: ShardRef,
        path: str | RangeFile,
        documents: BadDocuments,
        *,
        check_fingerprint: bool,
        share: SharedRowGroups | None = None,
        spill: Spill | None = None,
    ) -> None:
        """Open ``path`` (the shard ``ref``, its cached copy, or a pinned object read by ranges) and check it;
        ``check_fingerprint``: compare the footer with the planned fingerprint too; ``share``: decoded row groups
        shared with the rank's other DataLoader workers (``zephon.executor.read.shared_groups``); ``spill``: the
        reader's budget for decoded text, past which a row group is kept in a file, mapped (``spill``; a row group
        mapped from the share is not counted: one copy for the workers, bounded by the share's own room check)."""
        self.ref = ref
        self.share = share
        self.spill = spill
        #: Range mode: the object, whose row groups are fetched ahead of decoding (``zephon.storage.objects``).
        self.ranges = path if isinstance(path, RangeFile) else None
        #: A local file's path, for other threads' own handles (None in range mode: decoded on one thread).
        self._path = path if isinstance(path, str) else None
        self._owner = threading.get_ident()  # the thread that opened ``file``; others open their own handle
        self._documents = documents
        field = documents.field
        where = f"dataset {ref.dataset!r}: shard {ref.uri}"
        try:
            if isinstance(path, RangeFile):
                self.file = pq.ParquetFile(path, metadata=path.metadata, pre_buffer=False)
            else:
                self.file = pq.ParquetFile(path, pre_buffer=False)
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
            # A plan's copy of a selected shard carries its source rows (zephon.executor.read.selected_copy): not data.
            self._columns = [c for c in wanted if c in schema.names and c != COPY_ROW_COLUMN]
        elif field not in schema.names:
            raise DatasetError(
                f"{where} must have the column {field!r}, got columns {schema.names} — choose one of them as the "
                f"text field: {FIELD_HINT}{nested_hint(field, schema.names)}"
            )
        kind = schema.field(field).type if self._columns is None else pa.string()
        if pa.types.is_dictionary(kind):  # pandas' ``category``: strings, stored once each (read decoded)
            kind = kind.value_type
        text = pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)
        if not (text or pa.types.is_null(kind)):
            raise DatasetError(
                f"{where} column {field!r} must hold strings, got {kind} — choose a text column as the text field "
                f"({FIELD_HINT}), or convert the column to strings"
            )
        counts = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        self.rg_starts: np.ndarray = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        self.groups: list[pa.Array | None] = [None] * meta.num_row_groups
        self.nulls = False

    def row_group(self, g: int) -> pa.Array:
        """The text column of row group ``g``, decoded on the calling thread; a row group that cannot be decoded
        is a corrupt shard."""
        own = self._path is None or threading.get_ident() == self._owner  # range mode: one reader at a time
        file = self.file
        try:
            if not own:
                file = pq.ParquetFile(self._path, metadata=self.file.metadata, pre_buffer=False)
            if self._columns is not None:  # record mode: one struct per row
                table = file.read_row_group(g, columns=self._columns, use_threads=False)
                columns = [as_strings(c.combine_chunks()) for c in table.columns]
                return pa.StructArray.from_arrays(columns, names=self._columns)
            table = file.read_row_group(g, columns=[self._documents.field], use_threads=False)
            return as_strings(table.column(0).combine_chunks())
        except ZephonError:
            raise  # a read refused before the bytes (range mode: a changed object, a forked process): its own words
        except _ARROW_ERRORS as exc:
            first, end = int(self.rg_starts[g]), int(self.rg_starts[g + 1])
            raise DatasetError(
                f"dataset {self.ref.dataset!r}: shard {self.ref.uri} row group {g} (rows {first}-{end - 1}) must "
                f"decode, got {type(exc).__name__}: {one_line(exc)} — the file is corrupt: restore it from its "
                "source or re-export it, then re-plan"
            ) from exc
        finally:
            if file is not self.file:
                file.close()

    def decode(self, rows: np.ndarray) -> np.ndarray:
        """Decode the row groups holding ``rows`` that are not decoded yet; the row group of each row."""
        groups = np.searchsorted(self.rg_starts, rows, side="right") - 1
        if len(self.groups) == 1:  # one row group (a small shard): no unique pass per call (~1 CPU ns a token)
            todo = [0] if self.groups[0] is None and len(rows) else []
        else:
            todo = [g for g in np.unique(groups).tolist() if self.groups[g] is None]
        if not todo:
            return groups
        if self.ranges is not None:
            for column_name in self._columns or [self._documents.field]:  # concurrent GETs, before decoding
                self.ranges.fetch_row_groups(column_name, todo)
        try:
            for g, (column, private) in zip(todo, self._decoded(todo), strict=True):
                self.nulls |= column.null_count > 0 or pa.types.is_null(column.type) or self._columns is not None
                spill = self.spill if private else None  # (a share's mapped file is not this process's memory)
                self.groups[g] = column if spill is None else spill.keep(self.ref.shard_id, g, column)
        finally:
            if self.ranges is not None:
                self.ranges.release()
        release_now_and_then()  # the row groups' compressed bytes and pages, freed to allocators that keep them
        return groups

    def _decoded(self, todo: list[int]) -> Iterator[tuple[pa.Array, bool]]:
        """Row groups ``todo`` decoded, in order, each with whether it is this process's own memory (not a share's
        mapped file): several at once on the decode pool (a local shard), else one by one on this thread. The
        first that fails raises; those not started yet are cancelled. With a share, those another worker decoded
        are mapped instead (``_shared``)."""
        if self.share is not None and self.ranges is None:
            shared = self._shared(todo, self.share)
            if shared is not None:
                rest = [g for g in todo if g not in shared]  # published by nobody: decoded here, on the pool
                decoded = dict(zip(rest, self._decoded_here(rest), strict=True)) if rest else {}
                for g in todo:
                    yield shared[g] if g in shared else (decoded[g], True)
                return
        for column in self._decoded_here(todo):
            yield column, True

    def _decoded_here(self, todo: list[int]) -> Iterator[pa.Array]:
        """Row groups ``todo`` decoded in this process, in order (several at once on the decode pool)."""
        pool = decode_pool() if self._path is not None and len(todo) > 1 else None
        if pool is None:
            yield from map(self.row_group, todo)
            return
        futures = [pool.submit(self.row_group, g) for g in todo]
        try:
            for future in futures:
                yield future.result()
        finally:
            for future in futures:
                future.cancel()

    def _shared(self, todo: list[int], share: SharedRowGroups) -> dict[int, tuple[pa.Array, bool]] | None:
        """Row groups ``todo`` through the share, by row group: mapped where published, claimed and decoded (then
        published) where this worker is first, and waited for where another is decoding them — claims first,
        decodes next, waits last, so a claimant never waits (``zephon.executor.read.shared_groups``). Those nobody
        publishes (a claimant that failed, or a share that publishes nothing: no room, or a lone worker) are left
        out: the caller decodes them together on the decode pool, as without a share. None when a decode fails:
        the caller decodes them all as without a share, so the first bad row group raises as it would. Each with
        whether it is this process's memory (decoded here and not published: no room in the share)."""
        shard = self.ref.shard_id
        got: dict[int, tuple[pa.Array, bool]] = {}
        mine: list[tuple[int, int]] = []
        theirs: list[int] = []
        for g in todo:
            column = share.get(shard, g)
            if column is not None:
                got[g] = (column, False)
                continue
            fd = share.claim(shard, g)
            if fd is None:
                theirs.append(g)
            else:
                mine.append((g, fd))
        for k, (g, fd) in enumerate(mine):
            try:
                column = self.row_group(g)
            except BaseException as exc:
                for h, other in mine[k:]:
                    share.abandon(shard, h, other)
                if isinstance(exc, DatasetError):
                    return None
                raise
            kept = share.publish(shard, g, fd, column)  # the published file, mapped: one copy for the rank
            got[g] = (kept, kept is column)
        for g in theirs:
            column = share.wait(shard, g)  # at once when nobody holds its claim
            if column is not None:  # else nobody published it (counted by the share): the caller decodes it
                got[g] = (column, False)
        return got

    def values(self, rows: np.ndarray) -> list[object]:
        """The raw values of ``rows`` (strings, None for a null; records as dicts), in the order given: one
        Arrow ``take`` per row group, converted to Python together."""
        groups = self.decode(rows)
        first = int(groups[0]) if len(groups) else 0
        if not len(groups) or (groups == first).all():  # the common case: one row group
            local = rows - self.rg_starts[first]
            return self._python(self._group(first).take(pa.array(local))) if len(rows) else []
        parts = []
        for g in np.unique(groups).tolist():
            picked = np.flatnonzero(groups == g)
            parts.append((picked, self._python(self._group(g).take(pa.array(rows[picked] - self.rg_starts[g])))))
        return in_index_order(len(rows), parts)

    def _python(self, array: pa.Array) -> list[object]:
        """``array``'s values as Python values (``arrow_values``); one whose bytes are not UTF-8 is a ``NotUTF8``,
        and this shard's rows are checked one by one from then on (``read``), so it is reported."""
        values, bad = python_values(array)
        if bad:
            self.nulls = True
        return values

    def publish_decoded(self, share: SharedRowGroups) -> int:
        """Publish the row groups decoded so far to ``share`` (each one another process has not claimed), for the
        DataLoader workers about to start; how many. Local files only (range mode decodes on one reader)."""
        if self._path is None:
            return 0
        published = 0
        for g, column in enumerate(self.groups):
            fd = share.claim(self.ref.shard_id, g) if column is not None else None
            if fd is not None and column is not None:
                share.publish(self.ref.shard_id, g, fd, column)
                published += 1
        return published

    def close(self) -> None:
        """Drop the decoded row groups (the reader then returns the freed memory: ``memory_release``), and the
        files this worker published for the others (their mapped copies stay valid)."""
        self.groups = [None] * len(self.groups)
        if self.share is not None:
            self.share.forget(self.ref.shard_id)
        if self.spill is not None:
            self.spill.forget(self.ref.shard_id, len(self.groups))

    def _group(self, g: int) -> pa.Array:
        column = self.groups[g]
        assert column is not None, "decode() first"
        return column

    def read(self, rows: np.ndarray) -> list[object]:
        """Texts of ``rows`` in the order given; each checked when the shard has nulls (or records, or bytes that are
        not UTF-8), so a bad document is reported (None when skipped)."""
        values = self.values(rows)
        if not self.nulls:
            return values  # strings, every one
        text, ref = self._documents.text, self.ref
        return [text(ref, row, v) for row, v in zip(rows.tolist(), values, strict=True)]

    def iter_texts(self) -> Iterator[list[str | None]]:
        """Every text in row order, one row group at a time, checked; nothing is kept in ``values``."""
        for g in range(self.file.metadata.num_row_groups):
            column = self.row_group(g)
            first = int(self.rg_starts[g])
            values, _ = python_values(column)
            yield [self._documents.text(self.ref, first + i, v) for i, v in enumerate(values)]


def in_index_order(n: int, parts: list[tuple[np.ndarray, list[Any]]]) -> list[Any]:
    """The values of ``parts`` (indices, values; the indices of all parts are ``0..n-1`` once each) in index
    order: one argsort and one C-level gather instead of a Python store per document (~1 CPU ns a token on short
    documents). Values of any kind (strings, records, id arrays) are moved as they are. The shard reader puts a
    read's shards back together with it, and a shard its row groups."""
    values: list[Any] = []
    for _, got in parts:
        values += got
    order = np.argsort(np.concatenate([idx for idx, _ in parts]), kind="stable") if parts else np.empty(0, np.int64)
    if len(order) != n or len(values) != n:
        raise ValueError(f"a read must give one value a row, got {len(values)} for {n} rows")
    return list(map(values.__getitem__, order.tolist()))
