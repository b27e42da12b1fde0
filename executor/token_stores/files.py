"""The files of a token store, wherever they are: local disk, ``s3://``/``gs://``/``az://`` or the Hub.

A token store is a few files beside each other (``web.idx`` + ``web.bin``; ``x.ds`` + ``x.ds.index``; a folder
with ``index.json`` and its shards). :func:`list_store_files` lists, once, every file whose path starts with the
store's path, keyed by the rest of its path (its *suffix*); each is a :class:`Blob` that reads byte ranges:

* local — a memory map, opened on first read; a range is a view of it (no copy);
* object stores — the listed object pinned by its ETag (:class:`~zephon.storage.objects.reads.ObjectFile`): every
  range is one GET carrying ``If-Match``, so a store changed after opening is refused, never mixed;
* the Hub (``hf://datasets/ORG/NAME[@REVISION]/PATH``) — the file at the commit the revision pointed to when
  listed (:class:`~zephon.storage.hub.resolve.RemoteFile`): every range is one range request at that commit.

Worked example: ``s3://b/corpus/web_text_document`` lists the keys under ``corpus/web_text_document`` (one
listing request) → ``{".idx": Blob(1 234 bytes), ".bin": Blob(9 876 543 bytes)}``; the Megatron reader then
reads the whole ``.idx`` (one GET) and, per ``read``, one GET of the ``.bin`` bytes of the documents asked for.
A folder ``s3://b/mds/`` gives ``{"/index.json": …, "/shard.00000.mds": …}``.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from zephon.errors import DatasetError
from zephon.specs import StoreCredentials
from zephon.storage.objects.paths import SCHEMES as OBJECT_SCHEMES
from zephon.storage.objects.paths import ObjectPath, is_object_uri, parse_object_path, scheme_of

__all__ = ["Blob", "BytesBlob", "LocalBlob", "StoreFiles", "list_store_files"]

HF_PREFIX = "hf://datasets/"


class Blob(Protocol):
    """A file read by byte ranges: ``name`` (for messages), ``size``, ``read(start, end)`` (end exclusive)."""

    name: str
    size: int
    local: bool

    def read(self, start: int, end: int) -> memoryview | bytes: ...


class LocalBlob:
    """A local file, memory-mapped on first read; ``read`` returns a view of the map."""

    local = True

    def __init__(self, path: Path, size: int) -> None:
        self.path, self.name, self.size = path, str(path), size
        self._map: np.ndarray | None = None
        self._fd: int | None = None  # the mapped file, for ``check_size``

    def read(self, start: int, end: int) -> memoryview | bytes:
        _check_range(self, start, end)
        if end == start:
            return b""
        if self._map is None:
            self._fd = os.open(self.path, os.O_RDONLY)
            weakref.finalize(self, os.close, self._fd)
            self._map = np.memmap(self.path, mode="r", dtype=np.uint8)
            if len(self._map) != self.size:
                raise DatasetError(
                    f"{self.name} must keep its size of {self.size} bytes while read, got {len(self._map)} — "
                    "it changed on disk; open the store again"
                )
        self.check_size()
        return memoryview(self._map[start:end])

    def check_size(self) -> None:
        """Refuse to read a mapped file truncated since it was mapped (one ``fstat`` of the mapped file): a read
        past its new end would be a SIGBUS — the process killed without a word. ``TokenStore.gather`` calls it
        before slicing the map; a truncation racing a read of the same moment is not caught."""
        if self._fd is not None and (now := os.fstat(self._fd).st_size) < self.size:
            raise DatasetError(
                f"{self.name} must keep its size of {self.size} bytes while read, got {now} — it was truncated on "
                "disk while the run read it; restore it, then resume from the run's last checkpoint"
            )


class BytesBlob:
    """Bytes in memory (a decompressed shard) as a blob."""

    local = True

    def __init__(self, name: str, data: bytes) -> None:
        self.name, self.size, self._data = name, len(data), memoryview(data)

    def read(self, start: int, end: int) -> memoryview | bytes:
        _check_range(self, start, end)
        return self._data[start:end]


class ObjectBlob:
    """One pinned object of ``s3://``, ``gs://`` or ``az://``; each ``read`` is one range GET with ``If-Match``."""

    local = False

    def __init__(self, file: object, credentials: tuple[StoreCredentials, ...]) -> None:
        from zephon.storage.objects.reads import ObjectFile

        assert isinstance(file, ObjectFile)
        self.file, self.name, self.size, self._credentials = file, file.uri, file.size, credentials

    def read(self, start: int, end: int) -> memoryview | bytes:
        from zephon.storage.objects.reads import read_range

        _check_range(self, start, end)
        return b"" if end == start else read_range(self.file, start, end, self._credentials)


class HubBlob:
    """One file of a Hub dataset repository at a pinned commit; each ``read`` is one range request."""

    local = False

    def __init__(self, file: object, token: str | None) -> None:
        from zephon.storage.hub.resolve import RemoteFile

        assert isinstance(file, RemoteFile)
        self.file, self.size, self._token = file, file.size, token
        self.name = f"hf://datasets/{file.repo_id}@{file.revision}/{file.path_in_repo}"

    def read(self, start: int, end: int) -> memoryview | bytes:
        from zephon.storage.hub.fetch import read_remote_range

        _check_range(self, start, end)
        return b"" if end == start else read_remote_range(self.file, start, end, token=self._token)


def _check_range(blob: Blob, start: int, end: int) -> None:
    if not 0 <= start <= end <= blob.size:
        raise DatasetError(
            f"{blob.name} must hold bytes {start}-{end}, got a file of {blob.size} bytes — it is shorter than its "
            "index says (truncated?); copy it again"
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreFiles:
    """Every file whose path starts with ``path``, by the rest of its path (``""`` is ``path`` itself)."""

    path: str
    files: Mapping[str, Blob]

    def get(self, suffix: str) -> Blob | None:
        return self.files.get(suffix)

    def need(self, suffix: str, what: str, fix: str) -> Blob:
        """The file at ``suffix``, or a one-line error naming it, ``what`` it is for, and ``fix``."""
        blob = self.files.get(suffix)
        if blob is None:
            raise DatasetError(f"token store {self.path!r} must have {what} {self.path + suffix}, got none — {fix}")
        return blob

    def suffixes(self, ending: str) -> list[str]:
        """The suffixes ending in ``ending``, sorted."""
        return sorted(s for s in self.files if s.endswith(ending))

    @property
    def is_directory(self) -> bool:
        return any(s.startswith("/") for s in self.files)

    def pins(self) -> dict[str, str]:
        """Each remote file's pin by its name: an object's ETag (and version id), a Hub file's content hash (LFS
        sha256 or git blob id) — what a rewrite of it changes (``part_fingerprint``)."""
        out: dict[str, str] = {}
        for blob in self.files.values():
            file = getattr(blob, "file", None)
            etag = getattr(file, "etag", None)
            if etag:
                version = getattr(file, "version", None)
                out[blob.name] = f"{etag}@{version}" if version else str(etag)
        return out


def list_store_files(
    path: str, *, credentials: Iterable[StoreCredentials] = (), token: str | None = None
) -> StoreFiles:
    """List the files of the store at ``path`` (see the module docstring); nothing is read."""
    text = str(path)
    if text.startswith("hf://"):
        return _hub_files(text, token)
    if scheme_of(text) in OBJECT_SCHEMES or is_object_uri(text):
        return _object_files(text, tuple(credentials))
    if "://" in text:
        raise DatasetError(
            f"token store path must be local, s3://, gs://, az:// or hf://datasets/ORG/NAME/PATH, got {text!r} — "
            "fix the path"
        )
    return _local_files(text)


def _local_files(text: str) -> StoreFiles:
    base = Path(text.rstrip("/") or "/")
    files: dict[str, Blob] = {}
    if base.is_dir():
        for root, dirs, names in os.walk(base):
            dirs.sort()
            for name in names:
                full = Path(root) / name
                rel = full.relative_to(base).as_posix()
                files["/" + rel] = LocalBlob(full, full.stat().st_size)
    parent = base.parent
    if base.name not in ("", ".", "..") and parent.is_dir():  # siblings by name: web.idx, web.bin beside "web"
        for entry in os.scandir(parent):
            if entry.name.startswith(base.name) and entry.is_file():
                files[entry.name[len(base.name) :]] = LocalBlob(Path(entry.path), entry.stat().st_size)
    if not files:
        raise DatasetError(
            f"token store path {text!r} must name a file, a file prefix or a folder, got nothing there — fix the path"
        )
    return StoreFiles(path=text.rstrip("/"), files=files)


def _object_level(path: ObjectPath, parent: str, credentials: tuple[StoreCredentials, ...]) -> dict:
    """The objects directly under ``parent`` and its sub-"folders" (one listing request a page)."""
    import obstore

    from zephon.storage.objects import stores
    from zephon.storage.objects.errors import object_error
    from zephon.storage.objects.reads import count_request

    count_request("list")
    try:
        return obstore.list_with_delimiter(stores.store_for(path, credentials), parent or None)
    except DatasetError:
        raise
    except Exception as exc:
        raise object_error(exc, path.child(parent).uri, path.cloud, "the listing") from None


def _object_files(text: str, credentials: tuple[StoreCredentials, ...]) -> StoreFiles:
    """Objects whose key starts with the path's key: its siblings by name (``web.idx``, ``web.bin``: a listing of
    the parent "folder", object stores list by whole path segments) and, when the key is a "folder", every
    object under it (a recursive listing)."""
    from zephon.storage.objects.listing import list_objects
    from zephon.storage.objects.reads import ObjectFile, quoted_etag

    path = parse_object_path(text.rstrip("/"))
    key = path.key
    metas: list[dict] = []
    if key:
        level = _object_level(path, key.rpartition("/")[0], credentials)
        metas = [m for m in level["objects"] if str(m["path"]).startswith(key)]
        folders = {str(p).rstrip("/") for p in level["common_prefixes"]}
    if not key or key in folders:
        metas += list_objects(path, key + "/" if key else "", credentials)
    files: dict[str, Blob] = {}
    for meta in metas:
        name = str(meta["path"])
        etag = meta.get("e_tag")
        if not etag:
            raise DatasetError(
                f"object {path.child(name).uri} must have an ETag to be pinned, got none from the store — use a "
                "store that returns ETags"
            )
        file = ObjectFile(
            path=path.child(name),
            size=int(meta["size"]),
            etag=quoted_etag(str(etag)),
            version=meta.get("version") or None,
            format="",
        )
        files[name[len(key) :] if key else "/" + name] = ObjectBlob(file, credentials)
    if not files:
        raise DatasetError(
            f"token store path {path.uri!r} must name an object, an object prefix or a folder, got nothing there — "
            "fix the path"
        )
    return StoreFiles(path=path.uri, files=files)


def _hub_files(text: str, token: str | None) -> StoreFiles:
    from huggingface_hub import HfApi, get_token
    from huggingface_hub.errors import RemoteEntryNotFoundError

    from zephon.storage.hub.errors import HTTP_ERRORS, check_online, http_error
    from zephon.storage.hub.resolve import RemoteFile, check_repo_path, hub_endpoint

    if not text.startswith(HF_PREFIX) or len(text[len(HF_PREFIX) :].split("/")) < 2:
        raise DatasetError(
            f"a token store on the Hub must be named hf://datasets/ORG/NAME[@REVISION]/PATH, got {text!r} — name the "
            "file prefix or folder inside the dataset repository"
        )
    org, name_rev, *rest = text[len(HF_PREFIX) :].rstrip("/").split("/")
    name, _, revision = name_rev.partition("@")
    repo_id, inside = f"{org}/{name}", "/".join(rest)
    check_online(repo_id, f"list the token store {text}")
    endpoint, token = hub_endpoint(), token or get_token()
    api = HfApi(endpoint=endpoint, token=token or False, library_name="zephon")
    try:
        commit = str(api.dataset_info(repo_id, revision=revision or "main").sha)
        parent = inside.rpartition("/")[0]
        try:
            tree = list(
                api.list_repo_tree(repo_id, parent or None, recursive=True, revision=commit, repo_type="dataset")
            )
        except RemoteEntryNotFoundError:
            tree = []
    except HTTP_ERRORS as exc:
        raise http_error(exc, repo_id, endpoint, f"the token store {text}", token_sent=bool(token), attempts=1) from exc
    files: dict[str, Blob] = {}
    for item in tree:
        check_repo_path(item.path, repo_id, commit, endpoint)
        if not hasattr(item, "blob_id") or not item.path.startswith(inside):
            continue
        etag = item.lfs.sha256 if getattr(item, "lfs", None) is not None else item.blob_id
        remote = RemoteFile(
            repo_id=repo_id, revision=commit, path_in_repo=item.path, size=int(item.size), etag=str(etag), format=""
        )
        files[item.path[len(inside) :] if inside else "/" + item.path] = HubBlob(remote, token)
    if not files:
        raise DatasetError(
            f"token store path {text!r} must name a file, a file prefix or a folder of dataset {repo_id} at "
            f"{revision or 'main'}, got nothing there — fix the path"
        )
    return StoreFiles(path=f"{HF_PREFIX}{repo_id}@{commit}/{inside}", files=files)
