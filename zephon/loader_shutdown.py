"""The end of a DataLoader iteration with workers: its queues' feeder threads waited for, so a script that exits
right after its last batch prints nothing at exit.

Why: a ``multiprocessing.Queue`` made with the ``spawn`` or ``forkserver`` start method holds named semaphores
that the resource tracker (a process of Python's own) is told about when made and told to forget when freed.
Torch closes its DataLoader iterator's queues when the iteration ends, and each queue's *feeder* thread (a
daemon thread that writes what was put into the pipe) holds the last references to two of those semaphores
until it has flushed and returned. It then frees them from that thread: unlinks the name, then writes
"forget it" to the tracker. A script that ends while a feeder is between the two — its daemon threads are
stopped where they stand when the interpreter finalizes — leaves the tracker a name it was never told to forget
and can no longer find, and it prints ``UserWarning: resource_tracker: There appear to be 1 leaked semaphore
objects to clean up at shutdown`` with ``[Errno 2] No such file or directory``. Harmless (nothing is left in
``/dev/shm``), but a warning at the end of a run tells its reader something went wrong. Measured with torch
2.13 and Python 3.11.7 on 2 cores, a bare ``DataLoader(..., num_workers=2, multiprocessing_context="spawn")``
over an ``IterableDataset`` of 50 items iterated to the end as a script's last line: 1 run of 100 printed it
(the stress suite's CI run met it once); with the freeing thread made to wait 50 ms between unlink and
"forget" (a ``sitecustomize`` patch, to widen the window), 4 runs of 5 — and 0 of 5 with the wait below.

Invariant: once ``Loader.__iter__`` has returned, no feeder thread of its (non-persistent) DataLoader iterator
is running, unless one has been stuck for ``FEEDER_WAIT_S`` (a worker gone while a message waited for it):
then it is left to Python's own exit, as without this module.

Worked example: 2 spawned workers, the last batch handed out; torch's iterator has shut its workers down and
closed the 2 index queues (with pinning, the result queue too); ``wait_for_feeders`` joins their feeder
threads, each gone within microseconds of the close.

Persistent workers keep their queues open until the DataLoader is collected, which a script may leave to its
own exit: the race stays there (torch's, as with any DataLoader). A DataLoader of the user's own over
``to_torch_dataset()`` is the user's: docs/training.md says how to wait for it likewise.
"""

from __future__ import annotations

import threading

#: Seconds to wait for each feeder thread; a closed queue's feeder is gone within microseconds unless stuck.
FEEDER_WAIT_S = 1.0


def wait_for_feeders(iterator: object) -> None:
    """Join the feeder threads of a torch ``_MultiProcessingDataLoaderIter`` that has shut its workers down (its
    queues closed); anything else (an iterator without workers, one still running) is left alone."""
    if getattr(iterator, "_shutdown", False) is not True:
        return
    queues = [*getattr(iterator, "_index_queues", ()), getattr(iterator, "_worker_result_queue", None)]
    for queue in queues:
        feeder = getattr(queue, "_thread", None)
        if isinstance(feeder, threading.Thread) and feeder is not threading.current_thread():
            feeder.join(FEEDER_WAIT_S)
