"""zephon.executor.step_arithmetic: the worked example of its docstring, its invariant over many values, and the
same formulas on ints, numpy arrays and SQL expressions."""

from __future__ import annotations

import numpy as np
import pytest

from zephon.executor.step_arithmetic import (
    Sql,
    document_steps,
    first_position,
    lane_of,
    lane_row,
    sequence_tokens,
    sequences_in,
    step_of,
    step_of_token,
    step_sequences,
    step_tokens,
    steps_in,
    tokens_inside,
    tokens_per_step,
)


def test_the_worked_example_of_the_docstring() -> None:
    # G = 2, W = 4; documents of 3, 6 and 2 tokens at offsets 0, 3, 9.
    assert sequences_in(11, 4) == 3
    assert steps_in(3, 2) == 2 and steps_in(3, 2, drop_last=True) == 1
    assert tokens_per_step(2, 4) == 8
    assert step_sequences(1, 2) == (2, 4)
    assert step_tokens(1, 2, 4) == (8, 16)
    assert sequence_tokens(1, 3, 4) == (4, 12)
    assert step_of(3, 2) == 1 and step_of_token(9, 2, 4) == 1
    assert document_steps(3, 6, 2, 4) == (0, 1)
    assert tokens_inside(3, 6, 0, 8) == 5 and tokens_inside(3, 6, 8, 16) == 1
    assert first_position(np.array([0, 3, 9]), 1, 2, 4) == 2
    assert (lane_row(3, 2), lane_of(3, 2)) == (1, 1)


def test_counts_round_up_or_keep_the_full_steps() -> None:
    assert [sequences_in(m, 4) for m in (0, 1, 4, 5, 8)] == [0, 1, 1, 2, 2]
    assert [steps_in(n, 3) for n in (0, 1, 3, 4)] == [0, 1, 1, 2]
    assert [steps_in(n, 3, drop_last=True) for n in (0, 2, 3, 5, 6)] == [0, 0, 1, 1, 2]


@pytest.mark.parametrize(("global_batch", "max_length"), [(1, 1), (1, 7), (3, 5), (8, 33), (64, 257)])
def test_every_sequence_token_and_document_falls_in_the_step_that_holds_it(global_batch, max_length) -> None:
    rng = np.random.default_rng((global_batch, max_length))
    j = rng.integers(0, 10**6, 2000)
    first, end = step_sequences(step_of(j, global_batch), global_batch)
    assert ((first <= j) & (j < end)).all() and (end - first == global_batch).all()
    o = rng.integers(0, 10**7, 2000)
    start, stop = step_tokens(step_of_token(o, global_batch, max_length), global_batch, max_length)
    assert ((start <= o) & (o < stop)).all() and (stop - start == tokens_per_step(global_batch, max_length)).all()
    t = rng.integers(1, 3 * global_batch * max_length, 2000)
    lo, hi = document_steps(o, t, global_batch, max_length)
    for offset, tokens, a, b in zip(o.tolist(), t.tolist(), lo.tolist(), hi.tolist(), strict=True):
        steps = np.arange(a - 1, b + 2)
        inside = tokens_inside(offset, tokens, *step_tokens(steps, global_batch, max_length))
        assert (inside[1:-1] > 0).all() and inside[0] <= 0 and inside[-1] <= 0  # exactly steps a..b
        assert int(inside[1:-1].sum()) == tokens


def test_a_step_is_its_sequences_tokens() -> None:
    for step in range(5):
        assert step_tokens(step, 3, 7) == sequence_tokens(*step_sequences(step, 3), 7)


def test_first_position_is_the_first_document_no_earlier_step_touches() -> None:
    offsets = np.array([0, 3, 8, 10, 16, 16, 30])  # a document of 0 tokens at 16
    assert [first_position(offsets, s, 2, 4) for s in range(6)] == [0, 2, 4, 6, 7, 7]


def test_lanes_deal_sequences_round_robin() -> None:
    j = np.arange(24)
    assert (lane_row(j, 4) * 4 + lane_of(j, 4) == j).all()
    assert lane_of(j, 4)[:6].tolist() == [0, 1, 2, 3, 0, 1] and lane_row(j, 4)[:6].tolist() == [0, 0, 0, 0, 1, 1]


def test_ints_and_arrays_agree_elementwise() -> None:
    o, t = np.array([0, 3, 9, 40]), np.array([3, 6, 2, 1])
    lo, hi = document_steps(o, t, 2, 4)
    assert lo.tolist() == [document_steps(a, b, 2, 4)[0] for a, b in zip(o.tolist(), t.tolist(), strict=True)]
    assert hi.tolist() == [document_steps(a, b, 2, 4)[1] for a, b in zip(o.tolist(), t.tolist(), strict=True)]
    inside = tokens_inside(o, t, 0, 8)
    assert inside.tolist() == [tokens_inside(a, b, 0, 8) for a, b in zip(o.tolist(), t.tolist(), strict=True)]


def test_sql_operands_give_the_sql_of_the_same_formula() -> None:
    offset, tokens = Sql("token_offset"), Sql("tokens")
    assert str(Sql("token_offset") // 8 + 1) == "((token_offset // 8) + 1)"
    assert str(2 * Sql("n") - 1) == "((2 * n) - 1)"
    assert [str(s) for s in document_steps(offset, tokens, 2, 4)] == [
        "(token_offset // 8)",
        "(((token_offset + tokens) - 1) // 8)",
    ]
    assert str(tokens_inside(offset, tokens, *step_tokens(Sql("step"), 2, 4))) == (
        "(least((token_offset + tokens), ((step + 1) * 8)) - greatest(token_offset, (step * 8)))"
    )
    assert f"{step_sequences(Sql('k'), 3)[1]}" == "((k + 1) * 3)"
