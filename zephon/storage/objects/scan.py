"""Planning metadata of an object shard: rows and row groups, read from the Parquet footer only.

A Parquet object costs one GET (the last 64 KiB, :func:`~.reads.read_tail`); a JSONL object must be read
whole to count its lines (in memory, never staged on disk). The result is cached under
``$ZEPHON_CACHE_DIR/object-meta`` keyed by the URI and the pin (ETag and version), so re-planning an unchanged
corpus makes no GET at all; a changed object has another ETag, hence another key.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from zephon.specs import StoreCredentials
from zephon.storage.files import cache_dir, write_atomic
from zephon.storage.jsonl import decompress, line_spans
from zephon.storage.objects.reads import ObjectFile, read_tail, read_whole

__all__ = ["scan_object"]


def _meta_path(file: ObjectFile) -> Path:
    key = hashlib.blake2b(f"{file.uri}\0{file.pin}\0{file.size}".encode(), digest_size=16).hexdigest()
    return cache_dir() / "object-meta" / f"{key}.json"


def scan_object(file: ObjectFile, credentials: Iterable[StoreCredentials] = ()) -> tuple[int, int]:
    """``(rows, row_groups)`` of an object shard; raises ``ValueError`` for an unreadable footer or stream."""
    cached = _meta_path(file)
    try:
        data = json.loads(cached.read_text())
        return int(data["rows"]), int(data["row_groups"])
    except (OSError, ValueError, KeyError, TypeError):  # absent or damaged: read the object again
        pass
    if file.format == "parquet":
        meta = pq.read_metadata(pa.BufferReader(read_tail(file, credentials)))
        rows, groups = meta.num_rows, meta.num_row_groups
    else:
        rows, groups = len(line_spans(decompress(read_whole(file, credentials), file.format))[0]), 1
    record = json.dumps({"uri": file.uri, "pin": file.pin, "rows": rows, "row_groups": groups})
    write_atomic(cached, lambda tmp: tmp.write_text(record), "the object metadata cache")
    return rows, groups
