"""One data-parallel rank's run of a record pipeline: which records it yields, how, and where it stands.

The plan is a *samples plan*: each plan position is one record, and global step ``s`` is the ``G`` consecutive
positions ``[s·G, (s+1)·G)`` (``G`` the global batch). Rank ``r`` of ``D`` takes rows ``r, r + D, …`` of each
step, ``B`` per microbatch (``Geometry.microbatch_sequences``, the same split as text rows), so the union of all
ranks' microbatches of a step is the same ``G`` records at any ``D``: elastic data parallelism at step
boundaries, as for text. Mixtures, phases and selections are the plan's: the runner only follows positions.

Per microbatch (``RecordBatch``): the positions' (dataset, shard, row) from samples.parquet (``PlanPositions``),
the rows read whole (``zephon.executor.records.source``), the operators run with each record's position
(``zephon.executor.records.transforms``; seeded ones draw from the plan seed and the position), the survivors
collated (``zephon.executor.records.collate``; every batch must keep the first batch's structure).

Steps: ``ceil(N / G)`` for ``N`` plan positions (``drop_last``: ``floor``); rows past the end are absent, so
the last step's microbatches may hold fewer records, or none (``len(batch) == 0``, ``data == {}``): every rank
still yields the same number of microbatches per step.

State (``zephon.executor.state``): ``step`` and ``microbatch`` and what the state is valid for (plan,
``algorithm: "records"``, global batch, operators); no lane cursors — a position is all a record run needs.
A state at a step boundary resumes at any dp size; mid-step only at the same one.

Packed plans (``Pipeline.pack_samples``, ``zephon.executor.records.packed``): the plan's *rows* take the place of
positions — step ``s`` is rows ``[s·G, (s+1)·G)``, split over ranks the same way — and each microbatch holds its
rows' members, row by row (``RecordBatch.row``: each record's row in the microbatch). The default collate
collates the members as one list; a user collate receives the rows (a list of lists of records).

Example: a plan of 10 records, G = 4, dp 2, B = 1 (accumulation 2). Rank 0 yields positions [0], [2] (step 0),
[4], [6] (step 1), [8], [] (step 2, 10 is past the end); rank 1 yields [1], [3], [5], [7], [9], [].
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from zephon.errors import ConfigError, DatasetError
from zephon.executor.geometry import Geometry
from zephon.executor.operators import Where
from zephon.executor.operators import describe as describe_operators
from zephon.executor.plan_reader import PlanBundle
from zephon.executor.progress import MicrobatchAt, Progress
from zephon.executor.provenance_log import LogHeader, ProvenanceLog
from zephon.executor.read.remote import RemoteAccess
from zephon.executor.read.shard_reader import ShardReader
from zephon.executor.read.skipped_documents import SkippedDocument
from zephon.executor.records.batch import RecordBatch
from zephon.executor.records.collate import RecordError, Structure, default_collate
from zephon.executor.records.packed import PlannedRows
from zephon.executor.records.source import PlanPositions, RecordReader, WholeRecords
from zephon.executor.records.tar import sample_key
from zephon.executor.records.transforms import RecordOperators
from zephon.executor.settings import ExecutorSpec, RunStats
from zephon.executor.state import check_resume, check_resumed_step, rank_state
from zephon.executor.step_arithmetic import steps_in

#: The state's and the identity's ``algorithm`` of a record run: a text state is refused here, and back.
RECORDS = "records"
#: The provenance log's unit of a packed record run: pieces are rows' records (``zephon.inspection.log_check``).
PACKED_ROWS = "rows"


class RecordRunner:
    """Iterates one rank's record batches of a samples plan; see the module docstring."""

    def __init__(
        self,
        plan: PlanBundle,
        spec: ExecutorSpec,
        geometry: Geometry,
        *,
        state: dict[str, Any] | None = None,
        stats: RunStats | None = None,
        worker: tuple[int, int] = (0, 1),
    ) -> None:
        self.plan = plan
        self.spec = spec = spec.ready()
        assert spec.records and spec.batch is not None
        manifest = plan.manifest
        if manifest.exact:
            raise ConfigError(
                "a record pipeline must run a samples plan, got an exact plan (token offsets of a tokenizer) — "
                "plan without exact_tokens, or add .tokenize() and .pack_flat()"
            )
        planned = manifest.sample_packing
        wanted = spec.sample_pack
        if wanted is not None and (
            planned is None or (planned.max_cost, planned.oversize) != (wanted.max_cost, wanted.oversize)
        ):
            got = "no packing" if planned is None else f"max_cost={planned.max_cost}, oversize={planned.oversize!r}"
            raise ConfigError(
                f"pack_samples(max_cost={wanted.max_cost}, oversize={wanted.oversize!r}) must match the plan's "
                f"packing, got {got} in plan {manifest.config_hash[:12]} — drop .pack_samples() to run the plan as "
                "planned, or re-plan with it"
            )
        if geometry.lanes is not None:
            raise ConfigError(f"a record run's geometry must have no packing lanes, got {geometry.lanes}")
        self.geometry = geometry
        self.stats = stats
        self.worker = worker
        self.names = plan.dataset_names
        self.progress = Progress(accumulation=geometry.accumulation)
        if state is not None:
            self.progress.step, self.progress.microbatch = check_resume(state, self.identity(), manifest, geometry)
        self.log: ProvenanceLog | None = None
        self.log_hand_over = False  # a dataloader() worker's: rows go with its pieces (provenance_log)

    def identity(self) -> dict[str, Any]:
        """What a state of this run is valid for (the text identity's keys; no tokenizer, field or row width)."""
        return {
            "plan": self.plan.manifest.config_hash,
            "tokenizer": None,
            "field": None,
            "max_length": None,
            "algorithm": RECORDS,
            "global_batch": self.geometry.global_batch,
            "lanes": None,
            **({"operators": describe_operators(self.spec.operators)} if self.spec.operators else {}),
        }

    def state(self) -> dict[str, Any]:
        """This rank's position: steps done and microbatches into the current step."""
        return rank_state(
            self.identity(),
            dp_size=self.geometry.dp_size,
            microbatch_size=self.geometry.microbatch,
            step=self.progress.step,
            microbatch=self.progress.microbatch,
            lane_cursors={},
        )

    def num_steps(self) -> int:
        """Global steps: the plan's positions over the global batch (``drop_last``: whole steps only)."""
        assert self.spec.batch is not None
        packing = self.plan.manifest.sample_packing
        units = packing.rows if packing is not None else self.plan.num_documents
        return steps_in(units, self.geometry.global_batch, drop_last=self.spec.batch.drop_last)

    def close(self) -> None:
        """Nothing held between iterations (each iteration opens and closes its own reader)."""

    def __iter__(self) -> Iterator[RecordBatch]:
        if self.stats is not None:
            self.stats.include(self.names)
        if self.spec.provenance_dir is not None:
            packed = self.plan.manifest.sample_packing is not None
            header = LogHeader(
                plan=self.plan.manifest.config_hash,
                max_length=max(1, self.plan.num_documents) if packed else 1,  # packed: records a row may hold
                geometry=self.geometry,
                first_step=self.progress.step,
                worker=self.worker[0],
                unit=PACKED_ROWS if packed else RECORDS,
            )
            self.log = ProvenanceLog(self.spec.provenance_dir, header, hand_over=self.log_hand_over)
        skipped: dict[tuple[int, int], str] = {}
        reader = ShardReader(
            self.plan.shards,
            "",
            capacity=(self.plan.manifest.shuffle.window_shards + 1) * len(self.names),
            per_dataset=self.plan.manifest.shuffle.window_shards + 1,
            on_bad_document=self.spec.on_bad_document,
            on_skip=lambda ref, row, reason: skipped.__setitem__((ref.shard_id, row), reason),
            skippable=True,
            convert=WholeRecords(),
            copies=self.plan.copies,
        )
        remote = RemoteAccess(self.plan, self.spec.io, reader)
        source = RecordReader(reader, self.plan.shards, capacity=reader.capacity)
        try:
            yield from self._loop(source, remote, skipped)
        finally:
            source.close()
            remote.close()  # the reader's open shards and the shard cache
            if self.log is not None:
                self.log.close()

    def _loop(
        self, reader: RecordReader, remote: RemoteAccess, skipped: dict[tuple[int, int], str]
    ) -> Iterator[RecordBatch]:
        steps = self.num_steps()
        check_resumed_step(self.progress.step, steps)
        g = self.geometry
        packed = PlannedRows(self.plan) if self.plan.manifest.sample_packing is not None else None
        n = packed.rows if packed is not None else self.plan.num_documents
        first = self.progress.step * g.global_batch
        positions = PlanPositions(self.plan, packed.first_position(first) if packed else first, g.global_batch)
        operators = RecordOperators(self.spec.operators, self.plan.manifest.seed)
        collate = self.spec.collate or default_collate
        shape = Structure(user=self.spec.collate is not None)
        worker, workers = self.worker
        handed = 0  # microbatches of this iteration: a DataLoader takes item k from worker k mod N, from its start
        while self.progress.step < steps:
            at = MicrobatchAt(step=self.progress.step, index=self.progress.microbatch)  # handed out at its yield:
            handed += 1  # an error making it leaves the state at the batch before
            if (handed - 1) % workers != worker:
                self.progress.advance()
                continue
            wanted = g.microbatch_sequences(at.step, at.index)
            real = wanted[wanted < n]
            row_of = None
            if packed is not None:  # the rows' members, row by row
                row_of, real_rows = packed.members(real)
                real, wanted_units = real_rows, real
            datasets, shard_ids, rows = positions.take(real)
            if len(real):
                remote.advance(int(real.min()))
            records = reader.records(shard_ids, rows)
            where = [
                Where(reader.ref(s), r, sample_key(rec))
                for s, r, rec in zip(shard_ids.tolist(), rows.tolist(), records, strict=True)
            ]
            values = operators.run(
                records,
                where,
                real.tolist(),
                report=lambda w, reason, message: self._report(w, reason, message, skipped),
                drop=lambda w: skipped.__setitem__((w.ref.shard_id, w.row), "dropped"),
            )
            kept = [i for i, v in enumerate(values) if v is not None]
            gone = sorted(set(range(len(values))) - set(kept))
            self._skipped(real, where, gone, skipped)
            batch_records = [values[i] for i in kept]
            grouped: list[list[Any]] | None = None
            if row_of is not None and self.spec.collate is not None:  # a user collate receives the rows
                grouped = [[] for _ in wanted_units]
                for i in kept:
                    grouped[int(row_of[i])].append(values[i])
            try:
                collated = grouped if grouped is not None else batch_records
                data = collate(collated) if batch_records else {}
            except RecordError as exc:  # name the record's place: the collate knows only its index
                known = grouped is None and 0 <= exc.index < len(kept)
                raise DatasetError(f"{where[kept[exc.index]]}: {exc}" if known else str(exc)) from None
            if batch_records:
                shape.check(data, f"step {at.step} microbatch {at.index} (positions {real[kept[0]]}…)")
            batch = RecordBatch(
                data=data,
                positions=real[kept],
                datasets=datasets[kept],
                sequences=wanted,
                step=at.step,
                microbatch=at.index,
                row=row_of[kept] if row_of is not None else None,
            )
            if self.log is not None:
                rows = batch.sequences[batch.row] if batch.row is not None else None
                self.log.write_records(at.step, at.index, batch.positions, rows)
            if self.stats is not None:
                self.stats.records_handed_out(self.names, batch.datasets)
            self.progress.advance()
            yield batch

    def _report(self, where: Where, reason: str, message: str, skipped: dict[tuple[int, int], str]) -> None:
        """An operator failed on a record: raise, or (``on_bad_document="skip"``) count it."""
        if self.spec.on_bad_document != "skip":
            raise DatasetError(f'{message}, or skip and count such records with .options(on_bad_document="skip")')
        skipped[(where.ref.shard_id, where.row)] = reason

    def _skipped(
        self,
        real: np.ndarray,
        where: list[Where],
        gone: list[int],
        skipped: dict[tuple[int, int], str],
    ) -> None:
        """Count the microbatch's records that are not in it — skipped by the reader, dropped or failed in an
        operator — in ``stats`` (by reason and shard) and the provenance log's skipped file."""
        documents = []
        for i in gone:
            w = where[i]
            reason = skipped.pop((w.ref.shard_id, w.row), "dropped")
            if self.stats is not None:
                self.stats.skip(w.ref, w.row, reason)
            documents.append(SkippedDocument(ref=w.ref, row=w.row, reason=reason, position=int(real[i])))
        if self.log is not None and documents:
            self.log.skip(documents)
