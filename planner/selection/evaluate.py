"""Evaluating a dataset's selection by metadata with DuckDB: which (shard, row) pairs a plan reads, in what order.

One query per dataset, over all its Parquet shards at once (``read_parquet(..., file_row_number)``, ``file_index``),
optionally joined to a sidecar table on a key column (``LEFT JOIN ... USING (key)``)::

    SELECT shard, row [, order key] [, dedup key] FROM dataset [LEFT JOIN sidecar USING (key)] WHERE (where)

into a table, from which ``zephon.planner.selection.dedup.fetch_final`` reads the rows sorted by (shard, row) or
by the order key, and one row per dedup key (partitioned by the key's hash, out of core). A ``where`` alone runs
instead one streamed query per range of shards (``selection/ranges.py``; remote and JSONL shards read into Arrow
range by range), its rows kept in memory or an unnamed file (``selection/selected.py``): nothing in it grows with
the selection but 4 bytes a kept row on disk.

DuckDB reads only the columns the query names (projection pushdown) and skips row groups whose min/max
statistics exclude the predicate (filter pushdown), so a selection over one metadata column of a text
corpus reads that column, not the text. Remote shards (``s3://``, ``gs://``, ``az://``, ``hf://``) and JSONL
shards are read by ``zephon.planner.selection.tables`` instead — the referenced columns only, pinned — into
one Arrow table of the same shape (``file_row_number``, and ``zephon_shard`` for ``file_index``), on which
the same query runs: the selection is the one of the same files copied locally. Remote sidecars likewise.

Rules (docs/curricula.md):

* ``where`` keeps the rows for which the predicate is TRUE (NULL counts as false, as in SQL). A document with
  no sidecar row has NULL sidecar columns.
* ``order_by`` sorts by the expression (``ASC`` unless it ends in ``DESC``), **nulls last** either way, ties by
  (shard, row); ``order_window`` then shuffles inside consecutive windows of that many documents
  (``zephon.planner.orders``).
* ``dedup_on`` keeps one document per non-NULL value: among a key's documents, the one with the smallest
  seeded draw (PCG64 of ``(seed, dataset_index, DEDUP_STREAM)``, one draw per selected document in (shard,
  row) order); every document with a NULL key is kept.
* a sidecar must hold each key once (a duplicate is refused with an example); keys on one side only are
  counted (``SelectionReport``) and recorded in plan.json.

Invariant: the result is a function of the shards' content, the sidecar's content, the selection text and the
seed — never of DuckDB's thread count or scan order (every output is sorted on (shard, row) or on a rank
that breaks ties by them).

Worked example: shards a (rows 0-2, scores 1 5 3) and b (rows 0-1, scores 4 2), ``where="score >= 3"``: the
selection is a1 a2 b0 (a0 and b1 fail the predicate), held in (shard, row) order; with ``order_by="score
DESC"`` and ``order_window=1`` it is a1 (5), b0 (4), a2 (3), read in that order every epoch.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import duckdb
import numpy as np
import pyarrow.parquet as pq

from zephon.errors import ConfigError, DatasetError, one_line
from zephon.plan.records import ShardRef
from zephon.planner.selection.dedup import DEDUP_STREAM, DedupRun, fetch_final
from zephon.planner.selection.join import (
    JoinPlan,
    JoinRun,
    Relation,
    join_sidecar,
    joined_source,
    partitions_for,
    sidecar_columns,
    sidecar_files,
    sidecar_relation,
    sidecar_report,
)
from zephon.planner.selection.ranges import ROW_BYTES, arrow_registrar, where_by_range
from zephon.planner.selection.results import duckdb_limit, memory_bytes, stream_kept
from zephon.planner.selection.selected import RowColumn, SelectedRows, SelectionReport
from zephon.planner.selection.tables import arrow_read, read_documents, referenced_names
from zephon.recipe.selection import Selection

__all__ = ["DEDUP_STREAM", "SelectedRows", "SelectionReport", "select_rows", "sidecar_files"]

#: DuckDB's memory limit while selecting (it spills past it): a 2-core planning node has a few GB.
MEMORY_LIMIT = os.environ.get("ZEPHON_SELECT_MEMORY", "2GB")

_DIRECTION = re.compile(r"\s+(asc|desc)\s*$", re.IGNORECASE)
_NO_ROOM = re.compile(r"no space left|file too large|disk quota", re.IGNORECASE)
_UNKNOWN = re.compile(r'Referenced column "([^"]+)" not found', re.IGNORECASE)
#: DuckDB checks the UTF-8 of the Parquet strings a query reads (pyarrow's reader does not): a fault of the data.
_NOT_UTF8 = re.compile(r'Invalid string encoding found in Parquet file "([^"]+)": value "(.*?)" is not valid UTF8')


def _columns(dataset: str, refs: tuple[ShardRef, ...]) -> list[str]:
    try:
        return list(pq.read_schema(refs[0].uri).names)
    except (OSError, ValueError) as exc:
        raise DatasetError(
            f"dataset {dataset!r}: shard {refs[0].uri} must be a readable Parquet file, got {one_line(exc)} — "
            "restore it or re-export it"
        ) from exc


def out_of_memory(selection: Selection, field: str, text: str, exc: duckdb.Error, limit: str) -> ConfigError:
    """The one-line error of a selection past DuckDB's memory limit (``ZEPHON_SELECT_MEMORY``)."""
    return ConfigError(
        f"dataset {selection.dataset!r}: {field}={text!r} must fit DuckDB's memory limit "
        f"ZEPHON_SELECT_MEMORY={limit}, got {one_line(exc).split(' Possible solutions')[0]} — raise "
        "ZEPHON_SELECT_MEMORY (e.g. 8GB) or set ZEPHON_SELECT_PARTITIONS above the count chosen for it"
    )


def out_of_disk(selection: Selection, spill: str, exc: duckdb.Error | OSError) -> DatasetError:
    """The one-line error of a selection whose spill directory ran out of room (or of DuckDB's IO)."""
    return DatasetError(
        f"dataset {selection.dataset!r}: the selection's spill directory {spill} must have room for what DuckDB "
        f"spills, the partitioned join and dedup write and the kept rows take (4 bytes each past 256 MB, beside it "
        f"in TMPDIR), got {one_line(exc)} — free space there or point TMPDIR at a larger disk"
    )


def _described(selection: Selection) -> str:
    """The selection's settings that are set (``where='…', dedup_on='…'``): what a whole-selection error names."""
    fields = ("where", "metadata", "key", "order_by", "dedup_on")
    return ", ".join(f"{f}={getattr(selection, f)!r}" for f in fields if getattr(selection, f) is not None)


def _spilled(exc: duckdb.Error, spill: str) -> bool:
    """Whether DuckDB failed writing its spill directory (full disk, file size limit), not reading input."""
    text = str(exc)
    return isinstance(exc, duckdb.IOException) and (spill in text or bool(_NO_ROOM.search(text)))


def _fail(
    selection: Selection, exc: duckdb.Error, field: str, text: str, columns: list[str], limit: str
) -> ConfigError | DatasetError:
    """The one-line error of a query DuckDB refused: the expression's fault, or the data's (strings that are not
    UTF-8 in a file the query reads)."""
    name = selection.dataset
    bad = _NOT_UTF8.search(str(exc))
    if bad:
        return DatasetError(
            f"dataset {name!r}: {bad.group(1)} must hold UTF-8 strings in the columns {field}={text!r} reads, got "
            f'the value "{bad.group(2)}" — write those columns again as UTF-8, or select on other columns'
        )
    unknown = _UNKNOWN.search(str(exc))
    if unknown:
        return ConfigError(
            f"dataset {name!r}: {field} names column {unknown.group(1)!r}, which the dataset lacks — it has "
            f"{', '.join(columns)}; fix {field}={text!r}"
        )
    if isinstance(exc, duckdb.OutOfMemoryException):
        return out_of_memory(selection, field, text, exc, limit)
    if isinstance(exc, duckdb.ParserException):
        return ConfigError(
            f"dataset {name!r}: {field} must be a DuckDB SQL expression, got {text!r} ({one_line(exc)}) — fix "
            "its syntax"
        )
    return ConfigError(
        f"dataset {name!r}: {field}={text!r} must evaluate on the dataset's columns ({', '.join(columns)}), got "
        f"{type(exc).__name__}: {one_line(exc)} — fix the expression"
    )


def select_rows(
    selection: Selection,
    refs: tuple[ShardRef, ...],
    *,
    seed: int,
    dataset_index: int,
    threads: int | None = None,
    memory_limit: str | None = None,
    partitions: int | None = None,
    engine: str = "local",
    dedup_partitions: int | None = None,
    query_rows: int | None = None,
) -> SelectedRows:
    """Evaluate ``selection`` over the dataset's shards ``refs`` (see the module docstring).

    ``partitions``: how many key-hash partitions a sidecar join runs in (default: as many as DuckDB's memory
    limit needs, ``selection_join.partitions_for``); ``engine="ray"`` joins them as Ray tasks
    (``selection/ray_join.py``); ``dedup_partitions``: the same for ``dedup_on`` (``selection/dedup.py``). A
    ``where`` alone over local Parquet runs one query per range of shards of at most ``query_rows`` rows
    (``selection/ranges.py``; default: DuckDB's memory limit ÷ ``ranges.ROW_BYTES``). Every count, on either
    engine, gives the same selection."""
    name = selection.dataset
    # Local Parquet: DuckDB reads the files itself; remote or JSONL shards: read into Arrow first.
    remote = any(arrow_read(r) for r in refs)
    columns = [] if remote else _columns(name, refs)
    total = sum(r.rows for r in refs)
    limit = memory_limit or MEMORY_LIMIT
    memory_bytes(limit)  # a size, or the setting's one-line error before anything is made (not DuckDB's parser's)
    spill = tempfile.mkdtemp(prefix="zephon-select-")  # ours alone: removed below however the selection ends
    con = duckdb.connect()
    try:
        if threads is not None:
            con.execute(f"SET threads = {int(threads)}")
        con.execute("SET preserve_insertion_order = false")
        # Joins, aggregates and sorts past the limit spill to our own temporary directory (removed below),
        # never to DuckDB's default ``.tmp`` in the working directory.
        con.execute(f"SET memory_limit = '{duckdb_limit(limit)}'")
        con.execute("SET temp_directory = ?", [spill])
        streamed = selection.metadata is None and selection.order_by is None and selection.dedup_on is None
        if remote:  # the referenced columns (zephon.planner.selection.tables); streamed: range by range (ranges.py)
            documents = Relation(text="(SELECT * FROM zephon_documents) d", params={})
            if not streamed:
                table, columns = read_documents(name, refs, referenced_names(con, selection))
                con.register("zephon_documents", table)
        else:
            documents = Relation(
                text="(SELECT *, CAST(file_index AS INTEGER) AS zephon_shard FROM read_parquet($paths, "
                "file_row_number = true)) d",
                params={"paths": [r.uri for r in refs]},
            )
        run = JoinRun(partitions=partitions, spill=spill, engine=engine, memory_limit=limit)
        dedup = None
        if selection.dedup_on is not None:
            dedup = DedupRun(seed=seed, dataset_index=dataset_index, spill=spill, partitions=dedup_partitions)
        if streamed:
            register = arrow_registrar(con, selection, columns) if remote else None
            counts, rows = _where_by_range(
                con, selection, refs, documents, columns, query_rows, limit, spill, register=register
            )
            kept_by_where, sidecar, key_shard = len(rows), {}, None
        else:
            (counts, rows, key_shard, kept_by_where), sidecar = _evaluate(
                con, selection, documents, columns, total, len(refs), run=run, dedup=dedup
            )
    except duckdb.OutOfMemoryException as exc:
        raise out_of_memory(selection, "selection", _described(selection), exc, limit) from exc
    except duckdb.IOException as exc:
        if _spilled(exc, spill):
            raise out_of_disk(selection, spill, exc) from exc
        raise
    except OSError as exc:  # the dedup's own files (dedup.py) or the rows' file on a full disk
        if _NO_ROOM.search(str(exc)):
            raise out_of_disk(selection, spill, exc) from exc
        raise
    finally:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)
    dropped = kept_by_where - len(rows)
    report = SelectionReport(
        rows=total,
        skipped_by_where=total - kept_by_where,
        skipped_by_dedup=dropped,
        selected=len(rows),
        **sidecar,
    )
    if not len(rows):
        raise DatasetError(
            f"dataset {name!r}: selection must keep at least one row, got 0 of {total} "
            f"(where {selection.where!r}: {report.skipped_by_where} skipped; dedup: {dropped} skipped) — loosen "
            "the where predicate or remove the dataset"
        )
    return SelectedRows(counts=counts, rows=rows, key_shard=key_shard, window=selection.order_window, report=report)


class Kept(NamedTuple):
    """What a selection's final query kept, as ``SelectedRows`` holds it."""

    #: Kept rows per shard (int64).
    counts: np.ndarray
    #: The rows, in (shard, row) order or (``order_by``) in key order.
    rows: RowColumn
    #: ``order_by``: each row's shard, in key order; else None.
    key_shard: RowColumn | None
    #: Rows before ``dedup_on`` dropped any (``where`` kept them).
    before: int


def _final(con: duckdb.DuckDBPyConnection, way: str | None, dedup: DedupRun | None, shards: int, limit: str) -> Kept:
    """The kept rows out of ``zephon_selected``: streamed without ``dedup_on`` (``results.stream_kept``: one sort,
    nothing held whole), else fetched into arrays, deduplicated (``dedup.fetch_final``) and put in key order by
    their rank when ordered."""
    if dedup is None:
        counts, rows, key_shard = stream_kept(con, order=way, shards=shards)
        return Kept(counts, rows, key_shard, len(rows))
    result, before = fetch_final(con, order=way, dedup=dedup, memory_limit=limit)
    shard = np.asarray(result["shard"], dtype=np.int32)
    row = np.asarray(result["row"], dtype=np.int32)
    counts = np.bincount(shard, minlength=shards).astype(np.int64)
    rank = result.get("rank")  # int32 or int64 (results.fetch_selected)
    if rank is None:
        return Kept(counts, RowColumn(array=row), None, before)
    order = np.argsort(rank, kind="stable")
    return Kept(counts, RowColumn(array=row[order]), RowColumn(array=shard[order]), before)


#: Rows a range of ``_where_by_range`` holds (None: DuckDB's memory limit ÷ ``ranges.ROW_BYTES``; tests lower it).
QUERY_ROWS: int | None = None


def _where_by_range(
    con: duckdb.DuckDBPyConnection,
    selection: Selection,
    refs: tuple[ShardRef, ...],
    documents: Relation,
    columns: list[str],
    query_rows: int | None,
    limit: str,
    spill: str,
    *,
    register: Callable[[Sequence[ShardRef]], None] | None,
) -> tuple[np.ndarray, RowColumn]:
    """A ``where`` alone, range by range (``ranges.py``); a bad expression is blamed like the general path's."""
    rows = query_rows or QUERY_ROWS or max(1, memory_bytes(limit) // ROW_BYTES)
    try:
        return where_by_range(con, refs, selection.where, query_rows=rows, register=register)
    except duckdb.Error as exc:
        if isinstance(exc, duckdb.OutOfMemoryException) or _spilled(exc, spill):
            raise  # select_rows says which setting or disk to change
        field, text = _blame(selection, con, documents.text, documents.params)
        raise _fail(selection, exc, field, text, columns, limit) from exc


def _evaluate(
    con: duckdb.DuckDBPyConnection,
    selection: Selection,
    docs: Relation,
    columns: list[str],
    total: int,
    shards: int,
    *,
    run: JoinRun,
    dedup: DedupRun | None,
) -> tuple[Kept, dict[str, Any]]:
    """Run the selection's query on ``con``: what it kept (``_final``) and the sidecar's report fields."""
    params: dict[str, Any] = dict(docs.params)
    order_key = dedup_key = ""
    way = None
    if selection.order_by is not None:
        text = selection.order_by
        direction = _DIRECTION.search(text)
        order_key = text[: direction.start()] if direction else text
        way = direction.group(1).upper() if direction else "ASC"
    if selection.dedup_on is not None:
        dedup_key = selection.dedup_on
    # zephon_shard: the shard's place in the dataset (local: file_index, a virtual column of DuckDB's multi-file
    # reader, the place in $paths); file_row_number: the row in it.
    documents = docs.text
    plan = JoinPlan(where=selection.where, order_key=order_key, dedup_key=dedup_key)
    if selection.metadata is None:
        where = f"WHERE ({selection.where})" if selection.where is not None else ""
        carried = "".join(f", ({e}) AS {c}" for c, e in plan.carried())
        # Kept into a table first: its count sizes the arrays the sorted rows are fetched into (results.py).
        query = (
            f"CREATE TEMP TABLE zephon_selected AS SELECT zephon_shard AS shard, "
            f"CAST(file_row_number AS INTEGER) AS row{carried} FROM {documents} {where}"
        )
        try:
            con.execute(query, params)
        except duckdb.Error as exc:
            field, text = _blame(selection, con, documents, params)
            raise _fail(selection, exc, field, text, columns, run.memory_limit) from exc
        return _final(con, way, dedup, shards, run.memory_limit), {}
    assert selection.key is not None
    meta, fingerprint, sidecar_rows = sidecar_relation(con, selection)
    params.update(meta.params)
    meta_columns = sidecar_columns(con, selection, meta, columns)
    columns = columns + [c for c in meta_columns if c != selection.key]
    source = joined_source(docs, meta, selection.key)
    # One full join (or one per partition of the key's hash, past the memory budget: selection_join), from which
    # the selection and the counts of keys on one side only are both read. Expressions are checked on the whole
    # join first (EXPLAIN runs nothing), so a bad one is blamed the same way however the join runs.
    count = run.partitions if run.partitions is not None else partitions_for(total + sidecar_rows, run.memory_limit)
    try:
        checks = [selection.where or "true", order_key or "1", dedup_key or "1"]
        con.execute(f"EXPLAIN SELECT ({checks[0]}), ({checks[1]}), ({checks[2]}) FROM {source}", params)
        counts = join_sidecar(
            con,
            selection,
            documents=docs,
            meta=meta,
            plan=plan,
            referenced=referenced_names(con, selection).names,
            run=replace(run, partitions=count),
        )
    except duckdb.Error as exc:
        if isinstance(exc, duckdb.OutOfMemoryException) or _spilled(exc, run.spill):
            raise  # select_rows says which setting or disk to change
        field, text = _blame(selection, con, source, params)
        raise _fail(selection, exc, field, text, columns, run.memory_limit) from exc
    sidecar: dict[str, Any] = sidecar_report(con, selection, meta, counts, documents=total)  # refuses duplicates
    sidecar.update(sidecar_fingerprint=fingerprint, sidecar_rows=sidecar_rows)
    return _final(con, way, dedup, shards, run.memory_limit), sidecar


def _blame(
    selection: Selection, con: duckdb.DuckDBPyConnection, source: str, params: dict[str, Any]
) -> tuple[str, str]:
    """The field whose expression DuckDB refuses (each one is tried alone; ``where`` when none fails alone)."""
    probes = [("where", selection.where, "WHERE ({})"), ("order_by", selection.order_by, "ORDER BY {}"),
              ("dedup_on", selection.dedup_on, "ORDER BY ({})")]  # fmt: skip
    for field, text, form in probes:
        if text is None:
            continue
        try:
            con.execute(f"EXPLAIN SELECT 1 FROM {source} {form.format(text)}", params)
        except duckdb.Error:
            return field, text
    return "where", selection.where or ""
