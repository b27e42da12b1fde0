"""The cores this process may use: its CPU affinity where the platform has one (a container or ``taskset``
limits it), else every core of the machine — divided among a DataLoader's workers inside each worker
(``share_cores``). Thread pools size themselves from it: tokenizer threads, the decode pool, read-ahead.

Invariant: the threads never change the data, only how many run at once. Example: 2 cores, ``num_workers=2`` →
each worker sees 1 core: one tokenizer thread, no decode pool, ``RAYON_NUM_THREADS=1``, and a read-ahead thread
(``zephon.executor.read.ahead``: it tokenizes the next chunk while the worker waits for the loader to take its
pieces); with ``num_workers=1`` the worker sees both, as the main process would.
"""

from __future__ import annotations

import os

#: How many DataLoader workers share this process's cores: set in a worker by ``share_cores``, else 1.
_workers = [1]


def usable_cores() -> int:
    """Cores this process may run on (≥ 1), divided among the DataLoader workers sharing them."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // _workers[0])


def workers_sharing() -> int:
    """How many DataLoader workers share this process's cores (1 outside a worker)."""
    return _workers[0]


def sharing() -> bool:
    """Whether this process is one of several DataLoader workers sharing the cores (``share_cores``)."""
    return _workers[0] > 1


def share_cores(workers: int) -> None:
    """In a DataLoader worker, one of ``workers``: size every pool of this process to its share of the cores, and
    Rayon's (the ``tokenizers`` engine's) too unless ``RAYON_NUM_THREADS`` is set. ``torch`` already runs one
    thread in a worker (its worker loop sets it)."""
    _workers[0] = max(1, workers)
    os.environ.setdefault("RAYON_NUM_THREADS", str(usable_cores()))
