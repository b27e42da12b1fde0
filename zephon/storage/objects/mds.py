"""MDS datasets of records on object stores (``s3://``, ``gs://``, ``az://``): ``index.json`` and each shard's
header by range GETs, never a sample's bytes.

A prefix whose listing holds ``index.json`` beside ``*.mds`` objects (or compressed ``*.mds.zstd`` …) is an MDS
dataset (``zephon.storage.mds_records``): ``mds_objects`` GETs ``index.json`` once (carrying its pin; counted in
``REQUESTS["mds_index"]``), checks it describes records (a token column makes a token store: ``fmt="mds"``), and
gives one shard per entry, in the index's order, each the listed object it names (the raw shard, else its
compressed file) with its entry. ``scan_mds_object`` then reads the shard's header — one range GET of
``4 × (samples + 2)`` bytes at 0, carrying the object's pin (``REQUESTS["mds_header"]``) — and checks it against the
entry as a local scan does; a compressed shard is one GET of the whole object (``REQUESTS["whole"]``),
decompressed in memory. The shard's fingerprint is its pin (``etag:<ETag>[@<version>]``), as for every object
shard: at run time each GET carries it, so a shard rewritten since planning is refused by the store (HTTP 412).
A shard checked is remembered under ``$ZEPHON_CACHE_DIR/mds-checked``, keyed by its URI, pin, size and entry (a
rewritten object has another ETag, another entry another key), so re-planning it makes no GET.

Example: ``s3://b/pairs/`` holding ``index.json``, ``shard.00000.mds`` (5 samples) and ``shard.00001.mds`` (2)
plans with 1 LIST, 1 GET of ``index.json`` and 2 header GETs of 28 and 16 bytes; ``shards.parquet`` rows are the
local plan's but for ``uri`` and ``fingerprint``, and ``samples.parquet`` is the local plan's byte for byte.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from zephon.errors import DatasetError
from zephon.plan.records import ShardInfo
from zephon.specs import StoreCredentials
from zephon.storage.files import cache_dir, write_atomic
from zephon.storage.local import SourceFile
from zephon.storage.mds_compression import check_algorithm, compression_of, shard_file
from zephon.storage.mds_records import check_shard, is_record_index, parse_index
from zephon.storage.objects.paths import ObjectPath
from zephon.storage.objects.reads import ObjectFile, get_range, quoted_etag, with_version
from zephon.storage.objects.scan import AHEAD, ReadAhead, following, remember_listing

__all__ = ["is_mds_listing", "mds_objects", "scan_mds_object"]

INDEX = "index.json"
#: The MDS shards listed in this process by (URI, pin): what a header read ahead needs (its entry).
_listed: dict[tuple[str, str], SourceFile] = {}
_headers: ReadAhead[ShardInfo] = ReadAhead("zephon-mds-headers")


def is_mds_name(name: str) -> bool:
    """An MDS shard's file name: ``*.mds`` or a compressed ``*.mds.<algorithm>``."""
    return name.endswith(".mds") or compression_of(name) is not None


def is_mds_listing(prefix: str, metas: list[dict[str, Any]]) -> bool:
    """Whether a prefix's listing is an MDS folder: MDS shard objects directly under ``prefix`` (``index.json``
    beside them or not: a missing index is refused by ``mds_objects``)."""
    return any(
        str(m["path"]).startswith(prefix) and "/" not in str(m["path"])[len(prefix) :] and is_mds_name(str(m["path"]))
        for m in metas
    )


def _object(path: ObjectPath, meta: dict[str, Any], fmt: str) -> ObjectFile:
    return ObjectFile(
        path=path.child(meta["path"]),
        size=int(meta["size"]),
        etag=quoted_etag(str(meta.get("e_tag") or "")),
        version=meta.get("version") or None,
        format=fmt,
    )


def mds_objects(
    dataset: str, path: ObjectPath, prefix: str, metas: list[dict[str, Any]], credentials: Iterable[StoreCredentials]
) -> tuple[SourceFile, ...]:
    """The shards of the MDS folder ``prefix`` (module docstring), from its listing ``metas``."""
    by_key = {str(m["path"]): m for m in metas}
    folder = path.child(prefix).uri
    index = by_key.get(prefix + INDEX)
    if index is None:
        raise DatasetError(
            f"dataset {dataset!r}: MDS folder {folder} must hold index.json beside its shards, got no such object — "
            "upload the index.json MDSWriter wrote"
        )
    index_file = _object(path, index, "json")
    name = f"dataset {dataset!r}: {index_file.uri}"
    raw_index = get_range(index_file, 0, index_file.size, credentials, kind="mds_index")[0] if index_file.size else b""
    entries = parse_index(raw_index, name)
    if not is_record_index(entries):
        raise DatasetError(
            f"{name} must describe MDS records (a column that is not str, no tokens/input_ids column), got a token "
            'store\'s columns — read it as a token store: Dataset.from_path(..., fmt="mds")'
        )
    out = []
    for entry in entries:
        raw = by_key.get(prefix + str((entry.get("raw_data") or {}).get("basename")))
        basename, _, compressed = shard_file(entry)
        meta = raw if raw is not None or compressed is None else by_key.get(prefix + basename)
        if meta is None:
            raise DatasetError(
                f"dataset {dataset!r}: MDS shard {path.child(prefix + basename).uri} must exist as index.json lists, "
                "got no such object — upload every shard index.json lists"
            )
        obj = _object(path, meta, "mds")
        if raw is None:
            check_algorithm(entry, f"dataset {dataset!r}: MDS shard {obj.uri}")
        if not obj.etag:
            raise DatasetError(
                f"dataset {dataset!r}: object {obj.uri} must have an ETag to be pinned, got none from the store — use "
                "a store that returns ETags"
            )
        if raw is not None:  # the raw shard wins over its compressed file (range reads)
            entry = {**entry, "zip_data": None}
        out.append(SourceFile(uri=obj.uri, format="mds", size=obj.size, remote=obj, entry=json.dumps(entry)))
    objects = [f.remote for f in out if isinstance(f.remote, ObjectFile)]
    _listed.update(((obj.uri, obj.pin), f) for f, obj in zip(out, objects, strict=True))
    remember_listing(objects)  # the shards' order, for the headers read ahead
    return tuple(out)


def scan_mds_object(dataset: str, file: SourceFile, credentials: Iterable[StoreCredentials] = ()) -> ShardInfo:
    """Rows and pin of an MDS shard object: its header by one range GET (a compressed shard: one whole GET).

    The headers of the next ``AHEAD`` shards of the listing are read too, concurrently (as tar headers and
    Parquet footers are: ``zephon.storage.objects.scan``), so a planner that scans shard after shard waits for
    about one round trip per ``AHEAD`` shards. The results are what one-by-one scans give; an error of a shard
    read ahead is raised when that shard is scanned."""
    obj = file.remote
    assert isinstance(obj, ObjectFile)
    creds = tuple(credentials)
    own = _headers.start(obj, _scan, dataset, file, creds)
    for sibling in following(obj, AHEAD):
        listed = _listed.get((sibling.uri, sibling.pin))
        if listed is not None:
            _headers.start(sibling, _scan, dataset, listed, creds)
    return _headers.take(obj, own)


def _checked_path(obj: ObjectFile, entry: str) -> Path:
    """Where a shard checked at planning is remembered: keyed by its URI, pin, size and ``index.json`` entry."""
    key = hashlib.blake2b(f"{obj.uri}\0{obj.pin}\0{obj.size}\0{entry}".encode(), digest_size=16).hexdigest()
    return cache_dir() / "mds-checked" / f"{key}.json"


def _scan(dataset: str, file: SourceFile, creds: tuple[StoreCredentials, ...]) -> ShardInfo:
    obj = file.remote
    assert isinstance(obj, ObjectFile) and file.entry is not None
    entry = json.loads(file.entry)
    rows = int(entry["samples"])
    checked = _checked_path(obj, file.entry)
    try:  # checked before, these bytes (pin) against this entry: no GET
        version = json.loads(checked.read_text())["version"]
        pinned = obj if obj.version or not version else replace(obj, version=str(version))
        return ShardInfo(uri=obj.uri, format="mds", rows=rows, bytes=obj.size, row_groups=1, fingerprint=pinned.pin)
    except (OSError, ValueError, KeyError, TypeError):  # absent or damaged: check the shard
        pass
    where = f"dataset {dataset!r}: MDS shard {obj.uri}"
    first: list[dict[str, Any]] = []
    kind = "whole" if shard_file(entry)[2] is not None else "mds_header"

    def read(start: int, end: int) -> bytes:
        data, meta = get_range(obj, start, end, creds, kind=kind)
        first.append(meta)
        return data

    check_shard(entry, read, obj.size, where)
    pinned = with_version(obj, first[0]) if first else obj
    record = json.dumps({"uri": obj.uri, "pin": obj.pin, "version": pinned.version})
    write_atomic(checked, lambda tmp: tmp.write_text(record), "the MDS header cache")
    return ShardInfo(uri=obj.uri, format="mds", rows=rows, bytes=obj.size, row_groups=1, fingerprint=pinned.pin)
