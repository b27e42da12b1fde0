"""A metadata column over training: its mean per window of steps (``zephon audit --by-column COLUMN``).

The column comes from the ``metadata`` view (``zephon.inspection.metadata``): a selected dataset's own column
or its sidecar's. Each document counts in the step holding its first token (``zephon.inspection.views``);
windows are consecutive, ``window`` steps each (the last may be shorter); documents without a value (NULL,
or a dataset without a selection) are counted apart, never averaged in.

Example: an ascending ``order_by="quality"`` curriculum shows rising means window after window.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import duckdb
import numpy as np

from zephon.errors import ConfigError, one_line
from zephon.inspection.steps import resolve_layout
from zephon.inspection.views import connect_with_steps, document_steps_sql
from zephon.plan.bundle import open_bundle

__all__ = ["ColumnWindows", "column_windows"]


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True, kw_only=True, slots=True)
class ColumnWindows:
    """A metadata column's mean over the plan and in consecutive windows of ``window`` steps."""

    column: str
    window: int
    #: Mean over every planned document with a value; documents without one (NULL) are counted apart.
    mean: float
    documents: int
    nulls: int
    #: First step of each window, the mean in it (NaN when no document of the window has a value) and count.
    first_step: np.ndarray
    means: np.ndarray
    counts: np.ndarray


def column_windows(
    plan_dir: str | os.PathLike[str],
    column: str,
    *,
    batch_size: int | None = None,
    max_length: int | None = None,
    window: int = 100,
) -> ColumnWindows:
    """Mean of the metadata column ``column`` per window of ``window`` steps (each document in the step that
    holds its first token; ``zephon.inspection.views``)."""
    bundle = open_bundle(plan_dir)
    layout = resolve_layout(bundle.manifest, batch_size=batch_size, max_length=max_length)
    steps = layout.require_steps()
    con = connect_with_steps(bundle, layout.batch_size, max_length=max_length, metadata=True)
    try:
        have = [r[0] for r in con.execute("DESCRIBE metadata").fetchall()]
        if column not in have[3:]:
            raise ConfigError(
                f"--by-column must name a metadata column of the plan's selected datasets, got {column!r} — it has "
                f"{', '.join(have[3:]) or 'none (no dataset of this plan has a selection)'}"
            )
        rows = con.execute(
            f"SELECT d.step, sum(m.{_quote(column)})::DOUBLE AS total, count(m.{_quote(column)}) AS n, "
            f"count(*) AS docs FROM ({document_steps_sql(layout)}) d JOIN samples s USING (position) "
            "LEFT JOIN metadata m ON m.shard_id = s.shard_id AND m.row = s.row GROUP BY d.step"
        ).fetchnumpy()
    except duckdb.Error as exc:
        raise ConfigError(
            f"--by-column {column!r} must be a numeric column, got {one_line(exc)} — pick another"
        ) from exc
    finally:
        con.close()
    step = np.asarray(rows["step"], np.int64)
    total = np.zeros(steps + 1)
    count = np.zeros(steps + 1, np.int64)
    np.add.at(total, step, np.nan_to_num(np.asarray(rows["total"], float)))
    np.add.at(count, step, np.asarray(rows["n"], np.int64))
    firsts = np.arange(0, steps, window)
    sums = np.add.reduceat(total[:steps], firsts) if steps else np.zeros(0)
    counts = np.add.reduceat(count[:steps], firsts) if steps else np.zeros(0, np.int64)
    docs = int(np.asarray(rows["docs"]).sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    n = int(count.sum())
    return ColumnWindows(
        column=column,
        window=window,
        mean=float(total.sum() / n) if n else float("nan"),
        documents=docs,
        nulls=docs - n,
        first_step=firsts,
        means=means,
        counts=counts,
    )
