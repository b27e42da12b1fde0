"""A pinned object as a seekable file served by range requests, with the row groups it needs fetched ahead.

Range mode reads a Parquet shard without a local copy: pyarrow opens a :class:`RangeFile` as it would a file,
given the parsed footer (one GET the first time, :func:`~.reads.read_tail`; kept per pinned object for the
process's later opens of the shard, up to 4,096 footers). The text column's chunks of the row groups about to
be decoded are fetched by :meth:`RangeFile.fetch_row_groups` — one GET per column chunk, several at once on a
small thread pool — into ``blocks``; a read inside a block is served from memory, any other read is one GET
of exactly its bytes. Blocks are dropped once decoded (:meth:`RangeFile.release`), so memory holds at most
the blocks of one batch of row groups, itself bounded by ``read_ahead_bytes`` (chunks beyond the bound are
read when pyarrow asks for them).

Invariant: every byte pyarrow sees comes from the planned version of the object (each GET carries the pin,
:mod:`.reads`), so decoding is identical to decoding the planned file on local disk.

Worked example: a shard of 4 row groups, text column chunks at bytes [4, 1004), [1004, 2100), [2100, 3050),
[3050, 4000), footer at [4000, 4400). Opening costs one GET the first time (the last 64 KiB), none after; a
chunk of the plan needing rows of row groups 1 and 3 fetches [1004, 2100) and [3050, 4000) in two concurrent
GETs; pyarrow's reads of those ranges are then memory copies.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq

from zephon.specs import StoreCredentials
from zephon.storage.objects.reads import ObjectFile, read_range, read_tail
from zephon.storage.seekable import SeekableSpans

__all__ = ["RangeFile", "fetch_ranges"]

_POOL_WORKERS = 8
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
#: Footers of the objects opened lately, by (uri, pin): a shard opened again costs no GET (a few KB each).
_FOOTERS_KEPT = 4096
_footers: OrderedDict[tuple[str, str], tuple[pq.FileMetaData, bytes]] = OrderedDict()


def _fetch_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_POOL_WORKERS, thread_name_prefix="zephon-range")
        return _pool


def _forget_pool() -> None:
    """In a forked child (a DataLoader worker): the parent's fetch threads do not exist there, so the pool is
    made anew on first use (the copied one would queue GETs that no thread sends)."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def fetch_ranges(
    file: ObjectFile,
    ranges: Sequence[tuple[int, int]],
    credentials: Iterable[StoreCredentials] = (),
    *,
    kind: str = "range",
) -> list[bytes]:
    """The bytes of each ``[start, end)`` of ``ranges``, fetched concurrently (one GET each, counted as ``kind``)."""
    creds = tuple(credentials)
    futures = [_fetch_pool().submit(read_range, file, s, e, creds, kind=kind) for s, e in ranges]
    return [f.result() for f in futures]


class RangeFile(SeekableSpans):
    """The object ``file`` as a read-only, seekable binary file (see the module docstring)."""

    def __init__(
        self, file: ObjectFile, credentials: Iterable[StoreCredentials] = (), *, read_ahead_bytes: int = 256 << 20
    ) -> None:
        super().__init__()
        self.file = file
        self._credentials = tuple(credentials)
        self._read_ahead = read_ahead_bytes
        key = (file.uri, file.pin)
        with _pool_lock:
            known = _footers.get(key)
            if known is not None:
                _footers.move_to_end(key)
        if known is None:
            tail = read_tail(file, self._credentials)
            known = (pq.read_metadata(pa.BufferReader(tail)), tail[-(int.from_bytes(tail[-8:-4], "little") + 8) :])
            with _pool_lock:
                _footers[key] = known
                while len(_footers) > _FOOTERS_KEPT:
                    _footers.popitem(last=False)
        #: The parsed footer: hand it to ``pq.ParquetFile(..., metadata=)`` so pyarrow reads no footer.
        self.metadata: pq.FileMetaData = known[0]
        self._tail = known[1]
        self._tail_start = file.size - len(self._tail)
        #: start → the ranges fetched ahead (bytes, or the future of a GET in flight), until released.
        self.blocks: dict[int, bytes | Future[bytes]] = {}

    # ---- SeekableSpans
    def size(self) -> int:
        return self.file.size

    def span(self, start: int, end: int) -> bytes:
        return self._bytes(start, end)

    def _bytes(self, start: int, end: int) -> bytes:
        if start >= self._tail_start:
            return self._tail[start - self._tail_start : end - self._tail_start]
        for first, block in list(self.blocks.items()):
            if isinstance(block, Future):
                block = self.blocks[first] = block.result()
            if first <= start and end <= first + len(block):
                return block[start - first : end - first]
        return read_range(self.file, start, end, self._credentials)

    # ---- fetching ahead
    def column_ranges(self, column: str, groups: Sequence[int]) -> list[tuple[int, int]]:
        """``[start, end)`` of ``column``'s chunk in each of ``groups`` (from the footer)."""
        assert self.metadata is not None
        index = self.metadata.schema.to_arrow_schema().get_field_index(column)
        out = []
        for g in groups:
            chunk = self.metadata.row_group(g).column(index)
            start = chunk.data_page_offset
            if chunk.has_dictionary_page and chunk.dictionary_page_offset is not None:
                start = min(start, chunk.dictionary_page_offset)
            out.append((start, start + chunk.total_compressed_size))
        return out

    def fetch_row_groups(self, column: str, groups: Sequence[int]) -> None:
        """Start GETs of ``column``'s chunks of ``groups``, concurrently, into ``blocks`` (never waits). At most
        ``read_ahead_bytes`` are fetched ahead; chunks beyond are read when pyarrow asks for them."""
        ranges = self.column_ranges(column, groups)
        wanted = [(s, e) for s, e in ranges if s not in self.blocks and e <= self._tail_start]
        held, batch = 0, []
        for s, e in wanted:
            if held + (e - s) > self._read_ahead and batch:
                break
            batch.append((s, e))
            held += e - s
        for s, e in batch:
            self.blocks[s] = _fetch_pool().submit(read_range, self.file, s, e, self._credentials)

    def release(self) -> None:
        """Drop the blocks fetched ahead (their row groups are decoded); GETs in flight finish unused."""
        self.blocks.clear()
