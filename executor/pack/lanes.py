"""Packing lanes of an estimated plan, packed at train time, resumable from a two-number cursor.

Each lane holds the documents dealt to it (plan column ``lane``) in plan order and cuts their token stream
into rows of ``max_length`` (wrap packing, as ``zephon.executor.pack.rows``). A lane's cursor is
``(position, skip)``: where its next token lies inside a document (``skip`` > 0), that document and how many
of its tokens were emitted; where it lies between documents, one past the last document whose last token was
emitted (the lane's starting cursor if none was in this run). Everything a lane will produce follows from its
cursor alone, so resuming re-reads only the documents after it — never from the start of the plan.

Invariant: a cursor is a function of the rows emitted alone — never of how far the plan happened to be read
(chunks, read-ahead, DataLoader workers, a resume) — so every state taken after the same batch is the same,
byte for byte, whatever the execution settings.

Example, max_length 4, lane documents at positions 3: [a a a E], 9: [b E], 12: [c c E]: rows [a a a E],
[b E c c], then [E] (padded at the end of the plan). After the first row the cursor is (4, 0) — whether
document 9 was read yet or not —; after the second, (12, 2); after the third, (13, 0).

A lane is a few numbers in stream coordinates (token ``t`` of the lane's stream since the start of this run):
``_end`` (after the last token pushed), ``_next`` (the next token to emit) and ``_kept`` (tokens before it may be
forgotten). Its tokens and documents live in a ``LaneStore`` (``zephon.executor.pack.lane_store``) shared by a
worker's lanes: the segments the lanes hand it (a lane's slice of a chunk's ids, kept, not copied) and one document
table sorted by (lane, stream start). ``cut_block`` cuts a block of rows (row ``i`` from lane ``order[i]``) with no
Python per row: a lane's ``k``-th row of the block starts ``k · max_length`` past its ``_next`` (every row before
it is full unless the plan ran out), so every row's bounds, and what must be buffered before it, are a few array
operations; while the first row not yet full lacks tokens, the next chunk is dealt (``fill``, one call per chunk);
one ``searchsorted`` over the table then finds every row's documents and the pieces follow in a fixed number of
numpy calls; the ids are copied into the block's ``(n, W)`` array — one slice per run of a row's pieces that lie
one after another in one segment (a row within one chunk's documents: one slice), whatever the number of documents
in the row. Python runs per lane and per chunk dealt, not per row: with 8 lanes and a block of 64 rows, 8 counter
updates instead of 64 rounds of checks.

Zero-size documents (an empty text with no BOS/EOS): a row's pieces are the document holding its first token
and every document that starts inside it — at its first token too — so the empty documents between two rows are
the first pieces of the later row, whatever was read when (an empty row at the end of the plan has no pieces).
A row never ends on an empty document (one at its end starts the next row), so the cursor past a row's last
document is past the empty ones before it: a resumed run never hands one out twice.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from zephon.errors import STATE_FIX, ConfigError
from zephon.executor.encode.flags import ID
from zephon.executor.pack.lane_store import MASK, SEGMENT_MASK, SEGMENT_SHIFT, SHIFT, LaneStore, run_bounds
from zephon.executor.pack.rows import PIECE_DTYPE, PackedRows

__all__ = ["Block", "Held", "Lane", "LaneStore", "Snapshot", "cursors_of", "cut_block", "pop_rows"]

#: Every lane's counters that its cursor follows from, in a block's lanes' order (``Block.snapshots``): next, end
#: and done, the block being cut and how many of its rows were cut when it was taken (``done`` is updated once the
#: block is cut: ``Lane._done_at``). A lane holds one with its index in it (``Lane.held``).
Snapshot = tuple[list[int], list[int], list[int | None], int, int]
#: ``Lane.held``: a cell the lanes of one ``DealLanes`` share — the snapshot their cursors read (None: each lane's
#: own counters) — and the lane's index in it; one assignment a microbatch holds every lane at once, where setting
#: each lane's own cost ~0.6 µs a lane a microbatch (every lane of the rank, with gradient accumulation).
Held = tuple[list[Snapshot | None], int]
#: Numbers the calls of ``cut_block`` (blocks), so that a snapshot reads only its own block's rows.
_BLOCKS = itertools.count()

_ARANGE = np.arange(4096, dtype=np.int64)  # 0, 1, 2, ... for the usual sizes without a call (read only)
_ARANGE.flags.writeable = False
_EMPTY = np.empty(0, dtype=np.int64)
#: A block's rows with pieces by lane (``Lane._block``): the block, their rows, ``_done`` after each, bounds by lane.
_Entries = tuple[int, list[int], list[int], list[int]]
_NO_ENTRIES: _Entries = (-1, [], [], [0, 0])


class Lane:
    """One lane's cursor and stream counters; its tokens and documents are in ``store`` (its own store unless
    one is given: lanes of one worker share one)."""

    def __init__(
        self,
        max_length: int,
        pad_id: int,
        start: tuple[int, int] = (0, 0),
        *,
        dtype: np.dtype = ID,
        store: LaneStore | None = None,
    ) -> None:
        self.max_length = max_length
        self.pad_id = pad_id
        self.dtype = np.dtype(dtype)  # the encoder's tokens (``zephon.executor.encode.flags``): ids, or ids + flags
        self.store = LaneStore(self.dtype) if store is None else store
        if self.store.dtype != self.dtype:
            raise ValueError(
                f"a lane's store must hold {self.dtype} tokens, got {self.store.dtype} — share a store only between "
                "lanes of one run"
            )
        self.slot = self.store.add(self)
        self._key = self.slot << SHIFT  # the slot's part of the store's document keys
        self.start_position, self.start_skip = start
        self._end = 0  # stream index after the last buffered token
        self._next = 0  # stream index of the next token to emit
        self._kept = 0  # stream index of the first token the store must keep (rows cut, not yet copied, hold it)
        self._pushed = False  # a document was pushed this run
        self._cur: tuple[int, int] | None = None  # (position, stream start) of the document holding _next
        #: One past the document of the last piece this lane emitted in this run (None: none yet): its cursor while
        #: its next token lies between documents, when that piece ended its document (set in ``_cut``).
        self._done: int | None = None
        #: The last block (``cut_block`` call) this lane was cut in: (the block, the block's rows that had pieces
        #: grouped by lane, ``_done`` after each, where each lane's start), and this lane's index (``_done_at``).
        self._block: tuple[_Entries, int] = (_NO_ENTRIES, 0)
        #: What ``cursor`` reads instead of the live counters while rows cut ahead are handed out one microbatch at a
        #: time (``Block.snapshots``, ``zephon.executor.estimated.LaneBatches``): the counters as they were then.
        self.held: Held | None = None

    @property
    def buffered(self) -> int:
        """Tokens buffered and not emitted."""
        return self._end - self._next

    def push(self, position: int, tokens: np.ndarray) -> None:
        """Add the lane's document at ``position`` (documents before the lane's start are ignored)."""
        tokens = np.asarray(tokens)
        self.push_many(np.array([position], dtype=np.int64), tokens, np.array([len(tokens)], dtype=np.int64))

    def push_many(self, positions: np.ndarray, tokens: np.ndarray, sizes: np.ndarray) -> None:
        """``push`` for several documents at once (positions increasing): ``tokens`` holds their ids one after
        the other, ``sizes[i]`` of them for ``positions[i]``; kept as they are (never write them again): no copy."""
        if len(positions) and positions[0] < self.start_position:  # before the lane's start: ignored
            k = int(np.searchsorted(positions, self.start_position))
            tokens, positions, sizes = tokens[int(sizes[:k].sum()) :], positions[k:], sizes[k:]
        if not len(positions):
            return
        if self._next == self._end:  # caught up: the next token is this push's, not in the document found before
            self._cur = None
        self.store.append(self.slot, self._end, positions, tokens, sizes)
        self._end += len(tokens)
        first = int(positions[0])
        if self.start_skip and not self._pushed:  # resume inside the cursor's document: the first the lane gets
            if first != self.start_position or self.start_skip > int(sizes[0]):  # else resumed elsewhere, silently
                raise ConfigError(
                    f"pipeline state lane cursor {[self.start_position, self.start_skip]} must name a document of its "
                    f"lane and skip at most its tokens, got document {first} of {int(sizes[0])} — {STATE_FIX}"
                )
            self._next += self.start_skip
            self._kept, self._cur = self._next, None
        self._pushed = True

    def ready(self) -> bool:
        return self._end - self._next >= self.max_length

    def cursor(self) -> tuple[int, int]:
        """``(position, skip)`` from which this lane's remaining rows are rebuilt (module docstring; before a
        resumed lane emits anything: the cursor it was started from, its skip included). With ``held`` set, the
        cursor as it was when that snapshot was taken (``cursors_of``)."""
        return cursors_of([self])[0]

    def _done_at(self, block: int, rows: int, done: int | None) -> int | None:
        """``_done`` as it was when ``rows`` rows of ``block`` were cut, ``done`` being its value then (set only
        once the whole block is cut: the lane's rows of the block before ``rows`` may have changed it since)."""
        (cut, rows_of, done_of, bounds), k = self._block
        if cut == block:
            j = bisect.bisect_left(rows_of, rows, bounds[k], bounds[k + 1])  # past its entries of rows before
            if j > bounds[k]:
                return done_of[j - 1]
        return done

    def _at_rest(self, done: int | None) -> tuple[int, int]:
        """The cursor while the next token is not inside a document (module docstring)."""
        return (self.start_position, self.start_skip) if done is None else (done, 0)

    def pop_row(self) -> PackedRows:
        """The next row: full when enough is buffered, else what is left, padded (length 0 when empty)."""
        return pop_rows([self])


def cursors_of(lanes: list[Lane]) -> list[tuple[int, int]]:
    """Each lane's ``cursor()`` (module docstring), from its counters (``held`` where set, else its own). Where
    its next token may lie inside a document, that document's ``(position, stream start)`` comes from the store's
    table — found for all such lanes of a store in one search (``LaneStore.docs_at``; a state is every lane's
    cursor, taken each microbatch: one ``searchsorted`` a lane cost ~10 µs of an 8-lane state's ~100). A live lane
    keeps what it found (``_cur``, until its next row is cut); a held one does not (its snapshot is an earlier
    ``_next``, whose document is still in the table: nothing is appended between cutting a block and handing out
    its last microbatch)."""
    out: list[tuple[int, int]] = []
    # (index in out, lane, stream index of its next token, done, whether its own counters: it keeps what is found)
    find: list[tuple[int, Lane, int, int | None, bool]] = []
    for lane in lanes:
        snapshot = None if lane.held is None else lane.held[0][0]
        if snapshot is None:
            nxt, end, done = lane._next, lane._end, lane._done
        else:
            (at, ends, dones, block, rows), k = snapshot, lane.held[1]  # type: ignore[index]
            nxt, end, before = at[k], ends[k], dones[k]
            done = lane._done_at(block, rows, before)
        if nxt >= end:
            out.append(lane._at_rest(done))
        elif snapshot is None and lane._cur is not None:
            position, start = lane._cur
            out.append((position, nxt - start) if nxt > start else lane._at_rest(done))
        else:  # found below
            find.append((len(out), lane, nxt, done, snapshot is None))
            out.append((0, 0))
    for store in {id(f[1].store): f[1].store for f in find}.values():
        mine = [f for f in find if f[1].store is store]
        found = store.docs_at([f[1].slot for f in mine], [f[2] for f in mine])
        for (i, lane, nxt, done, live), (position, start) in zip(mine, found, strict=True):
            out[i] = (position, nxt - start) if nxt > start else lane._at_rest(done)
            if live:
                lane._cur = (position, start)
    return out


@dataclass(frozen=True, slots=True)
class Block:
    """Rows cut together (``cut_block``): the rows, every lane's counters where each of ``marks`` ends
    (``Lane.held``), and the error ``fill`` raised with the row that needed it, if any."""

    rows: PackedRows
    snapshots: list[Snapshot]
    failed: tuple[int, Exception] | None


def pop_rows(lanes: list[Lane], fill: Callable[[], bool] | None = None) -> PackedRows:
    """The next row of each of ``lanes`` in order (a lane may come more than once: its next rows), as one
    ``PackedRows`` (``cut_block``; an error ``fill`` raises is raised)."""
    index: dict[int, int] = {}
    own: list[Lane] = []
    for lane in lanes:
        if id(lane) not in index:
            index[id(lane)] = len(own)
            own.append(lane)
    block = cut_block(own, np.array([index[id(lane)] for lane in lanes], dtype=np.int64), fill)
    if block.failed is not None:
        raise block.failed[1]
    return block.rows


def cut_block(lanes: list[Lane], order: np.ndarray, fill: Callable[[], bool] | None = None, marks: Sequence[int] = (
    )) -> Block:  # fmt: skip
    """Row ``i`` is the next row of ``lanes[order[i]]`` (``lanes`` distinct; a lane's rows follow each other in
    its stream): full, or — once ``fill`` (buffer the next chunk; False when the plan is read to the end) has no
    more — what is left, padded. ``fill`` runs, in row order, while the first row not full yet lacks tokens; an
    error it raises stops the filling and is returned with that row (the rows are then cut from what was
    buffered). ``snapshots[k]`` holds the lanes' counters once ``marks[k]`` rows are cut (``Lane.held``); this
    call numbers the block. Lanes of one run: same ``max_length``, pad and dtype. No Python per row."""
    n, width, count = len(order), lanes[0].max_length, len(lanes)
    block = next(_BLOCKS)
    per_lane = np.bincount(order, minlength=count)
    by_lane = np.argsort(order, kind="stable")  # the rows grouped by lane, each lane's in row order
    first_of = per_lane.cumsum() - per_lane  # where each lane's rows start in by_lane
    failed = None
    nxt, end = _counters(lanes)
    while fill is not None:  # (a resumed lane's first push moves its _next past the skipped tokens: read anew)
        full = (end - nxt) // width  # each lane's first full rows are buffered
        lacking = np.flatnonzero(full < per_lane)
        if not len(lacking):
            break
        row = int(by_lane[(first_of + full)[lacking]].min())  # the first row not full yet
        try:
            more = fill()
        except Exception as exc:  # the caller raises it where the row that needed it is handed out
            failed, more = (row, exc), False
        nxt, end = _counters(lanes)
        if not more:
            break
    ahead = np.empty(n, dtype=np.int64)  # the row is the ahead[i]-th of its lane in this block
    ahead[by_lane] = _upto(n) - first_of[order[by_lane]]
    begin = nxt[order] + ahead * width
    lo = np.minimum(begin, end[order])
    hi = np.minimum(begin + width, end[order])
    snapshots: list[Snapshot] = []  # the counters once marks[k] rows are cut (``_done`` moves after the cut)
    if len(marks):
        grouped = order[by_lane] * (n + 1) + by_lane  # sorted: lane, then row
        cut = grouped.searchsorted((_upto(count) * (n + 1))[:, None] + np.asarray(marks)) - first_of[:, None]
        at = np.minimum(nxt[:, None] + cut * width, end[:, None]).T.tolist()
        ends, done = end.tolist(), [lane._done for lane in lanes]
        snapshots = [(a, ends, done, block, m) for a, m in zip(at, marks, strict=True)]
    keys = np.array([lane._key for lane in lanes], dtype=np.int64)[order]
    after = np.minimum(nxt + per_lane * width, end).tolist()  # each lane's _next once its rows are cut
    lengths = hi - lo
    short = [(int(r), int(lengths[r])) for r in np.flatnonzero(lengths < width)] if n and lengths.min() < width else []
    tokens = np.empty((n, width), dtype=lanes[0].dtype)
    doc_start = np.zeros((n, width), dtype=bool)
    stores = [lane.store for lane in lanes]
    if all(store is stores[0] for store in stores):
        bounds = np.array((keys + lo, keys + hi))
        grouping = (by_lane, per_lane)
        pieces = _cut(stores[0], lanes, order, None, bounds, short, tokens, doc_start, block, after, grouping)
    else:  # lanes of several stores (lanes made one by one): each store's rows, then the pieces in row order
        parts, lane_at = [], np.empty(count, dtype=np.int64)
        for store in {id(s): s for s in stores}.values():
            own = [k for k in range(count) if stores[k] is store]
            lane_at[own] = _upto(len(own))
            mine = np.flatnonzero(np.isin(order, own))
            where = {int(r): k for k, r in enumerate(mine)}
            empty = [(where[r], m) for r, m in short if r in where]
            bounds = np.array((keys[mine] + lo[mine], keys[mine] + hi[mine]))
            own_lanes = [lanes[k] for k in own]
            rows, nexts = lane_at[order[mine]], [after[k] for k in own]
            parts.append(_cut(store, own_lanes, rows, mine, bounds, empty, tokens, doc_start, block, nexts))
        pieces = np.concatenate(parts)
        pieces = pieces[np.argsort(pieces["row"], kind="stable")]
    for r, m in short:  # padding: the end of the plan only
        tokens[r, m:] = _pad(tokens.dtype, lanes[0].pad_id)
    return Block(PackedRows(tokens=tokens, doc_start=doc_start, lengths=lengths, pieces=pieces), snapshots, failed)


def _counters(lanes: list[Lane]) -> tuple[np.ndarray, np.ndarray]:
    """Each lane's ``_next`` and ``_end``."""
    nxt = np.array([lane._next for lane in lanes], dtype=np.int64)
    return nxt, np.array([lane._end for lane in lanes], dtype=np.int64)


def _upto(n: int) -> np.ndarray:
    """``np.arange(n)`` (int64), a read-only view for the usual sizes."""
    return _ARANGE[:n] if n <= len(_ARANGE) else np.arange(n, dtype=np.int64)


def _pad(dtype: np.dtype, pad_id: int) -> np.ndarray | int:
    if dtype.names is None:
        return pad_id
    pad = np.zeros((), dtype=dtype)
    pad["id"] = pad_id
    return pad


def _cut(
    store: LaneStore, lanes: list[Lane], order: np.ndarray, rows: np.ndarray | None, bounds: np.ndarray,
    short: list[tuple[int, int]], out: np.ndarray, doc_start: np.ndarray, block: int, after: list[int],
    grouping: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:  # fmt: skip
    """The pieces of the rows of ``lanes`` (row ``k`` is ``lanes[order[k]]``'s; row ``rows[k]`` of ``out``, None:
    row ``k``) cut from the keys ``bounds`` (``slot << SHIFT | stream index``: row ``k`` is ``[bounds[0, k],
    bounds[1, k])``), all in ``store``; their ids copied into ``out`` and their document starts marked in
    ``doc_start``; ``short``: the rows shorter than a full row, with their lengths; ``after``: each lane's
    ``_next`` once its rows are cut; ``grouping``: the rows sorted by lane (stably) and each lane's count of rows,
    when known. Each lane's next and kept indices, cursor and done entries of ``block`` are updated."""
    key, at, size, position = store.arrays()
    width, n = out.shape[1], len(order)
    label = _upto(n) if rows is None else rows  # each row's row in ``out``
    # Per row: the documents holding its first and its end token (the last starting at or before it), and the
    # first starting at or after it. Its pieces are from the first starting at its first token (an empty one
    # included), else the one holding it, through the last starting before its end.
    right = key.searchsorted(bounds, side="right") - 1
    left = key.searchsorted(bounds, side="left")
    first = np.minimum(left[0], right[0])
    counts = left[1] - first
    for k, m in short:
        if m == 0:
            counts[k] = 0  # an empty row (the end of the plan) has no pieces
    ends = counts.cumsum()
    total = int(ends[-1]) if n else 0
    local = np.repeat(_upto(n), counts)  # the row of each piece
    doc = (first - ends + counts)[local] + _upto(total)
    start = key[doc]
    lo, hi = bounds[0][local], bounds[1][local]
    begin = np.maximum(start, lo)
    end = np.minimum(start + size[doc], hi)
    pieces = np.empty(total, dtype=PIECE_DTYPE)
    pieces["row"] = label[local]
    pieces["offset"] = offset = begin - lo
    pieces["position"] = of = position[doc]
    pieces["doc_start"] = skip = begin - start
    pieces["length"] = length = end - begin
    # The ids: a slice per run of pieces whose source (in one segment) and destination advance together: a row of one
    # chunk's documents is one slice; a run may cross into the next row (full, or padded after) or an empty row.
    dst = offset + label[local] * width
    delta = at[doc] + skip - dst
    apart = delta[1:] != delta[:-1]
    if rows is not None:  # rows of another store may lie between two of these: a run never crosses one
        apart |= rows[local[1:]] - rows[local[:-1]] > 1
    firsts, lasts = run_bounds(apart, total)  # each run's first piece and its last
    to, source = dst[firsts], dst[firsts] + delta[firsts]
    flat, segments, runs = out.reshape(-1), store.segments, (to, dst[lasts] + length[lasts] - to, source & SEGMENT_MASK)
    for a, n, i, s in zip(*(r.tolist() for r in runs), (source >> SEGMENT_SHIFT).tolist(), strict=True):
        if n:  # (a run of empty documents only has no ids, and maybe no segment)
            flat[a : a + n] = segments[s][i : i + n]
    doc_start.reshape(-1)[dst[skip == 0]] = True
    # Cursors, per lane from its last row: the document at that row's end token; and ``_done``, one past the
    # document of the last piece of its last row with pieces (the cursor if a row ends between documents).
    if grouping is None:
        grouping = np.argsort(order, kind="stable"), np.bincount(order, minlength=len(lanes))
    by_lane, per_lane = grouping
    cur = None  # each lane's last row's document at its end token (lanes without rows: not read)
    if n and len(key):
        held = np.maximum(right[1][by_lane[np.maximum(per_lane.cumsum() - 1, 0)]], 0)
        cur = zip(position[held].tolist(), (key[held] & MASK).tolist(), strict=True)
    grouped = by_lane[counts[by_lane] > 0]  # the rows with pieces, by lane, in row order
    done = of[ends[grouped] - 1] + 1 if total else _EMPTY
    limits = [0, *np.bincount(order[grouped], minlength=len(lanes)).cumsum().tolist()]  # each lane's entries
    done_after = done.tolist()
    entries = (block, label[grouped].tolist(), done_after, limits)  # the rows with pieces, ``_done`` after each
    for k, (lane, has, b) in enumerate(zip(lanes, (per_lane > 0).tolist(), after, strict=True)):
        c = next(cur) if cur is not None else (0, 0)
        if has:
            lane._cur = c
        lane._next = lane._kept = b
        lane._block = (entries, k)
        if limits[k + 1] > limits[k]:  # its last row with pieces
            lane._done = done_after[limits[k + 1] - 1]
    return pieces
