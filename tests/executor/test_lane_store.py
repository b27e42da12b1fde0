"""Lanes sharing one ``LaneStore``: ``pop_rows`` against a simple reference packer on seeded random document
streams, through segments let go (long documents, short ones), resumes from cursors, flags, empty lanes
and rows that end exactly at a document's end; the lanes' cursors (one by one and together, ``cursors_of``, live
and held at an earlier snapshot) against the reference's."""

from __future__ import annotations

import numpy as np
import pytest

from zephon.executor.encode.flags import FLAGGED, ID, tag
from zephon.executor.pack.lane_store import MIN_ROOM, PERIOD, SHIFT
from zephon.executor.pack.lanes import Lane, LaneStore, cursors_of, cut_block, pop_rows
from zephon.executor.pack.rows import PIECE_DTYPE

PAD = -1


class RefLane:
    """The reference: a lane's stream as a Python list, rows cut by slicing, pieces by walking the documents."""

    def __init__(self) -> None:
        self.docs: list[tuple[int, list]] = []  # (position, tokens)
        self.stream: list = []
        self.next = 0

    def push(self, position: int, tokens: list) -> None:
        self.docs.append((position, tokens))
        self.stream += tokens

    def row(self, width: int) -> tuple[list, list[tuple[int, int, int, int]]]:
        lo, hi = self.next, min(self.next + width, len(self.stream))
        self.next = hi
        pieces, start = [], 0
        for position, tokens in self.docs:
            end = start + len(tokens)
            if hi > lo and start < hi and end > lo:
                pieces.append((max(start, lo) - lo, position, max(start, lo) - start, min(end, hi) - max(start, lo)))
            start = end
        return self.stream[lo:hi], pieces

    def cursor(self) -> tuple[int, int]:
        """Inside a document: it and the tokens emitted; between documents: one past the last one emitted whole
        (however many documents were pushed after it)."""
        start, done = 0, 0
        for position, tokens in self.docs:
            if start < self.next < start + len(tokens):
                return position, self.next - start
            start += len(tokens)
            if start <= self.next:
                done = position + 1
        return done, 0


def _plan(rng: np.random.Generator, lanes: int, documents: int, longest: int) -> list[tuple[int, int, list[int]]]:
    """(position, lane, tokens) of a random plan; every document has at least one token."""
    sizes = rng.integers(1, longest + 1, size=documents)
    lane_of = rng.integers(0, lanes, size=documents)
    return [(p, int(lane_of[p]), rng.integers(0, 1000, size=int(sizes[p])).tolist()) for p in range(documents)]


def _deal(plan, first: int, stop: int, lanes: dict[int, Lane], refs: dict[int, RefLane] | None, dtype) -> None:
    """Documents [first, stop) of the plan to their lanes, one ``push_many`` a lane (as ``DealLanes``)."""
    chunk = [doc for doc in plan[first:stop] if doc[1] in lanes]
    for k, lane in lanes.items():
        mine = [(p, toks) for p, lk, toks in chunk if lk == k]
        if mine:
            ids = np.array([t for _, toks in mine for t in toks], dtype=np.int32)
            tokens = ids if dtype == ID else tag(ids, loss=ids % 2 == 0)
            lane.push_many(np.array([p for p, _ in mine]), tokens, np.array([len(toks) for _, toks in mine]))
    if refs is not None:
        for p, lk, toks in chunk:
            refs[lk].push(p, toks)


def _check(rows, refs: dict[int, RefLane], order: list[int], width: int, flagged: bool, at: int = 0) -> dict:
    """Check ``rows`` against the reference's rows of ``order``; returns the reference's cursors after ``at`` rows."""
    expected_pieces = []
    cursors = {k: r.cursor() for k, r in refs.items()}
    for i, k in enumerate(order):
        tokens, pieces = refs[k].row(width)
        got = rows.tokens[i]["id"] if flagged else rows.tokens[i]
        assert got.tolist() == tokens + [PAD] * (width - len(tokens))
        if flagged:
            assert rows.tokens[i]["flags"].tolist() == [int(t % 2 == 0) for t in tokens] + [0] * (width - len(tokens))
        assert int(rows.lengths[i]) == len(tokens)
        marks = [False] * width
        for offset, _, doc_start, _ in pieces:
            marks[offset] = doc_start == 0
        assert rows.doc_start[i].tolist() == marks
        expected_pieces += [(i, *piece) for piece in pieces]
        if i + 1 == at:
            cursors = {k: r.cursor() for k, r in refs.items()}
    assert rows.pieces.dtype == PIECE_DTYPE
    assert rows.pieces.tolist() == expected_pieces
    return cursors


@pytest.mark.parametrize(
    ("seed", "width", "room", "dtype", "shared"),
    [
        (0, 7, 16, ID, True),
        (1, 16, 64, ID, True),
        (2, 5, 8, FLAGGED, True),
        (3, 33, 1 << 16, ID, True),
        (4, 3, 8, ID, False),
    ],
)
def test_shared_store_rows_match_the_reference_packer_through_released_segments_and_resumes(
    seed, width, room, dtype, shared
) -> None:
    rng = np.random.default_rng(seed)
    num_lanes = 5
    plan = _plan(rng, num_lanes + 1, 400, longest=3 * room if room < 100 else 60)  # lane 5: never held (empty)
    store = LaneStore(dtype)
    lanes = {
        k: Lane(width, PAD, dtype=dtype, store=store if shared else LaneStore(dtype))
        for k in range(num_lanes)
    }
    refs = {k: RefLane() for k in range(num_lanes)}
    dealt = 0
    resumed_at = len(plan) // 2
    while True:
        stop = min(len(plan), dealt + int(rng.integers(1, 40)))
        _deal(plan, dealt, stop, lanes, refs, dtype)
        dealt = stop
        for _ in range(int(rng.integers(0, 4))):
            order = rng.integers(0, num_lanes, size=int(rng.integers(1, 7))).tolist()  # lanes repeat
            at = int(rng.integers(0, len(order) + 1))  # a microbatch of the block ends after this many rows
            block = cut_block(list(lanes.values()), np.array(order), marks=[at])
            cell: list = [block.snapshots[0]]  # one cell for every lane, as DealLanes holds them
            rows, snapshots = block.rows, {k: (cell, i) for i, k in enumerate(lanes)}
            then = _check(rows, refs, order, width, dtype == FLAGGED, at)
            now = {k: r.cursor() for k, r in refs.items()}
            assert {k: lane.cursor() for k, lane in lanes.items()} == now
            assert dict(zip(lanes, cursors_of(list(lanes.values())), strict=True)) == now
            for k, lane in lanes.items():  # held at the counters after ``at`` rows (LaneBatches inside a block)
                lane.held = snapshots[k]
            assert dict(zip(lanes, cursors_of(list(lanes.values())), strict=True)) == then
            assert {k: lane.cursor() for k, lane in lanes.items()} == then
            cell[0] = None  # the block's last microbatch: every lane's own counters again
            assert {k: lane.cursor() for k, lane in lanes.items()} == now
            for lane in lanes.values():
                lane.held = None
        if dealt >= resumed_at and resumed_at:  # resume every lane from its cursor, in a new store
            cursors = {k: lane.cursor() for k, lane in lanes.items()}
            store = LaneStore(dtype)
            lanes = {
                k: Lane(
                    width, PAD, start=cursors[k], dtype=dtype, store=store if shared else LaneStore(dtype)
                )
                for k in range(num_lanes)
            }
            back = min(c[0] for c in cursors.values())
            _deal(plan, back, dealt, lanes, None, dtype)  # the documents from the earliest cursor on, again
            assert {k: lane.cursor() for k, lane in lanes.items()} == cursors
            resumed_at = 0
        if dealt == len(plan):
            break
    while any(lane.buffered for lane in lanes.values()):
        order = list(range(num_lanes))
        _check(pop_rows([lanes[k] for k in order]), refs, order, width, dtype == FLAGGED)
    stores = {id(lane.store): lane.store for lane in lanes.values()}.values()
    assert sum(s.copied for s in stores) == 0  # _deal's arrays: kept as they are, never copied
    last = {k: max(p for p, lk, _ in plan if lk == k) for k in lanes}  # every lane emitted its last document
    assert {k: lane.cursor() for k, lane in lanes.items()} == {k: (last[k] + 1, 0) for k in lanes}


def test_ids_are_kept_not_copied_and_each_lanes_segments_are_let_go_once_it_emitted_them() -> None:
    store = LaneStore(ID)
    lane = Lane(4, PAD, store=store)
    long = np.arange(100, dtype=ID)
    lane.push(0, long)
    assert store.segments[0] is long and store.copied == 0  # the array handed over, as it is
    rows = pop_rows([lane] * 25)
    assert rows.tokens[:25].reshape(-1)[:100].tolist() == list(range(100)) and rows.lengths.tolist() == [4] * 25
    for position in range(1, 200):  # short documents, emitted as they come: only the last ones stay
        lane.push(position, np.full(3, position, dtype=ID))
        if lane.ready():
            assert pop_rows([lane]).tokens.reshape(-1).tolist()[-1] > 0
    assert store.released >= 190 and len(store.segments) <= 2 and store.held() <= 2 * 3 * ID.itemsize
    lane.push(200, np.arange(5))  # int64: not the store's dtype, so copied once into its own
    assert store.copied == 5


def test_a_chunk_stays_in_memory_while_a_lane_reads_its_segment_and_goes_with_the_last_one() -> None:
    """Lanes ``a`` and ``b`` get one chunk's ids as two views of one array: ``a``'s segment is let go when ``a``
    has emitted it, the array stays while ``b`` reads its own segment, and goes when ``b`` has emitted it too."""
    store = LaneStore(ID)
    a, b = Lane(4, PAD, store=store), Lane(4, PAD, store=store)
    chunk = np.concatenate([np.arange(200, 208), np.arange(100, 108)]).astype(ID)
    a.push(0, chunk[:8])
    b.push(1, chunk[8:])
    assert store.held() == chunk.nbytes and store.copied == 0
    assert pop_rows([a, a]).tokens.reshape(-1).tolist() == list(range(200, 208))
    a.push(2, np.arange(300, 304, dtype=ID))  # a appends: its emitted segment is let go
    assert store.released == 1 and store.held() == chunk.nbytes + 4 * ID.itemsize
    assert pop_rows([b, b, a]).tokens.reshape(-1).tolist() == [*range(100, 108), *range(300, 304)]
    b.push(3, np.arange(400, 404, dtype=ID))
    assert store.released == 2 and store.held() == 2 * 4 * ID.itemsize  # the chunk's array is gone


def test_a_lane_far_behind_never_holds_every_chunk_read_meanwhile() -> None:
    """Lane 0 starts with a long document and emits one row a microbatch like the others, so it lags: every chunk
    read meanwhile gives it a slice it reads only much later. Its slices are copied out of each chunk's array
    once the other lanes have let theirs go, so the store holds about 4 times the live segments, not every
    chunk; the rows are the reference packer's."""
    from zephon.executor.pack.lane_store import MIN_LIVE

    width, lanes_n = 8, 16
    store = LaneStore(ID)
    lanes = [Lane(width, PAD, store=store) for _ in range(lanes_n)]
    refs = {k: RefLane() for k in range(lanes_n)}
    rng = np.random.default_rng(3)
    position = 0
    long = rng.integers(0, 1000, size=2000).astype(ID)
    lanes[0].push(position, long)
    refs[0].push(position, long.tolist())
    position += 1
    worst = 0.0
    for _ in range(150):  # chunks: 2 documents a lane, one array, a view for each lane
        sizes = rng.integers(1, 12, size=(lanes_n, 2))
        chunk = rng.integers(0, 1000, size=int(sizes.sum())).astype(ID)
        at = 0
        for k in range(lanes_n):
            n = int(sizes[k].sum())
            lanes[k].push_many(np.array([position, position + 1]), chunk[at : at + n], sizes[k])
            refs[k].push(position, chunk[at : at + int(sizes[k, 0])].tolist())
            refs[k].push(position + 1, chunk[at + int(sizes[k, 0]) : at + n].tolist())
            position, at = position + 2, at + n
        while all(lane.ready() for lane in lanes):
            order = list(range(lanes_n))
            _check(pop_rows(lanes), refs, order, width, False)
        worst = max(worst, store.held() / store.live())
    assert store.copied_out > 0 and store.copied == 0
    assert worst <= 1 / MIN_LIVE + 1, worst  # (+1: a chunk whose lanes have not let go of their segments yet)


def test_ids_in_a_memory_map_are_copied_once_never_kept(tmp_path) -> None:
    """A token store's ids may be a view of a memory-mapped file: kept, a file changed or cut under the run would
    change the ids or end the process at a read — so the store copies them, once."""
    path = tmp_path / "ids.bin"
    np.arange(12, dtype=ID).tofile(path)
    mapped = np.memmap(path, dtype=ID, mode="r")
    store = LaneStore(ID)
    lane = Lane(4, PAD, store=store)
    lane.push(0, mapped[4:12])
    assert store.copied == 8 and not isinstance(store.segments[0].base, np.memmap)
    del mapped
    path.write_bytes(b"")  # the file cut under the run: the rows read the copy
    assert pop_rows([lane, lane]).tokens.reshape(-1).tolist() == list(range(4, 12))


def test_rows_ending_exactly_at_a_document_end_start_the_next_row_at_the_next_document() -> None:
    store = LaneStore(ID)
    lane, other = Lane(4, PAD, store=store), Lane(4, PAD, store=store)
    lane.push_many(np.array([0, 2, 4]), np.array([1, 1, 1, 1, 2, 2, 3, 3]), np.array([4, 2, 2]))
    other.push(1, np.array([9, 9]))
    rows = pop_rows([lane, other, lane])
    assert rows.tokens.tolist() == [[1, 1, 1, 1], [9, 9, PAD, PAD], [2, 2, 3, 3]]
    assert rows.pieces.tolist() == [(0, 0, 0, 0, 4), (1, 0, 1, 0, 2), (2, 0, 2, 0, 2), (2, 2, 4, 0, 2)]
    assert rows.doc_start.tolist() == [[1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 1, 0]]
    assert lane.cursor() == (5, 0) and other.cursor() == (2, 0)  # all emitted: one past each lane's last document


def test_empty_lanes_give_empty_rows_beside_full_ones() -> None:
    store = LaneStore(ID)
    empty, full = Lane(3, PAD, store=store), Lane(3, PAD, store=store)
    full.push(7, np.array([4, 5, 6]))
    rows = pop_rows([empty, full, empty])
    assert rows.tokens.tolist() == [[PAD] * 3, [4, 5, 6], [PAD] * 3] and rows.lengths.tolist() == [0, 3, 0]
    assert rows.pieces.tolist() == [(1, 0, 7, 0, 3)] and rows.doc_start.tolist() == [[0, 0, 0], [1, 0, 0], [0, 0, 0]]


@pytest.mark.parametrize("together", [False, True])
def test_zero_size_documents_between_rows_are_the_next_rows_first_pieces_however_they_were_pushed(together) -> None:
    """Empty documents 2, 3 and 5 lie between the first row and the second: they are its first pieces whether they
    came with the first row's document (``together``: pushed before the lane had emitted it) or after it was
    emitted, and the cursors never depend on what was pushed when: one past the last document emitted whole."""
    lane = Lane(4, PAD, store=LaneStore(ID))
    if together:
        lane.push_many(np.array([1, 2, 3, 5]), np.array([5, 5, 5, 5]), np.array([4, 0, 0, 0]))
    else:
        lane.push(1, np.array([5, 5, 5, 5]))
    assert lane.pop_row().pieces.tolist() == [(0, 0, 1, 0, 4)] and lane.cursor() == (2, 0)
    if not together:
        lane.push_many(np.array([2, 3, 5]), np.array([], dtype=np.int32), np.array([0, 0, 0]))
    lane.push_many(np.array([6, 7]), np.array([7, 7, 8]), np.array([2, 1]))
    assert lane.cursor() == (2, 0)
    row = lane.pop_row()
    assert row.tokens.tolist() == [[7, 7, 8, PAD]] and lane.cursor() == (8, 0)
    assert row.pieces.tolist() == [(0, 0, 2, 0, 0), (0, 0, 3, 0, 0), (0, 0, 5, 0, 0), (0, 0, 6, 0, 2), (0, 2, 7, 0, 1)]
    lane.push(9, np.array([], dtype=np.int32))
    assert lane.cursor() == (8, 0)  # an empty row at the end of the plan has no pieces: 9 is never emitted
    assert lane.pop_row().lengths.tolist() == [0] and lane.cursor() == (8, 0)
    resumed = Lane(4, PAD, start=(2, 0), store=LaneStore(ID))  # from the state after the first row
    resumed.push_many(np.array([2, 3, 5, 6, 7]), np.array([7, 7, 8]), np.array([0, 0, 0, 2, 1]))
    assert resumed.cursor() == (2, 0) and resumed.pop_row().pieces.tolist() == row.pieces.tolist()


def test_a_store_refuses_a_lane_of_another_dtype() -> None:
    with pytest.raises(ValueError, match="a lane's store must hold"):
        Lane(4, PAD, dtype=FLAGGED, store=LaneStore(ID))


def test_rows_of_two_stores_interleaved_keep_their_own_ids() -> None:
    """Lanes of two stores in one microbatch (lanes made one by one): a run of one store's ids never spans a row
    of the other, even where its source and destination advance together across that row."""
    first, second = LaneStore(ID), LaneStore(ID)
    x, z = Lane(4, PAD, store=first), Lane(4, PAD, store=first)
    y, w = Lane(4, PAD, store=second), Lane(4, PAD, store=second)
    x.push(0, np.arange(1, 9))  # first store's ids 0..7: x's two rows; z's next at 8..11, as far as rows 1 → 3
    z.push(1, np.arange(11, 15))
    y.push(2, np.arange(21, 25))
    w.push(3, np.arange(31, 35))
    rows = pop_rows([y, x, w, z])
    assert rows.tokens.tolist() == [[21, 22, 23, 24], [1, 2, 3, 4], [31, 32, 33, 34], [11, 12, 13, 14]]
    assert rows.pieces.tolist() == [(0, 0, 2, 0, 4), (1, 0, 0, 0, 4), (2, 0, 3, 0, 4), (3, 0, 1, 0, 4)]


def test_the_table_forgets_documents_wholly_emitted_when_the_next_chunk_is_sorted_in() -> None:
    """The table keeps only what rows still need, the ids stay where they were handed over."""
    store = LaneStore(ID)
    a, b = Lane(4, PAD, store=store), Lane(4, PAD, store=store)
    a.push_many(np.array([0, 2]), np.array([1, 1, 1, 2, 2, 2]), np.array([3, 3]))
    b.push(1, np.array([9, 9, 9, 9, 9]))
    assert pop_rows([a, b]).tokens.tolist() == [[1, 1, 1, 2], [9, 9, 9, 9]]
    a.push(3, np.array([3, 3]))
    b.push(4, np.array([8]))
    assert store.table()[3].tolist() == [2, 3, 1, 4]  # document 0 wholly emitted: forgotten
    assert (a.cursor(), b.cursor()) == ((2, 1), (1, 4))
    rows = pop_rows([a, b])
    assert rows.tokens.tolist() == [[2, 2, 3, 3], [9, 8, PAD, PAD]] and rows.lengths.tolist() == [4, 2]
    assert rows.pieces.tolist() == [(0, 0, 2, 1, 2), (0, 2, 3, 0, 2), (1, 0, 1, 4, 1), (1, 1, 4, 0, 1)]
    assert a.cursor() == (4, 0) and b.cursor() == (5, 0)


@pytest.mark.parametrize("seed", range(6))
def test_the_table_chunk_by_chunk_is_the_stable_sort_of_every_live_document(seed: int) -> None:
    """``table`` (each lane's region, documents wholly emitted left out) gives the same rows, in the same order,
    as one stable sort by key of every document appended (in append order) that is still live — empty documents
    with equal keys included, lanes' kept indexes moving between chunks, regions laid out again on the way."""

    class Kept:  # what the store reads of a lane
        def __init__(self) -> None:
            self._kept = 0

    rng = np.random.default_rng(seed)
    store = LaneStore(ID)
    lanes = [Kept() for _ in range(5)]
    for lane in lanes:
        store.add(lane)
    ends = [0] * len(lanes)
    appended: list[tuple[np.ndarray, ...]] = []
    position = 0
    for _ in range(12):  # chunks: a run of documents for some lanes, in any lane order
        for slot in rng.permutation(len(lanes))[: rng.integers(1, len(lanes) + 1)].tolist():
            sizes = rng.choice([0, 0, 1, 3, 17], size=rng.integers(1, 9))
            positions = position + np.arange(len(sizes))
            position += len(sizes)
            start = ends[slot]
            store.append(slot, start, positions, np.zeros(int(sizes.sum()), dtype=ID), sizes)
            offsets = np.cumsum(sizes) - sizes
            appended.append(((slot << 40) + start + offsets, sizes, positions))
            ends[slot] += int(sizes.sum())
        for slot, lane in enumerate(lanes):  # rows were cut: kept moves forward, up to the lane's end
            lane._kept = int(rng.integers(lane._kept, ends[slot] + 1))
        key, _, size, pos = store.table()
        all_key, all_size, all_pos = (np.concatenate([a[i] for a in appended]) for i in range(3))
        floor = np.array([lane._kept for lane in lanes])[all_key >> 40]
        start = all_key & ((1 << 40) - 1)
        live = (start + all_size > floor) | (start >= floor)
        order = np.argsort(all_key[live], kind="stable")
        assert key.tolist() == all_key[live][order].tolist()
        assert size.tolist() == all_size[live][order].tolist() and pos.tolist() == all_pos[live][order].tolist()


def test_the_table_stays_sorted_and_is_laid_out_again_rarely_with_lanes_far_apart() -> None:
    """Lanes appended at very different rates (one lane of short documents that it emits as they come, seven
    that buffer long ones): every region's spare entries keep the whole table sorted by key and by (lane,
    position), a layout comes once per thousands of documents, and the table stays O(live documents)."""

    class Kept:  # what the store reads of a lane
        def __init__(self) -> None:
            self._kept = 0

    store = LaneStore(ID)
    lanes = [Kept() for _ in range(8)]
    for lane in lanes:
        store.add(lane)
    ends, position, appended = [0] * 8, 0, 0
    for _ in range(300):  # chunks
        for slot, (count, size) in enumerate([(200, 1)] + [(20, 5)] * 7):
            sizes = np.full(count, size)
            store.append(slot, ends[slot], position + np.arange(count), np.zeros(count * size, dtype=ID), sizes)
            position, ends[slot], appended = position + count, ends[slot] + count * size, appended + count
        lanes[0]._kept = ends[0] - 3  # lane 0 emits nearly all it gets; the others a tenth of theirs
        for slot in range(1, 8):
            lanes[slot]._kept = ends[slot] * 9 // 10
        key, _, _, pos = store.arrays()
        assert (np.diff(key) >= 0).all() and (np.diff((key >> SHIFT << SHIFT) | pos) >= 0).all()
    live = len(store.table()[0])
    assert store.layouts <= appended // 4000, (store.layouts, appended)
    assert len(store.key) <= 3 * live + 2 * PERIOD + 8 * MIN_ROOM, (len(store.key), live)


@pytest.mark.parametrize(("min_room", "period"), [(0, 1), (1, 4)])
def test_rows_match_the_reference_packer_with_the_smallest_rooms(
    monkeypatch: pytest.MonkeyPatch, min_room: int, period: int
) -> None:
    """Regions with no spare room beyond 1.5 × the live documents: the table laid out again many times, mid-row
    and around released segments — the rows, pieces and cursors are still the reference packer's."""
    import zephon.executor.pack.lane_store as lane_store

    monkeypatch.setattr(lane_store, "MIN_ROOM", min_room)
    monkeypatch.setattr(lane_store, "PERIOD", period)
    layouts = []
    original = LaneStore._layout

    def counted(self: LaneStore, *args: object, **kwargs: object) -> None:
        layouts.append(1)
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(LaneStore, "_layout", counted)
    test_shared_store_rows_match_the_reference_packer_through_released_segments_and_resumes(7, 9, 16, ID, True)
    assert len(layouts) >= 10  # laid out again many times (the rows checked through each)
