"""Packing lanes of an estimated plan, packed at train time, resumable from a two-number cursor.

Each lane holds the documents dealt to it (plan column ``lane``) in plan order and cuts their token stream
into rows of ``max_length`` (wrap packing, as ``zephon.executor.pack``). A lane's cursor is
``(position, skip)``: the plan position of the first document not fully emitted and how many of its tokens
were emitted. Everything a lane will produce follows from its cursor alone, so resuming re-reads only the
documents after it — never from the start of the plan.

Example, max_length 4, lane documents at positions 3: [a a a E], 9: [b E], 12: [c c E]: rows [a a a E],
[b E c c], then [E] (padded at the end of the plan). After the first row the cursor is (9, 0); after the
second, (12, 2).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from zephon.executor.pack import PackedRows, make_pieces


class Lane:
    """One lane's buffered documents and its cursor."""

    def __init__(self, max_length: int, pad_id: int, start: tuple[int, int] = (0, 0)) -> None:
        self.max_length = max_length
        self.pad_id = pad_id
        self.docs: deque[tuple[int, np.ndarray]] = deque()
        self.head_offset = 0  # tokens of the head document already emitted
        self.buffered = 0  # tokens buffered and not emitted
        self.start_position, self.start_skip = start
        self.read_to = self.start_position  # every plan position before this has been routed

    def push(self, position: int, tokens: np.ndarray) -> None:
        """Add the lane's document at ``position`` (documents before the lane's start are ignored)."""
        if position < self.start_position:
            return
        if not self.docs:
            self.head_offset = self.start_skip if position == self.start_position else 0
            self.buffered = len(tokens) - self.head_offset
        else:
            self.buffered += len(tokens)
        self.docs.append((position, tokens))

    def ready(self) -> bool:
        return self.buffered >= self.max_length

    def cursor(self) -> tuple[int, int]:
        """``(position, skip)`` from which this lane's remaining rows are rebuilt."""
        if self.docs:
            return self.docs[0][0], self.head_offset
        return self.read_to, 0

    def pop_row(self) -> PackedRows:
        """The next row: full when enough is buffered, else what is left, padded (length 0 when empty)."""
        width = self.max_length
        tokens = np.full((1, width), self.pad_id, dtype=np.int64)
        starts = np.zeros((1, width), dtype=bool)
        filled = 0
        pieces = []
        while filled < width and self.docs:
            position, doc = self.docs[0]
            take = min(width - filled, len(doc) - self.head_offset)
            pieces.append((0, filled, position, self.head_offset, take))
            tokens[0, filled : filled + take] = doc[self.head_offset : self.head_offset + take]
            starts[0, filled] = self.head_offset == 0
            filled += take
            self.buffered -= take
            self.head_offset += take
            if self.head_offset == len(doc):
                self.docs.popleft()
                self.head_offset = 0
        return PackedRows(
            tokens=tokens, doc_start=starts, lengths=np.array([filled], dtype=np.int64), pieces=make_pieces(pieces)
        )
