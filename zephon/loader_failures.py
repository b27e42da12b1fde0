"""When a DataLoader worker of ``Pipeline.dataloader()`` dies or stops answering: one line, no hang, and a retry
that resumes where the failed iteration stopped.

Why: torch reports a worker killed by a signal (the out-of-memory killer's SIGKILL) or gone as a ``RuntimeError``
(``DataLoader worker (pid(s) 123) exited unexpectedly``, ``… is killed by signal: Killed.``) raised from deep in its
iterator, ~50 lines of chained traceback that do not say how to go on; and ``timeout=`` as ``DataLoader timed out
after 3 seconds``. Then its shutdown joins each worker for 5 s, sends the live ones SIGTERM — which a stopped
(SIGSTOP) or uninterruptible (D-state: a hung NFS or FUSE read) worker never acts on — and leaves them running:
the error came 20 s late, and the interpreter hung at exit joining them (helper-43's audit). And the next
iteration started at the plan's start, so a training loop retrying after the error trained its first batches
again, silently.

What the loader does (``zephon.torch_loader``): an iteration that ends by an exception — not a ``break`` —
leaves the loader's state where it is, after the last batch handed out, and drops its DataLoader, so the next
iteration starts new workers there (a ``break`` keeps the documented epoch semantics: the next iteration starts
at the plan's start). So does an iteration closed while one of its workers had died (``workers_died``): torch's
SIGCHLD handler raises a worker's death in whatever code the main thread runs, often the training step's, and
the loader then sees only its iteration closed, as by a ``break``. A lost worker or a timeout (``worker_loss``)
first kills every worker still alive (``stop_workers``: SIGKILL reaches a stopped process) and then lets torch
shut down, which then waits for nobody; any other error stops the workers gently and kills those still alive
after it. The error is raised again as ``zephon.errors.WorkerLost``: torch's words, where the run stands and how
to resume, in one line (when torch raised it inside the loader: from the caller's own code it stays torch's).

Invariant: after an iteration failed, ``state_dict()`` and the next iteration's first batch are the ones an
uninterrupted run gives after the last batch handed out — never a repeated or skipped batch — and no worker
process of the failed iteration is alive when the error reaches the caller.

Example: 2 workers, one killed by SIGKILL after 96 microbatches handed out; the pieces the other had sent are
handed out first (torch raises once the dead worker's turn comes), then ``WorkerLost: DataLoader worker (pid(s)
4242) exited unexpectedly after step 48 microbatch 1 handed out — …``; ``for batch in loader`` again yields step
48 microbatch 2 onwards, byte for byte what the uninterrupted run gives.
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
from collections.abc import Iterator
from typing import Any

from zephon.errors import one_line
from zephon.executor.read.spill import remove_spills_of

#: torch's words for a worker gone (``_try_get_data``; the SIGCHLD check's ``is killed by signal``) or silent.
_LOST = re.compile(r"DataLoader worker \(pid|DataLoader timed out after")


def worker_loss(exc: BaseException) -> str | None:
    """torch's message when ``exc`` says a DataLoader worker died or timed out, else None."""
    if isinstance(exc, RuntimeError) and _LOST.search(str(exc)):
        return one_line(exc)
    return None


def at_end(state: dict[str, Any], steps: int) -> bool:
    """Whether ``state`` stands after a run's last microbatch (all ``steps`` handed out): a worker lost then took
    no batch with it (its final counts only), so the iteration ends as the run does, with a warning."""
    return not state.get("microbatch", 0) and state.get("step") == steps


def workers_died(iterator: Any) -> bool:
    """Whether a worker of a torch ``_MultiProcessingDataLoaderIter`` has exited on its own (a signal, an error) while
    the iteration ran: torch's SIGCHLD handler raises that in whatever code the main thread is running — the
    training step's, not the loader's — so the loader sees only its iteration closed, as by a ``break``."""
    return any(worker.exitcode not in (None, 0) for worker in getattr(iterator, "_workers", ()))


def lost_message(detail: str, state: dict[str, Any] | None) -> str:
    """``WorkerLost``'s one line: torch's ``detail``, where the run stands (``state``: the next microbatch to hand
    out, every one before it handed out), and how to go on."""
    where = "before its first batch"
    if state is not None and "step" in state:
        where = f"before step {int(state['step'])} microbatch {int(state.get('microbatch', 0))}"
    hint = (
        " (a worker that takes longer, e.g. a slow map_transform, needs a larger timeout=)"
        if "timed out" in detail
        else " (a worker killed by signal 9 may have run out of memory: fewer num_workers or a smaller "
        "prefetch_factor)"
    )
    return (
        f"{detail.rstrip('. ')}: the run stands {where}, every batch before it handed out — iterate the loader "
        f"again, or load_state_dict(loader.state_dict()) into a new one, and it resumes there{hint}"
    )


class WorkerWatch:
    """torch's SIGCHLD handler, deferred to the loader's own fetches while an iteration runs on the main thread.

    torch raises a worker's death from its SIGCHLD handler, wherever the main thread is: in the training step's
    code (the batch it trains on is lost: the loader sees only its iteration closed), or in the loader between
    taking a batch's pieces and handing it out (the state then counts a batch never handed out: a retry skipped
    it, 3 of 200 random kills). While the loader fetches (``fetch``: waiting on the workers, before any piece of
    the next batch is taken) torch's handler runs at once, as before; anywhere else the signal is noted and
    torch's handler runs at the start of the next fetch — where a death is raised inside the loader, before the
    next batch, with the state after the last one handed out. Installed only on the main thread (where Python
    runs signal handlers) and only over torch's own handler; ``close`` puts that back."""

    def __init__(self) -> None:
        self.previous: Any = None
        self.fetching = False
        self.pending = False

    @classmethod
    def install(cls) -> WorkerWatch | None:
        if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGCHLD"):
            return None
        previous = signal.getsignal(signal.SIGCHLD)
        if not callable(previous) or getattr(previous, "__module__", "") != _TORCH_SIGNALS:
            return None  # not torch's (set when the DataLoader's workers started): left alone
        watch = cls()
        watch.previous = previous
        signal.signal(signal.SIGCHLD, watch._handler)
        return watch

    def _handler(self, signum: int, frame: Any) -> None:
        if self.fetching:
            self.previous(signum, frame)
        else:
            self.pending = True

    def fetch(self, source: Iterator[Any]) -> Iterator[Any]:
        """``source``'s items, each fetched with torch's handler live (a noted signal handled first)."""
        while True:
            self.fetching = True
            try:
                if self.pending:
                    self.pending = False
                    self.previous(signal.SIGCHLD, None)  # raises a worker's death (other children: nothing)
                item = next(source, _END)
            finally:
                self.fetching = False
            if item is _END:
                return
            yield item

    def close(self) -> None:
        """torch's handler back (unless another was set meanwhile: that one stays); a noted signal handled now."""
        if self.previous is None:
            return
        if signal.getsignal(signal.SIGCHLD) == self._handler:
            signal.signal(signal.SIGCHLD, self.previous)
        previous, self.previous = self.previous, None
        if self.pending:
            self.pending = False
            with contextlib.suppress(RuntimeError):  # the workers are gone by now: only a user's handler matters
                previous(signal.SIGCHLD, None)


_TORCH_SIGNALS = "torch.utils.data._utils.signal_handling"
_END = object()


def stopped(iterator: Any) -> bool:
    """Whether a worker of a torch ``_MultiProcessingDataLoaderIter`` is stopped (SIGSTOP) or traced: torch's
    shutdown would wait 5 s for it, send it a SIGTERM it does not act on, and wait 5 s more."""
    for worker in getattr(iterator, "_workers", ()):
        try:
            with open(f"/proc/{worker.pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                    return True
        except (OSError, IndexError, TypeError):
            continue
    return False


def stop_workers(iterator: Any, *, kill_first: bool) -> None:
    """Shut down the workers of a torch ``_MultiProcessingDataLoaderIter`` (anything else is left alone), leaving
    none alive: with ``kill_first`` (one is lost or silent) every live worker gets SIGKILL before torch's shutdown,
    which then joins them at once; otherwise torch's shutdown asks them to stop and waits (up to 5 s each), and
    any still alive after it — stopped or stuck in the kernel, deaf to its SIGTERM — gets SIGKILL."""
    stop = getattr(iterator, "_shutdown_workers", None)
    if stop is None:
        return
    workers = list(getattr(iterator, "_workers", ()))
    if kill_first or stopped(iterator):
        if getattr(iterator, "_worker_pids_set", False):  # torch's SIGCHLD check would raise our own kills
            from torch.utils.data import _utils

            _utils.signal_handling._remove_worker_pids(id(iterator))  # as its shutdown does, before its kills
            iterator._worker_pids_set = False
        _kill(workers)
    stop()
    _kill(workers)
    remove_spills_of([w.pid for w in workers if w.pid is not None])  # a killed worker's could not remove its own


def _kill(workers: list[Any]) -> None:
    for worker in workers:
        if worker.is_alive():
            worker.kill()  # SIGKILL: acted on by the kernel, stopped process or not
    for worker in workers:
        worker.join(1.0)  # reaped at once (a process in uninterruptible sleep goes when its call returns)
