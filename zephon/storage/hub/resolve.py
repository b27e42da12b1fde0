"""Resolve ``hf://`` dataset paths on the Hugging Face Hub to pinned file lists.

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
   source, uploaded files in a supported format (the names local paths read, ``detect_format``: ``.parquet``,
   ``.jsonl``/``.ndjson`` plain, gzip or zstd, C4's and Dolma's ``.json.gz``; WebDataset ``.tar``, ``.tar.gz``)
   win; any other format switches to the conversion, which the Hub builds for the main branch only. A
   ``.json.gz`` beside Parquet or tar files is not JSON lines of the split: it switches to the conversion too.
2. ``~parquet``: the commit of branch ``refs/convert/parquet`` (no call when the path names a commit), then
   the tree at that commit, laid out ``{config}/{split}/NNNN.parquet``. Partial conversions are refused.
3. Several configs need one in the path; unknown revisions/configs/splits are errors listing what exists.

Failed calls become one-line :class:`~zephon.errors.HubError` (:mod:`zephon.storage.hub.errors`), after the
retries of :mod:`zephon.storage.hub.retry`; an unknown revision lists the branches and tags that exist. A
listing with a path that is not a relative path inside the repository (``../x``, ``/etc/passwd``) is refused
(:func:`check_repo_path`). Reading the files is :mod:`zephon.storage.hub.fetch`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from huggingface_hub import HfApi, get_token, hf_hub_url
from huggingface_hub.errors import RemoteEntryNotFoundError, RevisionNotFoundError

from zephon.errors import HubError
from zephon.storage.hub.discovery import SUPPORTED_FORMATS, file_format, select_conversion, select_original
from zephon.storage.hub.errors import HTTP_ERRORS, check_online, http_error
from zephon.storage.hub.paths import HfPath, is_commit_sha, parse_hf_path
from zephon.storage.hub.retry import RetryPolicy, retry_policy, with_retries
from zephon.storage.local import alias_side_files
from zephon.storage.mds_compression import compression_of
from zephon.storage.progress import track

__all__ = [
    "CONVERSION_REVISION",
    "RemoteFile",
    "ResolvedHfDataset",
    "check_repo_path",
    "hub_endpoint",
    "is_safe_repo_path",
    "resolve_hf_dataset",
]

CONVERSION_REVISION = "refs/convert/parquet"
_T = TypeVar("_T")


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
    format: str  # one of zephon.storage.hub.discovery.SUPPORTED_FORMATS; an MDS split's json and mds files
    #: MDS shards only: the shard's ``index.json`` entry (JSON).
    entry: str | None = None

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


def _is_mds_name(path: str) -> bool:
    name = path.rpartition("/")[2]
    return name.endswith(".mds") or compression_of(name) is not None


def _is_mds_split(paths: list[str], entries: Mapping[str, object]) -> bool:
    """A split whose data files are one ``index.json`` with MDS shards beside it (zephon.storage.hub.mds)."""
    if len(paths) != 1 or paths[0].rpartition("/")[2] != "index.json":
        return False
    folder = paths[0].rpartition("/")[0]
    return any(p.rpartition("/")[0] == folder and _is_mds_name(p) for p in entries)


def resolve_hf_dataset(
    path: HfPath | str, *, token: str | None = None, retry: RetryPolicy | None = None
) -> ResolvedHfDataset:
    """Pin ``path`` to a commit and list the files of its split (see the module docstring)."""
    hf = path if isinstance(path, HfPath) else parse_hf_path(path)
    check_online(hf.repo_id, f"resolve {hf}")
    return _Resolver(hf, token, retry_policy(retry)).resolve()


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
        if _is_mds_split(paths, entries):  # index.json beside MDS shards: the folder's index and shards, which
            folder = paths[0].rpartition("/")[0]  # zephon.storage.hub.mds turns into the shards the index lists
            paths = [p for p in entries if p.rpartition("/")[0] == folder and (p == paths[0] or _is_mds_name(p))]
            return self._result(commit, "original", config, split, paths, entries)
        tars = [p for p in paths if file_format(p) in ("tar", "tar.gz")]
        if tars and len(tars) < len(paths):  # archives beside other data files are not WebDataset shards: left
            paths = [p for p in paths if p not in tars]  # out as before tars were read (a split of tars only is)
        # .json.gz names JSON lines (C4, Dolma) in a split of JSON lines; beside Parquet or tar shards it is a side
        # file of another kind, unsupported as it was before such names were read (local paths: a side file)
        formats = [(p, file_format(p)) for p in paths]
        side = alias_side_files(formats)
        unsupported = [p for p, fmt in formats if fmt is None or p in side]
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
            fmt = file_format(path) or ("json" if path.endswith("index.json") else "parquet")
            fmt = "mds" if _is_mds_name(path) else fmt
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
        """Files under ``prefix`` at ``commit`` (path -> RepoFile). Pages are retried by huggingface_hub; a
        listing of many pages shows a bar of the entries listed on a terminal (:mod:`zephon.storage.progress`)."""
        try:
            tree = self.api.list_repo_tree(
                self.hf.repo_id, prefix or None, recursive=True, revision=commit, repo_type="dataset"
            )
            items = list(track(tree, total=None, desc=f"listing {self.hf.repo_id}", unit="file"))
        except RemoteEntryNotFoundError:
            return {}
        except HTTP_ERRORS as exc:
            raise self._error(exc, "the file listing", 1, commit) from exc
        for item in items:
            check_repo_path(item.path, self.hf.repo_id, commit, self.endpoint)
        return {item.path: item for item in items if hasattr(item, "blob_id")}

    def _call(self, what: str, revision: str | None, fn: Callable[[], _T]) -> _T:
        return with_retries(fn, self.retry, lambda exc, n: self._error(exc, what, n, revision))

    def _error(self, exc: BaseException, what: str, attempts: int, revision: str | None) -> HubError:
        if isinstance(exc, RevisionNotFoundError) and revision is not None:
            return self._revision_error(revision)
        token_sent = bool(self._token)
        return http_error(exc, self.hf.repo_id, self.endpoint, what, token_sent=token_sent, attempts=attempts)

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
