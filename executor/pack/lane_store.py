"""The token array a worker's lanes share, and the table of their documents sorted by (lane, stream start).

Every lane of a DataLoader worker (or of a rank without workers) appends the ids of the documents dealt to it
to one array, ``tokens``: a chunk's documents arrive grouped by lane, so a chunk is appended as one slice per
lane, one after the other — each id is copied in once. A document is one row of the table: its key
``slot << 40 | start`` (the lane's slot in the store, the stream index of its first token in that lane), where
its first id lies in ``tokens`` (``at``), its size and its plan position. New rows are sorted into the table once
per chunk (a stable sort of two sorted runs), so a row cut from ``[lo, hi)`` of lane ``s``'s stream meets the
documents ``searchsorted(key, s<<40|lo, "right") - 1`` up to ``searchsorted(key, s<<40|hi, "left")`` — one
``searchsorted`` for all rows of a microbatch (``zephon.executor.pack.lanes.pop_rows``).

When ``tokens`` is full, the documents still live — their tokens from each lane's ``kept`` stream index on —
are compacted to the front, in table order (so each lane's live tokens become one slice), and the array grows
to at least twice what is live plus what is appended: each id is copied O(1) times however long it stays.

Invariant: token ``t`` of document ``d`` (``start[d] <= t < start[d] + size[d]``), for ``t`` at or past its lane's
``kept``, is ``tokens[at[d] + t - start[d]]``; documents of one lane are in plan order and their stream spans
follow each other, so a lane's documents sorted by start are also sorted by position (key ``slot << 40 |
position`` searches the same table).

Example: lanes 0 and 1; a chunk deals lane 0 documents 4: [a a] and 6: [b], lane 1 document 5: [c c c] →
tokens [a a b c c c], table (0<<40|0, at 0, 2, pos 4), (0<<40|2, at 2, 1, pos 6), (1<<40|0, at 3, 3, pos 5).
A row [0, 3) of lane 0 meets documents 0 and 1, whose ids are tokens[0:2] and tokens[2:3]: one slice.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

__all__ = ["MASK", "SHIFT", "LaneStore"]

#: Bits of a key below the lane's slot: stream indices and plan positions stay below 2**40.
SHIFT = 40
MASK = (1 << SHIFT) - 1
_EMPTY = np.empty(0, dtype=np.int64)


class Lane(Protocol):
    """What the store reads of a lane (``zephon.executor.pack.lanes.Lane``): the first stream index it keeps."""

    _kept: int


class LaneStore:
    """One token array and one document table for the lanes registered with it (``add``)."""

    def __init__(self, dtype: np.dtype, room: int = 1 << 16) -> None:
        self.dtype = np.dtype(dtype)
        self.tokens = np.empty(room, dtype=self.dtype)
        self.used = 0  # ids written to tokens
        self.lanes: list[Lane] = []  # lane ``i`` has slot ``i``
        self.key, self.at, self.size, self.position = _EMPTY, _EMPTY, _EMPTY, _EMPTY
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.compactions = 0  # how often live documents were moved to the front (for tests and benchmarks)
        self.moved = 0  # ids those compactions copied

    def add(self, lane: Lane) -> int:
        """Register ``lane``; returns its slot."""
        self.lanes.append(lane)
        return len(self.lanes) - 1

    def append(
        self, slot: int, stream_start: int, positions: np.ndarray, tokens: np.ndarray, sizes: np.ndarray
    ) -> None:
        """Append documents of lane ``slot`` (positions increasing; ``sizes[i]`` ids of ``tokens`` each), the first
        at stream index ``stream_start`` of the lane: one copy."""
        n = len(tokens)
        if self.used + n > len(self.tokens):
            self._compact(n)
        self.tokens[self.used : self.used + n] = tokens
        sizes = np.asarray(sizes, dtype=np.int64)
        offsets = np.cumsum(sizes) - sizes
        key = (slot << SHIFT) + stream_start + offsets
        self._pending.append((key, self.used + offsets, sizes, np.asarray(positions, dtype=np.int64)))
        self.used += n

    def table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``key, at, size, position`` of every live document, sorted by key (documents appended since the last
        call are sorted in now: once per chunk, when the documents wholly emitted are forgotten, as ``_compact``
        forgets them — their tokens stay where they are until it runs. Kept, they made the table ~28,000 rows
        long on the tokens plan of ``bench_stages.py``, 260 µs a chunk to sort, against a few hundred live)."""
        if self._pending:
            parts = [(self.key, self.at, self.size, self.position), *self._pending]
            self._pending = []
            key, at, size, position = (np.concatenate([p[i] for p in parts]) for i in range(4))
            if self.lanes:
                live = self._live(key, size)
                if not live.all():
                    key, at, size, position = key[live], at[live], size[live], position[live]
            order = np.argsort(key, kind="stable")  # equal keys (empty documents): plan order kept
            self.key, self.at, self.size, self.position = key[order], at[order], size[order], position[order]
        return self.key, self.at, self.size, self.position

    def doc_at(self, slot: int, t: int) -> tuple[int, int]:
        """``(position, start)`` of the last document of lane ``slot`` starting at or before stream index ``t``."""
        key, _, _, position = self.table()
        d = int(np.searchsorted(key, (slot << SHIFT) + t, side="right")) - 1
        return int(position[d]), int(key[d]) & MASK

    def _floors(self, key: np.ndarray) -> np.ndarray:
        """Each document's lane's ``kept`` stream index."""
        return np.array([lane._kept for lane in self.lanes], dtype=np.int64)[key >> SHIFT]

    def _live(self, key: np.ndarray, size: np.ndarray) -> np.ndarray:
        """Which documents are not wholly emitted (empty documents at or past their lane's ``kept`` stay)."""
        start, floor = key & MASK, self._floors(key)
        return (start + size > floor) | (start >= floor)

    def _compact(self, n: int) -> None:
        """Move the live documents' tokens (from each lane's ``kept`` on) to the front of a new array with room
        for at least twice them and ``n`` more, in table order; forget documents wholly emitted."""
        key, at, size, position = self.table()
        live = self._live(key, size)
        key, at, size, position = key[live], at[live], size[live], position[live]
        start = key & MASK
        floor = self._floors(key)
        first = np.maximum(start, floor)  # first token still needed
        src, length = at + first - start, start + size - first
        total = int(length.sum())
        room = len(self.tokens)
        while 2 * (total + n) > room:
            room *= 2
        out = np.empty(room, dtype=self.dtype)
        dst = np.cumsum(length) - length
        # one slice per run of documents contiguous in the old array (a lane's documents of one chunk)
        breaks = np.flatnonzero(src[1:] != src[:-1] + length[:-1]) + 1
        firsts = np.r_[0, breaks] if len(src) else _EMPTY
        lasts = np.r_[breaks, len(src)] - 1 if len(src) else _EMPTY
        tokens = self.tokens
        froms, tos = src[firsts].tolist(), (src[lasts] + length[lasts]).tolist()
        for a, b, d in zip(froms, tos, dst[firsts].tolist(), strict=True):
            out[d : d + b - a] = tokens[a:b]
        self.tokens, self.used = out, total
        self.key, self.at, self.size, self.position = key, dst - (first - start), size, position
        self.compactions += 1
        self.moved += total
