"""Read the files of a resolved split: Parquet footers by range requests, whole files by verified downloads.

:func:`read_remote_parquet_metadata` reads only a Parquet footer: two range requests (the last 8 bytes give
the footer length, then the footer). :func:`download_remote_file` streams a whole file to
``dest + ".part-<pid>"``, checks size and hash (sha256 for LFS etags, git blob sha1 otherwise), then
``os.replace``-s it into place.

Both GET the file's resolve URL at its pinned commit (:meth:`~zephon.storage.hub.resolve.RemoteFile.url`),
with the endpoint and token read at call time and ``HF_HUB_OFFLINE`` refusing the read. Failed requests are
retried by ``huggingface_hub``'s ``http_stream_backoff`` per the :class:`~zephon.storage.hub.retry.RetryPolicy`;
a body that breaks mid-transfer is retried here, with the same backoff. Failures are the one-line errors of
:mod:`zephon.storage.hub.errors`; a file of another size than resolved says to resolve again, a wrong hash to
retry the download.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
from huggingface_hub import get_token
from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_stream_backoff

from zephon.errors import DatasetError, HubError
from zephon.storage.files import atomic_file, removed_on_failure
from zephon.storage.hub.errors import HTTP_ERRORS, TransportError, check_online, http_error
from zephon.storage.hub.paths import is_commit_sha
from zephon.storage.hub.resolve import RemoteFile, hub_endpoint
from zephon.storage.hub.retry import RetryPolicy, retry_policy
from zephon.storage.progress import progress_bar

__all__ = ["download_remote_file", "read_remote_parquet_metadata", "read_remote_range"]

_SHA256 = re.compile(r"[0-9a-f]{64}")
_DOWNLOAD_FIX = "or download to another directory (CacheOptions.root, ZEPHON_CACHE_DIR)"
_T = TypeVar("_T")


def _stream(
    file: RemoteFile,
    token: str | None,
    retry: RetryPolicy | None,
    extra: Mapping[str, str],
    what: str,
    consume: Callable[[Any], _T],
) -> _T:
    """GET the file's resolve URL (streamed, retried per ``retry``), then ``consume(response)``."""
    check_online(file.repo_id, f"read {what}")
    policy, endpoint = retry_policy(retry), hub_endpoint()
    token = token or get_token()
    headers = {**build_hf_headers(token=token or False, library_name="zephon"), "Accept-Encoding": "identity", **extra}
    backoff = {
        "max_retries": max(0, policy.attempts - 1),
        "base_wait_time": policy.base_delay,
        "max_wait_time": policy.max_delay,
    }
    attempts = max(1, policy.attempts)
    for attempt in range(1, attempts + 1):  # http_stream_backoff retries the request; this loop, broken bodies
        try:
            with http_stream_backoff("GET", file.url(endpoint), headers=headers, **backoff) as response:
                hf_raise_for_status(response)
                try:
                    return consume(response)
                except TransportError as exc:  # raising it inside would re-enter the backoff generator
                    broken = exc
        except HTTP_ERRORS as exc:
            raise http_error(exc, file.repo_id, endpoint, what, token_sent=bool(token), attempts=attempts) from exc
        if attempt == attempts:
            raise http_error(broken, file.repo_id, endpoint, what, token_sent=bool(token), attempts=attempt) from broken
        time.sleep(policy.delay(attempt))
    raise AssertionError("unreachable")  # pragma: no cover


def _read_range(file: RemoteFile, start: int, end: int, token: str | None, retry: RetryPolicy | None) -> bytes:
    label = f"{file.path_in_repo} of dataset {file.repo_id} at {file.revision}"

    def consume(response: Any) -> bytes:
        if response.status_code != 206:
            raise HubError(
                f"range request for {label} must answer HTTP 206, got {response.status_code} — the server ignores "
                f"Range headers; download the file instead"
            )
        total = response.headers.get("Content-Range", "").rpartition("/")[2]
        if total != str(file.size):
            raise HubError(
                f"size of {label} must be {file.size} bytes as resolved, got {total or 'unknown'} — the file "
                f"changed; resolve the dataset again"
            )
        data = response.read()
        if len(data) != end - start + 1:
            raise HubError(f"range {start}-{end} of {label} must be {end - start + 1} bytes, got {len(data)} — retry")
        return bytes(data)

    return _stream(file, token, retry, {"Range": f"bytes={start}-{end}"}, f"bytes {start}-{end} of {label}", consume)


def read_remote_range(
    file: RemoteFile, start: int, end: int, *, token: str | None = None, retry: RetryPolicy | None = None
) -> bytes:
    """Bytes ``[start, end)`` of the file at its pinned commit (``end`` exclusive), by one range request
    (retried); refused when the server's size differs from the resolved one."""
    return _read_range(file, start, end - 1, token, retry)


def read_remote_parquet_metadata(
    file: RemoteFile, *, token: str | None = None, retry: RetryPolicy | None = None
) -> pq.FileMetaData:
    """A remote Parquet file's footer, read with two range requests (the last 8 bytes: footer length and
    ``PAR1``; then the footer). Transfers ``8 + footer length`` bytes, never the file."""
    label = f"{file.path_in_repo} of dataset {file.repo_id} at {file.revision}"
    if file.format != "parquet" or file.size < 12:
        raise DatasetError(
            f"file {label} must be Parquet of at least 12 bytes to read its footer, got format {file.format!r} "
            f"of {file.size} bytes — download the file instead"
        )
    tail = _read_range(file, file.size - 8, file.size - 1, token, retry)
    footer_length = int.from_bytes(tail[:4], "little")
    if tail[4:] != b"PAR1" or footer_length + 12 > file.size:
        raise DatasetError(
            f"file {label} must end with a Parquet footer length and b'PAR1', got {tail!r} — it is corrupt"
        )
    footer = _read_range(file, file.size - 8 - footer_length, file.size - 9, token, retry)
    return pq.read_metadata(pa.BufferReader(footer + tail))


def download_remote_file(
    file: RemoteFile,
    dest: str,
    *,
    token: str | None = None,
    retry: RetryPolicy | None = None,
    in_place: bool = False,
    progress: bool | None = None,
) -> None:
    """Download ``file`` whole to ``dest`` atomically (``dest + ".part-<pid>"``, then ``os.replace``; see
    :func:`~zephon.storage.files.atomic_file`), checking its size and hash before the rename: sha256 when the
    etag is an LFS sha256, the git blob sha1 when it is a 40-hex oid. ``in_place=True`` writes ``dest`` itself,
    for a caller (the shard cache) whose ``dest`` is already a temporary name it renames; a failed download then
    removes ``dest``, and an ``OSError`` is left for that caller to word. ``progress``: a bar of the bytes
    received (:mod:`zephon.storage.progress`: ``None`` draws it on a terminal only, once a download has run
    a few seconds); it never changes what is written."""
    label = f"{file.path_in_repo} of dataset {file.repo_id} at {file.revision}"
    if in_place:
        with removed_on_failure(Path(dest)):
            Path(dest).parent.mkdir(parents=True, exist_ok=True)
            _download_checked(file, dest, label, token, retry, progress)
        return
    part = Path(f"{dest}.part-{os.getpid()}")
    with atomic_file(Path(dest), f"the download of {label}", _DOWNLOAD_FIX, temporary=part):
        _download_checked(file, str(part), label, token, retry, progress)


def _download_checked(
    file: RemoteFile, part: str, label: str, token: str | None, retry: RetryPolicy | None, progress: bool | None
) -> None:
    """Stream ``file`` into ``part`` (fsynced), then check its size and hash; raise ``HubError`` when they differ."""
    desc = f"downloading {file.path_in_repo.rpartition('/')[2]}"

    def consume(response: Any) -> tuple[int, str | None]:  # (bytes received, hex digest or None)
        if _SHA256.fullmatch(file.etag):
            digest = hashlib.sha256()
        elif is_commit_sha(file.etag):
            digest = hashlib.sha1(f"blob {file.size}\0".encode())
        else:
            digest = None
        written = 0
        bar = progress_bar(total=file.size, desc=desc, unit="B", unit_scale=True, progress=progress)
        with bar, open(part, "wb") as out:  # a retried body starts a new bar
            for chunk in response.iter_bytes(1 << 20):
                written += len(chunk)
                if written > file.size:
                    break
                out.write(chunk)
                if digest is not None:
                    digest.update(chunk)
                bar.update(len(chunk))
            out.flush()
            os.fsync(out.fileno())
        return written, digest.hexdigest() if digest is not None else None

    # An OSError here is writing the file (network failures arrive as HubError).
    written, hexdigest = _stream(file, token, retry, {}, f"the download of {label}", consume)
    if written != file.size:
        raise HubError(
            f"size of {label} must be {file.size} bytes, got {'more' if written > file.size else written} — the "
            f"file changed on the Hub or the transfer broke; resolve the dataset again"
        )
    if hexdigest is not None and hexdigest != file.etag:
        raise HubError(
            f"hash of {label} must match etag {file.etag}, got {hexdigest} — the download is corrupt; retry it"
        )
