"""One data-parallel rank's run over a plan: which sequences it yields, how, and where it stands.

``RankRunner`` yields this rank's microbatches step by step (``zephon.executor.geometry``):

* exact plans — every sequence is fixed by the plan, so microbatch ``(s, a)`` is built directly from its
  sequence ids (``zephon.executor.exact``), starting anywhere;
* estimated plans — the rank packs only its own lanes (``zephon.executor.lanes``): it reads the plan in
  order from the earliest of its lane cursors, tokenizes only its lanes' documents, and takes row ``j // L``
  of lane ``j % L`` for sequence ``j``.

Sequences past the end of the plan are empty rows (all padding, ``length`` 0, labels ignored), so every
rank yields the same number of microbatches per step. An exact plan has ``ceil(sequences / G)`` steps; an
estimated plan ends on a rank when all its lanes are used up (lanes are balanced in tokens, so ranks end
within a step or so of each other — stop training at a fixed step count below that).

``state()`` says where the rank stands (``zephon.executor.state``); a runner built with that state resumes
exactly there, without replaying the plan.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zephon.errors import ConfigError
from zephon.executor.batch import Batch
from zephon.executor.exact import ExactSequences, check_exact_plan
from zephon.executor.geometry import Geometry
from zephon.executor.lanes import Lane
from zephon.executor.pack import PackedRows, concat_rows
from zephon.executor.plan_reader import PlanBundle, SampleChunk
from zephon.executor.provenance_log import ProvenanceLog
from zephon.executor.read_ahead import ReadAhead, read_ahead_enabled
from zephon.executor.remote_access import RemoteAccess
from zephon.executor.settings import ExecutorSpec, RunStats
from zephon.executor.shard_reader import ShardReader
from zephon.executor.state import STATE_VERSION, check_state
from zephon.executor.tokenize import Encoded, Encoder, tokenizer_threads
from zephon.plan.records import ShardRef


class RankRunner:
    """Iterates one rank's batches of a plan; see the module docstring."""

    def __init__(
        self,
        plan_dir: str | Path,
        spec: ExecutorSpec,
        geometry: Geometry,
        *,
        state: dict[str, Any] | None = None,
        stats: RunStats | None = None,
        worker: tuple[int, int] = (0, 1),
        provenance_dir: str | Path | None = None,
    ) -> None:
        self.plan = PlanBundle(plan_dir)
        self.spec = spec
        self.geometry = geometry
        self.encoder = Encoder(spec.tokenize)
        self.exact = self.plan.manifest.get("kind") == "exact"
        self.stats = stats
        self.worker = worker
        plan_lanes = None if self.exact else int(self.plan.manifest.get("lanes") or 1)
        if geometry.lanes != plan_lanes:
            raise ConfigError(f"geometry lanes must be the plan's {plan_lanes}, got {geometry.lanes}")
        if self.exact:
            check_exact_plan(self.plan, spec, self.encoder)
        elif spec.pack.algorithm != "wrap":
            raise ConfigError(
                f"pack_flat algorithm {spec.pack.algorithm!r} must run on an exact plan, got an estimated plan — "
                "plan with exact_tokens=True"
            )
        self.pad = spec.pack.pad_token_id if spec.pack.pad_token_id is not None else self.encoder.pad_id
        self.provenance_dir = provenance_dir
        self.log: ProvenanceLog | None = None
        self.step, self.micro = 0, 0
        cursors: dict[str, list[int]] = {}
        if state is not None:
            check_state(state, self.identity())
            self.step, self.micro = int(state["step"]), int(state["microbatch"])
            if self.micro and state.get("dp_size") != geometry.dp_size:
                raise ConfigError(
                    f"a state taken mid-step (microbatch {self.micro}) must resume with the same dp_size "
                    f"{state.get('dp_size')}, got {geometry.dp_size} — checkpoint at a step boundary to change it"
                )
            cursors = state["lane_cursors"]
        self.lanes: dict[int, Lane] = {}
        if not self.exact:
            for lane in geometry.my_lanes:
                if state is not None and str(lane) not in cursors:
                    raise ConfigError(
                        f"pipeline state must hold the cursor of lane {lane} for dp_rank {geometry.dp_rank}, got "
                        f"lanes {sorted(map(int, cursors))} — merge all ranks' states (zephon.merge_states) or save "
                        "under torch.distributed, which gathers them"
                    )
                start = tuple(cursors.get(str(lane), (0, 0)))
                self.lanes[lane] = Lane(spec.pack.max_length, self.pad, start=(int(start[0]), int(start[1])))

    def identity(self) -> dict[str, Any]:
        """What a state of this run is valid for."""
        packing = self.plan.manifest.get("packing") or {}
        return {
            "plan": self.plan.manifest["config_hash"],
            "tokenizer": self.encoder.fingerprint,
            "field": self.spec.tokenize.field,
            "max_length": self.spec.pack.max_length,
            "algorithm": packing.get("algorithm", self.spec.pack.algorithm),
            "global_batch": self.geometry.global_batch,
            "lanes": self.geometry.lanes,
        }

    def state(self) -> dict[str, Any]:
        """This rank's position: steps done, microbatches into the current step, its lanes' cursors."""
        return {
            "version": STATE_VERSION,
            **self.identity(),
            "dp_size": self.geometry.dp_size,
            "step": self.step,
            "microbatch": self.micro,
            "lane_cursors": {str(k): list(lane.cursor()) for k, lane in sorted(self.lanes.items())},
        }

    def num_steps(self) -> int | None:
        """Global steps of an exact plan (None for estimated plans, whose end is known only when reached)."""
        if not self.exact:
            return None
        n = int(self.plan.manifest["packing"]["sequences"])
        g = self.geometry.global_batch
        return n // g if self.spec.batch.drop_last else -(-n // g)

    def __iter__(self) -> Iterator[Batch]:
        window = int(self.plan.manifest.get("shuffle", {}).get("window_shards", 1))
        skipped: list[tuple[ShardRef, int, str]] = []  # estimated plans: skipped in the chunk being read
        on_skip = self.stats.skip if self.stats is not None else None
        if not self.exact:  # counted when the chunk is consumed (reading may run ahead on a thread)
            on_skip = lambda ref, row, reason: skipped.append((ref, row, reason))  # noqa: E731
        reader = ShardReader(
            self.plan.shards,
            self.spec.tokenize.field,
            capacity=(window + 1) * len(self.plan.dataset_names),
            per_dataset=window + 1,  # a dataset reads within a window of shards, and crosses into the next
            on_bad_document=self.spec.on_bad_document,  # "skip": estimated plans only (check_exact_plan)
            on_skip=on_skip,
        )
        remote = RemoteAccess(self.plan, self.spec.io, reader)
        if self.provenance_dir is not None:
            self.log = ProvenanceLog(self.provenance_dir, self, worker=self.worker)
        try:
            if self.exact:
                yield from self._exact(reader, remote)
            else:
                yield from self._estimated(reader, remote, skipped)
        finally:
            remote.close()
            if self.log is not None:
                self.log.close()

    def _advance(self) -> tuple[int, int]:
        """The (step, microbatch) to yield now; moves the state past it (state reflects what was yielded)."""
        current = (self.step, self.micro)
        self.micro += 1
        if self.micro == self.geometry.accumulation:
            self.step, self.micro = self.step + 1, 0
        return current

    def _mine(self, step: int, micro: int) -> bool:
        index, count = self.worker
        return (step * self.geometry.accumulation + micro) % count == index

    def _exact(self, reader: ShardReader, remote: RemoteAccess) -> Iterator[Batch]:
        background = read_ahead_enabled() and remote.cache is None  # remote shards: the reader stays on one thread
        sequences = ExactSequences(self.plan, self.encoder, reader, self.pad, background=background)
        try:
            yield from self._exact_loop(sequences, remote)
        finally:
            sequences.close()

    def _exact_loop(self, sequences: ExactSequences, remote: RemoteAccess) -> Iterator[Batch]:
        steps = self.num_steps()
        assert steps is not None
        n = sequences.num_sequences
        while self.step < steps:
            step, micro = self._advance()
            if not self._mine(step, micro):
                continue
            ids = self.geometry.microbatch_sequences(step, micro)
            real = [int(j) for j in ids if j < n]
            if real and remote.cache is not None:
                pieces = sequences.pieces(real[0])
                remote.advance(pieces[0].position if pieces else 0)
            rows = sequences.rows(real) if real else None
            yield self._batch(step, micro, ids, rows)

    def _batch(self, step: int, micro: int, ids: np.ndarray, rows: PackedRows | None) -> Batch:
        """A batch of len(ids) rows: the given rows first, then empty rows for sequences past the plan."""
        width = self.spec.pack.max_length
        tokens = np.full((len(ids), width), self.pad, dtype=np.int64)
        starts = np.zeros((len(ids), width), dtype=bool)
        lengths = np.zeros(len(ids), dtype=np.int64)
        pieces = None
        if rows is not None:
            k = len(rows.lengths)
            tokens[:k], starts[:k], lengths[:k] = rows.tokens, rows.doc_start, rows.lengths
            pieces = rows.pieces
        batch = Batch(
            tokens=tokens, doc_start=starts, lengths=lengths, step=step, microbatch=micro, sequences=ids, pieces=pieces
        )
        if self.log is not None:
            self.log.write(batch)
        return batch

    def _estimated(
        self, reader: ShardReader, remote: RemoteAccess, skipped: list[tuple[ShardRef, int, str]]
    ) -> Iterator[Batch]:
        L = self.geometry.lanes
        assert L is not None
        lanes = self.lanes
        start = min(lane.start_position for lane in lanes.values())
        starts = np.zeros(L, dtype=np.int64)
        for k, lane in lanes.items():
            starts[k] = lane.start_position
        mine = np.zeros(L, dtype=bool)
        mine[list(lanes)] = True
        chunks = self.plan.chunks(self.spec.read_chunk, start=start)
        exhausted = False

        def produce() -> _Read | None:
            """Read and tokenize the next chunk's documents of this rank's lanes, grouped by lane (a stable sort
            keeps plan order within a lane, and each lane then takes one slice). Maybe on the read-ahead thread
            (``zephon.executor.read_ahead``): it alone touches the reader and the chunk iterator, and it hands
            the texts to the encode stage (a Future in ``_Read.encoded``, resolved in order by ``_route``)."""
            nonlocal encoded_once
            chunk: SampleChunk | None = next(chunks, None)
            if chunk is None:
                return None
            remote.advance(chunk.start)
            assert chunk.lane is not None, "estimated plans carry a lane per document"
            positions = chunk.start + np.arange(len(chunk))
            keep = np.flatnonzero(mine[chunk.lane] & (positions >= starts[chunk.lane]))
            texts: list[str] = []
            lost: list[tuple[int, str]] = []  # (position, reason) of the documents skipped in this chunk
            if len(keep):
                texts = reader.texts(chunk.shard_id[keep], chunk.row[keep])  # type: ignore[assignment]
                if self.spec.on_bad_document == "skip":  # a skipped document (None) is not pushed: no tokens
                    kept = [i for i, t in enumerate(texts) if t is not None]
                    if len(kept) < len(texts):
                        why = {(ref.shard_id, row): reason for ref, row, reason in skipped}
                        lost = [
                            (int(chunk.start + keep[i]), why[int(chunk.shard_id[keep[i]]), int(chunk.row[keep[i]])])
                            for i, t in enumerate(texts)
                            if t is None
                        ]
                    keep, texts = keep[kept], [texts[i] for i in kept]
                order = np.argsort(chunk.lane[keep], kind="stable")
                keep, texts = keep[order], [texts[i] for i in order.tolist()]
            taken = skipped[:]
            skipped.clear()
            if not texts:
                return _Read(chunk, keep, None, taken, lost)
            if stage is None or not encoded_once:
                encoded_once = True  # the first chunk verifies the fast engine before any parallel call
                return _Read(chunk, keep, self.encoder.encode_flat(texts), taken, lost)
            return _Read(chunk, keep, stage.submit(self.encoder.encode_flat, texts, split=False), taken, lost)

        threaded = read_ahead_enabled()
        # With read-ahead, tokenizing is a second stage of as many threads as the tokenizer may use: the
        # read-ahead thread hands each chunk's texts to it and goes on reading the next chunk, and each chunk is
        # encoded whole on one thread (one tiktoken call), several chunks at once; the consumer takes them back
        # in order (``_route``). Parquet decoding, tokenizing and packing all overlap, with no barrier inside
        # a chunk. The first chunk is encoded on the read-ahead thread itself, which verifies the fast engine.
        encoded_once = False
        stage = ThreadPoolExecutor(tokenizer_threads(), thread_name_prefix="zephon-encode") if threaded else None
        source: ReadAhead[_Read] = ReadAhead(produce, threaded=threaded)

        def read_more() -> None:
            nonlocal exhausted
            read = source.next()
            if read is None:
                exhausted = True
                for lane in lanes.values():
                    lane.read_to = self.plan.num_documents
                return
            self._route(read)
            for lane in lanes.values():
                lane.read_to = max(lane.read_to, read.chunk.start + len(read.chunk))

        try:
            yield from self._estimated_loop(read_more, lambda: exhausted)
        finally:
            source.close()
            if stage is not None:
                stage.shutdown(wait=True, cancel_futures=True)

    def _estimated_loop(self, read_more: Callable[[], None], exhausted: Callable[[], bool]) -> Iterator[Batch]:
        L = self.geometry.lanes
        assert L is not None
        lanes = self.lanes
        while True:
            if self.micro == 0:
                while not exhausted() and all(lane.buffered == 0 for lane in lanes.values()):
                    read_more()
                if exhausted() and all(lane.buffered == 0 for lane in lanes.values()):
                    return
            step, micro = self._advance()
            ids = self.geometry.microbatch_sequences(step, micro)
            rows = []
            for j in ids.tolist():
                lane = lanes[j % L]
                while not lane.ready() and not exhausted():
                    read_more()
                rows.append(lane.pop_row())
            if self.spec.batch.drop_last and any(int(r.lengths[0]) < self.spec.pack.max_length for r in rows):
                return
            if not self._mine(step, micro):
                continue
            yield self._batch(step, micro, ids, concat_rows(rows))

    def _route(self, read: _Read) -> None:
        """Push a chunk's tokenized documents (grouped by lane) to their lanes; count them and its skips."""
        if self.stats is not None:
            for ref, row, reason in read.skipped:
                self.stats.skip(ref, row, reason)
        if self.log is not None and read.lost:
            self.log.skip(read.lost)
        if read.encoded is None:
            return
        encoded = read.encoded.result() if isinstance(read.encoded, Future) else read.encoded
        chunk, keep, sizes = read.chunk, read.keep, encoded.sizes
        assert chunk.lane is not None
        lane_of = chunk.lane[keep]
        ends = np.cumsum(sizes)
        cuts = np.flatnonzero(np.diff(lane_of)) + 1
        firsts, lasts = [0, *cuts.tolist()], [*cuts.tolist(), len(keep)]
        positions = chunk.start + keep
        for a, b in zip(firsts, lasts, strict=True):
            tokens = encoded.ids[int(ends[a] - sizes[a]) : int(ends[b - 1])]
            self.lanes[int(lane_of[a])].push_many(positions[a:b], tokens, sizes[a:b])
        if self.stats is not None:
            self.stats.add(self.plan.dataset_names, chunk.dataset_id[keep], sizes)


@dataclass(frozen=True, slots=True)
class _Read:
    """One chunk of an estimated plan, read and tokenized: its kept documents (indices into the chunk, grouped
    by lane), their ids in that order, and the documents skipped while reading it (as the reader reported
    them, and by plan position)."""

    chunk: SampleChunk
    keep: np.ndarray
    encoded: Encoded | Future[Encoded] | None
    skipped: list[tuple[ShardRef, int, str]]
    #: ``(position, reason)`` of each document skipped in the chunk, for the provenance log.
    lost: list[tuple[int, str]]


def iterate_batches(plan_dir: str | Path, spec: ExecutorSpec, stats: RunStats | None = None) -> Iterator[Batch]:
    """One rank (dp_size 1, global batch = microbatch) over the whole plan: the simplest use of RankRunner."""
    plan = PlanBundle(plan_dir)
    lanes = None if plan.manifest.get("kind") == "exact" else int(plan.manifest.get("lanes") or 1)
    b = spec.batch.microbatch_size
    geometry = Geometry(microbatch=b, global_batch=b, dp_size=1, dp_rank=0, lanes=lanes)
    return iter(RankRunner(plan_dir, spec, geometry, stats=stats))
