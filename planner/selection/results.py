"""A selection's kept rows out of DuckDB and into NumPy, and ``dedup_on``'s keep mask.

**Fetching.** The kept rows' final query (sorted by (shard, row), or ranked) is read in record batches of
``BATCH_ROWS`` into arrays allocated once at the result's known length, so the only full-size copy is the
arrays the plan keeps; ``fetchnumpy`` first gathered the whole result in DuckDB's own buffers (outside its
memory limit) and then copied it: at 10^9 documents, a ``where`` keeping 3.5 × 10^8 held 2.8 GB of arrays
and as much again of result buffers.

Invariant: the arrays hold the query's rows in the query's order, every row once (the count is checked).

Worked example: a query of 5 rows (shard, row) read in batches of 2 fills ``shard[0:2]``, ``shard[2:4]``,
``shard[4:5]`` (and ``row`` alike) — the arrays ``fetchnumpy`` would give, without its copy.

**Dedup.** Among a group's documents the one with the smallest seeded draw is kept (ties: the first); see
``dedup_keep`` (and ``dedup.py``, which feeds it one key-hash partition at a time).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from zephon.checks import size_setting
from zephon.planner.selection.selected import RowColumn, RowColumnWriter

__all__ = [
    "BATCH_ROWS",
    "SELECTED",
    "dedup_keep",
    "duckdb_limit",
    "fetch_columns",
    "fetch_selected",
    "key_order",
    "memory_bytes",
    "stream_kept",
]

#: Rows per record batch read from DuckDB (8 MB of int64 a column).
BATCH_ROWS = 1 << 20


#: The temporary table of a selection's kept rows (shard, row and the columns the final query needs).
SELECTED = "zephon_selected"

#: The least share of DuckDB's memory limit it keeps while the final query fills the arrays (``fetch_selected``).
FETCH_SHARE = 4

def memory_bytes(limit: str) -> int:
    """``ZEPHON_SELECT_MEMORY``'s text ("2GB", "512MiB", "1000000") in bytes, read as DuckDB reads its
    ``memory_limit`` (``zephon.checks.size_bytes``); DuckDB is then given the bytes (``duckdb_limit``)."""
    size = size_setting("ZEPHON_SELECT_MEMORY", limit, {}, "2GB or 512MiB")
    assert size is not None  # no words: a size or the error
    return size


def duckdb_limit(limit: str) -> str:
    """``SET memory_limit``'s value for ``limit``: its bytes, so that a plain number (which DuckDB's parser refuses)
    and every unit ``size_bytes`` reads mean to DuckDB what they mean to the planner's own arithmetic."""
    return f"{memory_bytes(limit)}B"


def fetch_selected(
    con: duckdb.DuckDBPyConnection,
    query: str,
    params: dict[str, Any],
    *,
    ranked: bool,
    memory_limit: str,
    each: Callable[[pa.RecordBatch], None] | None = None,
) -> dict[str, np.ndarray]:
    """The final ``query`` over ``SELECTED`` — shard and row (int32), and ``rank`` where ``ranked`` — fetched in
    batches at the table's length (``each``, if given, sees every batch in order: other columns are its own); the
    table is dropped after. A rank is at most the row count: int32 below 2^31 rows (4 bytes a kept row less than
    int64), int64 from there.

    Unranked, while the arrays fill, DuckDB's ``memory_limit`` is lowered by their bytes, to no less than a
    ``FETCH_SHARE``-th of it, and restored after: the sort feeding them spills sooner instead of holding its whole
    limit beside them (at 10^9 documents, 2.5 × 10^8 kept rows: 2 GB of arrays beside 2 GB of sort, 4.29 GB
    peak). Ranked, the rank's window (which DuckDB holds whole, it does not spill) keeps the whole limit."""
    rows = int(con.execute(f"SELECT count(*) FROM {SELECTED}").fetchall()[0][0])
    dtypes: dict[str, Any] = {"shard": np.int32, "row": np.int32}
    dtypes.update({"rank": np.int32 if rows < 2**31 else np.int64} if ranked else {})
    budget = memory_bytes(memory_limit)
    arrays = rows * sum(np.dtype(t).itemsize for t in dtypes.values())
    lowered = budget if ranked else max(budget // FETCH_SHARE, budget - arrays)
    con.execute(f"SET memory_limit = '{lowered}B'")
    try:
        out = fetch_columns(con, query, params, rows=rows, dtypes=dtypes, each=each)
    finally:
        con.execute(f"SET memory_limit = '{budget}B'")
    con.execute(f"DROP TABLE {SELECTED}")
    return out


def key_order(order: str | None) -> str:
    """The ``ORDER BY`` of an ordered selection's kept rows — ``zephon_order`` as ``order`` says (``ASC``/``DESC``),
    NULLs last, ties by (shard, row) — or (shard, row) without ``order``: one definition for the streamed fetch
    and the ranked one of ``dedup_on`` (``dedup.fetch_final``), which must agree."""
    return f"zephon_order {order} NULLS LAST, shard, row" if order else "shard, row"


def stream_kept(
    con: duckdb.DuckDBPyConnection, *, order: str | None, shards: int
) -> tuple[np.ndarray, RowColumn, RowColumn | None]:
    """The kept rows of ``SELECTED`` of a selection without ``dedup_on``, streamed: each shard's count, the rows
    and, with ``order``, each one's shard — in (shard, row) order, or with ``order`` (``ASC``/``DESC``) by
    ``zephon_order``, NULLs last, ties by (shard, row): one sort, which DuckDB spills past its limit, no rank.
    Nothing is held whole: rows and shards go to ``RowColumn``s (``selected.py``: past 256 MB, an unnamed
    file), so DuckDB keeps its whole memory limit. The table is dropped after."""
    key = key_order(order)
    counts = np.zeros(shards, dtype=np.int64)
    rows, key_shard = RowColumnWriter(), RowColumnWriter() if order else None
    try:
        for batch in con.sql(f"SELECT shard, row FROM {SELECTED} ORDER BY {key}").to_arrow_reader(BATCH_ROWS):
            shard = batch.column("shard").to_numpy(zero_copy_only=False)
            counts += np.bincount(shard, minlength=shards)
            rows.append(batch.column("row").to_numpy(zero_copy_only=False))
            if key_shard is not None:
                key_shard.append(shard)
    except BaseException:
        rows.close()
        if key_shard is not None:
            key_shard.close()
        raise
    con.execute(f"DROP TABLE {SELECTED}")
    return counts, rows.finish(), key_shard.finish() if key_shard is not None else None


def fetch_columns(
    con: duckdb.DuckDBPyConnection,
    query: str,
    params: dict[str, Any],
    *,
    rows: int,
    dtypes: dict[str, Any],
    each: Callable[[pa.RecordBatch], None] | None = None,
) -> dict[str, np.ndarray]:
    """The columns ``dtypes`` names of ``query``'s ``rows`` rows, in its order, as arrays of those dtypes;
    ``each`` (if given) is called with every record batch, in order, after its rows are stored."""
    out = {name: np.empty(rows, dtype=dtype) for name, dtype in dtypes.items()}
    at = 0
    reader = con.sql(query, params=params or None).to_arrow_reader(BATCH_ROWS)  # streamed, not gathered first
    for batch in reader:
        n = batch.num_rows
        if at + n > rows:
            raise AssertionError(f"the selection's query returned more than its {rows} counted rows")
        for name, array in out.items():
            array[at : at + n] = batch.column(name).to_numpy(zero_copy_only=False)
        if each is not None:
            each(batch)
        at += n
    if at != rows:
        raise AssertionError(f"the selection's query returned {at} rows, counted {rows}")
    return out


def dedup_keep(group: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """Keep mask: per group id ≥ 0, the document with the smallest draw (ties: the first); every ``-1`` (NULL
    key) kept — what a stable lexsort by (group, draw) keeping each group's first gives.

    Each group's smallest draw is found with one ``np.minimum.at`` (linear: a lexsort took 11.4 s of CPU for
    2.5 × 10^7 documents, this 0.9 s); a document is kept when its draw is its group's smallest, and where two
    documents of a group share that draw (64-bit draws: all but never) the first of them.

    Example: groups [0, 0, -1, 1, 0], draws [5, 2, 9, 7, 2]: group 0's smallest draw is 2, held by documents 1
    and 4, so 1 is kept; group 1 keeps 3; the NULL key's document 2 is kept: [F, T, T, T, F]."""
    valid = group >= 0
    keep = ~valid
    if not valid.any():
        return keep
    smallest = np.full(int(group.max()) + 1, np.iinfo(np.uint64).max, dtype=np.uint64)
    np.minimum.at(smallest, group[valid], draws[valid])
    candidates = np.flatnonzero(valid & (draws == smallest[np.where(valid, group, 0)]))
    _, first = np.unique(group[candidates], return_index=True)  # the first candidate of each group
    keep[candidates[first]] = True
    return keep
