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

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from zephon.errors import DatasetError, one_line
from zephon.plan.bundle import CheckedBundle

__all__ = ["metadata_table"]


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
                f"SELECT {d.id}::SMALLINT AS dataset_id, CAST(list_extract($ids, CAST(d.file_index AS BIGINT) + 1) AS INTEGER) "
                f"AS shard_id, CAST(d.file_row_number AS INTEGER) AS row, "
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
