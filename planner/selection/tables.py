"""A selection's tables when its shards or its sidecar are remote: read through zephon's storage layer, pinned.

DuckDB reads local Parquet itself (``read_parquet``). For ``s3://``/``gs://``/``az://`` objects and ``hf://``
files the planner does not use DuckDB's httpfs (a download at run time, and it would not carry the plan's
pins): it reads each shard's footer and the column chunks of the columns the selection names, every GET pinned
exactly as the plan is (``If-Match`` ETag and version for objects, the commit and size for the Hub), and
registers them with DuckDB as one Arrow table shaped like ``read_parquet(paths, file_row_number = true)`` plus
the shard's index::

    <referenced columns>, file_row_number BIGINT, zephon_shard INTEGER

The query of ``zephon.planner.selection.evaluate`` then runs on it unchanged.

Invariant: the table holds, for every row of every shard, the same values DuckDB would read from the same
files copied locally (pyarrow decodes the planned bytes), so a remote selection keeps the same (shard, row)
pairs, in the same order, as the local copy — the plan's samples are byte-identical.

Columns read: those the ``where``, ``order_by`` and ``dedup_on`` expressions reference (found by DuckDB's own
parser, ``json_serialize_sql``, matched case-insensitively to the shard's columns) and the sidecar key. Every
row group's chunks of those columns are read (one GET per run of adjacent chunks, a few bytes per document
for a metadata column; the text column is never fetched) except the row groups whose footer statistics
exclude a simple conjunct of the ``where`` (``zephon.planner.selection.pruning``; not with a sidecar).

Remote sidecars: ``zephon.planner.selection.sidecar``.

Worked example: shard ``s3://b/web/0.parquet`` with columns id, text, score in 2 row groups and
``where="score >= 3"``: one GET of the footer, then the two ``score`` chunks (adjacent chunks within 64 KiB are
fetched by one GET); the registered table has columns score, file_row_number, zephon_shard.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zephon.errors import DatasetError, one_line
from zephon.plan.records import ShardRef
from zephon.planner.selection.pruning import Bound, bounds_of, groups_to_read
from zephon.recipe.selection import Selection
from zephon.storage.jsonl import decompress, line_spans
from zephon.storage.remote import is_hub_uri, is_remote_uri
from zephon.storage.seekable import SeekableSpans
from zephon.storage.tar_index import TAR_FORMATS, tar_index

#: The one column a WebDataset sample offers a selection or a cost: its key (as the record's ``__key__``).
TAR_KEY = "__key__"

__all__ = [
    "Wanted",
    "arrow_read",
    "read_documents",
    "read_shard",
    "referenced_names",
]


def arrow_read(ref: ShardRef) -> bool:
    """True when a selection reads this shard into Arrow first (remote or JSONL); DuckDB reads local Parquet."""
    return is_remote_uri(ref.uri) or ref.format != "parquet"


#: Chunks closer than this are fetched by one GET (the gap's bytes are read and dropped).
GAP_BYTES = 64 << 10
#: Shards read at once (each one fetches its chunks concurrently too).
SHARD_WORKERS = 8


def referenced_names(con: duckdb.DuckDBPyConnection, selection: Selection) -> Wanted:
    """The columns the selection's expressions reference, and its key (lower-cased names).

    An expression DuckDB cannot parse adds nothing: the query itself then reports it (``selection._fail``)."""
    queries = []
    if selection.where is not None:
        queries.append(f"SELECT 1 WHERE ({selection.where})")
    if selection.order_by is not None:
        queries.append(f"SELECT 1 ORDER BY {selection.order_by}")
    if selection.dedup_on is not None:
        queries.append(f"SELECT 1 ORDER BY ({selection.dedup_on})")
    names: set[str] = set()
    prune: tuple[Bound, ...] = ()
    for query in queries:
        tree = json.loads(con.execute("SELECT json_serialize_sql($q)", {"q": query}).fetchall()[0][0])
        if not tree.get("error"):
            _collect(tree, names)
            if query.startswith("SELECT 1 WHERE") and selection.metadata is None:
                prune = bounds_of(tree["statements"][0]["node"].get("where_clause"))
    if selection.key is not None:
        names.add(selection.key.lower())
    return Wanted(names=frozenset(names), prune=prune)


def _collect(node: Any, names: set[str]) -> None:
    if isinstance(node, dict):
        if node.get("class") == "COLUMN_REF":
            names.update(str(n).lower() for n in node.get("column_names", []))
        for value in node.values():
            _collect(value, names)
    elif isinstance(node, list):
        for value in node:
            _collect(value, names)


class _Blocks(SeekableSpans):
    """A remote file as a seekable file: reads inside the fetched blocks are memory copies, others one GET."""

    def __init__(self, size: int, blocks: dict[int, bytes], fallback: Callable[[int, int], bytes]) -> None:
        super().__init__()
        self._size, self._fallback = size, fallback
        self._starts = sorted(blocks)
        self._blocks = blocks

    def size(self) -> int:
        return self._size

    def span(self, start: int, end: int) -> bytes:
        i = bisect.bisect_right(self._starts, start) - 1
        block = self._blocks[self._starts[i]] if i >= 0 else b""
        first = self._starts[i] if i >= 0 else 0
        return block[start - first : end - first] if end <= first + len(block) else self._fallback(start, end)


class _Remote:
    """One remote Parquet file of a plan row: its footer, and pinned range reads."""

    def __init__(self, ref: ShardRef) -> None:
        self.uri, self.size = ref.uri, ref.bytes
        if is_hub_uri(ref.uri):
            from zephon.storage.hub.client import read_remote_parquet_metadata, read_remote_range
            from zephon.storage.remote import remote_file

            hub = remote_file(ref.uri, size=ref.bytes, fingerprint=ref.fingerprint, fmt=ref.format)
            self.metadata = read_remote_parquet_metadata(hub)
            self.read: Callable[[int, int], bytes] = lambda s, e: read_remote_range(hub, s, e)
        else:
            from zephon.storage.objects.range_file import RangeFile
            from zephon.storage.objects.reads import object_file, read_range

            obj = object_file(ref.uri, size=ref.bytes, fingerprint=ref.fingerprint, fmt=ref.format)
            self.metadata = RangeFile(obj).metadata  # kept per pinned object: a second read costs no GET
            self.read = lambda s, e: read_range(obj, s, e)


def _chunk_ranges(meta: pq.FileMetaData, wanted: set[str], groups: Sequence[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of the chunks of the ``wanted`` top-level columns in ``groups``, runs closer than
    GAP_BYTES merged."""
    ranges = []
    for g in groups:
        group = meta.row_group(g)
        for i in range(group.num_columns):
            chunk = group.column(i)
            if chunk.path_in_schema.split(".")[0] not in wanted:
                continue
            start = chunk.data_page_offset
            if chunk.has_dictionary_page and chunk.dictionary_page_offset:
                start = min(start, chunk.dictionary_page_offset)
            ranges.append((start, start + chunk.total_compressed_size))
    merged: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1] + GAP_BYTES:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


@dataclass(frozen=True, kw_only=True, slots=True)
class Wanted:
    """Which columns of a shard to read: those named in ``names`` (lower-cased), or with ``all_but`` set, every
    column except that one (``zephon sql``'s metadata view: all but the text)."""

    names: frozenset[str] = frozenset()
    all_but: str | None = None
    #: Remote Parquet: row groups these bounds exclude by statistics are not read (``selection_pruning``).
    prune: tuple[Bound, ...] = ()

    def __call__(self, column: str) -> bool:
        return column != self.all_but if self.all_but is not None else column.lower() in self.names


def read_shard(dataset: str, index: int, ref: ShardRef, wanted: Wanted) -> tuple[pa.Table, list[str]]:
    """The wanted columns of one shard (local or remote, Parquet or JSONL; a WebDataset tar's one column is
    ``__key__``, from its headers), with ``file_row_number`` and ``zephon_shard`` (= ``index``); the shard's
    column names."""
    if ref.format in TAR_FORMATS:
        return _read_tar_keys(dataset, index, ref, wanted)
    if ref.format == "mds":
        return _read_mds_columns(dataset, index, ref, wanted)
    if ref.format != "parquet":
        return _read_jsonl(dataset, index, ref, wanted)
    if not is_remote_uri(ref.uri):
        try:
            local = pq.ParquetFile(ref.uri)
            columns = list(local.schema_arrow.names)
            chosen = [c for c in columns if wanted(c)]
            return _numbered(local.read(columns=chosen, use_threads=False), local.metadata.num_rows, index), columns
        except (OSError, ValueError) as exc:
            raise DatasetError(
                f"dataset {dataset!r}: shard {ref.uri} must be readable Parquet, got {one_line(exc)} — restore it "
                "or re-export it"
            ) from exc
    try:
        remote = _Remote(ref)
        columns = list(remote.metadata.schema.to_arrow_schema().names)
        chosen = [c for c in columns if wanted(c)]
        groups = groups_to_read(remote.metadata, wanted.prune)
        if len(groups) < remote.metadata.num_row_groups:  # some excluded by statistics
            return _pruned(remote, groups, chosen, index), columns
        table = _fetch(remote, chosen, groups).read(columns=chosen, use_threads=False) if chosen else pa.table({})
    except (OSError, ValueError) as exc:  # an unreadable footer or page (storage errors arrive worded)
        raise DatasetError(
            f"dataset {dataset!r}: shard {ref.uri} must be readable Parquet, got {one_line(exc)} — restore it or "
            "re-export it"
        ) from exc
    return _numbered(table, remote.metadata.num_rows, index), columns


def _fetch(remote: _Remote, chosen: list[str], groups: Sequence[int]) -> pq.ParquetFile:
    """The remote file with the chunks of ``chosen`` in ``groups`` fetched (concurrently), as pyarrow opens it."""
    ranges = _chunk_ranges(remote.metadata, set(chosen), groups)
    with ThreadPoolExecutor(SHARD_WORKERS, thread_name_prefix="zephon-select") as pool:
        data = list(pool.map(lambda r: remote.read(*r), ranges))
    blocks = {s: d for (s, _), d in zip(ranges, data, strict=True)}
    return pq.ParquetFile(_Blocks(remote.size, blocks, remote.read), metadata=remote.metadata)


def _pruned(remote: _Remote, groups: list[int], chosen: list[str], index: int) -> pa.Table:
    """The ``chosen`` columns of the row ``groups`` only, with their rows' numbers in the whole shard."""
    meta = remote.metadata
    sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    numbers = [np.arange(offsets[g], offsets[g + 1], dtype=np.int64) for g in groups]
    row_numbers = np.concatenate(numbers) if numbers else np.zeros(0, dtype=np.int64)
    if groups:
        table = _fetch(remote, chosen, groups).read_row_groups(groups, columns=chosen, use_threads=False)
    else:
        schema = meta.schema.to_arrow_schema()
        table = pa.table({c: pa.array([], schema.field(c).type) for c in chosen})
    table = table.append_column("file_row_number", pa.array(row_numbers))
    return table.append_column("zephon_shard", pa.array(np.full(len(row_numbers), index, dtype=np.int32)))


def _numbered(table: pa.Table, rows: int, index: int) -> pa.Table:
    """``table`` with ``file_row_number`` (0..rows-1) and ``zephon_shard`` (``index``) appended."""
    numbers = {
        "file_row_number": pa.array(np.arange(rows, dtype=np.int64)),
        "zephon_shard": pa.array(np.full(rows, index, dtype=np.int32)),
    }
    if not table.num_columns:
        return pa.table(numbers)
    for name, values in numbers.items():
        table = table.append_column(name, values)
    return table


def _read_tar_keys(dataset: str, index: int, ref: ShardRef, wanted: Wanted) -> tuple[pa.Table, list[str]]:
    """A WebDataset tar shard as a table of its samples' keys (``__key__``): the member index, headers only."""
    where = f"dataset {dataset!r}: shard {ref.uri}"
    if is_remote_uri(ref.uri):  # the index kept by the scan (by pin or etag), else the headers by range reads
        from zephon.storage.remote import remote_tar_index

        found = remote_tar_index(ref.uri, size=ref.bytes, fingerprint=ref.fingerprint, fmt=ref.format, where=where)
        keys = found.keys
    else:
        keys = tar_index(ref.uri, ref.format, ref.bytes, where).keys
    table = pa.table({TAR_KEY: pa.array(keys, pa.string())}) if wanted(TAR_KEY) else pa.table({})
    return _numbered(table, len(keys), index), [TAR_KEY]


def _read_mds_columns(dataset: str, index: int, ref: ShardRef, wanted: Wanted) -> tuple[pa.Table, list[str]]:
    """The referenced columns of an MDS shard's samples, decoded as a record pipeline decodes them (``str``,
    numbers, ``json``; ``jpeg``/``png``/``bytes`` as BLOBs). Unlike a tar's keys, they live inside the samples:
    the shard's samples are read (each byte of it), a chunk at a time, and only the referenced columns kept."""
    from zephon.planner.record_samples import shard_samples

    names: list[str] = []
    values: dict[str, list[Any]] = {}
    for chunk in shard_samples(ref):
        for record in chunk:
            if not names:
                names = [n for n in record if not n.startswith("__")]
                values = {n: [] for n in names if wanted(n)}
            for name, column in values.items():
                column.append(record[name])

    def what(name: str) -> str:
        return f"dataset {dataset!r}: MDS shard {ref.uri} column {name!r} must hold one type to be selected on"

    fix = "select on another column, or use a sidecar (metadata=)"
    return _numbered(_arrow_columns(values, what, fix), ref.rows, index), names


def _jsonl_bytes(ref: ShardRef) -> bytes:
    """The whole shard's decompressed bytes: a local file, or the pinned remote file read whole."""
    if is_hub_uri(ref.uri):
        from zephon.storage.hub.client import read_remote_range
        from zephon.storage.remote import remote_file

        hub = remote_file(ref.uri, size=ref.bytes, fingerprint=ref.fingerprint, fmt=ref.format)
        raw = read_remote_range(hub, 0, hub.size) if hub.size else b""
    elif is_remote_uri(ref.uri):
        from zephon.storage.objects.reads import object_file, read_whole

        raw = read_whole(object_file(ref.uri, size=ref.bytes, fingerprint=ref.fingerprint, fmt=ref.format))
    else:
        with open(ref.uri, "rb") as handle:
            raw = handle.read()
    return decompress(raw, ref.format)


def _read_jsonl(dataset: str, index: int, ref: ShardRef, wanted: Wanted) -> tuple[pa.Table, list[str]]:
    """The referenced fields of a JSONL shard's rows (rows as the scan and the executor number them: one per
    line, ``zephon.storage.jsonl.line_spans``); a field a row lacks is NULL. Its fields, in order of first use."""
    try:
        data = _jsonl_bytes(ref)
    except ValueError as exc:  # a truncated or corrupt stream
        raise DatasetError(
            f"dataset {dataset!r}: shard {ref.uri} must be readable {ref.format}, got {one_line(exc)} — restore it"
        ) from exc
    starts, ends = line_spans(data)
    fields: dict[str, None] = {}
    values: dict[str, list[Any]] = {}
    for row, (start, end) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        try:
            record = json.loads(data[start:end])
        except ValueError as exc:
            record = exc
        if not isinstance(record, dict):
            got = one_line(record) if isinstance(record, Exception) else type(record).__name__
            raise DatasetError(
                f"dataset {dataset!r}: shard {ref.uri} row {row} must be a JSON object, got {got} — fix the line"
            )
        for key, value in record.items():
            if key not in fields:
                fields[key] = None
                if wanted(key):
                    values[key] = [None] * row
            if key in values:
                values[key].append(value)
        for column in values.values():
            if len(column) == row:  # the row lacks it
                column.append(None)
    def what(name: str) -> str:
        return f"dataset {dataset!r}: field {name!r} of shard {ref.uri} must hold one type in every row"

    return _numbered(_arrow_columns(values, what, "write it with one type"), len(starts), index), list(fields)


def _arrow_columns(values: dict[str, list[Any]], what: Callable[[str], str], fix: str) -> pa.Table:
    """``values`` (column → Python values) as an Arrow table; a column Arrow cannot type is one line: ``what``
    (of the column's name), what Arrow said, ``fix``."""
    arrays = {}
    for name, column in values.items():
        try:
            arrays[name] = pa.array(column)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise DatasetError(f"{what(name)}, got {one_line(exc)} — {fix}") from exc
    return pa.table(arrays) if arrays else pa.table({})


def read_documents(dataset: str, refs: Sequence[ShardRef], wanted: Wanted) -> tuple[pa.Table, list[str]]:
    """The selection's table over ``refs`` (see the module docstring) and the first shard's column names.

    Local shards among them are read from disk; remote ones through the storage layer."""
    with ThreadPoolExecutor(SHARD_WORKERS, thread_name_prefix="zephon-select-shard") as pool:
        parts = list(pool.map(lambda item: read_shard(dataset, item[0], item[1], wanted), enumerate(refs)))
    tables = [t for t, _ in parts]
    try:
        return pa.concat_tables(tables, promote_options="permissive"), parts[0][1]
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise DatasetError(
            f"dataset {dataset!r}: its shards must give each selected column one type, got {one_line(exc)} — "
            "write the column with one type in every shard"
        ) from exc
