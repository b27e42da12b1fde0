"""Each sample's cost, planned offline: a dataset's ``cost=`` expression evaluated with DuckDB at plan time.

A cost is one more projected expression of the selection machinery (``zephon.planner.selection``): the same
documents relation (local Parquet through ``read_parquet(..., file_row_number)``; remote or JSONL shards read
into Arrow by ``zephon.planner.selection.tables``, the referenced columns only), the same sidecar
(``metadata``/``key``, LEFT JOINed on the key), the same ``where``::

    SELECT zephon_shard AS shard, file_row_number AS row, ceil((cost)) AS cost
    FROM documents [LEFT JOIN sidecar USING (key)] [WHERE coalesce((where), false)]

so the cost column rides with the selected (shard, row) pairs. The planner then treats costs exactly as it
treats per-document token counts: cost mixtures schedule by them (``zephon.planner.token_mix``), ``num_cost``
budgets stop on them, ``Pipeline.pack_samples`` packs them into rows (``zephon.planner.best_fit``), and
samples.parquet's ``tokens`` column holds them (plan.json ``totals.tokens_are = "cost"``).

Rules (docs/records.md#costs-and-packing-samples): a cost is an integer ≥ 0; a non-integer is rounded **up**
(``ceil``); NULL, NaN, infinite, negative or ≥ 2^31 is refused in one line naming the dataset, the shard, the
row (and the key, with a sidecar) and how many samples share the fault. Rows a ``where`` leaves out cost 0 and
are never read. A WebDataset tar sample offers one column, its ``__key__`` (from the shard's headers, local or
remote; payloads are never read by the expression), so its cost comes from a sidecar keyed by ``__key__`` — or
from a function of its bytes: a ``ComputedCost`` (``zephon.recipe.computed_cost``) is computed by a planning pass
(``zephon.planner.counts.computed``) and is either the cost itself or, with its ``expression``, one more column
(``computed``) of the expression, joined on (shard, row).

Invariant: the costs are a function of the shards' and sidecar's content and the expression only — the result
is sorted by (shard, row) and scattered into per-shard arrays, whatever DuckDB's threads or scan order.

Worked example: shard 0 with rows (text_tokens, width, height) = (10, 28, 14), (3, 20, 20) and
``cost="text_tokens + ceil(width / 14.0) * ceil(height / 14.0)"``: costs 10 + 2·1 = 12 and 3 + 2·2 = 7;
``cost="width / 3"`` gives ceil(9.33) = 10 and ceil(6.67) = 7.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from zephon.errors import ConfigError, DatasetError, one_line
from zephon.plan.records import ShardRef
from zephon.planner.selection.evaluate import MEMORY_LIMIT
from zephon.planner.selection.join import Relation, quote, sidecar_relation
from zephon.planner.selection.results import duckdb_limit, memory_bytes
from zephon.planner.selection.tables import Wanted, arrow_read, read_documents, referenced_names
from zephon.recipe.computed_cost import COMPUTED_COLUMN, ComputedCost
from zephon.recipe.dataset import Dataset
from zephon.recipe.selection import Selection
from zephon.recipe.work_source import WorkSource
from zephon.specs import SamplePackSpec, TokenizeSpec

__all__ = ["MAX_COST", "dataset_costs"]

#: Costs travel in samples.parquet's int32 ``tokens`` column: one sample's cost must stay below this.
MAX_COST = 2**31 - 1


def dataset_costs(
    ds: Dataset, refs: tuple[ShardRef, ...], computed: Sequence[np.ndarray] | None = None
) -> list[np.ndarray]:
    """Per shard of ``ds`` (``refs``, in order): each row's cost (int64; 0 for rows its ``where`` leaves out).

    ``computed``: a ``ComputedCost``'s arrays from the computed pass (``zephon.planner.counts.computed``), per
    shard: the costs themselves, or — with its ``expression`` — the ``computed`` column of that expression."""
    assert ds.cost is not None
    if isinstance(ds.cost, ComputedCost):
        assert computed is not None and len(computed) == len(refs)
        if ds.cost.expression is None:  # checked and rounded up sample by sample by the pass
            return [np.asarray(c, np.int64) for c in computed]
        return _expression_costs(ds, refs, ds.cost.expression, computed)
    return _expression_costs(ds, refs, ds.cost, None)


def _expression_costs(
    ds: Dataset, refs: tuple[ShardRef, ...], expression: str, computed: Sequence[np.ndarray] | None
) -> list[np.ndarray]:
    """``expression`` evaluated per row (with ``computed`` as the column ``computed`` when given)."""
    selection = ds.selection or Selection(dataset=ds.name)
    memory_bytes(MEMORY_LIMIT)  # a size, or the setting's one-line error before anything is made
    spill = tempfile.mkdtemp(prefix="zephon-cost-")
    con = duckdb.connect()
    try:
        con.execute(f"SET memory_limit = '{duckdb_limit(MEMORY_LIMIT)}'")
        con.execute("SET temp_directory = ?", [spill])
        documents, columns = _documents(con, ds, selection, refs, expression)
        source, params = documents.text, dict(documents.params)
        if computed is not None:  # the computed pass's values as one more column, joined on (shard, row)
            con.register("zephon_computed", _computed_table(computed))
            source = f"{source} JOIN zephon_computed USING (zephon_shard, file_row_number)"
            columns = [*columns, COMPUTED_COLUMN]
        if selection.metadata is not None:
            assert selection.key is not None
            meta, _, _ = sidecar_relation(con, selection)
            params.update(meta.params)
            source = f"{source} LEFT JOIN (SELECT * FROM {meta.text}) m USING ({quote(selection.key)})"
        where = f"WHERE coalesce(({selection.where}), false)" if selection.where is not None else ""
        key = f", CAST({quote(selection.key)} AS VARCHAR) AS zephon_key" if selection.key is not None else ""
        query = (
            f"CREATE TEMP TABLE zephon_costs AS SELECT zephon_shard AS shard, CAST(file_row_number AS BIGINT) AS row, "
            f"CAST(({expression}) AS DOUBLE) AS cost{key} FROM {source} {where}"
        )
        try:
            con.execute(query, params)
        except duckdb.Error as exc:
            raise ConfigError(
                f"dataset {ds.name!r}: cost={expression!r} must be a number-valued DuckDB expression over the "
                f"dataset's columns ({', '.join(columns)}), got {type(exc).__name__}: {one_line(exc)} — fix the "
                "expression"
            ) from exc
        _check(con, ds.name, expression, refs, with_key=bool(key))
        result = con.execute(
            "SELECT shard, row, CAST(ceil(cost) AS BIGINT) AS cost FROM zephon_costs ORDER BY shard, row"
        ).fetchnumpy()
    finally:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)
    out = [np.zeros(r.rows, np.int64) for r in refs]
    shard = np.asarray(result["shard"], np.int64)
    row = np.asarray(result["row"], np.int64)
    cost = np.asarray(result["cost"], np.int64)
    cuts = np.flatnonzero(np.diff(shard)) + 1
    for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(shard)], strict=True):
        if hi > lo:
            out[int(shard[lo])][row[lo:hi]] = cost[lo:hi]
    return out


def _computed_table(computed: Sequence[np.ndarray]) -> pa.Table:
    """The computed pass's values as ``(zephon_shard, file_row_number, computed)`` rows."""
    shard = np.concatenate([np.full(len(c), j, np.int32) for j, c in enumerate(computed)] or [np.zeros(0, np.int32)])
    row = np.concatenate([np.arange(len(c), dtype=np.int64) for c in computed] or [np.zeros(0, np.int64)])
    values = np.concatenate([np.asarray(c, np.int64) for c in computed] or [np.zeros(0, np.int64)])
    return pa.table({"zephon_shard": shard, "file_row_number": row, COMPUTED_COLUMN: values})


def _documents(
    con: duckdb.DuckDBPyConnection, ds: Dataset, selection: Selection, refs: tuple[ShardRef, ...], expression: str
) -> tuple[Relation, list[str]]:
    """The documents relation (as the selection reads it) and the dataset's column names (for messages)."""
    if any(arrow_read(r) for r in refs):
        probe = Selection(
            dataset=ds.name,
            where=f"({expression}) IS NULL" + (f" AND ({selection.where})" if selection.where is not None else ""),
            metadata=selection.metadata,
            key=selection.key,
        )
        wanted = Wanted(names=referenced_names(con, probe).names)
        table, columns = read_documents(ds.name, refs, wanted)
        con.register("zephon_documents", table)
        return Relation(text="(SELECT * FROM zephon_documents) d", params={}), columns
    paths = [r.uri for r in refs]
    documents = Relation(
        text="(SELECT *, CAST(file_index AS INTEGER) AS zephon_shard FROM read_parquet($paths, "
        "file_row_number = true)) d",
        params={"paths": paths},
    )
    names = [r[0] for r in con.execute("DESCRIBE SELECT * FROM read_parquet($p)", {"p": paths[:1]}).fetchall()]
    return documents, names


def _check(
    con: duckdb.DuckDBPyConnection, name: str, expression: str, refs: tuple[ShardRef, ...], *, with_key: bool
) -> None:
    """Refuse the first sample (by shard, row) whose cost is NULL, not finite, negative or too large."""
    faults = (
        ("cost IS NULL", "NULL", "give every sample a value (e.g. coalesce(width, 0))"),
        ("isnan(cost) OR isinf(cost)", "not a finite number", "keep the expression finite"),
        ("cost < 0", "negative", "make it ≥ 0 (e.g. greatest(x, 0))"),
        (f"ceil(cost) > {MAX_COST}", f"above {MAX_COST}", "scale it down"),
    )
    for test, what, fix in faults:
        found: list[Any] = con.execute(
            f"SELECT shard, row, cost{', zephon_key' if with_key else ''}, count(*) OVER () FROM zephon_costs "
            f"WHERE {test} ORDER BY shard, row LIMIT 1"
        ).fetchall()
        if not found:
            continue
        shard, row, value, *rest = found[0]
        key = f" (key {rest[0]!r})" if with_key else ""
        raise DatasetError(
            f"dataset {name!r}: cost={expression!r} must be a number ≥ 0 for every sample, got {what} "
            f"({value}) at shard {refs[int(shard)].uri} row {int(row)}{key} and {int(rest[-1]) - 1} more — {fix}"
        )


def check_oversize(ds: Dataset, refs: tuple[ShardRef, ...], costs: list[np.ndarray], rows: list[np.ndarray | None],
                   max_cost: int) -> None:  # fmt: skip
    """Refuse the first sample (by shard, row) of ``ds`` the plan reads that costs more than ``max_cost``
    (``pack_samples(oversize="refuse")``); ``rows``: per shard, the rows read (None: all of them)."""
    over = 0
    first: tuple[int, int, int] | None = None
    for j, (cost, chosen) in enumerate(zip(costs, rows, strict=True)):
        at = np.arange(len(cost)) if chosen is None else np.sort(chosen)
        bad = at[cost[at] > max_cost]
        if len(bad) and first is None:
            first = (j, int(bad[0]), int(cost[bad[0]]))
        over += len(bad)
    if first is not None:
        j, row, value = first
        raise DatasetError(
            f"dataset {ds.name!r}: every sample must cost at most max_cost={max_cost} to fit a row, got {value} at "
            f"shard {refs[j].uri} row {row} and {over - 1} more — raise max_cost, or leave such samples out and count "
            'them with pack_samples(oversize="drop")'
        )


def check_costs(source: WorkSource, tokenize: TokenizeSpec | None, sample_pack: SamplePackSpec | None) -> None:
    """Costs are all-or-none, for record plans only; packing samples needs them."""
    priced = [ds.name for ds in source.datasets if ds.cost is not None]
    if not priced:
        if sample_pack is not None:
            raise ConfigError(
                "pack_samples must plan datasets with a cost=, got none — add e.g. Dataset.from_path(..., "
                'cost="text_tokens + ceil(width / 14.0) * ceil(height / 14.0)")'
            )
        return
    missing = [ds.name for ds in source.datasets if ds.cost is None]
    if missing:
        raise ConfigError(
            f"cost= must be on every dataset of a plan once one has it, got it on {priced} but not on {missing} — "
            'add cost= to those (cost="1": one unit per sample)'
        )
    if tokenize is not None or source.token_estimation is not None or source.exact_tokens:
        raise ConfigError(
            "datasets with cost= must be planned as records (no tokenizer, token_estimation or exact_tokens), got "
            "them in a text plan — drop cost= or the tokenizer settings"
        )
