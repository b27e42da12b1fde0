"""``pack.lanes.pop_rows``: a microbatch's rows cut from several lanes at once are the rows each lane gives alone."""

from __future__ import annotations

import numpy as np

from zephon.executor.pack.lanes import Lane, pop_rows

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


def test_pop_rows_runs_prepare_just_before_each_row() -> None:
    lane, seen = Lane(4, -1), []

    def prepare(target: Lane) -> None:  # what DealLanes does: buffer the lane's next documents
        seen.append(target.buffered)
        target.push_many(np.array([len(seen)]), np.array([7, 7, 7, 7]), np.array([4]))

    rows = pop_rows([lane, lane], prepare)
    assert seen == [0, 0] and rows.tokens.tolist() == [[7] * 4, [7] * 4]
