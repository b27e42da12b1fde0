"""The token segments a worker's lanes share, and the table of their documents sorted by (lane, stream start).

Every lane of a DataLoader worker (or of a rank without workers) hands the store the ids of the documents dealt
to it: a chunk's documents arrive grouped by lane, each lane's as one slice of the chunk's encoded ids, and the
store *keeps that slice* — a **segment**, numbered in the order they come — instead of copying it into an array
of its own (ids it cannot keep — a view of a memory map or of a buffer another library lends, another dtype — are
copied once). A document is one entry of the table: its key ``slot << 40 | start`` (the lane's slot in the store,
the stream index of its first token in that lane), where its first id lies (``at``, below), its size and its plan
position. A row cut from ``[lo, hi)`` of lane ``s``'s stream meets the entries ``searchsorted(key, s<<40|lo,
"right") - 1`` up to ``searchsorted(key, s<<40|hi, "left")`` — one ``searchsorted`` for all rows of a microbatch
(``zephon.executor.pack.lanes.cut_block``). ``at`` is ``segment << SEGMENT_SHIFT | index``: the document's first
id is id ``index`` of segment ``segment`` (``segments``), so the ids of documents that follow each other in one
segment have ``at`` values that follow each other too, and never those of two segments.

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

A segment is let go once its lane has emitted all of it (the lane's ``kept`` stream index is past its end),
checked when the lane appends and at each layout. A segment is a view of its chunk's array, which stays in memory
while any lane's segment of it is live; once its live segments hold a quarter of its bytes or less (``MIN_LIVE``),
they are copied out and the array goes — so a lane far behind the others (a long document) never holds the whole
array of every chunk read meanwhile, and the store holds about 4 times its live segments at most. (Until
the twenty-ninth session the ids were copied into one array and the live ones compacted to its front when it was
full: on 2 cores that copy, the compactions and the array's first touch of fresh pages cost the caller 3-6 CPU ns
a token, a third to a half of its work — docs/performance-log.md, twenty-ninth session.)

Invariant: token ``t`` of document ``d`` (``start[d] <= t < start[d] + size[d]``), for ``t`` at or past its lane's
``kept``, is id ``(at[d] & SEGMENT_MASK) + t - start[d]`` of segment ``at[d] >> SEGMENT_SHIFT``; documents of one
lane are in plan order and their stream spans follow each other, so a lane's documents sorted by start are also
sorted by position (key ``slot << 40 | position`` searches the same table).

Example: lanes 0 and 1, regions of 3 entries; a chunk deals lane 0 documents 4: [a a] and 6: [b], lane 1
document 5: [c c c] → segments 0: [a a b] and 1: [c c c] (views of the chunk's ids), table (0<<40|0, at 0, 2,
pos 4), (0<<40|2, at 2, 1, pos 6), (0<<40|MASK, spare), (1<<40|0, at 1<<32|0, 3, pos 5), (1<<40|MASK, spare),
(1<<40|MASK, spare). A row [0, 3) of lane 0 meets entries 0 and 1, whose ids are ids 0:2 and 2:3 of segment 0: one
slice. Once lane 0's ``kept`` reaches 3, its segment is let go.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

import numpy as np

__all__ = ["MASK", "SEGMENT_MASK", "SEGMENT_SHIFT", "SHIFT", "LaneStore", "run_bounds"]

#: Bits of a key below the lane's slot: stream indices and plan positions stay below 2**40.
SHIFT = 40
MASK = (1 << SHIFT) - 1
#: A lane's spare entries after a layout, at least.
MIN_ROOM = 64
#: Spare entries of all lanes after a layout, at least (besides 1.5 × the live documents).
PERIOD = 4096
#: ``at`` is ``segment << SEGMENT_SHIFT | index in the segment`` (a segment holds fewer than 2**32 ids).
SEGMENT_SHIFT = 32
SEGMENT_MASK = (1 << SEGMENT_SHIFT) - 1
#: An array whose live segments hold this share of its bytes or less has them copied out (``_release``): the
#: store holds at most ``1 / MIN_LIVE`` times the bytes of its live segments.
MIN_LIVE = 0.25
_EMPTY = np.empty(0, dtype=np.int64)


def run_bounds(apart: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first and the last index of each run of ``n`` items in a row, where ``apart[i]`` tells that items ``i``
    and ``i + 1`` lie in different runs (``n - 1`` flags; no item, no run): one slice a run instead of one an item,
    for ``pack.lanes``' cut. Example: ``apart`` [F, T, F], ``n`` 4 → firsts [0, 2],
    lasts [1, 3]."""
    firsts = np.flatnonzero(np.concatenate(([n > 0], apart)))
    return firsts, np.append(firsts[1:], n)[: len(firsts)] - 1


class Lane(Protocol):
    """What the store reads of a lane (``zephon.executor.pack.lanes.Lane``): the first stream index it keeps."""

    _kept: int


class LaneStore:
    """One token array and one document table for the lanes registered with it (``add``)."""

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = np.dtype(dtype)
        self.appended = 0  # segments handed to the store so far (the next one's number)
        self.lanes: list[Lane] = []  # lane ``i`` has slot ``i``
        # The table (module docstring): region ``i`` is entries [base[i], stop[i]), its documents [base[i], fill[i]).
        self.key, self.at, self.size, self.position = _EMPTY, _EMPTY, _EMPTY, _EMPTY
        self._base: list[int] = []
        self._fill: list[int] = []
        self._stop: list[int] = []
        self._added: list[int] = []  # per lane: documents appended so far (its share of the room at a layout)
        #: The live segments by number: what ``cut_block`` reads the ids from.
        self.segments: dict[int, np.ndarray] = {}
        self._owned: list[deque[tuple[int, int]]] = []  # per lane: its live segments' (stream end, number)
        #: The arrays the segments are views of, by ``id``: [the array, its live segments' bytes, their numbers].
        self._arrays: dict[int, list] = {}
        self._array_of: dict[int, int] = {}  # a live segment's number -> its array's ``id``
        self.copied_out = 0  # ids copied out of an array mostly let go (``_release``; for tests and benchmarks)
        self.copied = 0  # ids copied in: handed over in memory the store cannot keep (for tests and benchmarks)
        self.released = 0  # segments let go (for tests and benchmarks)
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
        self._owned.append(deque())
        return len(self.lanes) - 1

    def append(
        self, slot: int, stream_start: int, positions: np.ndarray, tokens: np.ndarray, sizes: np.ndarray
    ) -> None:
        """Append documents of lane ``slot`` (positions increasing; ``sizes[i]`` ids of ``tokens`` each), the first
        at stream index ``stream_start`` of the lane: ``tokens`` kept as one segment, not copied (the caller hands
        them over and never writes them again; else copied: ``_owner``), and one slice of each table array."""
        n = len(tokens)
        at = self.appended << SEGMENT_SHIFT  # (a call of empty documents only: a number no segment has)
        if n:
            assert n <= SEGMENT_MASK, n  # a lane's slice of one chunk: far below 2**32 ids (16 GiB of them)
            owner = _owner(tokens, self.dtype)
            if owner is None:
                tokens = owner = np.array(tokens, dtype=self.dtype)
                self.copied += n
            self._keep(self.appended, tokens, owner)
            self._owned[slot].append((stream_start + n, self.appended))
            self.appended += 1
            self._release(slot)
        m = len(sizes)
        if self._fill[slot] + m > self._stop[slot]:
            self._layout(slot, m)
        sizes = np.asarray(sizes, dtype=np.int64)
        offsets = np.cumsum(sizes) - sizes
        f = self._fill[slot]
        self.key[f : f + m] = offsets + ((slot << SHIFT) + stream_start)
        self.at[f : f + m] = offsets + at
        self.size[f : f + m] = sizes
        self.position[f : f + m] = positions
        self._fill[slot] = f + m
        self._added[slot] += m

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

    def _layout(self, slot: int, incoming: int) -> None:
        """Lay the table out again (module docstring): the live documents only, each lane's region with room for its
        share of what comes next, ``incoming`` more for lane ``slot``; and let go of every lane's emitted segments
        (a lane that has not appended since)."""
        live = self._live_entries()
        key, size, position, at = self.key[live], self.size[live], self.position[live], self.at[live]
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
        for k in range(lanes):
            self._release(k)

    def held(self) -> int:
        """Bytes of the arrays the live segments keep in memory (each chunk's array once, however many lanes'
        segments are views of it): about ``1 / MIN_LIVE`` times the live segments' bytes at most (``_release``)."""
        return sum(array.nbytes for array, _, _ in self._arrays.values())

    def live(self) -> int:
        """Bytes of the live segments (for tests and benchmarks)."""
        return sum(ids.nbytes for ids in self.segments.values())

    def _keep(self, number: int, ids: np.ndarray, owner: np.ndarray) -> None:
        """Keep ``ids`` (a view of ``owner``'s memory) as segment ``number``."""
        self.segments[number] = ids
        held = self._arrays.setdefault(id(owner), [owner, 0, set()])
        held[1] += ids.nbytes
        held[2].add(number)
        self._array_of[number] = id(owner)

    def _release(self, slot: int) -> None:
        """Let go of lane ``slot``'s segments it has wholly emitted (every id before its ``kept``). An array whose
        live segments fall to ``MIN_LIVE`` of its bytes or less has them copied out, so that it goes: a lane
        that lags far behind the others (a long document) would otherwise hold the whole array of every chunk
        read meanwhile for its own small share of each. Each id is copied out once at most: a copy is an array
        of its own, which goes with its segment."""
        owned, kept = self._owned[slot], self.lanes[slot]._kept
        while owned and owned[0][0] <= kept:
            number = owned.popleft()[1]
            ids = self.segments.pop(number)
            self.released += 1
            key = self._array_of.pop(number)
            held = self._arrays[key]
            held[1] -= ids.nbytes
            held[2].discard(number)
            if not held[2]:
                del self._arrays[key]
            elif held[1] <= MIN_LIVE * held[0].nbytes:
                del self._arrays[key]
                for other in held[2]:
                    copy = self.segments[other].copy()
                    self._keep(other, copy, copy)
                    self.copied_out += len(copy)


def _owner(tokens: np.ndarray, dtype: np.dtype) -> np.ndarray | None:
    """The array whose memory ``tokens`` is a view of, if the store may keep them as they are: of its dtype,
    contiguous, and memory NumPy allocated — never a view of a memory map (a file changed or cut under it would
    change the ids, or end the process at a read) or of a buffer another library lends (None: copy them)."""
    if tokens.dtype != dtype or not tokens.flags.c_contiguous:
        return None
    base = tokens
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base if isinstance(base, np.ndarray) and not isinstance(base, np.memmap) else None
