"""Local files Zephon writes: the cache root, all-or-nothing writes, and one-line storage errors.

Invariant: a reader of a path Zephon writes sees the old file (or directory) or the new one, never a part.
Every write goes to a temporary beside its target (same directory, so same file system), the writer checks
what it wrote, and only then ``os.replace`` moves it into place — one atomic rename. A failure removes the
temporary; a kill leaves it under a name no reader opens, for the writer's own stale-temporary cleanup. An
``OSError`` (disk full, read-only, permission denied) becomes a one-line :class:`StorageError`
(:func:`storage_error`): what was written, where, why, and the fix.

This module is the one place that does it:

* :func:`atomic_file` / :func:`write_atomic` — one file (caches, the Hub download);
* :func:`atomic_directory` — a directory (the plan bundle), with a writer mark and :func:`sweep_stale_temporaries`;
* :func:`removed_on_failure` — the lower-level piece for protocols that rename themselves (the shard cache commits
  a shard and its sidecar under a lock, see :mod:`zephon.storage.shard_cache_lock`).

Worked example — a per-shard token-count array, while another process may be reading it::

    write_atomic(cache_dir() / "token-counts" / "ab12.npy", lambda tmp: np.save(tmp, counts), "the token-count cache")

1. ``token-counts/`` is created if missing; numpy writes ``token-counts/ab12.4242-9f3e01c7.tmp.npy`` (pid 4242,
   random hex; the suffix is kept, else numpy would append ``.npy``).
2. ``os.replace`` renames it to ``ab12.npy``. A reader that opened ``ab12.npy`` before keeps reading the old
   bytes; one that opens it after reads the new ones. Nobody opens ``*.tmp.npy``.
3. ``kill -9`` before the rename leaves ``ab12.4242-9f3e01c7.tmp.npy`` and no ``ab12.npy``: a rerun counts
   that shard again. A full disk instead raises, with the temporary removed::

       StorageError: the token-count cache must be written to /home/u/.cache/zephon/token-counts/ab12.npy, got a
       full disk (ENOSPC: no space left on device) — free space on that file system, or set ZEPHON_CACHE_DIR to a
       writable directory with free space

A directory, ``with atomic_directory(Path("plans/run"), "the plan bundle") as tmp:`` writes into
``plans/.run.tmp-k3j2x9`` (beside it ``plans/.run.tmp-k3j2x9.writer``: ``"<host> 4242"``); when the block ends
an existing ``plans/run`` is moved to ``plans/.run.old-4242``, the temporary renamed to ``plans/run``, the old
one deleted. A kill between those two renames leaves ``run`` absent and the old bundle whole.

One writer at a time: the whole write holds an exclusive ``flock`` on ``plans/.run.lock`` (left in place, empty);
a second writer of the same path fails in one line, or waits (``wait=True``: ranks planning the same cached
plan). And what is replaced is checked again at the moment of replacing (``ours``, the caller's rule of which
entries it may have written): a file a user put into ``plans/run`` while it was written is refused, nothing
changed; only entries ``ours`` accepts are deleted from the old directory.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

from zephon.errors import StorageError


def cache_dir() -> Path:
    """Root of Zephon's local caches: ``$ZEPHON_CACHE_DIR``, else ``~/.cache/zephon``."""
    return Path(os.environ.get("ZEPHON_CACHE_DIR") or Path.home() / ".cache" / "zephon")


# -- one-line storage errors ---------------------------------------------------------------------------------
_STORAGE_FAILURES = {
    errno.ENOSPC: ("a full disk (ENOSPC: no space left on device)", "free space on that file system"),
    errno.EDQUOT: ("an exceeded disk quota (EDQUOT)", "free space within your quota"),
    errno.EROFS: ("a read-only file system (EROFS)", "make that file system writable"),
    errno.EACCES: ("permission denied (EACCES)", "make that directory writable for this user"),
    errno.EPERM: ("permission denied (EPERM)", "make that directory writable for this user"),
}


CACHE_DIR_FIX = "or set ZEPHON_CACHE_DIR to a writable directory with free space"


def storage_error(
    exc: OSError, what: str, where: str | os.PathLike[str], alternative: str = CACHE_DIR_FIX
) -> StorageError:
    """A one-line :class:`StorageError` for a failed write: what was written, where, why, and the fix."""
    got, fix = _STORAGE_FAILURES.get(exc.errno or 0, (f"{exc.strerror or exc}", "check that file system"))
    return StorageError(f"{what} must be written to {os.fspath(where)}, got {got} — {fix}, {alternative}")


# -- the temporary: removed unless it was moved into place -----------------------------------------------------
def discard(path: Path) -> None:
    """Remove a file or directory tree if it is there; errors are ignored (a failed write's cleanup must not
    hide why it failed, and a leftover is the stale-temporary cleanup's to remove)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


@contextlib.contextmanager
def removed_on_failure(temporary: Path) -> Iterator[Path]:
    """Yield ``temporary``; when the block raises, :func:`discard` it and re-raise.

    The block writes, checks and renames it; whoever renames it owns what is left. For a protocol that cannot
    use :func:`atomic_file` (the shard cache renames under its lock, in two steps).
    """
    try:
        yield temporary
    except BaseException:
        discard(temporary)
        raise


# -- one file ------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def atomic_file(
    path: Path, what: str, alternative: str = CACHE_DIR_FIX, *, temporary: Path | None = None
) -> Iterator[Path]:
    """Yield a temporary beside ``path``; when the block ends without an error, rename it to ``path``.

    The block writes the temporary and checks it (size, hash): raising leaves ``path`` as it was and removes the
    temporary. The default temporary, ``<stem>.<pid>-<hex>.tmp<suffix>``, keeps ``path``'s suffix (numpy appends
    ``.npy``/``.npz`` otherwise). ``temporary`` names it instead, for a caller whose documentation or cleanup
    knows the name; an ``OSError`` — creating the directory, in the block, renaming — becomes a
    :class:`StorageError` naming that temporary (the file being written), else ``path``.
    """
    tmp = temporary or path.with_name(f"{path.stem}.{os.getpid()}-{os.urandom(4).hex()}.tmp{path.suffix}")
    try:
        with removed_on_failure(tmp):
            path.parent.mkdir(parents=True, exist_ok=True)
            yield tmp
            os.replace(tmp, path)
    except OSError as exc:
        raise storage_error(exc, what, temporary or path, alternative) from exc


def write_atomic(path: Path, write: Callable[[Path], object], what: str, alternative: str = CACHE_DIR_FIX) -> None:
    """Write ``path`` all or nothing: ``write(tmp)`` in the same directory, then rename (:func:`atomic_file`).

    On any failure the temporary is removed, so readers see the old file or the new one, never a part; an
    ``OSError`` becomes a :class:`StorageError` (disk full, read-only, permission denied) naming ``path``.
    """
    with atomic_file(path, what, alternative) as tmp:
        write(tmp)


# -- one directory -------------------------------------------------------------------------------------------
#: Suffix of the file beside a temporary directory that names its writer: ``"<hostname> <pid>"``.
WRITER_SUFFIX = ".writer"


def _writer_mark(tmp: Path) -> Path:
    return tmp.with_name(tmp.name + WRITER_SUFFIX)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def sweep_stale_temporaries(path: Path) -> list[Path]:
    """Remove ``.NAME.tmp-*`` siblings of ``path`` left by writers that died (``kill -9``, power loss).

    Each temporary has a mark beside it (``.NAME.tmp-XXXX.writer``) naming its writer's host and pid. Only
    temporaries whose writer ran on this host and no longer exists are removed; another host's, a live
    writer's and unmarked ones are left alone. Returns the removed temporaries.
    """
    removed: list[Path] = []
    for mark in sorted(path.parent.glob(f".{path.name}.tmp-*{WRITER_SUFFIX}")):
        try:
            host, pid = mark.read_text(encoding="utf-8").split()
            alive = host != socket.gethostname() or _process_exists(int(pid))
        except (OSError, ValueError):
            continue
        if not alive:
            tmp = mark.with_name(mark.name[: -len(WRITER_SUFFIX)])
            if tmp.exists():
                discard(tmp)
                removed.append(tmp)
            mark.unlink(missing_ok=True)
    return removed


def _foreign(path: Path, ours: Callable[[Path], bool]) -> str | None:
    """The first entry of an existing ``path`` that ``ours`` does not accept (``path`` itself if it is not a
    directory), else None."""
    if path.is_symlink() or not path.is_dir():
        return path.name
    return next((p.name for p in sorted(path.iterdir()) if not ours(p)), None)


def _move_into_place(tmp: Path, path: Path, what: str, ours: Callable[[Path], bool] | None) -> None:
    """Rename ``tmp`` to ``path``; an existing ``path`` is first checked (``ours``), moved aside to
    ``.NAME.old-<pid>`` (a directory cannot be replaced in one rename), then deleted: whole without ``ours``,
    else only the entries ``ours`` accepts. A kill in between leaves ``path`` absent, the old whole."""
    if not path.exists() and not path.is_symlink():
        os.replace(tmp, path)
        return
    if ours is not None and (foreign := _foreign(path, ours)) is not None:
        raise StorageError(
            f"{what} must replace only what a writer of it wrote, got {path} holding {foreign!r} at the moment of "
            "replacing (put there while writing) — nothing was changed and the new one was discarded; move that "
            "out and write again, or choose another path"
        )
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    os.replace(path, old)
    os.replace(tmp, path)
    if ours is None:
        discard(old)
        return
    for entry in old.iterdir():
        if ours(entry):
            discard(entry)
    with contextlib.suppress(OSError):  # an entry put there between the check and the rename stays, in ``old``
        old.rmdir()


@contextlib.contextmanager
def claimed(path: Path, what: str, *, wait: bool = False) -> Iterator[None]:
    """Hold the exclusive lock ``.NAME.lock`` beside ``path`` for the block: one writer of ``path`` at a time.

    Another holder makes this a one-line :class:`StorageError` at once, or (``wait``) a wait for it. The lock
    file is left in place (removing it would race with the next writer's lock).
    """
    lock = path.with_name(f".{path.name}.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StorageError(
                f"{what} at {path} must have one writer at a time, got another writing it now (it holds {lock}) — "
                "wait for it to finish, or write to another path"
            ) from None
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def atomic_directory(
    path: Path,
    what: str,
    alternative: str = CACHE_DIR_FIX,
    *,
    ours: Callable[[Path], bool] | None = None,
    wait: bool = False,
) -> Iterator[Path]:
    """Yield a new temporary sibling ``.NAME.tmp-XXXX`` of ``path``; when the block ends without an error, rename
    it to ``path``, replacing an existing one (whether it may be replaced is the caller's to decide, and
    ``ours``, when given, is asked again at the moment of replacing: see the module docstring).

    The whole write holds :func:`claimed` (``wait``: wait for another writer instead of failing). Before,
    temporaries of dead writers are swept (:func:`sweep_stale_temporaries`); the temporary's writer mark is
    removed afterwards, and the temporary itself on failure. An ``OSError`` becomes a :class:`StorageError`
    naming ``path``.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with claimed(path, what, wait=wait):
            sweep_stale_temporaries(path)
            tmp = _new_directory(path.parent, f".{path.name}.tmp-")
            try:
                with removed_on_failure(tmp):
                    _writer_mark(tmp).write_text(f"{socket.gethostname()} {os.getpid()}\n", encoding="utf-8")
                    yield tmp
                    _move_into_place(tmp, path, what, ours)
            finally:
                _writer_mark(tmp).unlink(missing_ok=True)
    except OSError as exc:
        raise storage_error(exc, what, path, alternative) from exc


def _new_directory(parent: Path, prefix: str) -> Path:
    """A new, uniquely named directory ``parent/prefix<random>``, created with the user's umask.

    ``tempfile.mkdtemp`` would create it ``0700`` whatever the umask, so a plan bundle written on shared
    storage could not be read by the other users of a cluster; ``os.mkdir(..., 0o777)`` leaves the mode to
    the umask as any other directory the user creates.
    """
    while True:
        candidate = parent / f"{prefix}{os.urandom(6).hex()}"
        try:
            candidate.mkdir(mode=0o777)
        except FileExistsError:
            continue
        return candidate
