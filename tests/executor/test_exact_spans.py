"""The span copies of an exact run (``zephon.executor.pack.spans``) give exactly what the gathers by index give."""

from __future__ import annotations

import numpy as np

from zephon.executor.pack.spans import fill_rows, merge_tail, spread


def test_merge_tail_appends_after_the_kept_documents_in_place_then_grows() -> None:
    tokens = np.full(16, -1, dtype=np.int64)
    tokens[:5] = [10, 11, 12, 20, 21]  # documents at positions 5 (3 ids) and 6 (2 ids)
    cached, base, size = np.array([5, 6]), np.array([0, 3]), np.array([3, 2])
    out, starts = merge_tail(np.array([0, 1]), base, size, tokens, cached, np.array([7]), np.array([30, 31, 32, 33]),
                             np.array([4]))  # fmt: skip
    assert out is tokens and starts.tolist() == [0, 3, 5] and out[:9].tolist() == [10, 11, 12, 20, 21, 30, 31, 32, 33]
    # position 5 dropped, two documents of 5 ids each: no room left → the kept tail moves to the front of a new array
    cached, base, size = np.array([5, 6, 7]), starts, np.array([3, 2, 4])
    new = np.arange(100, 110)
    out, starts = merge_tail(np.array([1, 2]), base, size, out, cached, np.array([8, 9]), new, np.array([5, 5]))
    assert out is not tokens and starts.tolist() == [0, 2, 6, 11]
    assert out[:16].tolist() == [20, 21, 30, 31, 32, 33, *range(100, 110)]


def test_merge_tail_declines_when_new_documents_come_before_kept_ones() -> None:
    tokens = np.arange(5, dtype=np.int64)
    cached, base, size = np.array([5, 8]), np.array([0, 3]), np.array([3, 2])
    assert merge_tail(np.array([0, 1]), base, size, tokens, cached, np.array([6]), np.array([1]), np.array([1])) is None
    assert merge_tail(np.array([0]), base, size, tokens, cached[:1], np.array([9]), np.array([1]), np.array([1]))


def gathered(n: int, width: int, source, rows, offsets, src, lengths) -> np.ndarray:
    out = np.full(n * width, -1, dtype=np.int64)
    out[spread(rows * width + offsets, lengths)] = source[spread(src, lengths)]
    return out.reshape(n, width)


def test_fill_rows_copies_contiguous_rows_as_the_gather_does_and_declines_otherwise() -> None:
    source = np.arange(100, 140, dtype=np.int64)
    # wrap: row 0 = source 3..7 (two pieces), row 1 = source 7..11 (two pieces)
    rows, offsets = np.array([0, 0, 1, 1]), np.array([0, 2, 0, 3])
    src, lengths = np.array([3, 5, 7, 10]), np.array([2, 3, 3, 1])
    out = np.full((2, 5), -1, dtype=np.int64)
    assert fill_rows(out, source, rows, offsets, src, lengths)
    assert out.tolist() == gathered(2, 5, source, rows, offsets, src, lengths).tolist()
    assert out[1].tolist() == [107, 108, 109, 110, -1]
    # pieces not contiguous in the source (best fit), or a gap in a row: the caller gathers
    assert not fill_rows(out, source, rows, offsets, np.array([3, 20, 7, 10]), lengths)
    assert not fill_rows(out, source, np.array([0, 0]), np.array([0, 3]), np.array([3, 6]), np.array([2, 1]))
