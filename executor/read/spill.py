"""Decoded row groups past a memory budget kept in files on disk, mapped: the shard reader never holds more than
``ZEPHON_DECODED_MEMORY`` of decoded text in its process's own memory.

Why: a rank reads every dataset within a shuffle window of shards, so its reader keeps ``window_shards + 1`` shards
of each dataset open with the row groups it decoded (``zephon.executor.read.parquet``) — random access into the
window without decoding a row group again for each document. That is ``datasets × (window_shards + 1)`` shards of
decoded text at once, whatever the plan reads of them: a 50-dataset mixture of shards holding 28 MB of text in one
row group each held 6.0 GB before its first batch, 200 such datasets passed 7.5 GB and were killed by the
out-of-memory killer, with no word of why (helper-44's audit, December 2026).

Algorithm: ``Spill.keep`` takes each row group the reader decodes (not one mapped from the DataLoader workers'
share, which has its own room check). While the row groups it holds in memory stay within the budget it keeps it
there, as before; past it, it writes the row group as an Arrow IPC file in a directory of its own and hands back
the file, memory-mapped. Those pages belong to the kernel's page cache: kept while memory allows, written back and
dropped under pressure, read back from disk when touched again — never a reason to kill the process. A closed
shard's files are unlinked (``forget``; its mapped arrays stay valid until dropped) and the directory is removed
with the reader (``close``). A file system without room for twice the row group and ``ROOM_MARGIN`` keeps it in
memory (and warns once). The first row group kept in a file warns once a process: the reader holds more than the
budget, names the directory and how to hold less.

Invariant: the data never depends on the spill — a mapped row group is the decoded array's bytes, written and read
by the same pyarrow — and the reader's own memory for decoded text stays within the budget plus one row group.

Example: a budget of 1 GiB, 50 datasets × 5 open shards of one 28 MB row group each: the first 38 row groups
decoded stay in memory (1,064 MB > 1 GiB at the 39th), the other 212 go to files under ``$ZEPHON_SPILL_DIR``
(default: ``zephon-decoded`` in the system's temporary directory), ~5.9 GB of disk, mapped.

``ZEPHON_DECODED_MEMORY``: a size (``2GiB``, ``512MiB``, ``1000000`` bytes) or ``off`` (no budget: every row group
in memory, as before); by default a quarter of the memory this machine or container has (``/proc/meminfo``, the
cgroup's limit where lower) shared by its ranks (``LOCAL_WORLD_SIZE``, which ``torchrun`` sets) and by a rank's
DataLoader workers (each a process reading its own shards), at least
``MIN_BUDGET``: 6 GiB on a 24 GiB machine running one rank, 32 GiB a rank on a 2 TiB node running 16.
``ZEPHON_SPILL_DIR``: where — an existing directory (a mistyped one is never made: the row groups stay in memory,
with a warning) — by default ``zephon-decoded`` in the system's temporary directory (local to the machine), or
``$ZEPHON_CACHE_DIR/decoded`` where that is memory (tmpfs), made when first needed and removed with the
directory in it when that leaves it empty. A directory's name holds the machine, the PID
namespace and the PID of the process that made it; one left by a process of this machine that no longer runs (a
killed rank, or DataLoader worker: the loader removes its workers' when they end) is removed when the next is made
— its row group files, then the directory if nothing else is in it (``remove_abandoned``).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import tempfile
import threading

import pyarrow as pa

from zephon.checks import size_setting
from zephon.errors import warn
from zephon.executor.cores import workers_sharing
from zephon.executor.read.shared_groups import free_bytes, own_directory, pid_namespace, running

#: ``ZEPHON_DECODED_MEMORY`` and ``ZEPHON_SPILL_DIR``.
BUDGET_ENV, DIR_ENV = "ZEPHON_DECODED_MEMORY", "ZEPHON_SPILL_DIR"
#: The least default budget (a rank's reader of the local corpus holds ~170 MB of decoded text).
MIN_BUDGET = 1 << 30
#: Bytes a spill always leaves free on its file system (besides twice the row group it writes).
ROOM_MARGIN = 1 << 30
_PREFIX = "zephon-decoded-"
_warned: set[str] = set()  # the warnings given in this process ("spill", "room")


def budget() -> int | None:
    """The budget in bytes (``ZEPHON_DECODED_MEMORY``, read at each call), None when ``off``."""
    value = os.environ.get(BUDGET_ENV, "").strip()
    return size_setting(BUDGET_ENV, value, {"off": None}, "2GiB or 512MiB") if value else default_budget()


def default_budget() -> int:
    """A quarter of the memory of this machine (or container: its cgroup's limit where lower) over the ranks it
    runs (``LOCAL_WORLD_SIZE``) and, in a DataLoader worker, over its rank's workers; at least ``MIN_BUDGET``."""
    limits = []
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo") as meminfo:
        limits.append(int(next(line for line in meminfo if line.startswith("MemTotal:")).split()[1]) << 10)
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        with contextlib.suppress(OSError, ValueError), open(path) as limit:
            limits.append(int(limit.read().strip()))
    ranks = os.environ.get("LOCAL_WORLD_SIZE", "1")
    processes = (int(ranks) if ranks.isdigit() and int(ranks) > 0 else 1) * workers_sharing()
    return max(MIN_BUDGET, min(limits, default=0) // (4 * processes))


def spill_root() -> str:
    """Where spill directories are made: ``ZEPHON_SPILL_DIR``, else ``zephon-decoded`` in the system's temporary
    directory — local to the machine — unless that is memory (tmpfs), then ``decoded`` under Zephon's cache."""
    configured = os.environ.get(DIR_ENV)
    if configured:
        return configured
    temporary = tempfile.gettempdir()
    if _file_system(temporary) not in ("tmpfs", "ramfs"):
        return os.path.join(temporary, "zephon-decoded")
    from zephon.storage.files import cache_dir

    return str(cache_dir() / "decoded")


def _file_system(path: str) -> str | None:
    """The type of the file system ``path`` lies on (``/proc/self/mounts``), None where it cannot be told."""
    real, best, kind = os.path.realpath(path), "", None
    with contextlib.suppress(OSError), open("/proc/self/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            inside = len(fields) > 2 and (real == fields[1] or real.startswith(fields[1].rstrip("/") + "/"))
            if inside and len(fields[1]) >= len(best):
                best, kind = fields[1], fields[2]
    return kind


def _host() -> str:
    """This machine's name as a directory name's part (a spill root on a shared file system holds several)."""
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def _ours(name: str) -> int | None:
    """The PID in a spill directory's name made on this machine, in this PID namespace, else None."""
    found = re.fullmatch(re.escape(f"{_PREFIX}{_host()}-{pid_namespace()}-") + r"(\d+)-[a-z0-9_]{8}", name)
    return int(found.group(1)) if found else None


def _remove(directory: str) -> None:
    """The row group files a spill wrote in ``directory``, then the directory if that left it empty: nothing
    else in it is ever removed."""
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            if re.fullmatch(r"\d+-\d+\.arrow", name):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(directory, name))
        os.rmdir(directory)


def remove_abandoned(root: str, pids: list[int] | None = None) -> int:
    """Remove the spill directories under ``root`` of this machine's processes (of this PID namespace, this user)
    that no longer run — of ``pids`` only, when given (DataLoader workers just ended); how many. A directory
    named otherwise, of another machine or namespace, of a running process, a link, or not ours is left alone,
    and so is every file in one that a spill did not write."""
    removed = 0
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            pid = _ours(name)
            if pid is None or (pids is not None and pid not in pids) or running(pid):
                continue
            path = os.path.join(root, name)
            if not own_directory(path):
                continue
            _remove(path)
            removed += 1
    return removed


def remove_spills_of(pids: list[int]) -> int:
    """``remove_abandoned`` for these processes (a DataLoader's workers once they are gone) under the spill root."""
    return remove_abandoned(spill_root(), pids) if pids else 0


class Spill:
    """One shard reader's decoded row groups: ``held`` bytes in memory, the rest in files (module docstring)."""

    def __init__(self, limit: int, root: str) -> None:
        self.limit = limit
        self.root = root
        self.held = 0  # bytes of decoded row groups kept in memory
        self.spilled = 0  # bytes of row groups kept in files (unlinked ones not counted)
        self.directory: str | None = None
        self._made_root = False  # the default root, made by this spill: removed with the directory when empty
        self._kept: dict[tuple[int, int], tuple[int, str | None]] = {}  # (shard, group) -> bytes, its file or None
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls) -> Spill | None:
        limit = budget()
        return None if limit is None else cls(limit, spill_root())

    def keep(self, shard_id: int, group: int, column: pa.Array) -> pa.Array:
        """The row group as the reader should hold it: ``column`` itself within the budget, else its file, mapped."""
        size = column.nbytes
        with self._lock:
            if self.held + size <= self.limit:
                self.held += size
                self._kept[shard_id, group] = (size, None)
                return column
        path = self._write(shard_id, group, column)
        if path is None:  # no room on disk: in memory after all
            with self._lock:
                self.held += size
                self._kept[shard_id, group] = (size, None)
            return column
        mapped = pa.ipc.open_file(pa.memory_map(path)).get_batch(0).column(0)
        with self._lock:
            self.spilled += size
            self._kept[shard_id, group] = (size, path)
        return mapped

    def forget(self, shard_id: int, groups: int) -> None:
        """A shard closed: its row groups in memory no longer count, its files are unlinked."""
        with self._lock:
            kept = [entry for g in range(groups) if (entry := self._kept.pop((shard_id, g), None)) is not None]
            for size, path in kept:
                if path is None:
                    self.held -= size
                else:
                    self.spilled -= size
        for _, path in kept:
            if path is not None:
                with contextlib.suppress(OSError):
                    os.unlink(path)

    def close(self) -> None:
        """Remove the directory and what is left in it (the reader closed every shard first); usable again after."""
        directory, self.directory = self.directory, None
        if directory is not None:
            _remove(directory)
        if self._made_root:
            self._made_root = False
            with contextlib.suppress(OSError):  # another process's directory in it: it stays
                os.rmdir(self.root)
        with self._lock:
            self._kept.clear()
            self.held = self.spilled = 0

    def _write(self, shard_id: int, group: int, column: pa.Array) -> str | None:
        """``column`` written as an Arrow IPC file in this spill's directory (made at the first), or None where
        the file system has no room for it (a one-time warning) or cannot be written."""
        try:
            if self.directory is None:
                if not os.path.isdir(self.root):  # a ZEPHON_SPILL_DIR must exist (a mistyped one is not made)
                    if os.environ.get(DIR_ENV):
                        raise FileNotFoundError(f"{DIR_ENV} must be an existing directory, got {self.root!r}")
                    os.makedirs(self.root)
                    self._made_root = True
                remove_abandoned(self.root)
                prefix = f"{_PREFIX}{_host()}-{pid_namespace()}-{os.getpid()}-"
                self.directory = tempfile.mkdtemp(prefix=prefix, dir=self.root)
            free = free_bytes(self.directory)
            if free is not None and free < 2 * column.nbytes + ROOM_MARGIN:
                _warn_once("room", f"the shard reader must keep decoded row groups past {BUDGET_ENV} in files under "
                           f"{self.directory}, with {ROOM_MARGIN >> 20} MiB left free there beside twice the row "
                           f"group, got {free >> 20} MiB free — free space, or set {DIR_ENV} to a larger disk; they "
                           "are kept in memory meanwhile")  # fmt: skip
                return None
            path = os.path.join(self.directory, f"{shard_id}-{group}.arrow")
            batch = pa.RecordBatch.from_arrays([column], names=["v"])
            with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, batch.schema) as writer:
                writer.write_batch(batch)
        except (OSError, pa.ArrowException) as exc:
            _warn_once("room", f"the shard reader must keep decoded row groups past {BUDGET_ENV} in files under "
                       f"{self.root}, got {type(exc).__name__}: {exc} — set {DIR_ENV} to a writable disk; they are "
                       "kept in memory meanwhile")  # fmt: skip
            return None
        _warn_once("spill", f"the shard reader holds {_size(self.held)} of decoded text, its {BUDGET_ENV} budget: "
                   f"row groups past it are kept in files under {self.directory}, mapped (the page cache holds them "
                   "while memory allows) — a rank keeps (window_shards + 1) shards of every dataset open: plan with a "
                   f"smaller ShuffleSpec.window_shards to hold less, or raise {BUDGET_ENV}")  # fmt: skip
        return path


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def _warn_once(kind: str, message: str) -> None:
    if kind not in _warned:
        _warned.add(kind)
        warn(message)
