"""The ``metadata`` view: the columns a plan's selections were evaluated on, per document, for SQL and audits.

For every dataset planned through a selection (plan.json ``datasets[].selection``) the view holds one row per
document of its shards: ``dataset_id``, ``shard_id``, ``row``, the dataset's own columns except the text
field, and — with a sidecar — the sidecar's columns joined on the key (NULL where the sidecar has no row).
Join it to ``samples`` on ``(shard_id, row)``::

    SELECT s.position, m.int_score FROM samples s JOIN metadata m USING (shard_id, row) ORDER BY position

It is built on demand (``zephon sql`` builds it when a query names ``metadata``; ``audit --by-column``
always), by reading those columns of the shards and sidecar with DuckDB before the inspection connection is
locked; a dataset without a selection has no rows in it. ``zephon.inspection.column_audit`` averages one of
its columns per window of steps.

Example: a plan whose dataset ``web`` selects ``where="score >= 3"`` over shards with columns id, text,
score gives ``metadata(dataset_id, shard_id, row, id, score)``; ``column_windows(plan, "score", batch_size=8,
window=100)`` gives the mean score in steps 0-99, 100-199, ...
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zephon.errors import ConfigError, DatasetError, one_line
from zephon.plan.bundle import CheckedBundle

__all__ = ["metadata_table", "metadata_values"]


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def metadata_table(bundle: CheckedBundle) -> pa.Table:
    """The ``metadata`` view's rows (see the module docstring); an empty table when no dataset has a selection."""
    manifest = bundle.manifest
    field = manifest.tokenizer.field if manifest.tokenizer is not None else "text"
    shards = pq.read_table(bundle.shards.path, columns=["shard_id", "dataset_id", "uri"]).to_pydict()
    parts = []
    con = duckdb.connect()
    try:
        for d in manifest.datasets:
            if d.selection is None:
                continue
            pairs = [
                (sid, uri)
                for sid, did, uri in zip(shards["shard_id"], shards["dataset_id"], shards["uri"], strict=True)
                if did == d.id
            ]
            source = "read_parquet($paths, file_row_number = true) d"
            params: dict[str, object] = {"paths": [uri for _, uri in pairs], "ids": [sid for sid, _ in pairs]}
            side_columns = ""
            sidecar = d.selection.get("metadata")
            if sidecar is not None:
                from zephon.planner.selection import sidecar_files  # inspection sits above the planner
                from zephon.recipe.selection import Selection

                key = _quote(d.selection["key"])
                files = sidecar_files(Selection(dataset=d.name, metadata=sidecar, key=d.selection["key"]))
                params["meta"] = files
                source += f" LEFT JOIN read_parquet($meta) m ON d.{key} = m.{key}"
                side_columns = f", m.* EXCLUDE ({key})"
            query = (
                f"SELECT {d.id}::SMALLINT AS dataset_id, "
                "CAST(list_extract($ids, CAST(d.file_index AS BIGINT) + 1) AS INTEGER) AS shard_id, "
                "CAST(d.file_row_number AS INTEGER) AS row, "
                f"d.* EXCLUDE (file_row_number, {_quote(field)}){side_columns} FROM {source} ORDER BY shard_id, row"
            )
            try:
                parts.append(con.sql(query, params=params).to_arrow_table())
            except duckdb.Error as exc:
                raise DatasetError(
                    f"dataset {d.name!r}: its metadata must be readable from the planned shards and sidecar, got "
                    f"{one_line(exc)} — restore the data the plan was made from, or re-plan"
                ) from exc
    finally:
        con.close()
    if not parts:
        return pa.table(
            {
                "dataset_id": pa.array([], pa.int16()),
                "shard_id": pa.array([], pa.int32()),
                "row": pa.array([], pa.int32()),
            }
        )
    return pa.concat_tables(parts, promote_options="default")


def metadata_values(
    bundle: CheckedBundle, shard_ids: np.ndarray, rows: np.ndarray, names: Sequence[str]
) -> dict[str, list[object]]:
    """The metadata columns ``names`` of the documents ``(shard_ids[i], rows[i])`` (``zephon show --column``):
    read from those shards and the sidecar only, None where a document has no value (or its dataset no
    selection); a name no selected dataset has is a ``ConfigError`` listing the columns there are."""
    manifest = bundle.manifest
    field = manifest.tokenizer.field if manifest.tokenizer is not None else "text"
    shards = pq.read_table(bundle.shards.path, columns=["shard_id", "dataset_id", "uri"]).to_pydict()
    uri_of = dict(zip(shards["shard_id"], shards["uri"], strict=True))
    dataset_of = dict(zip(shards["shard_id"], shards["dataset_id"], strict=True))
    selected = {d.id: d for d in manifest.datasets if d.selection is not None}
    out: dict[str, list[object]] = {n: [None] * len(rows) for n in names}
    available: set[str] = set()
    for shard in np.unique(shard_ids).tolist():
        d = selected.get(dataset_of[shard])
        if d is None:
            continue
        assert d.selection is not None
        at = np.flatnonzero(shard_ids == shard)
        have = [c for c in pq.read_schema(uri_of[shard]).names if c != field]
        available |= set(have)
        key = d.selection.get("key")
        read = sorted({*(n for n in names if n in have), *([key] if key else [])})
        table = pq.read_table(uri_of[shard], columns=read)
        picked = table.take(pa.array(rows[at], pa.int64())).to_pydict()
        for n in names:
            if n in picked:
                for i, v in zip(at.tolist(), picked[n], strict=True):
                    out[n][i] = v
        if key:
            columns, side = _sidecar_values(d.name, d.selection["metadata"], key, picked[key], names)
            available |= columns
            for n, values in side.items():
                for i, v in zip(at.tolist(), values, strict=True):
                    out[n][i] = v
    missing = [n for n in names if n not in available]
    if missing and selected:
        raise ConfigError(
            f"--column must name a metadata column of the plan's selected datasets, got {missing[0]!r} — it has "
            f"{', '.join(sorted(available)) or 'none in this step'}"
        )
    if missing:
        raise ConfigError(f"--column needs a plan with selections (docs/curricula.md), got none for {missing[0]!r}")
    return out


def _sidecar_values(
    dataset: str, metadata: str, key: str, keys: list[object], names: Sequence[str]
) -> tuple[set[str], dict[str, list[object]]]:
    """The sidecar's columns, and the values of those of ``names`` it has for ``keys`` (None without a row)."""
    from zephon.planner.selection import sidecar_files
    from zephon.recipe.selection import Selection

    files = sidecar_files(Selection(dataset=dataset, metadata=metadata, key=key))
    con = duckdb.connect()
    try:
        columns = [r[0] for r in con.execute("DESCRIBE SELECT * FROM read_parquet($f)", {"f": files}).fetchall()]
        wanted = [n for n in names if n in columns and n != key]
        out: dict[str, list[object]] = {}
        if not wanted:
            return set(columns) - {key}, out
        table = pa.table({"k": pa.array(keys)})
        con.register("zephon_keys", table)
        select = ", ".join(f"m.{_quote(n)}" for n in wanted)
        found = con.execute(
            f"SELECT z.k, {select} FROM zephon_keys z LEFT JOIN read_parquet($f) m ON z.k = m.{_quote(key)}",
            {"f": files},
        ).fetchall()
    finally:
        con.close()
    by_key = {r[0]: r[1:] for r in found}
    for j, n in enumerate(wanted):
        out[n] = [by_key.get(k, (None,) * len(wanted))[j] for k in keys]
    return set(columns) - {key}, out
