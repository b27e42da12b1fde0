"""Writing samples.parquet a chunk at a time, in bounded memory, and the totals plan.json reports.

The file is one Parquet file sorted by ``position``, in row groups of exactly ``SAMPLES_ROW_GROUP`` rows
(the last one shorter), with min/max statistics on every column: the executor seeks to a position or a
token offset by the footer statistics and decodes one row group. A plan of more than ``SAMPLES_PART_ROWS``
documents is written as parts instead (``samples/part-00000.parquet``, ...; ``zephon.plan.format``): each part
but the last holds exactly ``SAMPLES_PART_ROWS`` rows, so no footer grows with the plan (a single file of 10^10
documents would have a footer of 152,588 row groups, ~100 MB, parsed by every rank that opens it).

Writer: pyarrow's ``ParquetWriter`` rather than Polars or DuckDB. It takes the plan chunk by chunk (a plan
of 10^8 documents never exists whole in memory), cuts row groups at exact boundaries whatever the chunking,
writes the schema's Arrow types as they are (``SAMPLES_SCHEMA``: int16 stays int16, nullable columns stay
nullable), and lets each column have its own encoding. pyarrow is already the executor's reader; the
bytes depend only on the rows and the pyarrow version, which the file records (``created_by``).

Encodings, chosen by measuring each column's bytes per document (docs/performance.md "Bytes per column"):

* ``position``, ``token_offset`` and ``deal`` (non-decreasing, a step every few documents) grow steadily:
  ``DELTA_BINARY_PACKED`` stores their differences
  (0 bits per position; a document's tokens per offset), where plain zstd would cost 1–3 bytes each.
* ``dataset_id``, ``epoch`` have a few values per row group, and ``shard_id`` a few dozen (one shuffle window per
  dataset): dictionary + run-length encoding, then zstd (``shard_id`` 0.58 bytes at 10^5 rows per shard;
  ``BYTE_STREAM_SPLIT`` 0.76 with 1,342 shards, 1.01 with 10^4: ids above 255 put noise in both bytes).
* ``row`` and ``tokens`` are close to random (a row within its shard, a document's length):
  ``BYTE_STREAM_SPLIT`` puts each byte of the integers in its own stream, so zstd's entropy coder sees the high
  bytes (mostly 0) apart from the low ones (noise) — at 10^5 rows per shard ``row`` 2.27 bytes (2.41 delta, 2.69
  plain), ``tokens`` 1.72 (2.06 plain). pyarrow 26, DuckDB 2.0 and Polars 2.1 read it for integers (checked here;
  the Parquet format has allowed it for integer columns since 2024, and older readers refuse such a column in one
  error).

All pages are zstd (level 3). Writing happens on a second thread, overlapping the layout of the next chunk.

Invariant: the files' bytes depend only on the plan's rows (and the pyarrow version), never on how they
were chunked: rows are held back until a whole row group is available, and only the last row group is short;
parts are cut at multiples of the row group.

Worked example, row groups of R rows and chunks of 1.5 R, 1.5 R and 0.2 R rows: the first chunk writes one
row group and holds 0.5 R rows; the second completes and writes two more (0.5 R + 1.5 R = 2 R); the third
is held, and ``close`` writes it as the last row group of 0.2 R — the same four row groups as one chunk
of 3.2 R rows. With parts of 2 R rows, the third row group starts a part: samples.parquet, already holding its
2 R rows, becomes samples/part-00000.parquet, and part-00001 gets the 1.2 R rows left.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zephon.plan.format import (
    SAMPLES_DIR,
    SAMPLES_FILE,
    SAMPLES_PART_ROWS,
    SAMPLES_ROW_GROUP,
    SAMPLES_SCHEMA,
    samples_part,
)
from zephon.planner.layout import Chunk

DICTIONARY = ["dataset_id", "shard_id", "epoch"]
ENCODINGS = {
    "position": "DELTA_BINARY_PACKED",
    "token_offset": "DELTA_BINARY_PACKED",
    "deal": "DELTA_BINARY_PACKED",
    "row": "BYTE_STREAM_SPLIT",
    "tokens": "BYTE_STREAM_SPLIT",
}


@dataclass(slots=True)
class StageTotals:
    """One stage's share of the totals (chunks never span stages)."""

    #: The position of the stage's first document.
    first_position: int
    #: Datasets in the plan (the length of ``docs`` and ``tokens``).
    datasets: int
    #: Documents the stage placed, per dataset.
    docs: np.ndarray = field(init=False)
    #: Tokens the stage placed, per dataset (float64 sums of integers: exact); None without tokens.
    tokens: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.docs = np.zeros(self.datasets, np.int64)


@dataclass(slots=True)
class Totals:
    """What plan.json reports about the samples, accumulated chunk by chunk."""

    #: Datasets in the plan (the length of the per-dataset arrays).
    datasets: int
    #: Keep every document's tokens (best-fit packing needs them all).
    keep_tokens: bool
    #: Documents (positions) so far.
    documents: int = 0
    #: Documents per dataset.
    docs: np.ndarray = field(init=False)
    #: The last epoch started, per dataset; -1 before its first document.
    last_epoch: np.ndarray = field(init=False)
    #: Tokens per dataset (float64 sums of integers: exact); None without tokens.
    tokens: np.ndarray | None = None
    #: With ``keep_tokens``: every chunk's tokens, in plan order.
    token_parts: list[np.ndarray] = field(default_factory=list)
    #: With ``keep_tokens``: every chunk's dataset ids, in plan order (homogeneous packing needs them).
    dataset_parts: list[np.ndarray] = field(default_factory=list)
    #: Per stage (phase) that placed documents: first position, documents and tokens per dataset.
    stages: dict[int, StageTotals] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.docs = np.zeros(self.datasets, np.int64)
        self.last_epoch = np.full(self.datasets, -1, np.int64)

    def add(self, chunk: Chunk) -> None:
        counts = np.bincount(chunk.dataset_id, minlength=self.datasets)
        stage = self.stages.get(chunk.stage)
        if stage is None:
            stage = self.stages[chunk.stage] = StageTotals(first_position=self.documents, datasets=self.datasets)
        stage.docs += counts
        self.documents += len(chunk)
        self.docs += counts
        for i in np.flatnonzero(counts).tolist():
            # Epochs never decrease within a dataset: its last document in the chunk has its largest epoch.
            last = int(np.flatnonzero(chunk.dataset_id == i)[-1])
            self.last_epoch[i] = max(int(self.last_epoch[i]), int(chunk.epoch[last]))
        if chunk.tokens is not None:
            sums = np.bincount(chunk.dataset_id, weights=chunk.tokens, minlength=self.datasets)
            self.tokens = sums if self.tokens is None else self.tokens + sums
            stage.tokens = sums if stage.tokens is None else stage.tokens + sums
            if self.keep_tokens:
                self.token_parts.append(chunk.tokens)
                self.dataset_parts.append(chunk.dataset_id)

    def all_tokens(self) -> np.ndarray:
        return np.concatenate(self.token_parts) if self.token_parts else np.empty(0, np.int32)

    def all_datasets(self) -> np.ndarray:
        return np.concatenate(self.dataset_parts) if self.dataset_parts else np.empty(0, np.int16)


def _table(chunk: Chunk) -> pa.Table:
    n = len(chunk)

    def column(values: np.ndarray | None, kind: pa.DataType) -> pa.Array:
        return pa.array(values, type=kind) if values is not None else pa.nulls(n, kind)

    return pa.Table.from_arrays(
        [
            pa.array(np.arange(chunk.start, chunk.start + n, dtype=np.int64)),
            pa.array(chunk.dataset_id),
            pa.array(chunk.shard_id),
            pa.array(chunk.row),
            pa.array(chunk.epoch),
            column(chunk.tokens, pa.int32()),
            column(chunk.token_offset, pa.int64()),
            column(chunk.deal, pa.int64()),
        ],
        schema=SAMPLES_SCHEMA,
    )


class SamplesWriter:
    """Write chunks of consecutive positions into the bundle directory ``plan_dir`` as whole row groups, on a
    background thread: samples.parquet, or parts of ``part_rows`` rows (a multiple of the row group) once the
    plan has more; ``files`` names what was written, in order, after ``close``."""

    def __init__(self, plan_dir: Path, *, part_rows: int | None = None) -> None:
        part_rows = SAMPLES_PART_ROWS if part_rows is None else part_rows
        if part_rows <= 0 or part_rows % SAMPLES_ROW_GROUP:
            raise ValueError(f"part_rows must be a positive multiple of {SAMPLES_ROW_GROUP}, got {part_rows}")
        self._dir = plan_dir
        self._part_rows = part_rows
        #: The files written so far (bundle-relative names); the last one is open.
        self.files: list[str] = [SAMPLES_FILE]
        self._writer = self._open(plan_dir / SAMPLES_FILE)
        self._in_part = 0  # rows written to the open file
        self._pending: list[pa.Table] = []
        self._rows = 0
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zephon-samples")
        self._future: Future[None] | None = None

    @staticmethod
    def _open(path: Path) -> pq.ParquetWriter:
        return pq.ParquetWriter(
            path,
            SAMPLES_SCHEMA,
            compression="zstd",
            compression_level=3,
            use_dictionary=DICTIONARY,
            column_encoding=ENCODINGS,
            write_statistics=True,
        )

    def _next_part(self) -> None:
        """Close the full file and open the next part (samples.parquet becomes part 0 when a second is needed)."""
        self._writer.close()
        if self.files == [SAMPLES_FILE]:
            (self._dir / SAMPLES_DIR).mkdir()
            (self._dir / SAMPLES_FILE).rename(self._dir / samples_part(0))
            self.files = [samples_part(0)]
        self.files.append(samples_part(len(self.files)))
        self._writer = self._open(self._dir / self.files[-1])
        self._in_part = 0

    def _write(self, table: pa.Table, final: bool) -> None:
        self._pending.append(table)
        self._rows += table.num_rows
        whole = self._rows if final else self._rows - self._rows % SAMPLES_ROW_GROUP
        if whole == 0:
            return
        merged = pa.concat_tables(self._pending) if len(self._pending) > 1 else self._pending[0]
        done = 0
        while done < whole:
            if self._in_part == self._part_rows:
                self._next_part()
            take = min(whole - done, self._part_rows - self._in_part)
            self._writer.write_table(merged.slice(done, take), row_group_size=SAMPLES_ROW_GROUP)
            self._in_part += take
            done += take
        rest = merged.slice(whole)
        self._pending = [rest] if rest.num_rows else []
        self._rows = rest.num_rows

    def _wait(self) -> None:
        if self._future is not None:
            self._future.result()
            self._future = None

    def write(self, chunk: Chunk) -> None:
        """Queue ``chunk``; at most one chunk is being written while the next is laid out."""
        table = _table(chunk)
        self._wait()
        self._future = self._thread.submit(self._write, table, False)

    def close(self) -> None:
        try:
            self._wait()
            self._write(pa.Table.from_batches([], schema=SAMPLES_SCHEMA), True)
            self._writer.close()
        finally:
            self._thread.shutdown(wait=True)

    def abort(self) -> None:
        self._thread.shutdown(wait=True, cancel_futures=True)
        self._writer.close()
