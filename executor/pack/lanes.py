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
``_end`` (after the last token pushed), ``_next`` (the next token to emit) and ``_kept`` (tokens before it may
be forgotten). Its tokens and documents live in a ``LaneStore`` (``zephon.executor.pack.lane_store``) shared by
a worker's lanes: one array the lanes append to (one copy a lane and chunk) and one document table sorted by
(lane, stream start). ``pop_rows`` cuts a microbatch's rows in three steps: per row, ``_next`` moves by up to
``max_length`` (integer arithmetic only); then, for all rows at once, one ``searchsorted`` over the table finds
every row's documents and the pieces follow in a fixed number of numpy calls; then the ids are copied into
the microbatch's ``(n, W)`` array — one slice per run of a row's pieces that lie one after another in the
store (a row within one chunk's documents: one slice), whatever the number of documents in the row.

Zero-size documents (an empty text with no BOS/EOS): a row's pieces are the document holding its first token
and every document that starts inside it — at its first token too — so the empty documents between two rows are
the first pieces of the later row, whatever was read when (an empty row at the end of the plan has no pieces).
A row never ends on an empty document (one at its end starts the next row), so the cursor past a row's last
document is past the empty ones before it: a resumed run never hands one out twice.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from zephon.executor.encode.flags import ID
from zephon.executor.pack.lane_store import MASK, SHIFT, LaneStore
from zephon.executor.pack.rows import PIECE_DTYPE, PackedRows

__all__ = ["Lane", "LaneStore", "Snapshot", "cursors_of", "pop_rows"]

#: A lane's counters that its cursor follows from (``Lane.snapshot``): next, end, done, the block being cut and
#: how many of its rows were cut when it was taken (``done`` is updated once the block is cut: ``Lane._done_at``).
Snapshot = tuple[int, int, int | None, int, int]
#: Numbers the calls of ``pop_rows`` (blocks), so that a snapshot reads only its own block's rows.
_BLOCKS = itertools.count()

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
        self._end = 0  # stream index after the last buffered token
        self._next = 0  # stream index of the next token to emit
        self._kept = 0  # stream index of the first token the store must keep (rows cut, not yet copied, hold it)
        self._pushed = False  # a document was pushed this run
        self._cur: tuple[int, int] | None = None  # (position, stream start) of the document holding _next
        #: One past the document of the last piece this lane emitted in this run (None: none yet): its cursor while
        #: its next token lies between documents, when that piece ended its document (set in ``_cut``).
        self._done: int | None = None
        #: The last block (``pop_rows`` call) this lane was cut in, and (row, done) of its rows of it that had
        #: pieces (``_done_at``).
        self._block: tuple[int, list[tuple[int, int]]] = (-1, [])
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
        if self._next == self._end:  # caught up: the next token is this push's, not in the document found before
            self._cur = None
        self.store.append(self.slot, self._end, positions, tokens, sizes)
        self._end += len(tokens)
        first = int(positions[0])
        if self.start_skip and first == self.start_position and not self._pushed:  # resume inside that document
            self._next += min(self.start_skip, int(sizes[0]))
            self._kept, self._cur = self._next, None
        self._pushed = True

    def ready(self) -> bool:
        return self._end - self._next >= self.max_length

    def cursor(self) -> tuple[int, int]:
        """``(position, skip)`` from which this lane's remaining rows are rebuilt (module docstring; before a
        resumed lane emits anything: the cursor it was started from, its skip included). With ``held`` set, the
        cursor as it was when that snapshot was taken (``cursors_of``)."""
        return cursors_of([self])[0]

    def snapshot(self, block: int, rows: int) -> Snapshot:
        """The counters ``cursor`` reads (``held``), taken when ``rows`` rows of ``block`` are cut (``pop_rows``'
        ``mark``)."""
        return self._next, self._end, self._done, block, rows

    def _done_at(self, block: int, rows: int, done: int | None) -> int | None:
        """``_done`` as it was when ``rows`` rows of ``block`` were cut, ``done`` being its value then (set only
        once the whole block is cut: the lane's rows of the block before ``rows`` may have changed it since)."""
        if self._block[0] == block:
            for row, value in reversed(self._block[1]):
                if row < rows:
                    return value
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
    find: list[tuple[int, Lane, int, int | None]] = []  # (index in out, lane, stream index of its next token, done)
    for lane in lanes:
        if lane.held is None:
            nxt, end, done = lane._next, lane._end, lane._done
        else:
            nxt, end, before, block, rows = lane.held
            done = lane._done_at(block, rows, before)
        if nxt >= end:
            out.append(lane._at_rest(done))
        elif lane.held is None and lane._cur is not None:
            position, start = lane._cur
            out.append((position, nxt - start) if nxt > start else lane._at_rest(done))
        else:  # found below
            find.append((len(out), lane, nxt, done))
            out.append((0, 0))
    for store in {id(lane.store): lane.store for _, lane, _, _ in find}.values():
        mine = [f for f in find if f[1].store is store]
        found = store.docs_at([lane.slot for _, lane, _, _ in mine], [nxt for _, _, nxt, _ in mine])
        for (i, lane, nxt, done), (position, start) in zip(mine, found, strict=True):
            out[i] = (position, nxt - start) if nxt > start else lane._at_rest(done)
            if lane.held is None:
                lane._cur = (position, start)
    return out


def pop_rows(
    lanes: list[Lane],
    prepare: Callable[[Lane], None] | None = None,
    *,
    marks: list[int] | None = None,
    mark: Callable[[int, int], None] | None = None,
) -> PackedRows:
    """The next row of each lane in ``lanes`` (in order; a lane may come more than once: its next rows), as one
    ``PackedRows`` (module docstring). ``prepare(lane)`` runs just before each row is cut (``DealLanes``
    buffers enough of the lane there). ``mark(block, rows)`` runs once for each of ``marks`` (increasing row
    counts), when that many rows are cut and the next row's ``prepare`` has not run: where a microbatch of rows cut
    together ends (``LaneBatches`` takes the lanes' snapshots there; ``block`` numbers this call). Lanes of one
    run: same ``max_length``, pad and dtype."""
    n, width = len(lanes), lanes[0].max_length
    block = next(_BLOCKS)
    for lane in lanes:
        lane._block = (block, [])
    lo, hi = [0] * n, [0] * n
    short = []
    marks = marks or []
    m = 0
    for i, lane in enumerate(lanes):  # per row: a few integers (the copies and searches come after, vectorized)
        while m < len(marks) and marks[m] == i:
            mark(block, i)  # type: ignore[misc]
            m += 1
        if prepare is not None:
            prepare(lane)
        a = lane._next
        b = lane._next = min(a + width, lane._end)
        lo[i], hi[i] = lane._key + a, lane._key + b
        if b - a < width:
            short.append((i, b - a))
    while m < len(marks):
        mark(block, marks[m])  # type: ignore[misc]
        m += 1
    tokens = np.empty((n, width), dtype=lanes[0].dtype)
    doc_start = np.zeros((n, width), dtype=bool)
    store = lanes[0].store
    if all(lane.store is store for lane in lanes):
        pieces = _cut(store, lanes, None, np.array((lo, hi), dtype=np.int64), short, tokens, doc_start)
    else:  # lanes of several stores (lanes made one by one): each store's rows, then the pieces in row order
        parts = []
        for s in {id(lane.store): lane.store for lane in lanes}.values():
            mine = [i for i, lane in enumerate(lanes) if lane.store is s]
            bounds = np.array(([lo[i] for i in mine], [hi[i] for i in mine]), dtype=np.int64)
            empty = [(k, m) for k, i in enumerate(mine) for j, m in short if j == i]
            own = [lanes[i] for i in mine]
            parts.append(_cut(s, own, np.array(mine), bounds, empty, tokens, doc_start))
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
    store: LaneStore, lanes: list[Lane], rows: np.ndarray | None, bounds: np.ndarray, short: list[tuple[int, int]],
    out: np.ndarray, doc_start: np.ndarray,
) -> np.ndarray:  # fmt: skip
    """The pieces of ``lanes``' rows — rows ``rows`` of ``out`` (None: 0, 1, ...) — cut from the keys ``bounds``
    (``slot << SHIFT | stream index``: row ``i`` is ``[bounds[0, i], bounds[1, i])``), all in ``store``; their ids
    copied into ``out`` and their document starts marked in ``doc_start``; ``short``: the rows shorter than a full
    row, with their lengths. Each lane's cursor and kept index are updated."""
    key, at, size, position = store.arrays()
    width = out.shape[1]
    # Per row: the documents holding its first and its end token (the last starting at or before it), and the
    # first starting at or after it. Its pieces are from the first starting at its first token (an empty one
    # included), else the one holding it, through the last starting before its end.
    right = key.searchsorted(bounds, side="right") - 1
    left = key.searchsorted(bounds, side="left")
    first = np.minimum(left[0], right[0])
    counts = left[1] - first
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
    pieces["position"] = of = position[doc]
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
    # Cursors (the last row of a lane wins): the document at each row's end token, and one past the document of
    # the row's last piece (``_done``: the cursor if the row ends between documents; else the table's is).
    if len(key):
        held = np.maximum(right[1], 0)
        cur = zip(position[held].tolist(), (key[held] & MASK).tolist(), strict=True)
    else:
        cur = ((0, 0) for _ in lanes)
    last = of[ends - 1].tolist() if total else []  # (an empty row's entry is another row's: never read)
    empty = {i for i, m in short if m == 0}
    for k, (lane, c) in enumerate(zip(lanes, cur, strict=True)):
        lane._cur, lane._kept = c, lane._next
        if total and k not in empty:
            lane._done = last[k] + 1
            lane._block[1].append((k if rows is None else int(rows[k]), last[k] + 1))
    return pieces
