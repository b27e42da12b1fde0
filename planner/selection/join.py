"""Joining a dataset to its sidecar on the key: in one piece, or partitioned by the key's hash out of core.

The selection with a sidecar reads one FULL OUTER JOIN of the documents' keys and the sidecar's rows: the
selected (shard, row) pairs, the keys on one side only and the duplicate keys all come from it. One join of
10^8 documents against 10^8 sidecar rows fits DuckDB's 2 GB limit; one of 10^9 against 10^9 does not (the
hash table of the build side must be pinned). Past one row (document or sidecar row) per ``IN_ONE_JOIN_BYTES``
bytes of the limit the join is **partitioned** (a grace hash join), into partitions of one row per
``PARTITION_BYTES`` bytes:

1. one pass over each side writes the columns the selection references, with ``hash(key) % P`` as a Hive
   partition, to Parquet under the planner's own spill directory (``COPY ... PARTITION_BY``);
2. partition by partition, the two sides' files are joined as the whole tables would be, twice, never
   materialized: the counts from a FULL OUTER JOIN of the keys alone, the kept rows (appended to one table
   DuckDB spills) from a LEFT JOIN ``WHERE (where)``, whose conjuncts DuckDB pushes into each side's scan
   (at 10^8: 30 + 13 s of CPU, against 54 s for one materialized join read twice);
3. the partition files are removed; ``order_by``'s rank, ``dedup_on`` (``zephon.planner.selection.dedup``)
   and the sort by (shard, row) run over all kept rows — as after the single join.

With ``engine="ray"`` step 2 runs as one Ray task per partition (``zephon.planner.selection.ray_join``): the
same statements (``counts_query``, ``kept_rows``), each partition's kept rows read back in
partition order. Every partition relation reads only files under the spill directory (an empty side reads that
side's empty file), so a task on another node needs nothing but that directory.

Invariant: the result is the one of the single join, byte for byte. Equal keys hash alike (both sides are cast
to the type the join compares them in), so every match of the full join is inside one partition and every
unmatched row is unmatched in its partition; counts of distinct keys add up over partitions; and nothing
computed per partition depends on the order of rows (the final query sorts by (shard, row) and ranks with
ties broken by them).

Worked example, P = 2: documents with keys a b c, sidecar rows b c d; say hash puts a, b in partition 0 and c,
d in 1. Partition 0 joins {a, b} with {b}: b matched, a without metadata; partition 1 joins {c} with {c, d}: c
matched, d without a document. Summed: 2 matched, 1 document without metadata, 1 sidecar row without a
document — the single join's figures.

Disk: the partitioned files hold the referenced columns once (measured at 10^9: 8.0 GB of documents with an
int64 key, their positions and a one-byte score; 9.4 GB of sidecar with an int64 key and a float32), under
a directory ``select_rows`` creates with ``tempfile.mkdtemp`` (``$TMPDIR``) and removes however the
selection ends; before the copy, ``zephon.planner.room.check_spill_room`` refuses a join whose rows cannot fit
there (one line with the estimate).
"""

from __future__ import annotations

import glob
import hashlib
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from zephon.errors import ConfigError, DatasetError
from zephon.planner.room import check_spill_room
from zephon.planner.selection.results import SELECTED, memory_bytes
from zephon.planner.selection.sidecar import is_remote_sidecar, read_sidecar, sidecar_digest
from zephon.recipe.selection import Selection

__all__ = ["JoinPlan", "JoinRun", "Relation", "join_sidecar", "partitions_for", "quote", "sidecar_files",
           "sidecar_relation"]  # fmt: skip

#: Rows (documents + sidecar rows) one join may hold per byte of DuckDB's memory limit: 10^8 + 10^8 in 2 GB
#: (measured: benchmarks/bench_selection.py, 2.48 GB peak RSS). Past it, partitions of half that many rows.
IN_ONE_JOIN_BYTES = 10
PARTITION_BYTES = 20


@dataclass(frozen=True, kw_only=True, slots=True)
class Relation:
    """A table of the query: its SQL text and the named parameters that text uses."""

    text: str
    params: dict[str, Any]


@dataclass(frozen=True, kw_only=True, slots=True)
class JoinRun:
    """How a sidecar join runs — never what it selects."""

    #: Key-hash partitions (None: as many as ``memory_limit`` needs, ``partitions_for``).
    partitions: int | None = None
    #: The selection's own spill directory (the partitioned files, DuckDB's spill).
    spill: str
    #: "local", or "ray": each partition joined in a Ray task (``zephon.planner.selection.ray_join``).
    engine: str = "local"
    #: DuckDB's memory limit (``ZEPHON_SELECT_MEMORY``), in this process and in each Ray task.
    memory_limit: str = "2GB"


@dataclass(frozen=True, kw_only=True, slots=True)
class JoinPlan:
    """What the joined query computes beyond (shard, row): the ``where`` keep flag and the window keys."""

    #: The ``where`` predicate (None: every document is kept): a kept row's WHERE clause, so DuckDB pushes its
    #: conjuncts into each side's scan and turns the LEFT JOIN into an INNER one when they reject NULLs.
    where: str | None
    #: ``order_by``'s expression without its direction ('' without one), ``dedup_on``'s ('' without one): each
    #: kept row carries their values (``zephon_order``, ``zephon_dedup``) to the final query.
    order_key: str
    dedup_key: str

    def carried(self) -> list[tuple[str, str]]:
        """The window keys each kept row carries, as (column, expression): order's, then dedup's, if set."""
        return [(c, e) for c, e in (("zephon_order", self.order_key), ("zephon_dedup", self.dedup_key)) if e]


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def partitions_for(rows: int, limit: str) -> int:
    """How many partitions a join of ``rows`` (documents + sidecar rows) needs under the memory ``limit``.

    ``ZEPHON_SELECT_PARTITIONS`` overrides it (any count gives the same selection; tests force several)."""
    forced = os.environ.get("ZEPHON_SELECT_PARTITIONS")
    if forced:
        if not forced.isdigit() or int(forced) < 1:
            raise ConfigError(f"ZEPHON_SELECT_PARTITIONS must be an integer ≥ 1, got {forced!r} — fix or unset it")
        return int(forced)
    budget = memory_bytes(limit)
    if rows * IN_ONE_JOIN_BYTES <= budget:
        return 1
    return math.ceil(rows * PARTITION_BYTES / budget)


def sidecar_files(selection: Selection) -> list[str]:
    """The sidecar's Parquet files, sorted: a file, every ``*.parquet`` under a directory, or a glob's matches."""
    assert selection.metadata is not None
    text = selection.metadata
    if "://" in text:
        raise DatasetError(
            f"dataset {selection.dataset!r}: metadata must be a local Parquet file, directory or glob, or an s3://, "
            f"gs://, az:// or hf:// path, got {text!r} — copy the sidecar to one of those"
        )
    path = Path(text).expanduser()
    if path.is_dir():
        files = sorted(str(p) for p in path.rglob("*.parquet"))
    elif path.is_file():
        files = [str(path)]
    else:
        files = sorted(glob.glob(str(path), recursive=True))
    if not files:
        raise DatasetError(
            f"dataset {selection.dataset!r}: metadata must name at least one Parquet file, got none at {text!r} — "
            "fix the path or glob"
        )
    return files


def _sidecar_fingerprint(files: list[str]) -> str:
    """SHA-256 over each sidecar file's name and whole content: any changed score changes the plan hash.

    The whole content, not the footer: a sidecar is a few bytes per document, and one changed value in the
    middle of a page need not change a footer. A remote sidecar's fingerprint is the same function of its
    files' names and bytes (``zephon.planner.selection.sidecar.sidecar_digest``)."""
    items = []
    for name in files:
        with open(name, "rb") as handle:
            items.append((Path(name).name, hashlib.file_digest(handle, "sha256").digest()))
    return sidecar_digest(items)


def sidecar_relation(con: duckdb.DuckDBPyConnection, selection: Selection) -> tuple[Relation, str, int]:
    """The sidecar as a relation, its fingerprint and its rows: local files through ``read_parquet``, a remote
    sidecar read whole through the storage layer and registered."""
    assert selection.metadata is not None
    if is_remote_sidecar(selection.metadata):
        side = read_sidecar(selection)
        con.register("zephon_sidecar", side.table)
        return Relation(text="zephon_sidecar", params={}), side.fingerprint, side.table.num_rows
    files = sidecar_files(selection)
    rows = con.execute("SELECT sum(num_rows) FROM parquet_file_metadata($meta)", {"meta": files}).fetchall()[0][0]
    return Relation(text="read_parquet($meta)", params={"meta": files}), _sidecar_fingerprint(files), int(rows)


def sidecar_columns(
    con: duckdb.DuckDBPyConnection, selection: Selection, meta: Relation, columns: list[str]
) -> list[str]:
    """The sidecar's columns, checked: the key in both tables, no other column in both."""
    name, key = selection.dataset, selection.key
    assert key is not None
    meta_columns = [r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {meta.text}", meta.params).fetchall()]
    for side, have in (("dataset", columns), ("metadata", meta_columns)):
        if key not in have:
            raise ConfigError(
                f"dataset {name!r}: key {key!r} must be a column of the {side} table, got columns "
                f"{', '.join(have)} — set key= to the column both tables hold"
            )
    clash = sorted(set(meta_columns) & set(columns) - {key})
    if clash:
        raise ConfigError(
            f"dataset {name!r}: sidecar column {clash[0]!r} must not also be a dataset column — rename it in "
            f"the sidecar (only {key!r}, the key, may be in both)"
        )
    return meta_columns


def joined_source(documents: Relation, meta: Relation, key: str) -> str:
    """The FULL OUTER JOIN of documents and sidecar, as SQL (``zephon_side`` is NULL on document-only rows)."""
    return f"{documents.text} FULL OUTER JOIN (SELECT *, true AS zephon_side FROM {meta.text}) m USING ({quote(key)})"


def join_sidecar(
    con: duckdb.DuckDBPyConnection,
    selection: Selection,
    *,
    documents: Relation,
    meta: Relation,
    plan: JoinPlan,
    referenced: frozenset[str],
    run: JoinRun,
) -> dict[str, int]:
    """Join, keep what the selection keeps in ``zephon_selected`` (shard, row and ``plan.carried()``), and count:
    joined document rows, documents without metadata, sidecar rows without a document, non-NULL sidecar-only
    keys, distinct ones. ``run.partitions`` > 1 joins partition by partition (module docstring), and removes the
    partition files after; with ``run.engine == "ray"`` each partition is joined in a Ray task
    (``zephon.planner.selection.ray_join``) and the kept rows are read back in partition order."""
    assert selection.key is not None
    typed = "".join(f", {c} {_type(con, e, documents, meta, selection.key)}" for c, e in plan.carried())
    con.execute(f"CREATE TEMP TABLE {SELECTED} (shard INTEGER, row INTEGER{typed})")
    totals = [0, 0, 0, 0, 0]
    assert run.partitions is not None
    if run.partitions == 1:
        _join_part(con, selection.key, documents, meta, plan, totals)
    else:
        pairs = _partition(con, selection, documents, meta, referenced, run.partitions, run.spill)
        if run.engine == "ray":
            from zephon.planner.selection.ray_join import join_on_ray

            kept, totals = join_on_ray(
                selection.dataset,
                [
                    (
                        counts_query(selection.key, docs_part, meta_part),
                        kept_rows(selection.key, docs_part, meta_part, plan),
                    )
                    for docs_part, meta_part in pairs
                ],
                spill=run.spill,
                memory_limit=run.memory_limit,
                memory=memory_bytes(run.memory_limit),
            )
            con.execute(f"INSERT INTO {SELECTED} SELECT * FROM read_parquet($kept)", {"kept": kept})
        else:
            for docs_part, meta_part in pairs:
                _join_part(con, selection.key, docs_part, meta_part, plan, totals)
        for name in ("documents", "metadata", "documents-empty.parquet", "metadata-empty.parquet", "kept"):
            path = os.path.join(run.spill, name)  # read into the table: their disk is the dedup's and the sort's
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            elif os.path.exists(path):
                os.remove(path)
    names = ("document_rows", "without_metadata", "without_document", "side_keys", "distinct_side_keys")
    return dict(zip(names, totals, strict=True))


def _type(con: duckdb.DuckDBPyConnection, expr: str, documents: Relation, meta: Relation, key: str) -> str:
    """The SQL type of ``expr`` over the joined tables (so the kept rows' table holds it unchanged)."""
    source = joined_source(documents, meta, key)
    params = {**documents.params, **meta.params}
    return str(con.execute(f"DESCRIBE SELECT ({expr}) AS t FROM {source}", params).fetchall()[0][1])


def counts_query(key: str, documents: Relation, meta: Relation) -> tuple[str, dict[str, Any]]:
    """One join's counts in ``join_sidecar``'s order, from a FULL OUTER JOIN of the keys alone, and the parameters."""
    qkey = quote(key)
    text = (
        "SELECT count(*) FILTER (WHERE zephon_doc), count(*) FILTER (WHERE zephon_doc AND zephon_side IS NULL), "
        f"count(*) FILTER (WHERE zephon_doc IS NULL), count(CASE WHEN zephon_doc IS NULL THEN {qkey} END), "
        f"count(DISTINCT CASE WHEN zephon_doc IS NULL THEN {qkey} END) FROM (SELECT {qkey}, true AS zephon_doc FROM "
        f"{documents.text}) FULL OUTER JOIN (SELECT {qkey}, true AS zephon_side FROM {meta.text}) USING ({qkey})"
    )
    return text, {**documents.params, **meta.params}


def kept_rows(key: str, documents: Relation, meta: Relation, plan: JoinPlan) -> tuple[str, dict[str, Any]]:
    """One join's kept rows as ``zephon_selected`` holds them, and the parameters: documents LEFT JOIN sidecar
    ``WHERE (where)`` (NULL is false). ``SELECT *`` hides the sidecar's virtual ``file_row_number``."""
    keys = "".join(f", ({e}) AS {c}" for c, e in plan.carried())
    where = f" WHERE ({plan.where})" if plan.where is not None else ""
    text = (
        f"SELECT zephon_shard AS shard, CAST(file_row_number AS INTEGER) AS row{keys} FROM {documents.text} "
        f"LEFT JOIN (SELECT * FROM {meta.text}) m USING ({quote(key)}){where}"
    )
    return text, {**documents.params, **meta.params}


def _join_part(
    con: duckdb.DuckDBPyConnection, key: str, documents: Relation, meta: Relation, plan: JoinPlan, totals: list[int]
) -> None:
    """One join (the whole tables, or one partition of each): add up its counts, append its kept rows."""
    counts = con.execute(*counts_query(key, documents, meta)).fetchone()
    assert counts is not None
    for i, n in enumerate(counts):
        totals[i] += int(n)
    text, params = kept_rows(key, documents, meta, plan)
    con.execute(f"INSERT INTO {SELECTED} {text}", params)


def _partition(
    con: duckdb.DuckDBPyConnection,
    selection: Selection,
    documents: Relation,
    meta: Relation,
    referenced: frozenset[str],
    partitions: int,
    spill: str,
) -> list[tuple[Relation, Relation]]:
    """Write both sides' referenced columns to ``spill``, Hive-partitioned by ``hash(key) % partitions``; the
    pairs of partition relations, each reading only files under ``spill`` (an empty side reads the side's empty
    file: no rows, the same columns), so a Ray task on another node can read them where ``spill`` is shared."""
    assert selection.key is not None
    qkey = quote(selection.key)
    params = {**documents.params, **meta.params}
    rows = con.execute(
        f"SELECT (SELECT count(*) FROM {documents.text}) + (SELECT count(*) FROM {meta.text})", params
    ).fetchone()
    assert rows is not None
    check_spill_room(spill, int(rows[0]), f"dataset {selection.dataset!r}: the sidecar join's partitions")
    # Hash both keys in the type the join compares them in (a UNION's common type), so equal keys hash alike.
    common = con.execute(f"DESCRIBE SELECT {qkey} FROM {documents.text} UNION ALL SELECT {qkey} FROM {meta.text}",
                         params).fetchall()[0][1]  # fmt: skip
    bucket = f"hash(CAST({qkey} AS {common})) % {partitions} AS zephon_part"
    sides = {}
    for side, relation, fixed in (
        ("documents", documents, ["zephon_shard", "file_row_number"]),
        ("metadata", meta, []),
    ):
        have = [r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {relation.text}", relation.params).fetchall()]
        keep = [c for c in have if c in fixed or c.lower() in referenced or c == selection.key]
        chosen = ", ".join(quote(c) for c in keep)
        target = os.path.join(spill, side)
        con.execute(
            f"COPY (SELECT {chosen}, {bucket} FROM {relation.text}) TO '{_sql_text(target)}' "
            "(FORMAT parquet, PARTITION_BY (zephon_part))",
            relation.params,
        )
        empty = os.path.join(spill, f"{side}-empty.parquet")
        con.execute(f"COPY (SELECT {chosen} FROM {relation.text} LIMIT 0) TO '{_sql_text(empty)}' (FORMAT parquet)",
                    relation.params)  # fmt: skip
        sides[side] = (target, chosen, empty)
    pairs = []
    for p in range(partitions):
        pair = []
        for side in ("documents", "metadata"):
            target, chosen, empty = sides[side]
            files = sorted(glob.glob(os.path.join(target, f"zephon_part={p}", "*.parquet"))) or [empty]
            text = f"(SELECT {chosen} FROM read_parquet($part_{side}_{p}, hive_partitioning = false))"
            pair.append(Relation(text=text, params={f"part_{side}_{p}": files}))
        pairs.append((pair[0], pair[1]))
    return pairs


def _sql_text(text: str) -> str:
    return text.replace("'", "''")


def sidecar_report(
    con: duckdb.DuckDBPyConnection, selection: Selection, meta: Relation, counts: dict[str, int], *, documents: int
) -> dict[str, int]:
    """Refuse duplicate sidecar keys (with an example); the report's counts of keys on one side only.

    A duplicated key that matches documents repeats them (more joined document rows than documents); one that
    matches none shows among the sidecar-only keys (more of them than distinct ones)."""
    name, key = selection.dataset, selection.key
    assert key is not None
    if counts["document_rows"] > documents or counts["side_keys"] > counts["distinct_side_keys"]:
        qkey = quote(key)
        # One aggregate over the duplicated keys: how many, their rows, the smallest and its rows (an example).
        keys, rows, example, n = con.execute(
            f"SELECT count(*), sum(n), min(k), arg_min(n, k) FROM (SELECT {qkey} AS k, count(*) AS n FROM "
            f"{meta.text} WHERE {qkey} IS NOT NULL GROUP BY {qkey} HAVING n > 1)",
            meta.params,
        ).fetchone() or (0, 0, None, 0)
        raise DatasetError(
            f"dataset {name!r}: sidecar key {key!r} must be unique, got {n} rows for {example!r} ({keys} "
            f"{'key' if keys == 1 else 'keys'} on more than one row, {rows} rows in all) in {selection.metadata} "
            "— keep one row per key (e.g. deduplicate the sidecar) and re-plan"
        )
    return {
        "documents_without_metadata": counts["without_metadata"],
        "metadata_without_document": counts["without_document"],
    }
