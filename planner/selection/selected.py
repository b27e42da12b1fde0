"""A selection's kept rows, held in memory while they are few and in an unnamed temporary file past that.

At 10^10 documents a ``where`` keeping a third of them keeps 3.5 × 10^9 rows: 14 GB of int32 row numbers,
more than a planning node's memory. The planner never needs them at once: ``orders.Reader`` reads one shard
window at a time. So a ``RowColumn`` keeps its values in memory up to ``MEMORY_BYTES`` and past that in a
``tempfile.TemporaryFile`` (on Linux an unnamed ``O_TMPFILE`` in ``TMPDIR``: no name to remove, freed when the
process closes it or ends), read back with ``os.pread`` in blocks of ``BLOCK_ROWS`` — the memory a plan's
selection takes does not grow with the selection.

``SelectedRows`` is a dataset's selection: each shard's count of kept rows, the rows themselves (grouped by
shard in shard order, ascending within a shard; for ``order_by`` selections in key order, with each one's shard
beside it).

Invariant: a column holds the values appended, in order, and ``slice``/``take``/``array`` return the same values
whether it is in memory or in a file (tests run both).

Worked example: appending [3, 7, 9] then [1, 4] with ``MEMORY_BYTES = 8`` (two int32) moves the column to a file
at the first append; ``take([4, 0])`` reads block 0 (the only one holding either) and gives [4, 3]; with counts
[3, 0, 2] shard 2's rows are ``slice(3, 5)`` = [1, 4].
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

__all__ = ["BLOCK_ROWS", "MEMORY_BYTES", "RowColumn", "RowColumnWriter", "SelectedRows", "SelectionReport"]

#: Bytes of rows a column keeps in memory; past them it moves to a temporary file (read at call time: tests lower
#: it to run the file path on small selections).
MEMORY_BYTES = 256 << 20
#: Rows read from a column's file at once by ``take`` (256 KiB).
BLOCK_ROWS = 1 << 16
#: The most bytes one ``pread`` is asked for (Linux returns at most 2^31 - 4096).
_READ_BYTES = 1 << 28
_ROW = np.dtype("<i4")


def _read(fd: int, start: int, count: int) -> np.ndarray:
    """``count`` int32 values from the file ``fd`` from value ``start`` on."""
    out = np.empty(count, dtype=_ROW)
    view = memoryview(out).cast("B")
    at = 0
    while at < len(view):
        n = os.preadv(fd, [view[at : at + _READ_BYTES]], start * _ROW.itemsize + at)
        if n <= 0:
            raise OSError(f"the selection's row file ended at byte {start * _ROW.itemsize + at}, expected more")
        at += n
    return out


class RowColumn:
    """Int32 values in memory or in an unnamed temporary file (see the module docstring)."""

    __slots__ = ("_array", "_file", "_length")

    def __init__(self, *, array: np.ndarray | None = None, file: IO[bytes] | None = None, length: int = 0) -> None:
        self._array = None if array is None else np.asarray(array, dtype=np.int32)
        self._file = file
        self._length = len(self._array) if self._array is not None else length

    @property
    def in_file(self) -> bool:
        """Whether the values are in a file (past ``MEMORY_BYTES``)."""
        return self._file is not None

    def __len__(self) -> int:
        return self._length

    def __reduce__(self) -> tuple[Any, ...]:  # a file cannot cross processes: its values do
        return (_in_memory, (self.array(),))

    def slice(self, lo: int, hi: int) -> np.ndarray:
        """Values ``lo`` to ``hi`` (a view when in memory)."""
        if self._array is not None:
            return self._array[lo:hi]
        assert self._file is not None
        return _read(self._file.fileno(), lo, max(0, hi - lo)).astype(np.int32, copy=False)

    def take(self, index: np.ndarray) -> np.ndarray:
        """The values at ``index`` (any order, repeats allowed); from a file, each block holding one read once."""
        index = np.asarray(index, dtype=np.int64)
        if self._array is not None:
            return self._array[index]
        if not len(index):
            return np.zeros(0, np.int32)
        assert self._file is not None
        blocks = np.unique(index // BLOCK_ROWS)
        fd = self._file.fileno()
        parts = []
        for b in blocks.tolist():
            lo = b * BLOCK_ROWS
            parts.append(_read(fd, lo, min(BLOCK_ROWS, self._length - lo)))
        flat = np.concatenate(parts) if len(parts) > 1 else parts[0]
        # Block b's values start at BLOCK_ROWS × its place among the blocks read (only the last block is short).
        at = np.searchsorted(blocks, index // BLOCK_ROWS) * BLOCK_ROWS + index % BLOCK_ROWS
        return flat[at].astype(np.int32, copy=False)

    def array(self) -> np.ndarray:
        """Every value (read whole from the file: for small selections and whole-selection questions only)."""
        if self._array is not None:
            return self._array
        assert self._file is not None
        return _read(self._file.fileno(), 0, self._length).astype(np.int32, copy=False)


def _in_memory(array: np.ndarray) -> RowColumn:
    return RowColumn(array=array)


class RowColumnWriter:
    """Builds a ``RowColumn`` from appended pieces: in memory until ``MEMORY_BYTES``, then in a temporary file."""

    def __init__(self) -> None:
        self._pieces: list[np.ndarray] = []
        self._file: IO[bytes] | None = None
        self._length = 0

    def append(self, rows: np.ndarray) -> None:
        rows = np.ascontiguousarray(rows, dtype=_ROW)
        self._length += len(rows)
        if self._file is None:
            self._pieces.append(rows)
            if self._length * _ROW.itemsize <= MEMORY_BYTES:
                return
            self._file = tempfile.TemporaryFile(prefix="zephon-selected-")  # noqa: SIM115 (lives with the column)
            pieces, self._pieces = self._pieces, []
            for piece in pieces:
                self._file.write(memoryview(piece).cast("B"))
            return
        self._file.write(memoryview(rows).cast("B"))

    def finish(self) -> RowColumn:
        if self._file is None:
            pieces = self._pieces
            return RowColumn(array=np.concatenate(pieces) if pieces else np.zeros(0, np.int32))
        self._file.flush()
        return RowColumn(file=self._file, length=self._length)

    def close(self) -> None:
        """Drop what was written (a selection that failed half-way)."""
        if self._file is not None:
            self._file.close()
        self._pieces = []


@dataclass(frozen=True, kw_only=True, slots=True)
class SelectionReport:
    """What a selection kept and skipped, for plan.json (every skipped row is counted)."""

    #: Rows of the dataset's shards.
    rows: int
    #: Rows the ``where`` predicate rejected (or 0 without one).
    skipped_by_where: int
    #: Rows dropped as duplicates of a ``dedup_on`` key.
    skipped_by_dedup: int
    #: Rows the plan reads.
    selected: int
    #: Sidecar: its files' content digest, rows, documents without a sidecar row, sidecar rows without a document.
    sidecar_fingerprint: str | None = None
    sidecar_rows: int | None = None
    documents_without_metadata: int | None = None
    metadata_without_document: int | None = None

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rows": self.rows,
            "selected": self.selected,
            "skipped_by_where": self.skipped_by_where,
            "skipped_by_dedup": self.skipped_by_dedup,
        }
        if self.sidecar_fingerprint is not None:
            out["sidecar"] = {
                "fingerprint": self.sidecar_fingerprint,
                "rows": self.sidecar_rows,
                "documents_without_metadata": self.documents_without_metadata,
                "metadata_without_document": self.metadata_without_document,
            }
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class SelectedRows:
    """A dataset's selected documents in reading order (before the epoch shuffle).

    Unordered selections hold them grouped by shard in shard order, ascending rows within a shard (``counts``
    says how many each shard has); the epoch order shuffles them shard window by shard window like a whole
    dataset. Ordered selections (``order_by``) hold them in key order, each one's shard in ``key_shard`` (a
    column too); the epoch order shuffles only inside windows of ``window`` documents.
    """

    #: Selected documents per shard of the dataset (int64, one entry per shard).
    counts: np.ndarray
    #: Each selected document's row within its shard.
    rows: RowColumn
    #: Ordered selections: each document's dataset-local shard index, in key order; None when unordered.
    key_shard: RowColumn | None = None
    #: Ordered selections: documents per local shuffle window.
    window: int = 1
    report: SelectionReport
    #: Where each shard's rows start in ``rows`` (unordered; derived).
    starts: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        counts = np.asarray(self.counts, dtype=np.int64)
        object.__setattr__(self, "counts", counts)
        object.__setattr__(self, "starts", np.concatenate(([0], np.cumsum(counts)))[:-1])

    @property
    def ordered(self) -> bool:
        """True when the documents are in ``order_by`` order."""
        return self.key_shard is not None

    @property
    def selected(self) -> int:
        """How many documents the selection keeps."""
        return len(self.rows)

    @property
    def shard(self) -> np.ndarray:
        """Every selected document's shard index (int32), in the selection's order."""
        if self.key_shard is not None:
            return self.key_shard.array()
        return np.repeat(np.arange(len(self.counts), dtype=np.int32), self.counts)

    @property
    def row(self) -> np.ndarray:
        """Every selected document's row (int32), in the selection's order (read whole: ``rows`` reads less)."""
        return self.rows.array()

    def per_shard(self, shards: int) -> np.ndarray:
        """Selected documents per shard (int64)."""
        if len(self.counts) != shards:
            raise ValueError(f"the selection has {len(self.counts)} shards, the reader {shards}")
        return self.counts

    def shard_rows(self, j: int) -> np.ndarray:
        """Shard ``j``'s selected rows, ascending (unordered selections)."""
        assert self.key_shard is None
        start = int(self.starts[j])
        return self.rows.slice(start, start + int(self.counts[j]))

    def lookup(self, shard: np.ndarray, local: np.ndarray) -> np.ndarray:
        """The row of each ``local``-th selected document of shard ``shard`` (unordered selections)."""
        assert self.key_shard is None
        return self.rows.take(self.starts[shard] + local)

    def in_key_order(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Shard and row of the documents at ``positions`` in key order (ordered selections)."""
        assert self.key_shard is not None
        return self.key_shard.take(positions), self.rows.take(positions)

    def by_shard(self) -> Iterator[tuple[int, np.ndarray]]:
        """``(shard index, its selected rows)`` for every shard with any, in shard order."""
        if self.key_shard is None:
            for j in np.flatnonzero(self.counts).tolist():
                yield j, self.shard_rows(j)
            return
        key_shard = self.key_shard.array()
        order = np.argsort(key_shard, kind="stable")
        shard, row = key_shard[order], self.rows.take(order)
        cuts = np.flatnonzero(np.diff(shard)) + 1
        for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(shard)], strict=True):
            if hi > lo:
                yield int(shard[lo]), row[lo:hi]
