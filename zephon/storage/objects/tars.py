"""WebDataset tar objects (``s3://``, ``gs://``, ``az://``): the member index from range GETs of the headers.

``object_tar_index(file, where)`` walks a plain ``.tar`` object's headers by windows of range GETs
(``zephon.storage.tar_windows``: 64 KiB ahead while payloads are small, a 4 KiB probe past a large payload) and
a ``.tar.gz`` by one GET of the whole object. Every GET carries the pin (``If-Match``), so a shard rewritten
since planning is refused by the store itself (HTTP 412, one line naming the object). GETs are counted in
``REQUESTS["tar_headers"]`` (a ``.tar.gz``: ``"whole"``).

Where the index lives: ``$ZEPHON_CACHE_DIR/tar-index/<digest of URI, ETag, size>.npz``, written at planning and
read by the executor when it opens the shard. Keyed by the pin, an entry can never describe other bytes (a
rewritten object has another ETag, hence another key), so it needs no checking. The plan bundle does not carry
it: the index is derived from the pinned bytes, its size grows with the samples (10^4 shards × 10^3 samples is
10^7 ranges), and a training node that lacks the planner's cache rebuilds it once per shard from the headers
alone (the same GETs planning made, a few per shard) — the bundle's format stays the same for every source.

Planning reads ahead: scanning one tar object of a listing starts the header walks of the next 16 (``AHEAD``, as
Parquet footers are read ahead: ``zephon.storage.objects.scan``), concurrently.

Example: a 10 MB shard of 100 (jpg 100 KB, txt, json) samples plans with ~100 GETs of 4 KiB (the headers and
the small members); a shard of 1,000 samples of 200-byte members with ~10 GETs of 64 KiB. Re-planning it, or
opening it on the planning machine, makes no GET.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from zephon.specs import StoreCredentials
from zephon.storage.files import cache_dir, write_atomic
from zephon.storage.objects.reads import ObjectFile, get_range, with_version
from zephon.storage.objects.scan import AHEAD, ReadAhead, following
from zephon.storage.tar_index import TAR_FORMATS, TarIndex, load_index, save_index
from zephon.storage.tar_windows import ranged_tar_index

__all__ = ["index_path", "object_tar_index"]

_headers: ReadAhead[tuple[TarIndex, ObjectFile, int]] = ReadAhead("zephon-tar-headers")


def index_path(file: ObjectFile) -> Path:
    """Where the index of the pinned ``file`` is kept."""
    key = hashlib.blake2b(f"{file.uri}\0{file.etag}\0{file.size}".encode(), digest_size=16).hexdigest()
    return cache_dir() / "tar-index" / f"{key}.npz"


def object_tar_index(
    file: ObjectFile, where: str, credentials: Iterable[StoreCredentials] = (), *, dataset: str | None = None
) -> tuple[TarIndex, ObjectFile, int]:
    """``(index, pinned, requests)`` of a tar object: from the pin's cache entry (no request), else from range
    GETs of its headers (saved for next time). ``pinned`` is ``file`` with the version id its first GET stated
    when the listing had none (GCS); ``where`` names the shard in errors.

    ``dataset`` (planning): the next ``AHEAD`` tar objects of the listing are indexed too, concurrently, so a
    planner that scans shard after shard waits for about one shard's GETs per ``AHEAD`` shards. The results are
    what one-by-one scans give; an error of a shard read ahead is raised when that shard is scanned."""
    found = _cached(file)
    if found is not None:
        _headers.forget(file)  # read ahead, done
        return found
    creds = tuple(credentials)
    if dataset is None:
        return _build(file, where, creds)
    own = _headers.start(file, _build, file, where, creds)
    for sibling in following(file, AHEAD):
        if sibling.format in TAR_FORMATS and not index_path(sibling).exists():
            _headers.start(sibling, _build, sibling, f"dataset {dataset!r}: shard {sibling.uri}", creds)
    return _headers.take(file, own)


def _cached(file: ObjectFile) -> tuple[TarIndex, ObjectFile, int] | None:
    path = index_path(file)
    found = load_index(path)
    if found is None:
        return None
    version = _version_of(path)
    return found, file if file.version or not version else replace(file, version=version), 0


def _build(file: ObjectFile, where: str, credentials: tuple[StoreCredentials, ...]) -> tuple[TarIndex, ObjectFile, int]:
    first: list[dict[str, Any]] = []

    def read(start: int, end: int) -> bytes:
        kind = "whole" if file.format == "tar.gz" else "tar_headers"
        data, meta = get_range(file, start, end, credentials, kind=kind)
        if not first:
            first.append(meta)
        return data

    index, requests = ranged_tar_index(read, file.size, file.format, where)
    pinned = with_version(file, first[0]) if first else file
    path = index_path(file)
    if pinned.version and not file.version:  # the version a GET stated (GCS), for the next plan's pin: written
        write_atomic(  # before the index, so that an index found always finds its version too
            path.with_suffix(".version"), lambda tmp: tmp.write_text(pinned.version or ""), "the tar index cache"
        )
    save_index(path, index)
    return index, pinned, requests


def _version_of(path: Path) -> str | None:
    try:
        return path.with_suffix(".version").read_text() or None
    except OSError:
        return None
