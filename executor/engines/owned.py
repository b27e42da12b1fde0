"""An engine confined to one thread of its own: built there, called only there, freed there.

Why: kitoken 0.11.1 segfaulted runs (a read of address 0x18 inside ``Kitoken.encode_all``) when its object had
been built on a thread that then exited — Zephon's old engine-preparation thread — and was called on other
threads afterwards (docs/performance.md, "Why kitoken crashed"). Built on a thread that stays alive, or called
only where it was built, it never crashed. So an engine class marked ``Engine.confined`` is wrapped here:

* one daemon thread per engine object (``zephon-engine-owner``) builds it and runs every ``encode`` call, in
  the order they arrive; callers on any thread wait for their own call's result. The engine holds the GIL
  while it encodes anyway (``releases_gil`` False), so confining it costs no parallelism;
* the object is freed on that thread too: when the wrapper is closed, garbage-collected, or the interpreter
  exits (an ``atexit`` hook stops every owner thread and waits for it, so no thread is inside the engine's
  native code while the interpreter finalizes);
* a closed engine that is called again (another encoder shared it) gets a new owner thread and object;
* in a forked child (a DataLoader worker) the owner thread does not exist: the first call there builds a new
  engine on a new owner thread, and the parent's copy is never touched again (not even freed).

Example: ``OwnedEngine(KitokenEngine, config)`` → ``encode(["hi"])`` from the main thread and from a pool thread
both run on ``zephon-engine-owner``; ``close()`` frees the kitoken object there and ends the thread.
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from zephon.executor.engines.base import Engine, TokenIds

_STOP = None
#: Live owners, stopped and joined at exit.
_LIVE: weakref.WeakSet[_Owner] = weakref.WeakSet()


class _Owner:
    """The thread that owns one engine object in this process: the only reference to the object is a local of
    that thread, so it is built, called and freed there alone."""

    def __init__(self, build: Callable[[], Engine]) -> None:
        self.pid = os.getpid()
        self.stopped = False
        self.requests: queue.SimpleQueue[tuple[Sequence[str], Future[tuple[TokenIds, float]]] | None] = (
            queue.SimpleQueue()
        )
        built: Future[None] = Future()
        self.thread = threading.Thread(target=self._run, args=(build, built), name="zephon-engine-owner", daemon=True)
        self.thread.start()
        built.result()  # raises what the build raised (EngineUnavailable)
        _LIVE.add(self)

    def _run(self, build: Callable[[], Engine], built: Future[None]) -> None:
        try:
            engine = build()
        except BaseException as exc:
            built.set_exception(exc)
            return
        built.set_result(None)
        while (item := self.requests.get()) is not _STOP:
            texts, result = item
            try:
                start = time.thread_time()  # the call's CPU is this thread's (``Engine.encode_cpu``)
                result.set_result((engine.encode(texts), time.thread_time() - start))
            except BaseException as exc:
                result.set_exception(exc)
            del item, texts, result
        del engine  # freed here, on the thread that built it

    def encode(self, texts: Sequence[str]) -> tuple[TokenIds, float]:
        """The ids of ``texts`` and the CPU seconds the owner thread spent on them."""
        result: Future[tuple[TokenIds, float]] = Future()
        self.requests.put((texts, result))
        return result.result()

    def stop(self) -> None:
        """End the thread after the calls already asked for, and wait for it (never from the thread itself)."""
        self.stopped = True
        if self.thread.is_alive():
            self.requests.put(_STOP)
            if threading.current_thread() is not self.thread:
                self.thread.join()


@atexit.register
def _stop_all() -> None:
    for owner in list(_LIVE):
        if owner.pid == os.getpid():
            owner.stop()


class OwnedEngine(Engine):
    """``cls(config_text, *args)`` built and called on a thread of its own (see the module docstring)."""

    def __init__(self, cls: type[Engine], config_text: str, *args: object) -> None:
        super().__init__(config_text)
        self.name = cls.name  # type: ignore[misc]
        self.package = cls.package  # type: ignore[misc]
        self.releases_gil = cls.releases_gil  # type: ignore[misc]
        self.crash_prone = cls.crash_prone  # type: ignore[misc]
        self.cls, self.args = cls, args
        self._lock = threading.Lock()
        self._owner = _Owner(self._build)

    def _build(self) -> Engine:
        return self.cls(self.config_text, *self.args)  # type: ignore[call-arg]

    @property
    def owner(self) -> _Owner:
        """This process's owner thread (a forked child makes its own on first use)."""
        owner = self._owner
        if owner.pid != os.getpid() or owner.stopped:
            with self._lock:
                if self._owner.pid != os.getpid() or self._owner.stopped:
                    # the parent's object stays a local of a thread this process does not have: never touched
                    self._owner = _Owner(self._build)
                owner = self._owner
        return owner

    def encode(self, texts: Sequence[str]) -> TokenIds:
        return self.owner.encode(texts)[0]

    def encode_cpu(self, texts: Sequence[str]) -> tuple[TokenIds, float]:
        return self.owner.encode(texts)  # the owner thread's CPU: this thread only waits

    def close(self) -> None:
        """Free the engine on its thread and end the thread."""
        if self._owner.pid == os.getpid():
            self._owner.stop()

    def __del__(self, _getpid: Callable[[], int] = os.getpid) -> None:  # (module globals may be gone at exit)
        owner = getattr(self, "_owner", None)
        if owner is not None and owner.pid == _getpid() and not owner.stopped:
            owner.stopped = True
            owner.requests.put(None)  # the thread frees the engine and ends; not joined from a finalizer

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (OwnedEngine, (self.cls, self.config_text, *self.args))
