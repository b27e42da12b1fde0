"""The provenance log: what a rank actually yielded, written as compact Parquet next to training.

With ``Pipeline.options(provenance_dir=DIR)`` every rank (and DataLoader worker) writes
``DIR/rank-{r:05d}-worker-{w:02d}-from-{step:09d}.parquet``: one row per piece of every yielded row —

    step, rank, microbatch, sequence, offset, position, doc_start, length

i.e. ``length`` tokens of the plan document at ``position`` (from its token ``doc_start``) sit at column
``offset`` of global sequence ``sequence``, yielded by ``rank`` in ``microbatch`` of ``step``. A resumed run
starts a new file (``from-{step}`` is its first step), so a crash never corrupts earlier logs. The file's
key-value metadata records the plan's ``config_hash``, ``max_length``, ``global_batch``, ``dp_size`` and
``lanes``. ``zephon audit PLAN --log DIR`` (``zephon.inspection.log_check``) checks the log against the plan.

Documents the skip policy (``Pipeline.options(on_bad_document="skip")``) left out are listed beside it, in
``DIR/skipped-rank-{r:05d}-worker-{w:02d}-from-{step:09d}.parquet`` (``position``, ``reason`` of each
``zephon.executor.read.skipped_documents.SkippedDocument``; written when the log closes, only if something was
skipped), so the check can tell a skipped document from a lost one.

Row groups are flushed every ``FLUSH_ROWS`` pieces, so a log costs a few bytes per piece and bounded memory.

In a DataLoader worker of ``Pipeline.dataloader()`` a batch is made ahead of training — up to the DataLoader's
prefetch of items, each of several pieces — so a log written there held microbatches never handed to training,
and a run resumed from the loader's state logged them again (``zephon audit`` takes a piece logged twice alike as
a step re-run after a crash). There the log is made with ``hand_over=True``: it writes no file of pieces but keeps
each batch's rows (``take``), which travel with the worker's piece, and the loader writes them when it hands the
piece out (``zephon.loader_pieces.Handed``), in its own file ``rank-…-worker-00-…``: the log then holds what
training took. The worker still writes its skipped documents' file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zephon.errors import ConfigError, one_line
from zephon.executor.batch import Batch
from zephon.executor.geometry import Geometry
from zephon.executor.read.skipped_documents import SkippedDocument


def _claim(path: Path, plan: str) -> None:
    """Refuse to replace what is at ``path`` unless it is a log of this ``plan`` — the same steps logged again — or
    a log a crash cut short (Parquet's opening ``PAR1`` and no footer: unreadable, so nothing is lost). Another
    plan's log, or any other file, is never overwritten (``provenance_dir`` shared by two runs, or pointed at a
    folder of the user's)."""
    if not (path.exists() or path.is_symlink()):
        return
    what = "not a Zephon provenance log"
    if path.is_file() and not path.is_symlink():
        try:
            theirs = (pq.read_schema(path).metadata or {}).get(b"zephon.plan")
        except (OSError, pa.ArrowInvalid):
            with path.open("rb") as f:
                if f.read(4) == b"PAR1":
                    return
        else:
            if theirs == plan.encode():
                return
            if theirs is not None:
                what = f"a log of another plan (config_hash {theirs.decode(errors='replace')[:16]}…)"
    raise ConfigError(
        f"provenance_dir must hold this plan's logs only, got {path}: {what} — choose another provenance_dir, "
        "or move that file away (nothing was replaced)"
    )


LOG_SCHEMA = pa.schema(
    [
        pa.field("step", pa.int64()),
        pa.field("rank", pa.int32()),
        pa.field("microbatch", pa.int32()),
        pa.field("sequence", pa.int64()),
        pa.field("offset", pa.int32()),
        pa.field("position", pa.int64()),
        pa.field("doc_start", pa.int32()),
        pa.field("length", pa.int32()),
    ]
)
SKIPPED_SCHEMA = pa.schema([pa.field("position", pa.int64()), pa.field("reason", pa.string())])
FLUSH_ROWS = 1 << 16


@dataclass(frozen=True, kw_only=True, slots=True)
class LogHeader:
    """What a log file says about its run: its name and key-value metadata (see the module docstring).

    Attributes:
        plan: the plan's ``config_hash``.
        max_length: tokens per row.
        geometry: batch sizes, data-parallel rank and size, lanes.
        first_step: the first step this log records (the run's step when it starts or resumes).
        worker: the DataLoader worker's index (0 without a DataLoader).
        unit: ``"tokens"`` (text pipelines) or ``"records"`` (record pipelines: one piece per record, ``sequence``
            and ``position`` equal, ``length`` 1; the metadata then says ``zephon.unit: records``) or ``"rows"``
            (records packed by cost: ``sequence`` the plan row, ``offset`` the record's place among the row's
            logged records, ``length`` 1).
    """

    plan: str
    max_length: int
    geometry: Geometry
    first_step: int
    worker: int = 0
    unit: str = "tokens"


class ProvenanceLog:
    """Appends yielded batches' pieces to this rank's log file."""

    def __init__(self, directory: str | Path, header: LogHeader, *, hand_over: bool = False) -> None:
        """``hand_over``: keep the rows for ``take`` instead of writing them (a DataLoader worker's log, module
        docstring); only the skipped documents' file is written."""
        g = header.geometry
        self.header, self.hand_over = header, hand_over
        self.rank = g.dp_rank
        directory = Path(directory)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a file where a folder must be, no permission, a full disk
            raise ConfigError(
                f"provenance_dir {str(directory)!r} must be a folder Zephon can make, got {one_line(exc)} — choose "
                "another provenance_dir"
            ) from None
        name = f"rank-{g.dp_rank:05d}-worker-{header.worker:02d}-from-{header.first_step:09d}.parquet"
        meta = {
            "zephon.plan": header.plan,
            "zephon.max_length": str(header.max_length),
            "zephon.global_batch": str(g.global_batch),
            "zephon.dp_size": str(g.dp_size),
            "zephon.lanes": str(g.lanes if g.lanes is not None else ""),
        }
        if header.unit != "tokens":  # text logs keep the metadata they had
            meta["zephon.unit"] = header.unit
        self.path = directory / name
        self.skipped_path = directory / f"skipped-{name}"
        for path in (self.path, self.skipped_path):
            _claim(path, header.plan)
        self._meta = meta
        schema = LOG_SCHEMA.with_metadata(meta)
        self._writer = None if hand_over else pq.ParquetWriter(self.path, schema, compression="zstd")
        self._parts: list[pa.Table] = []
        self._handed: list[pa.Table] = []  # hand_over: the rows not taken yet
        self._rows = 0
        self._skipped: list[SkippedDocument] = []

    def skip(self, documents: Sequence[SkippedDocument]) -> None:
        """Record documents the skip policy left out (placed at their plan positions)."""
        self._skipped.extend(documents)

    def write(self, batch: Batch) -> None:
        pieces = batch.pieces
        if pieces is None or batch.sequences is None or not len(pieces):
            return
        n = len(pieces)
        self._add(
            pa.table(
                {
                    "step": np.full(n, batch.step, np.int64),
                    "rank": np.full(n, self.rank, np.int32),
                    "microbatch": np.full(n, batch.microbatch, np.int32),
                    "sequence": batch.sequences[pieces["row"]].astype(np.int64),
                    "offset": pieces["offset"],
                    "position": pieces["position"],
                    "doc_start": pieces["doc_start"],
                    "length": pieces["length"],
                },
                schema=LOG_SCHEMA,
            )
        )

    def write_records(self, step: int, microbatch: int, positions: np.ndarray, rows: np.ndarray | None = None) -> None:
        """A record pipeline's microbatch: one piece per record (sequence = position, offset 0, length 1); a packed
        one (``rows``: each record's plan row, records of a row consecutive) logs sequence = row and offset = the
        record's place in its row."""
        n = len(positions)
        if not n:
            return
        positions = np.asarray(positions, np.int64)
        sequence, offset = positions, np.zeros(n, np.int32)
        if rows is not None:
            sequence = np.asarray(rows, np.int64)
            first = np.ones(n, bool)
            first[1:] = sequence[1:] != sequence[:-1]
            starts = np.flatnonzero(first)
            offset = (np.arange(n) - np.repeat(starts, np.diff(np.append(starts, n)))).astype(np.int32)
        self._add(
            pa.table(
                {
                    "step": np.full(n, step, np.int64),
                    "rank": np.full(n, self.rank, np.int32),
                    "microbatch": np.full(n, microbatch, np.int32),
                    "sequence": sequence,
                    "offset": offset,
                    "position": positions,
                    "doc_start": np.zeros(n, np.int32),
                    "length": np.ones(n, np.int32),
                },
                schema=LOG_SCHEMA,
            )
        )

    def take(self) -> list[pa.Table]:
        """``hand_over``: the rows of the batches written since the last call (for the loader to write)."""
        taken, self._handed = self._handed, []
        return taken

    def extend(self, tables: Sequence[pa.Table]) -> None:
        """Write rows another process's log ``take``-s (a loader, the pieces it hands out)."""
        for table in tables:
            self._add(table)

    def _add(self, table: pa.Table) -> None:
        if self.hand_over:
            self._handed.append(table)
            return
        self._parts.append(table)
        self._rows += len(table)
        if self._rows >= FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        if self._parts and self._writer is not None:
            self._writer.write_table(pa.concat_tables(self._parts))
            self._parts, self._rows = [], 0

    def close(self) -> None:
        self.flush()
        if self._writer is not None:
            self._writer.close()
        if self._skipped:
            positions = [document.position for document in self._skipped]
            reasons = [document.reason for document in self._skipped]
            table = pa.table({"position": positions, "reason": reasons}, schema=SKIPPED_SCHEMA)
            pq.write_table(table.replace_schema_metadata(self._meta), self.skipped_path, compression="zstd")
