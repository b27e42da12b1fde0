"""On-disk layout, file locks and entry bookkeeping of the shard cache (protocol: :mod:`zephon.storage.shard_cache`).

Layout of a cache root (every name below ``root`` comes from :func:`entry_name`, never from a key)::

    root/zephon-cache.lock                 global lock: held (LOCK_EX) only for short bookkeeping
    root/shards/<name>                     complete shards; LOCK_SH on an open fd pins one ("in use")
    root/meta/<name>.json                  sidecar {"format", "key", "size", "etag"}, written after the shard
    root/locks/<name>.lock                 per-entry download lock (LOCK_EX); empty, never deleted
    root/tmp/<name>.<size>.<rand>.part     a download in progress: reserves <size> bytes while its
                                           entry's download lock is held, stale (deleted) otherwise
    root/tmp/<name>.<rand>.json.tmp        a sidecar being written (stale whenever the global lock is free)

Locks are ``fcntl.flock`` locks: they belong to an open file description, so two fds of one process
conflict like two processes do (threads and several caches in one process are covered), and the kernel
drops them when a process dies, so a killed rank never leaves a lock behind. Linux/macOS, local disks.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import threading
import time
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from zephon.storage.files import removed_on_failure

META_FORMAT = 1
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_BASENAME_MAX = 64
PART_SUFFIX = ".part"
META_TMP_SUFFIX = ".json.tmp"


#: What :func:`entry_name` produces. Only files so named are the cache's: anything else a user puts under the
#: root (a file in ``shards/``, ``meta/`` or ``tmp/``) is never listed, counted, evicted or deleted.
_ENTRY_NAME = re.compile(r"^[0-9a-f]{32}-[A-Za-z0-9._-]+$")


def is_entry_name(name: str) -> bool:
    """True for a name :func:`entry_name` can produce (so a file the cache may have written)."""
    return _ENTRY_NAME.match(name) is not None


def _is_own_temporary(file_name: str) -> bool:
    """A ``.part`` download or a sidecar temporary of an entry (the names :class:`CacheLayout` makes)."""
    part = parse_part(file_name)
    if part is not None:
        return is_entry_name(part[0])
    if file_name.endswith(META_TMP_SUFFIX):
        return is_entry_name(file_name[: -len(META_TMP_SUFFIX)].rsplit(".", 1)[0])
    return False


def entry_name(key: str) -> str:
    """File name of a key: ``<32 hex of sha256(key)>-<sanitized basename, ≤ 64 chars>``.

    The hash makes it unique; the basename keeps the extension (``000.parquet``) for readers and humans.
    Only ``[A-Za-z0-9._-]`` survive, with no leading dot, so no key can name a path outside the root.

    >>> entry_name("hf/org/ds/abc123/sample/10BT/000.parquet")[32:]
    '-000.parquet'
    >>> entry_name("../../etc/passwd")[32:]
    '-passwd'
    """
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    last = re.split(r"[/\\]", key)[-1]
    unaccented = "".join(c for c in unicodedata.normalize("NFKD", last) if not unicodedata.combining(c))
    base = _UNSAFE.sub("_", unaccented).lstrip(".")[-_BASENAME_MAX:].lstrip(".") or "shard"
    return f"{digest}-{base}"


@dataclass(frozen=True, slots=True)
class CacheLayout:
    """Paths of one cache root."""

    root: Path

    @property
    def global_lock(self) -> Path:
        return self.root / "zephon-cache.lock"

    @property
    def shards(self) -> Path:
        return self.root / "shards"

    @property
    def meta_dir(self) -> Path:
        return self.root / "meta"

    @property
    def locks(self) -> Path:
        return self.root / "locks"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    def create(self) -> None:
        for directory in (self.shards, self.meta_dir, self.locks, self.tmp):
            directory.mkdir(parents=True, exist_ok=True)

    def exists(self) -> bool:
        """True when ``root`` holds a cache: its global lock file and its four directories."""
        dirs = (self.shards, self.meta_dir, self.locks, self.tmp)
        return self.global_lock.is_file() and all(d.is_dir() for d in dirs)

    def data(self, name: str) -> Path:
        return self.shards / name

    def meta(self, name: str) -> Path:
        return self.meta_dir / f"{name}.json"

    def download_lock(self, name: str) -> Path:
        return self.locks / f"{name}.lock"

    def part(self, name: str, size: int) -> Path:
        return self.tmp / f"{name}.{size}.{os.urandom(8).hex()}{PART_SUFFIX}"

    def meta_tmp(self, name: str) -> Path:
        return self.tmp / f"{name}.{os.urandom(8).hex()}{META_TMP_SUFFIX}"


def parse_part(file_name: str) -> tuple[str, int] | None:
    """``(entry name, reserved bytes)`` of a ``.part`` file name, or None when it is not one."""
    if not file_name.endswith(PART_SUFFIX):
        return None
    pieces = file_name[: -len(PART_SUFFIX)].rsplit(".", 2)
    if len(pieces) != 3 or not pieces[1].isdigit():
        return None
    return pieces[0], int(pieces[1])


def _open(path: Path, *, create: bool) -> int:
    flags = os.O_RDONLY | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    return os.open(path, flags, 0o644)


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold a blocking LOCK_EX on ``path`` (created if missing) for the ``with`` block."""
    fd = _open(path, create=True)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def try_exclusive(path: Path, *, create: bool = False) -> int | None:
    """Take LOCK_EX without waiting; return the fd that holds it (close it to release), or None.

    None also when the file does not exist (and ``create`` is False).
    """
    try:
        fd = _open(path, create=create)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def is_locked(path: Path) -> bool:
    """True when some fd holds a lock on ``path`` (probes with LOCK_EX|LOCK_NB and releases at once)."""
    try:
        fd = _open(path, create=False)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def pin(path: Path) -> int:
    """Take LOCK_SH on ``path`` and return the fd; call only under the global lock (no evictor can hold EX)."""
    fd = _open(path, create=False)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


class CachedShard:
    """A complete shard pinned in the cache; while open, no process evicts or replaces it."""

    def __init__(self, key: str, path: Path, fd: int, on_close: Callable[[CachedShard], None]) -> None:
        self.key = key
        self.path = path
        self._fd = fd
        self._on_close = on_close
        self._lock = threading.Lock()

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def close(self) -> None:
        """Release the pin (idempotent)."""
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)
            self._on_close(self)

    def __enter__(self) -> CachedShard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CachedShard({self.key!r}, {str(self.path)!r}{', closed' if self.closed else ''})"


def unlink_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


# ---------------------------------------------------------------- entries (call under the global lock)
@dataclass(slots=True)
class Entry:
    """A file under ``shards/``; ``has_meta`` False means an orphan (a crash between rename and sidecar)."""

    name: str
    size: int
    access_ns: int
    has_meta: bool


@dataclass(slots=True)
class Scan:
    entries: dict[str, Entry]
    reserved: int  # bytes reserved by downloads in progress

    @property
    def used(self) -> int:
        return self.reserved + sum(e.size for e in self.entries.values())


def scan(layout: CacheLayout) -> Scan:
    """List entries and live reservations; delete stale temporaries and sidecars without a shard."""
    reserved = 0
    for tmp in os.scandir(layout.tmp):
        if not _is_own_temporary(tmp.name):
            continue  # not a name the cache makes: not ours to delete
        part = parse_part(tmp.name)
        if part is not None and is_locked(layout.download_lock(part[0])):
            reserved += part[1]
        else:  # a killed download, or a sidecar never renamed: nobody owns it
            unlink_quietly(Path(tmp.path))
    metas = {
        m.name.removesuffix(".json")
        for m in os.scandir(layout.meta_dir)
        if m.name.endswith(".json") and is_entry_name(m.name.removesuffix(".json"))
    }
    entries: dict[str, Entry] = {}
    for data in os.scandir(layout.shards):
        if not is_entry_name(data.name):
            continue
        try:
            st = data.stat()
        except FileNotFoundError:
            continue
        entries[data.name] = Entry(data.name, st.st_size, st.st_mtime_ns, data.name in metas)
    for orphan in metas - entries.keys():
        unlink_quietly(layout.meta(orphan))
    return Scan(entries, reserved)


@dataclass(frozen=True, slots=True)
class Meta:
    """The sidecar of an entry."""

    key: str
    size: int
    etag: str


def read_meta(layout: CacheLayout, name: str) -> Meta | None:
    """The sidecar of ``name``, or None when it is missing, unreadable or of another format."""
    try:
        raw = json.loads(layout.meta(name).read_text(encoding="utf-8"))
        meta = Meta(raw["key"], raw["size"], raw["etag"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    ok = raw.get("format") == META_FORMAT and isinstance(meta.key, str) and isinstance(meta.etag, str)
    return meta if ok and isinstance(meta.size, int) else None


def commit(layout: CacheLayout, name: str, part: Path, *, key: str, size: int, etag: str) -> None:
    """Move a checked download into place, then its sidecar (written first to ``tmp/``, so a full disk fails
    before anything moves; a sidecar temporary left behind is deleted by the next :func:`scan`).

    Not :func:`~zephon.storage.files.atomic_file`: that renames one file as soon as it is written, while an
    entry is two files committed under the global lock — the sidecar's temporary must exist before the shard
    moves, and both temporaries live in ``tmp/`` under names :func:`scan` recognizes (a ``.part`` carries its
    reservation). The cache words its own ``StorageError`` (``CacheStore.locked``). The shared piece it uses is
    :func:`~zephon.storage.files.removed_on_failure`: a failure removes the temporary.
    """
    with removed_on_failure(layout.meta_tmp(name)) as meta_tmp:
        meta_tmp.write_text(
            json.dumps({"format": META_FORMAT, "key": key, "size": size, "etag": etag}), encoding="utf-8"
        )
        os.replace(part, layout.data(name))
        os.replace(meta_tmp, layout.meta(name))
    touch(layout.data(name))


def touch(path: Path) -> None:
    """Record an access (nanosecond wall clock; the kernel's own "now" is too coarse to order accesses)."""
    now = time.time_ns()
    os.utime(path, ns=(now, now))


def delete_entry(layout: CacheLayout, name: str) -> None:
    unlink_quietly(layout.meta(name))
    unlink_quietly(layout.data(name))


def evict(layout: CacheLayout, name: str) -> bool:
    """Delete an entry unless some process has it open (LOCK_EX|LOCK_NB on its file fails)."""
    fd = try_exclusive(layout.data(name))
    if fd is None:
        return False
    try:
        delete_entry(layout, name)
    finally:
        os.close(fd)
    return True
