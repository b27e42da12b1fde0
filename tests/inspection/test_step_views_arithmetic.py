"""The SQL views of steps and sequences (zephon.inspection.views, evaluated by DuckDB) equal
zephon.executor.step_arithmetic's Python functions (on numpy) on the same plans: exact and estimated wrap plans of
thousands of steps, several global batch sizes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from support.synthetic_plans import write_synthetic_plan

from zephon.executor.step_arithmetic import (
    document_steps,
    sequences_in,
    step_of_token,
    step_sequences,
    step_tokens,
    steps_in,
    tokens_inside,
)
from zephon.inspection.show import show_step
from zephon.inspection.steps import StepSeeker, resolve_layout
from zephon.inspection.views import connect_with_steps, document_steps_sql
from zephon.plan.bundle import open_bundle

DOCUMENTS = 3000
WIDTH = 64  # max_length: ~3,500 sequences


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("step_views")
    position = np.arange(DOCUMENTS)
    with_empty = (1 + (position * 7919) % 150) * (position % 11 != 5)  # every 11th document has no tokens
    return {
        "exact": write_synthetic_plan(root / "exact", DOCUMENTS, max_length=WIDTH),
        "exact_with_empty": write_synthetic_plan(
            root / "empty", DOCUMENTS, max_length=WIDTH, tokens=with_empty.tolist()
        ),
        "estimated": write_synthetic_plan(root / "estimated", DOCUMENTS, kind="estimated"),
    }


def _python_rows(plan: Path, global_batch: int) -> list[tuple[int, int, int]]:
    """(step, position, tokens in step) of every document with tokens, by the Python functions."""
    tokens = pq.read_table(plan / "samples.parquet", columns=["tokens"]).column(0).to_numpy().astype(np.int64)
    offsets = np.concatenate(([0], np.cumsum(tokens)[:-1]))  # exact plans record these; estimated ones sum them
    position = np.flatnonzero(tokens > 0)
    o, t = offsets[position], tokens[position]
    first, last = document_steps(o, t, global_batch, WIDTH)
    count = last - first + 1
    row = np.repeat(np.arange(len(position)), count)
    step = first[row] + np.arange(len(row)) - np.repeat(np.cumsum(count) - count, count)
    inside = tokens_inside(o[row], t[row], *step_tokens(step, global_batch, WIDTH))
    return sorted(zip(step.tolist(), position[row].tolist(), inside.tolist(), strict=True))


@pytest.mark.parametrize("kind", ["exact", "exact_with_empty", "estimated"])
@pytest.mark.parametrize("global_batch", [1, 3, 8, 64])
def test_the_steps_view_equals_the_python_arithmetic(plans, kind, global_batch) -> None:
    plan = plans[kind]
    max_length = WIDTH if kind == "estimated" else None
    expected = _python_rows(plan, global_batch)
    con = connect_with_steps(plan, global_batch, max_length=max_length)
    try:
        got = con.execute("SELECT step, position, tokens_in_step FROM steps ORDER BY ALL").fetchall()
        assert got == expected
        if global_batch == 1:  # a sequence is a step of one sequence
            sequences = con.execute("SELECT sequence, position, tokens_in_sequence FROM sequences ORDER BY ALL")
            assert sequences.fetchall() == expected
        layout = resolve_layout(open_bundle(plan).manifest, batch_size=global_batch, max_length=max_length)
        total = int(pq.read_table(plan / "samples.parquet", columns=["tokens"]).column(0).to_numpy().sum())
        assert layout.sequences == sequences_in(total, WIDTH)
        assert layout.steps == steps_in(layout.sequences, global_batch) == expected[-1][0] + 1
        assert layout.steps > 50  # many steps: the last, partial one included
        # The step of each document's first token, and the seeking macro on a spread of steps.
        first_steps = con.execute(f"SELECT position, step FROM ({document_steps_sql(layout)}) ORDER BY position")
        tokens = pq.read_table(plan / "samples.parquet", columns=["tokens"]).column(0).to_numpy().astype(np.int64)
        offsets = np.concatenate(([0], np.cumsum(tokens)[:-1]))
        kept = np.flatnonzero(tokens > 0)
        assert first_steps.fetchall() == list(
            zip(kept.tolist(), step_of_token(offsets[kept], global_batch, WIDTH).tolist(), strict=True)
        )
        by_step: dict[int, list[tuple[int, int]]] = {}
        for step, position, inside in expected:
            by_step.setdefault(step, []).append((position, inside))
        seeker = StepSeeker(open_bundle(plan), layout)
        for n in np.linspace(0, layout.steps - 1, 9).astype(int).tolist():
            rows = con.execute(f"SELECT position, tokens_in_step FROM step_documents({n})").fetchall()
            assert rows == by_step[n]
            first, end = step_sequences(n, global_batch)
            documents = seeker.documents(first, min(end, layout.sequences))
            assert documents.tokens_in_range is not None
            assert list(zip(documents.position.tolist(), documents.tokens_in_range.tolist(), strict=True)) == rows
    finally:
        con.close()


def test_show_lists_the_documents_of_the_python_step(plans) -> None:
    plan = plans["exact"]
    expected = [(p, inside) for step, p, inside in _python_rows(plan, 8) if step == 17]
    view = show_step(plan, 17, batch_size=8, text=False)
    assert [(r.position, r.tokens_in_step) for r in view.rows] == expected
