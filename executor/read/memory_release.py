"""Handing freed memory back to the system when the shard reader drops a large buffer.

The reader's large, short-lived buffers — a Parquet row group's compressed bytes and decompressed pages while it
is decoded, the decoded text of a shard when it is closed — are freed to allocators that keep freed memory
for reuse: Arrow's default pool (mimalloc in the pip wheels) and glibc's malloc, whose per-thread arenas (the
read-ahead thread, the encode pool, the engines' own threads) each keep up to tens of MB free at their top.
Kept, that memory is resident though unused: a training rank measured 200-300 MB above what it held live, and
more the longer it ran (docs/performance.md, Memory).

``release_memory()`` asks both to return what they hold free: ``pa.default_memory_pool().release_unused()``
and glibc's ``malloc_trim(0)`` (skipped where the C library has none). It changes no allocator setting —
no arena cap, no threshold. The reader calls ``release_now_and_then()`` — at most once per ``INTERVAL_S`` —
after decoding row groups, after closing a shard and after reading a chunk of texts: the chunks' texts and ids
are freed by the encode threads and the caller, and without it that memory stayed with their arenas (+200-300
MB over a run). Not at once on every close: a closed shard's memory is what the next shard's row groups are
decoded into, and handing it back first made each decode fault its pages in anew (a third of a selective
plan's reading time, docs/performance.md). A call takes about 2 ms on a rank of ~1 GB
(measured: 27 calls, 48 ms in total), so once per ``INTERVAL_S`` = 0.2 s costs at most ~1 % of one core, off the
training thread when the reader runs ahead. ``ZEPHON_RELEASE_MEMORY=off`` turns it off (e.g. for a process that
tunes its allocators itself); a size (``ZEPHON_RELEASE_MEMORY=256MiB``) trims glibc only once the resident set
has grown that much (below), trading memory for speed.

Handing memory back has a price paid later: glibc returns its free pages (``madvise``), and the next buffers
allocated there fault them in again, zeroed by the kernel. Every 0.2 s that was 15-30 page faults a microbatch
and 4-14 ns a token of system time on one core (``bench_stages.py``'s plans, DeepSeek V4: 35-45 CPU ns a token in
all), for memory the run was about to use again. So ``release_now_and_then`` trims glibc only when the resident
set has grown ``SLACK_BYTES`` (64 MiB) past what it was just after the latest trim (``/proc/self/statm``, a few
µs to read; where it cannot be read, every time as before): a run whose freed memory is reused in place — the
steady state — is not trimmed again, and one whose allocators keep more and more is trimmed whenever they have
kept another 64 MiB. Arrow's pool is still asked every time (it did not cause the faults: measured with glibc's
trim left out, 2-3 faults a microbatch). ``release_memory()`` (a shard closed for good, tests) releases both.

Example: a run reading 10 chunks a second checks after every other chunk; just after the first trim it holds
600 MB; while its resident set stays under 664 MB only Arrow's pool is asked; at 670 MB glibc is trimmed
(back to, say, 610 MB) and the next trim waits for 674 MB.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time
from collections.abc import Callable

import pyarrow as pa

from zephon.checks import size_setting

#: ``ZEPHON_RELEASE_MEMORY``: ``on`` (default) or ``off``.
RELEASE_MEMORY_ENV = "ZEPHON_RELEASE_MEMORY"
#: ``release_now_and_then`` releases at most once per this many seconds.
INTERVAL_S = 0.2
#: ``release_now_and_then`` releases once the resident set has grown this much since the latest release.
SLACK_BYTES = 64 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int | None:
    """This process's resident set in bytes (``/proc/self/statm``), or None where there is none."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None (another C library)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_TRIM = _malloc_trim()


def release_slack() -> int | None:
    """How much the resident set grows before glibc is trimmed (``ZEPHON_RELEASE_MEMORY``, read at each call):
    ``on`` (default) ``SLACK_BYTES``, a size that many bytes, None when ``off``."""
    value = os.environ.get(RELEASE_MEMORY_ENV, "on")
    return size_setting(RELEASE_MEMORY_ENV, value, {"on": SLACK_BYTES, "off": None}, "256MiB")


def release_enabled() -> bool:
    """Whether ``release_memory`` does anything (``ZEPHON_RELEASE_MEMORY`` is not ``off``; read at each call)."""
    return release_slack() is not None


def release_memory() -> None:
    """Return the free memory Arrow's pool and glibc's arenas hold to the system (see the module docstring)."""
    if not release_enabled():
        return
    pa.default_memory_pool().release_unused()
    if _TRIM is not None:
        _TRIM(0)


_last = [0.0]  # monotonic time of the latest release (a race between threads costs at most one extra release)
_trimmed = [-SLACK_BYTES]  # the resident set just after the latest release (none yet: the first check releases)


def release_now_and_then() -> None:
    """``release_memory()`` if the latest check is ``INTERVAL_S`` ago or more and the resident set has grown
    ``release_slack()`` (``SLACK_BYTES`` by default) since the latest release (module docstring)."""
    now = time.monotonic()
    if now - _last[0] < INTERVAL_S:
        return
    slack = release_slack()
    if slack is None:
        return
    held = resident_bytes()
    if held is None or held >= _trimmed[0] + slack:
        release_memory()
        after = resident_bytes()
        _trimmed[0] = after if after is not None else -slack
    _last[0] = time.monotonic()
