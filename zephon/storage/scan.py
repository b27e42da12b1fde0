"""Shard metadata for planning: rows, bytes, row groups and a content fingerprint per shard.

* Parquet: row counts and row groups come from the footer; no data page is read. The fingerprint is a
  BLAKE2b digest of the file size and the footer bytes (the footer holds every column chunk's offsets,
  sizes and statistics, so a rewritten file has a different footer); ``zephon.plan.footer`` computes it, for
  shards and for the plan bundle's own files alike.
* Object-store shards (``s3://``, ``gs://``, ``az://``): ``zephon.storage.objects.scan`` (footers by one range
  request); the fingerprint is the object's pin, ``etag:<ETag>[@<version>]``.
* WebDataset tar shards: samples (keys) from the tar headers only (``zephon.storage.tar_index``); the
  fingerprint is a digest of the member listing. A ``.tar.gz`` is decompressed whole. On an object store the
  headers are read by range GETs and the index kept by the object's pin (``zephon.storage.objects.tars``);
  the fingerprint is the pin, as for every object shard.
* MDS folders of records: ``index.json`` and each shard's header (``zephon.storage.mds_records``; a compressed
  shard decompressed whole); on object stores and the Hub by one range request a shard
  (``zephon.storage.objects.mds``, ``zephon.storage.hub.mds``), the fingerprint being the file's pin there.
* JSONL (plain, gzip, zstd): one scan decompresses the file, counts rows (see ``zephon.storage.jsonl``) and
  hashes the compressed bytes. The result (row count, row byte offsets in the decompressed stream,
  fingerprint) is cached under ``$ZEPHON_CACHE_DIR/jsonl-index`` keyed by the file's absolute path, size and
  modification time, so a second plan over the same files does not rescan them.

The executor recomputes the same fingerprints when it opens a shard (:func:`parquet_fingerprint`,
:func:`jsonl_fingerprint`) to refuse data that changed under a plan. Cache files under ``$ZEPHON_CACHE_DIR``
are written with :func:`write_atomic` (a temporary in the same directory, then a rename), so a killed writer
leaves at most an unused ``*.tmp.*`` file, and a full or read-only disk raises a
:class:`~zephon.errors.StorageError` naming the path.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from zephon.errors import DatasetError, one_line
from zephon.plan.footer import parquet_fingerprint as parquet_fingerprint  # re-exported: the executor uses it
from zephon.plan.records import ShardInfo
from zephon.storage.files import cache_dir, write_atomic
from zephon.storage.jsonl import decompress, line_spans
from zephon.storage.local import SourceFile
from zephon.storage.objects.reads import ObjectFile
from zephon.storage.tar_index import TAR_FORMATS, tar_index


def scan_shard(dataset: str, file: SourceFile) -> ShardInfo:
    """Metadata of one shard; errors name the dataset and file."""
    if isinstance(file.remote, ObjectFile) and file.format in TAR_FORMATS:  # WebDataset: headers by range GETs
        from zephon.storage.objects.tars import object_tar_index

        index, pinned, _ = object_tar_index(file.remote, f"dataset {dataset!r}: shard {file.uri}", dataset=dataset)
        return ShardInfo(
            uri=file.uri, format=file.format, rows=len(index), bytes=file.size, row_groups=1, fingerprint=pinned.pin
        )
    if isinstance(file.remote, ObjectFile) and file.format == "mds":  # index.json's entry, the header by a range GET
        from zephon.storage.objects.mds import scan_mds_object

        return scan_mds_object(dataset, file)
    if isinstance(file.remote, ObjectFile):  # an object-store shard (zephon.storage.objects)
        from zephon.storage.objects.scan import scan_object

        try:
            rows, groups, pinned = scan_object(file.remote)
        except ValueError as exc:  # a truncated or corrupt stream, an unreadable footer
            raise DatasetError(
                f"dataset {dataset!r}: shard {file.uri} must be readable {file.format}, got {one_line(exc)} — fix or "
                "remove the object"
            ) from exc
        pin = pinned.pin
        return ShardInfo(
            uri=file.uri, format=file.format, rows=rows, bytes=file.size, row_groups=groups, fingerprint=pin
        )
    if file.remote is not None and file.format == "mds":  # MDS records on the Hub: the header by a range request
        from zephon.storage.hub.mds import scan_hub_mds

        return scan_hub_mds(dataset, file.remote)  # type: ignore[arg-type]
    if file.remote is not None:
        from zephon.storage.remote import scan_remote

        try:
            rows, groups = scan_remote(file.remote)
        except DatasetError as exc:  # a tar's member without its partner, a truncated tar: name the dataset
            raise DatasetError(f"dataset {dataset!r}: {exc}") from None
        except ValueError as exc:  # a truncated or corrupt stream, an unreadable footer
            raise DatasetError(
                f"dataset {dataset!r}: shard {file.uri} must be readable {file.format}, got {one_line(exc)} — fix the "
                "file on the Hub, or leave it out of the dataset's configs"
            ) from exc
        etag = file.remote.etag  # type: ignore[attr-defined]
        return ShardInfo(
            uri=file.uri, format=file.format, rows=rows, bytes=file.size, row_groups=groups, fingerprint=f"etag:{etag}"
        )
    if file.format == "parquet":
        return _scan_parquet(dataset, file)
    if file.format == "mds":  # an MDS dataset of records: index.json and the shard's header
        from zephon.storage.mds_records import scan_mds

        return scan_mds(dataset, file.uri, file.size)
    if file.format in TAR_FORMATS:  # WebDataset: samples by key, from the tar headers only
        index = tar_index(file.uri, file.format, file.size, f"dataset {dataset!r}: shard {file.uri}")
        return ShardInfo(
            uri=file.uri,
            format=file.format,
            rows=len(index),
            bytes=file.size,
            row_groups=1,
            fingerprint=index.fingerprint,
        )
    return _scan_jsonl(dataset, file)


def scan_shards(dataset: str, files: Sequence[SourceFile]) -> list[ShardInfo]:
    """Metadata of a batch of one dataset's shards, in order: what :func:`scan_shard` gives for each, with the
    batch's object-store footers read ahead of the one scanned (``zephon.storage.objects.scan.remember_listing``).
    The planner's scan fan-out (``zephon.planner.ray_scan``) runs one batch per Ray task."""
    objects = [f.remote for f in files if isinstance(f.remote, ObjectFile)]
    if objects:
        from zephon.storage.objects.scan import remember_listing

        remember_listing(objects)
    return [scan_shard(dataset, f) for f in files]


def jsonl_fingerprint(raw: bytes) -> str:
    """``"blake2b:<digest>"`` of a JSONL shard's bytes as stored (compressed, for .gz and .zst)."""
    return "blake2b:" + hashlib.blake2b(raw, digest_size=16).hexdigest()


def _scan_parquet(dataset: str, file: SourceFile) -> ShardInfo:
    try:
        size, fingerprint = parquet_fingerprint(file.uri)
        meta = pq.read_metadata(file.uri)
    except (OSError, ValueError) as exc:
        raise DatasetError(
            f"dataset {dataset!r}: shard {file.uri} must be a readable Parquet file, got {one_line(exc)} — "
            "re-export or remove the file"
        ) from exc
    return ShardInfo(
        uri=file.uri,
        format="parquet",
        rows=meta.num_rows,
        bytes=size,
        row_groups=meta.num_row_groups,
        fingerprint=fingerprint,
    )


def _index_path(file: SourceFile) -> Path:
    st = os.stat(file.uri)
    key = hashlib.blake2b(f"{file.uri}\0{st.st_size}\0{st.st_mtime_ns}".encode(), digest_size=16).hexdigest()
    return cache_dir() / "jsonl-index" / f"{key}.npz"


def _read_index(index: Path) -> tuple[int, int, str] | None:
    """``(rows, bytes, fingerprint)`` of a cached JSONL index, or None when absent or unreadable (rescan)."""
    if not index.is_file():
        return None
    try:
        with np.load(index) as cached:
            return int(cached["rows"]), int(cached["bytes"]), str(cached["fingerprint"])
    except Exception:  # a damaged cache file (any numpy/zip error) is a cache miss, never a failure
        return None


def _scan_jsonl(dataset: str, file: SourceFile) -> ShardInfo:
    index = _index_path(file)
    cached = _read_index(index)
    if cached is not None:
        rows, size, fingerprint = cached
        return ShardInfo(uri=file.uri, format=file.format, rows=rows, bytes=size, row_groups=1, fingerprint=fingerprint)
    try:
        raw = Path(file.uri).read_bytes()
        data = decompress(raw, file.format)
    except (OSError, ValueError) as exc:
        raise DatasetError(
            f"dataset {dataset!r}: shard {file.uri} must be readable {file.format}, got {one_line(exc)} — "
            "re-export or remove the file"
        ) from exc
    starts, _ends = line_spans(data)
    fingerprint = jsonl_fingerprint(raw)
    write_atomic(
        index,
        lambda tmp: np.savez(tmp, rows=len(starts), bytes=len(raw), fingerprint=fingerprint, offsets=starts),
        "the JSONL index cache",
    )
    return ShardInfo(
        uri=file.uri,
        format=file.format,
        rows=len(starts),
        bytes=len(raw),
        row_groups=1,
        fingerprint=fingerprint,
    )
