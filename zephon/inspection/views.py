"""SQL views of sequences and steps over a plan bundle: "what is in step N" as one query.

``connect_with_steps(plan_dir, batch_size)`` opens the read-only connection of ``zephon.inspection.sql.connect`` (views
``samples``, ``shards``, ``datasets``, ``bins``) and adds, where the plan defines them (see
``zephon.inspection.steps`` for the definitions per kind of plan):

* ``sequences(sequence, position, dataset_id, tokens_in_sequence)`` — one row per (sequence, document
  overlapping it): the document's tokens inside that sequence. Needs sequences: exact plans, plans without
  tokens (a sequence is one document; ``tokens_in_sequence`` is NULL), estimated token plans given
  ``max_length``.
* ``steps(step, position, dataset_id, tokens_in_step)`` — the same per step of ``batch_size`` sequences.
  Needs ``batch_size`` too.
* table macros ``sequence_documents(k)`` and ``step_documents(n)``: the rows of ``sequences`` / ``steps`` for
  one sequence or step, in plan order, found by seeking — filters on ``token_offset``, ``position`` or
  ``bins.sequence`` that DuckDB pushes down to Parquet row-group statistics — rather than by scanning the
  views (estimated token plans have no offsets column; there the macros scan).

Rows of the views come in no particular order: add ``ORDER BY``. Examples::

    SELECT * FROM step_documents(1200);                                   -- what is in step 1200
    SELECT step, d.name, sum(tokens_in_step) AS tokens                     -- tokens per dataset per step
    FROM steps JOIN datasets d USING (dataset_id) GROUP BY ALL ORDER BY ALL;

Worked example (exact wrap, ``L = 4``, ``B = 2``; documents of 3, 6, 2 tokens at offsets 0, 3, 9)::

    steps: (0, 0, ., 3), (0, 1, ., 5), (1, 1, ., 1), (1, 2, ., 2)

The step, sequence and token formulas of the views are SQL built by ``zephon.executor.step_arithmetic`` (the
functions the executor and ``zephon.inspection.steps`` run), so the views and the Python cannot drift. Integers
in the view definitions (``L``, ``B``, the longest document) are validated Python ``int`` values written into
the SQL text: DuckDB views cannot take bound parameters.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import duckdb
import pyarrow as pa

from zephon.executor.step_arithmetic import (
    Sql,
    document_steps,
    step_of,
    step_of_token,
    step_sequences,
    step_tokens,
    tokens_inside,
)
from zephon.inspection.sql import QueryResult, connect
from zephon.inspection.steps import StepLayout, resolve_layout
from zephon.plan.bundle import CheckedBundle, open_bundle

__all__ = [
    "connect_with_steps",
    "document_steps_sql",
    "query_table",
    "run_query",
    "unique_names",
    "view_statements",
]

#: The samples columns the step formulas read, as SQL operands of ``zephon.executor.step_arithmetic``.
_POSITION, _OFFSET, _TOKENS = Sql("position"), Sql("token_offset"), Sql("tokens")


def connect_with_steps(
    plan: str | os.PathLike[str] | CheckedBundle,
    batch_size: int | None = None,
    *,
    max_length: int | None = None,
    metadata: bool = False,
) -> duckdb.DuckDBPyConnection:
    """``zephon.inspection.sql.connect(plan_dir)`` plus the ``sequences`` and ``steps`` views and their table macros.

    ``batch_size`` (global batch, in sequences) enables ``steps``; ``max_length`` gives estimated token plans
    their sequences. Passing ``batch_size`` for a plan whose sequences are unknown raises ``ConfigError``.
    """
    bundle = plan if isinstance(plan, CheckedBundle) else open_bundle(plan)
    layout = resolve_layout(bundle.manifest, batch_size=batch_size, max_length=max_length)
    if batch_size is not None:
        layout.require_steps()
    con = connect(bundle, metadata=metadata)
    try:
        for statement in view_statements(layout, longest_document(bundle)):
            con.execute(statement)
    except BaseException:
        con.close()
        raise
    return con


def run_query(
    plan_dir: str | os.PathLike[str] | CheckedBundle,
    query: str,
    params: Mapping[str, Any] | Sequence[Any] | None = None,
    *,
    batch_size: int | None = None,
    max_length: int | None = None,
) -> QueryResult:
    """``zephon.inspection.sql.run_sql`` over ``connect_with_steps``: the last statement's columns and rows."""
    con = connect_with_steps(plan_dir, batch_size, max_length=max_length, metadata="metadata" in query.lower())
    try:
        result = con.execute(query, params) if params else con.execute(query)
        if result is None or result.description is None:
            return QueryResult(columns=[], rows=[])
        return QueryResult(columns=[str(d[0]) for d in result.description], rows=result.fetchall())
    finally:
        con.close()


def query_table(
    plan_dir: str | os.PathLike[str] | CheckedBundle,
    query: str,
    params: Mapping[str, Any] | Sequence[Any] | None = None,
    *,
    batch_size: int | None = None,
    max_length: int | None = None,
) -> pa.Table | None:
    """The last statement's result as an Arrow table (``None`` for a statement without a result).

    Repeated column names get ``_1``, ``_2``... (Parquet needs unique names), as in ``zephon sql -f json``.
    """
    con = connect_with_steps(plan_dir, batch_size, max_length=max_length, metadata="metadata" in query.lower())
    try:
        result = con.execute(query, params) if params else con.execute(query)
        if result is None or result.description is None:
            return None
        with warnings.catch_warnings():
            # DuckDB warns that Arrow output of an execute() result copies the rows; it is one copy, and
            # execute() is what runs several statements and binds parameters.
            warnings.simplefilter("ignore", UserWarning)
            table = result.to_arrow_table()
    finally:
        con.close()
    return table.rename_columns(unique_names(table.column_names))


def unique_names(columns: Sequence[str]) -> list[str]:
    """Column names with repeats suffixed ``_1``, ``_2``...: ``[a, a, b]`` → ``[a, a_1, b]``."""
    names: list[str] = []
    for name in columns:
        key, n = name, 0
        while key in names:
            n += 1
            key = f"{name}_{n}"
        names.append(key)
    return names


def longest_document(bundle: CheckedBundle) -> int | None:
    """The largest ``tokens`` value of the samples files, from the footer statistics (``None`` if unknown)."""
    best = 0
    for file in bundle.samples:
        meta = file.metadata
        col = file.schema.get_field_index("tokens")
        for g in range(meta.num_row_groups):
            stats = meta.row_group(g).column(col).statistics
            if stats is None or stats.null_count == meta.row_group(g).num_rows:
                continue
            if not stats.has_min_max:
                return None
            best = max(best, int(stats.max))
    return best


def view_statements(layout: StepLayout, longest: int | None) -> list[str]:
    """``CREATE TEMP VIEW`` / ``CREATE TEMP MACRO`` statements of the views the layout defines."""
    if not layout.has_sequences:
        return []
    units = [("sequence", "sequences", 1)]
    if layout.batch_size is not None:
        units.append(("step", "steps", layout.batch_size))
    out = []
    for col, view, per in units:
        out.append(f"CREATE TEMP VIEW {view} AS {_rows_sql(layout, col, per, None, longest)}")
        body = _rows_sql(layout, col, per, "n", longest)
        out.append(f"CREATE TEMP MACRO {col}_documents(n) AS TABLE {body} ORDER BY position")
    return out


def document_steps_sql(layout: StepLayout) -> str:
    """A query of ``(position, dataset_id, step)``: the step holding each document's first token.

    Documents in no sequence (best_fit drops, empty documents) are left out.
    """
    batch = layout.batch_size
    assert batch is not None
    if layout.packing == "document":
        return f"SELECT position, dataset_id, {step_of(_POSITION, batch)} AS step FROM samples"
    if layout.packing == "best_fit":
        return (
            f"SELECT b.position, any_value(s.dataset_id) AS dataset_id, {step_of(Sql('min(b.sequence)'), batch)} "
            "AS step FROM bins b JOIN samples s USING (position) GROUP BY b.position"
        )
    assert layout.max_length is not None
    step = step_of_token(_OFFSET, batch, layout.max_length)
    return f"SELECT position, dataset_id, {step} AS step FROM ({_offsets_sql(layout)}) WHERE tokens > 0"


def _offsets_sql(layout: StepLayout) -> str:
    if layout.offsets == "column":
        return "SELECT position, dataset_id, tokens, token_offset FROM samples"
    # Estimated plans: each document's offset is the running sum of the estimated tokens before it.
    return (
        "SELECT position, dataset_id, tokens, CAST(coalesce(sum(tokens) OVER (ORDER BY position "
        "ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS BIGINT) AS token_offset FROM samples"
    )


def _rows_sql(layout: StepLayout, col: str, per: int, arg: str | None, longest: int | None) -> str:
    """Rows ``(col, position, dataset_id, tokens_in_col)`` for units of ``per`` sequences (``col`` is ``step``, or
    ``sequence`` with ``per`` = 1), their SQL built by ``zephon.executor.step_arithmetic``.

    With ``arg`` (a macro parameter name) only unit ``arg`` is produced, with seek-friendly filters.
    """
    n = Sql(f"CAST({arg} AS BIGINT)") if arg else None
    if layout.packing == "document":  # a sequence is one document: sequence = position
        where = ""
        if n is not None:
            first, end = step_sequences(n, per)
            where = f" WHERE position >= {first} AND position < {end}"
        unit = step_of(_POSITION, per)
        return f"SELECT {unit} AS {col}, position, dataset_id, tokens AS tokens_in_{col} FROM samples{where}"
    if layout.packing == "best_fit":
        if n is None:
            return (
                f"SELECT {step_of(Sql('b.sequence'), per)} AS {col}, b.position, s.dataset_id, "
                f"CAST(sum(b.length) AS INTEGER) AS tokens_in_{col} "
                "FROM bins b JOIN samples s USING (position) GROUP BY ALL"
            )
        # Pieces of the unit from bins (sorted by sequence: row-group statistics skip the rest), then their
        # documents from samples within the pieces' position range.
        first, end = step_sequences(n, per)
        return (
            f"WITH p AS (SELECT sequence, position, length FROM bins WHERE sequence >= {first} AND sequence < {end}) "
            f"SELECT {step_of(Sql('p.sequence'), per)} AS {col}, p.position, s.dataset_id, "
            f"CAST(sum(p.length) AS INTEGER) AS tokens_in_{col} FROM p JOIN samples s ON s.position = p.position "
            "AND s.position BETWEEN (SELECT min(position) FROM p) AND (SELECT max(position) FROM p) GROUP BY ALL"
        )
    width = layout.max_length
    assert width is not None
    source = _offsets_sql(layout)
    if n is not None and layout.offsets == "column":
        start, end = step_tokens(n, per, width)
        bound = f" AND token_offset > {start - longest}" if longest is not None else ""
        source = f"{source} WHERE token_offset < {end}{bound}"
    first, last = document_steps(_OFFSET, _TOKENS, per, width)
    inner = (
        f"SELECT unnest(range({first}, {last + 1})) AS {col}, "
        f"position, dataset_id, tokens, token_offset FROM ({source}) WHERE tokens > 0"
    )
    inside = tokens_inside(_OFFSET, _TOKENS, *step_tokens(Sql(col), per, width))
    where = f" WHERE {col} = {n}" if n is not None else ""
    return f"SELECT {col}, position, dataset_id, CAST({inside} AS INTEGER) AS tokens_in_{col} FROM ({inner}){where}"
