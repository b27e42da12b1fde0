"""The local shard cache: remote shards are downloaded whole into ``root`` before they are read.

The ranks of one node share one cache directory; each rank knows its whole future access order from the
plan and passes it as ``next_use`` (key → next plan position), so eviction is Belady's: farthest next use
first. :class:`ShardCache` is the public API (``acquire`` a :class:`CachedShard`, ``close`` it to release it;
``prefetch``; ``entries``/``prune`` for ``zephon cache``). The rest lives beside it:

* :mod:`zephon.storage.shard_cache_lock` — the on-disk layout, ``flock`` locks and entry bookkeeping.
* :mod:`zephon.storage.shard_cache_store` — :class:`CacheEntrySpec`, and filling an entry: check, reserve,
  download, verify, commit.
* :mod:`zephon.storage.shard_cache_evict` — the size budget and plan-ordered eviction, with a worked example.
* :mod:`zephon.storage.shard_cache_prefetch` — background downloads in plan order.

Invariants:

* A file under ``shards/`` is complete: downloads go to ``tmp/`` (same filesystem), are checked (size ==
  ``spec.size``, then ``spec.verify``) and ``os.replace``-d into place; the sidecar is written after that,
  atomically. A killed download leaves only a ``tmp/`` file, deleted by the next scan.
* Bytes under ``shards/`` plus bytes reserved by downloads in progress never exceed ``limit_bytes``: every
  reservation and eviction happens under the global lock, and a download reserves ``spec.size`` before
  it starts. So the limit holds whenever ``acquire`` returns, in every process.
* A shard is downloaded by at most one thread of one process at a time (its download lock), and the others
  wait for it and reuse it.
* An open :class:`CachedShard` holds LOCK_SH on its file; evictors need LOCK_EX|LOCK_NB, so a shard in use
  by any process is never evicted or replaced. Pins are only taken under the global lock.
* A cache opened with a smaller limit than its content is pruned to it at once (least recently used first).
* A full disk, a read-only file system or missing permissions raise :class:`~zephon.errors.StorageError`
  naming the path and the fix; the download's ``tmp/`` file is removed, so nothing half-written remains.

If only entries in use could make room for a download, ``acquire`` polls until ``wait_timeout_s`` and then
raises ``DatasetError``. ``prefetch`` never waits; its errors are re-raised by ``acquire`` of that shard.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from zephon.errors import ConfigError, DatasetError
from zephon.storage.shard_cache_evict import prune, ranks_by_name
from zephon.storage.shard_cache_lock import CachedShard, entry_name, exclusive, is_locked, pin, read_meta, scan, touch
from zephon.storage.shard_cache_prefetch import Prefetcher
from zephon.storage.shard_cache_store import CacheEntrySpec, CacheStore

if TYPE_CHECKING:
    from zephon.specs import CacheOptions

__all__ = ["CacheEntryInfo", "CacheEntrySpec", "CachedShard", "ShardCache"]


@dataclass(frozen=True, kw_only=True, slots=True)
class CacheEntryInfo:
    """One complete entry, as listed by ``zephon cache ls``.

    Attributes:
        key: the shard's key. path: its file. size: bytes. etag: as stored in the sidecar.
        last_access: seconds since the epoch of the last ``acquire`` (or download).
        in_use: some process (this one included) has it open as a :class:`CachedShard`.
    """

    key: str
    path: Path
    size: int
    etag: str
    last_access: float
    in_use: bool


class ShardCache:
    """A size-bounded cache of whole shards in ``root``, safe to share between the processes of a node.

    Args:
        root: cache directory (created if missing).
        limit_bytes: upper bound of the cache's total size, or None for unbounded.
        wait_timeout_s: how long ``acquire`` waits for room held by shards in use before it raises.
        poll_interval_s: sleep between two tries while waiting for room.
        prefetch_workers: threads that run ``prefetch`` downloads.
        create: make the cache's folders under ``root`` when missing (the executor); ``False`` opens an existing
            cache only and creates nothing (``zephon cache ls | du | prune``).
    """

    def __init__(
        self,
        root: str | Path,
        limit_bytes: int | None,
        *,
        wait_timeout_s: float = 600.0,
        poll_interval_s: float = 0.05,
        prefetch_workers: int = 2,
        create: bool = True,
    ) -> None:
        if limit_bytes is not None and (isinstance(limit_bytes, bool) or limit_bytes <= 0):
            raise ConfigError(f"limit_bytes must be an int > 0 or None, got {limit_bytes!r} — pass a size in bytes")
        if wait_timeout_s <= 0 or poll_interval_s <= 0:
            raise ConfigError(f"wait_timeout_s, poll_interval_s must be > 0, got {wait_timeout_s}, {poll_interval_s}")
        if prefetch_workers < 1:
            raise ConfigError(f"prefetch_workers must be ≥ 1, got {prefetch_workers}")
        self.root = Path(root)
        self.limit_bytes = limit_bytes
        self._store = CacheStore(self.root, limit_bytes, create=create)  # creates the directories if asked
        self._layout = self._store.layout
        self._timeout = wait_timeout_s
        self._poll = poll_interval_s
        self._lock = threading.Lock()
        self._open: set[CachedShard] = set()
        self._prefetcher = Prefetcher(self._store, prefetch_workers)
        self._closed = False
        with self._store.locked():
            scan(self._layout)  # deletes leftovers of killed downloads
        if limit_bytes is not None:
            self.prune(keep_bytes=limit_bytes)  # a cache reopened with a smaller limit shrinks at once

    @classmethod
    def from_options(cls, options: CacheOptions, *, wait_timeout_s: float = 600.0) -> ShardCache:
        """The cache described by ``CacheOptions`` (which must be enabled)."""
        if not options.enabled or not options.root:
            raise ConfigError(f"CacheOptions must have enabled=True and a root, got {options!r} — pass root=...")
        return cls(options.root, options.limit_bytes, wait_timeout_s=wait_timeout_s)

    # ------------------------------------------------------------------ public API
    def check_fits(self, specs: Sequence[CacheEntrySpec]) -> None:
        """Raise ``DatasetError`` naming the first shard larger than ``limit_bytes`` (check at start)."""
        if self.limit_bytes is None:
            return
        too_big = [s for s in specs if s.size > self.limit_bytes]
        if too_big:
            s, more = too_big[0], f" (and {len(too_big) - 1} more)" if len(too_big) > 1 else ""
            raise DatasetError(
                f"shard {s.key!r} must fit in the shard cache, got {s.size} bytes > limit_bytes={self.limit_bytes}"
                f"{more} — raise CacheOptions.limit_bytes to at least {max(t.size for t in too_big)}"
            )

    def acquire(self, spec: CacheEntrySpec, *, next_use: Mapping[str, int] | None = None) -> CachedShard:
        """Return the shard pinned (downloading it first, evicting as needed); close it when done reading."""
        self._check_open()
        self.check_fits([spec])
        error = self._prefetcher.take_error(spec.key)
        name = entry_name(spec.key)
        store = self._store
        with store.locked():
            if store.is_valid(spec, name):  # e.g. another rank downloaded it after our prefetch failed
                return self._pin(spec, name)
        if error is not None:
            raise error
        ranks = ranks_by_name(next_use or {})
        with exclusive(self._layout.download_lock(name)):
            deadline = time.monotonic() + self._timeout
            while True:
                with store.locked():
                    if store.is_valid(spec, name):
                        return self._pin(spec, name)
                    part, why = store.reserve(spec, name, ranks, prefetch=False)
                if part is not None:
                    break
                if time.monotonic() > deadline:
                    raise DatasetError(
                        f"shard {spec.key!r} ({spec.size} bytes) must fit in the shard cache at {self.root} "
                        f"(limit_bytes={self.limit_bytes}), got no room after waiting {self._timeout:g} s: {why} — "
                        f"close shards sooner (CachedShard.close()) or raise limit_bytes"
                    )
                time.sleep(self._poll)
            with store.filled(spec, name, part):  # downloaded, checked and committed; still under the global lock
                return self._pin(spec, name)

    def prefetch(self, specs: Sequence[CacheEntrySpec], *, next_use: Mapping[str, int] | None = None) -> None:
        """Download ``specs`` in the background, in order; replaces the not-yet-started rest of earlier calls.

        Without ``next_use`` only free space is used. Never blocks; errors surface at ``acquire``.
        """
        self._check_open()
        self._prefetcher.start(specs, ranks_by_name(next_use) if next_use is not None else None)

    def entries(self) -> list[CacheEntryInfo]:
        """Complete entries, sorted by key."""
        infos: list[CacheEntryInfo] = []
        with self._store.locked():
            for entry in scan(self._layout).entries.values():
                meta = read_meta(self._layout, entry.name)
                if meta is None:
                    continue
                path = self._layout.data(entry.name)
                access, in_use = entry.access_ns / 1e9, is_locked(path)
                infos.append(
                    CacheEntryInfo(
                        key=meta.key, path=path, size=entry.size, etag=meta.etag, last_access=access, in_use=in_use
                    )
                )
        return sorted(infos, key=lambda i: i.key)

    def total_bytes(self) -> int:
        """Bytes of the complete shards under ``shards/`` (downloads in progress not included)."""
        with self._store.locked():
            return sum(e.size for e in scan(self._layout).entries.values())

    def prune(self, *, keep_bytes: int = 0) -> int:
        """Evict unused entries, least recently used first, until ``total_bytes() <= keep_bytes``; bytes freed."""
        if keep_bytes < 0:
            raise ConfigError(f"keep_bytes must be ≥ 0, got {keep_bytes}")
        with self._store.locked():
            return prune(self._layout, keep_bytes)

    def close(self) -> None:
        """Cancel queued prefetches, wait for running ones, and release every pin of this cache."""
        with self._lock:
            self._closed = True
        self._prefetcher.close()
        for shard in list(self._open):
            shard.close()

    def __enter__(self) -> ShardCache:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError(f"ShardCache at {self.root} must be open, got a closed cache — create a new ShardCache")

    def _pin(self, spec: CacheEntrySpec, name: str) -> CachedShard:
        """Under the global lock: pin a valid entry and record the access."""
        path = self._layout.data(name)
        shard = CachedShard(spec.key, path, pin(path), self._forget)
        touch(path)
        with self._lock:
            self._open.add(shard)
        return shard

    def _forget(self, shard: CachedShard) -> None:
        with self._lock:
            self._open.discard(shard)
