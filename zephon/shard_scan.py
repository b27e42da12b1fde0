"""Shard metadata for planning: rows, bytes, row groups and a content fingerprint per shard.

* Parquet: row counts and row groups come from the footer; no data page is read. The fingerprint is a
  BLAKE2b digest of the file size and the footer bytes (the footer holds every column chunk's offsets,
  sizes and statistics, so a rewritten file has a different footer).
* JSONL (plain, gzip, zstd): one scan decompresses the file, counts rows (see ``zephon.jsonl_lines``) and
  hashes the compressed bytes. The result (row count, row byte offsets in the decompressed stream,
  fingerprint) is cached under ``$ZEPHON_CACHE_DIR/jsonl-index`` keyed by the file's absolute path, size and
  modification time, so a second plan over the same files does not rescan them.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from zephon.errors import DatasetError
from zephon.jsonl_lines import decompress, line_spans
from zephon.sources import SourceFile


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardInfo:
    """What the planner knows about one shard."""

    uri: str
    format: str
    rows: int
    bytes: int
    row_groups: int
    fingerprint: str


def cache_dir() -> Path:
    """Root of Zephon's local caches: ``$ZEPHON_CACHE_DIR``, else ``~/.cache/zephon``."""
    return Path(os.environ.get("ZEPHON_CACHE_DIR") or Path.home() / ".cache" / "zephon")


def scan_shard(dataset: str, file: SourceFile) -> ShardInfo:
    """Metadata of one shard; errors name the dataset and file."""
    if file.remote is not None:
        from zephon.remote import scan_remote

        rows, groups = scan_remote(file.remote)
        etag = file.remote.etag  # type: ignore[attr-defined]
        return ShardInfo(
            uri=file.uri, format=file.format, rows=rows, bytes=file.size, row_groups=groups, fingerprint=f"etag:{etag}"
        )
    if file.format == "parquet":
        return _scan_parquet(dataset, file)
    return _scan_jsonl(dataset, file)


def _scan_parquet(dataset: str, file: SourceFile) -> ShardInfo:
    try:
        with open(file.uri, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            if size < 12:
                raise ValueError("file is shorter than a Parquet header and footer")
            fh.seek(size - 8)
            tail = fh.read(8)
            if tail[4:] != b"PAR1":
                raise ValueError("file does not end with the Parquet magic bytes PAR1")
            (footer_len,) = struct.unpack("<I", tail[:4])
            fh.seek(size - 8 - footer_len)
            footer = fh.read(footer_len)
        meta = pq.read_metadata(file.uri)
    except (OSError, ValueError) as exc:
        raise DatasetError(
            f"dataset {dataset!r}: shard {file.uri} must be a readable Parquet file, got {exc} — "
            "re-export or remove the file"
        ) from exc
    digest = hashlib.blake2b(struct.pack("<Q", size) + footer, digest_size=16).hexdigest()
    return ShardInfo(
        uri=file.uri,
        format="parquet",
        rows=meta.num_rows,
        bytes=size,
        row_groups=meta.num_row_groups,
        fingerprint=f"pqfooter:{digest}",
    )


def _index_path(file: SourceFile) -> Path:
    st = os.stat(file.uri)
    key = hashlib.blake2b(f"{file.uri}\0{st.st_size}\0{st.st_mtime_ns}".encode(), digest_size=16).hexdigest()
    return cache_dir() / "jsonl-index" / f"{key}.npz"


def _scan_jsonl(dataset: str, file: SourceFile) -> ShardInfo:
    index = _index_path(file)
    if index.is_file():
        with np.load(index) as cached:
            return ShardInfo(
                uri=file.uri,
                format=file.format,
                rows=int(cached["rows"]),
                bytes=int(cached["bytes"]),
                row_groups=1,
                fingerprint=str(cached["fingerprint"]),
            )
    try:
        raw = Path(file.uri).read_bytes()
        data = decompress(raw, file.format)
    except (OSError, EOFError, ValueError) as exc:
        raise DatasetError(
            f"dataset {dataset!r}: shard {file.uri} must be readable {file.format}, got {exc} — "
            "re-export or remove the file"
        ) from exc
    starts, _ends = line_spans(data)
    fingerprint = "blake2b:" + hashlib.blake2b(raw, digest_size=16).hexdigest()
    index.parent.mkdir(parents=True, exist_ok=True)
    tmp = index.with_name(f"{index.stem}.{os.getpid()}.tmp.npz")
    np.savez(tmp, rows=len(starts), bytes=len(raw), fingerprint=fingerprint, offsets=starts)
    os.replace(tmp, index)
    return ShardInfo(
        uri=file.uri,
        format=file.format,
        rows=len(starts),
        bytes=len(raw),
        row_groups=1,
        fingerprint=fingerprint,
    )
