"""Resolve ``hf://`` dataset paths on the Hugging Face Hub to pinned file lists, and read remote shards.

:func:`resolve_hf_dataset` turns ``hf://{org}/{name}[@[{revision}][~{source}]]/[{config}/]{split}`` into a
:class:`ResolvedHfDataset`: the pinned commit, the chosen source, and every file of the split
(:class:`RemoteFile`) sorted by repository path. ``str(resolved.pinned)`` is itself a path (revision = the
40-hex commit, source and config explicit); resolving it gives the same files without resolving a branch,
so every rank of a job reads the same bytes.

All calls use the real ``huggingface_hub`` client (``HfApi``) with the endpoint read from ``HF_ENDPOINT``
and the token from the argument, ``HF_TOKEN`` or ``hf auth login`` — both at call time:

1. ``~original`` or no source: ``dataset_info(revision)`` (default ``main``) gives the commit and the card
   (``cardData``: the README's YAML front matter); :mod:`zephon.storage.hub.discovery` picks the files (card
   ``configs:`` globs, listing only the directory that holds them, else the default layout rules). Without a
   source, uploaded files in a supported format (``.parquet``, ``.jsonl``, ``.jsonl.gz``, ``.jsonl.zst``)
   win; any other format switches to the conversion, which the Hub builds for the main branch only.
2. ``~parquet``: the commit of branch ``refs/convert/parquet`` (no call when the path names a commit), then
   the tree at that commit, laid out ``{config}/{split}/NNNN.parquet``. Partial conversions are refused.
3. Several configs need one in the path; unknown revisions/configs/splits are errors listing what exists.

Errors are one-line :class:`~zephon.errors.HubError`: 401/403 say to run ``hf auth login``, set
``HF_TOKEN`` or request access on the dataset page; 429/5xx and network errors are retried per
:class:`RetryPolicy` (exponential backoff) and then reported. Tree-listing pages are retried by
``huggingface_hub``'s own ``http_backoff`` and not again here. ``HF_HUB_OFFLINE`` set in the environment
refuses every call. Tokens never appear in a message, repr or log. A listing with a path that is not a
relative path inside the repository (``../x``, ``/etc/passwd``) is refused (:func:`check_repo_path`).

:func:`read_remote_parquet_metadata` reads only a Parquet footer: two range requests (the last 8 bytes give
the footer length, then the footer). :func:`download_remote_file` streams a whole file to
``dest + ".part-<pid>"``, checks size and hash (sha256 for LFS etags, git blob sha1 otherwise), then
``os.replace``-s it into place.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
from huggingface_hub import HfApi, get_token, hf_hub_url
from huggingface_hub.errors import (
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_stream_backoff

from zephon.errors import DatasetError, HubError
from zephon.storage.files import atomic_file, removed_on_failure
from zephon.storage.hub.discovery import SUPPORTED_FORMATS, file_format, select_conversion, select_original
from zephon.storage.hub.paths import HfPath, is_commit_sha, parse_hf_path

try:  # huggingface_hub >= 2 ships on httpx2; 1.x on httpx.
    import httpx2 as _httpx
except ImportError:  # pragma: no cover
    import httpx as _httpx  # type: ignore[no-redef]

__all__ = [
    "DEFAULT_RETRY",
    "RemoteFile",
    "ResolvedHfDataset",
    "RetryPolicy",
    "download_remote_file",
    "hub_endpoint",
    "read_remote_parquet_metadata",
    "resolve_hf_dataset",
]

CONVERSION_REVISION = "refs/convert/parquet"
RETRY_STATUSES: tuple[int, ...] = (429, 500, 502, 503, 504)
_HTTP_ERRORS = (HfHubHTTPError, _httpx.TransportError, OfflineModeIsEnabled)
_SHA256 = re.compile(r"[0-9a-f]{64}")
_DOWNLOAD_FIX = "or download to another directory (CacheOptions.root, ZEPHON_CACHE_DIR)"
_T = TypeVar("_T")


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """``attempts`` tries in total on 429/5xx/network errors, sleeping ``base_delay * 2**(n-1)`` seconds
    (at most ``max_delay``) after the n-th failure."""

    attempts: int = 4
    base_delay: float = 0.5
    max_delay: float = 4.0

    def delay(self, failures: int) -> float:
        return min(self.max_delay, self.base_delay * 2 ** (failures - 1))


DEFAULT_RETRY = RetryPolicy()  # read at call time, so tests may monkeypatch a faster one


def hub_endpoint() -> str:
    """The Hub endpoint, read from ``HF_ENDPOINT`` now (default ``https://huggingface.co``)."""
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


@dataclass(frozen=True, kw_only=True, slots=True)
class RemoteFile:
    """One file of a resolved split at a pinned commit."""

    repo_id: str
    revision: str  # 40-hex commit sha
    path_in_repo: str
    size: int
    etag: str  # the LFS sha256 for LFS files, the git blob sha1 otherwise
    format: str  # one of zephon.storage.hub.discovery.SUPPORTED_FORMATS

    def url(self, endpoint: str | None = None) -> str:
        """The resolve URL of this file at its commit on ``endpoint`` (default: :func:`hub_endpoint`)."""
        ep = endpoint or hub_endpoint()
        return hf_hub_url(self.repo_id, self.path_in_repo, repo_type="dataset", revision=self.revision, endpoint=ep)


@dataclass(frozen=True, kw_only=True, slots=True)
class ResolvedHfDataset:
    """A split pinned to a commit: ``str(pinned)`` resolves to the same files with no branch lookup."""

    path: HfPath
    pinned: HfPath
    commit: str
    source: str
    files: tuple[RemoteFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def resolve_hf_dataset(
    path: HfPath | str, *, token: str | None = None, retry: RetryPolicy | None = None
) -> ResolvedHfDataset:
    """Pin ``path`` to a commit and list the files of its split (see the module docstring)."""
    hf = path if isinstance(path, HfPath) else parse_hf_path(path)
    _check_online(hf.repo_id, f"resolve {hf}")
    return _Resolver(hf, token, retry or DEFAULT_RETRY).resolve()


class _Resolver:
    def __init__(self, hf: HfPath, token: str | None, retry: RetryPolicy) -> None:
        self.hf, self.retry, self.endpoint = hf, retry, hub_endpoint()
        self._token = token or get_token()
        self.api = HfApi(endpoint=self.endpoint, token=self._token or False, library_name="zephon")

    def resolve(self) -> ResolvedHfDataset:
        hf = self.hf
        if hf.source == "parquet":
            return self._conversion(prefer=None)
        revision = hf.revision or "main"
        info = self._call(
            f"the revision {revision!r}", revision, lambda: self.api.dataset_info(hf.repo_id, revision=revision)
        )
        card = info.card_data.to_dict() if info.card_data is not None else {}
        commit = str(info.sha)
        config, split, paths, entries = select_original(hf, commit, card, lambda prefix: self._list(commit, prefix))
        unsupported = [p for p in paths if file_format(p) is None]
        if not unsupported:
            return self._result(commit, "original", config, split, paths, entries)
        conversion = replace(hf, revision=None, source="parquet")
        got = f"got {unsupported[0]!r} ({len(unsupported)} unsupported of {len(paths)})"
        must = f"must be {', '.join(SUPPORTED_FORMATS)}"
        if hf.source == "original":
            where = f"dataset {hf.repo_id} config {config!r} split {split!r}"
            raise HubError(f"files of {where} {must}, {got} — read the Hub's Parquet conversion with {conversion}")
        if hf.revision not in (None, "main"):
            raise HubError(
                f"files of dataset {hf.repo_id} at revision {hf.revision!r} {must}, {got}, and the Hub converts "
                f"only the main branch to Parquet — use {conversion} (the conversion of main)"
            )
        return self._conversion(prefer=config)

    def _conversion(self, prefer: str | None) -> ResolvedHfDataset:
        hf = self.hf
        if is_commit_sha(hf.revision):
            commit = str(hf.revision)
        elif hf.revision in (None, "main"):
            rev = CONVERSION_REVISION
            commit = str(
                self._call("the Parquet conversion", rev, lambda: self.api.dataset_info(hf.repo_id, revision=rev)).sha
            )
        else:
            raise HubError(
                f"revision of {hf} must be main or a commit sha of {CONVERSION_REVISION} when reading the Parquet "
                f"conversion, got {hf.revision!r} — the Hub converts only the main branch: drop @{hf.revision} "
                f"or read uploaded files with ~original"
            )
        entries = self._list(commit, "")
        config, split, paths = select_conversion(hf, commit, entries, prefer)
        return self._result(commit, "parquet", config, split, paths, entries)

    def _result(
        self, commit: str, source: str, config: str, split: str, paths: list[str], entries: Mapping[str, Any]
    ) -> ResolvedHfDataset:
        files = []
        for path in sorted(paths):
            entry = entries[path]
            etag = entry.lfs.sha256 if entry.lfs is not None else entry.blob_id
            fmt = file_format(path) or "parquet"
            files.append(
                RemoteFile(
                    repo_id=self.hf.repo_id,
                    revision=commit,
                    path_in_repo=path,
                    size=int(entry.size),
                    etag=str(etag),
                    format=fmt,
                )
            )
        pinned = replace(self.hf, revision=commit, source=source, config=config, split=split)
        return ResolvedHfDataset(path=self.hf, pinned=pinned, commit=commit, source=source, files=tuple(files))

    def _list(self, commit: str, prefix: str) -> dict[str, object]:
        """Files under ``prefix`` at ``commit`` (path -> RepoFile). Pages are retried by huggingface_hub."""
        try:
            items = list(
                self.api.list_repo_tree(
                    self.hf.repo_id, prefix or None, recursive=True, revision=commit, repo_type="dataset"
                )
            )
        except RemoteEntryNotFoundError:
            return {}
        except _HTTP_ERRORS as exc:
            raise self._error(exc, "the file listing", 1, commit) from exc
        for item in items:
            check_repo_path(item.path, self.hf.repo_id, commit, self.endpoint)
        return {item.path: item for item in items if hasattr(item, "blob_id")}

    def _call(self, what: str, revision: str | None, fn: Callable[[], _T]) -> _T:
        return _with_retries(fn, self.retry, lambda exc, n: self._error(exc, what, n, revision))

    def _error(self, exc: BaseException, what: str, attempts: int, revision: str | None) -> HubError:
        if isinstance(exc, RevisionNotFoundError) and revision is not None:
            return self._revision_error(revision)
        token_sent = bool(self._token)
        return _http_error(exc, self.hf.repo_id, self.endpoint, what, token_sent=token_sent, attempts=attempts)

    def _revision_error(self, revision: str) -> HubError:
        hf = self.hf
        if revision == CONVERSION_REVISION:
            return HubError(
                f"dataset {hf.repo_id} must have a Parquet conversion (branch {CONVERSION_REVISION}) to read {hf}, "
                f"got none — read uploaded files with ~original"
            )
        try:
            refs = self._call(
                "the list of refs", None, lambda: self.api.list_repo_refs(hf.repo_id, repo_type="dataset")
            )
            branches = ", ".join(sorted(b.name for b in refs.branches)) or "none"
            available = f"branches: {branches}; tags: {', '.join(sorted(t.name for t in refs.tags)) or 'none'}"
        except HubError:
            available = "refs: (the list of refs could not be read)"
        kind = "commit" if is_commit_sha(revision) else "revision"
        return HubError(
            f"{kind} of dataset {hf.repo_id} must exist, got {revision!r} — available {available} (or pin a commit sha)"
        )


def is_safe_repo_path(path: object) -> bool:
    """True for a relative POSIX path inside a repository: non-empty ``/``-separated segments, none ``.`` or
    ``..``, no leading ``/``, no backslash, NUL or other control character. Git trees never hold anything else."""
    if not isinstance(path, str) or not path or path.startswith("/") or "\\" in path:
        return False
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        return False
    return all(segment not in ("", ".", "..") for segment in path.split("/"))


def check_repo_path(path: object, repo_id: str, commit: str, endpoint: str) -> None:
    """Refuse a listed path that could name something outside the repository (``../x``, ``/etc/passwd``).

    Such a path never comes from the Hub; refusing the listing keeps a malicious endpoint from steering
    downloads or cache names. (Cache file names never come from paths anyway: ``zephon.storage.shard_cache_lock``.)
    """
    if not is_safe_repo_path(path):
        raise HubError(
            f"file paths in the listing of dataset {repo_id} at commit {commit} must be relative paths inside the "
            f"repository, got {path!r} from {endpoint} — the endpoint returned an unsafe listing; check HF_ENDPOINT "
            "and the repository"
        )


def _check_online(repo_id: str, what: str) -> None:
    if os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE"):
        raise HubError(f"Hub access for dataset {repo_id} must be allowed to {what}, got HF_HUB_OFFLINE set — unset it")


def _with_retries(fn: Callable[[], _T], policy: RetryPolicy, on_error: Callable[[BaseException, int], HubError]) -> _T:
    """Call ``fn``; retry 429/5xx and network errors per ``policy``; map failures with ``on_error``."""
    attempts = max(1, policy.attempts)
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except _HTTP_ERRORS as exc:
            transient = isinstance(exc, _httpx.TransportError) or _status(exc) in RETRY_STATUSES
            if not transient or attempt == attempts:
                raise on_error(exc, attempt) from exc
            time.sleep(policy.delay(attempt))
    raise AssertionError("unreachable")  # pragma: no cover


def _status(exc: BaseException) -> int | None:
    return getattr(getattr(exc, "response", None), "status_code", None)


def _http_error(
    exc: BaseException, repo_id: str, endpoint: str, what: str, *, token_sent: bool, attempts: int
) -> HubError:
    """A one-line HubError for a failed Hub request. Never includes the token."""
    page, status = f"{endpoint}/datasets/{repo_id}", _status(exc)
    if isinstance(exc, OfflineModeIsEnabled):
        return HubError(
            f"Hub access for dataset {repo_id} must be allowed, got HF_HUB_OFFLINE set — unset it to read {what}"
        )
    if status == 401:
        return HubError(
            f"access to dataset {repo_id} must be authorized, got HTTP 401 with "
            f"{'a token the Hub rejected' if token_sent else 'no token'} — run `hf auth login` or set HF_TOKEN, "
            f"and request access on {page} if the dataset is gated"
        )
    if status == 403:
        return HubError(
            f"access to dataset {repo_id} must be granted to your token, got HTTP 403 — request access on {page}, "
            f"or run `hf auth login` / set HF_TOKEN with a token that has access"
        )
    if isinstance(exc, RemoteEntryNotFoundError):
        return HubError(f"{what} of dataset {repo_id} must exist, got HTTP 404 — the file is gone; resolve again")
    if isinstance(exc, RepositoryNotFoundError) or status == 404:
        return HubError(
            f"dataset {repo_id} must exist on {endpoint}, got HTTP {status} for {what} — check the org/name "
            f"spelling; for a private dataset run `hf auth login` or set HF_TOKEN"
        )
    if status in RETRY_STATUSES or isinstance(exc, _httpx.TransportError):
        got = f"HTTP {status}" if status is not None else type(exc).__name__
        return HubError(
            f"Hub at {endpoint} must answer {what} of dataset {repo_id}, got {got} after {attempts} attempt(s) "
            f"— the Hub is unavailable or rate-limiting; retry later"
        )
    return HubError(f"Hub request for {what} of dataset {repo_id} must succeed, got HTTP {status} — check {page}")


# -- remote reads ----------------------------------------------------------------------------------------
def _stream(
    file: RemoteFile,
    token: str | None,
    retry: RetryPolicy | None,
    extra: Mapping[str, str],
    what: str,
    consume: Callable[[Any], _T],
) -> _T:
    """GET the file's resolve URL (streamed, retried per ``retry``), then ``consume(response)``."""
    _check_online(file.repo_id, f"read {what}")
    policy, endpoint = retry or DEFAULT_RETRY, hub_endpoint()
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
                except _httpx.TransportError as exc:  # raising it inside would re-enter the backoff generator
                    broken = exc
        except _HTTP_ERRORS as exc:
            raise _http_error(exc, file.repo_id, endpoint, what, token_sent=bool(token), attempts=attempts) from exc
        if attempt == attempts:
            raise _http_error(
                broken, file.repo_id, endpoint, what, token_sent=bool(token), attempts=attempt
            ) from broken
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
) -> None:
    """Download ``file`` whole to ``dest`` atomically (``dest + ".part-<pid>"``, then ``os.replace``; see
    :func:`~zephon.storage.files.atomic_file`), checking its size and hash before the rename: sha256 when the
    etag is an LFS sha256, the git blob sha1 when it is a 40-hex oid. ``in_place=True`` writes ``dest`` itself,
    for a caller (the shard cache) whose ``dest`` is already a temporary name it renames; a failed download then
    removes ``dest``, and an ``OSError`` is left for that caller to word."""
    label = f"{file.path_in_repo} of dataset {file.repo_id} at {file.revision}"
    if in_place:
        with removed_on_failure(Path(dest)):
            Path(dest).parent.mkdir(parents=True, exist_ok=True)
            _download_checked(file, dest, label, token, retry)
        return
    part = Path(f"{dest}.part-{os.getpid()}")
    with atomic_file(Path(dest), f"the download of {label}", _DOWNLOAD_FIX, temporary=part):
        _download_checked(file, str(part), label, token, retry)


def _download_checked(file: RemoteFile, part: str, label: str, token: str | None, retry: RetryPolicy | None) -> None:
    """Stream ``file`` into ``part`` (fsynced), then check its size and hash; raise ``HubError`` when they differ."""

    def consume(response: Any) -> tuple[int, str | None]:  # (bytes received, hex digest or None)
        if _SHA256.fullmatch(file.etag):
            digest = hashlib.sha256()
        elif is_commit_sha(file.etag):
            digest = hashlib.sha1(f"blob {file.size}\0".encode())
        else:
            digest = None
        written = 0
        with open(part, "wb") as out:
            for chunk in response.iter_bytes(1 << 20):
                written += len(chunk)
                if written > file.size:
                    break
                out.write(chunk)
                if digest is not None:
                    digest.update(chunk)
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
