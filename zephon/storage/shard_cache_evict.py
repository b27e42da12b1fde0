"""Room in the shard cache: the size budget, and eviction in the plan's order (Belady's: farthest next use first).

Every function here runs under the cache's global lock (:mod:`zephon.storage.shard_cache_lock`), which makes
the budget hold in every process: bytes under ``shards/`` plus bytes reserved by downloads in progress never
exceed ``limit_bytes``. A download reserves its room before it starts (:func:`reserve` creates its ``.part``
file, whose name carries the size, while its download lock is held), so the limit holds whenever
``ShardCache.acquire`` returns.

Each rank knows its whole future access order from the plan and passes it as ``next_use`` (key → next plan
position; :func:`ranks_by_name`). Eviction, when a download needs room: unused entries absent from
``next_use`` go first (never needed again), then those used farthest in the future; ties by least recent
access (:func:`eviction_order`). An entry in use by any process (pinned with LOCK_SH) is skipped. If only
entries in use could make room, ``acquire`` polls until ``wait_timeout_s`` and then raises ``DatasetError``.
A prefetch never evicts an entry needed sooner than the prefetched shard (:func:`needed_later`).

Worked example: ``limit_bytes=3000``, shards a, b, c, d of 1000 bytes each, plan order
``a b c d b a c`` (positions 0..6).

* Positions 0-2 fill the cache: {a, b, c}, 3000 bytes.
* Position 3 acquires d with ``next_use={a: 5, b: 4, c: 6, d: 3}``: 1000 bytes are missing; c is used
  farthest away (6) → evict c → {a, b, d}. Had c been open in some process, a (5) would go instead.
* Positions 4 and 5 reuse b and a: no download.
* Position 6 acquires c with ``next_use={c: 6}``: a, b, d are never needed again; least recently used is
  d (accessed at 3) → evict d → {a, b, c}.

:func:`prune` (``zephon cache prune``, and a cache opened with a smaller limit than its content) evicts unused
entries least recently used first, ignoring the plan.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from zephon.storage.shard_cache_lock import CacheLayout, Entry, delete_entry, entry_name, evict, scan, try_exclusive

__all__ = ["eviction_order", "needed_later", "prune", "ranks_by_name", "reserve"]


def ranks_by_name(next_use: Mapping[str, int]) -> dict[str, int]:
    """``next_use`` by entry name instead of key."""
    return {entry_name(key): position for key, position in next_use.items()}


def eviction_order(entry: Entry, ranks: dict[str, int] | None) -> tuple[int, int, int, str]:
    """Sort key, first evicted first: orphans, never needed again, farthest next use; ties least recently used."""
    if not entry.has_meta:
        return (0, 0, entry.access_ns, entry.name)
    rank = ranks.get(entry.name) if ranks is not None else None
    return (1, 0, entry.access_ns, entry.name) if rank is None else (2, -rank, entry.access_ns, entry.name)


def needed_later(victim: str, own: str, ranks: dict[str, int] | None) -> bool:
    """True when ``victim`` is never needed again or needed after ``own`` (by entry name)."""
    if ranks is None:
        return False
    if victim not in ranks:
        return True
    return own in ranks and ranks[victim] > ranks[own]


def reserve(
    layout: CacheLayout, name: str, size: int, limit: int | None, ranks: dict[str, int] | None, *, prefetch: bool
) -> tuple[Path | None, str]:
    """Under the global lock and the entry's download lock: make room and create the ``.part`` file.

    Returns ``(part, "")`` or ``(None, why not)``. ``ranks`` None: use free space only.
    """
    state = scan(layout)
    held: list[tuple[str, int]] = []
    try:
        used = state.used
        if name in state.entries:  # an older etag or a broken entry: replaced
            fd = try_exclusive(layout.data(name))
            if fd is None:
                return None, "another version of this shard is in use"
            held.append((name, fd))
            used -= state.entries[name].size
        if limit is not None and used + size > limit:
            victims = sorted(state.entries.values(), key=lambda e: eviction_order(e, ranks))
            in_use = 0
            for entry in (e for e in victims if e.name != name):
                if prefetch and not needed_later(entry.name, name, ranks):
                    break  # prefetch never evicts what is needed sooner than the shard itself
                fd = try_exclusive(layout.data(entry.name))
                if fd is None:
                    in_use += entry.size
                    continue
                held.append((entry.name, fd))
                used -= entry.size
                if used + size <= limit:
                    break
            if used + size > limit:
                return None, f"{in_use} bytes are in use by open shards, {state.reserved} reserved by downloads"
        for victim, _ in held:
            delete_entry(layout, victim)
        part = layout.part(name, size)
        os.close(os.open(part, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o644))
        return part, ""
    finally:
        for _, fd in held:
            os.close(fd)


def prune(layout: CacheLayout, keep_bytes: int) -> int:
    """Under the global lock: evict unused entries, least recently used first, until at most ``keep_bytes``
    remain under ``shards/``; returns the bytes freed."""
    freed = 0
    entries = scan(layout).entries.values()
    total = sum(e.size for e in entries)
    for entry in sorted(entries, key=lambda e: (e.has_meta, e.access_ns, e.name)):
        if total <= keep_bytes:
            break
        if evict(layout, entry.name):
            total -= entry.size
            freed += entry.size
    return freed
