"""Filling the shard cache: what a remote shard is (:class:`CacheEntrySpec`), and the steps that put one in.

:class:`CacheStore` holds the steps ``ShardCache.acquire`` and the prefetch threads share, each under the
locks of :mod:`zephon.storage.shard_cache_lock`:

1. :meth:`~CacheStore.is_valid`, under the global lock: a complete entry with this key, size and etag exists.
2. :meth:`~CacheStore.reserve`, under the global lock and the entry's download lock: make room
   (:mod:`zephon.storage.shard_cache_evict`) and create the ``tmp/`` ``.part`` file that holds it.
3. :meth:`~CacheStore.filled`: ``spec.fetch`` writes the ``.part`` file, which is checked (size == ``spec.size``,
   then ``spec.verify``) and committed (``os.replace``-d into ``shards/``, then its sidecar) under the global
   lock. A failed download or check removes the ``.part`` file, so nothing half-written remains.

An ``OSError`` of the cache's bookkeeping (under the global lock) becomes a :class:`~zephon.errors.StorageError`
naming the path and the fix, and so does one of a download writing its file when it is a storage failure (a
full disk, a read-only file system, missing permissions); any other failure of a download or its check is a
``DatasetError`` naming the shard.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from zephon.errors import ConfigError, DatasetError, ZephonError
from zephon.storage.files import removed_on_failure, storage_error
from zephon.storage.shard_cache_evict import reserve
from zephon.storage.shard_cache_lock import CacheLayout, commit, exclusive, read_meta

__all__ = ["STORAGE_FIX", "CacheEntrySpec", "CacheStore"]

STORAGE_FIX = "or point CacheOptions.root at another disk, or lower CacheOptions.limit_bytes to the space it has"
_STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


@dataclass(frozen=True, kw_only=True, slots=True)
class CacheEntrySpec:
    """What the cache needs to know about one remote shard.

    Attributes:
        key: stable identity, e.g. ``hf/HuggingFaceFW/fineweb-edu/<commit>/sample/10BT/000.parquet``.
        size: expected size in bytes; a download of any other size is rejected.
        etag: expected etag (opaque); an entry with another etag for the same key is replaced.
        fetch: writes the whole shard to the temporary path it is given (may raise).
        verify: optional extra check of a finished download (e.g. sha256); raise to reject it.
    """

    key: str
    size: int
    etag: str
    fetch: Callable[[str], None]
    verify: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise ConfigError(f"CacheEntrySpec.key must be a non-empty string, got {self.key!r} — pass the shard id")
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            raise ConfigError(f"CacheEntrySpec.size of {self.key!r} must be an int ≥ 0, got {self.size!r}")
        if not isinstance(self.etag, str):
            raise ConfigError(f"CacheEntrySpec.etag of {self.key!r} must be a string, got {self.etag!r}")
        if not callable(self.fetch) or (self.verify is not None and not callable(self.verify)):
            raise ConfigError(f"CacheEntrySpec.fetch/verify of {self.key!r} must be callables taking a path")


class CacheStore:
    """The entries of one cache root (``root``, at most ``limit_bytes``), changed under the cache's locks."""

    def __init__(self, root: Path, limit_bytes: int | None, *, create: bool = True) -> None:
        self.root = root
        self.limit_bytes = limit_bytes
        self.layout = CacheLayout(root)
        if not create:
            if not self.layout.exists():
                raise ConfigError(
                    f"cache root must be a shard cache (a directory with zephon-cache.lock, shards/, meta/, locks/ "
                    f"and tmp/), got {root} — pass the CacheOptions.root the executor used; nothing was created"
                )
            return
        try:
            self.layout.create()
        except OSError as exc:
            raise storage_error(exc, "the shard cache", root, STORAGE_FIX) from exc

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the global lock; bookkeeping under it only touches the cache, so an ``OSError`` there is a
        storage failure (disk full, read-only) and becomes a ``StorageError``."""
        try:
            with exclusive(self.layout.global_lock):
                yield
        except OSError as exc:
            raise storage_error(exc, "the shard cache", self.root, STORAGE_FIX) from exc

    def is_valid(self, spec: CacheEntrySpec, name: str) -> bool:
        """Under the global lock: a complete entry for this key, size and etag is present."""
        meta = read_meta(self.layout, name)
        if meta is None or (meta.key, meta.size, meta.etag) != (spec.key, spec.size, spec.etag):
            return False
        try:
            return self.layout.data(name).stat().st_size == spec.size
        except FileNotFoundError:
            return False

    def reserve(
        self, spec: CacheEntrySpec, name: str, ranks: dict[str, int] | None, *, prefetch: bool
    ) -> tuple[Path | None, str]:
        """Under the global lock and the entry's download lock: make room and create the ``.part`` file.

        Returns ``(part, "")`` or ``(None, why not)``. ``ranks`` None: use free space only.
        """
        return reserve(self.layout, name, spec.size, self.limit_bytes, ranks, prefetch=prefetch)

    @contextmanager
    def filled(self, spec: CacheEntrySpec, name: str, part: Path) -> Iterator[None]:
        """Download ``spec`` into its reservation ``part``, check it and commit it as entry ``name``.

        The ``with`` block runs under the global lock right after the commit (``acquire`` pins the entry
        there). ``part`` is renamed by the commit, and removed when the download or its check fails.
        """
        with removed_on_failure(part):
            _fetch_and_check(spec, part)
            with self.locked():
                try:
                    commit(self.layout, name, part, key=spec.key, size=spec.size, etag=spec.etag)
                except OSError as exc:  # the sidecar hit a full disk: name the shard, as a failed download does
                    if exc.errno not in _STORAGE_ERRNOS:
                        raise
                    raise storage_error(exc, f"shard {spec.key!r}", self.layout.meta(name), STORAGE_FIX) from exc
                yield


def _fetch_and_check(spec: CacheEntrySpec, part: Path) -> None:
    """Run ``spec.fetch`` into ``part``, then check the size and ``spec.verify``; raise ``DatasetError``."""
    _run(spec.fetch, spec, part, "download", "check the network and credentials, then retry")
    got = part.stat().st_size if part.exists() else 0
    if got != spec.size:
        raise DatasetError(
            f"shard {spec.key!r} must be {spec.size} bytes as planned, got {got} bytes downloaded — the download was "
            f"cut short (retry) or the remote file changed since the plan was made (make a new plan)"
        )
    if spec.verify is not None:
        fix = "the download is corrupt (retry) or the remote file changed (make a new plan)"
        _run(spec.verify, spec, part, "pass verification", fix)


def _run(step: Callable[[str], None], spec: CacheEntrySpec, part: Path, must: str, fix: str) -> None:
    try:
        step(str(part))
    except ZephonError:
        raise
    except OSError as exc:
        if exc.errno in _STORAGE_ERRNOS:
            raise storage_error(exc, f"shard {spec.key!r}", part, STORAGE_FIX) from exc
        raise DatasetError(f"shard {spec.key!r} must {must}, got {type(exc).__name__}: {exc} — {fix}") from exc
    except Exception as exc:
        raise DatasetError(f"shard {spec.key!r} must {must}, got {type(exc).__name__}: {exc} — {fix}") from exc
