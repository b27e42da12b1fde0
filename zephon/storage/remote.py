"""Remote shards in plans: their URI form, and their metadata scan (footers only for Parquet).

A remote shard is stored in ``shards.parquet`` as ``hf://datasets/{org}/{name}@{commit}/{path_in_repo}`` — the
file form, pinned to a commit, so it names exactly one blob — with ``fingerprint = "etag:<etag>"`` (the LFS
sha256, or the git blob id) and its size in ``bytes``. This is not a dataset path: dataset paths
(``hf://{org}/{name}/...``) name a split and are what users write.

Scanning a remote Parquet shard reads only its footer (two HTTP range requests); the result is cached
under ``$ZEPHON_CACHE_DIR/hub-meta`` keyed by the shard's etag, so re-planning makes no requests. A remote
JSONL shard must be read whole to count its lines: it is downloaded to a temporary file, indexed, and
deleted; its row count is cached the same way. A WebDataset ``.tar`` shard is indexed from its headers by
windows of range requests (``zephon.storage.tar_windows``; a ``.tar.gz`` is downloaded whole), and the index is
kept under ``$ZEPHON_CACHE_DIR/hub-tar-index`` by etag, for a selection's or a cost's ``__key__`` column
(``remote_tar_index``, which serves object-store tars from their index kept by pin too); at run time it is read
through the shard cache like every ``hf://`` shard.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

from zephon.errors import PlanFormatError
from zephon.storage.files import cache_dir, write_atomic
from zephon.storage.jsonl import decompress, line_spans
from zephon.storage.tar_index import TarIndex, load_index, save_index

_URI = re.compile(r"^hf://datasets/(?P<repo>[^/@]+/[^/@]+)@(?P<rev>[0-9a-f]{40})/(?P<path>.+)$")


def is_remote_uri(uri: str) -> bool:
    """A shard that is not a local file: an hf:// file or an object-store object (``s3://``, ``gs://``, ``az://``)."""
    return uri.startswith(("hf://datasets/", "s3://", "gs://", "az://"))


def is_hub_uri(uri: str) -> bool:
    return uri.startswith("hf://datasets/")


def remote_uri(file: object) -> str:
    """The plan's URI of a ``zephon.storage.hub.client.RemoteFile``."""
    return f"hf://datasets/{file.repo_id}@{file.revision}/{file.path_in_repo}"  # type: ignore[attr-defined]


def remote_file(uri: str, *, size: int, fingerprint: str, fmt: str):  # -> zephon.storage.hub.client.RemoteFile
    """Rebuild the ``RemoteFile`` of a plan row."""
    from zephon.storage.hub.client import RemoteFile

    m = _URI.match(uri)
    if m is None or not fingerprint.startswith("etag:"):
        raise PlanFormatError(
            f"remote shard uri must be hf://datasets/ORG/NAME@COMMIT/PATH with an etag fingerprint, got {uri!r} "
            f"({fingerprint!r}) — re-plan"
        )
    return RemoteFile(
        repo_id=m["repo"],
        revision=m["rev"],
        path_in_repo=m["path"],
        size=size,
        etag=fingerprint.removeprefix("etag:"),
        format=fmt,
    )


def _meta_path(etag: str, uri: str) -> Path:

    key = hashlib.blake2b(f"{uri}\0{etag}".encode(), digest_size=16).hexdigest()
    return cache_dir() / "hub-meta" / f"{key}.json"


def _tar_index_path(etag: str, uri: str) -> Path:
    key = hashlib.blake2b(f"{uri}\0{etag}".encode(), digest_size=16).hexdigest()
    return cache_dir() / "hub-tar-index" / f"{key}.npz"


def remote_tar_index(uri: str, *, size: int, fingerprint: str, fmt: str, where: str) -> TarIndex:
    """A remote WebDataset shard's member index (its ``__key__`` column for a selection or a cost): an object's as
    ``zephon.storage.objects.tars`` keeps it by pin (no request on the planning machine), a Hub file's as its scan
    kept it by etag, else rebuilt from its headers by windows of range requests (a ``.tar.gz``: read whole)."""
    if not is_hub_uri(uri):
        from zephon.storage.objects.reads import object_file
        from zephon.storage.objects.tars import object_tar_index

        return object_tar_index(object_file(uri, size=size, fingerprint=fingerprint, fmt=fmt), where)[0]
    from zephon.storage.hub.fetch import read_remote_range
    from zephon.storage.tar_windows import ranged_tar_index

    file = remote_file(uri, size=size, fingerprint=fingerprint, fmt=fmt)
    path = _tar_index_path(file.etag, uri)
    found = load_index(path) if fmt == "tar" else None
    if found is not None:
        return found
    index, _ = ranged_tar_index(lambda start, end: read_remote_range(file, start, end), size, fmt, where)
    if fmt == "tar":
        save_index(path, index)
    return index


def scan_remote(file: object) -> tuple[int, int]:
    """``(rows, row_groups)`` of a remote shard (a ``zephon.storage.hub.client.RemoteFile``), cached by etag."""
    from zephon.storage.hub.client import download_remote_file, read_remote_parquet_metadata

    uri = remote_uri(file)
    cached = _meta_path(file.etag, uri)  # type: ignore[attr-defined]
    try:
        data = json.loads(cached.read_text())
        return int(data["rows"]), int(data["row_groups"])
    except (OSError, ValueError, KeyError, TypeError):  # absent or damaged: read the shard again
        pass
    if file.format == "parquet":  # type: ignore[attr-defined]
        meta = read_remote_parquet_metadata(file)  # type: ignore[arg-type]
        rows, groups = meta.num_rows, meta.num_row_groups
    elif file.format == "tar":  # type: ignore[attr-defined]  # WebDataset: the headers by windows of range requests
        from zephon.storage.hub.fetch import read_remote_range
        from zephon.storage.tar_windows import ranged_tar_index

        def read(start: int, end: int) -> bytes:
            return read_remote_range(file, start, end)  # type: ignore[arg-type]

        index, _ = ranged_tar_index(read, file.size, "tar", f"shard {uri}")  # type: ignore[attr-defined]
        save_index(_tar_index_path(file.etag, uri), index)  # type: ignore[attr-defined]  # for a selection or a cost
        rows, groups = len(index), 1
    else:
        with tempfile.TemporaryDirectory(prefix="zephon-scan-") as tmp:
            dest = os.path.join(tmp, "shard")
            download_remote_file(file, dest)  # type: ignore[arg-type]
            if file.format == "tar.gz":  # type: ignore[attr-defined]
                from zephon.storage.tar_index import tar_index

                rows = len(tar_index(dest, "tar.gz", file.size, f"shard {uri}"))  # type: ignore[attr-defined]
            else:
                rows = len(line_spans(decompress(Path(dest).read_bytes(), file.format))[0])  # type: ignore[attr-defined]
            groups = 1
    record = json.dumps({"uri": uri, "rows": rows, "row_groups": groups})
    write_atomic(cached, lambda tmp: tmp.write_text(record), "the Hub metadata cache")
    return rows, groups
