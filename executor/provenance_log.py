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
``DIR/skipped-rank-{r:05d}-worker-{w:02d}-from-{step:09d}.parquet`` (``position``, ``reason``; written when the
log closes, only if something was skipped), so the check can tell a skipped document from a lost one.

Row groups are flushed every ``FLUSH_ROWS`` pieces, so a log costs a few bytes per piece and bounded memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zephon.executor.batch import Batch

if TYPE_CHECKING:
    from zephon.executor.runner import RankRunner

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


class ProvenanceLog:
    """Appends yielded batches' pieces to this rank's log file."""

    def __init__(self, directory: str | Path, runner: RankRunner, *, worker: tuple[int, int] = (0, 1)) -> None:
        g = runner.geometry
        self.rank = g.dp_rank
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        name = f"rank-{g.dp_rank:05d}-worker-{worker[0]:02d}-from-{runner.step:09d}.parquet"
        meta = {
            "zephon.plan": runner.plan.manifest["config_hash"],
            "zephon.max_length": str(runner.spec.pack.max_length),
            "zephon.global_batch": str(g.global_batch),
            "zephon.dp_size": str(g.dp_size),
            "zephon.lanes": str(g.lanes if g.lanes is not None else ""),
        }
        self.path = directory / name
        self.skipped_path = directory / f"skipped-{name}"
        self._meta = meta
        self._writer = pq.ParquetWriter(self.path, LOG_SCHEMA.with_metadata(meta), compression="zstd")
        self._parts: list[pa.Table] = []
        self._rows = 0
        self._skipped: list[tuple[int, str]] = []

    def skip(self, lost: list[tuple[int, str]]) -> None:
        """Record documents the skip policy left out: ``(position, reason)`` each."""
        self._skipped.extend(lost)

    def write(self, batch: Batch) -> None:
        pieces = batch.pieces
        if pieces is None or batch.sequences is None or not len(pieces):
            return
        n = len(pieces)
        self._parts.append(
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
        self._rows += n
        if self._rows >= FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        if self._parts:
            self._writer.write_table(pa.concat_tables(self._parts))
            self._parts, self._rows = [], 0

    def close(self) -> None:
        self.flush()
        self._writer.close()
        if self._skipped:
            positions, reasons = zip(*self._skipped, strict=True)
            table = pa.table({"position": list(positions), "reason": list(reasons)}, schema=SKIPPED_SCHEMA)
            pq.write_table(table.replace_schema_metadata(self._meta), self.skipped_path, compression="zstd")
