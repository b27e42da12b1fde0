"""Reading one pinned object: byte ranges, the Parquet footer, the whole object into a file.

An :class:`ObjectFile` is an object as listed at planning: its URI, size, ETag and (where the bucket keeps
versions) version id. Its pin — recorded in ``shards.parquet`` as the shard's ``fingerprint``, ``etag:<ETag>``
or ``etag:<ETag>@<version>`` — travels with every read: each GET carries ``If-Match: <ETag>`` (and the version
id when there is one, so a versioned bucket serves the planned bytes even after an overwrite), so the store
itself refuses an object changed after planning (HTTP 412), and the error names it. No extra HEAD request.

Requests: a Parquet footer costs one GET of the last 64 KiB (a second one only for a footer larger than that);
a whole object one GET, streamed. Failed requests are retried by the client (:mod:`.stores`); a body that
breaks after the headers is read again here, up to ``DEFAULT_RETRY.attempts`` times. :data:`REQUESTS` counts
the GETs by kind (benchmarks report requests per shard from it).
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from zephon.errors import DatasetError, PlanFormatError, StorageError
from zephon.specs import StoreCredentials
from zephon.storage.objects import stores
from zephon.storage.objects.errors import is_body_failure, object_error
from zephon.storage.objects.paths import ObjectPath, parse_object_path

__all__ = ["REQUESTS", "ObjectFile", "download_object", "object_file", "read_range", "read_tail"]

FOOTER_PROBE = 64 << 10
#: GETs made, by kind (``footer``, ``range``, ``whole``, ``list``): read by benchmarks and tests.
REQUESTS: Counter[str] = Counter()
_count_lock = threading.Lock()


def count_request(kind: str) -> None:
    with _count_lock:
        REQUESTS[kind] += 1


@dataclass(frozen=True, kw_only=True, slots=True)
class ObjectFile:
    """One object of a dataset, pinned: where it is, its size, ETag and version id, and its shard format."""

    path: ObjectPath
    size: int
    etag: str
    version: str | None
    format: str

    @property
    def uri(self) -> str:
        return self.path.uri

    @property
    def pin(self) -> str:
        """The plan's fingerprint of this object: ``etag:<ETag>[@<version>]``."""
        return f"etag:{self.etag}" + (f"@{self.version}" if self.version else "")

    def options(self, **extra: Any) -> dict[str, Any]:
        """GET options that refuse any other version of the object."""
        out: dict[str, Any] = {"if_match": self.etag, **extra}
        if self.version:
            out["version"] = self.version
        return out


def object_file(uri: str, *, size: int, fingerprint: str, fmt: str) -> ObjectFile:
    """Rebuild the ``ObjectFile`` of a plan row (``uri``, ``bytes``, ``fingerprint``, ``format``)."""
    if not fingerprint.startswith("etag:") or len(fingerprint) <= 5:
        raise PlanFormatError(
            f"object shard {uri} must have an etag:<ETag>[@<version>] fingerprint, got {fingerprint!r} — re-plan"
        )
    pin = fingerprint.removeprefix("etag:")
    etag, _, version = pin.partition("@")
    return ObjectFile(path=parse_object_path(uri), size=size, etag=etag, version=version or None, format=fmt)


def _store(file: ObjectFile, credentials: Iterable[StoreCredentials]) -> Any:
    return stores.store_for(file.path, credentials)


def transient(exc: BaseException) -> bool:
    """A failure worth a new request: a body that broke after its headers. Everything else the client has
    already retried per ``DEFAULT_RETRY`` (5xx, 429, connection failures, timeouts) or must not retry."""
    return is_body_failure(exc)


def from_store(exc: BaseException) -> bool:
    """The client raises Python's ``FileNotFoundError`` / ``PermissionError`` for some answers of the store;
    their messages name the object's location, a local file's do not."""
    return "Object at location" in str(exc) or "Error performing" in str(exc)


def _with_retries(file: ObjectFile, what: str, fn: Any) -> Any:
    from obstore import exceptions as ox

    attempts = max(1, stores.DEFAULT_RETRY.attempts)
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except (ox.BaseError, ConnectionError, FileNotFoundError, PermissionError, RuntimeError, ValueError) as exc:
            if isinstance(exc, DatasetError | StorageError) or (
                isinstance(exc, FileNotFoundError | PermissionError) and not from_store(exc)
            ):
                raise  # a local disk error propagates (the shard cache words it)
            if not transient(exc) or attempt == attempts:
                raise object_error(exc, file.uri, file.path.cloud, what, version=file.version) from None
            time.sleep(stores.DEFAULT_RETRY.base_delay * 2 ** (attempt - 1))
    raise AssertionError("unreachable")  # pragma: no cover


def read_range(
    file: ObjectFile, start: int, end: int, credentials: Iterable[StoreCredentials] = (), *, kind: str = "range"
) -> bytes:
    """Bytes ``[start, end)`` of the pinned object (``end`` exclusive); exactly that many, or an error."""
    return get_range(file, start, end, credentials, kind=kind)[0]


def get_range(
    file: ObjectFile, start: int, end: int, credentials: Iterable[StoreCredentials] = (), *, kind: str = "range"
) -> tuple[bytes, dict[str, Any]]:
    """``read_range`` and the object's metadata as the GET answered it (ETag, version: GCS's generation)."""
    import obstore

    if not 0 <= start < end <= file.size:
        raise DatasetError(f"range {start}-{end} of {file.uri} must lie within its {file.size} bytes — re-plan")
    store = _store(file, credentials)
    what = f"bytes {start}-{end - 1}"

    def get() -> tuple[bytes, dict[str, Any]]:
        count_request(kind)
        result = obstore.get(store, file.path.key, options=file.options(range=(start, end)))
        data = bytes(result.bytes())
        if len(data) != end - start:
            raise ConnectionError(f"a short body: {len(data)} of {end - start} bytes")  # read again
        return data, dict(result.meta)

    return _with_retries(file, what, get)


def read_tail(file: ObjectFile, credentials: Iterable[StoreCredentials] = ()) -> bytes:
    """The last bytes of a Parquet object, holding at least its footer, the footer's length and ``PAR1``: one
    GET of the last 64 KiB, and a second one only when the footer is longer."""
    return get_tail(file, credentials)[0]


def get_tail(file: ObjectFile, credentials: Iterable[StoreCredentials] = ()) -> tuple[bytes, dict[str, Any]]:
    """``read_tail`` and the metadata of its first GET."""
    if file.size < 12:
        raise DatasetError(
            f"object {file.uri} must be Parquet of at least 12 bytes, got {file.size} bytes — it is empty or truncated"
        )
    probe = min(file.size, FOOTER_PROBE)
    tail, meta = get_range(file, file.size - probe, file.size, credentials, kind="footer")
    if tail[-4:] != b"PAR1":
        raise DatasetError(
            f"object {file.uri} must end with the Parquet magic bytes PAR1, got {tail[-4:]!r} — it is truncated or "
            "not Parquet"
        )
    footer_length = int.from_bytes(tail[-8:-4], "little")
    if footer_length + 12 > file.size:
        raise DatasetError(
            f"object {file.uri} must hold its footer of {footer_length} bytes within {file.size} bytes — it is corrupt"
        )
    need = footer_length + 8
    if need <= len(tail):
        return tail, meta
    return read_range(file, file.size - need, file.size - probe, credentials, kind="footer") + tail, meta


def download_object(file: ObjectFile, dest: str, credentials: Iterable[StoreCredentials] = ()) -> None:
    """Write the whole pinned object to ``dest`` (streamed, fsynced); the caller renames it into place and
    removes it on failure (the shard cache does both)."""
    import obstore

    store = _store(file, credentials)

    def get() -> None:
        count_request("whole")
        written = 0
        result = obstore.get(store, file.path.key, options=file.options())
        with open(dest, "wb") as out:
            for chunk in result.stream(min_chunk_size=8 << 20):
                out.write(chunk)
                written += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        if written != file.size:
            raise ConnectionError(f"a short body: {written} bytes, {file.size} planned")

    _with_retries(file, "the whole object", get)


def read_whole(file: ObjectFile, credentials: Iterable[StoreCredentials] = ()) -> bytes:
    """The whole pinned object in memory (JSONL shards read by range mode, JSONL scans)."""
    return get_whole(file, credentials)[0]


def get_whole(file: ObjectFile, credentials: Iterable[StoreCredentials] = ()) -> tuple[bytes, dict[str, Any]]:
    """``read_whole`` and the metadata of its GET (none for an empty object, which needs no GET)."""
    if file.size == 0:
        return b"", {}
    return get_range(file, 0, file.size, credentials, kind="whole")


def quoted_etag(etag: str) -> str:
    """An ETag in its HTTP form: GCS lists ETags bare and answers HEAD and GET with them quoted."""
    return etag if not etag or etag.startswith(('"', "W/")) else f'"{etag}"'


def with_version(file: ObjectFile, meta: dict[str, Any]) -> ObjectFile:
    """``file`` with the version id its GET answered (GCS lists no generation; a GET states it), after checking
    that the GET read the listed object (same ETag)."""
    got = quoted_etag(str(meta.get("e_tag") or ""))
    if got and got != file.etag:
        raise DatasetError(
            f"object {file.uri} changed while it was planned: ETag must be {file.etag} as listed, got {got} — "
            "plan again"
        )
    version = meta.get("version")
    if file.version is not None or not version:
        return file
    return ObjectFile(path=file.path, size=file.size, etag=file.etag, version=str(version), format=file.format)
