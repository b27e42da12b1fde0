"""Packing lanes of an estimated plan, packed at train time, resumable from a two-number cursor.

Each lane holds the documents dealt to it (plan column ``lane``) in plan order and cuts their token stream
into rows of ``max_length`` (wrap packing, as ``zephon.executor.pack.rows``). A lane's cursor is
``(position, skip)``: the plan position of the first document not fully emitted and how many of its tokens
were emitted. Everything a lane will produce follows from its cursor alone, so resuming re-reads only the
documents after it — never from the start of the plan.

Example, max_length 4, lane documents at positions 3: [a a a E], 9: [b E], 12: [c c E]: rows [a a a E],
[b E c c], then [E] (padded at the end of the plan). After the first row the cursor is (9, 0); after the
second, (12, 2).

A lane is a few numbers in stream coordinates (token ``t`` of the lane's stream since the start of this run):
``_end`` (after the last token pushed), ``_next`` (the next token to emit) and ``_kept`` (tokens before it may
be forgotten). Its tokens and documents live in a ``LaneStore`` (``zephon.executor.pack.lane_store``) shared by
a worker's lanes: one array the lanes append to (one copy a lane and chunk) and one document table sorted by
(lane, stream start). ``pop_rows`` cuts a microbatch's rows in three steps: per row, ``_next`` moves by up to
``max_length`` (integer arithmetic only); then, for all rows at once, one ``searchsorted`` over the table finds
every row's documents and the pieces follow in a fixed number of numpy calls; then the ids are copied into
the microbatch's ``(n, W)`` array — one slice per run of a row's pieces that lie one after another in the
store (a row within one chunk's documents: one slice), whatever the number of documents in the row.

Zero-size documents (an empty text with no BOS/EOS) keep the cursors and pieces of the list-based lanes this
replaced: a document pushed to a lane that has emitted everything is the lane's cursor (``_fresh``) and the
first piece of its next row, even when it is empty.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from zephon.executor.encode.flags import ID
from zephon.executor.pack.lane_store import MASK, SHIFT, LaneStore
from zephon.executor.pack.rows import PIECE_DTYPE, PackedRows

__all__ = ["Lane", "LaneStore", "Snapshot", "cursors_of", "pop_rows"]

#: A lane's counters that its cursor follows from: pushed, read_to, fresh, next, end (``Lane.snapshot``).
Snapshot = tuple[bool, int, int | None, int, int]

_ARANGE = np.arange(4096, dtype=np.int64)  # 0, 1, 2, ... for the usual sizes without a call (read only)
_ARANGE.flags.writeable = False


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
        self.read_to = self.start_position  # every plan position before this has been routed
        self._end = 0  # stream index after the last buffered token
        self._next = 0  # stream index of the next token to emit
        self._kept = 0  # stream index of the first token the store must keep (rows cut, not yet copied, hold it)
        self._pushed = False  # a document was pushed this run
        self._fresh: int | None = None  # position of the first document pushed while everything was emitted
        self._cur: tuple[int, int] | None = None  # (position, stream start) of the document holding _next
        #: What ``cursor`` reads instead of the live counters while rows cut ahead are handed out one microbatch at a
        #: time (``snapshot``, ``zephon.executor.estimated.LaneBatches``): the counters as they were then.
        self.held: Snapshot | None = None

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
        the other, ``sizes[i]`` of them for the document at ``positions[i]``. One copy, no Python per document."""
        if len(positions) and positions[0] < self.start_position:  # before the lane's start: ignored
            k = int(np.searchsorted(positions, self.start_position))
            tokens, positions, sizes = tokens[int(sizes[:k].sum()) :], positions[k:], sizes[k:]
        if not len(positions):
            return
        caught_up = self._next == self._end
        self.store.append(self.slot, self._end, positions, tokens, sizes)
        self._end += len(tokens)
        first = int(positions[0])
        if self.start_skip and first == self.start_position and not self._pushed:  # resume inside that document
            self._next += min(self.start_skip, int(sizes[0]))
            self._kept, self._cur = self._next, None
        elif caught_up and self._fresh is None:
            self._fresh = first
        self._pushed = True

    def ready(self) -> bool:
        return self._end - self._next >= self.max_length

    def cursor(self) -> tuple[int, int]:
        """``(position, skip)`` from which this lane's remaining rows are rebuilt (before anything is routed to a
        resumed lane: the cursor it was started from, its skip included). With ``held`` set, the cursor as it was
        when that snapshot was taken (``cursors_of``)."""
        return cursors_of([self])[0]

    def snapshot(self) -> Snapshot:
        """The counters ``cursor`` reads (``held``)."""
        return self._pushed, self.read_to, self._fresh, self._next, self._end

    def pop_row(self) -> PackedRows:
        """The next row: full when enough is buffered, else what is left, padded (length 0 when empty)."""
        return pop_rows([self])


def cursors_of(lanes: list[Lane]) -> list[tuple[int, int]]:
    """Each lane's ``cursor()``: from its counters (``held`` where set, else its own), and where its next token
    lies inside a document, that document's ``(position, stream start)`` from the store's table — found for all
    such lanes of a store in one search (``LaneStore.docs_at``; a state is every lane's cursor, taken each
    microbatch: one ``searchsorted`` a lane cost ~10 µs of an 8-lane state's ~100). A live lane keeps what it found
    (``_cur``, until its next row is cut); a held one does not (its snapshot is an earlier ``_next``)."""
    out: list[tuple[int, int]] = []
    find: list[tuple[int, Lane, int]] = []  # (index in out, lane, stream index of its next token)
    for lane in lanes:
        live = lane.held is None
        pushed, read_to, fresh, nxt, end = lane.snapshot() if live else lane.held  # type: ignore[misc]
        if not pushed and read_to == lane.start_position:
            out.append((lane.start_position, lane.start_skip))
        elif fresh is not None:
            out.append((fresh, 0))
        elif nxt >= end:
            out.append((read_to, 0))
        elif live and lane._cur is not None:
            out.append((lane._cur[0], nxt - lane._cur[1]))
        else:  # found below (the held snapshot's document is still in the table: nothing appended since)
            find.append((len(out), lane, nxt))
            out.append((0, 0))
    for store in {id(lane.store): lane.store for _, lane, _ in find}.values():
        mine = [(i, lane, nxt) for i, lane, nxt in find if lane.store is store]
        found = store.docs_at([lane.slot for _, lane, _ in mine], [nxt for _, _, nxt in mine])
        for (i, lane, nxt), (position, start) in zip(mine, found, strict=True):
            out[i] = (position, nxt - start)
            if lane.held is None:
                lane._cur = (position, start)
    return out


def pop_rows(
    lanes: list[Lane],
    prepare: Callable[[Lane], None] | None = None,
    *,
    marks: list[int] | None = None,
    mark: Callable[[], None] | None = None,
) -> PackedRows:
    """The next row of each lane in ``lanes`` (in order; a lane may come more than once: its next rows), as one
    ``PackedRows`` (module docstring). ``prepare(lane)`` runs just before each row is cut (``DealLanes``
    buffers enough of the lane there). ``mark()`` runs once for each of ``marks`` (increasing row counts), when
    that many rows are cut and the next row's ``prepare`` has not run: where a microbatch of rows cut together
    ends (``LaneBatches`` takes the lanes' snapshots there). Lanes of one run: same ``max_length``, pad and dtype."""
    n, width = len(lanes), lanes[0].max_length
    lo, hi, fresh = [0] * n, [0] * n, [None] * n
    short = []
    marks = marks or []
    m = 0
    for i, lane in enumerate(lanes):  # per row: a few integers (the copies and searches come after, vectorized)
        while m < len(marks) and marks[m] == i:
            mark()  # type: ignore[misc]
            m += 1
        if prepare is not None:
            prepare(lane)
        a = lane._next
        b = lane._next = min(a + width, lane._end)
        lo[i], hi[i] = lane._key + a, lane._key + b
        if b - a < width:
            short.append((i, b - a))
        fresh[i], lane._fresh = lane._fresh, None
    while m < len(marks):
        mark()  # type: ignore[misc]
        m += 1
    tokens = np.empty((n, width), dtype=lanes[0].dtype)
    doc_start = np.zeros((n, width), dtype=bool)
    store = lanes[0].store
    if all(lane.store is store for lane in lanes):
        pieces = _cut(store, lanes, None, np.array((lo, hi), dtype=np.int64), fresh, short, tokens, doc_start)
    else:  # lanes of several stores (lanes made one by one): each store's rows, then the pieces in row order
        parts = []
        for s in {id(lane.store): lane.store for lane in lanes}.values():
            mine = [i for i, lane in enumerate(lanes) if lane.store is s]
            bounds = np.array(([lo[i] for i in mine], [hi[i] for i in mine]), dtype=np.int64)
            empty = [(k, m) for k, i in enumerate(mine) for j, m in short if j == i]
            own = [lanes[i] for i in mine]
            parts.append(_cut(s, own, np.array(mine), bounds, [fresh[i] for i in mine], empty, tokens, doc_start))
        pieces = np.concatenate(parts)
        pieces = pieces[np.argsort(pieces["row"], kind="stable")]
    lengths = np.full(n, width, dtype=np.int64)
    for i, m in short:  # padding: the end of the plan only
        tokens[i, m:] = _pad(tokens.dtype, lanes[0].pad_id)
        lengths[i] = m
    return PackedRows(tokens=tokens, doc_start=doc_start, lengths=lengths, pieces=pieces)


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
    store: LaneStore, lanes: list[Lane], rows: np.ndarray | None, bounds: np.ndarray, fresh: list[int | None],
    short: list[tuple[int, int]], out: np.ndarray, doc_start: np.ndarray,
) -> np.ndarray:  # fmt: skip
    """The pieces of ``lanes``' rows — rows ``rows`` of ``out`` (None: 0, 1, ...) — cut from the keys ``bounds``
    (``slot << SHIFT | stream index``: row ``i`` is ``[bounds[0, i], bounds[1, i])``), all in ``store``; their ids
    copied into ``out`` and their document starts marked in ``doc_start``. ``fresh[i]``: the position row ``i``
    starts at when its lane had caught up, else None; ``short``: the rows shorter than a full row, with their
    lengths. Each lane's cursor and kept index are updated."""
    key, at, size, position = store.arrays()
    width = out.shape[1]
    right = key.searchsorted(bounds, side="right") - 1  # per row: the documents holding its first and its end token
    first = right[0]
    if any(f is not None for f in fresh):  # a lane's first row after it caught up: from that document, even empty
        has = np.array([f is not None for f in fresh])
        pkey = (key >> SHIFT << SHIFT) | position  # a lane's documents sorted by start are sorted by position
        wanted = (bounds[0] >> SHIFT << SHIFT) + np.array([-1 if f is None else f for f in fresh], dtype=np.int64)
        first = np.where(has, pkey.searchsorted(wanted, side="left"), first)
    counts = key.searchsorted(bounds[1], side="left") - first  # documents [first, last) meet the row
    for i, m in short:
        if m == 0:
            counts[i] = 0  # an empty row (the end of the plan) has no pieces
    ends = counts.cumsum()
    total = int(ends[-1])
    local = np.repeat(_upto(len(lanes)), counts)  # the row of each piece
    doc = (first - ends + counts)[local] + _upto(total)
    start = key[doc]
    lo, hi = bounds[0][local], bounds[1][local]
    begin = np.maximum(start, lo)
    end = np.minimum(start + size[doc], hi)
    pieces = np.empty(total, dtype=PIECE_DTYPE)
    pieces["row"] = local if rows is None else rows[local]
    pieces["offset"] = offset = begin - lo
    pieces["position"] = position[doc]
    pieces["doc_start"] = skip = begin - start
    pieces["length"] = length = end - begin
    # The ids: one slice per run of pieces whose source and destination advance together (``delta`` equal):
    # a row within one chunk's documents is one slice. A run may cross into the next row (a full row before
    # it, or padding written after) or, in the one-store case, over an empty row (padded after as well).
    dst = offset + (local if rows is None else rows[local]) * width
    delta = at[doc] + skip - dst
    apart = delta[1:] != delta[:-1]
    if rows is not None:  # rows of another store may lie between two of these: a run never crosses one
        apart |= rows[local[1:]] - rows[local[:-1]] > 1
    breaks = (np.flatnonzero(apart) + 1).tolist()
    dst_, end_, delta_ = dst.tolist(), (dst + length).tolist(), delta.tolist()
    flat, tokens = out.reshape(-1), store.tokens
    for f, e in zip([0, *breaks], [*breaks, total], strict=True) if total else ():
        a, b, d = dst_[f], end_[e - 1], delta_[f]
        flat[a:b] = tokens[a + d : b + d]
    doc_start.reshape(-1)[dst[skip == 0]] = True
    # Cursors: the document holding each row's end (the last row of a lane wins).
    if len(key):
        held = np.maximum(right[1], 0)
        cur = zip(position[held].tolist(), (key[held] & MASK).tolist(), strict=True)
    else:
        cur = ((0, 0) for _ in lanes)
    for lane, c in zip(lanes, cur, strict=True):
        lane._cur, lane._kept = c, lane._next
    return pieces
