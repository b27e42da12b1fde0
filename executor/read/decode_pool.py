"""Decoding Parquet row groups on a small thread pool, several at once.

Decoding a row group — decompressing its pages (snappy: ~1 GB/s on one core) and building the Arrow array —
runs in pyarrow without the GIL. It is the one cost of reading that grows with selection: a plan keeping 30 %
of a dataset's rows at random decodes every row group whole and uses 30 of each 100 rows, so it decodes 3.3×
the bytes of a plan reading the same documents stored alone, and a chunk entering a new shard needs nearly all
of that shard's row groups at once. Decoded one after another on the reader's thread, they held up the chunk;
on the pool they decode side by side, on cores the tokenizer leaves idle (docs/performance.md, Selective
plans).

Invariant: the data never depends on the pool. A row group's array is the same whichever thread decoded it;
the reader takes the row groups in order and each row from its own row group, as before; the first row group
that fails raises the same ``DatasetError`` at the same read.

``ZEPHON_DECODE_THREADS`` sets the pool: ``auto`` (default) one thread per core this process may use, at most
``MAX_THREADS``; a number; ``1`` decodes on the reader's thread, one row group at a time.

Example: on 2 cores a chunk enters a shard of 50 row groups whose rows are 30 % selected: its rows lie in all
50. On the reader's thread they took ~65 ms one by one; two pool threads decode 25 each, ~35 ms.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

from zephon.errors import ConfigError
from zephon.executor.cores import usable_cores

#: ``ZEPHON_DECODE_THREADS``: ``auto`` (default) or a number of threads (1: no pool).
DECODE_THREADS_ENV = "ZEPHON_DECODE_THREADS"
#: ``auto`` uses at most this many threads: decoding is one of several stages sharing the cores.
MAX_THREADS = 4

_lock = threading.Lock()
_pools: dict[int, ThreadPoolExecutor] = {}


def decode_threads() -> int:
    """Threads decoding row groups (``ZEPHON_DECODE_THREADS``, read at each call)."""
    value = os.environ.get(DECODE_THREADS_ENV, "").strip().lower() or "auto"
    if value == "auto":
        cores = usable_cores()
        return max(1, min(MAX_THREADS, cores))
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(
            f'{DECODE_THREADS_ENV} must be "auto" or a number of threads ≥ 1, got {value!r} — unset it or pick one'
        )
    return int(value)


def decode_pool() -> ThreadPoolExecutor | None:
    """The process's pool of ``decode_threads()`` threads (idle ones cost nothing and end with the interpreter),
    or None when decoding stays on the reader's thread (1 thread)."""
    threads = decode_threads()
    if threads <= 1:
        return None
    with _lock:
        pool = _pools.get(threads)
        if pool is None:
            pool = _pools[threads] = ThreadPoolExecutor(threads, thread_name_prefix="zephon-decode")
        return pool


def _forget_pools() -> None:
    """In a forked child (a DataLoader worker): the parent's pool threads do not exist there, so its pools are
    made anew on first use (a copied pool would queue work that no thread runs)."""
    global _lock
    _lock = threading.Lock()
    _pools.clear()


os.register_at_fork(after_in_child=_forget_pools)
