"""The token array a worker's lanes share, and the table of their documents sorted by (lane, stream start).

Every lane of a DataLoader worker (or of a rank without workers) appends the ids of the documents dealt to it
to one array, ``tokens``: a chunk's documents arrive grouped by lane, so a chunk is appended as one slice per
lane, one after the other — each id is copied in once. A document is one entry of the table: its key
``slot << 40 | start`` (the lane's slot in the store, the stream index of its first token in that lane), where
its first id lies in ``tokens`` (``at``), its size and its plan position. A row cut from ``[lo, hi)`` of lane
``s``'s stream meets the entries ``searchsorted(key, s<<40|lo, "right") - 1`` up to
``searchsorted(key, s<<40|hi, "left")`` — one ``searchsorted`` for all rows of a microbatch
(``zephon.executor.pack.lanes.cut_block``).

The table is laid out in *regions*, one per lane in slot order, each with room to spare: a lane's new documents
are written at the end of its region (one slice per array, no sort, nothing else moved), and the spare entries
after them hold the key ``slot << 40 | MASK`` (position ``MASK``), above any real key of the lane and below the
next lane's, so the whole table stays sorted by key — and by ``slot << 40 | position``. When a lane's region is
full, every region is laid out again (``_layout``): the documents wholly emitted are forgotten and each lane gets
room in proportion to the documents it was appended so far (at least ``MIN_ROOM``, in all ``1.5 ×`` the live
documents or ``PERIOD`` entries, whichever is more), so the table holds O(live documents) entries and a layout,
O(them) too, comes once per that many appended documents. (The table was one sorted array, re-sorted once a chunk:
with lanes thousands of documents apart — short documents beside long code files — that pass over every live
document took half of cutting the rows on a token-mixture plan.)

When ``tokens`` is full, the documents still live — their tokens from each lane's ``kept`` stream index on —
are compacted to the front in the order they lie in the array (in place, its pages already mapped, while it has
room for twice what is live plus what is appended; else into an array grown to that): each id is copied O(1)
times however long it stays.

Invariant: token ``t`` of document ``d`` (``start[d] <= t < start[d] + size[d]``), for ``t`` at or past its lane's
``kept``, is ``tokens[at[d] + t - start[d]]``; documents of one lane are in plan order and their stream spans
follow each other, so a lane's documents sorted by start are also sorted by position (key ``slot << 40 |
position`` searches the same table).

Example: lanes 0 and 1, regions of 3 entries; a chunk deals lane 0 documents 4: [a a] and 6: [b], lane 1
document 5: [c c c] → tokens [a a b c c c], table (0<<40|0, at 0, 2, pos 4), (0<<40|2, at 2, 1, pos 6),
(0<<40|MASK, spare), (1<<40|0, at 3, 3, pos 5), (1<<40|MASK, spare), (1<<40|MASK, spare). A row [0, 3) of lane
0 meets entries 0 and 1, whose ids are tokens[0:2] and tokens[2:3]: one slice.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

__all__ = ["MASK", "SHIFT", "LaneStore", "run_bounds"]

#: Bits of a key below the lane's slot: stream indices and plan positions stay below 2**40.
SHIFT = 40
MASK = (1 << SHIFT) - 1
#: A lane's spare entries after a layout, at least.
MIN_ROOM = 64
#: Spare entries of all lanes after a layout, at least (besides 1.5 × the live documents).
PERIOD = 4096
_EMPTY = np.empty(0, dtype=np.int64)


def run_bounds(apart: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first and the last index of each run of ``n`` items in a row, where ``apart[i]`` tells that items ``i``
    and ``i + 1`` lie in different runs (``n - 1`` flags; no item, no run): one slice a run instead of one an item,
    for the store's compaction and ``pack.lanes``' cut. Example: ``apart`` [F, T, F], ``n`` 4 → firsts [0, 2],
    lasts [1, 3]."""
    firsts = np.flatnonzero(np.concatenate(([n > 0], apart)))
    return firsts, np.append(firsts[1:], n)[: len(firsts)] - 1


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
        # The table (module docstring): region ``i`` is entries [base[i], stop[i]), its documents [base[i], fill[i]).
        self.key, self.at, self.size, self.position = _EMPTY, _EMPTY, _EMPTY, _EMPTY
        self._base: list[int] = []
        self._fill: list[int] = []
        self._stop: list[int] = []
        self._added: list[int] = []  # per lane: documents appended so far (its share of the room at a layout)
        self.compactions = 0  # how often live documents were moved to the front (for tests and benchmarks)
        self.moved = 0  # ids those compactions copied
        self.layouts = 0  # how often the table was laid out again (for tests and benchmarks)

    def add(self, lane: Lane) -> int:
        """Register ``lane``; returns its slot (an empty region after the others: its first append lays the table
        out, so registering ``L`` lanes costs O(L), not ``L`` copies of the table)."""
        self.lanes.append(lane)
        end = len(self.key)
        self._base.append(end)
        self._fill.append(end)
        self._stop.append(end)
        self._added.append(0)
        return len(self.lanes) - 1

    def append(
        self, slot: int, stream_start: int, positions: np.ndarray, tokens: np.ndarray, sizes: np.ndarray
    ) -> None:
        """Append documents of lane ``slot`` (positions increasing; ``sizes[i]`` ids of ``tokens`` each), the first
        at stream index ``stream_start`` of the lane: one copy of the ids, one slice of each table array."""
        n = len(tokens)
        if self.used + n > len(self.tokens):
            self._compact(n)
        self.tokens[self.used : self.used + n] = tokens
        m = len(sizes)
        if self._fill[slot] + m > self._stop[slot]:
            self._layout(slot, m)
        sizes = np.asarray(sizes, dtype=np.int64)
        offsets = np.cumsum(sizes) - sizes
        f = self._fill[slot]
        self.key[f : f + m] = offsets + ((slot << SHIFT) + stream_start)
        self.at[f : f + m] = offsets + self.used
        self.size[f : f + m] = sizes
        self.position[f : f + m] = positions
        self._fill[slot] = f + m
        self._added[slot] += m
        self.used += n

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``key, at, size, position`` of the whole table, spare entries and documents not yet forgotten included
        (sorted by key: what ``cut_block`` searches)."""
        return self.key, self.at, self.size, self.position

    def table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``key, at, size, position`` of every live document, sorted by key (a copy: for tests and inspection)."""
        live = self._live_entries()
        return self.key[live], self.at[live], self.size[live], self.position[live]

    def docs_at(self, slots: list[int], ts: list[int]) -> list[tuple[int, int]]:
        """``(position, start)`` of the last document of lane ``slots[i]`` starting at or before its stream index
        ``ts[i]``, for each ``i``: one search for them all (NumPy's scalar search for one or two, ~3 µs each,
        against ~9 for the array calls and ~1 a lane more)."""
        wanted = [(slot << SHIFT) + t for slot, t in zip(slots, ts, strict=True)]
        if len(wanted) <= 2:
            found = [int(self.key.searchsorted(w, side="right")) - 1 for w in wanted]
            return [(int(self.position[d]), int(self.key[d]) & MASK) for d in found]
        d = self.key.searchsorted(np.array(wanted, dtype=np.int64), side="right") - 1
        return [(p, k & MASK) for p, k in zip(self.position[d].tolist(), self.key[d].tolist(), strict=True)]

    def _live_entries(self) -> np.ndarray:
        """Indexes of the table's live documents, in table order: in a region, not wholly emitted (empty
        documents at or past their lane's ``kept`` stay)."""
        if not self.lanes:
            return _EMPTY
        base, fill = np.array(self._base), np.array(self._fill)
        counts = fill - base
        total = int(counts.sum())
        entry = np.repeat(base - (np.cumsum(counts) - counts), counts) + np.arange(total)
        key, size = self.key[entry], self.size[entry]
        start, floor = key & MASK, self._floors(key)
        return entry[(start + size > floor) | (start >= floor)]

    def _floors(self, key: np.ndarray) -> np.ndarray:
        """Each document's lane's ``kept`` stream index."""
        return np.array([lane._kept for lane in self.lanes], dtype=np.int64)[key >> SHIFT]

    def _layout(self, slot: int, incoming: int, live: np.ndarray | None = None, at: np.ndarray | None = None) -> None:
        """Lay the table out again (module docstring): the live documents only (``live``: their entries, when the
        caller has them; with ``at`` as their new places: ``_compact``), each lane's region with room for its share
        of what comes next, ``incoming`` more for lane ``slot``."""
        live = self._live_entries() if live is None else live
        key, size, position = self.key[live], self.size[live], self.position[live]
        at = self.at[live] if at is None else at
        lanes = len(self.lanes)
        counts = np.bincount(key >> SHIFT, minlength=lanes)
        added = np.array(self._added, dtype=np.float64)
        spare = max(PERIOD, len(live)) * 3 // 2
        share = added / added.sum() if added.sum() else np.full(lanes, 1 / lanes)
        room = np.ceil(share * spare).astype(np.int64) + MIN_ROOM
        room[slot] += incoming
        stop = np.cumsum(counts + room)
        base = stop - counts - room
        total = int(stop[-1])
        owner = np.repeat(np.arange(lanes, dtype=np.int64), counts + room)
        self.key = (owner << SHIFT) | MASK
        self.position = np.full(total, MASK, dtype=np.int64)
        self.at = np.zeros(total, dtype=np.int64)
        self.size = np.zeros(total, dtype=np.int64)
        dest = np.repeat(base, counts) + (np.arange(len(live)) - np.repeat(np.cumsum(counts) - counts, counts))
        self.key[dest], self.position[dest], self.at[dest], self.size[dest] = key, position, at, size
        self._base, self._stop = base.tolist(), stop.tolist()
        self._fill = (base + counts).tolist()
        self.layouts += 1

    def _compact(self, n: int) -> None:
        """Move the live documents' tokens (from each lane's ``kept`` on) to the front, in the order they lie in
        the array — in place when it has room for twice them and ``n`` more, else into a new array that size or
        larger; forget documents wholly emitted. In place, each run of contiguous ids moves toward the front (the
        runs before it are no longer than the ids before it), so no run overwrites one not yet moved; and the
        array's pages are already mapped — a new array of the same size at every compaction cost the caller a page
        fault per 4 KiB appended (~1/3 of dealing a chunk on a samples plan)."""
        live = self._live_entries()
        key, at, size = self.key[live], self.at[live], self.size[live]
        start = key & MASK
        first = np.maximum(start, self._floors(key))  # first token still needed
        src, length = at + first - start, start + size - first
        total = int(length.sum())
        room = len(self.tokens)
        while 2 * (total + n) > room:
            room *= 2
        out = self.tokens if room == len(self.tokens) else np.empty(room, dtype=self.dtype)
        order = np.argsort(src, kind="stable")  # by place in the array
        src_sorted, length_sorted = src[order], length[order]
        dst = np.empty_like(src)
        dst[order] = np.cumsum(length_sorted) - length_sorted
        # one slice per run of documents contiguous in the array (a lane's documents of one chunk)
        firsts, lasts = run_bounds(src_sorted[1:] != src_sorted[:-1] + length_sorted[:-1], len(src))
        firsts, lasts = order[firsts], order[lasts]
        tokens = self.tokens
        froms, tos = src[firsts].tolist(), (src[lasts] + length[lasts]).tolist()
        for a, b, d in zip(froms, tos, dst[firsts].tolist(), strict=True):
            if out is not tokens or a != d:  # (in place, a run already at its place stays)
                out[d : d + b - a] = tokens[a:b]
        self.tokens, self.used = out, total
        if self.lanes:
            self._layout(0, 0, live, at=dst - (first - start))
        self.compactions += 1
        self.moved += total
