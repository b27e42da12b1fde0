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

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from zephon.errors import ConfigError
from zephon.executor.batch import Batch
from zephon.executor.engine import ExecutorSpec, RemoteAccess, RunStats, check_exact_plan
from zephon.executor.exact import ExactSequences
from zephon.executor.geometry import Geometry
from zephon.executor.lanes import Lane
from zephon.executor.pack import PackedRows, concat_rows
from zephon.executor.plan_reader import PlanBundle, SampleChunk
from zephon.executor.provenance import ProvenanceLog
from zephon.executor.shard_reader import ShardReader
from zephon.executor.state import STATE_VERSION, check_state
from zephon.executor.tokenize import Encoder


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
        reader = ShardReader(
            self.plan.shards,
            self.spec.tokenize.field,
            capacity=(window + 1) * len(self.plan.dataset_names),
            on_bad_document=self.spec.on_bad_document,  # "skip": estimated plans only (check_exact_plan)
            on_skip=self.stats.skip if self.stats is not None else None,
        )
        remote = RemoteAccess(self.plan, self.spec.io, reader)
        if self.provenance_dir is not None:
            self.log = ProvenanceLog(self.provenance_dir, self, worker=self.worker)
        try:
            if self.exact:
                yield from self._exact(reader, remote)
            else:
                yield from self._estimated(reader, remote)
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
        sequences = ExactSequences(self.plan, self.encoder, reader, self.pad)
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
        batch = Batch(tokens=tokens, doc_start=starts, lengths=lengths, step=step, microbatch=micro, sequences=ids,
                      pieces=pieces)
        if self.log is not None:
            self.log.write(batch)
        return batch

    def _estimated(self, reader: ShardReader, remote: RemoteAccess) -> Iterator[Batch]:
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
        names = self.plan.dataset_names
        exhausted = False

        def read_more() -> None:
            nonlocal exhausted
            chunk: SampleChunk | None = next(chunks, None)
            if chunk is None:
                exhausted = True
                for lane in lanes.values():
                    lane.read_to = self.plan.num_documents
                return
            remote.advance(chunk.start)
            assert chunk.lane is not None, "estimated plans carry a lane per document"
            positions = chunk.start + np.arange(len(chunk))
            keep = np.flatnonzero(mine[chunk.lane] & (positions >= starts[chunk.lane]))
            if len(keep):
                texts = reader.texts(chunk.shard_id[keep], chunk.row[keep])
                if self.spec.on_bad_document == "skip":  # a skipped document (None) is not pushed: no tokens
                    read = [i for i, t in enumerate(texts) if t is not None]
                    keep, texts = keep[read], [texts[i] for i in read]
                docs = self.encoder.encode(texts)
                for i, doc in zip(keep.tolist(), docs, strict=True):
                    lanes[int(chunk.lane[i])].push(int(positions[i]), doc)
                if self.stats is not None:
                    lengths = np.fromiter((len(d) for d in docs), np.int64, len(docs))
                    self.stats.add(names, chunk.dataset_id[keep], lengths)
            for lane in lanes.values():
                lane.read_to = max(lane.read_to, chunk.start + len(chunk))

        while True:
            if self.micro == 0:
                while not exhausted and all(lane.buffered == 0 for lane in lanes.values()):
                    read_more()
                if exhausted and all(lane.buffered == 0 for lane in lanes.values()):
                    return
            step, micro = self._advance()
            ids = self.geometry.microbatch_sequences(step, micro)
            rows = []
            for j in ids.tolist():
                lane = lanes[j % L]
                while not lane.ready() and not exhausted:
                    read_more()
                rows.append(lane.pop_row())
            if self.spec.batch.drop_last and any(int(r.lengths[0]) < self.spec.pack.max_length for r in rows):
                return
            if not self._mine(step, micro):
                continue
            yield self._batch(step, micro, ids, concat_rows(rows))


def iterate_batches(plan_dir: str | Path, spec: ExecutorSpec, stats: RunStats | None = None) -> Iterator[Batch]:
    """One rank (dp_size 1, global batch = microbatch) over the whole plan: the simplest use of RankRunner."""
    plan = PlanBundle(plan_dir)
    lanes = None if plan.manifest.get("kind") == "exact" else int(plan.manifest.get("lanes") or 1)
    b = spec.batch.microbatch_size
    geometry = Geometry(microbatch=b, global_batch=b, dp_size=1, dp_rank=0, lanes=lanes)
    return iter(RankRunner(plan_dir, spec, geometry, stats=stats))
