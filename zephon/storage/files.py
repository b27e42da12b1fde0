"""Local files Zephon writes: the cache root, all-or-nothing writes, and one-line storage errors."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

from zephon.errors import StorageError


def cache_dir() -> Path:
    """Root of Zephon's local caches: ``$ZEPHON_CACHE_DIR``, else ``~/.cache/zephon``."""
    return Path(os.environ.get("ZEPHON_CACHE_DIR") or Path.home() / ".cache" / "zephon")


# -- writing cache files -----------------------------------------------------------------------------------
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


def write_atomic(path: Path, write: Callable[[Path], object], what: str, alternative: str = CACHE_DIR_FIX) -> None:
    """Write ``path`` all or nothing: ``write(tmp)`` in the same directory, then rename.

    The temporary keeps ``path``'s suffix (numpy appends ``.npy``/``.npz`` otherwise). On any failure it is
    removed, so readers see the old file or the new one, never a part; an ``OSError`` becomes a
    :class:`StorageError` (disk full, read-only, permission denied) naming ``path``.
    """
    tmp = path.with_name(f"{path.stem}.{os.getpid()}-{os.urandom(4).hex()}.tmp{path.suffix}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        raise storage_error(exc, what, path, alternative) from exc
    finally:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        except OSError:  # e.g. a read-only file system: nothing was created there anyway
            pass
