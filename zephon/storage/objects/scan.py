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
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zephon.specs import StoreCredentials
from zephon.storage.files import cache_dir, write_atomic
from zephon.storage.jsonl import decompress, line_spans
from zephon.storage.objects.reads import ObjectFile, get_tail, get_whole, with_version

__all__ = ["line_index", "save_line_index", "scan_object"]


def _meta_path(file: ObjectFile) -> Path:
    key = hashlib.blake2b(f"{file.uri}\0{file.pin}\0{file.size}".encode(), digest_size=16).hexdigest()
    return cache_dir() / "object-meta" / f"{key}.json"


def scan_object(file: ObjectFile, credentials: Iterable[StoreCredentials] = ()) -> tuple[int, int, ObjectFile]:
    """``(rows, row_groups, pinned)`` of an object shard; ``pinned`` is ``file`` with the version id its GET
    stated when the listing had none (GCS). Raises ``ValueError`` for an unreadable footer or stream."""
    cached = _meta_path(file)
    try:
        data = json.loads(cached.read_text())
        version = data.get("version")
        pinned = file if not version or file.version else replace(file, version=str(version))
        return int(data["rows"]), int(data["row_groups"]), pinned
    except (OSError, ValueError, KeyError, TypeError):  # absent or damaged: read the object again
        pass
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
    write_atomic(cached, lambda tmp: tmp.write_text(record), "the object metadata cache")
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
