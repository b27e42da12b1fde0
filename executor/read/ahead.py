"""Reading and tokenizing ahead on a background thread, without changing a single batch.

The executor's loop alternates between work that releases the GIL (Parquet decoding in pyarrow, encoding in
tiktoken or ``tokenizers``) and Python work that does not (routing documents to lanes, cutting rows, building
batches and training tensors). ``ReadAhead`` runs a producer — "read and tokenize the next chunk of the plan" —
on one background thread, up to ``depth`` chunks ahead of the consumer, so that on two or more cores the two
overlap. The consumer takes the chunks in the order they were produced; the producer is the only thread that
touches the reader and the plan iterator, the consumer the only one that touches the lanes. The data is
therefore the same, byte for byte, with or without the thread; only timing changes. (Estimated plans go one
step further in ``zephon.executor.estimated``: the producer reads, and hands each chunk's texts to an encode
pool, so decoding the next chunk overlaps tokenizing this one; the consumer waits on each chunk's encoding in
order.)

* Errors: an exception raised by the producer is raised again, the same object (type and message), by the
  ``next()`` call that would have returned that chunk; nothing after it is produced.
* Shutdown: ``close()`` (called when the executor's iterator finishes, is closed or is garbage-collected, and
  so on ``state_dict`` / resume, which build a new iterator) stops the producer after the chunk it is working
  on and joins it. The thread is a daemon, so a leaked iterator never keeps the interpreter alive; and an
  ``atexit`` hook closes every read-ahead still running, so at exit no producer is inside native code
  (tokenizers, Arrow) while the interpreter finalizes — a thread there aborted processes at exit.

``ZEPHON_READ_AHEAD`` chooses: ``auto`` (default) uses the thread when the process may run on two or more cores
(on one core it only adds thread switches) or is one of several DataLoader workers sharing them, ``on`` or
``off`` force it. A worker's share of the cores may be one, but it spends part of its time blocked — its
``prefetch_factor`` items built, the loader still busy with another worker's — and a chunk of the plan comes in
one lump (read and tokenized: ~0.1 s a core at 1,024 documents) while its pieces go out a few hundred µs
apart; the thread tokenizes ahead while the worker waits (measured: ``benchmarks/bench_workers.py``,
docs/performance.md "DataLoader workers").
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

from zephon.errors import ConfigError
from zephon.executor.cores import sharing, usable_cores

#: ``ZEPHON_READ_AHEAD``: ``auto`` (default), ``on`` or ``off``.
READ_AHEAD_ENV = "ZEPHON_READ_AHEAD"
#: Chunks the producer may hold ready beyond the one being consumed.
DEPTH = 2

T = TypeVar("T")
_END = object()
#: Read-aheads whose thread runs, closed at exit.
_LIVE: weakref.WeakSet[ReadAhead[object]] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for ahead in list(_LIVE):
        ahead.close()


def read_ahead_enabled(value: str | None = None) -> bool:
    """Whether to read ahead on a thread: ``value`` (default: ``$ZEPHON_READ_AHEAD``) is auto, on or off."""
    choice = (value if value is not None else os.environ.get(READ_AHEAD_ENV, "")).strip().lower() or "auto"
    if choice not in ("auto", "on", "off"):
        raise ConfigError(f'{READ_AHEAD_ENV} must be "auto", "on" or "off", got {choice!r}')
    if choice != "auto":
        return choice == "on"
    return usable_cores() > 1 or sharing()


class ReadAhead(Generic[T]):
    """Items of ``produce()`` (None: no more) in order, produced on a background thread when ``threaded``."""

    def __init__(self, produce: Callable[[], T | None], *, threaded: bool, depth: int = DEPTH) -> None:
        self._produce = produce
        self._thread: threading.Thread | None = None
        self._done = False
        if threaded:
            self._queue: queue.Queue[object] = queue.Queue(maxsize=max(1, depth))
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, name="zephon-read-ahead", daemon=True)
            self._thread.start()
            _LIVE.add(self)  # type: ignore[arg-type]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                item: object = self._produce()
            except BaseException as exc:  # handed to the consumer, raised there
                item = exc
            if item is None:
                item = _END
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.05)
                    break
                except queue.Full:
                    continue
            if item is _END or isinstance(item, BaseException):
                return

    def next(self) -> T | None:
        """The next item, or None when the producer is done."""
        if self._done:
            return None
        if self._thread is None:
            item = self._produce()
            self._done = item is None
            return item
        got = self._queue.get()
        if got is _END:
            self._done = True
            return None
        if isinstance(got, BaseException):
            self._done = True
            raise got
        return got  # type: ignore[return-value]

    def close(self) -> None:
        """Stop the producer (after its current item) and wait for it."""
        self._done = True
        if self._thread is None:
            return
        self._stop.set()
        while True:  # unblock a producer waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        _LIVE.discard(self)  # type: ignore[arg-type]
