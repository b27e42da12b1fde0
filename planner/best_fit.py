"""Best-fit packing planned offline: whole documents into rows of ``max_length`` tokens, little padding.

Documents are taken in plan order. Each goes into the open row with the least free space that still holds
it (best fit); if none does, a new row is opened. At most ``max_open`` rows are open at once: opening one
more closes the row opened earliest, so a document never lands more than ``max_open`` rows away from where
plan order would put it, and curriculum order survives. Rows are numbered in the order they were opened.

A document longer than ``max_length`` is, with ``oversize="split"``, cut into full rows of ``max_length``
tokens plus a remainder that is packed like any document; with ``oversize="drop"`` it is left out. Both are
counted in the report.

Invariant: every kept token is in exactly one row; rows hold ≤ ``max_length`` tokens, filled from offset 0
with no gaps, padding only at the end.

Worked example, max_length 10, documents (position: tokens) 0:6, 1:5, 2:4, 3:3, 4:12:
0 opens row 0 (free 4); 1 does not fit → row 1 (free 5); 2 → row 1 has free 5, row 0 has free 4: best fit
is row 0 (free 0, closed); 3 → row 1 (free 2); 4 is split: tokens 0–9 fill row 2 alone, the remaining 2
go to row 1 (free 0). Rows: [0:6 2:4] [1:5 3:3 4:2] [4:10] — no padding at all.

With ``keep_empty`` (samples packed by cost, ``Pipeline.pack_samples``) a document of 0 tokens is placed like any
other — into the open row with the least free space, or a new row when none is open — so no sample is lost;
without it (token rows) it is skipped, as it holds no token.

``closes`` (samples packed by cost with phases or a continuation) closes rows at given positions: before the
document at ``position`` is placed, every open row numbered below ``rows_below`` (every open row, when None) is
closed, so no later document joins it. A phase boundary closes every row (a row never holds two phases'
samples); a continuation's seam closes the rows it keeps from its parent (``zephon.planner.continuation``).
Example, max_length 10, documents 0:6, 1:3, 2:1 with a close at position 1: 0 opens row 0; the close shuts it;
1 opens row 1 (free 7); 2 → row 1. Rows: [0:6] [1:3 2:1] (without the close: [0:6 1:3 2:1]).

``first_fit`` (the earliest-opened row that fits) is kept for comparison in reports and benchmarks.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, kw_only=True, slots=True)
class Bins:
    """Pieces sorted by (sequence, offset): row ``sequence`` holds ``length`` tokens of the document at plan
    position ``position``, starting at its token ``doc_start``, placed at ``offset`` in the row."""

    sequence: np.ndarray
    offset: np.ndarray
    position: np.ndarray
    doc_start: np.ndarray
    length: np.ndarray
    sequences: int
    padding_tokens: int
    split_documents: int
    dropped_documents: int
    dropped_tokens: int
    #: The ``closes`` the rows were planned with: ``(position, rows_below)``, ``rows_below`` None for every row.
    closes: tuple[tuple[int, int | None], ...] = ()


def pack(
    tokens: np.ndarray,
    max_length: int,
    *,
    oversize: str = "split",
    max_open: int = 64,
    first_fit: bool = False,
    keep_empty: bool = False,
    closes: Sequence[tuple[int, int | None]] = (),
) -> Bins:
    """Plan rows for documents of ``tokens[p]`` tokens at plan positions ``p``; ``closes``: ``(position,
    rows_below)`` pairs in increasing position (module docstring)."""
    out_seq: list[int] = []
    out_off: list[int] = []
    out_pos: list[int] = []
    out_start: list[int] = []
    out_len: list[int] = []
    fill: list[int] = []  # tokens used per row
    open_free: list[tuple[int, int]] = []  # (free, row) sorted, for best fit
    open_order: list[int] = []  # open rows by opening order
    split = dropped = dropped_tokens = 0

    def place(row: int, position: int, start: int, length: int) -> None:
        out_seq.append(row)
        out_off.append(fill[row])
        out_pos.append(position)
        out_start.append(start)
        out_len.append(length)
        fill[row] += length

    def close(row: int) -> None:
        open_order.remove(row)
        open_free.remove((max_length - fill[row], row))

    pending = sorted(closes, key=lambda c: c[0])
    next_close = 0
    for position, n in enumerate(tokens.tolist()):
        while next_close < len(pending) and pending[next_close][0] <= position:
            below = pending[next_close][1]
            for row in [r for r in open_order if below is None or r < below]:
                close(row)
            next_close += 1
        start = 0
        if n > max_length:
            if oversize == "drop":
                dropped += 1
                dropped_tokens += n
                continue
            split += 1
            while n - start > max_length:
                fill.append(0)
                place(len(fill) - 1, position, start, max_length)
                start += max_length
        length = n - start
        if length == 0 and not keep_empty:
            continue
        if first_fit:
            row = next((r for r in open_order if max_length - fill[r] >= length), -1)
        else:
            i = bisect.bisect_left(open_free, (length, -1))
            row = open_free[i][1] if i < len(open_free) else -1
        if row < 0:
            if len(open_order) >= max_open:
                close(open_order[0])
            fill.append(0)
            row = len(fill) - 1
            open_order.append(row)
        else:
            open_free.remove((max_length - fill[row], row))
        place(row, position, start, length)
        free = max_length - fill[row]
        if free == 0:
            open_order.remove(row)
        else:
            bisect.insort(open_free, (free, row))
    order = np.lexsort((np.array(out_off, dtype=np.int64), np.array(out_seq, dtype=np.int64)))
    fills = np.array(fill, dtype=np.int64)
    bins = Bins(
        sequence=np.array(out_seq, dtype=np.int64)[order],
        offset=np.array(out_off, dtype=np.int32)[order],
        position=np.array(out_pos, dtype=np.int64)[order],
        doc_start=np.array(out_start, dtype=np.int32)[order],
        length=np.array(out_len, dtype=np.int32)[order],
        sequences=len(fill),
        padding_tokens=int((max_length - fills).sum()),
        split_documents=split,
        dropped_documents=dropped,
        dropped_tokens=dropped_tokens,
        closes=tuple((int(p), None if b is None else int(b)) for p, b in pending),
    )
    return bins


def padding_fraction(bins: Bins, max_length: int) -> float:
    """Padding tokens over all row tokens."""
    return bins.padding_tokens / (bins.sequences * max_length) if bins.sequences else 0.0
