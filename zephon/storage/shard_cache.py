"""The local shard cache: remote shards are downloaded whole into ``root`` before they are read.

The ranks of one node share one cache directory; each rank knows its whole future access order from the
plan and passes it as ``next_use`` (key → next plan position), so eviction is Belady's: farthest next use
first. Layout and lock primitives are in :mod:`zephon.storage.shard_cache_lock`.

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

Eviction, when a download needs room: unused entries absent from ``next_use`` go first (never needed
again), then those used farthest in the future; ties by least recent access. If only entries in use could
make room, ``acquire`` polls until ``wait_timeout_s`` and then raises ``DatasetError``.

Worked example: ``limit_bytes=3000``, shards a, b, c, d of 1000 bytes each, plan order
``a b c d b a c`` (positions 0..6).

* Positions 0-2 fill the cache: {a, b, c}, 3000 bytes.
* Position 3 acquires d with ``next_use={a: 5, b: 4, c: 6, d: 3}``: 1000 bytes are missing; c is used
  farthest away (6) → evict c → {a, b, d}. Had c been open in some process, a (5) would go instead.
* Positions 4 and 5 reuse b and a: no download.
* Position 6 acquires c with ``next_use={c: 6}``: a, b, d are never needed again; least recently used is
  d (accessed at 3) → evict d → {a, b, c}.

``prefetch(specs, next_use=...)`` downloads the same way in background threads, but never waits and never
evicts an entry needed sooner than the prefetched shard; it stops at the first shard that does not fit
(a later one would only be evicted again), or that another thread or process is about to download and has
not reserved room for yet. Shards reserve their room in plan order, one after the other, even with several
prefetch threads; only the downloads overlap. Its errors are re-raised by ``acquire`` of that shard.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from zephon.errors import ConfigError, DatasetError, ZephonError
from zephon.storage.files import removed_on_failure, storage_error
from zephon.storage.shard_cache_lock import (
    PART_SUFFIX,
    CachedShard,
    CacheLayout,
    commit,
    delete_entry,
    entry_name,
    evict,
    eviction_order,
    exclusive,
    is_locked,
    needed_later,
    pin,
    read_meta,
    scan,
    touch,
    try_exclusive,
)

if TYPE_CHECKING:
    from zephon.specs import CacheOptions

_FIX = "or point CacheOptions.root at another disk, or lower CacheOptions.limit_bytes to the space it has"

__all__ = ["CacheEntryInfo", "CacheEntrySpec", "CachedShard", "ShardCache"]


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


@dataclass(slots=True)
class _Batch:
    """One ``prefetch`` call: its shards reserve room strictly in order (the downloads then overlap), so a
    later shard never takes the room an earlier one needed."""

    stopped: bool = False
    turn: int = 0  # index of the shard whose reservation comes next
    ready: threading.Condition = field(default_factory=threading.Condition)

    def wait_turn(self, index: int) -> bool:
        """Block until shards ``< index`` have reserved (or were skipped); False once the batch stopped."""
        with self.ready:
            while self.turn < index and not self.stopped:
                self.ready.wait(1.0)
            return not self.stopped

    def done_turn(self, index: int, *, stop: bool = False) -> None:
        with self.ready:
            self.turn = max(self.turn, index + 1)
            self.stopped = self.stopped or stop
            self.ready.notify_all()


class ShardCache:
    """A size-bounded cache of whole shards in ``root``, safe to share between the processes of a node.

    Args:
        root: cache directory (created if missing).
        limit_bytes: upper bound of the cache's total size, or None for unbounded.
        wait_timeout_s: how long ``acquire`` waits for room held by shards in use before it raises.
        poll_interval_s: sleep between two tries while waiting for room.
        prefetch_workers: threads that run ``prefetch`` downloads.
    """

    def __init__(
        self,
        root: str | Path,
        limit_bytes: int | None,
        *,
        wait_timeout_s: float = 600.0,
        poll_interval_s: float = 0.05,
        prefetch_workers: int = 2,
    ) -> None:
        if limit_bytes is not None and (isinstance(limit_bytes, bool) or limit_bytes <= 0):
            raise ConfigError(f"limit_bytes must be an int > 0 or None, got {limit_bytes!r} — pass a size in bytes")
        if wait_timeout_s <= 0 or poll_interval_s <= 0:
            raise ConfigError(f"wait_timeout_s, poll_interval_s must be > 0, got {wait_timeout_s}, {poll_interval_s}")
        if prefetch_workers < 1:
            raise ConfigError(f"prefetch_workers must be ≥ 1, got {prefetch_workers}")
        self.root = Path(root)
        self.limit_bytes = limit_bytes
        self._layout = CacheLayout(self.root)
        try:
            self._layout.create()
        except OSError as exc:
            raise storage_error(exc, "the shard cache", self.root, _FIX) from exc
        self._timeout = wait_timeout_s
        self._poll = poll_interval_s
        self._workers = prefetch_workers
        self._lock = threading.Lock()
        self._errors: dict[str, Exception] = {}
        self._open: set[CachedShard] = set()
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []
        self._batch: _Batch | None = None
        self._closed = False
        with self._global():
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
        with self._lock:
            error = self._errors.pop(spec.key, None)
        name = entry_name(spec.key)
        with self._global():
            if self._is_valid(spec, name):  # e.g. another rank downloaded it after our prefetch failed
                return self._pin(spec, name)
        if error is not None:
            raise error
        ranks = _ranks(next_use or {})
        with exclusive(self._layout.download_lock(name)):
            deadline = time.monotonic() + self._timeout
            while True:
                with self._global():
                    if self._is_valid(spec, name):
                        return self._pin(spec, name)
                    part, why = self._reserve(spec, name, ranks, prefetch=False)
                if part is not None:
                    break
                if time.monotonic() > deadline:
                    raise DatasetError(
                        f"shard {spec.key!r} ({spec.size} bytes) must fit in the shard cache at {self.root} "
                        f"(limit_bytes={self.limit_bytes}), got no room after waiting {self._timeout:g} s: {why} — "
                        f"close shards sooner (CachedShard.close()) or raise limit_bytes"
                    )
                time.sleep(self._poll)
            with removed_on_failure(part):  # renamed by commit; removed when the download or its check fails
                _fetch_and_check(spec, part)
                with self._global():
                    commit(self._layout, name, part, key=spec.key, size=spec.size, etag=spec.etag)
                    return self._pin(spec, name)

    def prefetch(self, specs: Sequence[CacheEntrySpec], *, next_use: Mapping[str, int] | None = None) -> None:
        """Download ``specs`` in the background, in order; replaces the not-yet-started rest of earlier calls.

        Without ``next_use`` only free space is used. Never blocks; errors surface at ``acquire``.
        """
        self._check_open()
        ranks = _ranks(next_use) if next_use is not None else None
        batch = _Batch()
        with self._lock:
            for future in self._pending:
                future.cancel()
            if self._batch is not None:
                self._batch.done_turn(0, stop=True)  # its waiting tasks give up; running downloads finish
            self._batch = batch
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="zephon-prefetch")
            fitting = [s for s in specs if self.limit_bytes is None or s.size <= self.limit_bytes]
            self._pending = [self._pool.submit(self._prefetch_one, s, ranks, batch, i) for i, s in enumerate(fitting)]

    def entries(self) -> list[CacheEntryInfo]:
        """Complete entries, sorted by key."""
        infos: list[CacheEntryInfo] = []
        with self._global():
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
        with self._global():
            return sum(e.size for e in scan(self._layout).entries.values())

    def prune(self, *, keep_bytes: int = 0) -> int:
        """Evict unused entries, least recently used first, until ``total_bytes() <= keep_bytes``; bytes freed."""
        if keep_bytes < 0:
            raise ConfigError(f"keep_bytes must be ≥ 0, got {keep_bytes}")
        freed = 0
        with self._global():
            entries = scan(self._layout).entries.values()
            total = sum(e.size for e in entries)
            for entry in sorted(entries, key=lambda e: (e.has_meta, e.access_ns, e.name)):
                if total <= keep_bytes:
                    break
                if evict(self._layout, entry.name):
                    total -= entry.size
                    freed += entry.size
        return freed

    def close(self) -> None:
        """Cancel queued prefetches, wait for running ones, and release every pin of this cache."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
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

    @contextmanager
    def _global(self) -> Iterator[None]:
        """Hold the global lock; bookkeeping under it only touches the cache, so an ``OSError`` there is a
        storage failure (disk full, read-only) and becomes a ``StorageError``."""
        try:
            with exclusive(self._layout.global_lock):
                yield
        except OSError as exc:
            raise storage_error(exc, "the shard cache", self.root, _FIX) from exc

    def _is_valid(self, spec: CacheEntrySpec, name: str) -> bool:
        """Under the global lock: a complete entry for this key, size and etag is present."""
        meta = read_meta(self._layout, name)
        if meta is None or (meta.key, meta.size, meta.etag) != (spec.key, spec.size, spec.etag):
            return False
        try:
            return self._layout.data(name).stat().st_size == spec.size
        except FileNotFoundError:
            return False

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

    def _reserve(
        self, spec: CacheEntrySpec, name: str, ranks: dict[str, int] | None, *, prefetch: bool
    ) -> tuple[Path | None, str]:
        """Under the global lock and the entry's download lock: make room and create the ``.part`` file.

        Returns ``(part, "")`` or ``(None, why not)``. ``ranks`` None: use free space only.
        """
        state = scan(self._layout)
        held: list[tuple[str, int]] = []
        try:
            used = state.used
            if name in state.entries:  # an older etag or a broken entry: replaced
                fd = try_exclusive(self._layout.data(name))
                if fd is None:
                    return None, "another version of this shard is in use"
                held.append((name, fd))
                used -= state.entries[name].size
            limit = self.limit_bytes
            if limit is not None and used + spec.size > limit:
                victims = sorted(state.entries.values(), key=lambda e: eviction_order(e, ranks))
                in_use = 0
                for entry in (e for e in victims if e.name != name):
                    if prefetch and not needed_later(entry.name, name, ranks):
                        break  # prefetch never evicts what is needed sooner than the shard itself
                    fd = try_exclusive(self._layout.data(entry.name))
                    if fd is None:
                        in_use += entry.size
                        continue
                    held.append((entry.name, fd))
                    used -= entry.size
                    if used + spec.size <= limit:
                        break
                if used + spec.size > limit:
                    return None, f"{in_use} bytes are in use by open shards, {state.reserved} reserved by downloads"
            for victim, _ in held:
                delete_entry(self._layout, victim)
            part = self._layout.part(name, spec.size)
            os.close(os.open(part, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o644))
            return part, ""
        finally:
            for _, fd in held:
                os.close(fd)

    def _prefetch_one(self, spec: CacheEntrySpec, ranks: dict[str, int] | None, batch: _Batch, index: int) -> None:
        try:
            if not batch.wait_turn(index) or self._closed:
                return
            name = entry_name(spec.key)
            fd = try_exclusive(self._layout.download_lock(name), create=True)
            if fd is None:
                # Being downloaded by another thread or process. Until that download has reserved its room, a
                # later shard of this batch could take it: stop here unless the reservation exists.
                if not any(self._layout.tmp.glob(f"{name}.*{PART_SUFFIX}")):
                    batch.done_turn(index, stop=True)
                return
            try:
                with self._global():
                    if self._is_valid(spec, name):
                        return
                    part, _ = self._reserve(spec, name, ranks, prefetch=True)
                if part is None:
                    batch.done_turn(index, stop=True)
                    return
                batch.done_turn(index)  # room reserved: the next shard may reserve while this one downloads
                with removed_on_failure(part):
                    _fetch_and_check(spec, part)
                    with self._global():
                        commit(self._layout, name, part, key=spec.key, size=spec.size, etag=spec.etag)
            except Exception as exc:  # kept for the acquire() of this shard
                with self._lock:
                    self._errors[spec.key] = exc
            finally:
                os.close(fd)
        finally:
            batch.done_turn(index)  # every way out passes the turn on (a no-op once passed)


_STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


def _ranks(next_use: Mapping[str, int]) -> dict[str, int]:
    """``next_use`` by entry name instead of key."""
    return {entry_name(key): position for key, position in next_use.items()}


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
            raise storage_error(exc, f"shard {spec.key!r}", part, _FIX) from exc
        raise DatasetError(f"shard {spec.key!r} must {must}, got {type(exc).__name__}: {exc} — {fix}") from exc
    except Exception as exc:
        raise DatasetError(f"shard {spec.key!r} must {must}, got {type(exc).__name__}: {exc} — {fix}") from exc
