"""SQL over a plan bundle with DuckDB: read-only inspection of what a training run will see.

``connect(plan_dir)`` opens an in-memory DuckDB connection with these views:

* ``samples``  — the bundle's samples Parquet file(s) (``plan.json`` ``files.samples``), one row per
  scheduled document: position, dataset_id, shard_id, row, epoch, tokens, token_offset.
* ``shards``   — ``shards.parquet``: shard_id, dataset_id, dataset, uri, format, rows, bytes, row_groups,
  fingerprint.
* ``datasets`` — ``plan.json`` ``datasets``: dataset_id, name, path, pinned, format, fingerprint, shards,
  rows, weight, planned_documents. ``format`` is that of the dataset's shards (``shards.parquet``): one
  format, or the formats found, sorted and comma-joined, when its JSONL shards mix compressions
  (``jsonl.gz,jsonl.zst``).
* ``phases``   — one row per (phase, dataset) from ``plan.json`` ``phases`` (one phase 0 spanning the plan
  when it has none): phase, first_position, end_position, dataset_id, weight (0 where the phase does not
  read the dataset), planned_documents, planned_tokens (null without token counts). A document's phase is
  the row with ``first_position <= position < end_position``.
* ``segments`` — one row per segment of a continued plan (``plan.json`` ``lineage.segments``; one segment 0
  spanning a plan without lineage): segment, config_hash (of the plan that laid it out), first_step (of the
  global batch the branch was made for), first_position, end_position. A document's segment is the row with
  ``first_position <= position < end_position``; a step's, the last row with ``first_step <= step``.
* ``metadata`` — with ``metadata=True`` (``run_sql`` when the query names it): the columns the plan's
  selections were evaluated on, per document (``zephon.inspection.metadata``).
* ``bins``     — best-fit exact plans only: ``bins.parquet`` (sequence, offset, position, doc_start, length).

Example — documents per dataset in the first 1000 positions::

    run_sql(plan_dir, "SELECT d.name, count(*) AS n FROM samples s JOIN datasets d USING (dataset_id) "
                      "WHERE s.position < $n GROUP BY d.name ORDER BY d.name", {"n": 1000})

The connection cannot touch the file system: the Parquet files are opened by pyarrow (lazily; DuckDB pushes
column projections and filters such as ``position BETWEEN a AND b`` down to row-group statistics), then
DuckDB's external access is switched off and its configuration locked. ``COPY ... TO``, ``ATTACH``,
``INSTALL``, ``read_csv('/etc/...')`` and the like fail with a permission error; temporary tables live in
memory only. Parameters are bound by DuckDB (``$name`` with a dict, ``?`` with a list), never formatted in.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import duckdb
import pyarrow as pa
import pyarrow.dataset as pds

from zephon.errors import ConfigError, PlanFormatError
from zephon.plan.bundle import CheckedBundle, CheckedFile, open_bundle
from zephon.plan.manifest import Manifest

__all__ = ["DATASETS_SCHEMA", "PHASES_SCHEMA", "SEGMENTS_SCHEMA", "QueryResult", "connect", "run_sql"]

#: Columns of the ``segments`` view: the stretches of a continued plan each configuration laid out.
SEGMENTS_SCHEMA = pa.schema(
    [
        pa.field("segment", pa.int64(), nullable=False),
        pa.field("config_hash", pa.string(), nullable=False),
        pa.field("first_step", pa.int64(), nullable=False),
        pa.field("first_position", pa.int64(), nullable=False),
        pa.field("end_position", pa.int64(), nullable=False),
    ]
)

#: Columns of the ``datasets`` view, built from ``plan.json`` (``dataset_id`` is the manifest's ``id``).
DATASETS_SCHEMA = pa.schema(
    [
        pa.field("dataset_id", pa.int16(), nullable=False),
        pa.field("name", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("pinned", pa.string(), nullable=False),
        pa.field("format", pa.string()),
        pa.field("fingerprint", pa.string(), nullable=False),
        pa.field("shards", pa.int64(), nullable=False),
        pa.field("rows", pa.int64(), nullable=False),
        pa.field("weight", pa.float64(), nullable=False),
        pa.field("planned_documents", pa.int64(), nullable=False),
    ]
)


#: Columns of the ``phases`` view, built from ``plan.json``.
PHASES_SCHEMA = pa.schema(
    [
        pa.field("phase", pa.int32(), nullable=False),
        pa.field("first_position", pa.int64(), nullable=False),
        pa.field("end_position", pa.int64(), nullable=False),
        pa.field("dataset_id", pa.int16(), nullable=False),
        pa.field("weight", pa.float64(), nullable=False),
        pa.field("planned_documents", pa.int64(), nullable=False),
        pa.field("planned_tokens", pa.int64()),
    ]
)


class QueryResult(NamedTuple):
    """Column names and rows of a query; unpacks as ``columns, rows = run_sql(...)``."""

    columns: list[str]
    rows: list[tuple[Any, ...]]


def connect(plan: str | os.PathLike[str] | CheckedBundle, *, metadata: bool = False) -> duckdb.DuckDBPyConnection:
    """An in-memory, file-system-less DuckDB connection with the views ``samples``, ``shards``, ``datasets``
    (and ``metadata`` when asked: it reads the selected datasets' shards, so it is built only on demand).

    ``plan`` is a bundle directory, opened and checked here (``zephon.plan.bundle.open_bundle``: a damaged
    bundle is one ``PlanFormatError`` naming the file), or a bundle a caller already opened.
    """
    bundle = plan if isinstance(plan, CheckedBundle) else open_bundle(plan)
    plan_dir = bundle.path
    manifest = bundle.manifest
    samples = _parquet(bundle.samples)
    shards = _parquet((bundle.shards,))
    datasets = _datasets_table(manifest, plan_dir, shards)

    con = duckdb.connect(":memory:")
    try:
        # Unknown table names must not resolve to Python variables of the caller (DuckDB's replacement scans).
        con.execute("SET python_enable_replacements = false")
        con.register("samples", samples)
        con.register("shards", shards)
        con.register("datasets", datasets)
        con.register("phases", _phases_table(manifest, plan_dir))
        con.register("segments", _segments_table(manifest))
        if bundle.bins is not None:
            con.register("bins", _parquet((bundle.bins,)))
        if metadata:
            from zephon.inspection.metadata import metadata_table

            con.register("metadata", metadata_table(bundle))
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


def run_sql(
    plan_dir: str | os.PathLike[str],
    query: str,
    params: Mapping[str, Any] | Sequence[Any] | None = None,
) -> QueryResult:
    """Run ``query`` on a plan bundle's views and return its columns and rows (all rows, in memory).

    The last statement's result is returned when ``query`` holds several. DuckDB errors (``duckdb.Error``)
    propagate unchanged.
    """
    if not isinstance(query, str) or not query.strip():
        raise ConfigError(f"query must be a SQL statement, got {query!r} — pass e.g. 'SELECT * FROM datasets'")
    con = connect(plan_dir, metadata="metadata" in query.lower())
    try:
        result = con.execute(query, params) if params else con.execute(query)
        if result is None or result.description is None:
            return QueryResult(columns=[], rows=[])
        columns = [str(d[0]) for d in result.description]
        return QueryResult(columns=columns, rows=result.fetchall())
    finally:
        con.close()


def _parquet(files: Sequence[CheckedFile]) -> pds.Dataset:
    # Checked by open_bundle (present, complete, the format's columns): the schema need not be read again.
    return pds.dataset([str(f.path) for f in files], schema=files[0].schema, format="parquet")


def _shard_formats(shards: pds.Dataset) -> dict[int, str]:
    """Each dataset's shard formats from ``shards.parquet``: one, or several sorted and comma-joined."""
    pairs = shards.to_table(columns=["dataset_id", "format"]).group_by(["dataset_id", "format"]).aggregate([])
    found: dict[int, list[str]] = {}
    for dataset_id, fmt in zip(pairs["dataset_id"].to_pylist(), pairs["format"].to_pylist(), strict=True):
        found.setdefault(dataset_id, []).append(fmt)
    return {dataset_id: ",".join(sorted(formats)) for dataset_id, formats in found.items()}


def _datasets_table(manifest: Manifest, plan_dir: Path, shards: pds.Dataset) -> pa.Table:
    formats = _shard_formats(shards)
    try:
        columns = {
            field.name: [getattr(d, "id" if field.name == "dataset_id" else field.name) for d in manifest.datasets]
            for field in DATASETS_SCHEMA
        }
        columns["format"] = [formats.get(d.id, d.format) for d in manifest.datasets]
        return pa.Table.from_pydict(columns, schema=DATASETS_SCHEMA)
    except pa.ArrowException as exc:
        raise PlanFormatError(
            f"{plan_dir / 'plan.json'} `datasets` must fit the datasets view {DATASETS_SCHEMA.names}, got an "
            f"invalid entry ({type(exc).__name__}: {exc}) — the bundle is damaged; re-plan"
        ) from exc


def _segments_table(manifest: Manifest) -> pa.Table:
    """plan.json ``lineage.segments`` with their end positions; one segment 0 for a plan without lineage."""
    lineage = manifest.lineage
    end = manifest.totals.documents
    if lineage is None:
        rows = [{"segment": 0, "config_hash": manifest.config_hash, "first_step": 0, "first_position": 0}]
    else:
        rows = [
            {"segment": s.segment, "config_hash": s.config_hash, "first_step": s.first_step,
             "first_position": s.first_position}
            for s in lineage.segments
        ]  # fmt: skip
    ends = [r["first_position"] for r in rows[1:]] + [end]
    return pa.Table.from_pylist([r | {"end_position": e} for r, e in zip(rows, ends, strict=True)], SEGMENTS_SCHEMA)


def _phases_table(manifest: Manifest, plan_dir: Path) -> pa.Table:
    try:
        rows = [
            {
                "phase": p.index,
                "first_position": p.first_position,
                "end_position": p.end_position,
                "dataset_id": d.id,
                "weight": p.weights.get(d.name, 0.0),
                "planned_documents": p.planned_documents[d.name],
                "planned_tokens": (p.planned_tokens or {}).get(d.name),
            }
            for p in manifest.resolved_phases
            for d in manifest.datasets
        ]
        return pa.Table.from_pylist(rows, schema=PHASES_SCHEMA)
    except (KeyError, pa.ArrowException) as exc:
        raise PlanFormatError(
            f"{plan_dir / 'plan.json'} `phases` must give planned_documents of every dataset in the phases view, "
            f"got an invalid entry ({type(exc).__name__}: {exc}) — the bundle is damaged; re-plan"
        ) from exc
