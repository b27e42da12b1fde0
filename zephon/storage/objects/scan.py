"""Planning metadata of an object shard: rows and row groups, read from the Parquet footer only.

A Parquet object costs one GET (the last 64 KiB, :func:`~.reads.read_tail`); a JSONL object must be read
whole to count its lines (in memory, never staged on disk). The result is cached under
``$ZEPHON_CACHE_DIR/object-meta`` keyed by the URI and the pin (ETag and version), so re-planning an unchanged
corpus makes no GET at all; a changed object has another ETag, hence another key. The line spans of a
plain ``.jsonl`` object are kept too (``object-index``), for range mode's line reads. A store that lists no
version ids but states them on GET (GCS's generation) gets the version of that GET into the pin.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zephon.specs import StoreCredentials
from zephon.storage.files import cache_dir, write_atomic
from zephon.storage.jsonl import decompress, line_spans
from zephon.storage.objects.reads import ObjectFile, get_tail, get_whole, with_version

__all__ = ["AHEAD", "following", "line_index", "remember_listing", "save_line_index", "scan_object"]

#: Footers read ahead of the one asked for, concurrently.
AHEAD = 16
_lock = threading.Lock()
_listings: dict[tuple[str, str], tuple[tuple[ObjectFile, ...], int]] = {}
T = TypeVar("T")


class ReadAhead(Generic[T]):
    """Work on objects started ahead of being asked for: at most one future per pinned object (``(uri, pin)``),
    on a pool of ``AHEAD`` threads made on first use. ``take`` waits for an object's result and forgets it, so a
    later scan of the same object starts again (its result is cached on disk by then)."""

    def __init__(self, thread_name: str) -> None:
        self._thread_name = thread_name
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._inflight: dict[tuple[str, str], Future[T]] = {}

    def start(self, file: ObjectFile, fn: Any, *args: Any) -> Future[T]:
        """The future of ``fn(*args)`` for ``file``: the one in flight, else a new one."""
        with self._lock:
            future = self._inflight.get((file.uri, file.pin))
            if future is None:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(AHEAD, thread_name_prefix=self._thread_name)
                future = self._inflight[(file.uri, file.pin)] = self._pool.submit(fn, *args)
        return future

    def take(self, file: ObjectFile, future: Future[T]) -> T:
        """``future``'s result (its error raised here), ``file`` forgotten either way."""
        try:
            return future.result()
        finally:
            self.forget(file)

    def forget(self, file: ObjectFile) -> None:
        with self._lock:
            self._inflight.pop((file.uri, file.pin), None)


_footers: ReadAhead[tuple[int, int, ObjectFile]] = ReadAhead("zephon-footers")


def _meta_path(file: ObjectFile) -> Path:
    key = hashlib.blake2b(f"{file.uri}\0{file.pin}\0{file.size}".encode(), digest_size=16).hexdigest()
    return cache_dir() / "object-meta" / f"{key}.json"


def remember_listing(files: Sequence[ObjectFile]) -> None:
    """Record a dataset's objects in listing order: a footer scan reads the next ones' footers ahead."""
    listing = tuple(files)
    with _lock:
        for index, file in enumerate(listing):
            _listings[(file.uri, file.pin)] = (listing, index)


def following(file: ObjectFile, n: int) -> tuple[ObjectFile, ...]:
    """The ``n`` objects after ``file`` in its remembered listing (none when it was not listed)."""
    with _lock:
        listing, index = _listings.get((file.uri, file.pin), ((file,), 0))
    return listing[index + 1 : index + 1 + n]


def scan_object(file: ObjectFile, credentials: Iterable[StoreCredentials] = ()) -> tuple[int, int, ObjectFile]:
    """``(rows, row_groups, pinned)`` of an object shard; ``pinned`` is ``file`` with the version id its GET
    stated when the listing had none (GCS). Raises ``ValueError`` for an unreadable footer or stream.

    Footers are read ahead: scanning a Parquet object of a listing (``remember_listing``) also starts GETs of the
    next ``AHEAD`` uncached footers of that listing, concurrently, so a planner that scans shard after shard
    waits for one round trip per ``AHEAD`` shards, not per shard. The results are what one-by-one scans give."""
    found = _cached(file)
    if found is not None:
        return found
    creds = tuple(credentials)
    if file.format != "parquet":
        return _scan(file, creds)
    own = _footers.start(file, _scan, file, creds)
    for sibling in following(file, AHEAD):
        if sibling.format == "parquet" and not _meta_path(sibling).exists():
            _footers.start(sibling, _scan, sibling, creds)
    return _footers.take(file, own)


def _cached(file: ObjectFile) -> tuple[int, int, ObjectFile] | None:
    try:
        data = json.loads(_meta_path(file).read_text())
        version = data.get("version")
        pinned = file if not version or file.version else replace(file, version=str(version))
        return int(data["rows"]), int(data["row_groups"]), pinned
    except (OSError, ValueError, KeyError, TypeError):  # absent or damaged: read the object again
        return None


def _scan(file: ObjectFile, credentials: tuple[StoreCredentials, ...]) -> tuple[int, int, ObjectFile]:
    if file.format == "parquet":
        tail, meta = get_tail(file, credentials)
        parsed = pq.read_metadata(pa.BufferReader(tail))
        rows, groups = parsed.num_rows, parsed.num_row_groups
    else:
        raw, meta = get_whole(file, credentials)
        spans = line_spans(decompress(raw, file.format))
        rows, groups = len(spans[0]), 1
        if file.format == "jsonl":
            save_line_index(file, spans)
    pinned = with_version(file, meta)
    record = json.dumps(
        {"uri": file.uri, "pin": file.pin, "rows": rows, "row_groups": groups, "version": pinned.version}
    )
    write_atomic(_meta_path(file), lambda tmp: tmp.write_text(record), "the object metadata cache")
    return rows, groups, pinned


def _index_path(file: ObjectFile) -> Path:
    key = hashlib.blake2b(f"{file.uri}\0{file.etag}\0{file.size}".encode(), digest_size=16).hexdigest()
    return cache_dir() / "object-index" / f"{key}.npz"


def save_line_index(file: ObjectFile, spans: tuple[np.ndarray, np.ndarray]) -> None:
    """Keep a plain JSONL object's line spans, keyed by its URI, ETag and size (range mode reads lines by them)."""
    starts, ends = spans
    write_atomic(_index_path(file), lambda tmp: np.savez(tmp, starts=starts, ends=ends), "the JSONL line index cache")


def line_index(file: ObjectFile) -> tuple[np.ndarray, np.ndarray] | None:
    """The line spans of a plain JSONL object saved by the scan or an earlier read, or None."""
    try:
        with np.load(_index_path(file)) as saved:
            return saved["starts"].astype(np.int64), saved["ends"].astype(np.int64)
    except Exception:  # absent or damaged: a miss, never a failure
        return None
