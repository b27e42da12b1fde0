"""One data-parallel rank's run over a plan: which sequences it yields, how, and where it stands.

``RankRunner`` yields this rank's microbatches step by step (``zephon.executor.geometry``):

* exact plans — every sequence is fixed by the plan, so microbatch ``(s, a)`` is built directly from its
  sequence ids (``zephon.executor.exact``), starting anywhere;
* estimated plans — the rank packs only its own lanes (``zephon.executor.pack.lanes``): it reads the plan in
  order from the earliest of its lane cursors, tokenizes only its lanes' documents, and takes row ``j // L``
  of lane ``j % L`` for sequence ``j`` — a chain of stages, from plan rows to microbatches
  (``zephon.executor.estimated``).

Sequences past the end of the plan are empty rows (all padding, ``length`` 0, labels ignored), so every
rank yields the same number of microbatches per step. Every rank yields ``num_steps()`` steps: an exact plan
has ``ceil(sequences / G)`` (``floor`` with ``drop_last``); an estimated plan the number
``zephon.executor.pack.run_length`` computes from the plan and a calibration every rank measures alike.

``state()`` says where the rank stands (``zephon.executor.state``): its ``Progress``
(``zephon.executor.progress``) and, for estimated plans, its lanes' cursors; a runner built with that state
resumes exactly there, without replaying the plan.

``stats`` (``RunStats``) count each batch as it is handed out, by the dataset of each piece of its rows. Under
``on_bad_document="skip"`` a run that read its whole share from the start and packed none of it — every
document skipped — ends with a ``DatasetError`` counting the skips by reason, instead of yielding nothing.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from zephon.errors import ConfigError
from zephon.executor.batch import Batch
from zephon.executor.encode.encoders import AnyEncoder, carries_flags, for_stores, make_encoder, masks_loss
from zephon.executor.encode.flags import filled, token_dtype, untag
from zephon.executor.encode.slices import encode_in_slices
from zephon.executor.engines.at_document import AtDocument
from zephon.executor.estimated import DealLanes, FetchTexts, LaneBatches, ReadPlanRows, Tokenize
from zephon.executor.exact import ExactSequences
from zephon.executor.exact_checks import check_exact_plan
from zephon.executor.exact_chunks import exact_microbatches
from zephon.executor.geometry import Geometry, packing_lanes
from zephon.executor.operators import describe as describe_operators
from zephon.executor.operators import expect_outputs, outputs_digest, resumed_length
from zephon.executor.pack.calibration import calibration_documents
from zephon.executor.pack.lanes import Lane, LaneStore, cursors_of
from zephon.executor.pack.rows import PackedRows
from zephon.executor.pack.run_length import Ratios, estimated_steps, lane_units
from zephon.executor.plan_reader import PlanBundle
from zephon.executor.progress import MicrobatchAt, Progress
from zephon.executor.provenance_log import LogHeader, ProvenanceLog
from zephon.executor.read.ahead import ReadAhead, read_ahead_enabled
from zephon.executor.read.bad_documents import all_skipped
from zephon.executor.read.remote import RemoteAccess
from zephon.executor.read.shard_reader import ShardReader
from zephon.executor.read.shared_groups import SharedRowGroups
from zephon.executor.read.skipped_documents import SkipReports
from zephon.executor.settings import Counted, ExecutorSpec, RunStats
from zephon.executor.shard_access import ShardAccess
from zephon.executor.state import check_resume, check_resumed_step, rank_state
from zephon.executor.step_arithmetic import steps_in
from zephon.executor.token_stores.identity import check_store_tokenizers
from zephon.executor.truncations import Truncations
from zephon.executor.worker_share import WorkerShare, worker_share


class RankRunner:
    """Iterates one rank's batches of a plan; see the module docstring."""

    def __init__(
        self,
        plan_dir: str | Path | PlanBundle,
        spec: ExecutorSpec,
        geometry: Geometry,
        *,
        encoder: AnyEncoder | None = None,
        state: dict[str, Any] | None = None,
        stats: RunStats | None = None,
        worker: tuple[int, int] = (0, 1),
        pieces: int = 1,
        known_steps: int | None = None,
        known_outputs: str | None = None,
    ) -> None:
        """``known_steps``, ``known_outputs``: ``num_steps()`` and ``outputs`` as an earlier runner of the same plan,
        spec and geometry measured them (``Pipeline.num_steps()`` then iterating: the calibration runs once).
        ``plan_dir`` may be a bundle already opened and ``encoder`` one already built for ``spec`` (a pipeline opens
        each once per process). ``worker`` is ``(w, N)`` of a DataLoader worker and ``pieces`` the items per
        microbatch: the runner builds and yields only that worker's share (``zephon.executor.worker_share``)."""
        self.plan = plan_dir if isinstance(plan_dir, PlanBundle) else PlanBundle(plan_dir)
        self.spec = spec = spec.ready()
        self.geometry = geometry
        if encoder is None:
            encoder = make_encoder(spec.tokenize, spec.operators, threads=spec.tokenizer_threads)
        self.encoder = encoder = for_stores(encoder, self.plan.manifest.datasets)  # a store's loss mask: flagged ids
        self.flags, self.masks_loss = carries_flags(encoder), masks_loss(encoder)  # ids carry loss/segment bits
        self.exact = self.plan.manifest.exact
        self.stats, self.worker = stats, worker
        manifest = self.plan.manifest
        lanes = packing_lanes(exact=manifest.exact, plan_lanes=manifest.lanes, global_batch=geometry.global_batch)
        if geometry.lanes != lanes:
            raise ConfigError(f"geometry lanes must be {lanes} for this plan and global batch, got {geometry.lanes}")
        if self.exact:
            check_exact_plan(self.plan, spec, self.encoder)
        elif spec.pack.algorithm != "wrap":
            raise ConfigError(
                f"pack_flat algorithm {spec.pack.algorithm!r} must run on an exact plan, got an estimated plan — "
                "plan with exact_tokens=True"
            )
        # a token store's ids must be read with the tokenizer they were made with: refused before the first batch
        check_store_tokenizers(self.plan.manifest.datasets, self.encoder, spec.tokenize.tokenizer_id)
        self.pad = spec.pack.pad_token_id if spec.pack.pad_token_id is not None else self.encoder.pad_id
        self.log: ProvenanceLog | None = None
        self.log_hand_over = False  # a dataloader() worker's: rows go with its pieces (provenance_log)
        self.progress = Progress(accumulation=geometry.accumulation)
        self.names = self.plan.dataset_names
        self._num_steps: int | None = known_steps
        #: What the operators made of the calibration documents (``operators.outputs_digest``), once measured.
        self.outputs: str | None = known_outputs
        self._identity: dict[str, Any] | None = None
        self._access: ShardAccess | None = None  # opened on first use: calibration and run share it
        self.shared_groups: SharedRowGroups | None = None  # a DataLoader worker's row groups, shared with the rest
        self._release: weakref.finalize | None = None
        self.truncations = Truncations()  # documents max_tokens cut, counted as handed out (each iteration anew)
        cursors: dict[str, list[int]] = {}
        if state is not None:
            self.progress.step, self.progress.microbatch = check_resume(state, self.identity(), manifest, geometry)
            cursors = state["lane_cursors"]
            known = state.get("num_steps")  # the run's length, computed when it started: a resume skips it
            own = state.get("plan") == manifest.config_hash  # a parent's state (continued plan) knows another length
            if not self.exact and own and isinstance(known, dict) and known.get("drop_last") == spec.batch.drop_last:
                self._num_steps, self.outputs = resumed_length(known, self.outputs)
        #: Whether this run starts at the beginning of the plan (the all-skipped check needs the whole share).
        self.from_start = self.progress.step == 0 and self.progress.microbatch == 0
        #: This DataLoader worker's part of the rank's run, counted from where the run starts.
        self.share: WorkerShare = worker_share(
            geometry, worker=worker[0], workers=worker[1], pieces=pieces, first=self.progress.running
        )
        self.lanes: dict[int, Lane] = {}
        if not self.exact:
            assert self.share.lanes is not None
            store = LaneStore(token_dtype(self.encoder))  # one token array for this worker's lanes
            for lane in self.share.lanes:
                if state is not None and str(lane) not in cursors:
                    raise ConfigError(
                        f"pipeline state must hold the cursor of lane {lane} for dp_rank {geometry.dp_rank}, got "
                        f"lanes {sorted(map(int, cursors))} — merge all ranks' states (zephon.merge_states) or save "
                        "under torch.distributed, which gathers them"
                    )
                start = tuple(cursors.get(str(lane), (0, 0)))
                at = (int(start[0]), int(start[1]))
                self.lanes[lane] = Lane(spec.pack.max_length, self.pad, start=at, dtype=store.dtype, store=store)
        #: The lanes in a state's order and their keys (made once: a state is taken after every microbatch).
        self._keys, self._ordered = [str(k) for k in sorted(self.lanes)], [self.lanes[k] for k in sorted(self.lanes)]

    def identity(self) -> dict[str, Any]:
        """What a state of this run is valid for (made once: every microbatch's state copies it)."""
        if self._identity is None:
            self._identity = self._make_identity()
        return self._identity

    def _make_identity(self) -> dict[str, Any]:
        packing = self.plan.manifest.packing
        return {
            "plan": self.plan.manifest.config_hash,
            "tokenizer": self.encoder.fingerprint,
            "field": self.spec.tokenize.field,
            "max_length": self.spec.pack.max_length,
            "algorithm": packing.algorithm if packing is not None else self.spec.pack.algorithm,
            "global_batch": self.geometry.global_batch,
            "lanes": self.geometry.lanes,
            # only with user operators: states of pipelines without them are as they were
            **({"operators": describe_operators(self.spec.operators)} if self.spec.operators else {}),
        }

    def state(self) -> dict[str, Any]:
        """This rank's position: steps done, microbatches into the current step, its lanes' cursors."""
        return rank_state(
            self.identity(),
            dp_size=self.geometry.dp_size,
            microbatch_size=self.geometry.microbatch,
            step=self.progress.step,
            microbatch=self.progress.microbatch,
            lane_cursors=dict(zip(self._keys, map(list, cursors_of(self._ordered)), strict=True)),
            **self._known_length(),
        )

    def _known_length(self) -> dict[str, Any]:
        """``num_steps`` for a state of an estimated plan, once computed (a resume then skips computing it)."""
        if self.exact or self._num_steps is None:
            return {}
        outputs = {"outputs": self.outputs} if self.outputs is not None else {}
        return {"num_steps": {"steps": self._num_steps, "drop_last": self.spec.batch.drop_last, **outputs}}

    def num_steps(self) -> int:
        """Global steps of the run, the same on every rank: an exact plan's sequences over the global batch; an
        estimated plan's from its lanes' planned units and a calibration every rank measures alike
        (``zephon.executor.pack.run_length``)."""
        if self._num_steps is None:
            if self.exact:
                n = self.plan.manifest.exact_packing().sequences
                self._num_steps = steps_in(n, self.geometry.global_batch, drop_last=self.spec.batch.drop_last)
            else:
                units, g = lane_units(self.plan, self.geometry.lanes or 1), self.geometry
                measured, known = self._calibrate()
                self._num_steps = estimated_steps(
                    units, measured, self.spec.pack.max_length, global_batch=g.global_batch,
                    drop_last=self.spec.batch.drop_last, known=known,
                )  # fmt: skip
        return self._num_steps

    def _calibrate(self) -> tuple[Ratios, np.ndarray | None]:
        """Tokens per planned unit over the plan's first documents (``zephon.executor.pack.calibration``): the same
        documents, so the same ratio, on every rank; and each lane's real tokens when those documents are the whole
        plan (else None). Documents the skip policy or the operators leave out count as 0 tokens of their units.
        They are read through the run's own shard access, so the run decodes them once
        (``zephon.executor.shard_access``)."""
        access = self._shards()
        first = calibration_documents(self.plan, max_shards=access.reader.capacity)  # the shards it holds open
        texts = access.calibration_texts(first.shard_id, first.row)
        kept = [i for i, t in enumerate(texts) if t is not None]
        docs, step = [texts[i] for i in kept], self.spec.read_chunk  # encoded a chunk at a time, as the run does:
        sizes = []  # (one call held every id at once)
        for k in range(0, len(docs), step):
            try:
                sizes.append(encode_in_slices(self.encoder, docs[k : k + step]).sizes)  # type: ignore[arg-type]
            except AtDocument as exc:  # the spot check or a lone surrogate: name the document
                i = kept[k + exc.index]
                raise exc.located(access.reader.ref(int(first.shard_id[i])), int(first.row[i])) from None
        real = np.concatenate(sizes) if sizes else np.zeros(0, np.int64)
        lanes = self.geometry.lanes or 1  # every lane's real tokens, when these are every document of the plan
        known = np.bincount(first.deal[kept] % lanes, real, lanes).astype(np.int64) if first.whole else None
        if self.spec.operators:  # what they made of these documents, as in the state's process? (outputs_digest)
            self.outputs = expect_outputs(self.outputs, outputs_digest(kept, real))
        every = np.zeros(len(texts), np.int64)  # a document skipped or dropped trains on none of its planned units
        every[kept] = real
        names, field = self.plan.dataset_names, self.spec.tokenize.field
        return Ratios.measure(every, first.units, first.dataset, len(names), field=field, kept=len(kept)), known

    def _shards(self) -> ShardAccess:
        """The run's shard reader and remote access, opened on first use (see ``close``)."""
        if self._access is None:
            self._access = ShardAccess(self.plan, self.spec, self.encoder, stats=self.stats)
            self._access.reader.attach_share(self.shared_groups)  # None outside a DataLoader worker
            self._release = weakref.finalize(self, self._access.close)  # a runner dropped without iterating
        return self._access

    @property
    def reader(self) -> ShardReader | None:  # the shard reader while the access is open (pins, decoded row groups)
        return self._access.reader if self._access is not None else None

    def close(self) -> None:
        """Release the shard access (open shards, shard cache pins): at the end of an iteration, or after a
        ``num_steps()`` that is not followed by one. A later use opens it again."""
        if self._release is not None:
            self._release()  # runs ShardAccess.close once
        self._access, self._release = None, None
        self.encoder.close()  # the encoder's threads (made anew by the next use)

    def __iter__(self) -> Iterator[Batch]:
        if self.stats is not None:
            self.stats.include(self.plan.dataset_names)
        access = self._shards()  # already open if num_steps() calibrated: the run reuses its decoded shards
        self.truncations = Truncations()
        if self.spec.provenance_dir is not None:
            header = LogHeader(
                plan=self.identity()["plan"],
                max_length=self.spec.pack.max_length,
                geometry=self.geometry,
                first_step=self.progress.step,
                worker=self.worker[0],
            )
            self.log = ProvenanceLog(self.spec.provenance_dir, header, hand_over=self.log_hand_over)
        try:
            if self.exact:
                yield from self._exact(access.reader, access.remote)
            else:
                yield from self._estimated(access.reader, access.remote, access.reports)
            if self.stats is not None and not self.stats.tokenizer_engine and self.encoder.settled:
                self._note_engine()  # a run that ended before its first batch was handed out
        finally:
            if self.stats is not None:
                spot = self.encoder.spot_check
                self.stats.spot_checked, self.stats.spot_check_seconds = spot.documents, spot.seconds
            self.close()
            if self.log is not None:
                self.log.close()

    def _note_engine(self) -> None:
        assert self.stats is not None
        self.stats.tokenizer_engine = self.encoder.engine
        self.stats.refused_engines = self.encoder.refused

    def _exact(self, reader: ShardReader, remote: RemoteAccess) -> Iterator[Batch]:
        background = read_ahead_enabled() and remote.cache is None  # remote shards: the reader stays on one thread
        sequences = ExactSequences(
            self.plan, self.encoder, reader, self.pad, background=background,
            truncations=self.truncations if self.stats is not None else None,  # counted in stats only
        )  # fmt: skip
        try:
            yield from self._exact_loop(sequences, remote)
        finally:
            sequences.close()

    def _exact_loop(self, sequences: ExactSequences, remote: RemoteAccess) -> Iterator[Batch]:
        """The share's microbatches, built a chunk at a time (``zephon.executor.exact_chunks``)."""
        steps = self.num_steps()
        assert steps is not None
        check_resumed_step(self.progress.step, steps)
        chunks = exact_microbatches(sequences, self.progress, self.share, self.geometry, steps=steps, remote=remote)
        for at, ids, rows, datasets in chunks:
            yield self._batch(at, ids, rows, datasets)

    def _batch(self, at: MicrobatchAt, ids: np.ndarray, rows: PackedRows | None, datasets: Counted | None) -> Batch:
        """A batch of len(ids) rows: the given rows first, then empty rows for sequences past the plan; counted
        in ``stats`` as it is handed out (``datasets``: of the rows' pieces, ``RunStats.handed_out``)."""
        width = self.spec.pack.max_length
        pieces = None if rows is None else rows.pieces
        if rows is not None and len(rows.lengths) == len(ids):  # every row real: the rows are the batch's arrays
            tokens, starts, lengths = rows.tokens, rows.doc_start, rows.lengths
        else:  # rows past the end of the plan: empty (padding, length 0)
            tokens = filled((len(ids), width), self.pad, token_dtype(self.encoder))
            starts = np.zeros((len(ids), width), dtype=bool)
            lengths = np.zeros(len(ids), dtype=np.int64)
            if rows is not None:
                k = len(rows.lengths)
                tokens[:k], starts[:k], lengths[:k] = rows.tokens, rows.doc_start, rows.lengths
        loss_mask = None
        if self.flags:
            tokens, starts, loss_mask = untag(tokens, starts, self.masks_loss)
        batch = Batch(
            tokens=tokens,
            doc_start=starts,
            lengths=lengths,
            step=at.step,
            microbatch=at.index,
            sequences=ids,
            pieces=pieces,
            loss_mask=loss_mask,
        )
        if self.log is not None:
            self.log.write(batch)
        if self.stats is not None:
            if not self.stats.tokenizer_engine and self.encoder.settled:
                self._note_engine()
            if pieces is not None and datasets is not None:
                self.stats.handed_out(self.names, datasets, pieces)
                self.truncations.count(self.stats, self.names, pieces)
        return batch

    def _estimated(self, reader: ShardReader, remote: RemoteAccess, reports: SkipReports) -> Iterator[Batch]:
        """The stages of ``zephon.executor.estimated``, the first three on the read-ahead thread if enabled."""
        L = self.geometry.lanes
        assert L is not None
        steps = self.num_steps()  # before any thread starts: its calibration may raise (a bad document)
        check_resumed_step(self.progress.step, steps)
        threaded = read_ahead_enabled()
        rows = ReadPlanRows(self.plan, self.lanes, num_lanes=L, chunk_size=self.spec.read_chunk)
        reader.bad_documents.defer = True  # under "raise": a bad document's error raised where its lane reaches it
        texts = FetchTexts(rows, reader, remote, reports)
        tokens = Tokenize(texts, self.encoder, threads=self.encoder.threads if threaded else None)
        source = ReadAhead(tokens.next, threaded=threaded)
        lanes = DealLanes(
            source, self.lanes, num_documents=self.plan.num_documents, dataset_names=self.plan.dataset_names,
            stats=self.stats, log=self.log, truncations=self.truncations,
        )  # fmt: skip
        batches = LaneBatches(
            lanes, self.geometry, self.progress, drop_last=self.spec.batch.drop_last,
            max_length=self.spec.pack.max_length, num_steps=steps, share=self.share,
        )  # fmt: skip
        try:
            for microbatch in batches:
                yield self._batch(microbatch.at, microbatch.sequences, microbatch.rows, microbatch.counted)
        finally:
            source.close()  # the producer stops first, then the encode pool it feeds
            tokens.close()
        if lanes.skipped and not lanes.dealt and self.from_start:
            g = self.geometry
            share = f"dp_rank {g.dp_rank}'s share (dp_size {g.dp_size})" if g.dp_size > 1 else "the plan"
            raise all_skipped(lanes.skipped, share, self.spec.tokenize.field)


def iterate_batches(plan_dir: str | Path, spec: ExecutorSpec, stats: RunStats | None = None) -> Iterator[Batch]:
    """One rank (dp_size 1, global batch = microbatch) over the whole plan: the simplest use of RankRunner."""
    manifest = PlanBundle(plan_dir).manifest
    spec = spec.ready()
    assert spec.batch is not None
    b = spec.batch.microbatch_size
    geometry = Geometry.for_plan(
        microbatch=b, global_batch=b, dp_size=1, dp_rank=0, exact=manifest.exact, plan_lanes=manifest.lanes
    )
    return iter(RankRunner(plan_dir, spec, geometry, stats=stats))
