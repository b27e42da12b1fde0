"""Row groups a remote selection need not read: those whose footer statistics prove its ``where`` false.

The bounds are the conjuncts of the predicate's top-level ``AND`` of the form ``column OP constant`` (or
``constant OP column``), OP one of ``= < <= > >=``, on an integer or string column of the shard with a
constant of the same kind (DuckDB's own parser, ``json_serialize_sql``). A row group is skipped when one bound
is false for every value in its ``[min, max]``; its NULLs fail the bound too (NULL is not TRUE). Anything
else — OR, functions, float columns (Parquet statistics leave NaN out, DuckDB orders NaN above every number),
dates, decimals, a group without statistics — prunes nothing.

Only used without a sidecar: with one, every document takes part in the join's counts of keys on one side.

Invariant: a skipped row group holds no row the predicate keeps, so the selection, its order, dedup draws
and counts are those of reading every row group (``skipped_by_where`` is rows minus kept, over all rows).

Worked example: ``where="int_score >= 3 AND language = 'en'"`` gives the bounds (int_score >= 3) and
(language = 'en'). A row group with int_score in [0, 2] is skipped; one with language in ['fr', 'ru'] is
skipped; one with int_score in [1, 5] and language in ['de', 'fr'] is read ('en' lies between).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow.parquet as pq

from zephon.checks import is_int

__all__ = ["Bound", "bounds_of", "groups_to_read"]

_OPS = {
    "COMPARE_EQUAL": "=",
    "COMPARE_LESSTHAN": "<",
    "COMPARE_LESSTHANOREQUALTO": "<=",
    "COMPARE_GREATERTHAN": ">",
    "COMPARE_GREATERTHANOREQUALTO": ">=",
}
_FLIP = {"=": "=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


@dataclass(frozen=True, kw_only=True, slots=True)
class Bound:
    """``column OP value``: a conjunct every kept row satisfies."""

    column: str  # lower-cased
    op: str
    value: int | str


def _constant(node: dict[str, Any]) -> int | str | None:
    if node.get("class") != "CONSTANT":
        return None
    literal = node.get("literal")
    if isinstance(literal, dict):  # {"kind": "INTEGER" | "STRING" | ..., "text": ...}
        if literal.get("kind") == "INTEGER":
            return int(literal["text"])
        if literal.get("kind") == "STRING":
            return str(literal["text"])
        return None
    value = node.get("value")
    if isinstance(value, dict) and not value.get("is_null"):  # {"type": {"id": ...}, "value": ...}
        kind = str(value.get("type", {}).get("id", ""))
        if kind in ("TINYINT", "SMALLINT", "INTEGER", "BIGINT") and isinstance(value.get("value"), int):
            return int(value["value"])
        if kind == "VARCHAR" and isinstance(value.get("value"), str):
            return value["value"]
    return None


def _column(node: dict[str, Any]) -> str | None:
    names = node.get("column_names") if node.get("class") == "COLUMN_REF" else None
    return str(names[0]).lower() if isinstance(names, list) and len(names) == 1 else None


def bounds_of(where: dict[str, Any] | None) -> tuple[Bound, ...]:
    """The bounds of a parsed ``WHERE`` clause (a ``json_serialize_sql`` expression node)."""
    if not isinstance(where, dict):
        return ()
    if where.get("class") == "CONJUNCTION" and where.get("type") == "CONJUNCTION_AND":
        return tuple(b for child in where.get("children", []) for b in bounds_of(child))
    op = _OPS.get(str(where.get("type")))
    if where.get("class") != "COMPARISON" or op is None:
        return ()
    left, right = where.get("left", {}), where.get("right", {})
    column, value = _column(left), _constant(right)
    if column is None or value is None:
        column, value, op = _column(right), _constant(left), _FLIP[op]
    if column is None or value is None:
        return ()
    return (Bound(column=column, op=op, value=value),)


def _may_hold(bound: Bound, low: Any, high: Any) -> bool:
    v = bound.value
    if isinstance(v, int):
        if not (is_int(low) and is_int(high)):
            return True
    elif not (isinstance(low, str) and isinstance(high, str)):
        return True
    return {
        "=": low <= v <= high,  # type: ignore[operator]
        "<": low < v,  # type: ignore[operator]
        "<=": low <= v,  # type: ignore[operator]
        ">": high > v,  # type: ignore[operator]
        ">=": high >= v,  # type: ignore[operator]
    }[bound.op]


def groups_to_read(meta: pq.FileMetaData, bounds: tuple[Bound, ...]) -> list[int]:
    """The row groups of ``meta`` no bound excludes by its statistics (all of them without bounds)."""
    if not bounds:
        return list(range(meta.num_row_groups))
    leaf = {}
    for i in range(meta.num_columns):
        path = meta.schema.column(i).path
        if "." not in path:
            leaf[path.lower()] = i
    keep = []
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        excluded = False
        for bound in bounds:
            i = leaf.get(bound.column)
            stats = group.column(i).statistics if i is not None else None
            if stats is not None and stats.has_min_max and not _may_hold(bound, stats.min, stats.max):
                excluded = True
                break
        if not excluded:
            keep.append(g)
    return keep
