"""Prefetch for the shard cache: download the shards the plan needs next in background threads.

``ShardCache.prefetch(specs, next_use=...)`` hands the shards to a :class:`Prefetcher`, which downloads them
the way ``acquire`` does (:class:`~zephon.storage.shard_cache_store.CacheStore`), but never waits and never
evicts an entry needed sooner than the prefetched shard; it stops at the first shard that does not fit
(a later one would only be evicted again), or that another thread or process is about to download and has
not reserved room for yet. Shards reserve their room in plan order, one after the other, even with several
prefetch threads (:class:`_Batch`); only the downloads overlap. A new call replaces the not-yet-started rest
of the previous one. Its errors are re-raised by ``acquire`` of that shard (:meth:`Prefetcher.take_error`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from zephon.storage.shard_cache_lock import PART_SUFFIX, entry_name, try_exclusive
from zephon.storage.shard_cache_store import CacheEntrySpec, CacheStore

__all__ = ["Prefetcher"]


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


class Prefetcher:
    """The prefetch threads of one ``ShardCache`` (``workers`` of them, started by the first :meth:`start`)."""

    def __init__(self, store: CacheStore, workers: int) -> None:
        self._store = store
        self._workers = workers
        self._lock = threading.Lock()
        self._errors: dict[str, Exception] = {}
        self._pool: ThreadPoolExecutor | None = None
        self.pending: list[Future[None]] = []  # the current batch's tasks (tests wait on them)
        self._batch: _Batch | None = None
        self._closed = False

    def start(self, specs: Sequence[CacheEntrySpec], ranks: dict[str, int] | None) -> None:
        """Download ``specs`` in the background, in order; the not-yet-started rest of the last call is dropped.

        ``ranks`` (next use by entry name) None: only free space is used. Never blocks.
        """
        batch = _Batch()
        limit = self._store.limit_bytes
        with self._lock:
            for future in self.pending:
                future.cancel()
            if self._batch is not None:
                self._batch.done_turn(0, stop=True)  # its waiting tasks give up; running downloads finish
            self._batch = batch
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="zephon-prefetch")
            fitting = [s for s in specs if limit is None or s.size <= limit]
            self.pending = [self._pool.submit(self._prefetch_one, s, ranks, batch, i) for i, s in enumerate(fitting)]

    def take_error(self, key: str) -> Exception | None:
        """The error of the last prefetch of ``key``, once (``acquire`` raises it unless the shard is there)."""
        with self._lock:
            return self._errors.pop(key, None)

    def close(self) -> None:
        """Cancel queued prefetches and wait for running ones."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def _prefetch_one(self, spec: CacheEntrySpec, ranks: dict[str, int] | None, batch: _Batch, index: int) -> None:
        store, layout = self._store, self._store.layout
        try:
            if not batch.wait_turn(index) or self._closed:
                return
            name = entry_name(spec.key)
            fd = try_exclusive(layout.download_lock(name), create=True)
            if fd is None:
                # Being downloaded by another thread or process. Until that download has reserved its room, a
                # later shard of this batch could take it: stop here unless the reservation exists.
                if not any(layout.tmp.glob(f"{name}.*{PART_SUFFIX}")):
                    batch.done_turn(index, stop=True)
                return
            try:
                with store.locked():
                    if store.is_valid(spec, name):
                        return
                    part, _ = store.reserve(spec, name, ranks, prefetch=True)
                if part is None:
                    batch.done_turn(index, stop=True)
                    return
                batch.done_turn(index)  # room reserved: the next shard may reserve while this one downloads
                with store.filled(spec, name, part):
                    pass  # committed; a prefetch pins nothing
            except Exception as exc:  # kept for the acquire() of this shard
                with self._lock:
                    self._errors[spec.key] = exc
            finally:
                os.close(fd)
        finally:
            batch.done_turn(index)  # every way out passes the turn on (a no-op once passed)
