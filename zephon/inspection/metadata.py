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
from zephon.plan.records import shard_refs

__all__ = ["metadata_table", "metadata_values"]


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def metadata_table(bundle: CheckedBundle) -> pa.Table:
    """The ``metadata`` view's rows (see the module docstring); an empty table when no dataset has a selection."""
    manifest = bundle.manifest
    field = manifest.tokenizer.field if manifest.tokenizer is not None else "text"
    # inspection sits above the planner: remote and JSONL shards are read as the planner's selection read them
    from zephon.planner.selection.tables import Wanted, arrow_read, read_documents

    all_refs = shard_refs(pq.read_table(bundle.shards.path))
    parts = []
    con = duckdb.connect()
    try:
        for d in manifest.datasets:
            if d.selection is None:
                continue
            refs = [r for r in all_refs if r.dataset_id == d.id]
            params: dict[str, object] = {"ids": [r.shard_id for r in refs]}
            if any(arrow_read(r) for r in refs):
                documents, _ = read_documents(d.name, refs, Wanted(all_but=field))
                con.register(f"zephon_documents_{d.id}", documents)
                source = f"(SELECT * EXCLUDE (zephon_shard), zephon_shard AS file_index FROM zephon_documents_{d.id}) d"
                exclude = "file_row_number, file_index"
            else:
                source = "read_parquet($paths, file_row_number = true) d"
                params["paths"] = [r.uri for r in refs]
                exclude = f"file_row_number, {_quote(field)}"
            side_columns = ""
            sidecar = d.selection.get("metadata")
            if sidecar is not None:
                key = _quote(d.selection["key"])
                side, side_params = _sidecar_relation(con, d.name, sidecar, d.selection["key"], f"zephon_side_{d.id}")
                params.update(side_params)
                source += f" LEFT JOIN {side} m ON d.{key} = m.{key}"
                side_columns = f", m.* EXCLUDE ({key})"
            query = (
                f"SELECT {d.id}::SMALLINT AS dataset_id, "
                "CAST(list_extract($ids, CAST(d.file_index AS BIGINT) + 1) AS INTEGER) AS shard_id, "
                "CAST(d.file_row_number AS INTEGER) AS row, "
                f"d.* EXCLUDE ({exclude}){side_columns} FROM {source} ORDER BY shard_id, row"
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
    from zephon.planner.selection.tables import Wanted, arrow_read, read_shard

    ref_of = {r.shard_id: r for r in shard_refs(pq.read_table(bundle.shards.path))}
    selected = {d.id: d for d in manifest.datasets if d.selection is not None}
    out: dict[str, list[object]] = {n: [None] * len(rows) for n in names}
    available: set[str] = set()
    for shard in np.unique(shard_ids).tolist():
        ref = ref_of[shard]
        d = selected.get(ref.dataset_id)
        if d is None:
            continue
        assert d.selection is not None
        at = np.flatnonzero(shard_ids == shard)
        key = d.selection.get("key")
        if arrow_read(ref):  # remote or JSONL: as the planner's selection read it
            wanted = Wanted(names=frozenset(n.lower() for n in [*names, *([key] if key else [])]))
            table, columns = read_shard(d.name, 0, ref, wanted)
            have = [c for c in columns if c != field]
        else:
            have = [c for c in pq.read_schema(ref.uri).names if c != field]
            table = pq.read_table(ref.uri, columns=sorted({*(n for n in names if n in have), *([key] if key else [])}))
        available |= set(have)
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
    con = duckdb.connect()
    try:
        side, params = _sidecar_relation(con, dataset, metadata, key, "zephon_side")
        columns = [r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {side}", params).fetchall()]
        wanted = [n for n in names if n in columns and n != key]
        out: dict[str, list[object]] = {}
        if not wanted:
            return set(columns) - {key}, out
        table = pa.table({"k": pa.array(keys)})
        con.register("zephon_keys", table)
        select = ", ".join(f"m.{_quote(n)}" for n in wanted)
        found = con.execute(
            f"SELECT z.k, {select} FROM zephon_keys z LEFT JOIN {side} m ON z.k = m.{_quote(key)}",
            params,
        ).fetchall()
    finally:
        con.close()
    by_key = {r[0]: r[1:] for r in found}
    for j, n in enumerate(wanted):
        out[n] = [by_key.get(k, (None,) * len(wanted))[j] for k in keys]
    return set(columns) - {key}, out


def _sidecar_relation(
    con: duckdb.DuckDBPyConnection, dataset: str, metadata: str, key: str, name: str
) -> tuple[str, dict[str, object]]:
    """The sidecar as a relation of ``con`` and its parameters: local files through ``read_parquet($meta)``, a
    remote sidecar read whole (``zephon.planner.selection.tables``) and registered as ``name``."""
    from zephon.planner.selection.evaluate import sidecar_files  # inspection sits above the planner
    from zephon.planner.selection.sidecar import is_remote_sidecar, read_sidecar
    from zephon.recipe.selection import Selection

    selection = Selection(dataset=dataset, metadata=metadata, key=key)
    if is_remote_sidecar(metadata):
        con.register(name, read_sidecar(selection).table)
        return name, {}
    return "read_parquet($meta)", {"meta": sidecar_files(selection)}
