"""A selection by ``where`` alone, one query per range of shards, streamed.

Why: the general path (``evaluate.py``) keeps every kept (shard, row) pair in a DuckDB table, sorts it and
fetches it into two arrays. At 10^10 documents a ``where`` keeping a third keeps 3.5 × 10^9 pairs: 28 GB of
arrays and ~40 GB of sort spill. Without a sidecar, ``order_by`` or ``dedup_on`` nothing needs the pairs
together: the shards are split into ranges of consecutive shards of at most ``query_rows`` rows, and each range is
one query::

    SELECT file_index, file_row_number FROM read_parquet(range's files, file_row_number = true) WHERE (where)

(remote or JSONL shards: the range's referenced columns read into Arrow and registered, ``tables.py``, then
queried the same way) run with DuckDB's insertion order preserved, so its rows come in file order and row
order — (shard, row) order — and stream out in record batches: each shard's count is added up, each batch's
rows are appended to a ``RowColumn`` (``selected.py``: in memory while small, in an unnamed temporary file past
that). The order is
checked batch by batch, never assumed: a range whose rows come out of order is read again with ``ORDER BY``
(sorted within the range, which ``query_rows`` keeps to a share of DuckDB's memory limit).

Invariant: the counts and the rows are those of the general path (one query sorted by (shard, row)) for every
range size and thread count; DuckDB holds at most one range's batches (and, read into Arrow, one range's
columns), and the planner's memory holds the counts (8 bytes a shard) and at most ``selected.MEMORY_BYTES`` of
rows.

Worked example: 3 shards of 4 rows each and ``query_rows = 8``: ranges [0, 2) and [2, 3). A ``where`` keeping
rows 1 and 3 of shard 0, none of shard 1 and row 0 of shard 2 gives counts [2, 0, 1] and rows [1, 3, 0].
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import duckdb
import numpy as np

from zephon.plan.records import ShardRef
from zephon.planner.selection.results import BATCH_ROWS
from zephon.planner.selection.selected import RowColumn, RowColumnWriter
from zephon.planner.selection.tables import read_documents, referenced_names
from zephon.recipe.selection import Selection

__all__ = ["ROW_BYTES", "arrow_registrar", "shard_ranges", "where_by_range"]

#: DuckDB bytes a kept row may take while a range is sorted (its fallback): ranges hold memory_limit ÷ this rows.
ROW_BYTES = 32


def shard_ranges(rows: list[int], query_rows: int) -> list[tuple[int, int]]:
    """Consecutive ``[lo, hi)`` ranges of shards holding at most ``query_rows`` rows each (a bigger shard alone)."""
    out: list[tuple[int, int]] = []
    lo, held = 0, 0
    for j, n in enumerate(rows):
        if j > lo and held + n > query_rows:
            out.append((lo, j))
            lo, held = j, 0
        held += n
    if rows:
        out.append((lo, len(rows)))
    return out


def where_by_range(
    con: duckdb.DuckDBPyConnection,
    refs: tuple[ShardRef, ...],
    where: str | None,
    *,
    query_rows: int,
    register: Callable[[Sequence[ShardRef]], None] | None = None,
) -> tuple[np.ndarray, RowColumn]:
    """Each shard's count of rows ``where`` keeps (int64) and those rows in (shard, row) order (module docstring).
    ``register``: for shards read into Arrow first (remote or JSONL, ``tables.read_documents``), called with each
    range's shards to register that range alone as ``zephon_documents`` (its ``zephon_shard`` counted from the
    range's first shard), so memory holds one range's columns, not the dataset's. DuckDB's errors (a bad
    expression, a full spill disk) propagate; the caller names them."""
    counts = np.zeros(len(refs), dtype=np.int64)
    writer = RowColumnWriter()
    condition = f"WHERE ({where})" if where is not None else ""
    con.execute("SET preserve_insertion_order = true")
    try:
        for lo, hi in shard_ranges([r.rows for r in refs], query_rows):
            params: dict[str, object] | None = None
            if register is None:
                params = {"paths": [r.uri for r in refs[lo:hi]]}
                query = (
                    "SELECT CAST(file_index AS INTEGER) AS shard, CAST(file_row_number AS INTEGER) AS row "
                    "FROM read_parquet($paths, file_row_number = true)"
                )
            else:
                register(refs[lo:hi])
                query = "SELECT zephon_shard AS shard, CAST(file_row_number AS INTEGER) AS row FROM zephon_documents"
            query = f"{query} {condition}"
            part = _kept(con, query, params, hi - lo)
            if part is None:  # out of order: sorted within the range
                part = _kept(con, f"{query} ORDER BY shard, row", params, hi - lo)
                assert part is not None, "DuckDB returned a sorted range out of order"
            counts[lo:hi] = part[0]
            for rows in part[1]:
                writer.append(rows)
    except BaseException:
        writer.close()
        raise
    finally:
        con.execute("SET preserve_insertion_order = false")
    return counts, writer.finish()


def arrow_registrar(
    con: duckdb.DuckDBPyConnection, selection: Selection, columns: list[str]
) -> Callable[[Sequence[ShardRef]], None]:
    """For shards read into Arrow first: registers a range's table as ``zephon_documents`` (the one before it
    dropped first) and puts the first shard's column names in ``columns`` (for messages)."""
    wanted = referenced_names(con, selection)

    def register(part: Sequence[ShardRef]) -> None:
        with contextlib.suppress(duckdb.Error):
            con.unregister("zephon_documents")
        table, names = read_documents(selection.dataset, part, wanted)
        if not columns:
            columns.extend(names)
        con.register("zephon_documents", table)

    return register


def _kept(
    con: duckdb.DuckDBPyConnection, query: str, params: dict[str, object] | None, shards: int
) -> tuple[np.ndarray, list[np.ndarray]] | None:
    """One range's counts per shard and its rows batch by batch, or None when a row came out of (shard, row) order.
    A range holds at most ``query_rows`` rows, so its kept rows fit in memory until they are appended."""
    counts = np.zeros(shards, dtype=np.int64)
    pieces: list[np.ndarray] = []
    last = -1
    for batch in con.sql(query, params=params).to_arrow_reader(BATCH_ROWS):
        if not batch.num_rows:
            continue
        shard = batch.column("shard").to_numpy(zero_copy_only=False).astype(np.int64)
        row = batch.column("row").to_numpy(zero_copy_only=False)
        key = (shard << 32) | row.astype(np.int64)
        if key[0] <= last or (len(key) > 1 and not bool((key[1:] > key[:-1]).all())):
            return None
        last = int(key[-1])
        counts += np.bincount(shard, minlength=shards)
        pieces.append(row.astype(np.int32, copy=False))
    return counts, pieces
