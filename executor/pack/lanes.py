"""Packing lanes of an estimated plan, packed at train time, resumable from a two-number cursor.

Each lane holds the documents dealt to it (plan column ``lane``) in plan order and cuts their token stream
into rows of ``max_length`` (wrap packing, as ``zephon.executor.pack.rows``). A lane's cursor is
``(position, skip)``: the plan position of the first document not fully emitted and how many of its tokens
were emitted. Everything a lane will produce follows from its cursor alone, so resuming re-reads only the
documents after it — never from the start of the plan.

Example, max_length 4, lane documents at positions 3: [a a a E], 9: [b E], 12: [c c E]: rows [a a a E],
[b E c c], then [E] (padded at the end of the plan). After the first row the cursor is (9, 0); after the
second, (12, 2).

The lane's tokens live in one growing array, in stream coordinates (token ``t`` of the lane's stream since
the start of this run); documents are recorded by their first stream token. A row is one slice of the array,
and its pieces come from one binary search over the document starts. ``pop_rows`` cuts the next row of
several lanes (a microbatch's) into one buffer: per row a binary search, two list slices and one slice copy;
the pieces, document starts and lengths of all rows in a fixed number of numpy calls — whether the rows hold
one document or hundreds of short ones.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

import numpy as np

from zephon.executor.encode.flags import ID, filled
from zephon.executor.pack.rows import PIECE_DTYPE, PackedRows


class Lane:
    """One lane's buffered documents and its cursor."""

    def __init__(self, max_length: int, pad_id: int, start: tuple[int, int] = (0, 0), *, dtype: np.dtype = ID) -> None:
        self.max_length = max_length
        self.pad_id = pad_id
        self.dtype = np.dtype(dtype)  # the encoder's tokens (``zephon.executor.encode.flags``): ids, or ids + flags
        self.start_position, self.start_skip = start
        self.read_to = self.start_position  # every plan position before this has been routed
        self._buf = np.empty(4 * max_length, dtype=self.dtype)
        self._base = 0  # stream index of _buf[0]
        self._end = 0  # stream index after the last buffered token
        self._next = 0  # stream index of the next token to emit
        self._starts: list[int] = []  # stream index of each buffered document's first token, in order
        self._positions: list[int] = []  # its plan position
        self._head = 0  # index (in the two lists) of the document holding token _next

    @property
    def buffered(self) -> int:
        """Tokens buffered and not emitted."""
        return self._end - self._next

    def push(self, position: int, tokens: np.ndarray) -> None:
        """Add the lane's document at ``position`` (documents before the lane's start are ignored)."""
        if position < self.start_position:
            return
        n = len(tokens)
        self._copy_in(tokens)
        self._starts.append(self._end)
        self._positions.append(position)
        self._end += n
        if position == self.start_position and self.start_skip:  # resume inside the cursor's document
            self._next += min(self.start_skip, n)
            self._skip_done()

    def push_many(self, positions: np.ndarray, tokens: np.ndarray, sizes: np.ndarray) -> None:
        """``push`` for several documents at once (positions increasing): ``tokens`` holds their ids one after
        the other, ``sizes[i]`` of them for the document at ``positions[i]``. One copy, no Python per document."""
        if len(positions) and positions[0] < self.start_position:  # before the lane's start: ignored
            k = int(np.searchsorted(positions, self.start_position))
            tokens, positions, sizes = tokens[int(sizes[:k].sum()) :], positions[k:], sizes[k:]
        if not len(positions):
            return
        n = len(tokens)
        self._copy_in(tokens)
        first = len(self._starts)
        self._starts.extend((np.cumsum(sizes) - sizes + self._end).tolist())
        self._positions.extend(positions.tolist())
        self._end += n
        if self.start_skip and self._positions[first] == self.start_position:  # resume inside that document
            self._next += min(self.start_skip, int(sizes[0]))
            self._skip_done()

    def _copy_in(self, tokens: np.ndarray) -> None:
        """Copy ``tokens`` to the buffer after the last pushed token (``_end``), making room first."""
        n = len(tokens)
        if self._end + n - self._base > len(self._buf):
            self._make_room(n)
        at = self._end - self._base
        self._buf[at : at + n] = tokens

    def _make_room(self, n: int) -> None:
        """Drop emitted tokens from the front of the array, growing it if that is not enough."""
        keep = self._buf[self._next - self._base : self._end - self._base]
        size = len(self._buf)
        while len(keep) + n > size:
            size *= 2
        buf = self._buf if size == len(self._buf) else np.empty(size, dtype=self.dtype)
        buf[: len(keep)] = keep.copy() if buf is self._buf else keep
        self._buf, self._base = buf, self._next
        if self._head > 4096:  # forget finished documents now and then (amortized O(1) per document)
            del self._starts[: self._head], self._positions[: self._head]
            self._head = 0

    def _skip_done(self) -> None:
        """Move the head past documents whose tokens are all emitted."""
        starts, head = self._starts, self._head
        if head < len(starts) and (head + 1 == len(starts) or starts[head + 1] <= self._next):
            head = bisect.bisect_right(starts, self._next, lo=head) - 1
            if self._next >= self._end:
                head = len(starts)
        self._head = head

    def ready(self) -> bool:
        return self._end - self._next >= self.max_length

    def cursor(self) -> tuple[int, int]:
        """``(position, skip)`` from which this lane's remaining rows are rebuilt (before anything is routed to a
        resumed lane: the cursor it was started from, its skip included)."""
        if not self._starts and self.read_to == self.start_position:
            return self.start_position, self.start_skip
        if self._head < len(self._starts):
            return self._positions[self._head], self._next - self._starts[self._head]
        return self.read_to, 0

    def pop_row(self) -> PackedRows:
        """The next row: full when enough is buffered, else what is left, padded (length 0 when empty)."""
        return pop_rows([self])

    def _cut(self) -> tuple[int, int, list[int], list[int]]:
        """Move past the next row: its stream span ``[lo, hi)``, the first stream token of each document meeting
        it followed by the end of the last one, and their plan positions."""
        take = min(self.max_length, self._end - self._next)
        lo, hi, head = self._next, self._next + take, self._head
        last = bisect.bisect_left(self._starts, hi, lo=head)  # documents [head, last) meet [lo, hi)
        starts = self._starts[head : last + 1]
        if len(starts) == last - head:  # the last document ends at the end of the buffer
            starts.append(self._end)
        positions = self._positions[head:last]
        self._next = hi
        self._head = last - 1 if last > head else head
        self._skip_done()
        return lo, hi, starts, positions


def pop_rows(lanes: list[Lane], prepare: Callable[[Lane], None] | None = None) -> PackedRows:
    """The next row of each lane in ``lanes`` (in order; a lane may come more than once: its next rows), as one
    ``PackedRows``: one slice copy a row into one buffer, and the pieces of all rows in a fixed number of numpy
    calls (the per-row Python is a binary search and two list slices). ``prepare(lane)`` runs just before each
    row is cut (``DealLanes`` buffers enough of the lane there). Lanes of one run: same ``max_length``, pad."""
    n, width, pad_id = len(lanes), lanes[0].max_length, lanes[0].pad_id
    tokens = filled((n, width), pad_id, lanes[0].dtype)
    lo, hi = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    starts: list[int] = []  # per row: its documents' first stream tokens, then the end of the last
    positions: list[int] = []
    counts: list[int] = []
    for i, lane in enumerate(lanes):
        if prepare is not None:
            prepare(lane)
        a, b, row_starts, row_positions = lane._cut()
        lo[i], hi[i] = a, b
        if b > a:
            tokens[i, : b - a] = lane._buf[a - lane._base : b - lane._base]
        starts += row_starts
        positions += row_positions
        counts.append(len(row_positions))
    row = np.repeat(np.arange(n, dtype=np.int64), counts)
    at = np.arange(len(row), dtype=np.int64) + row  # piece k of row r: its document's start is starts[k + r]
    first = np.array(starts, dtype=np.int64)
    begin, end = np.maximum(first[at], lo[row]), np.minimum(first[at + 1], hi[row])
    pieces = np.empty(len(row), dtype=PIECE_DTYPE)
    pieces["row"] = row
    pieces["offset"] = begin - lo[row]
    pieces["position"] = positions
    pieces["doc_start"] = begin - first[at]
    pieces["length"] = end - begin
    doc_start = np.zeros((n, width), dtype=bool)
    marked = (hi > lo)[row]  # an empty row (the end of the plan) marks nothing
    doc_start.reshape(-1)[(row * width + pieces["offset"])[marked]] = (pieces["doc_start"] == 0)[marked]
    return PackedRows(tokens=tokens, doc_start=doc_start, lengths=hi - lo, pieces=pieces)
