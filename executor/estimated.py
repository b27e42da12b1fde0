"""The estimated-plan hot path: five stages from plan rows to microbatches, each a small object with named state.

Over 400 lines: the five stages and the four values between them stay in one module so that the worked example
below reads against the code it describes, top to bottom; split, the values would need a module of their own that
both halves import, and the example would describe three files.

An estimated plan fixes which packing lane each document goes to (plan column ``lane``) but not where rows
are cut: a rank cuts the rows of its own lanes at train time (``zephon.executor.pack.lanes``). A document goes
through five stages, each wrapping the one before and handing on one named value per chunk of the plan:

1. ``ReadPlanRows`` reads the plan in order, a chunk of positions at a time, from the earliest cursor of this
   rank's lanes, and keeps the documents of this rank's lanes at or after their lane's cursor → ``PlanRows``.
2. ``FetchTexts`` reads their texts from the shards, drops the documents the skip policy left out, and groups
   the rest by lane (a stable sort: plan order within each lane) → ``ChunkTexts``.
3. ``Tokenize`` encodes the chunk's texts, in calls of at most ``MAX_CHARS`` characters
   (``zephon.executor.encode.slices``) → ``ChunkTokens`` (its encoding may still be running).
4. ``DealLanes`` takes the chunks in plan order and pushes each lane's slice of a chunk to that ``Lane``: kept as
   it is (``zephon.executor.pack.lane_store``), no copy, no Python per document.
5. ``LaneBatches`` builds microbatch ``(step, index)``: for each of its sequences ``j``
   (``zephon.executor.geometry``), the next row of lane ``j % L`` (``zephon.executor.step_arithmetic``), reading
   on until that lane holds a full row or the plan is read to the end → ``LaneMicrobatch``. It pops the rows of a
   *block* of consecutive microbatches in one call (``BLOCK_TOKENS``), in the same order as one microbatch at a
   time, and hands them out one by one; before the block and where each microbatch but the block's last ends, it
   snapshots every lane's counters (``Block.snapshots``), and while that microbatch (before the first: the one
   before the block) is the last handed out, the lanes' cursors are read from that snapshot (``Lane.held``) — so
   a state taken between two batches, or after an error raised for a microbatch not handed out, is the
   one-at-a-time state.
   An iteration's first block is one microbatch (its batch comes as soon as its rows are read), and an error
   reading for a block is raised at the microbatch whose rows needed it, after the ones before it.
   A DataLoader worker holds only the lanes of its ``WorkerShare`` (``zephon.executor.worker_share``): it pops
   rows of those lanes only and yields its own piece of each microbatch (stages 1-3 then read and tokenize only
   those lanes' documents). A run ends after ``num_steps`` steps, the same on every rank
   (``zephon.executor.pack.run_length``); without it (the stage on its own) a step starts only while some lane
   has tokens left, so blocks are one microbatch.

Stages 1-3 are the producer. With read-ahead (``zephon.executor.read.ahead``) they run on the read-ahead
thread, the only one that touches the plan iterator and the shard reader; ``Tokenize`` encodes the first chunk
there (which verifies the fast engine) and hands every later chunk whole to an encode pool, several chunks at
once, so Parquet decoding, tokenizing and packing overlap with no barrier inside a chunk. Stages 4-5 are the
consumer, on the caller's thread, the only one that touches the lanes; it waits on each chunk's encoding in
plan order.

Invariant: lane ``ℓ``'s token stream is the tokenized documents dealt to ``ℓ`` from its cursor on, in plan
order, and sequence ``j`` is row ``j // L`` of lane ``j % L``. The batches therefore depend only on the plan,
the tokenizer, the packing and the cursors — never on the chunk size, the threads or the read-ahead — and so do
the cursors after each batch (``zephon.executor.pack.lanes``: a function of the rows emitted alone).

State: the checkpoint holds only the consumer's — ``Progress`` (microbatches handed out) and every lane's
cursor ``(position, skip)``, which says where its stream resumes (``zephon.executor.state``). The producer's
state is how far it has read (``ReadPlanRows``' chunk iterator, ``FetchTexts``' pending skip reports,
``Tokenize``'s first-call flag and pool); it runs ahead of the consumer, so a resumed run rebuilds it from the
cursors instead of saving it.

Stats (``RunStats``) are the consumer's too, counted when ``LaneBatches`` hands a microbatch out, never when a
chunk is read or dealt: each piece of its rows is looked up in ``DealLanes``' dataset of each position (kept
from the earliest lane cursor on), and the skipped documents dealt so far are counted once a microbatch holds a
later document of their lane (the rest at the end of the plan). So the stats, like the batches, never depend
on the chunk size or the read-ahead.

Worked example: 2 lanes, one rank, ``max_length`` 4, microbatch 2 (one per step). Plan positions 0-3 have
lanes [0, 1, 0, 1] and tokenize to 0: [a a E], 1: [b E], 2: [c E], 3: [d d d E].

* stages 1-2: one chunk, ``keep`` [0, 1, 2, 3] → grouped by lane [0, 2, 1, 3];
* stage 4: lane 0's stream is a a E c E, lane 1's is b E d d d E;
* stage 5: step 0 is sequences [0, 1] = row 0 of lane 0 [a a E c], row 0 of lane 1 [b E d d]; the cursors
  are then (2, 1) and (3, 2). Step 1 is sequences [2, 3] = [E p p p] (length 1) and [d E p p] (length 2),
  padded because the plan is read to the end. No lane has tokens left: the iteration ends, the cursors (3, 0)
  and (4, 0) — one past each lane's last document.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from zephon.executor.block_split import split_block
from zephon.executor.chunk_sizes import CHUNK_UNITS, GROW
from zephon.executor.encode.slices import encode_in_slices
from zephon.executor.encode.text import Encoded, Encoder
from zephon.executor.engines.at_document import AtDocument
from zephon.executor.geometry import Geometry
from zephon.executor.pack.lanes import Block, Lane, Snapshot, cursors_of, cut_block
from zephon.executor.pack.rows import PackedRows
from zephon.executor.pack.run_length import document_units, warn_cut
from zephon.executor.plan_reader import PlanBundle, SampleChunk
from zephon.executor.progress import MicrobatchAt, Progress
from zephon.executor.provenance_log import ProvenanceLog
from zephon.executor.read.ahead import ReadAhead
from zephon.executor.read.remote import RemoteAccess
from zephon.executor.read.shard_reader import ShardReader
from zephon.executor.read.skipped_documents import SkippedDocument, SkipReports
from zephon.executor.settings import RunStats
from zephon.executor.step_arithmetic import lane_of
from zephon.executor.truncations import Truncations
from zephon.executor.worker_share import WorkerShare

#: ``LaneBatches`` pops the rows of several microbatches together, enough for this many tokens (at most
#: ``MAX_BLOCK`` microbatches; one microbatch of this many or more): cutting a block costs ~40 NumPy calls and a
#: few passes over the lanes whatever its rows, so the caller's work a microbatch falls with longer blocks — on
#: the samples plan (8 × 2,049, DeepSeek V4, the consumer alone) ~180 µs a microbatch in blocks of 8 (2^17
#: tokens), ~120 in blocks of 32 (2^19), no lower in blocks of 64 (docs/performance-log.md). A block's rows
#: are buffered at once: 32 microbatches of 8 × 2,049 are ~2.6 MB (int32 ids and a bool a token).
BLOCK_TOKENS = 1 << 19
MAX_BLOCK = 64

# -- the values handed from stage to stage ------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanRows:
    """A chunk of the plan and the documents of it this rank tokenizes: ``keep`` indexes ``chunk``, in plan
    order (its lanes' documents at or after their lane's cursor)."""

    chunk: SampleChunk
    keep: np.ndarray


@dataclass(frozen=True, kw_only=True, slots=True)
class ChunkTexts:
    """A chunk's texts: ``keep`` indexes ``chunk`` grouped by lane (plan order within a lane), ``texts[i]`` is
    the text of document ``keep[i]``; ``skipped`` are the documents the reader skipped while reading them, placed
    at their plan positions and lanes (``zephon.executor.read.skipped_documents``)."""

    chunk: SampleChunk
    keep: np.ndarray
    texts: list[str]
    skipped: tuple[SkippedDocument, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class ChunkTokens:
    """``ChunkTexts`` tokenized: ``encoded`` holds the ids of ``keep``'s documents in that order (None when the
    chunk has none), maybe still being encoded on the encode pool."""

    chunk: SampleChunk
    keep: np.ndarray
    encoded: Future[Encoded] | None
    skipped: tuple[SkippedDocument, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class LaneMicrobatch:
    """A microbatch's rows: ``rows`` row ``i`` is global sequence ``sequences[i]``; ``counted`` holds its rows'
    documents and tokens per dataset (``RunStats.handed_out``, when it is handed out)."""

    at: MicrobatchAt
    sequences: np.ndarray
    rows: PackedRows
    counted: tuple[list[int], list[int]]


# -- producer: stages 1-3 (on the read-ahead thread when there is one) --------------------------------------


class ReadPlanRows:
    """Stage 1: the plan from the earliest cursor of this rank's lanes, a chunk at a time, kept to its lanes.

    State: the chunk iterator (how far the plan is read; ``zephon.executor.chunk_sizes``); ``starts`` and ``mine``
    are fixed at the start.
    """

    def __init__(self, plan: PlanBundle, lanes: dict[int, Lane], *, num_lanes: int, chunk_size: int) -> None:
        self.starts = np.zeros(num_lanes, dtype=np.int64)  # per lane: the first plan position it takes
        self.mine = np.zeros(num_lanes, dtype=bool)  # per lane: whether this rank packs it
        for k, lane in lanes.items():
            self.starts[k] = lane.start_position
        self.mine[list(lanes)] = True
        start = min(lane.start_position for lane in lanes.values())
        units = document_units(plan)  # chunks of small documents take more of them (the plan alone decides)
        self._chunks = plan.chunks(chunk_size, start=start, lanes=num_lanes, units=units, budget=CHUNK_UNITS, grow=GROW)

    def next(self) -> PlanRows | None:
        """The next chunk (None at the end of the plan)."""
        chunk = next(self._chunks, None)
        if chunk is None:
            return None
        assert chunk.lane is not None, "estimated plans carry a lane per document"
        positions = chunk.start + np.arange(len(chunk))
        keep = np.flatnonzero(self.mine[chunk.lane] & (positions >= self.starts[chunk.lane]))
        return PlanRows(chunk=chunk, keep=keep)


class FetchTexts:
    """Stage 2: the texts of a chunk's kept documents, grouped by lane; documents the skip policy left out
    (text None) are dropped — they get no tokens — and their reports placed at their positions and lanes. Under
    ``on_bad_document="raise"`` a bad document is dropped and placed the same way, carrying its error, which
    ``DealLanes`` raises before the first microbatch to reach it (``BadDocuments.defer``): the batches before the
    error are then the same for any read chunk and any DataLoader workers.

    State: the reader's pending skip reports (``reports``, taken by the chunk that caused them).
    """

    def __init__(
        self,
        rows: ReadPlanRows,
        reader: ShardReader,
        remote: RemoteAccess,
        reports: SkipReports,
    ) -> None:
        self.rows = rows
        self.reader = reader
        self.remote = remote
        self.reports = reports  # the reader's on_skip callback fills it

    def next(self) -> ChunkTexts | None:
        """The next chunk's texts (None at the end of the plan)."""
        rows = self.rows.next()
        if rows is None:
            return None
        chunk, keep = rows.chunk, rows.keep
        assert chunk.lane is not None
        self.remote.advance(chunk.start)
        got: list[str | None] = self.reader.texts(chunk.shard_id[keep], chunk.row[keep]) if len(keep) else []
        reports = self.reports.take()
        skipped: tuple[SkippedDocument, ...] = ()
        if len(keep) and reports:  # a text is None only when reported (skipped, dropped, or its error deferred)
            kept = [i for i, t in enumerate(got) if t is not None]
            if len(kept) < len(got):
                report = {(r.ref.shard_id, r.row): r for r in reports}
                skipped = tuple(
                    report[int(chunk.shard_id[k]), int(chunk.row[k])].placed(
                        position=int(chunk.start + k), lane=int(chunk.lane[k])
                    )
                    for k, t in zip(keep.tolist(), got, strict=True)
                    if t is None
                )
            keep, got = keep[kept], [got[i] for i in kept]
        texts: list[str] = []
        if len(keep):
            order = np.argsort(chunk.lane[keep], kind="stable")
            keep, texts = keep[order], [got[i] for i in order.tolist()]  # type: ignore[misc]  # None dropped
        return ChunkTexts(chunk=chunk, keep=keep, texts=texts, skipped=skipped)


class Tokenize:
    """Stage 3: each chunk's texts encoded together (``encode_in_slices``: calls of ≤ 1 Mi characters). Without
    a pool (``threads`` None) on this thread; with one, the first chunk on this thread (it verifies the fast
    engine, which must not run alongside another call) and every later chunk whole on one pool thread, several
    chunks at once.

    State: ``verified`` (the first encoding is done) and the pool.
    """

    def __init__(self, texts: FetchTexts, encoder: Encoder, *, threads: int | None) -> None:
        self.texts = texts
        self.encoder = encoder
        self.verified = False
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="zephon-encode") if threads else None

    def next(self) -> ChunkTokens | None:
        """The next chunk, its encoding submitted (None at the end of the plan)."""
        got = self.texts.next()
        if got is None:
            return None
        encoded: Future[Encoded] | None = None
        if got.texts and (self._pool is None or not self.verified):
            self.verified = True
            encoded = Future()
            encoded.set_result(self._encode(got, split=True))
        elif got.texts:
            assert self._pool is not None
            encoded = self._pool.submit(self._encode, got, split=False)
        return ChunkTokens(chunk=got.chunk, keep=got.keep, encoded=encoded, skipped=got.skipped)

    def _encode(self, got: ChunkTexts, *, split: bool) -> Encoded:
        """The chunk's texts encoded; an error about one document (``AtDocument``) names its dataset, shard and row."""
        try:
            return encode_in_slices(self.encoder, got.texts, split=split)
        except AtDocument as exc:
            i = int(got.keep[exc.index])
            shard, row = int(got.chunk.shard_id[i]), int(got.chunk.row[i])
            raise exc.located(self.texts.reader.ref(shard), row) from None

    def close(self) -> None:
        """Stop the pool (after the producer has stopped): queued encodings are cancelled."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


# -- consumer: stages 4-5 (on the caller's thread) -----------------------------------------------------------


class DealLanes:
    """Stage 4: chunks taken in plan order, each lane's slice pushed to its ``Lane``; skipped documents written
    to the provenance ``log`` and held until ``LaneBatches`` hands out a microbatch past them (``stats``).

    State: the lanes (their buffers and cursors), ``exhausted`` (the plan is read to the end), the dataset of
    every position from the earliest lane cursor on (``dataset_of``: the provenance of the rows, for the
    stats), the documents dealt (``dealt``) and skipped (``skipped``, by reason) so far, and the skipped
    documents not yet counted in ``stats`` (per lane and position).
    """

    def __init__(
        self,
        source: ReadAhead[ChunkTokens],
        lanes: dict[int, Lane],
        *,
        num_documents: int,
        dataset_names: list[str],
        stats: RunStats | None,
        log: ProvenanceLog | None,
        truncations: Truncations | None = None,
    ) -> None:
        self.source = source
        self.truncations = truncations  # the documents max_tokens cut, held until handed out (with stats)
        self.lanes = lanes
        self.exhausted = False
        self.num_documents = num_documents
        self.dataset_names = dataset_names
        self.stats = stats
        self.log = log
        self.dealt = 0  # documents pushed to the lanes (tokenized), this run
        self.skipped: dict[str, int] = {}  # documents the skip policy left out, this run, by reason
        self._ids = np.empty(0, dtype=np.int16)  # dataset of positions [_ids_from, _ids_from + len(_ids))
        self._ids_from: int | None = None
        self._keep_from = 0  # positions before this are no longer needed (set by ``hold``)
        #: Skipped documents not yet counted in ``stats`` (placed: their positions and lanes are set), and bad
        #: documents whose error is raised when a microbatch reaches them (``_fatal``: some are held).
        self._pending: list[SkippedDocument] = []
        self._fatal = False
        self._all = list(lanes.values())  # the lanes in ``lanes``' order: a block's snapshots list each one
        self._index = np.full(max(lanes, default=0) + 1, -1, dtype=np.int64)  # lane id -> index in _all
        self._index[list(lanes)] = np.arange(len(lanes))
        self._hold: list[Snapshot | None] = [None]  # every lane's ``held`` cell: the snapshot their cursors read
        for i, lane in enumerate(self._all):
            lane.held = (self._hold, i)

    @property
    def pending(self) -> bool:
        """Skipped documents are held, not yet counted (``count_skipped``), or a bad document's deferred error."""
        return bool(self._pending) and (self.stats is not None or self._fatal)

    @property
    def empty(self) -> bool:
        """No lane holds a token."""
        return all(lane.buffered == 0 for lane in self.lanes.values())

    def hold_at(self, snapshot: Snapshot | None) -> None:
        """Every lane's cursor read from ``snapshot`` (``Block.snapshots``: the counters where a microbatch of a
        block ended, while it is the last handed out), or from the lanes' own counters (None)."""
        self._hold[0] = snapshot

    def rows(self, lanes: np.ndarray, marks: list[int]) -> Block:
        """The next row of each of ``lanes`` (lane ids, in order), in one buffer (``pack.lanes.cut_block``, with
        every lane's counters where each of ``marks`` rows end): full, or (the plan read to the end) what is left,
        padded; and the error reading on raised with the row that needed it, if any: from that row on nothing
        more is read (those rows are cut from what was buffered, and never handed out) — so ``LaneBatches`` raises
        it where one microbatch at a time would have, after the ones before it."""

        def more() -> bool:
            if self.exhausted:
                return False
            self.fill()
            return True

        return cut_block(self._all, self._index[lanes], more, marks)

    def fill(self) -> None:
        """Deal the next chunk to the lanes (at the end of the plan: ``exhausted``)."""
        got = self.source.next()
        if got is None:
            self.exhausted = True
            return
        self._deal(got)

    def hold(self) -> None:
        """Keep the datasets of positions from the earliest lane cursor on: no later row reaches before it."""
        self._keep_from = min((position for position, _ in cursors_of(list(self.lanes.values()))), default=0)
        if self.truncations is not None:
            self.truncations.drop_before(self._keep_from)

    def dataset_of(self, positions: np.ndarray) -> np.ndarray:
        """The dataset of each plan position (dealt, and not before the cursors at the last ``hold``)."""
        assert self._ids_from is not None or not len(positions), "positions are dealt before they are emitted"
        return self._ids[positions - (self._ids_from or 0)]

    def _remember(self, chunk: SampleChunk) -> None:
        """Add the chunk's datasets to ``_ids``, dropping positions before ``_keep_from``."""
        if self._ids_from is None:
            self._ids_from = chunk.start
        assert chunk.start == self._ids_from + len(self._ids), "chunks are consecutive"
        drop = min(max(0, self._keep_from - self._ids_from), len(self._ids))
        self._ids = np.concatenate([self._ids[drop:], chunk.dataset_id.astype(np.int16, copy=False)])
        self._ids_from += drop

    def count_skipped(self, lanes: np.ndarray, positions: np.ndarray) -> None:
        """Count in ``stats`` the skipped documents a microbatch about to be handed out moves past: those before a
        document it holds in the same lane (``lanes[k]``, ``positions[k]``: the lane and position of its piece
        ``k``). A bad document's deferred error (``on_bad_document="raise"``) is raised there instead, before
        that microbatch: it is the first whose rows would have held the document."""
        if not self.pending or not len(positions):
            return
        reached = {lane: int(positions[lanes == lane].max()) for lane in np.unique(lanes).tolist()}
        rest = []
        for held in self._pending:
            assert held.position is not None and held.lane is not None
            if held.position < reached.get(held.lane, -1):
                self._count(held)
            else:
                rest.append(held)
        self._pending = rest

    def count_all_skipped(self) -> None:
        """At the end of the run: count in ``stats`` every skipped document not counted yet (a deferred error:
        raised, the plan's first)."""
        for held in sorted(self._pending, key=lambda h: h.error is None):  # errors first
            self._count(held)
        self._pending = []

    def _count(self, held: SkippedDocument) -> None:
        if held.error is not None:
            raise held.error
        if self.stats is not None:
            self.stats.skip(held.ref, held.row, held.reason)

    def _deal(self, got: ChunkTokens) -> None:
        chunk = got.chunk
        self._remember(chunk)
        if got.skipped:
            fatal = [doc for doc in got.skipped if doc.error is not None]  # raised where their lane reaches them
            skipped = [doc for doc in got.skipped if doc.error is None] if fatal else got.skipped
            for doc in skipped:
                self.skipped[doc.reason] = self.skipped.get(doc.reason, 0) + 1
            if self.stats is not None:  # held until a microbatch handed out moves past them
                self._pending.extend(skipped)
            if fatal:
                self._fatal = True
                self._pending.extend(fatal)
            if self.log is not None and skipped:
                self.log.skip(tuple(skipped))
        if got.encoded is None:
            return
        encoded = got.encoded.result()
        chunk, keep, sizes = got.chunk, got.keep, encoded.sizes
        assert chunk.lane is not None
        lane_of = chunk.lane[keep]
        if self.truncations is not None and self.stats is not None:
            self.truncations.add(chunk.start + keep, chunk.dataset_id[keep], encoded.cut)
        ends = np.cumsum(sizes)
        cuts = np.flatnonzero(np.diff(lane_of)) + 1  # keep is grouped by lane: one slice per lane
        firsts, lasts = [0, *cuts.tolist()], [*cuts.tolist(), len(keep)]
        positions = chunk.start + keep
        for a, b in zip(firsts, lasts, strict=True):
            tokens = encoded.ids[int(ends[a] - sizes[a]) : int(ends[b - 1])]
            self.lanes[int(lane_of[a])].push_many(positions[a:b], tokens, sizes[a:b])
        self.dealt += len(keep)


class LaneBatches:
    """Stage 5: microbatch ``(step, index)`` is, for each of its sequences ``j``, the next row of lane
    ``j % L``, with the dataset of each of its pieces. Rows are popped only from the lanes ``DealLanes`` holds;
    with a ``share`` (a DataLoader worker) only the rows ``share.rows`` names are yielded, else the whole
    microbatch. The skipped documents it moves past (in their lane) are counted then, and those left when the
    plan is read to the end at the end.

    State: ``progress`` (microbatches handed out; shared with the runner, which saves it).
    """

    def __init__(
        self,
        lanes: DealLanes,
        geometry: Geometry,
        progress: Progress,
        *,
        drop_last: bool,
        max_length: int,
        num_steps: int | None = None,
        share: WorkerShare | None = None,
    ) -> None:
        assert geometry.lanes is not None
        self.lanes = lanes
        self.geometry = geometry
        self.progress = progress
        self.drop_last = drop_last
        self.max_length = max_length
        self.num_steps = num_steps
        self.share = share
        self._held = np.zeros(geometry.lanes, dtype=bool)  # per lane: whether this worker packs it
        self._held[list(lanes.lanes)] = True

    def __iter__(self) -> Iterator[LaneMicrobatch]:
        deal, progress, num_lanes = self.lanes, self.progress, self.geometry.lanes
        assert num_lanes is not None
        blocks = 0  # blocks popped this iteration: the first is one microbatch, handed out as soon as it is read
        while True:
            if progress.microbatch == 0 and self.num_steps is not None and progress.step >= self.num_steps:
                self._end_of_run()  # every rank ends here (``zephon.executor.pack.run_length``)
                return
            if progress.microbatch == 0 and self.num_steps is None:  # a step starts while a lane has tokens
                while not deal.exhausted and deal.empty:
                    deal.fill()
                if deal.exhausted and deal.empty:
                    deal.count_all_skipped()
                    return
            deal.hold()
            running = progress.running
            size, blocks = (1, blocks + 1) if not blocks else (self._block_size(running), blocks)  # first: a batch soon
            # Row k of each: microbatch running + k's sequences, their lanes, whether this worker packs that lane.
            ids = self.geometry.block_sequences(running, size)
            lanes = lane_of(ids, num_lanes)
            held = self._held[lanes]
            ends = np.cumsum(np.count_nonzero(held, axis=1)).tolist()  # the block's rows up to each microbatch's end
            spans = self._spans(held, ends, running)
            rows, failed = None, None  # the rows of the whole block, popped together; an error reading for them
            # The lanes' counters before the block and where each microbatch but the last ends: while microbatch
            # k - 1 is the last handed out (the block's start: the one before it), cursors read snapshot k.
            snapshots: list[Snapshot] = []
            handed: list[tuple[PackedRows, tuple[list[int], list[int]]] | None] = [None] * size
            shorts = [0] * size  # per microbatch: its rows shorter than max_length
            if ends[-1]:
                cut = deal.rows(lanes[held], [0, *ends[:-1]])
                rows, failed, snapshots = cut.rows, cut.failed, cut.snapshots
                deal.hold_at(snapshots[0])  # an error before the first is handed out: the state before the block
                handed = split_block(rows, spans, deal.dataset_of, len(deal.dataset_names))
                below = np.concatenate(([0], np.cumsum(rows.lengths < self.max_length)))[[0, *ends]]
                shorts = np.diff(below).tolist()
            for k in range(size):
                if failed is not None and failed[0] < ends[k]:  # the microbatch whose rows needed it
                    raise failed[1]
                span, got = spans[k], handed[k]
                if span is not None:
                    assert got is not None
                    (lo, hi), (packed, counted) = span[0], got
                    if deal.pending:  # may raise a bad document's deferred error: before this counts as handed out
                        assert packed.pieces is not None
                        deal.count_skipped(lanes[k, lo:hi][packed.pieces["row"]], packed.pieces["position"])
                at = progress.advance()
                short = shorts[k]
                if self.num_steps is None and self.drop_last and short:
                    deal.count_all_skipped()  # the plan is read to the end
                    return
                if self.num_steps is not None and self.drop_last and short and deal.stats is not None:
                    deal.stats.short_rows += short  # a lane ran out before the estimated end
                deal.hold_at(snapshots[k + 1] if k + 1 < len(snapshots) else None)  # None: the lanes' own counters
                if span is not None:
                    yield LaneMicrobatch(at=at, sequences=ids[k, lo:hi], rows=packed, counted=counted)

    def _spans(self, held: np.ndarray, ends: list[int], running: int) -> list[
        tuple[tuple[int, int], tuple[int, int]] | None]:  # fmt: skip
        """Per microbatch of a block (the ``running`` one first; ``held[k]``: which of its sequences' lanes this
        worker packs): the sequences ``[lo, hi)`` of it this worker yields and the rows of the block that hold
        them, or None (``WorkerShare.rows``; without a share or with one worker, all — every lane held,
        microbatch ``k`` is the block's rows ``[k·B, (k+1)·B)``)."""
        b = held.shape[1]
        if self.share is None or self.share.workers == 1:
            assert held.all() and (self.share is None or self.share.pieces == 1)
            return [((0, b), (k * b, (k + 1) * b)) for k in range(len(ends))]
        spans: list[tuple[tuple[int, int], tuple[int, int]] | None] = []
        for k in range(len(ends)):
            piece = self.share.rows(running + k)
            if piece is None:
                spans.append(None)
                continue
            lo, hi = piece
            mine = np.flatnonzero(held[k])
            at = int(np.searchsorted(mine, lo))  # the piece's rows are held (the worker packs their lanes)
            assert mine[at : at + hi - lo].tolist() == list(range(lo, hi))
            first = ends[k] - len(mine) + at
            spans.append(((lo, hi), (first, first + hi - lo)))
        return spans

    def _block_size(self, running: int) -> int:
        """Microbatches whose rows are popped together (``BLOCK_TOKENS``, at most ``MAX_BLOCK``): 1 without
        ``num_steps`` (a step starts only while a lane has tokens), never past the run's last microbatch."""
        if self.num_steps is None:
            return 1
        left = self.num_steps * self.progress.accumulation - running
        return max(1, min(left, MAX_BLOCK, -(-BLOCK_TOKENS // (self.geometry.microbatch * self.max_length))))

    def _end_of_run(self) -> None:
        """At ``num_steps``: without ``drop_last``, read this rank's lanes to the end of the plan and count in
        ``stats.lanes_cut`` those still holding tokens, with a ``ShortRunWarning`` (the estimate fell short: never
        silent); then count the skipped documents not counted yet."""
        deal = self.lanes
        if not self.drop_last:
            while not deal.exhausted:
                deal.fill()
            if deal.stats is not None:
                deal.stats.lanes_cut += sum(lane.buffered > 0 for lane in deal.lanes.values())
                deal.stats.tokens_cut += sum(lane.buffered for lane in deal.lanes.values())
            warn_cut({k: lane.buffered for k, lane in deal.lanes.items()}, self.num_steps or 0)
        deal.count_all_skipped()
