"""Decoded Parquet row groups shared by the DataLoader workers of one rank, through files in shared memory.

A rank's workers own disjoint lanes, but every lane draws documents from every shard of its datasets' windows,
so without sharing each of ``N`` workers decodes every row group the rank reads — ``N`` times the decoding
(zstd text: ~1 GB/s a core), and ``N`` decoded copies of each row group resident at once. With a share, the
first worker to need a row group *claims* it, decodes it once and *publishes* it as an Arrow IPC file in a
directory of ``/dev/shm`` made by the loader; the other workers map that file (``pa.memory_map``: no copy, no
decoding; the pages are the publisher's, resident once for the whole rank).

Protocol, per row group ``(shard, g)`` in directory ``D`` (files ``D/s-g.claim`` and ``D/s-g.arrow``):

* ``get``: map ``s-g.arrow`` if it exists (a rename publishes it whole, so it is complete or absent);
* ``claim``: create a lock file, take an exclusive ``flock`` on it, then ``link`` it to ``s-g.claim`` —
  atomic, so exactly one process holds a claim, and holds its lock from the moment the claim exists;
* ``publish``: write ``s-g.arrow`` under a temporary name, rename it, then drop the lock;
* ``wait``: a process that could not claim takes a shared ``flock`` on ``s-g.claim`` — it returns when the
  claimant has published, failed or died (the kernel drops a dead process's locks) — then ``get``s; absent
  (the claimant failed, ran out of room, or forgot it), it decodes the row group itself.

A reader claims every row group of a read it can, decodes those, and only then waits for the others: a
claimant never waits while it holds a claim, so no two workers can wait on each other.

Invariant: the data never depends on the share. A mapped row group holds the bytes the worker would have decoded
(the same file, the same pyarrow); every failure — no room in ``/dev/shm`` (``ROOM_MARGIN`` and four times the
file must stay free, or nothing more is published by this process: a full ``/dev/shm`` kills processes that
touch shared pages, e.g. the workers' slot rings), a claimant that died, a file gone — leaves the worker to
decode the row group itself; a corrupt row group raises from the worker's own decode, as before.

Lifetime: the loader makes ``D`` (``make_share_directory``) and removes it when it is closed or collected; a
publisher unlinks its files when it closes their shard (its reader's LRU), and mapped copies stay valid until
their last user drops them. The loader's process publishes too, before its workers start: the row groups its
``num_steps()`` decoded (``ShardReader.publish_decoded``), unlinked once every worker has handed over its first
piece (``zephon.torch_loader``). A lone worker (``num_workers=1``) is ``closed`` from its start: no other worker
would map its files, so it maps what the loader published and decodes the rest itself (a row group nobody
claimed is not waited for). ``ZEPHON_SHARE_ROW_GROUPS=off`` turns sharing off.

Example: 2 workers, a chunk whose rows lie in row groups 0 and 1 of a new shard. Worker 0 claims both and decodes
them; worker 1, a moment later, claims neither, waits on 0's lock, and maps both files: 2 decodes instead of 4.
Had worker 1 arrived first at group 1, each would have decoded one and mapped the other.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field

import pyarrow as pa

from zephon.errors import ConfigError

#: ``ZEPHON_SHARE_ROW_GROUPS``: ``on`` (default) or ``off``.
SHARE_ENV = "ZEPHON_SHARE_ROW_GROUPS"
#: Where the directory is made (tmpfs on Linux).
SHM_ROOT = "/dev/shm"
#: Bytes of ``/dev/shm`` a publisher always leaves free (besides four times the file it writes).
ROOM_MARGIN = 256 << 20
_PREFIX = "zephon-rowgroups-"


def share_enabled() -> bool:
    """Whether DataLoader workers share decoded row groups (``ZEPHON_SHARE_ROW_GROUPS``, read at each call)."""
    value = os.environ.get(SHARE_ENV, "on").strip().lower()
    if value not in ("on", "off"):
        raise ConfigError(f'{SHARE_ENV} must be "on" or "off", got {value!r} — unset it or pick one')
    return value == "on"


def make_share_directory() -> str | None:
    """A new, empty directory in ``/dev/shm`` for one loader's workers, or None where there is none (not Linux,
    not writable) or sharing is off. The caller removes it (``remove_share_directory``).

    Its name holds the making process's PID namespace and PID (``zephon-rowgroups-<ns>-<pid>-…``); first, the
    directories of this user named for a process of this PID namespace that no longer runs are removed
    (``remove_abandoned``): a loader's process ended by SIGTERM — what schedulers, preemption and ``timeout``
    send — or SIGKILL could not remove its own, and each left one behind (empty, or with the row groups its
    workers had published). Example: a job killed mid-epoch leaves ``/dev/shm/zephon-rowgroups-4026531836-8812-x1``;
    the next loader made on that machine, in that namespace, removes it once PID 8812 is gone."""
    if not share_enabled() or not os.path.isdir(SHM_ROOT) or not os.access(SHM_ROOT, os.W_OK):
        return None
    remove_abandoned()
    try:
        return tempfile.mkdtemp(prefix=f"{_PREFIX}{pid_namespace()}-{os.getpid()}-", dir=SHM_ROOT)
    except OSError:
        return None


def remove_abandoned() -> int:
    """Remove the share directories of processes of this PID namespace that no longer run, made by this user
    (``make_share_directory``); how many. A directory of another namespace (a container sharing ``/dev/shm``,
    whose PIDs mean other processes), of another user, of a name without a PID (made before PIDs were in names),
    or of a process still running is left alone."""
    namespace, removed = pid_namespace(), 0
    try:
        names = os.listdir(SHM_ROOT)
    except OSError:
        return 0
    for name in names:
        if not name.startswith(_PREFIX):
            continue
        parts = name[len(_PREFIX) :].split("-")
        if len(parts) < 3 or parts[0] != namespace or not parts[1].isdigit() or running(int(parts[1])):
            continue
        path = os.path.join(SHM_ROOT, name)
        if not own_directory(path):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    return removed


def own_directory(path: str) -> bool:
    """Whether ``path`` is a directory of this user's, not a link (one a cleanup may look into)."""
    try:
        return os.lstat(path).st_uid == os.getuid() and os.path.isdir(path) and not os.path.islink(path)
    except OSError:
        return False


def pid_namespace() -> str:
    """This process's PID namespace (its inode), or "host" where ``/proc`` does not say."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "host"


def running(pid: int) -> bool:
    """Whether process ``pid`` of this PID namespace runs (another user's counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process (EPERM): it runs
        return True
    return True


def remove_share_directory(directory: str) -> None:
    """Remove a directory ``make_share_directory`` made, with what the workers left in it — and nothing else: a
    path that is not one of ours (another prefix or place) is left alone."""
    if os.path.dirname(directory) == SHM_ROOT and os.path.basename(directory).startswith(_PREFIX):
        shutil.rmtree(directory, ignore_errors=True)


def free_bytes(path: str) -> int | None:
    """Bytes free to unprivileged writers on ``path``'s file system (``/dev/shm`` for shared memory), None where
    that cannot be told."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


@dataclass(slots=True)
class SharedRowGroups:
    """One worker's side of a share directory (see the module docstring).

    ``counts``: row groups this process ``decoded`` and published, ``mapped`` from another's file, and
    ``unshared`` (decoded but not published, or decoded again after a failed wait).
    """

    directory: str
    margin: int = ROOM_MARGIN
    counts: dict[str, int] = field(default_factory=lambda: {"decoded": 0, "mapped": 0, "unshared": 0})
    #: Files this process published, per shard id (unlinked by ``forget``).
    written: dict[int, list[str]] = field(default_factory=dict)
    #: No more publishing (no room, the directory is gone, or the rank's only worker: nobody would map its files):
    #: reads still map what others published.
    closed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _path(self, shard_id: int, group: int, kind: str) -> str:
        return os.path.join(self.directory, f"{shard_id}-{group}.{kind}")

    def get(self, shard_id: int, group: int) -> pa.Array | None:
        """The published row group, mapped, or None."""
        column = self._map(shard_id, group)
        if column is not None:
            self.counts["mapped"] += 1
        return column

    def _map(self, shard_id: int, group: int) -> pa.Array | None:
        try:
            source = pa.memory_map(self._path(shard_id, group, "arrow"))
        except (FileNotFoundError, OSError):
            return None
        try:
            return pa.ipc.open_file(source).get_batch(0).column(0)
        except (OSError, pa.ArrowException):
            return None  # not a file we can read (never the case for one published whole): decode instead

    def claim(self, shard_id: int, group: int) -> int | None:
        """A locked descriptor when this process now holds the row group's claim, else None (another does, or
        this process publishes nothing any more)."""
        if self.closed:
            return None
        temporary = self._path(shard_id, group, f"{os.getpid()}-{threading.get_ident()}.lock")
        try:
            fd = os.open(temporary, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        except OSError:
            self.closed = True  # the directory is gone (the loader closed): no more claims
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.link(temporary, self._path(shard_id, group, "claim"))
        except OSError:
            os.close(fd)
            return None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        return fd

    def publish(self, shard_id: int, group: int, fd: int, column: pa.Array) -> pa.Array:
        """Write the decoded row group for the other workers, then drop the claim's lock; the row group to keep:
        the published file, mapped (so the rank holds one copy, not the publisher's as well), else ``column``.
        Without room (or on any write error) nothing is published: the claim is removed, so waiters decode it
        themselves."""
        path = self._path(shard_id, group, "arrow")
        temporary = f"{path}.{os.getpid()}.tmp"
        published = False
        try:
            free = free_bytes(self.directory)
            if free is None or free < 4 * column.nbytes + self.margin:
                self.closed = True
            else:
                batch = pa.RecordBatch.from_arrays([column], names=["v"])
                with pa.OSFile(temporary, "wb") as sink, pa.ipc.new_file(sink, batch.schema) as writer:
                    writer.write_batch(batch)
                os.rename(temporary, path)
                published = True
        except (OSError, pa.ArrowException):
            self.closed = True
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        finally:
            if published:
                with self._lock:
                    self.written.setdefault(shard_id, []).append(path)
                self.counts["decoded"] += 1
            else:
                self._unclaim(shard_id, group)
                self.counts["unshared"] += 1
            os.close(fd)
        mapped = self._map(shard_id, group) if published else None
        return column if mapped is None else mapped

    def abandon(self, shard_id: int, group: int, fd: int) -> None:
        """Give a claim up without publishing (the decode failed): waiters decode the row group themselves."""
        self._unclaim(shard_id, group)
        os.close(fd)

    def _unclaim(self, shard_id: int, group: int) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self._path(shard_id, group, "claim"))

    def wait(self, shard_id: int, group: int) -> pa.Array | None:
        """The row group another process claimed, once it has published it; None when it did not (the caller
        decodes it: counted ``unshared``)."""
        try:
            fd = os.open(self._path(shard_id, group, "claim"), os.O_RDONLY)
        except OSError:
            pass  # published and forgotten, or given up: whatever is there
        else:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)  # returns once the claimant published, gave up or died
            finally:
                os.close(fd)
        column = self.get(shard_id, group)
        if column is None:
            self.counts["unshared"] += 1
        return column

    def forget_all(self) -> None:
        """``forget`` every shard this process published for."""
        for shard_id in list(self.written):
            self.forget(shard_id)

    def forget(self, shard_id: int) -> None:
        """Unlink the files this process published for a shard it closed (mapped copies stay valid)."""
        with self._lock:
            paths = self.written.pop(shard_id, [])
        for path in paths:
            for name in (path, path[: -len("arrow")] + "claim"):
                with contextlib.suppress(OSError):
                    os.unlink(name)
