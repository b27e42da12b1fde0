"""``pack.lanes.pop_rows``: a microbatch's rows cut from several lanes at once are the rows each lane gives alone."""

from __future__ import annotations

import numpy as np

from zephon.executor.pack.lanes import Lane, cut_block, pop_rows

A, B, C, E = 1, 2, 3, 0


def _lane(start: tuple[int, int] = (0, 0)) -> Lane:
    """The module docstring's lane: width 4, documents 3: [a a a E], 9: [b E], 12: [c c E]."""
    lane = Lane(4, -1, start=start)
    lane.push_many(np.array([3, 9, 12]), np.array([A, A, A, E, B, E, C, C, E]), np.array([4, 2, 3]))
    return lane


def test_pop_rows_cuts_each_lanes_next_row_and_a_repeated_lane_gives_its_following_rows() -> None:
    one, two = _lane(), _lane(start=(9, 1))  # two resumes inside document 9, after its first token
    rows = pop_rows([one, two, one, one])
    assert rows.tokens.tolist() == [[A, A, A, E], [E, C, C, E], [B, E, C, C], [E, -1, -1, -1]]
    assert rows.lengths.tolist() == [4, 4, 4, 1]
    assert rows.doc_start.tolist() == [
        [True, False, False, False],
        [False, True, False, False],
        [True, False, True, False],
        [False, False, False, False],
    ]
    assert rows.pieces is not None
    assert rows.pieces[["row", "offset", "position", "doc_start", "length"]].tolist() == [
        (0, 0, 3, 0, 4),
        (1, 0, 9, 1, 1),
        (1, 1, 12, 0, 3),
        (2, 0, 9, 0, 2),
        (2, 2, 12, 0, 2),
        (3, 0, 12, 2, 1),
    ]
    assert one.buffered == two.buffered == 0
    empty = pop_rows([two])  # nothing left: one empty row, no pieces
    assert empty.lengths.tolist() == [0] and empty.tokens.tolist() == [[-1] * 4] and len(empty.pieces) == 0


def test_fill_runs_while_the_first_row_not_full_lacks_tokens() -> None:
    lane, seen = Lane(4, -1), []

    def fill() -> bool:  # what DealLanes does: deal the next chunk
        seen.append(lane.buffered)
        lane.push_many(np.array([len(seen)]), np.array([7, 7, 7, 7, 7, 7]), np.array([6]))
        return True

    rows = pop_rows([lane, lane, lane], fill)  # 12 tokens needed: two chunks of 6, filled before any row is cut
    assert seen == [0, 6] and rows.tokens.tolist() == [[7] * 4] * 3 and lane.buffered == 0


def test_an_error_filling_is_returned_with_the_row_that_needed_it_and_the_rows_are_cut_from_what_was_buffered() -> None:
    one, two = _lane(), Lane(4, -1)
    calls = []

    def fill() -> bool:
        calls.append(1)
        raise ValueError("bad shard")

    block = cut_block([one, two], np.array([0, 0, 1, 0]), fill, marks=[1, 3])
    assert block.failed is not None and block.failed[0] == 2 and str(block.failed[1]) == "bad shard"
    assert len(calls) == 1  # row 2 (lane two, empty) needed it; nothing was read after the error
    assert block.rows.lengths.tolist() == [4, 4, 0, 1]
    # the counters once 1 and 3 rows are cut: lane one's next at 4, then 8 (its third row is not cut yet)
    assert [snapshot[0] for snapshot in block.snapshots] == [[4, 0], [8, 0]]
